"""Walks of the vocabulary trie (`pegmask.grammars.token_trie`) through a grammar's
configurations: the tokens a configuration can read, found a trie level at a time with numpy
while the frontier is wide, depth-first once it is narrow, and without numpy at all inside a
literal (a configuration that reads few bytes). Where a walk reaches plain text that every
plain token below a node survives (`PlainText`), it cuts there and allows them all at once.
"""

from __future__ import annotations

import functools
from bisect import bisect_left
from typing import TYPE_CHECKING

import numpy as np

from pegmask.grammars.configurations import DEAD, UNKNOWN
from pegmask.grammars.plain_text import PlainText
from pegmask.grammars.token_trie import TokenTrie, token_trie

if TYPE_CHECKING:
    from pegmask.grammars.grammar import Grammar
    from pegmask.grammars.vocab import Vocabulary

_NARROW_FRONTIER = 48  # walk depth-first below a level with at most this many children to read
_CUT_FRONTIER = 512  # a walk looks for plain-text regions on a level with at least this many children
_FEW_CHILDREN = 4  # a configuration of few bytes (`_NARROW_ROOT`) looks them up among a node's
                   # children (a binary search each) where the node has more than this many
                   # children per byte
_ROW_THREADS = 8  # a configuration with more threads gets ...
_ROW_AT = 8  # ... a whole row only when a walk level needs more bytes of it at once


def _flat_ranges(starts: np.ndarray, counts: np.ndarray, total: int) -> np.ndarray:
    """The indices of the ranges [starts[i], starts[i] + counts[i]), one after the other
    (`total` is the sum of `counts`)."""
    return np.repeat(starts - np.cumsum(counts) + counts, counts) + np.arange(total)


