"""The PEG DSL front-end: text grammars to the IR, by a hand-written tokenizer and parser.

Syntax, one rule per definition (a definition continues on following lines that are indented
or start with `|`; `#` starts a comment)::

    root      = reasoning? @content:until(token("<tool_call>")) call*
    reasoning = token("<think>") @reasoning:until("</think>") "</think>" "\\n"*
    call      = trigger(token("<tool_call>")) "\\n" @call:call_body "\\n" token("</tool_call>")
    digits    = [0-9]+

Expressions: "literal" or 'literal' (with \\n \\t \\r \\\\ \\" \\' \\uXXXX escapes), character
classes [a-z_] / [^"\\\\] (Unicode scalars), `.` (any character), rule names, grouping ( ),
ordered choice `|`, sequence by juxtaposition, `?`, `*`, `+`, `{m}`, `{m,}`, `{m,n}`,
captures `@tag:item`, and the built-ins:

* `token("<|channel|>")`  a special token (matched by id, never by text)
* `until("a", "b")`      text containing none of the strings (`until()` is any text)
* `json`, `json(name)`    a JSON value, any or constrained by the schema `schemas[name]`
* `trigger(item)`         marks where a lazily constrained region starts

The start rule is `root` when defined, else the first rule.

The parser is recursive descent over one compiled regex's tokens, not a parser generator: a
dialect's tool grammar (hundreds of definitions) is parsed in the request thread, where an
LALR parse and tree transform cost most of the front-end. Its recursion is bounded by
`MAX_NESTING`, checked as it descends.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from pegmask.grammars.counted import count_literal
from pegmask.grammars.errors import GrammarError
from pegmask.grammars.ir import (
    MAX_UNICODE,
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
    seq,
)
from pegmask.grammars.program import check_rules

# Groups (a call's argument is one) and captures nest at most this deep, the regex front-end's
# bound: the parser and the IR's walks recurse once per level, and real grammars nest a few.
MAX_NESTING = 100

# One token per match, whitespace and comments before it included; its kind is the name of
# its group. `end` is the end of the definition, `bad` a character no token starts with. A
# built-in's name takes its `(` (`token (` is a rule name and a group), as in the lark
# meta-grammar this replaced.
_TOKEN = re.compile(r"""
    [ \t\r\n]* (?:\#[^\n]*[ \t\r\n]*)*
    (?:
      (?P<string>"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*')
    | (?P<charclass>\[(?:\\.|[^\]\\\n])*\])
    | (?P<capture>@[A-Za-z_][A-Za-z0-9_.\-]*:)
    | (?P<func>(?:token|until|json|trigger)\()
    | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
    | (?P<int>[0-9]+)
    | (?P<quantifier>[?*+])
    | (?P<eq>=) | (?P<bar>\|) | (?P<lparen>\() | (?P<rparen>\)) | (?P<lbrace>\{) | (?P<rbrace>\})
    | (?P<comma>,) | (?P<dot>\.)
    | (?P<end>\Z)
    | (?P<bad>[\s\S])
    )""", re.VERBOSE)
_ITEM_START = frozenset({"capture", "string", "charclass", "dot", "name", "lparen", "func"})
_QUANTIFIERS = {"?": (0, 1), "*": (0, None), "+": (1, None)}
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "0": "\0", "f": "\f", "b": "\b", "v": "\v"}
_WIDTHS = {"u": 4, "x": 2, "U": 8}  # hex digits of \\uXXXX, \\xXX, \\UXXXXXXXX
_HEX = frozenset("0123456789abcdefABCDEF")
# The tokens hold escapes whole (a backslash and the character after it).
_ESCAPE = re.compile(r"\\(u.{0,4}|x.{0,2}|U.{0,8}|.)", re.DOTALL)

# The helpers below raise GrammarError without a position: the parser adds the item's (only
# then is a line and column worth computing).


def _escaped(escape: str) -> str:
    """The character of an escape's text after the backslash (`n`, `u00e9`, `"`: itself)."""
    kind = escape[0]
    if kind in _WIDTHS:
        digits = escape[1:]
        if (len(digits) != _WIDTHS[kind] or any(d not in _HEX for d in digits)
                or int(digits, 16) > MAX_UNICODE):
            raise GrammarError(f"bad \\{kind} escape")
        return chr(int(digits, 16))
    return _ESCAPES.get(kind, kind)


def _unescape(body: str) -> list[str]:
    """Decode escapes of a class body; returns one entry per character, escaped
    metacharacters (`\\-`, `\\]`) prefixed with a backslash so the class parser can tell them
    apart."""
    chars: list[str] = []
    position = 0
    for match in _ESCAPE.finditer(body):
        chars.extend(body[position:match.start()])
        escape = match.group(1)
        known = escape[0] in _WIDTHS or escape[0] in _ESCAPES
        chars.append(_escaped(escape) if known else "\\" + escape)
        position = match.end()
    chars.extend(body[position:])
    return chars


def _char_class(text: str) -> CharClass:
    """The class `[...]` / `[^...]`: an escaped `-` is a character, never a range's dash."""
    body = text[1:-1]
    negated = body.startswith("^")
    if negated:
        body = body[1:]
    decoded = _unescape(body)
    items = [c[1] if len(c) == 2 else c for c in decoded]
    literal = [len(c) == 2 for c in decoded]
    ranges: list[tuple[int, int]] = []
    i = 0
    while i < len(items):
        if i + 2 < len(items) and items[i + 1] == "-" and not literal[i + 1]:
            lo, hi = ord(items[i]), ord(items[i + 2])
            if lo > hi:
                raise GrammarError(f"bad character range {items[i]}-{items[i + 2]}")
            ranges.append((lo, hi))
            i += 3
        else:
            ranges.append((ord(items[i]), ord(items[i])))
            i += 1
    if not ranges and not negated:
        raise GrammarError("empty character class")
    return CharClass(tuple(ranges), negated)


def _string(text: str) -> Literal:
    """The literal `"..."` / `'...'`; a lone surrogate (`"\\ud800"`) has no UTF-8."""
    value = text[1:-1]
    if "\\" in value:
        value = _ESCAPE.sub(lambda match: _escaped(match.group(1)), value)
    try:
        return Literal.of(value)
    except UnicodeEncodeError:
        raise GrammarError("string has a lone surrogate") from None


def _builtin(func: str, args: list[Node], schemas: dict[str, Any]) -> Node:
    """The built-in `func(args...)`."""
    if func == "token":
        if len(args) != 1 or not isinstance(args[0], Literal) or not args[0].data:
            raise GrammarError(f'{func}() takes one non-empty string, e.g. {func}("<|end|>")')
        return Special(args[0].data.decode("utf-8"))
    if func == "until":
        stops: list[bytes] = []
        for arg in args:
            if isinstance(arg, Special):
                continue  # text never contains a special token: it always ends the text
            if not isinstance(arg, Literal) or not arg.data:
                raise GrammarError("until() takes non-empty strings or token(...)")
            stops.append(arg.data)
        return Until(tuple(stops))
    if func == "json":
        if not args:
            return JsonSchema("{}")
        if len(args) != 1:
            raise GrammarError("json() takes one schema name")
        arg = args[0]
        if isinstance(arg, Ref):
            if arg.name not in schemas:
                raise GrammarError(f"json({arg.name}): no schema named {arg.name!r}")
            schema = schemas[arg.name]
            if isinstance(schema, JsonSchema):  # a schema with front-end options
                return schema
        elif isinstance(arg, Literal):
            try:
                schema = json.loads(arg.data)
            except ValueError as exc:
                raise GrammarError(f"json(): invalid inline schema: {exc}") from exc
        else:
            raise GrammarError("json() takes a schema name or inline JSON text")
        return JsonSchema(json.dumps(schema))
    if len(args) != 1:  # trigger, the tokenizer's last built-in
        raise GrammarError("trigger() takes one expression")
    return Trigger(args[0])


class _Parser:
    """Recursive descent over one definition (`name = expr`), reading tokens as it goes (a
    definition nested too deeply is refused at the level past the bound, unread beyond)::

        expr    = item* ("|" item*)*
        item    = capture* primary (quantifier | "{" int "}" | "{" int "," int? "}")?
        primary = string | charclass | "." | name | "(" expr ")" | func ")"
                | func expr ("," expr)* ")"

    `depth` counts the groups, call arguments and captures around what is being parsed."""

    def __init__(self, definition: str, first_line: int, schemas: dict[str, Any]):
        self.definition = definition
        self.first_line = first_line
        self.schemas = schemas
        self._tokens = _TOKEN.finditer(definition)
        self.token = next(self._tokens)
        self.kind = self.token.lastgroup

    def parse(self) -> tuple[str, Node]:
        name = self._expect("name").group("name")
        self._expect("eq")
        body = self._expr(0)
        if self.kind != "end":
            raise self._unexpected(self.token)
        return name, body

    def _advance(self) -> re.Match[str]:
        """Move to the next token; returns the current one (never the end: nothing takes it)."""
        token = self.token
        self.token = next(self._tokens)
        self.kind = self.token.lastgroup
        return token

    def _expect(self, kind: str) -> re.Match[str]:
        if self.kind != kind:
            raise self._unexpected(self.token)
        return self._advance()

    def _expr(self, depth: int) -> Node:
        alternatives: list[Node] = []
        items: list[Node] = []
        while True:
            kind = self.kind
            if kind in _ITEM_START:
                items.append(self._item(depth))
            elif kind == "bar":
                alternatives.append(seq(*items))
                items = []
                self._advance()
            else:
                alternatives.append(seq(*items))
                return choice(*alternatives)

    def _item(self, depth: int) -> Node:
        tags: list[str] = []
        while self.kind == "capture":
            depth += 1
            self._check_depth(depth, self.token)
            tags.append(self._advance().group("capture")[1:-1])
        kind = self.kind
        if kind == "end":
            raise self._unexpected(self.token)
        token = self._advance()
        node: Node
        if kind == "name":
            node = Ref(token.group(kind))
        elif kind == "string":
            node = self._built(token, _string, token.group(kind))
        elif kind == "charclass":
            node = self._built(token, _char_class, token.group(kind))
        elif kind == "dot":
            node = CharClass((), negated=True)  # a node of its own, as each item
        elif kind == "lparen":
            self._check_depth(depth + 1, token)
            node = self._expr(depth + 1)
            self._expect("rparen")
        elif kind == "func":
            node = self._call(token, depth + 1)
        else:
            raise self._unexpected(token)
        if self.kind == "quantifier":
            node = Repeat(node, *_QUANTIFIERS[self._advance().group("quantifier")])
        elif self.kind == "lbrace":
            node = self._counted(node)
        for tag in reversed(tags):
            node = Capture(tag, node)
        return node

    def _call(self, func: re.Match[str], depth: int) -> Node:
        """A built-in's arguments: `f()` has none, an argument between commas may be empty."""
        args: list[Node] = []
        if self.kind == "rparen":
            self._advance()
        else:
            self._check_depth(depth, func)
            args.append(self._expr(depth))
            while self.kind == "comma":
                self._advance()
                args.append(self._expr(depth))
            self._expect("rparen")
        return self._built(func, _builtin, func.group("func")[:-1], args, self.schemas)

    def _counted(self, item: Node) -> Node:
        """`{m}`, `{m,}` or `{m,n}` after `item` (the current token is the `{`)."""
        self._advance()
        low_token = self._expect("int")
        low = count_literal(low_token.group("int"))
        if self.kind == "rbrace":
            self._advance()
            return Repeat(item, low, low)
        self._expect("comma")
        high = count_literal(self._advance().group("int")) if self.kind == "int" else None
        self._expect("rbrace")
        if high is not None and high < low:
            raise self._error(f"repetition {{{low},{high}}} has max < min", low_token)
        return Repeat(item, low, high)

    def _built(self, token: re.Match[str], build: Callable[..., Node], *args: Any) -> Node:
        """`build(*args)`, its error placed at `token`."""
        try:
            return build(*args)
        except GrammarError as exc:
            raise self._error(str(exc), token) from None

    def _check_depth(self, depth: int, token: re.Match[str]) -> None:
        if depth > MAX_NESTING:
            raise self._error(f"groups and captures nested too deeply (limit {MAX_NESTING})",
                              token)

    def _unexpected(self, token: re.Match[str]) -> GrammarError:
        kind = token.lastgroup
        if kind == "end":
            return self._error("unexpected end of rule", token)
        text = token.group(kind)
        if kind == "bad":
            hint = " (lookahead & and ! are not supported)" if text in "&!" else ""
            return self._error(f"unexpected character {text!r}{hint}", token)
        return self._error(f"unexpected {text!r}", token)

    def _error(self, message: str, token: re.Match[str]) -> GrammarError:
        """`message` at the token (the end: just past the last token)."""
        kind = token.lastgroup
        offset = token.start() if kind == "end" else token.start(kind)
        definition = self.definition
        line = self.first_line + definition.count("\n", 0, offset)
        return GrammarError(message, line=line, column=offset - definition.rfind("\n", 0, offset))


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """Group physical lines into definitions: a line that starts at column 0 with something
    other than `|` or `#` starts a new definition; others continue the current one. A blank
    line inside a definition stays (empty), so that lines count as in the text."""
    definitions: list[tuple[int, list[str]]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or (stripped.startswith("#") and not definitions):
            continue
        starts_new = not line[0].isspace() and not stripped.startswith(("|", "#"))
        if starts_new or not definitions:
            definitions.append((number, [line]))
        else:
            first, lines = definitions[-1]
            lines.extend([""] * (number - first - len(lines)))
            lines.append(line)
    return [(number, "\n".join(lines)) for number, lines in definitions]


def peg_to_ir(text: str, *, start: str | None = None,
              schemas: dict[str, Any] | None = None) -> GrammarIR:
    """Parse PEG DSL text into a checked `GrammarIR` (undefined rules and left recursion are
    reported here, with the offending rule)."""
    rules: dict[str, Node] = {}
    for first_line, definition in _logical_lines(text):
        name, body = _Parser(definition, first_line, schemas or {}).parse()
        if name in rules:
            raise GrammarError(f"rule {name!r} is defined twice", line=first_line, column=1)
        rules[name] = body
    if not rules:
        raise GrammarError("grammar defines no rules")
    start_rule = start or ("root" if "root" in rules else next(iter(rules)))
    ir = GrammarIR(rules, start_rule)
    check_rules(ir)
    return ir
