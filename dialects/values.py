"""How a tool call's parameter values are read: the capture tags a value comes in, the value
syntaxes the families declare, Python literals, and the JSON Schema type that decides how raw
text is read. The stream parser (`pegmask.dialects.stream`) and the families' readers share it."""

from __future__ import annotations

import ast
import functools
import json
import math
from collections.abc import Callable
from typing import Any

#: reads a value written in a family's own syntax: (text, the parameter's schema or None) -> the
#: JSON value; ValueError when the text is no value
ValueReader = Callable[[str, Any], Any]

#: what `python_literal` returns for text that is no JSON-kind literal
INVALID = object()
#: capture tags of a parameter's value in any dialect: raw text (`string`), JSON (`json`), text
#: typed by the schema (`value`); the families' own syntaxes add theirs (`value_readers`)
VALUE_TAGS = ("string", "json", "value")


@functools.cache
def value_readers() -> dict[str, ValueReader]:
    """The value readers every registered family declares, and the derived dialect's (not a
    family: engines parse with grammars alone), by capture tag."""
    from pegmask.dialects.derive import DerivedDialect
    from pegmask.dialects.registry import dialect_classes

    return {tag: reader for cls in (*dialect_classes(), DerivedDialect)
            for tag, reader in cls.value_readers.items()}


def schema_type(schema: Any) -> str | None:
    """The single JSON type a schema allows (`None` when unknown or several)."""
    if not isinstance(schema, dict):
        return None
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = kind[0] if len(kind) == 1 else None
    if isinstance(kind, str):
        return kind
    values = schema.get("enum", [schema["const"]] if "const" in schema else None)
    if isinstance(values, list) and values and all(isinstance(v, str) for v in values):
        return "string"
    return None


_JSON_SCALARS = (str, int, float, bool, type(None))


def python_literal(text: str) -> Any:
    """The JSON value a Python literal spells (tuples read as arrays), or `INVALID` when the
    text is no literal of JSON's kinds (sets, bytes, complex and non-finite numbers are not)."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return INVALID
    return _as_json(value)


def _as_json(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return INVALID
    if isinstance(value, _JSON_SCALARS):
        return value
    if isinstance(value, (list, tuple)):
        items = [_as_json(item) for item in value]
        return INVALID if any(item is INVALID for item in items) else items
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        members = {k: _as_json(v) for k, v in value.items()}
        return INVALID if any(v is INVALID for v in members.values()) else members
    return INVALID


def value_json(kind: str, raw: str, schema: Any, reader: ValueReader | None = None) -> str:
    """The JSON text of a whole parameter value captured as `kind`, typed by its schema when
    known; `reader`: the family's reader of `kind`, for a syntax of its own (its grammar follows
    the schema).

    `value` text loses one framing newline at each end. Any value of a string parameter is
    that string. Other text is read as JSON (kept as written), else as a Python literal
    (`{'a': 1}`, `True`, `None`: models whose prompts show Python values write them, and
    vLLM's parsers read them so), else it stays a string.
    """
    expected = schema_type(schema)
    if reader is not None:
        try:
            return dumps(reader(raw, schema))
        except ValueError:
            return dumps(raw)
    if kind == "value":
        raw = raw.removeprefix("\n").removesuffix("\n")
        if expected == "string":
            return dumps(raw)
    text = raw.strip()
    try:
        value, exact = json.loads(text), True
    except ValueError:
        value, exact = python_literal(text), False
    if value is INVALID or (kind == "string" and isinstance(value, str)):
        return dumps(raw)
    if expected == "string" and not isinstance(value, str):
        return dumps(text)
    return text if exact and kind != "string" else dumps(value)


def dumps(value: Any) -> str:
    """`value` as JSON text, non-ASCII characters as they are."""
    return json.dumps(value, ensure_ascii=False)
