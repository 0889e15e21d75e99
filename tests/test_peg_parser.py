"""The hand-written PEG parser builds the same IR as the lark parser it replaced: that parser
(its meta-grammar and tree transform, as they were) is kept here as the oracle, and both read
every shipped `.peg` file, every dialect's grammar texts and random grammars."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lark import Lark, Token, Transformer
from lark.exceptions import UnexpectedInput, VisitError

from pegmask.dialects import ChatRequest
from pegmask.dialects.base import TURN_TAG
from pegmask.dialects.registry import dialect_names, get_dialect
from pegmask.grammars.counted import count_literal
from pegmask.grammars.errors import GrammarError
from pegmask.grammars.ir import (
    Capture,
    CharClass,
    GrammarIR,
    JsonSchema,
    Literal,
    Node,
    Ref,
    Repeat,
    Special,
    Trigger,
    Until,
    choice,
    json_schema_node,
    seq,
)
from pegmask.grammars.peg import (
    _char_class,
    _logical_lines,
    _Parser,
    _string,
    peg_to_ir,
)
from pegmask.grammars.program import check_rules

REPO = Path(__file__).resolve().parents[1]

# ----------------------------------------------------------------------------- the oracle
META_GRAMMAR = r"""
?definition: NAME "=" expr

?expr: sequence ("|" sequence)*          -> alternatives
sequence: item*
?item: CAPTURE item                       -> capture
     | primary QUANT?                     -> quantified
     | primary "{" INT "}"                -> repeat_exact
     | primary "{" INT "," INT? "}"       -> repeat_range
?primary: STRING                          -> string
     | CHARCLASS                          -> charclass
     | "."                                -> any_char
     | NAME                               -> ref
     | "(" expr ")"
     | FUNC [arg ("," arg)*] ")"          -> call
?arg: expr

