"""The PEG DSL front-end: text grammars (meta-grammar in lark) to the IR.

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
"""

from __future__ import annotations

import json
from typing import Any

from lark import Lark, Token, Transformer, Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, VisitError

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

_PARSER = Lark(META_GRAMMAR, start="definition", parser="lalr", maybe_placeholders=False)

# Groups (a call's argument is one) and captures nest at most this deep, the regex front-end's
# bound: the tree's transform and the IR's walks recurse once per level, and real grammars
# nest a few levels.
MAX_NESTING = 100
_NESTING_NODES = frozenset({"sequence", "capture"})

_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "0": "\0", "f": "\f", "b": "\b", "v": "\v"}


def _unescape(body: str, line: int) -> list[str]:
    """Decode escapes of a string or class body; returns one entry per character, escaped
    class metacharacters prefixed with a backslash so the class parser can tell them apart."""
    chars: list[str] = []
    i = 0
    while i < len(body):
        c = body[i]
        if c != "\\":
            chars.append(c)
            i += 1
            continue
        if i + 1 >= len(body):
            raise GrammarError("dangling backslash", line=line)
        e = body[i + 1]
        if e in _ESCAPES:
            chars.append(_ESCAPES[e])
            i += 2
        elif e in "ux":
            width = 4 if e == "u" else 2
            digits = body[i + 2 : i + 2 + width]
            if len(digits) != width or any(d not in "0123456789abcdefABCDEF" for d in digits):
                raise GrammarError(f"bad \\{e} escape", line=line)
            chars.append(chr(int(digits, 16)))
            i += 2 + width
        elif e == "U":
            digits = body[i + 2 : i + 10]
            if len(digits) != 8 or int(digits, 16) > MAX_UNICODE:
                raise GrammarError("bad \\U escape", line=line)
            chars.append(chr(int(digits, 16)))
            i += 10
        else:
            chars.append("\\" + e)
            i += 2
    return chars


def _char_class(text: str, line: int) -> CharClass:
    body = text[1:-1]
    negated = body.startswith("^")
    if negated:
        body = body[1:]
    items = [c[1] if len(c) == 2 else c for c in _unescape(body, line)]
    literal = [len(c) == 2 for c in _unescape(body, line)]  # escaped: never a range dash
    ranges: list[tuple[int, int]] = []
    i = 0
    while i < len(items):
        if i + 2 < len(items) and items[i + 1] == "-" and not literal[i + 1]:
            lo, hi = ord(items[i]), ord(items[i + 2])
            if lo > hi:
                raise GrammarError(f"bad character range {items[i]}-{items[i + 2]}", line=line)
            ranges.append((lo, hi))
            i += 3
        else:
            ranges.append((ord(items[i]), ord(items[i])))
            i += 1
    if not ranges and not negated:
        raise GrammarError("empty character class", line=line)
    return CharClass(tuple(ranges), negated)


def _string(token: Token) -> str:
    body = str(token)[1:-1]
    return "".join(c[1] if len(c) == 2 and c[0] == "\\" else c for c in _unescape(body, token.line))


