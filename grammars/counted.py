"""Counted repetitions in O(log n) rules: `x{n,m}` with large counts, from every front-end.

Why: the compiler unrolls a repetition (`n` copies of the item, then `m - n` optional ones),
which is what small counts want (one thread at a time, and JSON whitespace's `{0,32}` is read
as a run: `Program.runs`), but `x{1000000000}` would be a billion copies. A repetition whose
unrolled code would pass `UNROLL_INSTRUCTIONS` is rewritten before compiling into calls of
generated rules, counting in base `BASE`:

* E_k = x{B^k}: E_0 is the item (a rule of its own), E_k is B calls of E_{k-1};
* x{n} is d_k calls of E_k for each base-B digit d_k of n;
* U_k = x{0,B^k-1} = E_{k-1}{0,B-1} U_{k-1}, U_0 the empty string;
* x{0,m} = E_a{d} x{0,m-d*B^a} | E_a{0,d-1} U_a, where d*B^a is m's leading digit;
* x{n,} = x{n} x*, x{n,m} = x{n} x{0,m-n}.

So a repetition costs O(B log_B m) instructions, and its rules are shared by every repetition
of the same item. Every count has exactly one derivation (alternatives and optional copies
split the counts into disjoint ranges), larger counts first as when unrolled, so captures are
reported alike; a configuration inside holds O(log_B m) threads (one per digit still open),
and a thread's stack is O(log_B m) frames deeper. Counts saturate at `SATURATED` (16^15,
about 1.2e18 items, more than any output holds): a larger maximum bounds nothing (`x{n,}`), a
larger minimum is never met either way, and the stack stays within 16 frames of the
repetition, well inside the depth limit (`max_depth`, 256), whatever the count.

Items that may match the empty string are left unrolled: every copy of them is reachable
without input, so no form keeps their threads few; their copies count against
`GrammarLimits.max_instructions` like any others (and are refused before they are emitted).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

from pegmask.grammars.ir import (
    EMPTY,
    Capture,
    Choice,
    GrammarIR,
    Node,
    Ref,
    Repeat,
    Seq,
    Trigger,
    seq,
)
from pegmask.grammars.program import instruction_count, is_nullable, nullable_rules

BASE = 16
SATURATED = 16**15  # about 1.2e18: counts at least this are this (no output is that long)
UNROLL_INSTRUCTIONS = 512  # a repetition whose unrolled code is larger is counted in rules
_PREFIX = "count~"  # generated rule names (no front-end names a rule with "~")


def count_literal(digits: str) -> int:
    """A count written in a grammar's text: past `SATURATED` every count compiles alike, so a
    longer digit string is read as 10^19 (`int()` of a huge one is slow, and refused past 4,300
    digits)."""
    return int(digits) if len(digits) <= 19 else 10**19


def compact_repetitions(ir: GrammarIR) -> tuple[GrammarIR, list[str]]:
    """`ir` with its large counted repetitions of items that never match the empty string
    rewritten into rules (see the module docstring), and the names of the rules it made."""
    counter = _Counter(ir.rules)
    rules = {name: counter.rewrite(body) for name, body in ir.rules.items()}
    if all(rules[name] is body for name, body in ir.rules.items()):
        return ir, []
    return GrammarIR({**rules, **counter.rules}, ir.start, ir.specials), list(counter.rules)


class _Counter:
    """The rewrite of one grammar: the rules it made, per item its powers E_k and the
    repetitions below them U_k."""

    def __init__(self, grammar_rules: Mapping[str, Node]):
        self.grammar_rules = grammar_rules
        self.rules: dict[str, Node] = {}
        self._done: dict[int, tuple[Node, Node]] = {}  # by node identity: (node, rewritten)
        self._sizes: dict[int, tuple[Node, int]] = {}
        self._powers: dict[Node, list[Node]] = {}
        self._below: dict[tuple[Node, int], Node] = {}

    @functools.cached_property
    def nullable(self) -> set[str]:
        """The grammar's rules that may match the empty string (found only for a grammar with
        a large repetition: most have none)."""
        return nullable_rules(self.grammar_rules)

    def rule(self, body: Node) -> Ref:
        """A new generated rule for `body`."""
        name = f"{_PREFIX}{len(self.rules)}"
        while name in self.grammar_rules:
            name += "~"
        self.rules[name] = body
        return Ref(name)

    def rewrite(self, node: Node) -> Node:
        """`node` with its large repetitions counted in rules, inner ones first (the same
        node object where nothing changed)."""
        hit = self._done.get(id(node))
        if hit is not None and hit[0] is node:
            return hit[1]
        result = node
        if isinstance(node, (Seq, Choice)):
            parts = node.items if isinstance(node, Seq) else node.alts
            new = tuple(self.rewrite(part) for part in parts)
            if any(a is not b for a, b in zip(new, parts, strict=True)):
                result = Seq(new) if isinstance(node, Seq) else Choice(new)
        elif isinstance(node, Repeat):
            item = self.rewrite(node.item)
            if item is not node.item:
                result = Repeat(item, node.min, node.max)
            if (instruction_count([result], self._sizes) > UNROLL_INSTRUCTIONS
                    and not is_nullable(item, self.nullable)):
                result = self.counted(item, node.min, node.max)
        elif isinstance(node, Capture):
            item = self.rewrite(node.item)
            result = node if item is node.item else Capture(node.tag, item)
        elif isinstance(node, Trigger):
            item = self.rewrite(node.item)
            result = node if item is node.item else Trigger(item)
        self._done[id(node)] = (node, result)
        return result

    def counted(self, item: Node, lo: int, hi: int | None) -> Node:
        """item{lo,hi} from the item's powers (counts saturated at `SATURATED`)."""
        lo = min(lo, SATURATED)
        if hi is None or hi >= SATURATED:
            return seq(self.exactly(item, lo), Repeat(self.power(item, 0), 0, None))
        return seq(self.exactly(item, lo), self.at_most(item, hi - lo))

    def power(self, item: Node, k: int) -> Node:
        """E_k = item{BASE^k}: a call (E_0 calls the item's rule, or is the item's own call)."""
        powers = self._powers.get(item)
        if powers is None:
            powers = self._powers[item] = [item if isinstance(item, Ref) else self.rule(item)]
        while len(powers) <= k:
            powers.append(self.rule(Seq((powers[-1],) * BASE)))
        return powers[k]

    def exactly(self, item: Node, n: int) -> Node:
        """item{n}: d calls of E_k for each base-BASE digit d of n."""
        calls: list[Node] = []
        k = 0
        while n:
            n, digit = divmod(n, BASE)
            calls += [self.power(item, k)] * digit
            k += 1
        return seq(*calls) if calls else EMPTY

    def at_most(self, item: Node, m: int) -> Node:
        """item{0,m}: at least the leading digit's worth (then at most the rest), or fewer."""
        if m < BASE:
            return Repeat(self.power(item, 0), 0, m) if m else EMPTY
        a, scale = 0, 1
        while scale * BASE <= m:
            a, scale = a + 1, scale * BASE
        digit, rest = divmod(m, scale)
        block = self.power(item, a)
        more = seq(*[block] * digit, self.at_most(item, rest))
        fewer = seq(Repeat(block, 0, digit - 1) if digit > 1 else EMPTY, self.below(item, a))
        return Choice((more, fewer))

    def below(self, item: Node, k: int) -> Node:
        """U_k = item{0,BASE^k-1}, a rule: E_{k-1}{0,BASE-1} U_{k-1}."""
        if k == 0:
            return EMPTY
        key = (item, k)
        found = self._below.get(key)
        if found is None:
            body = seq(Repeat(self.power(item, k - 1), 0, BASE - 1), self.below(item, k - 1))
            found = self._below[key] = self.rule(body)
        return found
