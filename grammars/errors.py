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


class GrammarTooLarge(GrammarError):
    """A grammar past one of the budgets that bound what one request may cost the server.

    `limit` names the budget (`compile_time`: seconds a compile may take; `compile_memory`:
    bytes a compile may add to its worker process), `allowed` is its value and `value` what the
    grammar reached, where known (a compile stopped at the budget never shows its full cost)."""

    def __init__(self, limit: str, *, value: float | None = None, allowed: float,
                 unit: str = ""):
        self.limit = limit
        self.allowed = allowed
        self.value = value
        reached = f" (reached {value:g}{unit})" if value is not None else ""
        super().__init__(f"the grammar is too large: it exceeds the {limit} limit of "
                         f"{allowed:g}{unit}{reached}")