class _ToIR(Transformer):
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

    # Methods take the children list (no `v_args`: lark wraps such a method at every call,
    # a third of a dialect grammar's parse with hundreds of tools).
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
        return Literal.of(_string(children[0]))

    def charclass(self, children: list[Token]) -> Node:
        return _char_class(str(children[0]), self._line(children[0]))

    def any_char(self, _children: list[Any]) -> Node:
        return CharClass((), negated=True)

    def ref(self, children: list[Token]) -> Node:
        return Ref(str(children[0]))

    def call(self, children: list[Any]) -> Node:
        func_token, args = children[0], children[1:]
        func = str(func_token)[:-1]
        line = self._line(func_token)
        if func == "token":
            name = self._literal_arg(func, args, line)
            return Special(name)
        if func == "until":
            stops: list[bytes] = []
            for arg in args:
                if isinstance(arg, Special):
                    continue  # text never contains a special token: it always ends the text
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
                if isinstance(schema, JsonSchema):  # a schema with front-end options
                    return schema
            elif isinstance(arg, Literal):
                try:
                    schema = json.loads(arg.data)
                except ValueError as exc:
                    raise GrammarError(f"json(): invalid inline schema: {exc}", line=line) from exc
            else:
                raise GrammarError("json() takes a schema name or inline JSON text", line=line)
            return JsonSchema(json.dumps(schema))
        if func == "trigger":
            if len(args) != 1:
                raise GrammarError("trigger() takes one expression", line=line)
            return Trigger(args[0])
        raise GrammarError(f"unknown function {func}()", line=line)  # pragma: no cover

    @staticmethod
    def _literal_arg(func: str, args: list[Any], line: int) -> str:
        if len(args) != 1 or not isinstance(args[0], Literal) or not args[0].data:
            raise GrammarError(f'{func}() takes one non-empty string, e.g. {func}("<|end|>")', line=line)
        return args[0].data.decode("utf-8")


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """Group physical lines into definitions: a line that starts at column 0 with something
    other than `|` or `#` starts a new definition; others continue the current one."""
    definitions: list[tuple[int, list[str]]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or (stripped.startswith("#") and not definitions):
            continue
        starts_new = not line[0].isspace() and not stripped.startswith(("|", "#"))
        if starts_new or not definitions:
            definitions.append((number, [line]))
        else:
            definitions[-1][1].append(line)
    return [(number, "\n".join(lines)) for number, lines in definitions]


def peg_to_ir(text: str, *, start: str | None = None,
              schemas: dict[str, Any] | None = None) -> GrammarIR:
    """Parse PEG DSL text into a checked `GrammarIR` (undefined rules and left recursion are
    reported here, with the offending rule)."""
    rules: dict[str, Node] = {}
    transformer = _ToIR(schemas or {}, 0)  # one for all: making one wraps all its methods
    for first_line, definition in _logical_lines(text):
        try:
            tree = _PARSER.parse(definition)
            _check_nesting(tree, first_line)
            transformer.line_offset = first_line - 1
            name, body = transformer.transform(tree)
        except VisitError as exc:
            if isinstance(exc.orig_exc, GrammarError):
                raise exc.orig_exc from None
            raise
        except UnexpectedInput as exc:
            raise _syntax_error(exc, definition, first_line) from None
        if name in rules:
            raise GrammarError(f"rule {name!r} is defined twice", line=first_line, column=1)
        rules[name] = body
    if not rules:
        raise GrammarError("grammar defines no rules")
    start_rule = start or ("root" if "root" in rules else next(iter(rules)))
    ir = GrammarIR(rules, start_rule)
    check_rules(ir)
    return ir


def _check_nesting(tree: Tree, first_line: int) -> None:
    """Refuse a definition whose groups and captures nest past `MAX_NESTING`, walking
    the parse tree without recursion (the LALR parse itself never recurses)."""
    stack: list[tuple[Tree, int]] = [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        if node.data in _NESTING_NODES:
            depth += 1
            if depth > MAX_NESTING + 1:  # the rule body is the first sequence
                line, column = _position(node, first_line)
                raise GrammarError(f"groups and captures nested too deeply (limit "
                                   f"{MAX_NESTING})", line=line, column=column)
        stack.extend((child, depth) for child in node.children if isinstance(child, Tree))


def _position(node: Tree, first_line: int) -> tuple[int | None, int | None]:
    """Where a parse tree node's first token is in the grammar text (iteratively: the node
    may be deep)."""
    stack: list[Tree | Token] = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, Token):
            return first_line + (item.line or 1) - 1, item.column
        stack.extend(reversed(item.children))
    return first_line, None


def _syntax_error(exc: UnexpectedInput, definition: str, first_line: int) -> GrammarError:
    line = first_line + (exc.line - 1 if exc.line and exc.line > 0 else 0)
    column = exc.column if exc.column and exc.column > 0 else None
    if isinstance(exc, UnexpectedEOF):
        return GrammarError("unexpected end of rule", line=line, column=column)
    if isinstance(exc, UnexpectedCharacters):
        char = definition[exc.pos_in_stream] if exc.pos_in_stream is not None else "?"
        hint = " (lookahead & and ! are not supported)" if char in "&!" else ""
        return GrammarError(f"unexpected character {char!r}{hint}", line=line, column=column)
    token = getattr(exc, "token", None)
    if token is not None and token.type == "$END":
        return GrammarError("unexpected end of rule", line=line, column=column)
    return GrammarError(f"unexpected {str(token)!r}", line=line, column=column)
