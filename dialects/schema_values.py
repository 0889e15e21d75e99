"""Strict PEG rules for parameter values that a family writes in its own syntax (Gemma's JSON
dialect, MiniMax M3's and Cohere's XML), generated from each tool's JSON Schema.

`SchemaValueRules` walks the schema (`$ref`, `const` / `enum`, `anyOf` / `oneOf`, type lists,
types inferred from `properties` / `items`) and collects the named rules and JSON Schema nodes
the walk needs; a family's subclass says how each kind of value is spelled.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

from pegmask.dialects.base import alternatives, peg_literal, raw_string_values
from pegmask.grammars.ir import json_schema_node

#: keywords no family syntax can express as a grammar: refused at compile time
UNSUPPORTED = ("allOf", "not", "if", "patternProperties")
SCALARS = ("integer", "number", "boolean", "null")


class SchemaValueRules:
    """PEG rules of the values a JSON Schema allows, named `<prefix>_<n>`, and the JSON Schema
    nodes (numbers, constrained strings) they use."""

    #: the dialect's name and its syntax's name, for errors
    family: ClassVar[str]
    syntax: ClassVar[str]
    #: the rule of any value (a schema that says nothing)
    any_value: ClassVar[str]
    #: what ends a raw string value
    raw_until: ClassVar[str]

    def __init__(self, prefix: str, root: dict[str, Any]):
        self.prefix = prefix
        self.rules: list[str] = []
        self.schemas: dict[str, Any] = {}
        self.defs = {**root.get("definitions", {}), **root.get("$defs", {})}
        self.refs: dict[str, str] = {}

    # ------------------------------------------------------------- what a family spells
    def literal(self, value: Any) -> str:
        """A PEG literal of one `const` / `enum` value."""
        raise NotImplementedError

    def string_value(self, schema: dict[str, Any]) -> str:
        """A string value (`string(schema)` within the family's framing)."""
        return self.string(schema)

    def scalar(self, schema: dict[str, Any], kind: str) -> str:
        """A number, boolean or null: JSON by default."""
        return self._json(schema)

    def array(self, schema: dict[str, Any]) -> str:
        raise NotImplementedError

    def object(self, schema: dict[str, Any]) -> str:
        raise NotImplementedError

    def bracketed_items(self, schema: dict[str, Any], ws: str, sep: str) -> str:
        """`[ item, ... ]` within the array's `minItems` / `maxItems`, for a family whose
        whitespace rule is `ws` and item separator `sep` (rule names of its grammar)."""
        item = self.value(schema.get("items", True))
        low, high = int(schema.get("minItems", 0)), schema.get("maxItems")
        if high == 0:
            return f'"[" {ws} "]"'
        more = f"({sep} {item}){{{max(low - 1, 0)},{'' if high is None else int(high) - 1}}}"
        items = f"{item} {more}"
        return f'"[" {ws} {items if low else f"({items})?"} {ws} "]"'

    # ------------------------------------------------------------- the walk
    def value(self, schema: Any) -> str:
        if schema is True or schema == {}:
            return self.any_value
        if not isinstance(schema, dict):
            raise ValueError(f"{self.family}: the schema {schema!r} allows no value")
        unsupported = [key for key in UNSUPPORTED if key in schema]
        if unsupported:
            raise ValueError(f"{self.family}: {unsupported[0]} has no {self.syntax} form")
        if "$ref" in schema:
            return self.ref(schema["$ref"])
        if "const" in schema or "enum" in schema:
            values = [schema["const"]] if "const" in schema else schema["enum"]
            return alternatives([self.literal(v) for v in values])
        for key in ("anyOf", "oneOf"):
            if key in schema:
                rest = {k: v for k, v in schema.items() if k != key}
                return alternatives([self.value({**rest, **sub} if isinstance(sub, dict) else sub)
                                     for sub in schema[key]])
        kind = schema.get("type")
        if isinstance(kind, list):
            return alternatives([self.value({**schema, "type": k}) for k in kind])
        if kind is None:
            kind = "object" if "properties" in schema else "array" if "items" in schema else None
        if kind == "string":
            return self.string_value(schema)
        if kind in SCALARS:
            return self.scalar(schema, kind)
        if kind == "array":
            return self.array(schema)
        if kind == "object":
            return self.object(schema)
        return self.any_value

    def string(self, schema: dict[str, Any]) -> str:
        """The raw text: any, one of an enum, or obeying the schema."""
        values = raw_string_values(schema)
        if values == []:
            return "raw"
        if values is not None:
            return alternatives([peg_literal(v) for v in values])
        return self._json(schema, raw_until=self.raw_until)

    def ref(self, ref: str) -> str:
        if ref not in self.refs:
            target = ref.rsplit("/", 1)[-1]
            if not ref.startswith("#/") or target not in self.defs:
                raise ValueError(f"{self.family}: cannot resolve $ref {ref!r}")
            name = f"{self.prefix}_r{len(self.refs)}"
            self.refs[ref] = name
            self.rules.append(f"{name} = {self.value(self.defs[target])}")
        return self.refs[ref]

    def rule(self, body: str) -> str:
        """A new named rule for `body`."""
        name = f"{self.prefix}_{len(self.rules)}"
        self.rules.append(f"{name} = {body}")
        return name

    def _json(self, schema: dict[str, Any], **options: Any) -> str:
        name = f"{self.prefix}_s{len(self.schemas)}"
        defs = {"$defs": self.defs} if self.defs and "$ref" in json.dumps(schema) else {}
        self.schemas[name] = json_schema_node({**schema, **defs}, **options)
        return f"json({name})"
