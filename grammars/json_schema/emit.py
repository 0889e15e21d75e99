"""Normal-form schemas (`normal`) to grammar IR rules.

Shared pieces (whitespace, any value, any string, one string character, repetitions, big
subtrees that would otherwise be copied) become named rules, so the compiled program stays
linear in the schema: the compiler expands every occurrence of a node, but a rule only once.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from decimal import Decimal
from typing import TYPE_CHECKING

from pegmask.grammars.errors import SchemaError, UnsupportedSchemaError
from pegmask.grammars.ir import (
    EMPTY,
    JSON_WHITESPACE,
    MAX_UNICODE,
    CharClass,
    Choice,
    Literal,
    Node,
    Ref,
    Repeat,
    Seq,
    choice,
    optional,
    seq,
)
from pegmask.grammars.json_schema.lexical import (
    ALL,
    INTEGER,
    NON_INTEGRAL,
    NOT_PLAIN,
    NUMBER,
    PLAIN,
    QUOTE,
    encode_node,
    encode_ranges,
    integer_range,
    multiple_of_dfa,
    number_range,
    string_literal,
    value_literal,
)
from pegmask.grammars.json_schema.normal import (
    ANY,
    ArrayAtom,
    Atom,
    BoolAtom,
    ConstAtom,
    NullAtom,
    NumberAtom,
    ObjectAtom,
    RefAtom,
    Schema,
    StringAtom,
)
from pegmask.grammars.json_schema.regular import (
    Bounded,
    CharDFA,
    Language,
    NotCharLevel,
    RegularTooLarge,
    language_ir,
    not_in_node,
    restrict_length,
    without_words,
)
from pegmask.grammars.program import instruction_count

if TYPE_CHECKING:
    from pegmask.grammars.json_schema.lower import Lowering

NEVER_NODE = Choice(())
MAX_KEY_REGIONS = 32
ANY_ORDER_BUDGET = 2048  # any-order states (2^slots per object) per schema; then schema order
MAX_RULES = 50_000
MAX_UNIQUE_STATES = 1024  # sets of items written so far that a `uniqueItems` array may reach
_MAX_COUNTED_SLOTS = 64  # minProperties / maxProperties counting: one rule call per slot
_SMALL = 24  # nodes of up to about this many instructions are copied instead of shared
_ANY_TEXT = Repeat(CharClass(((0, MAX_UNICODE),)), 0, None)


class CommonRules:
    """The rules that depend on no schema, only on the whitespace (whitespace, any string, any
    value, numbers), named with `prefix`, and the size estimates of nodes: shared by the
    schemas of one grammar (a dialect's hundreds of tools would each have a copy, two thirds
    of their instructions), each emitter starting with the rules made before it."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.rules: dict[str, Node] = {}
        self.sizes: dict[int, tuple[Node, int]] = {}  # see `program.instruction_count`


