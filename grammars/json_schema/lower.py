"""JSON Schema keywords to the front-end's normal form (`normal`): `Lowering` resolves `$ref`
over the document and turns each schema into a union of per-type atoms, combinators into
operations on them; `schema_to_rules` (the package) emits the rules from its result."""

from __future__ import annotations

import math
from collections.abc import Iterable
from decimal import Decimal
from typing import Any
from urllib.parse import unquote

from pegmask.grammars.errors import GrammarError, SchemaError, UnsupportedSchemaError
from pegmask.grammars.ir import Node
from pegmask.grammars.json_schema.formats import FORMATS, format_node
from pegmask.grammars.json_schema.normal import (
    ANY,
    NEVER,
    Algebra,
    ArrayAtom,
    AtomSet,
    BoolAtom,
    ConstAtom,
    KeyRules,
    NullAtom,
    NumberAtom,
    ObjectAtom,
    PendingRef,
    RefAtom,
    Schema,
    StringAtom,
    is_number,
    to_decimal,
)
from pegmask.grammars.json_schema.regular import CharDFA, NotCharLevel, RegularTooLarge
from pegmask.grammars.regex import regex_to_node_search

TYPES = ("null", "boolean", "integer", "number", "string", "array", "object")
_NON_OBJECT = Schema(tuple(a for a in ANY.atoms if not isinstance(a, ObjectAtom)))

# Keywords no grammar can express (or not yet); any other keyword this module does not read
# is an annotation.
_UNSUPPORTED = ("$dynamicRef", "$recursiveRef", "unevaluatedItems")
_COMBINATORS = ("allOf", "anyOf", "oneOf", "not", "$ref", "dependentSchemas", "dependencies", "if")


