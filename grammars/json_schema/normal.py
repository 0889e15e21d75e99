"""The JSON Schema front-end's normal form: a schema as a union of per-type *atoms*.

Lowering (`pegmask.grammars.json_schema.lower`) turns keywords into atoms, and combinators into
operations on them: `anyOf` is a union, `allOf` an intersection (`Algebra.intersect`), `enum`
filters constants through `Algebra.accepts`. Object atoms keep their key rules as a conjunction
(intersected per key only when the grammar is emitted), which keeps recursive schemas finite;
`$ref` stays a `RefAtom` (a named rule) until something needs its content.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from pegmask.grammars.errors import SchemaError


@dataclass(frozen=True)
class NullAtom:
    pass


@dataclass(frozen=True)
class BoolAtom:
    pass


@dataclass(frozen=True)
class NumberAtom:
    integer: bool = False
    minimum: Decimal | None = None
    exclusive_minimum: bool = False
    maximum: Decimal | None = None
    exclusive_maximum: bool = False
    multiple_of: tuple[Decimal, ...] = ()
    pointer: str = field(default="", compare=False)
    fractional: bool = False  # only non-integral values ("number, not integer")


@dataclass(frozen=True)
class StringAtom:
    """Strings of `min_length`..`max_length` characters matching every `patterns` (ECMAScript
    search), every `formats`, none of `not_patterns`, and not in `excluded`."""

    min_length: int = 0
    max_length: int | None = None
    patterns: tuple[str, ...] = ()
    formats: tuple[str, ...] = ()
    not_patterns: tuple[str, ...] = ()
    excluded: tuple[str, ...] = ()
    pointer: str = field(default="", compare=False)


@dataclass(frozen=True)
class ArrayAtom:
    prefix: tuple[Schema, ...] = ()
    items: Schema | None = None  # beyond the prefix; None: any value
    min_items: int = 0
    max_items: int | None = None
    contains: tuple[Schema, ...] = ()
    pointer: str = field(default="", compare=False)
    unique: bool = False  # uniqueItems (set only where maxItems allows two items)


@dataclass(frozen=True)
class KeyRules:
    """One schema's rules for an object's members: named, by key pattern, and the rest."""

    properties: tuple[tuple[str, Schema], ...] = ()
    patterns: tuple[tuple[str, Schema], ...] = ()
    additional: Schema | None = None  # None: any value

    def named(self, key: str) -> Schema | None:
        for name, schema in self.properties:
            if name == key:
                return schema
        return None


@dataclass(frozen=True)
class ObjectAtom:
    """Objects satisfying every one of `rules` (a conjunction), with the `required` keys, a
    member count within bounds, and keys valid under every `property_names` schema."""

    rules: tuple[KeyRules, ...] = ()
    required: frozenset[str] = frozenset()
    min_properties: int = 0
    max_properties: int | None = None
    property_names: tuple[Schema, ...] = ()
    pointer: str = field(default="", compare=False)


@dataclass(frozen=True)
class ConstAtom:
    """One JSON value (`key` is its canonical text; `value` keeps the original key order)."""

    key: str
    value: Any = field(compare=False, hash=False)

    @staticmethod
    def of(value: Any) -> ConstAtom:
        return ConstAtom(canonical_json(value), value)


@dataclass(frozen=True)
class RefAtom:
    """A named schema (a `$ref` target or an intersection involving one), emitted as a rule."""

    key: tuple


Atom = NullAtom | BoolAtom | NumberAtom | StringAtom | ArrayAtom | ObjectAtom | ConstAtom | RefAtom


@dataclass(frozen=True)
class Schema:
    """A union of atoms (no atoms: nothing is valid)."""

    atoms: tuple[Atom, ...]


ANY = Schema((NullAtom(), BoolAtom(), NumberAtom(), StringAtom(), ArrayAtom(), ObjectAtom()))
NEVER = Schema(())
MAX_ATOMS = 512
DISJOINT_DEPTH = 8
"""How deep `Algebra.disjoint` looks into members and items for a proof."""


class AtomSet:
    """Atoms in the order they are added, each once. Constants are told apart by their key in
    a set (an enum has thousands: comparing each with all was quadratic), the few other
    atoms by equality."""

    def __init__(self) -> None:
        self._atoms: list[Atom] = []
        self._keys: set[str] = set()
        self._others: list[Atom] = []

    def add(self, atom: Atom) -> None:
        if isinstance(atom, ConstAtom):
            if atom.key in self._keys:
                return
            self._keys.add(atom.key)
        elif atom in self._others:
            return
        else:
            self._others.append(atom)
        self._atoms.append(atom)

    def update(self, atoms: Iterable[Atom]) -> None:
        for atom in atoms:
            self.add(atom)

    def atoms(self) -> tuple[Atom, ...]:
        return tuple(self._atoms)


def canonical_json(value: Any) -> str:
    """Text equal for JSON-equal values (1 and 1.0 alike, key order ignored)."""
    return json.dumps(_normalized(value), sort_keys=True, ensure_ascii=False)


def _normalized(value: Any) -> Any:
    """`value` with numbers as their normalized decimal text (a function of the module, not
    of each call: a nested one is a reference cycle, garbage for the collector, per enum
    value)."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, float)):
        return {"$n": str(Decimal(repr(value)).normalize()) if value != 0 else "0"}
    if isinstance(value, list):
        return [_normalized(x) for x in value]
    return {k: _normalized(x) for k, x in value.items()}


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def to_decimal(value: int | float) -> Decimal:
    return Decimal(value) if isinstance(value, int) else Decimal(repr(value))