class Emitter:
    """Emits the rules for one schema; every rule name starts with `prefix`."""

    def __init__(self, lowering: Lowering, *, prefix: str, max_whitespace: int,
                 any_order_limit: int, common: CommonRules | None = None):
        self.lowering = lowering
        self.algebra = lowering.algebra
        self.prefix = prefix
        self.common = CommonRules(prefix) if common is None else common
        self.any_order_limit = any_order_limit  # objects with up to this many slots: any order
        self.rules: dict[str, Node] = dict(self.common.rules)
        self._ref_names: dict[tuple, str] = {}
        self._pending: list[tuple[tuple, str]] = []
        self._saw_never = False
        self._counter = 0
        self._any_order_budget = ANY_ORDER_BUDGET
        self._classes: dict[tuple[tuple[int, int], ...], Node | None] = {}
        self._repeats: dict[tuple[Node, int, int | None], Node] = {}
        self._extras: dict[tuple, Node | None] = {}  # see `extra_member`
        self._sizes = self.common.sizes  # instruction counts by node identity
        self.ws = self.shared("ws", lambda: Repeat(JSON_WHITESPACE, 0, max_whitespace)) if max_whitespace else EMPTY
        self.sep = seq(self.ws, Literal(b","), self.ws)
        self.colon = seq(self.ws, Literal(b":"), self.ws)

    # ----------------------------------------------------------------- rules
    def fresh(self, tag: str) -> str:
        """A new rule name (not yet defined)."""
        if len(self.rules) >= MAX_RULES:
            raise SchemaError(f"schema needs more than {MAX_RULES} grammar rules")
        self._counter += 1
        return f"{self.prefix}_{tag}{self._counter}"

    def new_name(self, tag: str) -> str:
        """A new rule name, reserved; the caller sets the body."""
        name = self.fresh(tag)
        self.rules[name] = EMPTY
        return name

    def shared(self, tag: str, build: Callable[[], Node]) -> Ref:
        """The common rule `tag` (see `CommonRules`), built once (the builder may refer to
        the rule itself)."""
        name = f"{self.common.prefix}_{tag}"
        if name not in self.rules:
            self.rules[name] = EMPTY
            self.rules[name] = self.common.rules[name] = build()
        return Ref(name)

    def share(self, node: Node) -> Node:
        """`node` itself when small, else a rule for it (so copies cost one call each)."""
        if instruction_count([node], self._sizes) <= _SMALL:
            return node
        name = self.new_name("n")
        self.rules[name] = node
        return Ref(name)

    def never(self) -> Node:
        self._saw_never = True
        return NEVER_NODE

    # ----------------------------------------------------------------- entry
    def emit_root(self, schema: Schema) -> tuple[Node, dict[str, Node]]:
        root = self.emit(schema)
        aliases: dict[tuple, list[tuple]] = {}  # references a rule makes before any input
        while self._pending:
            key, name = self._pending.pop()
            content = self.algebra.expand_ref(RefAtom(key))
            aliases[key] = [a.key for a in content.atoms if isinstance(a, RefAtom)]
            self.rules[name] = self.emit(content)
        _check_alias_cycles(aliases)
        if self._saw_never:
            root, self.rules = _prune(root, self.rules)
        if root is None or _is_never(root):
            raise SchemaError("the schema accepts no value")
        return root, self.rules

    def emit_raw_root(self, schema: Schema, stop: str) -> tuple[Node, dict[str, Node]]:
        """The strings `schema` accepts, written raw (unescaped, as XML-parameter dialects
        write string values) and never containing `stop`, which ends the value."""
        if schema is ANY:
            raise UnsupportedSchemaError("type", "", "a raw value must be a string")
        atoms = list(schema.atoms)
        for _ in range(64):  # a chain of `$ref`s to the string schema
            refs = [a for a in atoms if isinstance(a, RefAtom)]
            if not refs:
                break
            atoms = [a for a in atoms if not isinstance(a, RefAtom)]
            atoms += [b for a in refs for b in self.algebra.expand_ref(a).atoms]
        words = [a.value for a in atoms if isinstance(a, ConstAtom) and isinstance(a.value, str)]
        strings = [a for a in atoms if isinstance(a, StringAtom)]
        if len(words) + len(strings) != len(atoms):
            raise UnsupportedSchemaError("type", "", "a raw value must be a string")
        try:
            ends_early = CharDFA.from_node(seq(_ANY_TEXT, Literal.of(stop), _ANY_TEXT))
            languages = [self.raw_language(a) for a in strings]
            if words:
                languages.append(Bounded(CharDFA.from_strings(words)))
            languages = [Bounded(b.dfa.difference(ends_early), b.lo, b.hi)
                         for b in languages if b is not None]
            if len(languages) > 1:  # a union: the length bounds go into the automata
                union = languages[0].dfa.with_length(languages[0].lo, languages[0].hi)
                for b in languages[1:]:
                    union = union.union(b.dfa.with_length(b.lo, b.hi))
                languages = [Bounded(union)]
            base = self.fresh("raw")
            made = language_ir(languages[0], lambda key: base + "_" + "_".join(map(str, key))) \
                if languages else None
        except (RegularTooLarge, NotCharLevel) as exc:
            pointer = strings[0].pointer if strings else ""
            raise UnsupportedSchemaError("pattern", pointer, str(exc)) from exc
        if made is None:
            raise SchemaError("the schema accepts no raw string value")
        node, rules = made
        self.rules.update(rules)
        return node, self.rules

    def raw_language(self, atom: StringAtom) -> Bounded | None:
        """`string_language(atom)` as a DFA with its length bounds (None: no string)."""
        if not (atom.patterns or atom.formats or atom.not_patterns or atom.excluded):
            return Bounded(CharDFA.from_node(_ANY_TEXT), atom.min_length, atom.max_length)
        language = self.string_language(atom)
        if language is None or isinstance(language, Bounded):
            return language
        return Bounded(CharDFA.from_node(language))

    def emit(self, schema: Schema) -> Node:
        if schema is ANY:
            return self.any_value()
        consts = [a.value for a in schema.atoms if isinstance(a, ConstAtom)]
        # Two JSON strings never match the same text (the first unescaped quote ends each), so
        # their order ranks nothing: sorted, the strings that share a prefix are neighbours,
        # and the compiler's trie shares their escaped characters too (`grammars.alternation`).
        alts = [value_literal(value, self.ws) for value in consts if not isinstance(value, str)]
        alts += [string_literal(value) for value in sorted(v for v in consts if isinstance(v, str))]
        alts += [self.atom(a) for a in schema.atoms if not isinstance(a, ConstAtom)]
        alts = [a for a in alts if not _is_never(a)]
        return choice(*alts) if alts else self.never()

    def atom(self, atom: Atom) -> Node:
        if isinstance(atom, NullAtom):
            return Literal(b"null")
        if isinstance(atom, BoolAtom):
            return choice(Literal(b"true"), Literal(b"false"))
        if isinstance(atom, RefAtom):
            name = self._ref_names.get(atom.key)
            if name is None:
                name = self._ref_names[atom.key] = self.new_name("d")
                self._pending.append((atom.key, name))
            return Ref(name)
        if isinstance(atom, NumberAtom):
            return self.number(atom)
        if isinstance(atom, StringAtom):
            return self.string(atom)
        if isinstance(atom, ArrayAtom):
            return self.array(atom)
        return self.object(atom)

    # ----------------------------------------------------------------- any value
    def any_value(self) -> Ref:
        def build() -> Node:
            value = Ref(f"{self.common.prefix}_any")
            member = seq(self.any_string(), self.colon, value)
            members = seq(member, Repeat(seq(self.sep, member), 0, None), self.ws)
            items = seq(value, Repeat(seq(self.sep, value), 0, None), self.ws)
            return choice(
                seq(Literal(b"{"), self.ws, optional(members), Literal(b"}")),
                seq(Literal(b"["), self.ws, optional(items), Literal(b"]")),
                self.any_string(), self.shared("num", lambda: NUMBER),
                Literal(b"true"), Literal(b"false"), Literal(b"null"))

        return self.shared("any", build)

    def any_string(self) -> Ref:
        return self.shared("str", lambda: seq(QUOTE, Repeat(self.char_body(), 0, None), QUOTE))

    def char_body(self) -> Node:
        """One string character: printable ASCII inline, everything else a shared rule."""
        return choice(PLAIN, self.not_plain())

    def not_plain(self) -> Ref:
        return self.shared("other", lambda: NOT_PLAIN)

    def char(self) -> Ref:
        return self.shared("char", self.char_body)

    def encode(self, chars: Node | None) -> Node | None:
        """JSON spellings of a character-level node (`Ref`s kept), sharing common pieces."""
        return None if chars is None else encode_node(chars, self.encode_class)

    def encode_class(self, ranges: tuple[tuple[int, int], ...]) -> Node | None:
        """One character of a class: the shared any-character rule, or a rule per big class
        (`share`). One of printable ASCII and a shared rule, which `share` keeps inline, skips
        its size estimate: a key beside the names has such a class per prefix of a name."""
        if ranges == ALL:
            return self.char()
        if ranges not in self._classes:
            node = encode_ranges(ranges, self.not_plain())
            small = isinstance(node, Choice) and all(
                isinstance(alt, (CharClass, Ref)) for alt in node.alts)
            self._classes[ranges] = node if node is None or small else self.share(node)
        return self._classes[ranges]

    # ----------------------------------------------------------------- numbers
    def number(self, atom: NumberAtom) -> Node:
        if atom.integer:
            lo = hi = None
            if atom.minimum is not None:
                lo = math.ceil(atom.minimum)
                lo += atom.exclusive_minimum and lo == atom.minimum
            if atom.maximum is not None:
                hi = math.floor(atom.maximum)
                hi -= atom.exclusive_maximum and hi == atom.maximum
            if lo is None and hi is None and not atom.multiple_of:
                return self.shared("int", lambda: INTEGER)
            node = integer_range(lo, hi)
        elif atom.minimum is None and atom.maximum is None:
            if atom.fractional and not atom.multiple_of:
                return self.shared("frac", lambda: NON_INTEGRAL)
            node = NUMBER if atom.multiple_of else self.shared("num", lambda: NUMBER)
        else:
            try:
                node = number_range(atom.minimum, atom.exclusive_minimum,
                                    atom.maximum, atom.exclusive_maximum)
            except RegularTooLarge as exc:
                raise UnsupportedSchemaError("minimum", atom.pointer, str(exc)) from exc
        if node is None:
            return self.never()
        if atom.multiple_of:
            node = self.multiple_of(node, atom)
        if atom.fractional:
            node = self.non_integral(node, atom)
        return node

    def non_integral(self, node: Node, atom: NumberAtom) -> Node:
        """The non-integral spellings within `node` ("number, not integer")."""
        try:
            result = CharDFA.from_node(node).intersect(CharDFA.from_node(NON_INTEGRAL))
        except RegularTooLarge as exc:
            raise UnsupportedSchemaError("not", atom.pointer, f"not integer: {exc}") from exc
        spelled = self.spell(Bounded(result), "not", atom.pointer)
        return self.never() if spelled is None else spelled

    def multiple_of(self, node: Node, atom: NumberAtom) -> Node:
        steps = atom.multiple_of
        if len(steps) > 1:
            if not all(s == s.to_integral_value() for s in steps):
                raise UnsupportedSchemaError("multipleOf", atom.pointer, "several fractional steps")
            step = Decimal(math.lcm(*(int(s) for s in steps)))
        else:
            step = steps[0]
        try:
            dfa = multiple_of_dfa(step, atom.integer)
            if dfa is None:
                raise UnsupportedSchemaError("multipleOf", atom.pointer, f"step {step} is too fine")
            result = CharDFA.from_node(node).intersect(dfa)
        except RegularTooLarge as exc:
            raise UnsupportedSchemaError("multipleOf", atom.pointer, str(exc)) from exc
        spelled = self.spell(Bounded(result), "multipleOf", atom.pointer)
        return self.never() if spelled is None else spelled

    # ----------------------------------------------------------------- strings
    def string(self, atom: StringAtom) -> Node:
        if not (atom.patterns or atom.formats or atom.not_patterns or atom.excluded):
            if atom.min_length == 0 and atom.max_length is None:
                return self.any_string()
            return seq(QUOTE, self.repeat(self.char(), atom.min_length, atom.max_length), QUOTE)
        encoded = self.spell(self.string_language(atom), _string_keyword(atom), atom.pointer)
        return self.never() if encoded is None else seq(QUOTE, encoded, QUOTE)

    def string_language(self, atom: StringAtom) -> Language | None:
        """The decoded content of the strings `atom` accepts (None when none qualifies)."""
        lowering = self.lowering
        sources = [("pattern", p) for p in atom.patterns] + [("format", f) for f in atom.formats]
        lo, hi = atom.min_length, atom.max_length
        try:
            if len(sources) == 1 and not atom.not_patterns and not atom.excluded:
                node = lowering.regex_node(*sources[0], atom.pointer)
                return restrict_length(node, lo, hi) if lo or hi is not None else node
            dfa = CharDFA.from_node(_ANY_TEXT)
            for kind, source in sources:
                dfa = dfa.intersect(lowering.regex_dfa(kind, source, atom.pointer))
            for pattern in atom.not_patterns:
                dfa = dfa.difference(lowering.regex_dfa("pattern", pattern, atom.pointer))
            if atom.excluded:
                dfa = dfa.difference(CharDFA.from_strings(atom.excluded))
            for kind, source in sources:  # a source that already says it all keeps its IR
                if dfa.equivalent(lowering.regex_dfa(kind, source, atom.pointer)):
                    node = lowering.regex_node(kind, source, atom.pointer)
                    return restrict_length(node, lo, hi) if lo or hi is not None else node
        except (RegularTooLarge, NotCharLevel) as exc:
            raise UnsupportedSchemaError(_string_keyword(atom), atom.pointer, str(exc)) from exc
        return Bounded(dfa, lo, hi)

    def spell(self, language: Language | None, keyword: str, pointer: str,
              without: tuple[CharDFA, list[str]] | None = None) -> Node | None:
        """JSON spellings of a character language (see `language_ir`); None when empty.
        `without` (a DFA and words) is the same language as a difference, spelled by
        `without_words` where `language` has no compact form (or is None: not computed)."""
        if language is None and without is None:
            return None
        base = self.fresh("s")

        def name(key: tuple) -> str:
            return base + "_" + "_".join(map(str, key))

        try:
            try:
                if language is None:
                    raise RegularTooLarge("the difference was not computed")
                made = language_ir(language, name)
            except RegularTooLarge:
                if without is None:
                    raise
                made = without_words(*without, name)
        except (RegularTooLarge, NotCharLevel) as exc:
            raise UnsupportedSchemaError(keyword, pointer, str(exc)) from exc
        if made is None:
            return None
        node, rules = made
        for name, body in rules.items():
            self.rules[name] = self.encode(body)
        return self.encode(node)

    # ----------------------------------------------------------------- arrays
    def array(self, atom: ArrayAtom) -> Node:
        if atom.unique:
            return self.unique_array(atom)
        lo, hi = atom.min_items, atom.max_items
        prefix: list[Node] = []
        rest: Node | None = None
        for schema in atom.prefix:
            node = self.emit(schema)
            if _is_never(node):
                break
            prefix.append(node)
        if len(prefix) == len(atom.prefix):
            node = self.emit(ANY if atom.items is None else atom.items)
            rest = None if _is_never(node) else self.share(node)
        if rest is None:
            hi = len(prefix) if hi is None else min(hi, len(prefix))
        if hi is not None and lo > hi:
            return self.never()
        if atom.contains:
            return self.array_contains(atom, rest)
        empty = seq(Literal(b"["), self.ws, Literal(b"]"))
        if hi == 0:
            return empty
        body = seq(Literal(b"["), self.ws, self.elements(prefix, rest, 0, lo, hi), self.ws, Literal(b"]"))
        return choice(empty, body) if lo == 0 else body

    def elements(self, prefix: list[Node], rest: Node | None, i: int, lo: int, hi: int | None) -> Node:
        """Elements from position i on, position i present (preceded by a comma unless first)."""
        lead = self.sep if i else EMPTY
        if i < len(prefix):
            here = seq(lead, prefix[i])
            if (hi is not None and i + 1 >= hi) or (i + 1 >= len(prefix) and rest is None):
                return here
            tail = self.elements(prefix, rest, i + 1, lo, hi)
            return seq(here, tail if i + 1 < lo else optional(tail))
        assert rest is not None
        more = self.repeat(seq(self.sep, rest), max(0, lo - i - 1), None if hi is None else hi - i - 1)
        return seq(lead, rest, more)

    def unique_array(self, atom: ArrayAtom) -> Node:
        """`uniqueItems` where every position's items come from a finite set of values (enum,
        const, booleans, null): a rule per set of values written so far, offering only the
        values not in it, so a duplicate can never be written. The set decides the position
        (its size) and whether `contains` holds, so it is the whole state."""
        domains = [self.finite_values(s) for s in atom.prefix]
        rest = self.finite_values(ANY if atom.items is None else atom.items)
        if any(d is None for d in domains) or (rest is None and (
                atom.max_items is None or atom.max_items > len(domains))):
            raise UnsupportedSchemaError("uniqueItems", atom.pointer, "only for items from a finite "
                                         "set of values (enum, const, boolean, null)")
        values = {v.key: v for d in [*domains, rest or []] for v in d or []}
        literals = {key: self.share(value_literal(v.value, self.ws)) for key, v in values.items()}
        satisfies = {key: [self.algebra.accepts(c, v.value) for c in atom.contains]
                     for key, v in values.items()}
        made: dict[frozenset[str], Ref | None] = {}

        def state(used: frozenset[str]) -> Ref | None:
            """The rule after writing the values `used` (None: no valid way to go on)."""
            if used in made:
                return made[used]
            if len(made) >= MAX_UNIQUE_STATES:
                raise UnsupportedSchemaError(
                    "uniqueItems", atom.pointer, f"the arrays need more than {MAX_UNIQUE_STATES} "
                    f"grammar states (sets of distinct items out of {len(values)} values)")
            made[used] = None
            i = len(used)
            alts: list[Node] = []
            if i >= atom.min_items and all(any(satisfies[k][c] for k in used)
                                           for c in range(len(atom.contains))):
                alts.append(Literal(b"]") if i == 0 else seq(self.ws, Literal(b"]")))
            domain = domains[i] if i < len(domains) else rest or []
            if atom.max_items is None or i < atom.max_items:
                for value in domain:
                    if value.key not in used and (after := state(used | {value.key})) is not None:
                        alts.append(seq(self.sep if i else EMPTY, literals[value.key], after))
            if alts:
                name = self.new_name("u")
                self.rules[name] = choice(*alts)
                made[used] = Ref(name)
            return made[used]

        start = state(frozenset())
        return self.never() if start is None else seq(Literal(b"["), self.ws, start)

    def finite_values(self, schema: Schema, depth: int = 0) -> list[ConstAtom] | None:
        """The values valid under `schema` when they are few and known (constants, booleans,
        null), without duplicates; None otherwise."""
        values: dict[str, ConstAtom] = {}
        for atom in schema.atoms:
            if isinstance(atom, RefAtom):
                found = self.finite_values(self.algebra.expand_ref(atom), depth + 1) \
                    if depth < 8 else None
            elif isinstance(atom, ConstAtom):
                found = [atom]
            elif isinstance(atom, BoolAtom):
                found = [ConstAtom.of(True), ConstAtom.of(False)]
            elif isinstance(atom, NullAtom):
                found = [ConstAtom.of(None)]
            else:
                found = None
            if found is None:
                return None
            values.update((v.key, v) for v in found)
        return list(values.values())

    def array_contains(self, atom: ArrayAtom, rest: Node | None) -> Node:
        """`contains` (at least one match) for a homogeneous array without a maximum."""
        if len(atom.contains) > 1 or atom.prefix or atom.max_items is not None or atom.min_items > 1:
            raise UnsupportedSchemaError("contains", atom.pointer,
                                         "only one contains, without prefixItems, maxItems or minItems > 1")
        match = self.emit(self.algebra.intersect(ANY if atom.items is None else atom.items, atom.contains[0]))
        if _is_never(match) or rest is None:
            return self.never()
        before = Repeat(seq(rest, self.sep), 0, None)
        after = Repeat(seq(self.sep, rest), 0, None)
        return seq(Literal(b"["), self.ws, before, match, after, self.ws, Literal(b"]"))

    def repeat(self, item: Node, lo: int, hi: int | None) -> Node:
        """item{lo,hi}; a rule made once per (item, lo, hi) unless it is tiny. Large counts
        cost no more: the compiler counts them in O(log n) rules (`pegmask.grammars.counted`)."""
        if hi == 0:
            return EMPTY
        copies = lo + 1 if hi is None else hi
        if instruction_count([item], self._sizes) * copies <= _SMALL:
            return Repeat(item, lo, hi)
        key = (item, lo, hi)
        if key not in self._repeats:
            name = self.new_name("r")
            self.rules[name] = Repeat(self.share(item), lo, hi)
            self._repeats[key] = Ref(name)
        return self._repeats[key]

    # ----------------------------------------------------------------- objects
    def object(self, atom: ObjectAtom) -> Node:
        algebra = self.algebra
        names: list[str] = []
        for rules in atom.rules:
            names += [name for name, _ in rules.properties if name not in names]
        names += sorted(atom.required - set(names))
        slots: list[tuple[bool, Node]] = []
        for name in names:
            required = name in atom.required
            if all(algebra.accepts(n, name) for n in atom.property_names):
                value = self.emit(algebra.member_schema(atom, name))
            else:
                value = NEVER_NODE
            if _is_never(value):
                if required:
                    return self.never()
                continue
            slots.append((required, seq(string_literal(name), self.colon, value)))
        extra = self.extra_member(atom, names)
        return self.members(atom, slots, extra)

    def extra_member(self, atom: ObjectAtom, names: list[str]) -> Node | None:
        """One member whose key is none of `names`: the key patterns cut the other keys into
        regions (which patterns a key matches), each with its own value schema.

        Made once per key rules and names, and shared (an object written twice, or the
        variants of a `oneOf` of objects with the same properties, use one rule: its key
        is a trie of every name, as large as the names)."""
        key = (tuple((rules.patterns, rules.additional) for rules in atom.rules),
               atom.property_names, tuple(names))
        if key not in self._extras:
            member = self._extra_member(atom, names)
            self._extras[key] = None if member is None else self.share(member)
        return self._extras[key]

    def _extra_member(self, atom: ObjectAtom, names: list[str]) -> Node | None:
        patterns: list[str] = []
        for rules in atom.rules:
            patterns += [p for p, _ in rules.patterns if p not in patterns]
        members: list[Node] = []
        for chosen, others in self.key_regions(atom, patterns):
            value = ANY
            for rules in atom.rules:
                matched = [s for p, s in rules.patterns if p in chosen]
                for part in matched or ([] if rules.additional is None else [rules.additional]):
                    value = self.algebra.intersect(value, part)
            if not value.atoms:
                continue
            key = self.key_node(atom, chosen, others, names)
            node = None if key is None else self.emit(value)
            if node is not None and not _is_never(node):
                members.append(seq(key, self.colon, node))
        return choice(*members) if members else None

    def key_regions(self, atom: ObjectAtom, patterns: list[str]) -> list[tuple[list[str], list[str]]]:
        """(matched, unmatched) pattern lists of the non-empty regions, found by splitting on
        one pattern at a time (most of the 2^n combinations are usually empty)."""
        if len(patterns) <= 1:
            return [([], patterns)] + ([(patterns, [])] if patterns else [])
        regions: list[tuple[list[str], list[str], CharDFA]] = [([], [], CharDFA.from_node(_ANY_TEXT))]
        try:
            for p in patterns:
                dfa = self.lowering.regex_dfa("pattern", p, atom.pointer)
                split = []
                for chosen, others, region in regions:
                    split += [(chosen + [p], others, region.intersect(dfa)),
                              (chosen, others + [p], region.difference(dfa))]
                regions = [r for r in split if not r[2].is_empty()]
                if len(regions) > MAX_KEY_REGIONS:
                    raise UnsupportedSchemaError("patternProperties", atom.pointer,
                                                 f"key patterns overlap in more than {MAX_KEY_REGIONS} ways")
        except (RegularTooLarge, NotCharLevel) as exc:
            raise UnsupportedSchemaError("patternProperties", atom.pointer, str(exc)) from exc
        return [(chosen, others) for chosen, others, _ in regions]

    def key_node(self, atom: ObjectAtom, chosen: list[str], others: list[str],
                 names: list[str]) -> Node | None:
        """A quoted key matching every `chosen` pattern, no `others`, none of `names`, and
        valid under `propertyNames` (None when no such key exists)."""
        lowering = self.lowering
        without: tuple[CharDFA, list[str]] | None = None  # the language as a difference
        try:
            language: Language | None
            if not chosen and not others and not atom.property_names:
                language = not_in_node(names) if names else _ANY_TEXT
            else:
                bounded = Bounded(CharDFA.from_node(_ANY_TEXT))
                for p in chosen:
                    bounded.dfa = bounded.dfa.intersect(lowering.regex_dfa("pattern", p, atom.pointer))
                for p in others:
                    bounded.dfa = bounded.dfa.difference(lowering.regex_dfa("pattern", p, atom.pointer))
                for schema in atom.property_names:
                    bounded = bounded.intersect(self.key_language(schema))
                clashing = [n for n in names if bounded.dfa.matches(n)]  # others are no keys here
                if clashing and bounded.lo == 0 and bounded.hi is None:
                    without = (bounded.dfa, clashing)
                try:
                    if clashing:
                        bounded.dfa = bounded.dfa.difference(CharDFA.from_strings(clashing))
                except RegularTooLarge:
                    if without is None:
                        raise
                    return self.quoted(self.spell(None, "patternProperties", atom.pointer, without))
                language = bounded
                for p in chosen:  # a pattern that already says it all keeps its IR
                    if bounded.dfa.equivalent(lowering.regex_dfa("pattern", p, atom.pointer)):
                        node = lowering.regex_node("pattern", p, atom.pointer)
                        restricted = restrict_length(node, bounded.lo, bounded.hi)
                        language = bounded if restricted is None else restricted
                        break
        except (RegularTooLarge, NotCharLevel) as exc:
            raise UnsupportedSchemaError("patternProperties", atom.pointer, str(exc)) from exc
        return self.quoted(self.spell(language, "patternProperties", atom.pointer, without))

    @staticmethod
    def quoted(encoded: Node | None) -> Node | None:
        return None if encoded is None else seq(QUOTE, encoded, QUOTE)

    def key_language(self, schema: Schema) -> Bounded:
        """The strings valid under a `propertyNames` schema. Length bounds are kept aside
        when one string atom says it all (the common case), else multiplied in."""
        atoms = self.string_atoms(schema)
        if len(atoms) == 1 and isinstance(atoms[0], StringAtom):
            atom = atoms[0]
            language = self.string_language(replace(atom, min_length=0, max_length=None))
            if isinstance(language, Bounded):
                return Bounded(language.dfa, atom.min_length, atom.max_length)
            if language is None:
                return Bounded(CharDFA.from_strings([]))
            return Bounded(CharDFA.from_node(language), atom.min_length, atom.max_length)
        result = CharDFA.from_strings([])
        for atom in atoms:
            if isinstance(atom, ConstAtom):
                result = result.union(CharDFA.from_strings([atom.value]))
            elif isinstance(atom, StringAtom):
                language = self.string_language(atom)
                if isinstance(language, Node):
                    language = Bounded(CharDFA.from_node(language))
                if language is not None:
                    result = result.union(language.dfa.with_length(language.lo, language.hi))
        return Bounded(result)

    def string_atoms(self, schema: Schema) -> list[StringAtom | ConstAtom]:
        """The atoms of `schema` that strings can match (references expanded): keys are strings."""
        atoms: list[StringAtom | ConstAtom] = []
        for atom in schema.atoms:
            if isinstance(atom, RefAtom):
                atoms += self.string_atoms(self.algebra.expand_ref(atom))
            elif isinstance(atom, StringAtom) or (
                    isinstance(atom, ConstAtom) and isinstance(atom.value, str)):
                atoms.append(atom)
        return atoms

    def members(self, atom: ObjectAtom, slots: list[tuple[bool, Node]], extra: Node | None) -> Node:
        """`{...}` with the slots (schema order, or any order when small), extra members, and
        the member count within minProperties..maxProperties."""
        required = sum(r for r, _ in slots)
        lo, hi = atom.min_properties, atom.max_properties
        most = None if extra is not None else len(slots)
        counted = lo > max(required, 1) or (hi is not None and (most is None or hi < most))
        small = 2 <= len(slots) <= self.any_order_limit and self._any_order_budget >= 1 << len(slots)
        body: Node | None
        if counted and small and extra is None:
            body = self.any_order(slots, None, lo, hi)
        elif counted:
            if len(slots) > _MAX_COUNTED_SLOTS:
                raise UnsupportedSchemaError("minProperties" if lo > required else "maxProperties",
                                             atom.pointer, "too many properties to count")
            body = self.counted(slots, extra, lo, hi)
        elif small:
            body = self.any_order(slots, extra)
        else:
            items = list(slots)
            if extra is not None:
                items.append((False, seq(extra, Repeat(seq(self.sep, extra), 0, None))))
            body = self.chain(items) if items else None
        alts = []
        if required == 0 and lo == 0:
            alts.append(seq(Literal(b"{"), self.ws, Literal(b"}")))
        if body is not None and hi != 0:
            alts.append(seq(Literal(b"{"), self.ws, body, self.ws, Literal(b"}")))
        return choice(*alts) if alts else self.never()

    def counted(self, slots: list[tuple[bool, Node]], extra: Node | None, lo: int,
                hi: int | None) -> Node | None:
        """Non-empty member lists in schema order with lo..hi members: one rule per (slot,
        members so far), extras counted by repetition at the end."""
        members = [self.share(node) for _, node in slots]
        cap = lo if hi is None else hi
        made: dict[tuple[int, int], Node | None] = {}

        def state(i: int, count: int) -> Node | None:
            if i == len(slots):
                need = max(0, lo - count) if count else max(1, lo)
                room = None if hi is None else hi - count
                if room is not None and room < need:
                    return None
                if extra is None:
                    return EMPTY if need == 0 else None
                if count == 0:
                    return seq(extra, self.repeat(seq(self.sep, extra), need - 1, None if room is None else room - 1))
                return self.repeat(seq(self.sep, extra), need, room)
            key = (i, count)
            if key not in made:
                made[key] = None
                alts: list[Node] = []
                if hi is None or count < hi:
                    taken = state(i + 1, count + 1 if hi is not None else min(count + 1, cap))
                    if taken is not None:
                        alts.append(seq(self.sep if count else EMPTY, members[i], taken))
                if not slots[i][0]:
                    skipped = state(i + 1, count)
                    if skipped is not None:
                        alts.append(skipped)
                if alts:
                    name = self.new_name("c")
                    self.rules[name] = choice(*alts)
                    made[key] = Ref(name)
            return made[key]

        return state(0, 0)

    def chain(self, items: list[tuple[bool, Node]]) -> Node:
        """Non-empty comma-separated subsequences of `items` (in order) with every required
        item, by halves: linear size, logarithmic rule depth."""
        if len(items) == 1:
            return items[0][1]
        mid = len(items) // 2
        left, right = items[:mid], items[mid:]
        a, b = self.chain(left), self.chain(right)
        if any(r for r, _ in left) and any(r for r, _ in right):
            return seq(a, self.sep, b)
        if any(r for r, _ in left):
            return seq(a, optional(seq(self.sep, b)))
        if any(r for r, _ in right):
            return seq(optional(seq(a, self.sep)), b)
        b = self.share(b)
        return choice(seq(a, optional(seq(self.sep, b))), b)

    def any_order(self, slots: list[tuple[bool, Node]], extra: Node | None, lo: int = 0,
                  hi: int | None = None) -> Node:
        """Non-empty member lists with each slot at most once, in any order, extras anywhere:
        one rule per set of slots already written. `lo` / `hi` bound the member count (only
        used without extras, when the set's size is the count)."""
        self._any_order_budget -= 1 << len(slots)
        refs = [self.share(node) for _, node in slots]
        need = sum(1 << i for i, (r, _) in enumerate(slots) if r)
        extras = self.share(Repeat(seq(self.sep, extra), 0, None)) if extra is not None else EMPTY
        states: dict[int, str] = {}

        def after(done: int) -> Ref:
            if done not in states:
                states[done] = self.new_name("o")
                count = bin(done).count("1")
                alts: list[Node] = []
                if hi is None or count < hi:
                    nexts = [seq(refs[i], after(done | 1 << i))
                             for i in range(len(refs)) if not done >> i & 1]
                    if nexts:
                        alts.append(seq(self.sep, choice(*nexts)))
                if done & need == need and count >= lo:
                    alts.append(EMPTY)
                self.rules[states[done]] = seq(extras, choice(*alts)) if alts else self.never()
            return Ref(states[done])

        starts = [seq(refs[i], after(1 << i)) for i in range(len(refs))]
        if extra is not None:
            starts.append(seq(extra, after(0)))
        return choice(*starts)