QUANT: "?" | "*" | "+"
FUNC.2: /(token|until|json|trigger)\(/
CAPTURE: /@[A-Za-z_][A-Za-z0-9_.\-]*:/
NAME: /[A-Za-z_][A-Za-z0-9_]*/
STRING: /"(\\.|[^"\\\n])*"/ | /'(\\.|[^'\\\n])*'/
CHARCLASS: /\[(\\.|[^\]\\\n])*\]/
INT: /[0-9]+/
COMMENT: /#[^\n]*/
%ignore COMMENT
%ignore /[ \t\r\n]+/
"""

_LARK = Lark(META_GRAMMAR, start="definition", parser="lalr", maybe_placeholders=False)


class _LarkToIR(Transformer):
    """The lark parse tree to the IR, as `grammars/peg.py` did it before its own parser."""

    def __init__(self, schemas: dict[str, Any], line_offset: int):
        super().__init__()
        self.schemas = schemas
        self.line_offset = line_offset

    def _line(self, token: Token) -> int:
        return (token.line or 1) + self.line_offset

    def definition(self, children: list[Any]) -> tuple[str, Node]:
        name, body = children
        return str(name), body

    def alternatives(self, children: list[Node]) -> Node:
        return choice(*children)

    def sequence(self, children: list[Node]) -> Node:
        return seq(*children)

    def quantified(self, children: list[Any]) -> Node:
        if len(children) == 1:
            return children[0]
        atom, quant = children
        return {"?": Repeat(atom, 0, 1), "*": Repeat(atom, 0, None), "+": Repeat(atom, 1, None)}[
            str(quant)
        ]

    def repeat_exact(self, children: list[Any]) -> Node:
        atom, count = children
        return Repeat(atom, count_literal(count), count_literal(count))

    def repeat_range(self, children: list[Any]) -> Node:
        atom, lo = children[0], count_literal(children[1])
        hi = count_literal(children[2]) if len(children) > 2 else None
        if hi is not None and hi < lo:
            raise GrammarError(f"repetition {{{lo},{hi}}} has max < min", line=self._line(children[1]))
        return Repeat(atom, lo, hi)

    def capture(self, children: list[Any]) -> Node:
        tag, atom = children
        return Capture(str(tag)[1:-1], atom)

    def string(self, children: list[Token]) -> Node:
        return self._decoded(_string, children[0])

    def charclass(self, children: list[Token]) -> Node:
        return self._decoded(_char_class, children[0])

    def _decoded(self, decode: Callable[[str], Node], token: Token) -> Node:
        """The new parser's decoding of strings and classes (unchanged), at lark's line."""
        try:
            return decode(str(token))
        except GrammarError as exc:
            raise GrammarError(str(exc), line=self._line(token)) from None

    def any_char(self, _children: list[Any]) -> Node:
        return CharClass((), negated=True)

    def ref(self, children: list[Token]) -> Node:
        return Ref(str(children[0]))

    def call(self, children: list[Any]) -> Node:
        func_token, args = children[0], children[1:]
        func = str(func_token)[:-1]
        line = self._line(func_token)
        if func == "token":
            if len(args) != 1 or not isinstance(args[0], Literal) or not args[0].data:
                raise GrammarError(f"{func}() takes one non-empty string", line=line)
            return Special(args[0].data.decode("utf-8"))
        if func == "until":
            stops: list[bytes] = []
            for arg in args:
                if isinstance(arg, Special):
                    continue
                if not isinstance(arg, Literal) or not arg.data:
                    raise GrammarError("until() takes non-empty strings or token(...)", line=line)
                stops.append(arg.data)
            return Until(tuple(stops))
        if func == "json":
            if not args:
                return JsonSchema("{}")
            if len(args) != 1:
                raise GrammarError("json() takes one schema name", line=line)
            arg = args[0]
            if isinstance(arg, Ref):
                if arg.name not in self.schemas:
                    raise GrammarError(f"json({arg.name}): no schema named {arg.name!r}", line=line)
                schema = self.schemas[arg.name]
                if isinstance(schema, JsonSchema):
                    return schema
            elif isinstance(arg, Literal):
                try:
                    schema = json.loads(arg.data)
                except ValueError as exc:
                    raise GrammarError(f"json(): invalid inline schema: {exc}", line=line) from exc
            else:
                raise GrammarError("json() takes a schema name or inline JSON text", line=line)
            return JsonSchema(json.dumps(schema))
        if len(args) != 1:
            raise GrammarError("trigger() takes one expression", line=line)
        return Trigger(args[0])


def _lark_definition(definition: str, first_line: int,
                     schemas: dict[str, Any]) -> tuple[str, Node]:
    """One definition by the oracle; its errors as the lark front-end reported them."""
    try:
        return _LarkToIR(schemas, first_line - 1).transform(_LARK.parse(definition))
    except VisitError as exc:
        if isinstance(exc.orig_exc, GrammarError):
            raise exc.orig_exc from None
        raise
    except UnexpectedInput as exc:
        line = first_line + (exc.line - 1 if exc.line and exc.line > 0 else 0)
        raise GrammarError(f"syntax error: {exc}", line=line) from None


def lark_peg_to_ir(text: str, *, start: str | None = None,
                   schemas: dict[str, Any] | None = None) -> GrammarIR:
    """`peg_to_ir` as it was with lark."""
    rules: dict[str, Node] = {}
    for first_line, definition in _logical_lines(text):
        name, body = _lark_definition(definition, first_line, schemas or {})
        if name in rules:
            raise GrammarError(f"rule {name!r} is defined twice", line=first_line, column=1)
        rules[name] = body
    if not rules:
        raise GrammarError("grammar defines no rules")
    ir = GrammarIR(rules, start or ("root" if "root" in rules else next(iter(rules))))
    check_rules(ir)
    return ir


# ----------------------------------------------------------------------------- comparing
Outcome = tuple[str, Any]


def _definitions(parse: Any, text: str, schemas: dict[str, Any]) -> list[Outcome]:
    """Each definition's (name, body), or whether it is a syntax error and its line."""
    outcomes: list[Outcome] = []
    for first_line, definition in _logical_lines(text):
        try:
            outcomes.append(("ok", parse(definition, first_line, schemas)))
        except GrammarError as exc:
            syntax = str(exc).startswith(("unexpected", "syntax error"))
            outcomes.append(("syntax" if syntax else "invalid", exc.line))
    return outcomes


def assert_same_definitions(text: str, schemas: dict[str, Any]) -> list[Outcome]:
    """The same bodies; the same refusals, on the same line when both are syntax errors (the
    new parser builds as it reads: an invalid item may be reported before a syntax error
    after it)."""
    expected = _definitions(_lark_definition, text, schemas)
    actual = _definitions(_new_definition, text, schemas)
    for got, wanted in zip(actual, expected, strict=True):
        if "ok" in (got[0], wanted[0]) or got[0] == wanted[0] == "syntax":
            assert got == wanted
    return expected


def _new_definition(definition: str, first_line: int,
                    schemas: dict[str, Any]) -> tuple[str, Node]:
    return _Parser(definition, first_line, schemas).parse()


def assert_same_ir(text: str, schemas: dict[str, Any] | None = None,
                   start: str | None = None) -> GrammarIR:
    expected = lark_peg_to_ir(text, start=start, schemas=schemas)
    actual = peg_to_ir(text, start=start, schemas=schemas)
    assert list(actual.rules) == list(expected.rules)
    for name, body in expected.rules.items():
        assert actual.rules[name] == body, name
    assert (actual.start, actual.specials) == (expected.start, expected.specials)
    return actual


# ----------------------------------------------------------------------------- the texts
PEG_FILES = sorted(path for folder in ("dialects", "grammars", "tests", "data", "bench")
                   for path in (REPO / folder).rglob("*.peg"))


def test_the_shipped_peg_files_are_found():
    assert len(PEG_FILES) >= 30
    assert all(path.parent.name == "dialects" for path in PEG_FILES)


