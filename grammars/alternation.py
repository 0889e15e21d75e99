"""A choice of many alternatives as a trie (prefix tree) of their symbols.

An enum of thousands of strings, or a dialect's choice of tools, is a choice whose alternatives
mostly start alike. Compiled one branch per alternative, a configuration inside the choice
holds one thread per alternative still alive, and every step and mask there pays for all of
them. Here alternatives are read as sequences of *symbols*: the bytes of their literals,
capture marks, and any other node whole (`symbols`). Alternatives that begin with the same
symbol share one branch, so a configuration holds one thread per distinct next symbol, and the
program grows with the trie, not with the alternatives times their shared prefixes.

Sharing keeps the language (a union is a union) and the captures exactly. The order of
alternatives ranks derivations, and a shared branch ranks its alternatives ahead of any
branch made between its first alternative and a later one. That is harmless where those
alternatives can never both match the same input, and a branch is only shared then:

* two different bytes never match the same input, so byte branches share freely, unless a
  branch in between could start with that byte (an alternative that ended, a capture mark,
  an opaque node whose first bytes include it);
* a capture mark or the end of an alternative competes with anything: shared only when its
  branch is the last one made;
* an opaque node (a class, a choice of escapes) is shared only where it is the same object,
  matches at most one prefix of any input in at most one way (`_prefix_unique`), and no branch
  made after its own can start with one of its first bytes.

A symbol that ends a derivation in exactly one way at a fixed length ranks the same before
and after its branch is shared (Pike priority is lexicographic over the choices made), so the
ranking of every two derivations that can meet is unchanged. Repeated alternatives are kept
once (the first: a later copy never ranks first).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from pegmask.grammars.ir import (
    ByteClass,
    Capture,
    CharClass,
    Choice,
    Literal,
    Node,
    Seq,
    Trigger,
    choice,
    list_separator,
    seq,
)

ALL_BYTES = (1 << 256) - 1
_MAX_PATHS = 32  # an opaque node with more spellings than this is never shared
_MAX_PATH_LENGTH = 64  # nor one with longer spellings


@dataclass(frozen=True)
class Mark:
    """A capture's start (`close` False) or end, as a symbol."""

    tag: str
    close: bool


Symbol = int | Mark | Node  # a byte, a capture mark, or a node taken whole


def symbols(node: Node) -> Iterator[Symbol]:
    """`node` as a sequence of symbols: literals as bytes, captures as their marks around
    their item's symbols, and every other node whole. An item followed by `(sep item)*`
    stays one node with it, so the compiler still makes the list one loop."""
    if isinstance(node, Literal):
        yield from node.data
    elif isinstance(node, Seq):
        items, i = node.items, 0
        while i < len(items):
            if i + 1 < len(items) and list_separator(items[i], items[i + 1]) is not None:
                yield Seq(items[i : i + 2])
                i += 2
            else:
                yield from symbols(items[i])
                i += 1
    elif isinstance(node, Capture):
        yield Mark(node.tag, False)
        yield from symbols(node.item)
        yield Mark(node.tag, True)
    elif isinstance(node, Trigger):
        yield from symbols(node.item)
    else:
        yield node


def alternation_trie(alts: Sequence[Node]) -> Alternation | None:
    """The trie of `alts`, or None where no two of them start with the same symbol (a plain
    choice is then just as good)."""
    sequences = [_sequence(alt) for alt in alts]
    heads = {_key(sequence[0]) if sequence else None for sequence in sequences}
    return None if len(heads) == len(alts) else Alternation(sequences)


def left_factored(alts: Sequence[Node]) -> Node:
    """The choice of `alts` with the items they all begin with taken out of it: `a b | a c`
    as `a (b | c)`. Only for alternatives no two of which match the same text (the tools of a
    call, each named at the same place), whose order then ranks nothing: items that are not
    symbols the trie can share (a rule for whitespace) are shared all the same."""
    items = [alt.items if isinstance(alt, Seq) else (alt,) for alt in alts]
    shortest, common = min(map(len, items)), 0
    while common < shortest and all(parts[common] == items[0][common] for parts in items[1:]):
        common += 1
    return seq(*items[0][:common], choice(*(seq(*parts[common:]) for parts in items)))


