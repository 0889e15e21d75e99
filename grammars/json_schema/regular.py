"""Regular languages over Unicode characters as DFAs, for the JSON Schema front-end.

Some schema constraints combine regular languages in ways the grammar IR has no operator for:
`pattern` plus `format` (intersection), `patternProperties` next to `additionalProperties`
(complement: keys matching *no* pattern), extra keys that must differ from the named ones
(difference with a finite set), `not: {pattern: ...}`. This module determinizes character-level
IR (Literal, CharClass, Seq, Choice, Repeat), applies those operations on DFAs, and turns the
result back into IR by state elimination, with explicit size caps so a hostile pattern cannot
blow up compile time.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from pegmask.grammars.ir import (
    EMPTY,
    MAX_UNICODE,
    ByteClass,
    CharClass,
    Choice,
    Literal,
    Node,
    Ref,
    Repeat,
    Seq,
    seq,
)
from pegmask.grammars.program import char_class_scalar_ranges

MAX_NFA_STATES = 20_000
MAX_DFA_STATES = 2_000
MAX_NODE_SIZE = 4_000
MAX_NODE_DEPTH = 120
MAX_COUNTER_STATES = 400  # a pattern times a length counter, tried as one regular expression
MAX_RULE_DEPTH = 100  # the most nested rule calls a language spelled as rules may need

Ranges = tuple[tuple[int, int], ...]
Edges = tuple[tuple[int, int, int], ...]  # sorted (lo, hi, target), covering 0..MAX_UNICODE


class RegularTooLarge(ValueError):
    """An automaton or its IR form exceeds the caps (reported as unsupported by the caller)."""


class NotCharLevel(ValueError):
    """The node uses something that is not a plain character-level regular expression."""


# ---------------------------------------------------------------------------- NFA
class _NFA:
    """Thompson NFA over scalar ranges: `eps[s]` epsilon targets, `edges[s]` (lo, hi, t)."""

    def __init__(self) -> None:
        self.eps: list[list[int]] = []
        self.edges: list[list[tuple[int, int, int]]] = []

    def new(self) -> int:
        if len(self.eps) >= MAX_NFA_STATES:
            raise RegularTooLarge("regular expression automaton too large")
        self.eps.append([])
        self.edges.append([])
        return len(self.eps) - 1

    def build(self, node: Node, start: int) -> int:
        """Add `node` starting at state `start`; return its end state."""
        if isinstance(node, Literal):
            try:
                text = node.data.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise NotCharLevel("literal is not UTF-8 text") from exc
            state = start
            for char in text:
                nxt = self.new()
                self.edges[state].append((ord(char), ord(char), nxt))
                state = nxt
            return state
        if isinstance(node, (CharClass, ByteClass)):
            end = self.new()
            for lo, hi in class_ranges(node):
                self.edges[start].append((lo, hi, end))
            return end
        if isinstance(node, Seq):
            state = start
            for item in node.items:
                state = self.build(item, state)
            return state
        if isinstance(node, Choice):
            end = self.new()
            for alt in node.alts:
                entry = self.new()
                self.eps[start].append(entry)
                self.eps[self.build(alt, entry)].append(end)
            return end
        if isinstance(node, Repeat):
            state = start
            for _ in range(node.min):
                state = self.build(node.item, state)
            if node.max is None:
                loop = self.new()
                self.eps[state].append(loop)
                self.eps[self.build(node.item, loop)].append(loop)
                return loop
            end = self.new()
            for _ in range(node.max - node.min):
                self.eps[state].append(end)
                state = self.build(node.item, state)
            self.eps[state].append(end)
            return end
        raise NotCharLevel(f"{type(node).__name__} is not a character-level regular expression")


def class_ranges(node: CharClass | ByteClass) -> list[tuple[int, int]]:
    """Scalar ranges of a character class (a ByteClass only when it is ASCII)."""
    if isinstance(node, ByteClass):
        if any(hi > 0x7F for _, hi in node.ranges):
            raise NotCharLevel("byte class beyond ASCII")
        return sorted(node.ranges)
    return char_class_scalar_ranges(node)


# ---------------------------------------------------------------------------- DFA
class CharDFA:
    """A complete DFA over scalar values (state 0 is the start state)."""

    def __init__(self, trans: list[Edges], accepting: list[bool]):
        self.trans = trans
        self.accepting = accepting

    def __len__(self) -> int:
        return len(self.trans)

    # ----------------------------------------------------------------- construction
    @staticmethod
    def from_node(node: Node) -> CharDFA:
        nfa = _NFA()
        start = nfa.new()
        final = nfa.build(node, start)
        return _determinize(nfa, start, final).minimize()

    @staticmethod
    def from_strings(words: Iterable[str]) -> CharDFA:
        """The finite language `words`."""
        return CharDFA.from_node(Choice(tuple(Literal.of(w) for w in words)) if words else NEVER)

    # ----------------------------------------------------------------- queries
    def matches(self, text: str) -> bool:
        state = 0
        for char in text:
            state = _step(self.trans[state], ord(char))
        return self.accepting[state]

    def is_empty(self) -> bool:
        return not any(self.accepting[s] for s in self._reachable())

    def equivalent(self, other: CharDFA) -> bool:
        return self.difference(other).is_empty() and other.difference(self).is_empty()

    def _reachable(self) -> set[int]:
        seen = {0}
        todo = [0]
        while todo:
            for _, _, t in self.trans[todo.pop()]:
                if t not in seen:
                    seen.add(t)
                    todo.append(t)
        return seen

    # ----------------------------------------------------------------- operations
    def intersect(self, other: CharDFA) -> CharDFA:
        return _product(self, other, lambda a, b: a and b)

    def union(self, other: CharDFA) -> CharDFA:
        return _product(self, other, lambda a, b: a or b)

    def difference(self, other: CharDFA) -> CharDFA:
        return _product(self, other, lambda a, b: a and not b)

    def minimize(self) -> CharDFA:
        """Moore partition refinement (the automata here are small)."""
        block = [int(a) for a in self.accepting]
        count = len(set(block))
        while True:
            signatures: dict[tuple, int] = {}
            new_block = []
            for s, edges in enumerate(self.trans):
                sig = (block[s], _merge_edges((lo, hi, block[t]) for lo, hi, t in edges))
                new_block.append(signatures.setdefault(sig, len(signatures)))
            if len(signatures) == count:
                break
            block, count = new_block, len(signatures)
        # Renumber so the start state's block is 0.
        order = {block[0]: 0}
        for b in block:
            order.setdefault(b, len(order))
        trans: list[Edges] = [()] * count
        accepting = [False] * count
        for s, edges in enumerate(self.trans):
            b = order[block[s]]
            trans[b] = _merge_edges((lo, hi, order[block[t]]) for lo, hi, t in edges)
            accepting[b] = self.accepting[s]
        return CharDFA(trans, accepting)

    def with_length(self, lo: int, hi: int | None) -> CharDFA:
        """The words of this language with `lo` to `hi` characters (product with a counter)."""
        cap = hi if hi is not None else lo
        if len(self.trans) * (cap + 2) > MAX_DFA_STATES:
            raise RegularTooLarge("length bound too large to combine with this pattern")
        ids: dict[tuple[int, int], int] = {(0, 0): 0}
        pairs = [(0, 0)]
        trans: list[Edges] = []
        i = 0
        while i < len(pairs):
            state, count = pairs[i]
            if state < 0:  # the dead state: the word got too long
                trans.append(((0, MAX_UNICODE, i),))
                i += 1
                continue
            nxt = min(count + 1, cap) if hi is None else count + 1
            row = []
            for a, b, t in self.trans[state]:
                key = (t, nxt) if hi is None or nxt <= hi else (-1, -1)
                if key not in ids:
                    ids[key] = len(pairs)
                    pairs.append(key)
                row.append((a, b, ids[key]))
            trans.append(_merge_edges(row))
            i += 1
        accepting = [s >= 0 and self.accepting[s] and c >= lo for s, c in pairs]
        return CharDFA(trans, accepting).minimize()

    # ----------------------------------------------------------------- back to IR
    def to_node(self, max_size: int = MAX_NODE_SIZE) -> Node | None:
        """A character-level IR node for the language (None when it is empty)."""
        live = self._live()
        if 0 not in live:
            return None
        start, final = -1, -2
        edges: dict[tuple[int, int], Node] = {(start, 0): EMPTY}
        for s in live:
            by_target: dict[int, list[tuple[int, int]]] = {}
            for lo, hi, t in self.trans[s]:
                if t in live:
                    by_target.setdefault(t, []).append((lo, hi))
            for t, ranges in by_target.items():
                edges[(s, t)] = CharClass(tuple(ranges))
            if self.accepting[s]:
                edges[(s, final)] = EMPTY
        node = _eliminate(edges, sorted(live), start, final, max_size)
        if _depth(node) > MAX_NODE_DEPTH:
            raise RegularTooLarge("regular language nests too deeply to express")
        return node

    def to_rules(self, name: Callable[[tuple], str]) -> tuple[Node, dict[str, Node]] | None:
        """The language as right-recursive rules, one per state (`name(("s", state))` names
        them): exact for any DFA; each character costs a call, but a tail call (the compiler
        makes it a jump), so words of any length stack nothing. The last resort, for
        languages whose regular expression is too large. None when the language is empty."""
        live = self._live()
        if 0 not in live:
            return None
        rules: dict[str, Node] = {}
        for s in live:
            by_target: dict[int, list[tuple[int, int]]] = {}
            for lo, hi, t in self.trans[s]:
                if t in live:
                    by_target.setdefault(t, []).append((lo, hi))
            alts: list[Node] = [seq(CharClass(tuple(r)), Ref(name(("s", t))))
                                for t, r in by_target.items()]
            if self.accepting[s]:
                alts.append(EMPTY)
            rules[name(("s", s))] = Choice(tuple(alts)) if len(alts) > 1 else alts[0]
        return Ref(name(("s", 0))), rules

    def _live(self) -> set[int]:
        """States reachable from the start that can reach an accepting state."""
        reachable = self._reachable()
        back: dict[int, list[int]] = {}
        for s in reachable:
            for _, _, t in self.trans[s]:
                back.setdefault(t, []).append(s)
        live = {s for s in reachable if self.accepting[s]}
        todo = list(live)
        while todo:
            for p in back.get(todo.pop(), ()):
                if p not in live:
                    live.add(p)
                    todo.append(p)
        return live


NEVER = Choice(())  # the empty language (only inside this module and as a marker)


def _step(edges: Edges, code: int) -> int:
    lo_i, hi_i = 0, len(edges) - 1
    while lo_i < hi_i:
        mid = (lo_i + hi_i) // 2
        if edges[mid][1] < code:
            lo_i = mid + 1
        else:
            hi_i = mid
    return edges[lo_i][2]


def _merge_edges(edges: Iterable[tuple[int, int, int]]) -> Edges:
    merged: list[tuple[int, int, int]] = []
    for lo, hi, t in edges:
        if merged and merged[-1][2] == t and merged[-1][1] + 1 == lo:
            merged[-1] = (merged[-1][0], hi, t)
        else:
            merged.append((lo, hi, t))
    return tuple(merged)


def _determinize(nfa: _NFA, start: int, final: int) -> CharDFA:
    def closure(states: Iterable[int]) -> frozenset[int]:
        seen = set(states)
        todo = list(seen)
        while todo:
            for t in nfa.eps[todo.pop()]:
                if t not in seen:
                    seen.add(t)
                    todo.append(t)
        return frozenset(seen)

    ids: dict[frozenset[int], int] = {}
    sets: list[frozenset[int]] = []

    def state_id(states: frozenset[int]) -> int:
        sid = ids.get(states)
        if sid is None:
            if len(sets) >= MAX_DFA_STATES:
                raise RegularTooLarge("regular expression automaton too large")
            sid = ids[states] = len(sets)
            sets.append(states)
        return sid

    state_id(closure([start]))
    trans: list[Edges] = []
    i = 0
    while i < len(sets):
        out = [e for s in sets[i] for e in nfa.edges[s]]
        points = sorted({0, MAX_UNICODE + 1} | {lo for lo, _, _ in out} | {hi + 1 for _, hi, _ in out})
        row = []
        for a, b in zip(points, points[1:], strict=False):
            targets = closure(t for lo, hi, t in out if lo <= a <= hi)
            row.append((a, b - 1, state_id(targets)))
        trans.append(_merge_edges(row))
        i += 1
    return CharDFA(trans, [final in s for s in sets])


def _product(a: CharDFA, b: CharDFA, accept: Callable[[bool, bool], bool]) -> CharDFA:
    ids: dict[tuple[int, int], int] = {(0, 0): 0}
    pairs = [(0, 0)]
    trans: list[Edges] = []
    i = 0
    while i < len(pairs):
        sa, sb = pairs[i]
        row = []
        for lo, hi, ta, tb in _overlay(a.trans[sa], b.trans[sb]):
            key = (ta, tb)
            if key not in ids:
                if len(pairs) >= MAX_DFA_STATES:
                    raise RegularTooLarge("regular language product too large")
                ids[key] = len(pairs)
                pairs.append(key)
            row.append((lo, hi, ids[key]))
        trans.append(_merge_edges(row))
        i += 1
    dfa = CharDFA(trans, [accept(a.accepting[x], b.accepting[y]) for x, y in pairs])
    return dfa.minimize()


def _overlay(ea: Edges, eb: Edges) -> list[tuple[int, int, int, int]]:
    """Common refinement of two complete edge lists: (lo, hi, target_a, target_b)."""
    out = []
    i = j = 0
    lo = 0
    while i < len(ea) and j < len(eb):
        hi = min(ea[i][1], eb[j][1])
        out.append((lo, hi, ea[i][2], eb[j][2]))
        lo = hi + 1
        if ea[i][1] == hi:
            i += 1
        if eb[j][1] == hi:
            j += 1
    return out


# ---------------------------------------------------------------------------- state elimination
def _eliminate(edges: dict[tuple[int, int], Node], states: list[int], start: int, final: int,
               max_size: int) -> Node:
    """Classic GNFA state elimination, cheapest state (in x out degree) first."""
    out: dict[int, set[int]] = {}
    inc: dict[int, set[int]] = {}
    for i, j in edges:
        out.setdefault(i, set()).add(j)
        inc.setdefault(j, set()).add(i)
    sizes: dict[int, tuple[Node, int]] = {}
    remaining = set(states)
    while remaining:
        k = min(remaining, key=lambda s: (len(inc.get(s, ())) * len(out.get(s, ())), s))
        remaining.remove(k)
        loop = edges.pop((k, k), None)
        star = _star(loop) if loop is not None else EMPTY
        preds = [p for p in inc.get(k, ()) if p != k]
        succs = [q for q in out.get(k, ()) if q != k]
        for p in preds:
            left = edges.pop((p, k))
            out[p].discard(k)
            for q in succs:
                path = seq(left, star, edges[(k, q)])
                old = edges.get((p, q))
                label = path if old is None else _union(old, path)
                if _size(label, sizes) > max_size:
                    raise RegularTooLarge("regular language too large to express")
                edges[(p, q)] = label
                out.setdefault(p, set()).add(q)
                inc.setdefault(q, set()).add(p)
        for q in succs:
            edges.pop((k, q), None)
            inc[q].discard(k)
        out.pop(k, None)
        inc.pop(k, None)
    return edges[(start, final)]


def _star(node: Node) -> Node:
    if isinstance(node, Repeat) and node.min <= 1 and node.max in (1, None):
        node = node.item
    return Repeat(node, 0, None)


def _union(a: Node, b: Node) -> Node:
    """Union with the simplifications that keep state elimination output small."""
    alts: list[Node] = []
    ranges: list[tuple[int, int]] = []
    nullable = False
    for node in (a, b):
        parts = node.alts if isinstance(node, Choice) else (node,)
        for part in parts:
            if part == EMPTY:
                nullable = True
            elif isinstance(part, Repeat) and part.min == 0 and part.max == 1:
                nullable = True
                alts.append(part.item)
            elif isinstance(part, CharClass) and not part.negated:
                ranges.extend(part.ranges)
            elif not any(part is x for x in alts):
                alts.append(part)
    if ranges:
        alts.insert(0, CharClass(tuple(sorted(ranges))))
    result = alts[0] if len(alts) == 1 else Choice(tuple(alts))
    return Repeat(result, 0, 1) if nullable else result


def _depth(node: Node) -> int:
    best = 0
    stack = [(node, 1)]
    while stack:
        current, depth = stack.pop()
        best = max(best, depth)
        if isinstance(current, Seq):
            stack.extend((i, depth + 1) for i in current.items)
        elif isinstance(current, Choice):
            stack.extend((a, depth + 1) for a in current.alts)
        elif isinstance(current, Repeat):
            stack.append((current.item, depth + 1))
    return best


def _size(node: Node, memo: dict[int, tuple[Node, int]]) -> int:
    """IR node count (shared subtrees counted at each use, as the compiler expands them)."""
    hit = memo.get(id(node))
    if hit is not None and hit[0] is node:
        return hit[1]
    if isinstance(node, Seq):
        size = 1 + sum(_size(i, memo) for i in node.items)
    elif isinstance(node, Choice):
        size = 1 + sum(_size(i, memo) for i in node.alts)
    elif isinstance(node, Repeat):
        size = 1 + _size(node.item, memo)
    else:
        size = 1
    memo[id(node)] = (node, size)
    return size


def restrict_length(node: Node, lo: int, hi: int | None) -> Node | Bounded | None:
    """`node`'s words of `lo`..`hi` characters, rewritten in place where the structure allows
    (a repetition of a fixed-length item, or a sequence with one variable part); otherwise
    left to `Bounded`. None when no word fits."""
    n_lo, n_hi = node_length_bounds(node)
    if n_lo >= lo and (hi is None or (n_hi is not None and n_hi <= hi)):
        return node
    if hi is not None and (n_lo > hi or lo > hi):
        return None
    if n_hi is not None and n_hi < lo:
        return None
    if isinstance(node, Repeat):
        a, b = node_length_bounds(node.item)
        if a == b and a > 0:
            low = max(node.min, -(-lo // a))
            highs = [h for h in (node.max, None if hi is None else hi // a) if h is not None]
            high = min(highs) if highs else None
            return None if high is not None and high < low else Repeat(node.item, low, high)
    if isinstance(node, Seq):
        bounds = [node_length_bounds(i) for i in node.items]
        variable = [i for i, (a, b) in enumerate(bounds) if a != b]
        if len(variable) == 1:
            v = variable[0]
            fixed = sum(a for i, (a, _) in enumerate(bounds) if i != v)
            inner = restrict_length(node.items[v], max(0, lo - fixed),
                                    None if hi is None else hi - fixed)
            if inner is None or isinstance(inner, Node):
                return None if inner is None else Seq(node.items[:v] + (inner,) + node.items[v + 1:])
        spread = _spread_choices(node, variable)
        if spread is not None:
            return restrict_length(spread, lo, hi)
    if isinstance(node, Choice):
        alts = [restrict_length(alt, lo, hi) for alt in node.alts]
        if all(isinstance(a, Node) or a is None for a in alts):
            kept = [a for a in alts if a is not None]
            return Choice(tuple(kept)) if len(kept) > 1 else kept[0] if kept else None
    return Bounded(CharDFA.from_node(node), lo, hi)


MAX_SPREAD = 64  # the most sequences a length bound may split one sequence into


def _spread_choices(node: Seq, variable: list[int]) -> Choice | None:
    """`node` as a choice of sequences, one per pick of its choices between words of fixed
    lengths (`(jpg|jpeg)[a-z]*`: `jpg[a-z]*|jpeg[a-z]*`), when that leaves each sequence one
    variable part; None otherwise."""
    choices = {i: item for i in variable if isinstance(item := node.items[i], Choice)
               and all(a == b for a, b in map(node_length_bounds, item.alts))}
    if len(variable) - len(choices) > 1 or not choices \
            or math.prod(len(c.alts) for c in choices.values()) > MAX_SPREAD:
        return None
    seqs: list[tuple[Node, ...]] = [()]
    for index, item in enumerate(node.items):
        picks = choices[index].alts if index in choices else (item,)
        seqs = [done + (pick,) for done in seqs for pick in picks]
    return Choice(tuple(seq(*items) for items in seqs))


@dataclass(eq=False)
class Bounded:
    """The words of `dfa` with `lo` to `hi` characters (`hi` None: no upper bound)."""

    dfa: CharDFA
    lo: int = 0
    hi: int | None = None

    def intersect(self, other: Bounded) -> Bounded:
        his = [h for h in (self.hi, other.hi) if h is not None]
        return Bounded(self.dfa.intersect(other.dfa), max(self.lo, other.lo), min(his) if his else None)


Language = Node | Bounded  # a character-level regular language


def language_ir(language: Language, name: Callable[[tuple], str]) -> tuple[Node, dict[str, Node]] | None:
    """Character-level IR for a language: a node, plus rules (named by `name(key)`) when a DFA
    has no compact regular expression. Tried in order: the node itself; state elimination,
    then the length bounds applied to the result's structure; a counter product; rules.
    Raises `RegularTooLarge` when nothing fits the caps; None when the language is empty."""
    if isinstance(language, Node):
        return language, {}
    dfa, lo, hi = language.dfa, language.lo, language.hi
    if hi is not None and lo > hi:
        return None
    try:
        node = dfa.to_node()
    except RegularTooLarge:
        pass
    else:
        if node is None:
            return None
        restricted = restrict_length(node, lo, hi) if lo or hi is not None else node
        if not isinstance(restricted, Bounded):
            return None if restricted is None else (restricted, {})
    if lo or hi is not None:
        if len(dfa) * ((hi if hi is not None else lo) + 2) <= MAX_COUNTER_STATES or hi is None:
            try:
                return dfa.with_length(lo, hi).to_node(), {}
            except RegularTooLarge:
                if hi is None:
                    raise
        if 2 * math.isqrt(hi) + 2 > MAX_RULE_DEPTH:
            raise RegularTooLarge("length bound too large to combine with this pattern")
        return _bounded_rules(dfa, lo, hi, name)
    return dfa.to_rules(name)  # each state's call is a tail call: no stack, whatever the length


def _bounded_rules(dfa: CharDFA, lo: int, hi: int, name: Callable[[tuple], str],
                   ) -> tuple[Node, dict[str, Node]] | None:
    """Words of lo..hi characters as rules with about 2*sqrt(hi) nested calls: blocks of B
    characters (each a rule chain from a state to a guessed end state, checked at the block's
    end), a chain of blocks, and a shorter tail."""
    block = max(1, math.isqrt(hi))
    live = dfa._live()
    rules: dict[str, Node] = {}
    made: dict[tuple, Node | None] = {}

    def targets(state: int) -> list[tuple[Node, int]]:
        by_target: dict[int, list[tuple[int, int]]] = {}
        for a, b, t in dfa.trans[state]:
            if t in live:
                by_target.setdefault(t, []).append((a, b))
        return [(CharClass(tuple(r)), t) for t, r in by_target.items()]

    def rule(key: tuple, build: Callable[[], list[Node]]) -> Node | None:
        if key not in made:
            made[key] = None  # rules here are never re-entered before they are built
            alts = build()
            if alts:
                rules[name(key)] = Choice(tuple(alts)) if len(alts) > 1 else alts[0]
                made[key] = Ref(name(key))
        return made[key]

    def exact(n: int, state: int, end: int) -> Node | None:
        def build() -> list[Node]:
            if n == 0:
                return [EMPTY] if state == end else []
            return [seq(cls, sub) for cls, t in targets(state)
                    if (sub := exact(n - 1, t, end)) is not None]
        return rule(("x", n, state, end), build)

    def tail(state: int, low: int, high: int) -> Node | None:
        def build() -> list[Node]:
            alts: list[Node] = [EMPTY] if low == 0 and dfa.accepting[state] else []
            if high > 0:
                alts += [seq(cls, sub) for cls, t in targets(state)
                         if (sub := tail(t, max(low - 1, 0), high - 1)) is not None]
            return alts
        return rule(("t", state, low, high), build)

    def chain(state: int, done: int) -> Node | None:
        def build() -> list[Node]:
            alts: list[Node] = []
            if hi - done >= 0:
                end_tail = tail(state, max(0, lo - done), min(block - 1, hi - done))
                if end_tail is not None:
                    alts.append(end_tail)
            if done + block <= hi:
                for end in live:
                    first = exact(block, state, end)
                    rest = chain(end, done + block) if first is not None else None
                    if rest is not None:
                        alts.append(seq(first, rest))
            return alts
        return rule(("c", state, done), build)

    start = chain(0, 0) if 0 in live else None
    return None if start is None else (start, rules)


def without_words(dfa: CharDFA, words: Iterable[str], name: Callable[[tuple], str],
                  ) -> tuple[Node, dict[str, Node]] | None:
    """The language of `dfa` minus the finite set `words`, with no product automaton (whose
    regular expression can be far too large: a key pattern beside a hundred names). The
    words' trie is walked along `dfa`: a text either stops at a trie node that ends no word,
    or leaves the trie with a character no word continues with and goes on as the rest of the
    language from the state it reached (a rule per state, `name(("r", state))`, by state
    elimination from that state). None when the language is empty."""
    trie = _word_trie(words)
    live = dfa._live()
    rules: dict[str, Node] = {}

    def rest(state: int) -> Ref:
        ref = Ref(name(("r", state)))
        if ref.name not in rules:
            order = [state] + [s for s in range(len(dfa)) if s != state]
            index = {s: i for i, s in enumerate(order)}
            rebased = CharDFA([tuple((lo, hi, index[t]) for lo, hi, t in dfa.trans[s]) for s in order],
                              [dfa.accepting[s] for s in order])
            rules[ref.name] = rebased.to_node()  # not None: `state` is live
        return ref

    def walk(level: dict, state: int, depth: int) -> Node | None:
        if depth > MAX_RULE_DEPTH:
            raise RegularTooLarge("excluded names too long")
        alts: list[Node] = [EMPTY] if dfa.accepting[state] and "" not in level else []
        taken = sorted(ord(c) for c in level if c)
        leaving: dict[int, list[tuple[int, int]]] = {}
        for lo, hi, t in dfa.trans[state]:
            if t in live:
                for a, b in _without(lo, hi, taken):
                    leaving.setdefault(t, []).append((a, b))
        alts += [seq(CharClass(tuple(r)), rest(t)) for t, r in leaving.items()]
        for code in taken:
            t = _step(dfa.trans[state], code)
            sub = walk(level[chr(code)], t, depth + 1) if t in live else None
            if sub is not None:
                alts.append(seq(Literal.of(chr(code)), sub))
        return None if not alts else Choice(tuple(alts)) if len(alts) > 1 else alts[0]

    node = walk(trie, 0, 0) if 0 in live else None
    return None if node is None else (node, rules)


def _without(lo: int, hi: int, taken: list[int]) -> list[tuple[int, int]]:
    """The range lo..hi less the sorted code points `taken`."""
    out = []
    for code in taken:
        if lo <= code <= hi:
            if lo < code:
                out.append((lo, code - 1))
            lo = code + 1
    return out + ([(lo, hi)] if lo <= hi else [])


def _word_trie(words: Iterable[str]) -> dict:
    """The words as a trie of dicts by character; "" marks a word's end."""
    trie: dict = {}
    for word in words:
        level = trie
        for char in word:
            level = level.setdefault(char, {})
        level[""] = {}
    return trie


