"""The `gemma` dialect: Gemma 4 `<|tool_call>call:NAME{...}<tool_call|>` calls whose arguments
are Gemma's JSON dialect, unquoted keys and strings between `<|"|>` tokens (gemma.peg).

The strict grammar is written from each tool's schema here (`GemmaValues`): keys in sorted order
as the template writes them, strings raw between the delimiters (a constrained string's schema
applies to that text), numbers and booleans as JSON, null as `null` or Python's `None` (which the
template writes), arrays and objects recursively
(objects take their declared properties only; a schema without properties any members).
`allOf`, `not`, `if` and `patternProperties` have no Gemma form here: such a tool is refused
with a clear error. Parsed values are converted to JSON (`read_value`; Python's `None`, `True`
read too). ``reasoning`` is detected from the output: the model writes
`<|channel>thought...<channel|>` when the template's ``enable_thinking`` is on (its prompt
otherwise closes an empty channel itself); a request's ``enable_thinking: false`` turns it off.

Prompts come from the model's template.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from pegmask.dialects.base import (
    TurnDialect,
    peg_literal,
    schema_type,
    separated,
)
from pegmask.dialects.schema_values import SchemaValueRules

QUOTE = '<|"|>'
_Q = "Q"  # the rule of the delimiter token
_PROBE_CALL = re.compile(r"<\|tool_call>call:pegmask_probe\{pegmask_arg:")


class GemmaValues(SchemaValueRules):
    """Gemma-style values: strings between `<|"|>` delimiters, JSON-like arrays and objects with
    keys in sorted order."""

    family, syntax, any_value, raw_until = "gemma", "Gemma-style", "gvalue", QUOTE

    def literal(self, value: Any) -> str:
        return literal(value)

    def string_value(self, schema: dict[str, Any]) -> str:
        return f"{_Q} {self.string(schema)} {_Q}"

    def scalar(self, schema: dict[str, Any], kind: str) -> str:
        if kind == "null":  # the template writes Python's None
            return '("null" | "None")'
        return self._json(schema)

    def array(self, schema: dict[str, Any]) -> str:
        item = self.value(schema.get("items", True))
        low, high = int(schema.get("minItems", 0)), schema.get("maxItems")
        if high == 0:
            return '"[" gws "]"'
        more = f"(gsep {item}){{{max(low - 1, 0)},{'' if high is None else int(high) - 1}}}"
        items = f"{item} {more}"
        return f'"[" gws {items if low else f"({items})?"} gws "]"'

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


def in_order(items: list[tuple[str, bool]], sep: str) -> str:
    """The items (rule, required) in their order, the optional ones each at most once, joined
    by `sep` (Gemma writes keys sorted, required or not)."""
    required = [i for i, (_, needed) in enumerate(items) if needed]
    if not required:
        return separated([], [rule for rule, _ in items], sep)
    first = required[0]
    parts = [f"({rule} {sep})?" for rule, _ in items[:first]] + [items[first][0]]
    parts += [f"{sep} {rule}" if needed else f"({sep} {rule})?"
              for rule, needed in items[first + 1:]]
    return "(" + " ".join(parts) + ")"


def literal(value: Any) -> str:
    """A JSON value as the PEG of its Gemma spelling."""
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
def read_value(text: str, schema: Any = None) -> Any:
    """The JSON value of a Gemma-style value (ValueError if it is none). `schema` is not
    needed: Gemma's syntax tells strings, numbers and literals apart."""
    value, end = _read(text, _skip(text, 0))
    if _skip(text, end) != len(text):
        raise ValueError(f"trailing text in a Gemma value: {text[end:]!r}")
    return value


_SCALARS = {"true": True, "false": False, "null": None, "True": True, "False": False,
            "None": None}


def _skip(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


def _read(text: str, i: int) -> tuple[Any, int]:
    if text.startswith(QUOTE, i):
        end = text.index(QUOTE, i + len(QUOTE))
        return text[i + len(QUOTE):end], end + len(QUOTE)
    if text.startswith("[", i):
        return _read_items(text, _skip(text, i + 1), "]", lambda j: _read(text, j))
    if text.startswith("{", i):
        members, end = _read_items(text, _skip(text, i + 1), "}", lambda j: _member(text, j))
        return dict(members), end
    match = re.compile(r"[^,\]}\s]+").match(text, i)
    if not match:
        raise ValueError(f"no Gemma value at {text[i:]!r}")
    word = match.group()
    return (_SCALARS[word] if word in _SCALARS else json.loads(word)), match.end()


def _member(text: str, i: int) -> tuple[tuple[str, Any], int]:
    if text.startswith(QUOTE, i):
        key, i = _read(text, i)
    else:
        end = text.index(":", i)
        key, i = text[i:end].strip(), end
    i = _skip(text, i)
    if not text.startswith(":", i):
        raise ValueError(f"':' expected in a Gemma object at {text[i:]!r}")
    value, i = _read(text, _skip(text, i + 1))
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


class GemmaDialect(TurnDialect):
    name = "gemma"
    priority = 60
    probe = (_PROBE_CALL,)
    value_readers = {"gemma": read_value}
    peg_file = "gemma.peg"
    raw_until = QUOTE

    def substitutions(self, strict: bool) -> dict[str, str]:
        return {"gws": '""' if strict else "[ \\t\\r\\n]*"}

    def param_rules(self, sections: dict[str, str], index: int, schema: dict[str, Any],
                    grammar_of: Callable[[Any], Any]) -> tuple[str, str, dict[str, Any]]:
        """One `key:value` rule per declared property, in sorted order: strings captured raw
        between the delimiters, other values as Gemma text converted after parsing."""
        properties = schema.get("properties")
        if not isinstance(properties, dict) or not properties:
            return "", "any_params", {}
        values = GemmaValues(f"g_{index}", schema)
        required = set(schema.get("required") or ())
        text, members = "", []
        for j, key in enumerate(sorted(properties)):
            sub = properties[key]
            head = f'@param:(@key:{peg_literal(key)} ":" '
            if schema_type(sub) == "string" and not any(k in sub for k in ("anyOf", "oneOf")):
                body = f"{_Q} @string:{values.string(sub)} {_Q})"
            else:
                body = f"@gemma:({values.value(sub)}))"
            text += f"p_{index}_{j} = {head}{body}\n"
            members.append((f"p_{index}_{j}", key in required))
        text += "".join(rule + "\n" for rule in values.rules)
        return text, in_order(members, "gsep"), values.schemas