def _sequence(node: Node) -> bytes | tuple[Symbol, ...]:
    """`symbols(node)`, as bytes where all of them are (made fast for a sequence of literals:
    an enum's strings)."""
    if isinstance(node, Literal):
        return node.data
    if isinstance(node, Seq) and all(isinstance(item, Literal) for item in node.items):
        return b"".join(item.data for item in node.items)
    found = tuple(symbols(node))
    return bytes(found) if all(isinstance(symbol, int) for symbol in found) else found


def _key(symbol: Symbol | None) -> object:
    """What makes two symbols the same: a byte or mark by value, a node by identity."""
    return symbol if symbol is None or isinstance(symbol, (int, Mark)) else id(symbol)


class Alternation:
    """The trie of a choice's alternatives (their symbol sequences), read one node at a time:
    a node is the alternatives that share a path (`members`, in rank order) and its length
    (`depth`). The compiler walks it depth first (`program._Compiler.alternation`), so a node
    lives only until its code is emitted: a large enum's trie never exists whole (its nodes
    outlived the collector's young generations, and made it scan everything twice)."""

    def __init__(self, sequences: list[bytes | tuple[Symbol, ...]]):
        self.sequences = sequences
        self._opaque: dict[int, tuple[int, bool]] = {}  # id -> (first bytes, shareable)

    def __len__(self) -> int:
        return len(self.sequences)

    def rest(self, alt: int, depth: int) -> bytes | tuple[Symbol, ...]:
        """The symbols of alternative `alt` after the first `depth`."""
        return self.sequences[alt][depth:]

    def branches(self, members: list[int], depth: int) -> list[tuple[Symbol, list[int] | None]]:
        """The branches after `depth` symbols of `members`, in rank order: each next symbol
        with the alternatives that take it ((None, None): those that end here)."""
        branches: list[tuple[Symbol, list[int] | None]] = []
        first: list[int] = []  # per branch, the bytes it may start with
        last: dict[object, int] = {}  # symbol key -> its latest branch
        wide: list[int] = []  # branches that are not a byte
        ended = False
        for alt in members:
            sequence = self.sequences[alt]
            if len(sequence) == depth:
                if not ended:  # a repeated alternative is kept once
                    ended = True
                    wide.append(len(branches))
                    first.append(ALL_BYTES)
                    branches.append((None, None))
                continue
            symbol = sequence[depth]
            if not wide and isinstance(symbol, int):  # bytes only so far: always shared
                at = last.get(symbol)
                if at is None:
                    last[symbol] = len(branches)
                    first.append(1 << symbol)
                    branches.append((symbol, [alt]))
                else:
                    self._join(branches, at, alt)
                continue
            key, bits = _key(symbol), self._first(symbol)
            at = last.get(key)
            if at is not None and self._shares(symbol, bits, at, first, wide):
                self._join(branches, at, alt)
                continue
            last[key] = len(branches)
            if not isinstance(symbol, int):
                wide.append(len(branches))
            first.append(bits)
            branches.append((symbol, [alt]))
        return branches

    @staticmethod
    def _join(branches: list[tuple[Symbol, list[int] | None]], at: int, alt: int) -> None:
        group = branches[at][1]
        assert group is not None  # an ended branch is never joined: it has no symbol
        group.append(alt)

    def _shares(self, symbol: Symbol, bits: int, at: int, first: list[int],
                wide: list[int]) -> bool:
        """Whether an alternative going on with `symbol` may join branch `at` (see the module
        docstring): no branch made after it may start like it."""
        if isinstance(symbol, int):  # later byte branches read other bytes
            for index in reversed(wide):
                if index <= at:
                    return True
                if first[index] & bits:
                    return False
            return True
        if isinstance(symbol, Mark):
            return at == len(first) - 1
        if not self._opaque[id(symbol)][1]:
            return False
        return not any(later & bits for later in first[at + 1 :])

    def _first(self, symbol: Symbol) -> int:
        """The bytes `symbol` may start with (all of them for a mark: it reads nothing)."""
        if isinstance(symbol, int):
            return 1 << symbol
        if isinstance(symbol, Mark):
            return ALL_BYTES
        known = self._opaque.get(id(symbol))
        if known is None:
            paths = _paths(symbol)
            if paths is None or not all(paths):
                known = (ALL_BYTES, False)
            else:
                bits = 0
                for path in paths:
                    bits |= _lead_bits(path[0])
                known = (bits, _prefix_unique(paths))
            self._opaque[id(symbol)] = known
        return known[0]