class Lowering:
    """JSON Schema (dicts) to the normal form, with `$ref` resolution over the document."""

    def __init__(self, document: Any, *, strict: bool | str, ignore: frozenset[str]):
        self.document = document
        self.strict = strict
        self.ignore = ignore
        self.legacy_refs = _legacy_draft(document)
        self.ids: dict[str, str] = {}
        self._index_ids(document, "")
        self._lowered: dict[str, Schema] = {}
        self._lowering: set[str] = set()
        self._regex_dfas: dict[tuple[str, str], CharDFA] = {}
        self._regex_nodes: dict[str, Node] = {}
        self.algebra = Algebra(self.expand, self.matches)

    # ----------------------------------------------------------------- references
    def expand(self, key: tuple) -> Schema:
        """Content of a `RefAtom` key: ("ref", pointer), ("with", key, stored index) or
        ("and", key, key, ...)."""
        if key[0] == "ref":
            if key[1] in self._lowering:
                raise PendingRef(key[1])
            return self.lower(self.at_pointer(key[1]), key[1])
        if key[0] == "with":
            return self.algebra.intersect(self.expand(key[1]), self.algebra.stored[key[2]])
        result = ANY
        for part in key[1:]:
            result = self.algebra.intersect(result, self.expand(part))
        return result

    def _index_ids(self, schema: Any, pointer: str) -> None:
        if not isinstance(schema, dict):
            return
        for name in ("$id", "id"):
            if isinstance(schema.get(name), str):
                self.ids.setdefault(schema[name].rstrip("#"), pointer)
        if isinstance(schema.get("$anchor"), str):
            self.ids.setdefault("#" + schema["$anchor"], pointer)
        for key, sub in _subschemas(schema):
            self._index_ids(sub, f"{pointer}/{key}")

    def resolve(self, ref: str, pointer: str) -> str:
        """The JSON pointer (in this document) that `ref` names."""
        base, _, fragment = ref.partition("#")
        target = ""
        if base:
            candidates = [p for uri, p in self.ids.items()
                          if uri == base or uri.rsplit("/", 1)[-1] == base.rsplit("/", 1)[-1]]
            if len(set(candidates)) != 1:
                raise UnsupportedSchemaError("$ref", pointer, f"reference {ref!r} is not in this document")
            target = candidates[0]
        if fragment and not fragment.startswith("/"):
            if "#" + fragment not in self.ids:
                raise SchemaError(f"unresolvable $ref {ref!r}", pointer)
            return self.ids["#" + fragment]
        target += unquote(fragment)
        try:
            self.at_pointer(target)
        except (KeyError, IndexError, ValueError, TypeError):
            raise SchemaError(f"unresolvable $ref {ref!r}", pointer) from None
        return target

    def at_pointer(self, pointer: str) -> Any:
        node = self.document
        for token in pointer.split("/")[1:]:
            token = token.replace("~1", "/").replace("~0", "~")
            node = node[int(token)] if isinstance(node, list) else node[token]
        return node

    # ----------------------------------------------------------------- regular languages
    def regex_dfa(self, kind: str, source: str, pointer: str = "") -> CharDFA:
        """DFA of a `pattern` (search semantics) or of a known `format`."""
        key = (kind, source)
        if key not in self._regex_dfas:
            node = self.regex_node(kind, source, pointer)
            try:
                self._regex_dfas[key] = CharDFA.from_node(node)
            except (RegularTooLarge, NotCharLevel) as exc:
                raise UnsupportedSchemaError(kind, pointer, f"{source!r}: {exc}") from exc
        return self._regex_dfas[key]

    def regex_node(self, kind: str, source: str, pointer: str = "") -> Node:
        """Character-level IR of a `pattern` (search semantics) or of a known `format`."""
        if kind == "format":
            return format_node(source)
        if source not in self._regex_nodes:
            try:
                self._regex_nodes[source] = regex_to_node_search(source)
            except GrammarError as exc:
                raise UnsupportedSchemaError("pattern", pointer, str(exc)) from exc
        return self._regex_nodes[source]

    def matches(self, kind: str, source: str, text: str) -> bool:
        return self.regex_dfa(kind, source).matches(text)

    # ----------------------------------------------------------------- lowering
    def lower(self, schema: Any, pointer: str) -> Schema:
        """The normal form of the subschema at `pointer` (memoized per location)."""
        if schema is True:
            return ANY
        if schema is False:
            return NEVER
        if not isinstance(schema, dict):
            raise SchemaError(f"a schema must be an object or a boolean, not {type(schema).__name__}", pointer)
        if pointer in self._lowered:
            return self._lowered[pointer]
        if pointer in self._lowering:
            raise SchemaError("schema refers to itself without consuming input", pointer)
        self._lowering.add(pointer)
        try:
            result = self._lower(schema, pointer)
        finally:
            self._lowering.discard(pointer)
        self._lowered[pointer] = result
        return result

    def _lower(self, schema: dict[str, Any], pointer: str) -> Schema:
        if self.ignore:
            schema = {k: v for k, v in schema.items() if k not in self.ignore}
        for keyword in _UNSUPPORTED:
            if keyword in schema:
                raise UnsupportedSchemaError(keyword, pointer)
        if "$ref" in schema:
            if not isinstance(schema["$ref"], str):
                raise SchemaError("$ref must be a string", pointer)
            target = Schema((RefAtom(("ref", self.resolve(schema["$ref"], pointer))),))
            if self.legacy_refs:
                return target
        # Parts are intersected in the order the schema writes them: intersection does not
        # care, but "schema" property order follows it (own properties vs. $ref / allOf ones).
        result = ANY
        for part in _parts_in_order(schema):
            if part == "$ref":
                result = self.algebra.intersect(result, target)
            elif part == "typed":
                result = self.algebra.intersect(result, self._typed(schema, pointer))
            else:
                result = self.algebra.intersect(result, self._combinator(schema, part, pointer))
        if "const" in schema or "enum" in schema:
            values = [schema["const"]] if "const" in schema else schema["enum"]
            if not isinstance(values, list):
                raise SchemaError("enum must be an array", pointer)
            atoms = AtomSet()
            try:
                for value in values:  # (any schema takes any string: the usual enum)
                    if (result is ANY and isinstance(value, str)
                            or self.algebra.accepts(result, value)):
                        atoms.add(ConstAtom.of(value))
            except PendingRef as exc:
                raise UnsupportedSchemaError(
                    "enum", pointer, "next to a $ref back into an enclosing schema") from exc
            result = Schema(atoms.atoms())
        return result

    def _combinator(self, schema: dict[str, Any], keyword: str, pointer: str) -> Schema:
        """The schema a combinator keyword (or keyword family) stands for."""
        if keyword == "allOf":
            result = ANY
            for i, sub in enumerate(_list(schema, "allOf", pointer)):
                result = self.algebra.intersect(result, self.lower(sub, f"{pointer}/allOf/{i}"))
            return result
        if keyword in ("anyOf", "oneOf"):
            return self.algebra.union([self.lower(sub, f"{pointer}/{keyword}/{i}")
                                       for i, sub in enumerate(_list(schema, keyword, pointer))])
        if keyword == "not":
            return self.negate(schema["not"], f"{pointer}/not")
        if keyword == "if":
            return self._conditional(schema, pointer)
        return self._dependencies(schema, pointer)

    def _typed(self, schema: dict[str, Any], pointer: str) -> Schema:
        """Atoms for `type` and the type-specific keywords."""
        declared = schema.get("type")
        if declared is None:
            types = set(TYPES) - {"integer"}
        else:
            names = [declared] if isinstance(declared, str) else declared
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                raise SchemaError("type must be a string or an array of strings", pointer)
            for name in names:
                if name not in TYPES:
                    raise SchemaError(f"unknown type {name!r}", pointer)
            types = set(names)
            if "number" in types:
                types.discard("integer")
            if schema.get("nullable") is True:
                types.add("null")
        atoms: list = []
        for name in TYPES:
            if name not in types:
                continue
            if name == "null":
                atoms.append(NullAtom())
            elif name == "boolean":
                atoms.append(BoolAtom())
            elif name in ("integer", "number"):
                atoms.append(self._number(schema, pointer, name == "integer"))
            elif name == "string":
                atoms.append(self._string(schema, pointer))
            elif name == "array":
                atoms.append(self._array(schema, pointer))
            else:
                atoms.append(self._object(schema, pointer))
        if declared is None and tuple(atoms) == ANY.atoms:
            return ANY
        return Schema(tuple(atoms))

    def _number(self, schema: dict[str, Any], pointer: str, integer: bool) -> NumberAtom:
        lo, lo_x = _decimal(schema, "minimum", pointer), False
        hi, hi_x = _decimal(schema, "maximum", pointer), False
        for keyword, is_min in (("exclusiveMinimum", True), ("exclusiveMaximum", False)):
            value = schema.get(keyword)
            if value is None:
                continue
            if isinstance(value, bool):  # draft 4: a flag on minimum / maximum
                if is_min:
                    lo_x = value and lo is not None
                else:
                    hi_x = value and hi is not None
                continue
            bound = _decimal(schema, keyword, pointer)
            if is_min and (lo is None or bound >= lo):
                lo, lo_x = bound, True
            elif not is_min and (hi is None or bound <= hi):
                hi, hi_x = bound, True
        if lo is not None and hi is not None and (lo > hi or (lo == hi and (lo_x or hi_x))):
            raise SchemaError("contradictory numeric bounds", pointer)
        multiples: tuple[Decimal, ...] = ()
        if "multipleOf" in schema:
            step = _decimal(schema, "multipleOf", pointer)
            if step <= 0:
                raise SchemaError("multipleOf must be greater than 0", pointer)
            multiples = (step,)
        return NumberAtom(integer, lo, lo_x, hi, hi_x, multiples, pointer)

    def _string(self, schema: dict[str, Any], pointer: str) -> StringAtom:
        lo = _count(schema, "minLength", pointer) or 0
        hi = _count(schema, "maxLength", pointer)
        if hi is not None and lo > hi:
            raise SchemaError("minLength is greater than maxLength", pointer)
        patterns: tuple[str, ...] = ()
        if "pattern" in schema:
            pattern = schema["pattern"]
            if not isinstance(pattern, str):
                raise SchemaError("pattern must be a string", pointer)
            self.regex_node("pattern", pattern, f"{pointer}/pattern")
            patterns = (pattern,)
        formats: tuple[str, ...] = ()
        fmt = schema.get("format")
        if fmt is not None and not isinstance(fmt, str):
            raise SchemaError("format must be a string", pointer)
        if fmt in FORMATS:
            formats = (fmt,)
        return StringAtom(lo, hi, patterns, formats, pointer=pointer)

    def _array(self, schema: dict[str, Any], pointer: str) -> ArrayAtom:
        items = schema.get("items")
        prefix: tuple[Schema, ...] = ()
        rest: Schema | None = None
        if "prefixItems" in schema:
            prefix = tuple(self.lower(s, f"{pointer}/prefixItems/{i}")
                           for i, s in enumerate(_list(schema, "prefixItems", pointer)))
            if items is not None:
                rest = self.lower(items, f"{pointer}/items")
        elif isinstance(items, list):
            prefix = tuple(self.lower(s, f"{pointer}/items/{i}") for i, s in enumerate(items))
            if "additionalItems" in schema:
                rest = self.lower(schema["additionalItems"], f"{pointer}/additionalItems")
        elif items is not None:
            rest = self.lower(items, f"{pointer}/items")
        lo = _count(schema, "minItems", pointer) or 0
        hi = _count(schema, "maxItems", pointer)
        if hi is not None and lo > hi:
            raise SchemaError("minItems is greater than maxItems", pointer)
        contains: tuple[Schema, ...] = ()
        if "contains" in schema:
            low = _count(schema, "minContains", pointer)
            if "maxContains" in schema:
                raise UnsupportedSchemaError("maxContains", pointer)
            if low != 0:
                if low not in (None, 1):
                    raise UnsupportedSchemaError("minContains", pointer, "only 0 or 1 is supported")
                contains = (self.lower(schema["contains"], f"{pointer}/contains"),)
        unique = schema.get("uniqueItems", False)
        if not isinstance(unique, bool):
            raise SchemaError("uniqueItems must be a boolean", pointer)
        if unique and (hi is None or hi > 1):
            raise UnsupportedSchemaError("uniqueItems", pointer, "a grammar cannot compare items")
        return ArrayAtom(prefix, rest, lo, hi, contains, pointer)

    def _object(self, schema: dict[str, Any], pointer: str) -> ObjectAtom:
        properties = tuple((name, self.lower(sub, f"{pointer}/properties/{_escape(name)}"))
                           for name, sub in _dict(schema, "properties", pointer).items())
        patterns = []
        for pattern, sub in _dict(schema, "patternProperties", pointer).items():
            self.regex_node("pattern", pattern, f"{pointer}/patternProperties")
            patterns.append((pattern, self.lower(sub, f"{pointer}/patternProperties/{_escape(pattern)}")))
        additional: Schema | None = None
        if "additionalProperties" in schema:
            additional = self.lower(schema["additionalProperties"], f"{pointer}/additionalProperties")
        elif "unevaluatedProperties" in schema:
            if any(k in schema for k in _COMBINATORS):
                raise UnsupportedSchemaError(
                    "unevaluatedProperties", pointer, "only without combinators or $ref")
            additional = self.lower(schema["unevaluatedProperties"], f"{pointer}/unevaluatedProperties")
        elif self.strict and _is_object_schema(schema) and (
                self.strict != "declared" or "properties" in schema
                or "patternProperties" in schema):
            additional = NEVER
        required = schema.get("required", [])
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            if isinstance(required, bool):  # draft 3 style: an annotation here
                required = []
            else:
                raise SchemaError("required must be an array of strings", pointer)
        lo = _count(schema, "minProperties", pointer) or 0
        hi = _count(schema, "maxProperties", pointer)
        if hi is not None and lo > hi:
            raise SchemaError("minProperties is greater than maxProperties", pointer)
        names: tuple[Schema, ...] = ()
        if "propertyNames" in schema:
            names = (self.lower(schema["propertyNames"], f"{pointer}/propertyNames"),)
        rules: tuple[KeyRules, ...] = ()
        if properties or patterns or additional is not None:
            rules = (KeyRules(properties, tuple(patterns), additional),)
        return ObjectAtom(rules, frozenset(required), lo, hi, names, pointer)

    def _dependencies(self, schema: dict[str, Any], pointer: str) -> Schema:
        """`dependentRequired` / `dependentSchemas` / `dependencies` as a union per key:
        the key is absent, or present together with what it requires."""
        result = ANY
        for keyword in ("dependentRequired", "dependentSchemas", "dependencies"):
            for key, need in _dict(schema, keyword, pointer).items():
                where = f"{pointer}/{keyword}/{_escape(key)}"
                absent = ObjectAtom((KeyRules(((key, NEVER),)),))
                if isinstance(need, list):
                    if not all(isinstance(n, str) for n in need):
                        raise SchemaError("dependent keys must be strings", where)
                    present = Schema((ObjectAtom(required=frozenset([key, *need])),))
                else:
                    present = self.algebra.intersect(
                        Schema((ObjectAtom(required=frozenset([key])),)), self.lower(need, where))
                case = self.algebra.union([_NON_OBJECT, Schema((absent,)), present])
                result = self.algebra.intersect(result, case)
        return result

    def _conditional(self, schema: dict[str, Any], pointer: str) -> Schema:
        """if/then/else as (if and then) or (not if and else): exact when `if` can be negated."""
        condition = self.lower(schema["if"], f"{pointer}/if")
        try:
            negated = self.negate(schema["if"], f"{pointer}/if")
        except UnsupportedSchemaError as exc:
            raise UnsupportedSchemaError("if", pointer, f"cannot negate the condition: {exc}") from exc
        then = self.lower(schema.get("then", True), f"{pointer}/then")
        otherwise = self.lower(schema.get("else", True), f"{pointer}/else")
        return self.algebra.union([self.algebra.intersect(condition, then),
                                   self.algebra.intersect(negated, otherwise)])

    # ----------------------------------------------------------------- not
    def negate(self, schema: Any, pointer: str) -> Schema:
        """The complement of a subschema, for the forms a grammar can express."""
        if schema is True or schema == {}:
            return NEVER
        if schema is False:
            return ANY
        if not isinstance(schema, dict):
            raise SchemaError("not must be a schema", pointer)
        groups = _assertion_groups(schema)
        return self.algebra.union([self._negate_group(schema, g, pointer) for g in groups])

    def _negate_group(self, schema: dict[str, Any], group: tuple[str, ...], pointer: str) -> Schema:
        """The complement of one keyword group. A type-specific keyword accepts every other
        type, so its complement lies within its own type."""
        keyword = group[0]
        value = schema[keyword]
        algebra = self.algebra
        if group == ("type",):
            kept = self._typed({"type": value}, pointer)
            if any(isinstance(a, NumberAtom) and a.integer for a in kept.atoms):
                raise UnsupportedSchemaError("not", pointer, "not integer")
            return Schema(tuple(a for a in ANY.atoms if a not in kept.atoms))
        if keyword in ("enum", "const"):
            values = [value] if keyword == "const" else value
            if not isinstance(values, list):
                raise SchemaError("enum must be an array", pointer)
            return self._excluding(values, pointer)
        if group == ("required",):
            if not value:
                return NEVER
            return algebra.union([Schema((ObjectAtom((KeyRules(((k, NEVER),)),)),)) for k in value])
        if group == ("pattern",):
            self.regex_node("pattern", value, pointer)
            return Schema((StringAtom(not_patterns=(value,)),))
        if group in (("minLength",), ("maxLength",)):
            n = _count(schema, keyword, pointer)
            if keyword == "minLength":
                return NEVER if n == 0 else Schema((StringAtom(max_length=n - 1),))
            return Schema((StringAtom(min_length=n + 1),))
        if group in (("minItems",), ("maxItems",)):
            n = _count(schema, keyword, pointer)
            if keyword == "minItems":
                return NEVER if n == 0 else Schema((ArrayAtom(max_items=n - 1),))
            return Schema((ArrayAtom(min_items=n + 1),))
        if group in (("minimum",), ("maximum",), ("exclusiveMinimum",), ("exclusiveMaximum",)):
            bound = _decimal(schema, keyword, pointer)
            strict = keyword in ("minimum", "maximum")
            if keyword in ("minimum", "exclusiveMinimum"):
                return Schema((NumberAtom(maximum=bound, exclusive_maximum=strict),))
            return Schema((NumberAtom(minimum=bound, exclusive_minimum=strict),))
        if group == ("anyOf",):
            result = ANY
            for i, sub in enumerate(_list(schema, "anyOf", pointer)):
                result = algebra.intersect(result, self.negate(sub, f"{pointer}/anyOf/{i}"))
            return result
        if group == ("allOf",):
            return algebra.union([self.negate(sub, f"{pointer}/allOf/{i}")
                                  for i, sub in enumerate(_list(schema, "allOf", pointer))])
        if group == ("not",):
            return self.lower(value, f"{pointer}/not")
        if group == ("$ref",):
            target = self.resolve(value, pointer)
            if target in self._lowering:
                raise UnsupportedSchemaError("not", pointer, "recursive schema under not")
            self._lowering.add(target)
            try:
                return self.negate(self.at_pointer(target), target)
            finally:
                self._lowering.discard(target)
        if group == ("properties",) and isinstance(value, dict):
            cases = []
            for name, sub in value.items():
                negated = self.negate(sub, f"{pointer}/properties/{_escape(name)}")
                if negated.atoms:
                    cases.append(Schema((ObjectAtom((KeyRules(((name, negated),)),),
                                                    frozenset([name])),)))
            return algebra.union(cases)
        raise UnsupportedSchemaError("not", pointer, f"cannot negate {', '.join(group)}")

    def _excluding(self, values: list[Any], pointer: str) -> Schema:
        """Everything except the given constants (not arrays or objects): numbers become the
        open intervals between the excluded values."""
        atoms: list = []
        for atom in ANY.atoms:
            kind = [v for v in values if self.algebra.accepts(Schema((atom,)), v)]
            if not kind:
                atoms.append(atom)
            elif isinstance(atom, StringAtom):
                atoms.append(StringAtom(excluded=tuple(kind)))
            elif isinstance(atom, BoolAtom):
                atoms.extend(ConstAtom.of(b) for b in (True, False) if b not in kind)
            elif isinstance(atom, NumberAtom):
                cuts: list[Decimal | None] = [None, *sorted({to_decimal(v) for v in kind}), None]
                atoms += [NumberAtom(minimum=a, exclusive_minimum=a is not None,
                                     maximum=b, exclusive_maximum=b is not None)
                          for a, b in zip(cuts, cuts[1:], strict=False)]
            elif not isinstance(atom, NullAtom):
                raise UnsupportedSchemaError("not", pointer, "excluding arrays or objects")
        return Schema(tuple(atoms))