class PendingRef(Exception):
    """A reference whose target is still being lowered (its content is not known yet)."""


class Algebra:
    """Intersection and membership on normal-form schemas.

    `expand(key)` gives the schema of a `RefAtom` (raising `PendingRef` while the target is
    being lowered); `matches(kind, source, text)` decides `pattern` / `format` membership of a
    string (kind "pattern" or "format"); `language(kind, source)` is its automaton (for
    deciding whether two string atoms can share a value).
    """

    def __init__(self, expand: Callable[[tuple], Schema],
                 matches: Callable[[str, str, str], bool],
                 language: Callable[[str, str], Any]):
        self.expand = expand
        self.matches = matches
        self.language = language
        self.stored: list[Schema] = []  # right-hand sides of deferred ("with", ref, i) keys
        self._expanding: list[tuple] = []

    # ----------------------------------------------------------------- union / intersection
    @staticmethod
    def union(schemas: list[Schema]) -> Schema:
        atoms = AtomSet()
        for schema in schemas:
            if schema is ANY:
                return ANY
            atoms.update(schema.atoms)
        return _checked(Schema(atoms.atoms()))

    def intersect(self, a: Schema, b: Schema) -> Schema:
        if a is ANY or b is NEVER:
            return b
        if b is ANY or a is NEVER:
            return a
        # A constant of `a` meets at most one constant of `b` (the one of its key): looked up,
        # not compared with each (two enums of thousands). Results keep the pairs' order.
        at = {y.key: i for i, y in enumerate(b.atoms) if isinstance(y, ConstAtom)}
        others = [(i, y) for i, y in enumerate(b.atoms) if not isinstance(y, ConstAtom)]
        atoms = AtomSet()
        for x in a.atoms:
            if not isinstance(x, ConstAtom):
                for y in b.atoms:
                    atoms.update(self._intersect_atoms(x, y))
                continue
            same = at.get(x.key)
            for i, y in others:
                if same is not None and same < i:
                    atoms.add(x)
                    same = None
                atoms.update(self._intersect_atoms(x, y))
            if same is not None:
                atoms.add(x)
        return _checked(Schema(atoms.atoms()))

    def _intersect_atoms(self, x: Atom, y: Atom) -> list[Atom]:
        if isinstance(x, RefAtom) and isinstance(y, RefAtom):
            if x == y:
                return [x]
            # Parts in operand order (not sorted): property order follows it, as for `allOf`.
            return [RefAtom(("and", *dict.fromkeys((*_ref_parts(x), *_ref_parts(y)))))]
        if isinstance(x, RefAtom) or isinstance(y, RefAtom):
            ref, other = (x, y) if isinstance(x, RefAtom) else (y, x)
            try:
                content = self.expand_ref(ref)
            except PendingRef:
                self.stored.append(Schema((other,)))
                return [RefAtom(("with", ref.key, len(self.stored) - 1))]
            # Keep the operands' order: object rules (and so property order) follow it.
            pair = (content, Schema((y,))) if ref is x else (Schema((x,)), content)
            return list(self.intersect(*pair).atoms)
        if isinstance(y, ConstAtom):
            x, y = y, x
        if isinstance(x, ConstAtom):
            return [x] if self.accepts(Schema((y,)), x.value) else []
        if type(x) is not type(y):
            return []
        if isinstance(x, (NullAtom, BoolAtom)):
            return [x]
        if isinstance(x, NumberAtom):
            number = _intersect_numbers(x, y)
            return [] if number.integer and number.fractional else [number]
        # bounds that cross (a complement's minLength 101 beside maxLength 100): no value
        if isinstance(x, StringAtom):
            string = _intersect_strings(x, y)
            return [] if _crossed(string.min_length, string.max_length) else [string]
        if isinstance(x, ArrayAtom):
            array = self._intersect_arrays(x, y)
            return [] if _crossed(array.min_items, array.max_items) else [array]
        obj = _intersect_objects(x, y)
        return [] if _crossed(obj.min_properties, obj.max_properties) else [obj]

    def expand_ref(self, atom: RefAtom) -> Schema:
        """The content of a `RefAtom`; a cycle of references without content is an error."""
        if atom.key in self._expanding:
            raise SchemaError("circular $ref that never reaches a schema", _pointer_of(atom.key))
        self._expanding.append(atom.key)
        try:
            return self.expand(atom.key)
        finally:
            self._expanding.pop()

    def _intersect_arrays(self, x: ArrayAtom, y: ArrayAtom) -> ArrayAtom:
        length = max(len(x.prefix), len(y.prefix))
        prefix = tuple(self.intersect(_item_at(x, i), _item_at(y, i)) for i in range(length))
        items = None if x.items is None and y.items is None else self.intersect(
            x.items or ANY, y.items or ANY)
        return ArrayAtom(
            prefix, items, max(x.min_items, y.min_items), _min_bound(x.max_items, y.max_items),
            x.contains + y.contains, x.pointer, x.unique or y.unique)

    # ----------------------------------------------------------------- disjointness
    def disjoint(self, a: Schema, b: Schema, depth: int = 0) -> bool:
        """Whether no value is valid under both `a` and `b`, where provable cheaply: by type,
        constants, numeric ranges, string lengths and languages, array lengths and prefix
        items, and object keys one requires whose values cannot agree (a discriminator).
        False means "not proven", never "overlapping"."""
        if depth > DISJOINT_DEPTH:
            return False
        try:
            return all(self._disjoint_atoms(x, y, depth) for x in a.atoms for y in b.atoms)
        except PendingRef:  # content not known yet (a recursive reference)
            return False

    def _disjoint_atoms(self, x: Atom, y: Atom, depth: int) -> bool:
        if isinstance(x, RefAtom) or isinstance(y, RefAtom):
            ref, other = (x, y) if isinstance(x, RefAtom) else (y, x)
            if ref.key in self._expanding:
                return False
            return self.disjoint(self.expand_ref(ref), Schema((other,)), depth + 1)
        if isinstance(y, ConstAtom):
            x, y = y, x
        if isinstance(x, ConstAtom):
            return not self.accepts(Schema((y,)), x.value)
        if type(x) is not type(y):
            return True
        if isinstance(x, NumberAtom):
            return (_ranges_disjoint(x, y) or (x.integer and y.fractional)
                    or (x.fractional and y.integer))
        if isinstance(x, StringAtom):
            return self._strings_disjoint(x, y)
        if isinstance(x, ArrayAtom):
            return self._arrays_disjoint(x, y, depth)
        if isinstance(x, ObjectAtom):
            return self._objects_disjoint(x, y, depth)
        return False

    def _strings_disjoint(self, x: StringAtom, y: StringAtom) -> bool:
        if _counts_disjoint(x.min_length, x.max_length, y.min_length, y.max_length):
            return True
        sources = [("pattern", p) for p in x.patterns + y.patterns]
        sources += [("format", f) for f in x.formats + y.formats]
        if len(sources) < 2:
            return False
        try:
            dfa = self.language(*sources[0])
            for source in sources[1:]:
                dfa = dfa.intersect(self.language(*source))
        except SchemaError:  # an automaton past its size cap: not proven
            return False
        return dfa.is_empty()

    def _arrays_disjoint(self, x: ArrayAtom, y: ArrayAtom, depth: int) -> bool:
        if _counts_disjoint(x.min_items, x.max_items, y.min_items, y.max_items):
            return True
        present = max(x.min_items, y.min_items)  # items every common value has
        return any(self.disjoint(_item_at(x, i), _item_at(y, i), depth + 1)
                   for i in range(min(present, max(len(x.prefix), len(y.prefix)) + 1)))

    def _objects_disjoint(self, x: ObjectAtom, y: ObjectAtom, depth: int) -> bool:
        if _counts_disjoint(x.min_properties, x.max_properties, y.min_properties, y.max_properties):
            return True
        return any(self.disjoint(self.member_schema(x, key), self.member_schema(y, key), depth + 1)
                   for key in sorted(x.required | y.required))

    # ----------------------------------------------------------------- membership
    def accepts(self, schema: Schema, value: Any) -> bool:
        """Whether `value` is valid under `schema` (used to filter `enum` / `const`)."""
        key = None  # the value's canonical text, made once for all the constants
        for atom in schema.atoms:
            if isinstance(atom, ConstAtom):
                key = canonical_json(value) if key is None else key
                if atom.key == key:
                    return True
            elif self._accepts_atom(atom, value):
                return True
        return False

    def _accepts_atom(self, atom: Atom, value: Any) -> bool:
        if isinstance(atom, RefAtom):
            return self.accepts(self.expand_ref(atom), value)
        if isinstance(atom, NullAtom):
            return value is None
        if isinstance(atom, BoolAtom):
            return isinstance(value, bool)
        if isinstance(atom, NumberAtom):
            return is_number(value) and _number_ok(atom, value)
        if isinstance(atom, StringAtom):
            return isinstance(value, str) and self._string_ok(atom, value)
        if isinstance(atom, ArrayAtom):
            return isinstance(value, list) and self._array_ok(atom, value)
        return isinstance(value, dict) and self._object_ok(atom, value)

    def _string_ok(self, atom: StringAtom, value: str) -> bool:
        return (atom.min_length <= len(value)
                and (atom.max_length is None or len(value) <= atom.max_length)
                and all(self.matches("pattern", p, value) for p in atom.patterns)
                and all(self.matches("format", f, value) for f in atom.formats)
                and not any(self.matches("pattern", p, value) for p in atom.not_patterns)
                and value not in atom.excluded)

    def _array_ok(self, atom: ArrayAtom, value: list) -> bool:
        if len(value) < atom.min_items or (atom.max_items is not None and len(value) > atom.max_items):
            return False
        if not all(self.accepts(_item_at(atom, i), v) for i, v in enumerate(value)):
            return False
        if atom.unique and len({canonical_json(v) for v in value}) < len(value):
            return False
        return all(any(self.accepts(c, v) for v in value) for c in atom.contains)

    def _object_ok(self, atom: ObjectAtom, value: dict) -> bool:
        if not atom.required <= value.keys() or len(value) < atom.min_properties:
            return False
        if atom.max_properties is not None and len(value) > atom.max_properties:
            return False
        for key, item in value.items():
            if not all(self.accepts(names, key) for names in atom.property_names):
                return False
            if not self.accepts(self.member_schema(atom, key), item):
                return False
        return True

    def member_schema(self, atom: ObjectAtom, key: str) -> Schema:
        """What the value of member `key` must satisfy (all rules of the atom together)."""
        result = ANY
        for rules in atom.rules:
            result = self.intersect(result, self.rule_schema(rules, key))
        return result

    def rule_schema(self, rules: KeyRules, key: str) -> Schema:
        named = rules.named(key)
        if named is not None:
            parts = [named]
        else:
            parts = [s for p, s in rules.patterns if self.matches("pattern", p, key)]
            if not parts:
                return ANY if rules.additional is None else rules.additional
        if named is not None:
            parts += [s for p, s in rules.patterns if self.matches("pattern", p, key)]
        result = ANY
        for part in parts:
            result = self.intersect(result, part)
        return result


