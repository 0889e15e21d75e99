"""Values in a JSON dialect whose strings are written between a quote token and whose object
keys are bare, sorted (Gemma 4's `{city:<|"|>Tokyo<|"|>,days:3}`; templates write null as
Python's `None`): strict PEG rules from a JSON Schema (`QuotedValues`), and the reader back to
JSON (`read_value`).

The rules refer to rules the dialect's grammar defines: `Q` (the quote token), `gws`
(whitespace), `gsep` (`gws "," gws`), `gvalue` (any value) and `gobject` (any object);
`value_rules` writes them for a quote.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from pegmask.dialects.base import peg_literal, separated
from pegmask.dialects.schema_values import SchemaValueRules
from pegmask.dialects.values import schema_type

_Q = "Q"  # the rule of the quote token

def value_rules(quote: str) -> str:
    """The rules `QuotedValues` refers to, for `quote` (`gws`: `$gws`, for the dialect's
    substitutions to say: none in strict grammars)."""
    return f"""\
Q           = token({peg_literal(quote)})
gws         = $gws
gsep        = gws "," gws
gvalue      = Q raw Q | gnumber | "true" | "false" | "null" | "None" | garray | gobject
garray      = "[" gws (gvalue (gws "," gws gvalue)*)? gws "]"
gobject     = "{{" gws (gmember (gws "," gws gmember)*)? gws "}}"
gmember     = (gkey | Q raw Q) gws ":" gws gvalue
gkey        = [^:{{}}\\[\\],"<> \\t\\r\\n]+
gnumber     = "-"? [0-9]+ ("." [0-9]+)? ([eE] [+\\-]? [0-9]+)?
"""


class QuotedValues(SchemaValueRules):
    """Quoted-string values: strings between the quote, JSON-like arrays and objects with keys
    in sorted order."""

    family, syntax, any_value = "quoted values", "quoted-value", "gvalue"

    def __init__(self, prefix: str, root: dict[str, Any], quote: str):
        super().__init__(prefix, root)
        self.raw_until = quote

    def literal(self, value: Any) -> str:
        return literal(value)

    def string_value(self, schema: dict[str, Any]) -> str:
        return f"{_Q} {self.string(schema)} {_Q}"

    def scalar(self, schema: dict[str, Any], kind: str) -> str:
        if kind == "null":  # templates write Python's None
            return '("null" | "None")'
        return self._json(schema)

    def array(self, schema: dict[str, Any]) -> str:
        return self.bracketed_items(schema, "gws", "gsep")

    def object(self, schema: dict[str, Any]) -> str:
        properties = schema.get("properties")
        if not isinstance(properties, dict) or not properties:
            return '"{" gws "}"' if schema.get("additionalProperties") is False else "gobject"
        required = set(schema.get("required") or ())
        members = []
        for key in sorted(properties):
            name = self.rule(f'{peg_literal(key)} gws ":" gws {self.value(properties[key])}')
            members.append((name, key in required))
        return f'"{{" gws {in_order(members, "gsep")} gws "}}"'


def quoted_params(index: int, schema: dict[str, Any], quote: str, tag: str,
                  key_rule: Callable[[str], str]) -> tuple[str, str, dict[str, Any]]:
    """A dialect's `param_rules` for quoted values: one rule `p_<index>_<j>` per declared
    property, in sorted order (`key_rule(key)`: the PEG of the key and what parts it from the
    value), strings captured raw between the quotes, other values captured under `tag` (the
    dialect's reader converts them), the expression listing the rules and their schemas."""
    properties = schema.get("properties")
    if not isinstance(properties, dict) or not properties:
        return "", "any_params", {}
    values = QuotedValues(f"g_{index}", schema, quote)
    required = set(schema.get("required") or ())
    text, members = "", []
    for j, key in enumerate(sorted(properties)):
        sub = properties[key]
        if schema_type(sub) == "string" and not any(k in sub for k in ("anyOf", "oneOf")):
            body = f"{_Q} @string:{values.string(sub)} {_Q}"
        else:
            body = f"@{tag}:({values.value(sub)})"
        text += f"p_{index}_{j} = @param:({key_rule(key)} {body})\n"
        members.append((f"p_{index}_{j}", key in required))
    text += "".join(rule + "\n" for rule in values.rules)
    return text, in_order(members, "gsep"), values.schemas


def in_order(items: list[tuple[str, bool]], sep: str) -> str:
    """The items (rule, required) in their order, the optional ones each at most once, joined
    by `sep` (keys written sorted, required or not)."""
    required = [i for i, (_, needed) in enumerate(items) if needed]
    if not required:
        return separated([], [rule for rule, _ in items], sep)
    first = required[0]
    parts = [f"({rule} {sep})?" for rule, _ in items[:first]] + [items[first][0]]
    parts += [f"{sep} {rule}" if needed else f"({sep} {rule})?"
              for rule, needed in items[first + 1:]]
    return "(" + " ".join(parts) + ")"


def literal(value: Any) -> str:
    """A JSON value as the PEG of its quoted-value spelling."""
    if isinstance(value, str):
        return f"{_Q} {peg_literal(value)} {_Q}"
    if isinstance(value, list):
        items = ' "," '.join(literal(item) for item in value)
        return f'"[" {items} "]"'
    if isinstance(value, dict):
        members = ' "," '.join(f'{peg_literal(k)} ":" {literal(v)}' for k, v in
                               sorted(value.items()))
        return f'"{{" {members} "}}"'
    return peg_literal(json.dumps(value))


# ------------------------------------------------------------------------------ reading values
# A quote token where the reader is not told it: `<|x|>`.
_QUOTE_TOKEN = re.compile(r"<\|[^<>\s|]+\|>")


def read_value(text: str, schema: Any = None, quote: str | None = None) -> Any:
    """The JSON value of a quoted-value text (ValueError if it is none); `quote`: the quote
    token (None: any `<|x|>` token where a value starts). `schema` is not needed: the syntax
    tells strings, numbers and literals apart."""
    value, end = _read(text, _skip(text, 0), quote)
    if _skip(text, end) != len(text):
        raise ValueError(f"trailing text in a quoted value: {text[end:]!r}")
    return value


_SCALARS = {"true": True, "false": False, "null": None, "True": True, "False": False,
            "None": None}


def _skip(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


def _quote_at(text: str, i: int, quote: str | None) -> str | None:
    if quote is not None:
        return quote if text.startswith(quote, i) else None
    match = _QUOTE_TOKEN.match(text, i)
    return match.group() if match else None


def _read(text: str, i: int, quote: str | None) -> tuple[Any, int]:
    opened = _quote_at(text, i, quote)
    if opened is not None:
        end = text.index(opened, i + len(opened))
        return text[i + len(opened):end], end + len(opened)
    if text.startswith("[", i):
        return _read_items(text, _skip(text, i + 1), "]", lambda j: _read(text, j, quote))
    if text.startswith("{", i):
        members, end = _read_items(text, _skip(text, i + 1), "}",
                                   lambda j: _member(text, j, quote))
        return dict(members), end
    match = re.compile(r"[^,\]}\s]+").match(text, i)
    if not match:
        raise ValueError(f"no quoted value at {text[i:]!r}")
    word = match.group()
    return (_SCALARS[word] if word in _SCALARS else json.loads(word)), match.end()


def _member(text: str, i: int, quote: str | None) -> tuple[tuple[str, Any], int]:
    if _quote_at(text, i, quote) is not None:
        key, i = _read(text, i, quote)
    else:
        end = text.index(":", i)
        key, i = text[i:end].strip(), end
    i = _skip(text, i)
    if not text.startswith(":", i):
        raise ValueError(f"':' expected in a quoted-value object at {text[i:]!r}")
    value, i = _read(text, _skip(text, i + 1), quote)
    return (key, value), i


def _read_items(text: str, i: int, close: str,
                item: Callable[[int], tuple[Any, int]]) -> tuple[list[Any], int]:
    items: list[Any] = []
    if text.startswith(close, i):
        return items, i + 1
    while True:
        value, i = item(i)
        items.append(value)
        i = _skip(text, i)
        if text.startswith(close, i):
            return items, i + 1
        if not text.startswith(",", i):
            raise ValueError(f"',' or {close!r} expected at {text[i:]!r}")
        i = _skip(text, i + 1)