# ---------------------------------------------------------------------------- helpers
_GROUPS = (
    ("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum"),
    ("properties", "patternProperties", "additionalProperties"),
    ("items", "additionalItems", "prefixItems"), ("contains", "minContains", "maxContains"),
    ("if", "then", "else"),
)
_ASSERTIONS = frozenset((
    "type", "enum", "const", "$ref", "allOf", "anyOf", "oneOf", "not", "minimum", "maximum",
    "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "minLength", "maxLength", "pattern",
    "format", "items", "prefixItems", "additionalItems", "minItems", "maxItems", "contains",
    "minContains", "maxContains", "uniqueItems", "properties", "patternProperties",
    "additionalProperties", "required", "minProperties", "maxProperties", "propertyNames",
    "dependentRequired", "dependentSchemas", "dependencies", "if", "then", "else",
    "unevaluatedProperties", "unevaluatedItems", "nullable",
))


def _parts_in_order(schema: dict[str, Any]) -> list[str]:
    """"typed" (type-specific keywords) and the combinators present, in the order of their
    first keyword in the schema; "typed" comes first when no keyword places it."""
    parts: list[str] = []
    for keyword in schema:
        if keyword in ("$ref", "allOf", "anyOf", "oneOf", "not"):
            part = keyword
        elif keyword in ("dependentRequired", "dependentSchemas", "dependencies"):
            part = "dependencies"
        elif keyword == "if":
            part = "if" if "then" in schema or "else" in schema else ""
        elif keyword in _ASSERTIONS and keyword not in ("type", "nullable", "then", "else", "enum",
                                                        "const"):
            part = "typed"
        else:
            part = ""
        if part and part not in parts:
            parts.append(part)
    return parts if "typed" in parts else ["typed", *parts]