def not_in_node(words: Iterable[str]) -> Node:
    """All strings except `words`, from their trie: a string either leaves the trie (a trie
    path, one character no word continues with, then anything) or stops at a trie node that
    ends no word. Linear in the words' size, with one shared "anything" tail."""
    trie = _word_trie(words)

    def leave(level: dict) -> Node:
        chars = sorted(ord(c) for c in level if c)
        alts: list[Node] = [CharClass(tuple((c, c) for c in chars), negated=True)]
        alts += [seq(Literal.of(chr(c)), leave(level[chr(c)])) for c in chars]
        return Choice(tuple(alts)) if len(alts) > 1 else alts[0]

    def stop(level: dict) -> Node | None:
        alts: list[Node] = [] if "" in level else [EMPTY]
        for char in sorted(c for c in level if c):
            sub = stop(level[char])
            if sub is not None:
                alts.append(seq(Literal.of(char), sub))
        return None if not alts else Choice(tuple(alts)) if len(alts) > 1 else alts[0]

    anything = Repeat(CharClass(((0, MAX_UNICODE),)), 0, None)
    stops = stop(trie)
    leaving = seq(leave(trie), anything)
    return leaving if stops is None else Choice((leaving, stops))


def node_length_bounds(node: Node) -> tuple[int, int | None]:
    """(min, max) number of characters a character-level node matches (max None: unbounded)."""
    if isinstance(node, Literal):
        n = len(node.data.decode("utf-8", "replace"))
        return n, n
    if isinstance(node, (CharClass, ByteClass)):
        return 1, 1
    if isinstance(node, Seq):
        lo, hi = 0, 0
        for item in node.items:
            a, b = node_length_bounds(item)
            lo += a
            hi = None if hi is None or b is None else hi + b
        return lo, hi
    if isinstance(node, Choice):
        if not node.alts:
            return 0, 0
        bounds = [node_length_bounds(a) for a in node.alts]
        his = [b for _, b in bounds]
        return min(a for a, _ in bounds), None if None in his else max(his)
    if isinstance(node, Repeat):
        a, b = node_length_bounds(node.item)
        if node.max is None:
            return a * node.min, None if b != 0 else 0
        return a * node.min, None if b is None else b * node.max
    raise NotCharLevel(f"{type(node).__name__} is not a character-level regular expression")
