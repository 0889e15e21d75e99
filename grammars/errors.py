"""Exceptions raised by the grammar layer; all derive from ValueError so callers can catch bad
input uniformly (the server maps them to HTTP 400)."""

from __future__ import annotations


class GrammarError(ValueError):
    """A grammar (PEG text, IR, regex) is malformed or cannot be compiled."""

    def __init__(self, message: str, *, line: int | None = None, column: int | None = None):
        self.line = line
        self.column = column
        where = f" (line {line}, column {column})" if line is not None else ""
        super().__init__(f"{message}{where}")


class GrammarTooLarge(GrammarError):
    """A grammar past one of the budgets that bound what one request may cost the server.

    `limit` names the budget: a size budget of `GrammarLimits` ("max_instructions",
    "max_completion_length"), or the compile service's "compile_time" (CPU seconds a compile
    may take) and "compile_memory" (what a compile may add to its worker). `allowed` is the
    budget, `value` what the grammar needs (at least) or reached, where known: a size is
    checked before anything proportional to it is built, and a compile stopped at its budget
    never shows its full cost. The message names the limit and how to raise it."""

    def __init__(self, limit: str, message: str, *, allowed: float,
                 value: float | None = None):
        self.limit = limit
        self.allowed = allowed
        self.value = value
        super().__init__(message)


class SchemaError(GrammarError):
    """A JSON Schema is invalid or uses something that cannot be compiled.

    `pointer` is the JSON pointer of the offending subschema (e.g. `/properties/a/pattern`).
    """

    def __init__(self, message: str, pointer: str = ""):
        self.pointer = pointer
        super().__init__(f"{message} at {pointer or '/'}")


class UnsupportedSchemaError(SchemaError):
    """A JSON Schema keyword (or keyword value) that pegmask cannot express as a grammar."""

    def __init__(self, keyword: str, pointer: str = "", detail: str = ""):
        self.keyword = keyword
        extra = f": {detail}" if detail else ""
        super().__init__(f"unsupported JSON Schema keyword {keyword!r}{extra}", pointer)


class ParseError(ValueError):
    """Input does not match the grammar. `position` is the byte offset of the first symbol that
    no derivation can consume (or the input length when the input ended too early)."""

    def __init__(self, message: str, position: int):
        self.position = position
        super().__init__(f"{message} at byte {position}")