def _assertion_groups(schema: dict[str, Any]) -> list[tuple[str, ...]]:
    """The schema's assertion keywords, grouped where keywords only mean something together
    (so `not` can negate each group: not (A and B) = not A or not B)."""
    present = [k for k in schema if k in _ASSERTIONS]
    groups: list[tuple[str, ...]] = []
    for group in _GROUPS:
        found = tuple(k for k in group if k in present)
        if found:
            groups.append(found)
    grouped = {k for g in _GROUPS for k in g}
    groups += [(k,) for k in present if k not in grouped]
    if any(isinstance(schema.get(k), bool) for k in ("exclusiveMinimum", "exclusiveMaximum")):
        raise UnsupportedSchemaError("not", "", "draft-4 exclusive bounds under not")
    return groups


def _subschemas(schema: dict[str, Any]) -> Iterable[tuple[str, Any]]:
    """(pointer suffix, subschema) for every subschema position (for indexing `$id`s)."""
    for key in ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas",
                "dependencies"):
        value = schema.get(key)
        if isinstance(value, dict):
            for name, sub in value.items():
                yield f"{key}/{_escape(name)}", sub
    for key in ("items", "prefixItems", "allOf", "anyOf", "oneOf"):
        value = schema.get(key)
        if isinstance(value, list):
            for i, sub in enumerate(value):
                yield f"{key}/{i}", sub
        elif isinstance(value, dict):
            yield key, value
    for key in ("additionalProperties", "additionalItems", "not", "contains", "propertyNames",
                "if", "then", "else", "unevaluatedProperties", "unevaluatedItems"):
        if isinstance(schema.get(key), dict):
            yield key, schema[key]