def _ref_parts(atom: RefAtom) -> tuple:
    return atom.key[1:] if atom.key[0] == "and" else (atom.key,)


def _pointer_of(key: tuple) -> str:
    return key[1] if key and key[0] == "ref" and isinstance(key[1], str) else ""


def _checked(schema: Schema) -> Schema:
    """`schema`, unless combinators made it too many alternatives. Constants do not count:
    there are only as many as the schema writes (an `anyOf` of thousands of `const`s)."""
    if sum(not isinstance(a, ConstAtom) for a in schema.atoms) > MAX_ATOMS:
        raise SchemaError(f"schema combinators expand to more than {MAX_ATOMS} alternatives")
    return schema


def _item_at(atom: ArrayAtom, index: int) -> Schema:
    if index < len(atom.prefix):
        return atom.prefix[index]
    return ANY if atom.items is None else atom.items


def _counts_disjoint(lo1: int, hi1: int | None, lo2: int, hi2: int | None) -> bool:
    return (hi1 is not None and hi1 < lo2) or (hi2 is not None and hi2 < lo1)


def _ranges_disjoint(x: NumberAtom, y: NumberAtom) -> bool:
    """Whether the numeric ranges of `x` and `y` do not meet (bounds only)."""
    for low, high in ((x, y), (y, x)):
        if low.minimum is not None and high.maximum is not None and (
                low.minimum > high.maximum or (low.minimum == high.maximum and (
                    low.exclusive_minimum or high.exclusive_maximum))):
            return True
    return False