@pytest.mark.parametrize("path", PEG_FILES, ids=lambda path: path.name)
def test_each_definition_of_a_shipped_peg_file_parses_alike(path: Path):
    """The files are templates (`$tools`, per-tool sections): rule by rule, the same body, or
    an error on the same line for both."""
    text = path.read_text()
    schemas = {"schema": {"type": "object"}}
    assert any(kind == "ok" for kind, _ in assert_same_definitions(text, schemas))


WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"},
                                     "unit": {"enum": ["c", "f"]}, "days": {"type": "integer"}},
    "required": ["city"]}}}
SEARCH = {"type": "function", "function": {"name": "search.web-2", "parameters": {
    "type": "object", "properties": {"query": {"type": "string", "maxLength": 50},
                                     "tags": {"type": "array", "items": {"type": "string"}}},
    "required": ["query", "tags"], "additionalProperties": False}}}
ANSWER = {"type": "json_schema", "json_schema": {"name": "answer", "schema": {
    "type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}}}
REQUESTS = {
    "no tools": ChatRequest(),
    "auto": ChatRequest(tools=[WEATHER, SEARCH]),
    "required": ChatRequest(tools=[WEATHER, SEARCH], tool_choice="required",
                            parallel_tool_calls=False),
    "named": ChatRequest(tools=[WEATHER, SEARCH],
                         tool_choice={"type": "function", "function": {"name": "search.web-2"}}),
    "response format": ChatRequest(tools=[WEATHER], response_format=ANSWER),
}


@pytest.mark.parametrize("name", dialect_names())
def test_every_dialect_grammar_parses_alike(name: str):
    """`grammar_source` for both strict values, as the dialect compiles it."""
    dialect = get_dialect(name)
    for request in REQUESTS.values():
        for strict in (True, False):
            text, schemas = dialect.grammar_source(request, strict)
            assert_same_ir(text + f"\npegmask_turn = @{TURN_TAG}:root\n", schemas,
                           start="pegmask_turn")


LEAVES = st.sampled_from([
    '"a"', "'b'", r'"\n\t\u00e9\x41"', r'"\\\"q"', r"'it\'s'", '"é€😀"', "[a-z_]", r'[^"\\]',
    r"[\-x\]]", r"[^]", r"[a\-z]", "[\u00e0-\u00ff0-9]", ".", "leaf", "json_string",
    'token("<t>")', "token('</t>')", "until()", 'until("</x>", token("<t>"))', "json()",
    "json(s)", "json(opts)", r'json("{\"type\": \"integer\"}")', "()", '("x" | )', "( | )",
])
SPACES = st.sampled_from([" ", "  ", "\t", "\n    ", " # note (a | b\n  ", "\n\n  ", "\n#x\n "])
SUFFIXES = st.sampled_from(["", "?", "*", "+", "{2}", "{0,}", "{1,3}", "{ 2 , 5 }", "{3,3}",
                            "{000010}"])
TAGS = st.sampled_from(["", "", "@t:", "@a.b-c:", "@x:@y_1:", "@_:"])


def _expressions(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """Alternatives of sequences of items built on `inner` (a group, a call's argument)."""
    primary = st.one_of(LEAVES, inner.map(lambda e: f"({e})"),
                        inner.map(lambda e: f"trigger({e})"))
    item = st.tuples(TAGS, primary, SUFFIXES).map("".join)
    sequence = st.lists(st.tuples(SPACES, item).map("".join), min_size=1, max_size=3).map("".join)
    separator = st.sampled_from([" | ", "|", "\n    | ", "\n| "])
    return st.tuples(st.lists(sequence, min_size=1, max_size=3), separator).map(
        lambda parts: parts[1].join(parts[0]))


EXPRESSIONS = st.recursive(LEAVES, _expressions, max_leaves=16)
SCHEMAS = {"s": {"type": "string"}, "opts": json_schema_node({"type": "number"}, strict=True)}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(EXPRESSIONS, EXPRESSIONS, st.booleans())
def test_random_grammars_parse_alike(root: str, other: str, root_first: bool):
    rules = [f"root ={root}", f"other = {other}\n  # trailing comment", 'leaf = "x"',
             'json_string = "\\"" [^"]* "\\""']
    if not root_first:
        rules.reverse()
    text = "# a random grammar\n" + "\n".join(rules) + "\n"
    assert_same_ir(text, SCHEMAS)


PIECES = st.sampled_from([
    '"a"', "'b'", '"\\n"', '"', "[a-z]", "[^]", "[", "]", "x", "r", ".", "(", ")", "|", "?", "*",
    "+", "{2}", "{1,}", "{0,3}", "{", "}", ",", "1", "@t:", "@", ":", "token(", "until(", "json(",
    "trigger(", " ", " ", "\t", "\n ", "\n| ", "\n", "#c\n ", "=", "&", "!", "\\", "$"])


@settings(max_examples=1000, deadline=None)
@given(st.lists(PIECES, max_size=30).map("".join))
def test_random_text_is_refused_or_parsed_alike(text: str):
    """Any text: both parsers refuse the same definitions and agree on the others."""
    assert_same_definitions("r = " + text, {})