def _check_alias_cycles(aliases: dict[tuple, list[tuple]]) -> None:
    """Every atom but a reference consumes input first, so a cycle of references that are
    whole alternatives of each other is the only way to left recursion: reject it."""
    state: dict[tuple, int] = {}

    def visit(key: tuple) -> None:
        state[key] = 1
        for nxt in aliases.get(key, ()):
            if state.get(nxt) == 1:
                raise SchemaError("circular $ref: a schema is one of its own alternatives",
                                  nxt[1] if nxt[0] == "ref" else "")
            if nxt not in state:
                visit(nxt)
        state[key] = 2

    for key in aliases:
        if key not in state:
            visit(key)


def _string_keyword(atom: StringAtom) -> str:
    return "pattern" if atom.patterns else "format" if atom.formats else "not"


def _is_never(node: Node) -> bool:
    return isinstance(node, Choice) and not node.alts


def _prune(root: Node, rules: dict[str, Node]) -> tuple[Node | None, dict[str, Node]]:
    """Remove what can match nothing (empty choices, references to empty rules)."""
    live: set[str] = set()
    changed = True
    while changed:
        changed = False
        for name in reversed(list(rules)):
            if name not in live and _matches_something(rules[name], live, {}):
                live.add(name)
                changed = True
    memo: dict[int, Node | None] = {}

    def rewrite(node: Node) -> Node | None:
        key = id(node)
        if key in memo:
            return memo[key]
        result: Node | None = node
        if isinstance(node, Seq):
            items = [rewrite(i) for i in node.items]
            result = None if any(i is None for i in items) else Seq(tuple(items))
        elif isinstance(node, Choice):
            alts = [a for a in (rewrite(a) for a in node.alts) if a is not None]
            result = choice(*alts) if alts else None
        elif isinstance(node, Repeat):
            item = rewrite(node.item)
            result = (EMPTY if node.min == 0 else None) if item is None else Repeat(item, node.min, node.max)
        elif isinstance(node, Ref):
            result = node if node.name in live else None
        memo[key] = result
        return result

    # In the rules' order, not the set's: the program is then the same in every process.
    new_rules = {name: body for name in rules
                 if name in live and (body := rewrite(rules[name])) is not None}
    return rewrite(root), new_rules


def _matches_something(node: Node, live: set[str], memo: dict[int, bool]) -> bool:
    key = id(node)
    if key in memo:
        return memo[key]
    if isinstance(node, Seq):
        result = all(_matches_something(i, live, memo) for i in node.items)
    elif isinstance(node, Choice):
        result = any(_matches_something(a, live, memo) for a in node.alts)
    elif isinstance(node, Repeat):
        result = node.min == 0 or _matches_something(node.item, live, memo)
    elif isinstance(node, Ref):
        result = node.name in live
    else:
        result = True
    memo[key] = result
    return result