class TrieWalk(PlainText):
    """The live nodes of the vocabulary trie from a configuration, and where its tokens lead
    (the third layer of `CompiledGrammar`)."""

    def __init__(self, grammar: Grammar, vocab: Vocabulary, max_depth: int):
        super().__init__(grammar, vocab, max_depth)
        self.trie: TokenTrie = token_trie(vocab, self.lexer.first_bytes)

    def _narrow_walk(self, config: int, trie: TokenTrie) -> list[int] | None:
        """`_live_nodes` of a configuration that reads few bytes (`_NARROW_ROOT`) whose live
        children of the root have few children to read (`_few_lookups`), walked depth-first
        without numpy: a literal's mask is a handful of tokens, and a dozen array operations
        would cost it more than its walk. None for other configurations. (No plain text
        survives the first byte of such a configuration: its walk has no cuts.)"""
        few = self._few_bytes[config]
        if few is None:
            return None
        nodes, states = self._few_root_steps(config, few, trie)  # at most `_NARROW_ROOT`
        child_start, child_end, _ = trie.lists
        counts = [child_end[node] - child_start[node] for node in nodes]
        if sum(counts) > _NARROW_FRONTIER and not self._few_lookups(states, counts):
            return None
        return nodes + self._walk_depth_first(trie, nodes, states)

    def _live_nodes(self, config: int, trie: TokenTrie,
                    cuts: list[tuple[np.ndarray, np.ndarray]] | None = None) -> np.ndarray:
        """Nodes of `trie` whose byte prefix `config` can consume (the root excluded); with
        `cuts`, see `_walk_levels`."""
        return self._walk_levels(trie, *self._live_children_of_root(config, trie), cuts)

    def _walk_levels(self, trie: TokenTrie, live_nodes: np.ndarray, live_states: np.ndarray,
                     cuts: list[tuple[np.ndarray, np.ndarray]] | None = None) -> np.ndarray:
        """`live_nodes` (reached in `live_states`) and the live nodes below them.

        Levels are expanded with numpy while the frontier is wide; once it is narrow, a plain
        depth-first walk is cheaper than a dozen array operations per level.

        With `cuts` (a walk of the full trie), a node reached at a character boundary in a
        configuration that can read as many plain characters as the node's longest token
        holds after it (`_plain_depth`, `TokenTrie.height`) is not expanded: it goes to
        `cuts` with its configuration, since every plain token below it is allowed and the
        others are below the node of the same bytes in `trie.rest` (see
        `_allow_below_cuts`). In an object's key where keys other than its properties' are
        allowed, or in a string of bounded length, most of the trie is below such nodes.
        """
        found: list[np.ndarray] = []
        while len(live_nodes):
            found.append(live_nodes)
            starts = trie.child_start[live_nodes]
            counts = trie.child_end[live_nodes] - starts
            total = int(counts.sum())
            if cuts is not None and total >= _CUT_FRONTIER:
                depths = self._plain_depths[live_states]
                if (depths < 0).any():
                    for state in np.unique(live_states[depths < 0]).tolist():
                        self._plain_depth(state)
                    depths = self._plain_depths[live_states]
                cut = (depths > 0) & (depths >= trie.height[live_nodes]) & trie.boundary[live_nodes]
                if cut.any():
                    cuts.append((live_nodes[cut], live_states[cut]))
                    keep = ~cut
                    live_nodes, live_states = live_nodes[keep], live_states[keep]
                    starts, counts = starts[keep], counts[keep]
                    total = int(counts.sum())
            if total <= _NARROW_FRONTIER or (  # (the length first: no lists of a wide level)
                    len(live_states) <= _NARROW_FRONTIER // _FEW_CHILDREN
                    and self._few_lookups(live_states.tolist(), counts.tolist())):
                found.append(np.asarray(self._walk_depth_first(
                    trie, live_nodes.tolist(), live_states.tolist()), dtype=np.int64))
                break
            # Children of all live nodes, as one flat index array.
            children = _flat_ranges(starts, counts, total)
            parent_states = np.repeat(live_states, counts)
            child_bytes = trie.byte[children]
            next_states = self._table[parent_states, child_bytes]
            unknown = next_states == UNKNOWN
            if unknown.any():
                self._resolve(parent_states[unknown], child_bytes[unknown])
                next_states = self._table[parent_states, child_bytes]
            keep = next_states != DEAD
            live_nodes = children[keep]
            live_states = next_states[keep]
        return np.concatenate(found) if found else np.zeros(0, dtype=np.int64)

    def _allow_below_cuts(self, allowed: np.ndarray, trie: TokenTrie,
                          cuts: list[tuple[np.ndarray, np.ndarray]]) -> None:
        """Allow the tokens below the nodes where a walk reached a configuration that can read
        all their plain tokens (see `_walk_levels`): every plain token below such a node, and
        the others below it that a walk of the trie of non-plain tokens from there finds."""
        nodes = np.concatenate([nodes for nodes, _ in cuts])
        states = np.concatenate([states for _, states in cuts])
        first = trie.first_entry[nodes]
        counts = trie.end_entry[nodes] - first
        entries = _flat_ranges(first, counts, int(counts.sum()))
        allowed[trie.entry_token[entries[trie.plain_entry[entries]]]] = True
        rest_nodes = trie.rest_node[nodes]
        keep = rest_nodes >= 0
        if keep.any():
            rest = trie.rest
            below = self._walk_levels(rest, rest_nodes[keep], states[keep])
            allowed[rest.tokens_at(below)] = True

    def _few_lookups(self, states: list[int], counts: list[int]) -> bool:
        """Whether `_walk_depth_first` reads at most `_NARROW_FRONTIER` children on this
        level of at most `_NARROW_FRONTIER // _FEW_CHILDREN` nodes (few nodes, in
        configurations that read few bytes: inside literals)."""
        few_bytes, lookups = self._few_bytes, 0
        for state, count in zip(states, counts, strict=True):
            few = few_bytes[state]
            lookups += count if few is None else min(count, len(few) * _FEW_CHILDREN)
        return lookups <= _NARROW_FRONTIER

    def _few_root_steps(self, config: int, few: tuple[int, ...], trie: TokenTrie
                        ) -> tuple[list[int], list[int]]:
        """The root's children for the bytes `few` that `config` reads alive, and where each
        leads."""
        nodes, states, first, step = [], [], trie.first_child, self._step
        for byte in few:
            node = first[byte]
            if node >= 0:
                nxt = step(config, byte)
                if nxt != DEAD:
                    nodes.append(node)
                    states.append(nxt)
        return nodes, states

    def _live_children_of_root(self, config: int, trie: TokenTrie) -> tuple[np.ndarray, np.ndarray]:
        """The first level of `_live_nodes`: the root's children are one range of the trie
        and have one parent, so this level is slices and a row lookup (every walk has it);
        when only a few bytes may be live (inside a literal, say), it is those bytes' steps."""
        few = self._few_bytes[config]
        if few is not None:
            nodes, states = self._few_root_steps(config, few, trie)
            return np.array(nodes, dtype=np.int64), np.array(states, dtype=np.int32)
        start, end = int(trie.child_start[0]), int(trie.child_end[0])
        child_bytes = trie.byte[start:end]
        next_states = self._table[config][child_bytes]
        unknown = next_states == UNKNOWN
        if unknown.any():
            self._resolve(np.full(int(unknown.sum()), config, dtype=np.int32),
                          child_bytes[unknown])
            next_states = self._table[config][child_bytes]
        keep = np.flatnonzero(next_states != DEAD)
        return keep + start, next_states[keep]

    def moves(self, config: int) -> tuple[np.ndarray, np.ndarray]:
        """The allowed tokens (stop tokens aside) and the configuration each leads to, except
        tokens that lead back to `config` itself as plain text does inside a string (left
        out where every plain character loops back: those of whole plain characters).

        A walk of the trie level by level with numpy that keeps every node's configuration
        (no shortcut: the closing mask needs where each token leads, not only whether it
        lives); inside a string, only the trie of what tokens hold after their plain prefix,
        and the plain tokens cut inside their last character one by one."""
        tokens: list[np.ndarray] = []
        states: list[np.ndarray] = []
        trie = self.trie
        if config != DEAD and self._loops_on_plain_text(config):
            found = self._walk_with_states(config, trie.after_plain)
            cut = self._plain_tokens_cut_inside_a_character
            cut_states = np.array([self.state_after_token(config, t) for t in cut.tolist()],
                                  dtype=np.int32)
            found = (np.concatenate([found[0], cut[cut_states != DEAD]]),
                     np.concatenate([found[1], cut_states[cut_states != DEAD]]))
        else:
            found = self._walk_with_states(config, trie)
        tokens.append(found[0])
        states.append(found[1])
        for token_id, symbol in self.special_symbol.items():
            after = self.next_state(config, symbol) if config != DEAD else DEAD
            if after != DEAD and token_id < self.vocab.size:
                tokens.append(np.array([token_id]))
                states.append(np.array([after], dtype=np.int32))
        return np.concatenate(tokens), np.concatenate(states)

    @functools.cached_property
    def _plain_tokens_cut_inside_a_character(self) -> np.ndarray:
        plain = self.trie.plain_tokens
        return plain[~self.trie.boundary[self.trie.token_node[plain]]]

    def _walk_with_states(self, config: int, trie: TokenTrie) -> tuple[np.ndarray, np.ndarray]:
        """The tokens of `trie` that `config` can read, and the configuration after each."""
        nodes = np.zeros(1, dtype=np.int64)
        states = np.full(1, config, dtype=np.int32)
        reached = np.full(trie.node_count, DEAD, dtype=np.int32)
        while len(nodes):
            starts = trie.child_start[nodes]
            counts = trie.child_end[nodes] - starts
            total = int(counts.sum())
            children = _flat_ranges(starts, counts, total)
            parent_states = np.repeat(states, counts)
            child_bytes = trie.byte[children]
            next_states = self._table[parent_states, child_bytes]
            unknown = next_states == UNKNOWN
            if unknown.any():
                self._resolve(parent_states[unknown], child_bytes[unknown])
                next_states = self._table[parent_states, child_bytes]
            keep = next_states != DEAD
            nodes, states = children[keep], next_states[keep]
            reached[nodes] = states
        reached[0] = DEAD  # the root is no token
        tokens = np.concatenate([trie.node_token, trie.duplicate_token])
        after = np.concatenate([reached, reached[trie.duplicate_node]])
        keep = (tokens >= 0) & (after != DEAD)
        return tokens[keep], after[keep]

    def _resolve(self, states: np.ndarray, symbols: np.ndarray) -> None:
        """Compute the unknown transitions (states[i], symbols[i]). A whole row is cheap for a
        configuration of a few threads and spares later lookups; one of many threads (a
        large object's properties) gets only the bytes the walk needs when they are few, as
        every other byte of its row would make a configuration no token reaches."""
        large = []
        for config in sorted(set(states.tolist())):  # (np.unique costs more on few states)
            if len(self._threads[config]) <= _ROW_THREADS:
                self._row(config)
            else:
                large.append(config)
        if not large:
            return
        pairs = np.unique(states.astype(np.int64) << 8 | symbols)
        pairs = pairs[np.isin(pairs >> 8, large)]
        configs, first, counts = np.unique(pairs >> 8, return_index=True, return_counts=True)
        for config, start, count in zip(configs.tolist(), first.tolist(), counts.tolist(),
                                        strict=True):
            if count > _ROW_AT:
                self._row(config)
            else:
                for byte in (pairs[start : start + count] & 0xFF).tolist():
                    self._step(config, byte)

    def _walk_depth_first(self, trie: TokenTrie, nodes: list[int], states: list[int]) -> list[int]:
        """`_walk_levels` one node at a time. A configuration that reads only a few bytes
        looks them up among a node's many children instead of reading every child."""
        child_start, child_end, byte = trie.lists
        rows, step = self._rows, self._step if self._lexed else self._thread_byte
        live_bits, few_bytes, complete = self._live_bits, self._few_bytes, self._complete
        live: list[int] = []
        stack = list(zip(nodes, states, strict=False))
        while stack:
            node, state = stack.pop()
            row, bits, few = rows[state], live_bits[state], few_bytes[state]
            start, end = child_start[node], child_end[node]
            if few is not None and len(few) * _FEW_CHILDREN < end - start:
                children: list[int] | range = []
                for symbol in few:
                    child = bisect_left(byte, symbol, start, end)
                    if child < end and byte[child] == symbol:
                        children.append(child)
            else:
                children = range(start, end)
                if few is None and end - start > _ROW_AT and not complete[state]:
                    row = self._row(state)  # as in `_resolve`: many bytes of it at once
            for child in children:
                symbol = byte[child]
                nxt = row[symbol]
                if nxt == UNKNOWN:
                    nxt = step(state, symbol) if bits >> symbol & 1 else DEAD
                if nxt != DEAD:
                    live.append(child)
                    stack.append((child, nxt))
        return live
