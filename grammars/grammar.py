"""`Grammar`: the user-facing grammar object, built by any front-end, compiled once."""

from __future__ import annotations

import json
from typing import Any

from pegmask.grammars.counted import compact_repetitions
from pegmask.grammars.ir import GrammarIR, Node, contains_json_schema, json_schema_node
from pegmask.grammars.limits import DEFAULT_LIMITS, GrammarLimits
from pegmask.grammars.parser import ParseResult, StreamParser, parse_program
from pegmask.grammars.program import Program, compile_program


class Grammar:
    """A grammar in IR form with its compiled program (compiled on first use, then cached).

    Build one with `from_peg`, `from_json_schema`, `from_regex` or from an IR directly.
    `limits` are the size budgets it is compiled and closed under (`with_limits`: the same
    grammar under others, as an engine applies its own).
    """

    def __init__(self, ir: GrammarIR, *, limits: GrammarLimits = DEFAULT_LIMITS):
        self.ir = ir
        self.limits = limits
        self._program: Program | None = None
        self._key: tuple | None = None

    # ----------------------------------------------------------------- front-ends
    @classmethod
    def from_peg(cls, text: str, *, start: str | None = None,
                 schemas: dict[str, Any] | None = None,
                 limits: GrammarLimits = DEFAULT_LIMITS) -> Grammar:
        """Parse the PEG DSL. `schemas` maps names used by `json(name)` to JSON Schemas (or to
        `ir.json_schema_node(schema, **options)` for a schema with front-end options)."""
        from pegmask.grammars.peg import peg_to_ir

        return cls(peg_to_ir(text, start=start, schemas=schemas), limits=limits)

    @classmethod
    def from_json_schema(cls, schema: dict[str, Any] | bool | str, *,
                         limits: GrammarLimits = DEFAULT_LIMITS, **options: Any) -> Grammar:
        """A grammar for JSON values valid under `schema` (a dict, bool or JSON text).

        Options are those of `pegmask.grammars.json_schema.schema_to_rules` (whitespace,
        property order, ...). The schema is compiled eagerly so errors surface here.
        """
        if isinstance(schema, str):
            schema = json.loads(schema)
        return cls(GrammarIR({"root": json_schema_node(schema, **options)}), limits=limits).compile()

    @classmethod
    def from_regex(cls, pattern: str, *, limits: GrammarLimits = DEFAULT_LIMITS) -> Grammar:
        """A grammar for strings fully matching `pattern` (the structured-output regex subset)."""
        from pegmask.grammars.regex import regex_to_node

        return cls(GrammarIR({"root": regex_to_node(pattern)}), limits=limits).compile()

    @classmethod
    def from_node(cls, node: Node, rules: dict[str, Node] | None = None, *,
                  limits: GrammarLimits = DEFAULT_LIMITS) -> Grammar:
        """A grammar whose start rule is `node` (plus optional named rules)."""
        return cls(GrammarIR({**(rules or {}), "root": node}), limits=limits)

    def with_limits(self, limits: GrammarLimits) -> Grammar:
        """This grammar under other size budgets: itself where they are the same; else a
        grammar of the same IR, sharing the compiled program where it fits them."""
        if limits == self.limits:
            return self
        other = Grammar(self.ir, limits=limits)
        if self._program is not None and len(self._program) <= limits.max_instructions:
            other._program = self._program
        return other

    # ----------------------------------------------------------------- compiled forms
    @property
    def program(self) -> Program:
        """The compiled program. The JSON Schema front-end first expands the IR's `JsonSchema`
        nodes into rules (imported only then: grammars without schemas never load it), so
        the compiler depends on no front-end; then large counted repetitions become rules
        (`compact_repetitions`). Raises `GrammarTooLarge` past `limits.max_instructions`."""
        if self._program is None:
            ir = self.ir
            generated: list[str] = []
            if any(contains_json_schema(body) for body in ir.rules.values()):
                from pegmask.grammars.json_schema import expand_json_schemas

                ir = expand_json_schemas(ir)
                generated += ir.rules.keys() - self.ir.rules.keys()
            ir, counted = compact_repetitions(ir)
            self._program = compile_program(ir, generated=generated + counted, limits=self.limits)
        return self._program

    def compile(self) -> Grammar:
        """Compile now, so that a bad grammar is an error here rather than at first use."""
        _ = self.program
        return self

    def adopt(self, program: Program) -> Grammar:
        """Take `program`, compiled from this grammar's IR in another process (the engine's
        compile workers), as this grammar's program; returns self."""
        self._program = program
        return self

    @property
    def key(self) -> tuple:
        """A hashable identity of the grammar's language and captures (for caches)."""
        if self._key is None:
            self._key = (self.ir.start, tuple(self.ir.rules.items()))
        return self._key

    @property
    def specials(self) -> tuple[str, ...]:
        """Names of the special tokens the grammar uses."""
        return self.program.specials

    def parse(self, text: str | bytes) -> ParseResult:
        """Parse a whole input; raises `ParseError` (with the byte position) when invalid."""
        return parse_program(self.program, text)

    def stream_parser(self) -> StreamParser:
        return StreamParser(self.program)

    def matches(self, text: str | bytes) -> bool:
        from pegmask.grammars.errors import ParseError

        try:
            self.parse(text)
        except ParseError:
            return False
        return True
