"""Python literals as tool-call argument values (the pythonic call lists of Llama 3.2 / 4 and
LFM2: `[get_weather(city="Paris", days=3)]`): the reader back to JSON (`read_value`, and
`read_calls` for a whole list), the writer (`literal`, `call_list`), and strict PEG rules from
a JSON Schema (`PythonValues`).

Values are read with Python's own parser (`ast`), never evaluated: strings with either quote and
Python's escapes, numbers, `True` / `False` / `None`, lists, tuples (as arrays) and dicts with
string keys. JSON's `true` / `false` / `null` are read too: LFM2.5's template writes a mapping
argument with `tojson` inside the Python list.

The rules refer to rules the dialect's grammar defines: `ws` (whitespace), `pstring` (any
string literal), `pvalue` (any value) and `pdict` (any dict).
"""

from __future__ import annotations

import ast
import json
import math
import warnings
from collections.abc import Sequence
from typing import Any

from pegmask.dialects.base import alternatives, peg_literal, raw_string_values
from pegmask.dialects.quoted_values import in_order
from pegmask.dialects.schema_values import SchemaValueRules

_NAMES = {"True": True, "False": False, "None": None, "true": True, "false": False,
          "null": None}


# ------------------------------------------------------------------------------ reading
def read_value(text: str, schema: Any = None) -> Any:
    """The JSON value a Python literal spells (ValueError if it is none). `schema` is not
    needed: the literal's syntax says its type."""
    return _value(_parse(text))


def _parse(text: str) -> ast.expr:
    """The expression `text` holds; an unknown escape (`"\\<"`) is a backslash, as Python
    reads it, without its warning."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", (SyntaxWarning, DeprecationWarning))
            return ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, ValueError, MemoryError, RecursionError) as exc:
        raise ValueError(f"not a Python literal: {text[:80]!r}") from exc


def read_calls(text: str) -> list[tuple[str, dict[str, Any]]]:
    """The calls of a pythonic call list `[name(key=value, ...), ...]` (ValueError if it is
    none): what the whole list says, for checking a template's rendering."""
    body = _parse(text)
    if not isinstance(body, ast.List):
        raise ValueError("a pythonic call list is a list")
    calls = []
    for node in body.elts:
        if not isinstance(node, ast.Call) or node.args or not isinstance(node.func, ast.Name):
            raise ValueError("each item of a pythonic call list is a call by keywords")
        if any(keyword.arg is None for keyword in node.keywords):
            raise ValueError("a pythonic call names every argument")
        calls.append((node.func.id, {str(k.arg): _value(k.value) for k in node.keywords}))
    return calls


def _value(node: ast.expr) -> Any:
    if isinstance(node, ast.Constant) and (node.value is None or isinstance(
            node.value, (str, int, float))):
        if isinstance(node.value, float) and not math.isfinite(node.value):
            raise ValueError("a non-finite number is no JSON value")
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)) \
            and isinstance(node.operand, ast.Constant) \
            and type(node.operand.value) in (int, float):
        value = node.operand.value
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.Name) and node.id in _NAMES:
        return _NAMES[node.id]
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_value(item) for item in node.elts]
    if isinstance(node, ast.Dict):
        members = {}
        for key, item in zip(node.keys, node.values, strict=True):
            if key is None or not isinstance(name := _value(key), str):
                raise ValueError("a dict's keys are strings")
            members[name] = _value(item)
        return members
    raise ValueError(f"not a JSON-kind Python literal: {ast.dump(node)[:80]}")


# ------------------------------------------------------------------------------ writing
def literal(value: Any) -> str:
    """A JSON value as a Python literal (strings double-quoted with JSON's escapes, which
    Python reads alike)."""
    if value is True or value is False or value is None:
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(literal(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{literal(k)}: {literal(v)}" for k, v in value.items()) + "}"
    return json.dumps(value, ensure_ascii=False)


def call_list(calls: Sequence[tuple[str, dict[str, Any]]]) -> str:
    """Calls as a pythonic call list, as the models write them."""
    return "[" + ", ".join(
        f"{name}(" + ", ".join(f"{key}={literal(value)}" for key, value in arguments.items()) + ")"
        for name, arguments in calls) + "]"


# ------------------------------------------------------------------------------ strict rules
class PythonValues(SchemaValueRules):
    """Python-literal values typed by a JSON Schema: strings in either quote, `True` /
    `False` / `None`, JSON's numbers (Python reads them alike), lists, and dicts whose declared
    keys come in schema order. A constrained string (pattern, format, length) is its raw text
    between double quotes, so it never holds a double quote."""

    family, syntax, any_value, raw_until = "pythonic", "Python-literal", "pvalue", '"'

    def literal(self, value: Any) -> str:
        if isinstance(value, str):  # either quote, as models write both
            return alternatives([peg_literal(json.dumps(value, ensure_ascii=False)),
                                 peg_literal(repr(value))])
        return peg_literal(literal(value))

    def string_value(self, schema: dict[str, Any]) -> str:
        values = raw_string_values(schema)
        if values == []:
            return "pstring"
        if values is not None:
            return alternatives([self.literal(v) for v in values])
        return f'"\\"" {self._json(schema, raw_until=self.raw_until)} "\\""'

    def scalar(self, schema: dict[str, Any], kind: str) -> str:
        if kind == "boolean":
            return '("True" | "False")'
        if kind == "null":
            return '"None"'
        return self._json(schema)

    def array(self, schema: dict[str, Any]) -> str:
        return self.bracketed_items(schema, "ws", 'ws "," ws')

    def object(self, schema: dict[str, Any]) -> str:
        properties = schema.get("properties")
        if not isinstance(properties, dict) or not properties:
            return '"{" ws "}"' if schema.get("additionalProperties") is False else "pdict"
        required = set(schema.get("required") or ())
        members = []
        for key, sub in properties.items():
            quoted = self.literal(key)
            members.append((self.rule(f'{quoted} ws ":" ws {self.value(sub)}'), key in required))
        return f'"{{" ws {in_order(members, "psep")} ws "}}"'


def python_params(index: int, schema: dict[str, Any], tag: str) -> tuple[str, str, dict[str, Any]]:
    """A dialect's `param_rules` for keyword arguments: one rule `p_<index>_<j>` per declared
    property in schema order (`key=value`, the value captured under `tag`), the expression
    listing them (each optional one at most once, joined by `psep`) and their schemas. No
    declared properties: any keyword arguments (`any_params`), none where the schema closes
    the object."""
    properties = schema.get("properties")
    if not isinstance(properties, dict) or not properties:
        return "", '""' if schema.get("additionalProperties") is False else "any_params", {}
    values = PythonValues(f"v_{index}", schema)
    required = set(schema.get("required") or ())
    text, members = "", []
    for j, (key, sub) in enumerate(properties.items()):
        if not key.isidentifier():
            raise ValueError(f"pythonic: the argument name {key!r} is no Python identifier")
        text += (f'p_{index}_{j} = @param:(@key:{peg_literal(key)} ws "=" ws '
                 f"@{tag}:({values.value(sub)}))\n")
        members.append((f"p_{index}_{j}", key in required))
    text += "".join(rule + "\n" for rule in values.rules)
    return text, in_order(members, "psep"), values.schemas
