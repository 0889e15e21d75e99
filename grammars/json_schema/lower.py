"""JSON Schema keywords to the front-end's normal form (`normal`): `Lowering` resolves `$ref`
over the document and turns each schema into a union of per-type atoms, combinators into
operations on them; `schema_to_rules` (the package) emits the rules from its result."""

from __future__ import annotations

import math
from collections.abc import Iterable
from decimal import Decimal
from typing import Any

from pegmask.grammars.errors import GrammarError, SchemaError, UnsupportedSchemaError
from pegmask.grammars.ir import Node
from pegmask.grammars.json_schema.formats import FORMATS, format_node
from pegmask.grammars.json_schema.normal import (
    ANY,
    NEVER,
    Algebra,
    ArrayAtom,
    Atom,
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
from pegmask.grammars.json_schema.refs import Resources
from pegmask.grammars.json_schema.regular import CharDFA, NotCharLevel, RegularTooLarge
from pegmask.grammars.regex import regex_to_node_search

TYPES = ("null", "boolean", "integer", "number", "string", "array", "object")
_NON_OBJECT = Schema(tuple(a for a in ANY.atoms if not isinstance(a, ObjectAtom)))

# Keywords no grammar can express (or not yet); any other keyword this module does not read
# is an annotation.
_UNSUPPORTED = ("$recursiveRef",)
_COMBINATORS = ("allOf", "anyOf", "oneOf", "not", "$ref", "$dynamicRef", "dependentSchemas", "dependencies", "if")


class Lowering:
    """JSON Schema (dicts) to the normal form, with `$ref` resolution over the document."""

    def __init__(self, document: Any, *, strict: bool | str, ignore: frozenset[str],
                 one_of: str = "exact"):
        self.document = document
        self.strict = strict
        self.one_of = one_of
        self.ignore = ignore
        _check_dialect(document)
        self.legacy_refs = _legacy_draft(document)
        self.refs = Resources(document, _subschemas, legacy_ids=_draft_uses_id(document))
        self.scope: tuple[str, ...] = ()  # the dynamic scope of what is being lowered
        self._lowered: dict[tuple[str, tuple[str, ...]], Schema] = {}
        self._lowering: set[tuple[str, tuple[str, ...]]] = set()
        self._negating: set[tuple] = set()
        self._regex_dfas: dict[tuple[str, str], CharDFA] = {}
        self._regex_nodes: dict[str, Node] = {}
        self.algebra = Algebra(self.expand, self.matches, self.regex_dfa)

    # ----------------------------------------------------------------- references
    def expand(self, key: tuple) -> Schema:
        """Content of a `RefAtom` key: ("ref", pointer, dynamic scope), ("with", key, stored
        index) or ("and", key, key, ...)."""
        if key[0] == "ref":
            if key[1:] in self._lowering:
                raise PendingRef(key[1])
            outer, self.scope = self.scope, key[2]
            try:
                return self.lower(self.at_pointer(key[1]), key[1])
            finally:
                self.scope = outer
        if key[0] == "with":
            return self.algebra.intersect(self.expand(key[1]), self.algebra.stored[key[2]])
        result = ANY
        for part in key[1:]:
            result = self.algebra.intersect(result, self.expand(part))
        return result

    def _reference(self, schema: dict[str, Any], keyword: str, pointer: str) -> Schema:
        """The `$ref` or `$dynamicRef` of `schema`, as a named rule of its target."""
        ref = schema[keyword]
        if not isinstance(ref, str):
            raise SchemaError(f"{keyword} must be a string", pointer)
        if keyword == "$ref":
            target = self.refs.resolve(ref, pointer)
        else:
            target = self.refs.resolve_dynamic(ref, pointer, self.scope)
        return Schema((RefAtom(("ref", target, self.scope)),))

    def at_pointer(self, pointer: str) -> Any:
        return self.refs.at_pointer(pointer)

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
        outer = self.scope
        self.scope = self.refs.entered(outer, pointer)
        key = (pointer, self.scope)
        try:
            if key in self._lowered:
                return self._lowered[key]
            if key in self._lowering:
                raise SchemaError("schema refers to itself without consuming input", pointer)
            self._lowering.add(key)
            try:
                result = self._lower(schema, pointer)
            finally:
                self._lowering.discard(key)
            self._lowered[key] = result
            return result
        finally:
            self.scope = outer

    def _lower(self, schema: dict[str, Any], pointer: str) -> Schema:
        if self.ignore:
            schema = {k: v for k, v in schema.items() if k not in self.ignore}
        for keyword in _UNSUPPORTED:
            if keyword in schema:
                raise UnsupportedSchemaError(keyword, pointer)
        if "$ref" in schema and self.legacy_refs:
            return self._reference(schema, "$ref", pointer)
        # Parts are intersected in the order the schema writes them: intersection does not
        # care, but "schema" property order follows it (own properties vs. $ref / allOf ones).
        result = ANY
        for part in _parts_in_order(schema):
            if part in ("$ref", "$dynamicRef"):
                result = self.algebra.intersect(result, self._reference(schema, part, pointer))
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
        if keyword == "anyOf":
            return self.algebra.union([self.lower(sub, f"{pointer}/anyOf/{i}")
                                       for i, sub in enumerate(_list(schema, "anyOf", pointer))])
        if keyword == "oneOf":
            return self._one_of(schema, pointer)
        if keyword == "not":
            return self.negate(schema["not"], f"{pointer}/not")
        if keyword == "if":
            return self._conditional(schema, pointer)
        return self._dependencies(schema, pointer)

    def _one_of(self, schema: dict[str, Any], pointer: str) -> Schema:
        """Exactly one branch: the union where branches are provably disjoint (within what
        the schema's own type keywords allow); a branch that may overlap others is
        intersected with their complements (`negate`). Where that is not expressible, an
        error, or with `one_of="any"` the union (values valid under several branches are
        then accepted too)."""
        subschemas = _list(schema, "oneOf", pointer)
        where = [f"{pointer}/oneOf/{i}" for i in range(len(subschemas))]
        branches = [self.lower(sub, at) for sub, at in zip(subschemas, where, strict=True)]
        if self.one_of == "any":
            return self.algebra.union(branches)
        context = self._typed(schema, pointer)
        within = [self.algebra.intersect(context, b) for b in branches]
        exact = []
        for i, branch in enumerate(branches):
            for j in range(len(branches)):
                if i == j or not within[i].atoms or self.algebra.disjoint(within[i], within[j]):
                    continue
                try:
                    branch = self._complement_in(branch, subschemas[j], where[j])
                except UnsupportedSchemaError as exc:
                    raise UnsupportedSchemaError(
                        "oneOf", pointer,
                        f"branches {i} and {j} may overlap and branch {j} cannot be negated "
                        f"({exc}); one_of=\"any\" accepts values valid under several") from exc
            exact.append(branch)
        return self.algebra.union(exact)

    def _complement_in(self, context: Schema, other: Any, pointer: str) -> Schema:
        """`context` minus the values of subschema `other`: with `other`'s complement, else
        atom by atom with its complement within each (references expanded)."""
        try:
            return self.algebra.intersect(context, self.negate(other, pointer))
        except UnsupportedSchemaError:
            atoms = _expanded(self.algebra, context)
            if atoms is None:
                raise
        return self.algebra.union([
            self.algebra.intersect(Schema((atom,)), self.negate(other, pointer, atom))
            for atom in atoms])

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
        if "unevaluatedItems" in schema and rest is None:
            evaluated = self._evaluated_items(schema, pointer)
            if evaluated is not None:  # None: every item is evaluated
                unevaluated = self.lower(schema["unevaluatedItems"], f"{pointer}/unevaluatedItems")
                prefix += tuple(ANY for _ in range(evaluated - len(prefix)))
                rest = unevaluated
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
        return ArrayAtom(prefix, rest, lo, hi, contains, pointer, unique and (hi is None or hi > 1))

    def _object(self, schema: dict[str, Any], pointer: str) -> ObjectAtom:
        properties = tuple((name, self.lower(sub, f"{pointer}/properties/{_escape(name)}"))
                           for name, sub in _dict(schema, "properties", pointer).items())
        patterns = []
        for pattern, sub in _dict(schema, "patternProperties", pointer).items():
            self.regex_node("pattern", pattern, f"{pointer}/patternProperties")
            patterns.append((pattern, self.lower(sub, f"{pointer}/patternProperties/{_escape(pattern)}")))
        additional: Schema | None = None
        extra_rules: KeyRules | None = None  # unevaluatedProperties beside applicators
        if "additionalProperties" in schema:
            additional = self.lower(schema["additionalProperties"], f"{pointer}/additionalProperties")
        elif "unevaluatedProperties" in schema:
            names, patterns_seen, everything = self._evaluated_properties(schema, pointer)
            if not everything:
                rest = self.lower(schema["unevaluatedProperties"], f"{pointer}/unevaluatedProperties")
                extra_rules = KeyRules(tuple((n, ANY) for n in names),
                                       tuple((p, ANY) for p in patterns_seen), rest)
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
        if extra_rules is not None:
            rules += (extra_rules,)
        return ObjectAtom(rules, frozenset(required), lo, hi, names, pointer)

    # ----------------------------------------------------------------- unevaluated*
    def _always_applied(self, schema: dict[str, Any], pointer: str, keywords: frozenset[str],
                        keyword: str) -> list[tuple[dict[str, Any], str]]:
        """`schema` and the subschemas applied to the same value whenever it is valid
        (`allOf`, `$ref`, `$dynamicRef`, transitively): what they evaluate is evaluated.
        Conditional applicators (`anyOf`, `oneOf`, `if`, `dependentSchemas`) evaluate per
        branch; those that touch `keywords` are refused (`not` evaluates nothing)."""
        found: list[tuple[dict[str, Any], str]] = []
        seen: set[str] = set()
        todo = [(schema, pointer)]
        while todo:
            node, at = todo.pop()
            if not isinstance(node, dict) or at in seen:
                continue
            seen.add(at)
            found.append((node, at))
            for i, sub in enumerate(_list(node, "allOf", at)):
                todo.append((sub, f"{at}/allOf/{i}"))
            for ref in ("$ref", "$dynamicRef"):
                if isinstance(node.get(ref), str):
                    target = (self.refs.resolve(node[ref], at) if ref == "$ref"
                              else self.refs.resolve_dynamic(node[ref], at, self.scope))
                    todo.append((self.at_pointer(target), target))
            for applicator in ("anyOf", "oneOf", "if", "then", "else", "dependentSchemas"):
                if applicator in node and _mentions(node[applicator], keywords):
                    raise UnsupportedSchemaError(
                        keyword, pointer, f"beside {applicator} that evaluates {keyword[11:].lower()}")
        return found

    def _evaluated_properties(self, schema: dict[str, Any], pointer: str
                              ) -> tuple[list[str], list[str], bool]:
        """(names, patterns, everything) that `properties`-like keywords evaluate here."""
        names: list[str] = []
        patterns: list[str] = []
        for node, at in self._always_applied(schema, pointer, _PROPERTY_KEYWORDS,
                                             "unevaluatedProperties"):
            if ("additionalProperties" in node
                    or node is not schema and "unevaluatedProperties" in node):
                return [], [], True
            names += [n for n in _dict(node, "properties", at) if n not in names]
            patterns += [p for p in _dict(node, "patternProperties", at) if p not in patterns]
        return names, patterns, False

    def _evaluated_items(self, schema: dict[str, Any], pointer: str) -> int | None:
        """How many leading items the item keywords evaluate here (None: all of them)."""
        count = 0
        for node, _at in self._always_applied(schema, pointer, _ITEM_KEYWORDS, "unevaluatedItems"):
            if "contains" in node:
                raise UnsupportedSchemaError("unevaluatedItems", pointer, "beside contains")
            items = node.get("items")
            if (isinstance(items, (dict, bool)) or "additionalItems" in node
                    or node is not schema and "unevaluatedItems" in node):
                return None
            prefix = node.get("prefixItems", items if isinstance(items, list) else [])
            count = max(count, len(prefix) if isinstance(prefix, list) else 0)
        return count

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
    def negate(self, schema: Any, pointer: str, within: Atom | None = None) -> Schema:
        """The complement of a subschema, for the forms a grammar can express. With
        `within`, only its intersection with that atom has to be right: some complements
        are expressible there only (a closed object's keys are known)."""
        if schema is True or schema == {}:
            return NEVER
        if schema is False:
            return ANY
        if not isinstance(schema, dict):
            raise SchemaError("not must be a schema", pointer)
        groups = _assertion_groups(schema)
        return self.algebra.union([self._negate_group(schema, g, pointer, within) for g in groups])

    def _negate_group(self, schema: dict[str, Any], group: tuple[str, ...], pointer: str,
                      within: Atom | None = None) -> Schema:
        """The complement of one keyword group. A type-specific keyword accepts every other
        type, so its complement lies within its own type."""
        keyword = group[0]
        value = schema[keyword]
        algebra = self.algebra
        if group == ("type",):
            kept = self._typed({"type": value}, pointer)
            rest = tuple(a for a in ANY.atoms if a not in kept.atoms)
            if any(isinstance(a, NumberAtom) and a.integer for a in kept.atoms):
                # Not integer: the non-integral numbers, in place of all numbers.
                rest = tuple(NumberAtom(fractional=True) if isinstance(a, NumberAtom) else a
                             for a in rest)
            return Schema(rest)
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
                result = algebra.intersect(result, self.negate(sub, f"{pointer}/anyOf/{i}", within))
            return result
        if group == ("oneOf",):
            subschemas = _list(schema, "oneOf", pointer)
            branches = [self.lower(sub, f"{pointer}/oneOf/{i}") for i, sub in enumerate(subschemas)]
            if not all(algebra.disjoint(a, b) for i, a in enumerate(branches) for b in branches[i + 1:]):
                raise UnsupportedSchemaError("not", pointer, "cannot negate oneOf (overlapping branches)")
            result = ANY  # disjoint branches: "exactly one" is "any"
            for i, sub in enumerate(subschemas):
                result = algebra.intersect(result, self.negate(sub, f"{pointer}/oneOf/{i}", within))
            return result
        if group == ("allOf",):
            return algebra.union([self.negate(sub, f"{pointer}/allOf/{i}", within)
                                  for i, sub in enumerate(_list(schema, "allOf", pointer))])
        if group == ("not",):
            return self.lower(value, f"{pointer}/not")
        if group in (("$ref",), ("$dynamicRef",)):
            (atom,) = self._reference(schema, keyword, pointer).atoms
            if atom.key[1:] in self._lowering or atom.key in self._negating:
                raise UnsupportedSchemaError("not", pointer, "recursive schema under not")
            self._negating.add(atom.key)
            outer, self.scope = self.scope, self.refs.entered(self.scope, atom.key[1])
            try:
                return self.negate(self.at_pointer(atom.key[1]), atom.key[1], within)
            finally:
                self.scope = outer
                self._negating.discard(atom.key)
        if group == ("format",) and (value not in FORMATS or isinstance(within, StringAtom)
                                     and value in within.formats):
            return NEVER  # an annotation, or a format the context asserts already
        if "additionalProperties" in group and "patternProperties" not in group:
            return self._negate_closed(schema, pointer, within)
        if group == ("items",) and isinstance(within, (NullAtom, BoolAtom, NumberAtom, StringAtom,
                                                       ObjectAtom)):
            return NEVER  # valid under any array keyword
        if group == ("items",) and (isinstance(value, dict) or isinstance(value, bool)):
            if isinstance(within, ArrayAtom) and not within.prefix and (
                    within.items == self.lower(value, f"{pointer}/items")):
                return NEVER
            # Some item outside `items`: `contains` of its complement (among the items
            # the context allows).
            context = within.items if isinstance(within, ArrayAtom) and not within.prefix else None
            outside = self._complement_in(context or ANY, value, f"{pointer}/items")
            return Schema((ArrayAtom(contains=(outside,)),)) if outside.atoms else NEVER
        if group == ("properties",) and isinstance(value, dict):
            cases = []
            for name, sub in value.items():
                context = (algebra.member_schema(within, name) if isinstance(within, ObjectAtom)
                           else ANY)
                negated = self._complement_in(context, sub, f"{pointer}/properties/{_escape(name)}")
                if negated.atoms:
                    cases.append(Schema((ObjectAtom((KeyRules(((name, negated),)),),
                                                    frozenset([name])),)))
            return algebra.union(cases)
        raise UnsupportedSchemaError("not", pointer, f"cannot negate {', '.join(group)}")

    def _negate_closed(self, schema: dict[str, Any], pointer: str, within: Atom | None) -> Schema:
        """The complement of `properties` + `additionalProperties` within an object atom whose
        keys are known (closed): one of those keys outside `properties` with a value outside
        `additionalProperties`, or a named key with a value outside its schema."""
        if isinstance(within, (NullAtom, BoolAtom, NumberAtom, StringAtom, ArrayAtom)):
            return NEVER  # valid under any object keyword
        keys = _closed_keys(within) if isinstance(within, ObjectAtom) else None
        if keys is None:
            raise UnsupportedSchemaError(
                "not", pointer, "cannot negate additionalProperties outside a closed object")
        named = _dict(schema, "properties", pointer)
        cases = []
        for key in sorted(keys - named.keys()):
            extra = self.negate(schema["additionalProperties"], f"{pointer}/additionalProperties")
            if extra.atoms:
                cases.append(Schema((ObjectAtom((KeyRules(((key, extra),)),), frozenset([key])),)))
        for key, sub in named.items():
            where = f"{pointer}/properties/{_escape(key)}"
            if key not in keys or self.algebra.member_schema(within, key) == self.lower(sub, where):
                continue  # absent in the context, or valid there whenever present
            negated = self._complement_in(self.algebra.member_schema(within, key), sub, where)
            if negated.atoms:
                cases.append(Schema((ObjectAtom((KeyRules(((key, negated),)),), frozenset([key])),)))
        return self.algebra.union(cases)

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
    "type", "enum", "const", "$ref", "$dynamicRef", "allOf", "anyOf", "oneOf", "not", "minimum", "maximum",
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
        if keyword in ("$ref", "$dynamicRef", "allOf", "anyOf", "oneOf", "not"):
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


_PROPERTY_KEYWORDS = frozenset(("properties", "patternProperties", "additionalProperties",
                                "unevaluatedProperties"))
_ITEM_KEYWORDS = frozenset(("items", "prefixItems", "additionalItems", "unevaluatedItems",
                            "contains"))


def _mentions(value: Any, keywords: frozenset[str]) -> bool:
    """Whether any of `keywords` occurs as a key anywhere in `value` (conservatively: also
    below other instance locations)."""
    if isinstance(value, dict):
        return any(k in keywords or _mentions(v, keywords) for k, v in value.items())
    if isinstance(value, list):
        return any(_mentions(v, keywords) for v in value)
    return False


def _expanded(algebra: Algebra, schema: Schema) -> tuple[Atom, ...] | None:
    """The atoms of `schema` with references replaced by their content (None where one is
    still being lowered)."""
    atoms: list[Atom] = []
    todo = list(schema.atoms)
    while todo:
        atom = todo.pop(0)
        if not isinstance(atom, RefAtom):
            atoms.append(atom)
            continue
        try:
            todo[:0] = algebra.expand_ref(atom).atoms
        except PendingRef:
            return None
    return tuple(atoms)


def _closed_keys(atom: ObjectAtom) -> frozenset[str] | None:
    """The only keys an object atom allows, where one of its rules names them all."""
    found = None
    for rules in atom.rules:
        if rules.additional == NEVER and not rules.patterns:
            names = frozenset(name for name, _ in rules.properties)
            found = names if found is None else found & names
    return found


def _is_object_schema(schema: dict[str, Any]) -> bool:
    """Whether `strict` applies: the schema is about objects (by type or keywords)."""
    declared = schema.get("type")
    if declared == "object" or (isinstance(declared, list) and "object" in declared):
        return True
    return any(k in schema for k in ("properties", "patternProperties", "required"))


KNOWN_DIALECTS = ("json-schema.org/", "spec.openapis.org/")


def _check_dialect(document: Any) -> None:
    """A root `$schema` outside the published dialects names a meta-schema whose vocabularies
    (which keywords validate) would have to be downloaded: refused, not guessed."""
    uri = document.get("$schema") if isinstance(document, dict) else None
    if isinstance(uri, str) and not any(d in uri for d in KNOWN_DIALECTS):
        raise UnsupportedSchemaError(
            "$schema", "", f"unknown dialect {uri!r}: its vocabularies are not known offline")


def _draft_uses_id(document: Any) -> bool:
    """Drafts 3-4 name resources with `id` (later ones with `$id`)."""
    uri = document.get("$schema", "") if isinstance(document, dict) else ""
    return isinstance(uri, str) and any(f"draft-0{n}" in uri for n in (3, 4))


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