def _min_bound(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


def _intersect_numbers(x: NumberAtom, y: NumberAtom) -> NumberAtom:
    lo, lo_x = x.minimum, x.exclusive_minimum
    if y.minimum is not None and (lo is None or y.minimum > lo or (y.minimum == lo and y.exclusive_minimum)):
        lo, lo_x = y.minimum, y.exclusive_minimum
    hi, hi_x = x.maximum, x.exclusive_maximum
    if y.maximum is not None and (hi is None or y.maximum < hi or (y.maximum == hi and y.exclusive_maximum)):
        hi, hi_x = y.maximum, y.exclusive_maximum
    multiples = x.multiple_of + tuple(m for m in y.multiple_of if m not in x.multiple_of)
    return NumberAtom(x.integer or y.integer, lo, lo_x, hi, hi_x, multiples, x.pointer,
                      x.fractional or y.fractional)


def _crossed(low: int, high: int | None) -> bool:
    """A count range `low`..`high` that holds no count."""
    return high is not None and low > high


def _intersect_strings(x: StringAtom, y: StringAtom) -> StringAtom:
    def merged(a: tuple[str, ...], b: tuple[str, ...]) -> tuple[str, ...]:
        return a + tuple(v for v in b if v not in a)

    return StringAtom(
        max(x.min_length, y.min_length), _min_bound(x.max_length, y.max_length),
        merged(x.patterns, y.patterns), merged(x.formats, y.formats),
        merged(x.not_patterns, y.not_patterns), merged(x.excluded, y.excluded), x.pointer)


def _intersect_objects(x: ObjectAtom, y: ObjectAtom) -> ObjectAtom:
    return ObjectAtom(
        x.rules + tuple(r for r in y.rules if r not in x.rules), x.required | y.required,
        max(x.min_properties, y.min_properties), _min_bound(x.max_properties, y.max_properties),
        x.property_names + y.property_names, x.pointer)


def number_accepts(atom: NumberAtom, value: Decimal) -> bool:
    """Bounds and `multipleOf` for a finite decimal value."""
    if atom.integer and value != value.to_integral_value():
        return False
    if atom.fractional and value == value.to_integral_value():
        return False
    if atom.minimum is not None and (value < atom.minimum or (atom.exclusive_minimum and value == atom.minimum)):
        return False
    if atom.maximum is not None and (value > atom.maximum or (atom.exclusive_maximum and value == atom.maximum)):
        return False
    return all((value / m) == (value / m).to_integral_value() for m in atom.multiple_of)


def _number_ok(atom: NumberAtom, value: int | float) -> bool:
    if isinstance(value, float) and not math.isfinite(value):
        return False
    return number_accepts(atom, to_decimal(value))