# An opaque node's spellings as paths of elements: a set of bytes (an int of bits) or one
# character of a class (its scalar ranges, however many bytes its UTF-8 form takes).
Element = int | tuple[tuple[int, int], ...]


def _paths(node: Node) -> list[tuple[Element, ...]] | None:
    """The derivations of a finite node (literals, classes, sequences, choices), one path
    each; None for any other node or past `_MAX_PATHS` or `_MAX_PATH_LENGTH`."""
    if isinstance(node, Literal):
        if len(node.data) > _MAX_PATH_LENGTH:
            return None
        return [tuple(1 << byte for byte in node.data)]
    if isinstance(node, ByteClass):
        bits = 0
        for lo, hi in node.ranges:
            bits |= ((1 << (hi + 1)) - 1) ^ ((1 << lo) - 1)
        return [(bits,)]
    if isinstance(node, CharClass):
        return None if node.negated else [(node.ranges,)]
    if isinstance(node, Choice):
        found: list[tuple[Element, ...]] = []
        for alt in node.alts:
            sub = _paths(alt)
            if sub is None or len(found) + len(sub) > _MAX_PATHS:
                return None
            found += sub
        return found
    if isinstance(node, Seq):
        found = [()]
        for item in node.items:
            sub = _paths(item)
            if sub is None:
                return None
            if not sub:  # an empty choice: the sequence matches nothing
                return []
            if (len(found) * len(sub) > _MAX_PATHS
                    or max(map(len, found)) + max(map(len, sub)) > _MAX_PATH_LENGTH):
                return None
            found = [head + tail for head in found for tail in sub]
        return found
    return None


def _prefix_unique(paths: list[tuple[Element, ...]]) -> bool:
    """Whether no input has two derivations, or two prefixes, that the paths match: no path
    may match a prefix of what another matches. A class beside bytes that may start it
    counts as a clash (their lengths differ, the rest is not compared)."""
    for i, path in enumerate(paths):
        for other in paths[i + 1 :]:
            for a, b in zip(path, other, strict=False):
                if isinstance(a, int) and isinstance(b, int):
                    if not a & b:
                        break
                elif isinstance(a, tuple) and isinstance(b, tuple):
                    if not _overlap(a, b):
                        break
                elif not _lead_bits(a) & _lead_bits(b):
                    break
                else:
                    return False
            else:
                return False
    return True


def _overlap(a: tuple[tuple[int, int], ...], b: tuple[tuple[int, int], ...]) -> bool:
    return any(lo <= other_hi and other_lo <= hi for lo, hi in a for other_lo, other_hi in b)


def _lead_bits(element: Element) -> int:
    """The first bytes an element may read: its bytes, or the UTF-8 lead bytes of its class
    (a lead byte grows with the scalar, so a range's are those between its ends')."""
    if isinstance(element, int):
        return element
    bits = 0
    for lo, hi in element:
        first, last = _lead_byte(lo), _lead_byte(hi)
        bits |= ((1 << (last + 1)) - 1) ^ ((1 << first) - 1)
    return bits


def _lead_byte(scalar: int) -> int:
    if scalar < 0x80:
        return scalar
    if scalar < 0x800:
        return 0xC0 | scalar >> 6
    if scalar < 0x10000:
        return 0xE0 | scalar >> 12
    return 0xF0 | scalar >> 18
