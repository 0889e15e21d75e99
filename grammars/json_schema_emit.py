"""Normal-form schemas (`json_schema_normal`) to grammar IR rules.

Shared pieces (whitespace, any value, any string, one string character, repeated blocks, big
subtrees that would otherwise be copied) become named rules, so the compiled program stays
linear in the schema: the compiler expands every occurrence of a node, but a rule only once.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from decimal import Decimal

from pegmask.grammars.errors import SchemaError, UnsupportedSchemaError
from pegmask.grammars.ir import (
    EMPTY,
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
from pegmask.grammars.json_schema_lexical import (
    ANY_CHAR,
    INTEGER,
    NUMBER,
    QUOTE,
    encode_node,
    integer_range,
    multiple_of_dfa,
    number_range,
    string_literal,
    value_literal,
)
from pegmask.grammars.json_schema_normal import (
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
from pegmask.grammars.json_schema_regular import (
    CharDFA,
    NotCharLevel,
    RegularTooLarge,
    not_in_node,
    restrict_length,
)

NEVER_NODE = Choice(())
MAX_KEY_PATTERNS = 4
MAX_RULES = 50_000
_INLINE_REPEAT = 64  # repetition counts above this are built from shared blocks
_SMALL = 24  # nodes up to this size are copied instead of shared
_WS = CharClass(((0x09, 0x0A), (0x0D, 0x0D), (0x20, 0x20)))
_ANY_TEXT = Repeat(CharClass(((0, MAX_UNICODE),)), 0, None)


class Emitter:
    """Emits the rules for one schema; every rule name starts with `prefix`."""

    def __init__(self, lowering, *, prefix: str, max_whitespace: int, any_order: bool):
        from pegmask.grammars.json_schema import ANY_ORDER_MAX_PROPERTIES

        self.lowering = lowering
        self.algebra = lowering.algebra
        self.prefix = prefix
        self.any_order_limit = ANY_ORDER_MAX_PROPERTIES if any_order else 1
        self.rules: dict[str, Node] = {}
        self._ref_names: dict[tuple, str] = {}
        self._pending: list[tuple[tuple, str]] = []
        self._saw_never = False
        self.ws = self.shared("ws", lambda: Repeat(_WS, 0, max_whitespace)) if max_whitespace else EMPTY
        self.sep = seq(self.ws, Literal(b","), self.ws)
        self.colon = seq(self.ws, Literal(b":"), self.ws)

    # ----------------------------------------------------------------- rules
    def new_name(self, tag: str) -> str:
        if len(self.rules) >= MAX_RULES:
            raise SchemaError(f"schema needs more than {MAX_RULES} grammar rules")
        name = f"{self.prefix}_{tag}{len(self.rules)}"
        self.rules[name] = EMPTY  # reserved; the body is set by the caller
        return name

    def shared(self, tag: str, build: Callable[[], Node]) -> Ref:
        """The rule `prefix_tag`, built once (the builder may refer to the rule itself)."""
        name = f"{self.prefix}_{tag}"
        if name not in self.rules:
            self.rules[name] = EMPTY
            self.rules[name] = build()
        return Ref(name)

    def share(self, node: Node) -> Node:
        """`node` itself when small, else a rule for it (so copies cost one call each)."""
        if _small(node, _SMALL):
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
        while self._pending:
            key, name = self._pending.pop()
            self.rules[name] = self.emit(self.algebra.expand_ref(RefAtom(key)))
        if self._saw_never:
            root, self.rules = _prune(root, self.rules)
        if root is None or _is_never(root):
            raise SchemaError("the schema accepts no value")
        return root, self.rules

    def emit(self, schema: Schema) -> Node:
        if schema is ANY:
            return self.any_value()
        consts = [a for a in schema.atoms if isinstance(a, ConstAtom)]
        alts = [value_literal(a.value, self.ws) for a in consts]
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
            value = Ref(f"{self.prefix}_any")
            member = seq(self.any_string(), self.colon, value)
            return choice(
                seq(Literal(b"{"), self.ws, optional(seq(member, Repeat(seq(self.sep, member), 0, None), self.ws)), Literal(b"}")),
                seq(Literal(b"["), self.ws, optional(seq(value, Repeat(seq(self.sep, value), 0, None), self.ws)), Literal(b"]")),
                self.any_string(), self.shared("num", lambda: NUMBER),
                Literal(b"true"), Literal(b"false"), Literal(b"null"))

        return self.shared("any", build)

    def any_string(self) -> Ref:
        return self.shared("str", lambda: seq(QUOTE, Repeat(ANY_CHAR, 0, None), QUOTE))

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
            node = NUMBER if atom.multiple_of else self.shared("num", lambda: NUMBER)
        else:
            node = number_range(atom.minimum, atom.exclusive_minimum,
                                atom.maximum, atom.exclusive_maximum)
        if node is None:
            return self.never()
        if atom.multiple_of:
            node = self.multiple_of(node, atom)
        return node

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
            magnitudes = dfa.to_node()
            if magnitudes is None:
                return self.never()
            signed = CharDFA.from_node(seq(optional(Literal(b"-")), magnitudes))
            result = CharDFA.from_node(node).intersect(signed).to_node()
        except RegularTooLarge as exc:
            raise UnsupportedSchemaError("multipleOf", atom.pointer, str(exc)) from exc
        return self.never() if result is None else result

    # ----------------------------------------------------------------- strings
    def string(self, atom: StringAtom) -> Node:
        if not (atom.patterns or atom.formats or atom.not_patterns or atom.excluded):
            if atom.min_length == 0 and atom.max_length is None:
                return self.any_string()
            char = self.shared("char", lambda: ANY_CHAR)
            return seq(QUOTE, self.repeat(char, atom.min_length, atom.max_length), QUOTE)
        chars = self.string_chars(atom)
        encoded = None if chars is None else encode_node(chars)
        return self.never() if encoded is None else seq(QUOTE, encoded, QUOTE)

    def string_chars(self, atom: StringAtom) -> Node | None:
        """Character-level IR for the decoded content of the strings `atom` accepts."""
        lowering = self.lowering
        sources = [("pattern", p) for p in atom.patterns] + [("format", f) for f in atom.formats]
        try:
            if len(sources) == 1 and not atom.not_patterns and not atom.excluded:
                node: Node | None = lowering.regex_node(*sources[0], atom.pointer)
            else:
                dfa = CharDFA.from_node(_ANY_TEXT)
                for kind, source in sources:
                    dfa = dfa.intersect(lowering.regex_dfa(kind, source, atom.pointer))
                for pattern in atom.not_patterns:
                    dfa = dfa.difference(lowering.regex_dfa("pattern", pattern, atom.pointer))
                if atom.excluded:
                    dfa = dfa.difference(CharDFA.from_strings(atom.excluded))
                node = dfa.to_node()
            if node is not None and (atom.min_length or atom.max_length is not None):
                node = restrict_length(node, atom.min_length, atom.max_length)
        except (RegularTooLarge, NotCharLevel) as exc:
            keyword = "pattern" if atom.patterns else "format" if atom.formats else "not"
            raise UnsupportedSchemaError(keyword, atom.pointer, str(exc)) from exc
        return node

    # ----------------------------------------------------------------- arrays
    def array(self, atom: ArrayAtom) -> Node:
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
        """item{lo,hi}; large counts are composed from shared blocks of about sqrt(count)."""
        span = 0 if hi is None else hi - lo
        if lo <= _INLINE_REPEAT and span <= _INLINE_REPEAT:
            return Repeat(item, lo, hi)
        item = self.share(item)
        parts: list[Node] = []
        if lo > _INLINE_REPEAT:
            b = math.isqrt(lo)
            block = self.share(Repeat(item, b, b))
            parts += [Repeat(block, lo // b, lo // b), Repeat(item, lo % b, lo % b)]
        else:
            parts.append(Repeat(item, lo, lo))
        if hi is None:
            parts.append(Repeat(item, 0, None))
        elif span > _INLINE_REPEAT:
            b = math.isqrt(span)
            q, r = divmod(span, b)
            block = self.share(Repeat(item, b, b))
            small = self.share(Repeat(item, 0, b - 1))
            parts.append(choice(seq(Repeat(block, 0, q - 1), small),
                                seq(Repeat(block, q, q), Repeat(item, 0, r))))
        else:
            parts.append(Repeat(item, 0, span))
        return seq(*parts)

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
        """One member whose key is none of `names`, by the regions the key patterns cut."""
        patterns: list[str] = []
        for rules in atom.rules:
            patterns += [p for p, _ in rules.patterns if p not in patterns]
        if len(patterns) > MAX_KEY_PATTERNS:
            raise UnsupportedSchemaError("patternProperties", atom.pointer,
                                         f"more than {MAX_KEY_PATTERNS} key patterns on one object")
        members: list[Node] = []
        for mask in range(1 << len(patterns)):
            chosen = [p for i, p in enumerate(patterns) if mask >> i & 1]
            value = ANY
            for rules in atom.rules:
                matched = [s for p, s in rules.patterns if p in chosen]
                for part in matched or ([] if rules.additional is None else [rules.additional]):
                    value = self.algebra.intersect(value, part)
            if not value.atoms:
                continue
            others = [p for p in patterns if p not in chosen]
            key = self.key_node(atom, chosen, others, names)
            node = None if key is None else self.emit(value)
            if node is not None and not _is_never(node):
                members.append(seq(key, self.colon, node))
        return choice(*members) if members else None

    def key_node(self, atom: ObjectAtom, chosen: list[str], others: list[str],
                 names: list[str]) -> Node | None:
        """A quoted key matching every `chosen` pattern, no `others`, none of `names`, and
        valid under `propertyNames` (None when no such key exists)."""
        lowering = self.lowering
        try:
            if not chosen and not others and not atom.property_names:
                chars: Node | None = not_in_node(names) if names else _ANY_TEXT
            else:
                dfa = CharDFA.from_node(_ANY_TEXT)
                for p in chosen:
                    dfa = dfa.intersect(lowering.regex_dfa("pattern", p, atom.pointer))
                for p in others:
                    dfa = dfa.difference(lowering.regex_dfa("pattern", p, atom.pointer))
                if names:
                    dfa = dfa.difference(CharDFA.from_strings(names))
                for schema in atom.property_names:
                    dfa = dfa.intersect(self.key_language(schema, atom.pointer))
                chars = dfa.to_node()
        except (RegularTooLarge, NotCharLevel) as exc:
            raise UnsupportedSchemaError("patternProperties", atom.pointer, str(exc)) from exc
        encoded = None if chars is None else encode_node(chars)
        return None if encoded is None else seq(QUOTE, encoded, QUOTE)

    def key_language(self, schema: Schema, pointer: str) -> CharDFA:
        """The strings valid under a `propertyNames` schema, as a DFA."""
        result = CharDFA.from_strings([])
        for atom in schema.atoms:
            if isinstance(atom, RefAtom):
                result = result.union(self.key_language(self.algebra.expand_ref(atom), pointer))
            elif isinstance(atom, ConstAtom) and isinstance(atom.value, str):
                result = result.union(CharDFA.from_strings([atom.value]))
            elif isinstance(atom, StringAtom):
                chars = self.string_chars(atom)
                if chars is not None:
                    result = result.union(CharDFA.from_node(chars))
        return result

    def members(self, atom: ObjectAtom, slots: list[tuple[bool, Node]], extra: Node | None) -> Node:
        """`{...}` with the slots (schema order, or any order when small) and extra members."""
        required = sum(r for r, _ in slots)
        lo, hi = atom.min_properties, atom.max_properties
        empty_ok = required == 0
        body: Node | None
        if not slots and extra is not None and (lo > 1 or hi is not None):
            body = seq(extra, self.repeat(seq(self.sep, extra), max(lo, 1) - 1, None if hi is None else hi - 1))
            empty_ok = lo == 0
            lo, hi = 0, None
        elif 2 <= len(slots) <= self.any_order_limit:
            body = self.any_order(slots, extra)
        else:
            items = list(slots)
            if extra is not None:
                items.append((False, seq(extra, Repeat(seq(self.sep, extra), 0, None))))
            body = self.chain(items) if items else None
        if lo > required:
            if lo > 1:
                raise UnsupportedSchemaError("minProperties", atom.pointer,
                                             "only 1, or any value for objects without named properties")
            empty_ok = False
        if hi is not None and (extra is not None or hi < len(slots)):
            if hi > 0:
                raise UnsupportedSchemaError("maxProperties", atom.pointer,
                                             "only 0, or any value for objects without named properties")
            body = None
        alts = []
        if empty_ok:
            alts.append(seq(Literal(b"{"), self.ws, Literal(b"}")))
        if body is not None:
            alts.append(seq(Literal(b"{"), self.ws, body, self.ws, Literal(b"}")))
        return choice(*alts) if alts else self.never()

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

    def any_order(self, slots: list[tuple[bool, Node]], extra: Node | None) -> Node:
        """Non-empty member lists with each slot at most once, in any order, extras anywhere:
        one rule per set of slots already written."""
        refs = [self.share(node) for _, node in slots]
        need = sum(1 << i for i, (r, _) in enumerate(slots) if r)
        extras = self.share(Repeat(seq(self.sep, extra), 0, None)) if extra is not None else EMPTY
        states: dict[int, str] = {}

        def after(done: int) -> Ref:
            if done not in states:
                states[done] = self.new_name("o")
                alts = [seq(self.sep, refs[i], after(done | 1 << i))
                        for i in range(len(refs)) if not done >> i & 1]
                if done & need == need:
                    alts.append(EMPTY)
                self.rules[states[done]] = seq(extras, choice(*alts))
            return Ref(states[done])

        starts = [seq(refs[i], after(1 << i)) for i in range(len(refs))]
        if extra is not None:
            starts.append(seq(extra, after(0)))
        return choice(*starts)


def _is_never(node: Node) -> bool:
    return isinstance(node, Choice) and not node.alts


def _small(node: Node, budget: int) -> bool:
    """Whether `node` has at most `budget` IR nodes (stops counting early)."""
    stack = [node]
    count = 0
    while stack:
        current = stack.pop()
        count += 1
        if count > budget:
            return False
        if isinstance(current, Seq):
            stack.extend(current.items)
        elif isinstance(current, Choice):
            stack.extend(current.alts)
        elif isinstance(current, Repeat):
            stack.append(current.item)
    return True


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

    new_rules = {name: body for name in live if (body := rewrite(rules[name])) is not None}
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