def _is_object_schema(schema: dict[str, Any]) -> bool:
    """Whether `strict` applies: the schema is about objects (by type or keywords)."""
    declared = schema.get("type")
    if declared == "object" or (isinstance(declared, list) and "object" in declared):
        return True
    return any(k in schema for k in ("properties", "patternProperties", "required"))


def _legacy_draft(document: Any) -> bool:
    """Drafts 3-7 ignore the siblings of `$ref`."""
    uri = document.get("$schema", "") if isinstance(document, dict) else ""
    return isinstance(uri, str) and any(f"draft-0{n}" in uri for n in (3, 4, 6, 7))


def _escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def _list(schema: dict[str, Any], keyword: str, pointer: str) -> list[Any]:
    value = schema.get(keyword, [])
    if not isinstance(value, list):
        raise SchemaError(f"{keyword} must be an array", pointer)
    return value


def _dict(schema: dict[str, Any], keyword: str, pointer: str) -> dict[str, Any]:
    value = schema.get(keyword, {})
    if not isinstance(value, dict):
        raise SchemaError(f"{keyword} must be an object", pointer)
    return value


def _decimal(schema: dict[str, Any], keyword: str, pointer: str) -> Decimal | None:
    value = schema.get(keyword)
    if value is None:
        return None
    if not is_number(value) or (isinstance(value, float) and not math.isfinite(value)):
        raise SchemaError(f"{keyword} must be a number", pointer)
    return to_decimal(value)


def _count(schema: dict[str, Any], keyword: str, pointer: str) -> int | None:
    value = schema.get(keyword)
    if value is None:
        return None
    if not is_number(value) or value < 0 or value != int(value):
        raise SchemaError(f"{keyword} must be a non-negative integer", pointer)
    return int(value)
