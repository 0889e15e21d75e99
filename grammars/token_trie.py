"""The vocabulary as a byte trie in flat numpy arrays, walked one level at a time.

Computing a mask means finding every token whose bytes the automaton can consume from a given
state. Tokens share prefixes, so the walk goes over trie nodes (unique prefixes), level by
level, vectorized, and only expands the children of nodes that are still alive; a dead prefix
kills all tokens below it at once.
"""

from __future__ import annotations

import dataclasses
import functools
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from pegmask.grammars.program import utf8_sequences

if TYPE_CHECKING:
    from pegmask.grammars.vocab import Vocabulary


# Plain text: printable characters other than the JSON string delimiters `"` and `\`.
# Inside a JSON string or free text every plain character leads back to the same state, so
# tokens made only of plain text need no walk there (see CompiledGrammar.mask).
PLAIN_ASCII = tuple(b for b in range(0x20, 0x80) if b not in b'"\\')
PLAIN_MULTIBYTE = tuple(
    tuple(seq) for lo, hi in ((0x80, 0xD7FF), (0xE000, 0x10FFFF)) for seq in utf8_sequences(lo, hi)
)


def is_plain_text(data: bytes) -> bool:
    """Valid UTF-8 with no control character, `"` or `\\`, possibly cut inside its last
    character (byte-level vocabularies split characters between tokens): where every plain
    character loops back, such a token is allowed too, ending inside a character."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        if error.end != len(data) or not _is_partial_character(data[error.start :]):
            return False
        text = data[: error.start].decode("utf-8")
    return all(map(_is_plain_character, text))


def _is_plain_character(ch: str) -> bool:
    """Not a control character, `"` or `\\`: what JSON strings and free text read as is."""
    return ch >= " " and ch not in '"\\'


def plain_prefix_length(data: bytes, not_plain: bytes = b"") -> int:
    """Bytes in the longest prefix of `data` made of whole plain characters (none of whose
    bytes is in `not_plain`)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        text = data[: error.start].decode("utf-8")
    length = 0
    for ch in text:
        encoded = ch.encode("utf-8")
        if not _is_plain_character(ch) or any(b in not_plain for b in encoded):
            break
        length += len(encoded)
    return length


def _is_partial_character(data: bytes) -> bool:
    """Whether `data` is a proper prefix of the UTF-8 bytes of a plain non-ASCII character."""
    return any(len(seq) > len(data)
               and all(lo <= b <= hi for b, (lo, hi) in zip(data, seq, strict=False))
               for seq in PLAIN_MULTIBYTE)


@dataclass(frozen=True)
class TokenTrie:
    """Flat trie: node 0 is the root; nodes of one level are contiguous, children of a node
    are a contiguous range of the next level (`child_start`/`child_end`)."""

    byte: np.ndarray  # uint8 [nodes]: the byte leading into the node
    child_start: np.ndarray  # int64 [nodes]
    child_end: np.ndarray  # int64 [nodes]
    token_node: np.ndarray  # int64 [vocab size]: node of each ordinary token, -1 if none
    node_token: np.ndarray  # int64 [nodes]: the (first) token ending at the node, -1 if none
    duplicate_node: np.ndarray  # int64: nodes shared by a further token (same bytes) ...
    duplicate_token: np.ndarray  # int64: ... and that token
    depth: int
    token_count: int
    # Entries are the tokens in byte order; the tokens below a node are a range of them.
    entry_token: np.ndarray  # int64 [entries]: the token of each entry
    first_entry: np.ndarray  # int64 [nodes]: the first entry below (or at) the node ...
    end_entry: np.ndarray  # int64 [nodes]: ... and the end of its range
    boundary: np.ndarray  # bool [nodes]: the node's bytes do not end inside a UTF-8 character
    height: np.ndarray  # int64 [nodes]: bytes of the longest token at or below the node after it
    plain_tokens: np.ndarray  # int64: ids of plain-text tokens (set only on a full trie) ...
    rest: TokenTrie | None  # ... and the trie of all its other tokens ...
    # ... and the trie of what those tokens hold after their longest prefix of whole plain
    # characters (tokens with the same such rest share its node): where every plain
    # character leads back to the same configuration, a token is allowed if its rest is.
    after_plain: TokenTrie | None = None
    plain_entry: np.ndarray | None = None  # bool [entries]: the entry is a plain token
    rest_node: np.ndarray | None = None  # int64 [nodes]: the node of `rest` with the same bytes, or -1

    @property
    def node_count(self) -> int:
        return len(self.byte)

    @functools.cached_property
    def parent(self) -> np.ndarray:
        """int64 [nodes]: each node's parent (the root's is 0)."""
        parent = np.zeros(self.node_count, dtype=np.int64)
        parent[1:] = np.repeat(np.arange(self.node_count), self.child_end - self.child_start)
        return parent

    @functools.cached_property
    def lists(self) -> tuple[list[int], list[int], list[int]]:
        """child_start, child_end and byte as Python lists, for scalar walks."""
        return self.child_start.tolist(), self.child_end.tolist(), self.byte.tolist()

    @functools.cached_property
    def first_child(self) -> list[int]:
        """Per byte, the root's child for it (the node of the one-byte prefix), or -1."""
        first = [-1] * 256
        for node in range(int(self.child_start[0]), int(self.child_end[0])):
            first[int(self.byte[node])] = node
        return first

    @functools.cached_property
    def plain_allowed(self) -> np.ndarray:
        """bool [vocab size]: True at `plain_tokens` (copied, not scattered, into each mask
        of a configuration inside text: most of the vocabulary)."""
        allowed = np.zeros(len(self.token_node), dtype=bool)
        allowed[self.plain_tokens] = True
        return allowed

    @functools.cached_property
    def _token_lists(self) -> tuple[list[int], dict[int, list[int]]]:
        """node_token as a list, and the further tokens of each node that has some."""
        further: dict[int, list[int]] = {}
        for node, token_id in zip(self.duplicate_node.tolist(), self.duplicate_token.tolist(),
                                  strict=True):
            further.setdefault(node, []).append(token_id)
        return self.node_token.tolist(), further

    def tokens_of(self, nodes: list[int]) -> list[int]:
        """`tokens_at` for a few nodes, without numpy."""
        node_token, further = self._token_lists
        tokens = [node_token[node] for node in nodes if node_token[node] >= 0]
        if further:
            for node in nodes:
                if node in further:
                    tokens += further[node]
        return tokens

    def tokens_at(self, nodes: np.ndarray) -> np.ndarray:
        """Ids of all tokens ending at `nodes`."""
        tokens = self.node_token[nodes]
        tokens = tokens[tokens >= 0]
        if len(self.duplicate_node):
            reached = np.zeros(self.node_count, dtype=bool)
            reached[nodes] = True
            tokens = np.concatenate([tokens, self.duplicate_token[reached[self.duplicate_node]]])
        return tokens


_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def token_trie(vocab: Vocabulary, not_plain: frozenset[int] = frozenset()) -> TokenTrie:
    """The trie of `vocab`'s ordinary (non-empty, non-special) tokens, built once per vocab.

    `not_plain`: bytes that do not count as plain text (those that may start a special token's
    spelling, which never loops back inside text); the plain / rest split is made once per set.
    """
    tries = _CACHE.setdefault(vocab, {})
    trie = tries.get(not_plain)
    if trie is None:
        full = token_trie(vocab) if not_plain else build_token_trie(vocab.token_bytes)
        trie = tries[not_plain] = _split_plain(full, vocab.token_bytes, not_plain,
                                               after_plain=True)
    return trie


def _split_plain(full: TokenTrie, token_bytes: list[bytes | None], not_plain: frozenset[int],
                 *, after_plain: bool) -> TokenTrie:
    """`full` (the trie of `token_bytes`, by token id) with its plain tokens and the trie of
    the others (`TokenTrie.rest`, with `rest_node` and `plain_entry`) for `not_plain`, which
    walks that cut where plain text survives need; and with `after_plain`, the trie of what
    the others hold after their plain prefix (`TokenTrie.after_plain`)."""
    excluded = bytes(sorted(not_plain))
    plain = [data is not None and is_plain_text(data) and not any(b in data for b in excluded)
             for data in token_bytes]
    others = [None if p else d for d, p in zip(token_bytes, plain, strict=False)]
    rest = build_token_trie(others)
    return dataclasses.replace(
        full, plain_tokens=np.flatnonzero(plain).astype(np.int64), rest=rest,
        after_plain=build_token_trie([d and d[plain_prefix_length(d, excluded):]
                                      for d in others]) if after_plain else None,
        plain_entry=np.asarray(plain, dtype=bool)[full.entry_token],
        rest_node=_same_nodes(full, rest))


@dataclass(frozen=True)
class RunTrie:
    """The vocabulary seen after a leading run of one byte class (whitespace, say).

    `lead[t]` is the length of token t's leading run (0 when it does not start with the
    class); `rests` is the trie of what follows the run in the tokens that start with one
    (tokens with the same rest share its node); `run_only` are the tokens made of the class
    alone, by increasing length.
    """

    lead: np.ndarray  # int64 [vocab size]
    rests: TokenTrie
    run_only: np.ndarray  # int64
    count: int  # tokens with a leading run
    longest_lead: int  # of the tokens in `rests`

    def run_only_within(self, remaining: int) -> np.ndarray:
        """The tokens made of at most `remaining` bytes of the class alone."""
        return self.run_only[: self._run_only_counts[min(remaining, len(self._run_only_counts) - 1)]]

    @functools.cached_property
    def _run_only_counts(self) -> list[int]:
        """Per run length, how many of `run_only` are at most that long."""
        lengths = self.lead[self.run_only]
        longest = int(lengths[-1]) if len(lengths) else 0
        return np.searchsorted(lengths, np.arange(longest + 1), side="right").tolist()


def run_trie(vocab: Vocabulary, table: bytes) -> RunTrie:
    """The `RunTrie` of `vocab` for the byte class `table` (256 flags), built once per pair."""
    tries = _CACHE.setdefault(vocab, {})
    key = ("run", table)
    trie = tries.get(key)
    if trie is None:
        in_class = [bool(flag) for flag in table]
        lead = np.zeros(len(vocab.token_bytes), dtype=np.int64)
        rests: list[bytes | None] = [None] * len(vocab.token_bytes)
        only: list[int] = []
        for token_id, data in enumerate(vocab.token_bytes):
            if not data or not in_class[data[0]]:
                continue
            run = 1
            while run < len(data) and in_class[data[run]]:
                run += 1
            lead[token_id] = run
            if run == len(data):
                only.append(token_id)
            else:
                rests[token_id] = data[run:]
        only.sort(key=lambda token_id: lead[token_id])
        with_rest = lead[[token_id for token_id, rest in enumerate(rests) if rest is not None]]
        trie = tries[key] = RunTrie(lead, build_token_trie(rests), np.asarray(only, dtype=np.int64),
                                    int(np.count_nonzero(lead)), int(with_rest.max(initial=0)))
    return trie


def run_rests_split(vocab: Vocabulary, table: bytes, not_plain: frozenset[int]) -> TokenTrie:
    """`RunTrie.rests` of `run_trie(vocab, table)` (the same nodes) with its plain / rest split
    for `not_plain` (`_split_plain`): for a walk after a run that cuts where plain text
    survives (free text after whitespace), made once per triple when a walk first cuts."""
    tries = _CACHE.setdefault(vocab, {})
    key = ("run split", table, not_plain)
    trie = tries.get(key)
    if trie is None:
        run = run_trie(vocab, table)
        rests = [data[lead:] if 0 < lead < len(data) else None
                 for data, lead in zip(vocab.token_bytes, run.lead.tolist(), strict=True)]
        trie = tries[key] = _split_plain(run.rests, rests, not_plain, after_plain=False)
    return trie


def _same_nodes(trie: TokenTrie, sub: TokenTrie) -> np.ndarray:
    """Per node of `trie`, the node of `sub` (a trie of some of its tokens) with the same bytes,
    or -1. Found one level of `sub` at a time: (parent, byte) increases with the node."""
    same = np.full(trie.node_count, -1, dtype=np.int64)
    same[0] = 0
    in_trie = np.zeros(sub.node_count, dtype=np.int64)  # the inverse, for sub's parents
    keys = trie.parent * 256 + trie.byte
    keys[0] = -1
    level = np.zeros(1, dtype=np.int64)
    while True:
        starts, ends = sub.child_start[level], sub.child_end[level]
        parents = ends > starts
        if not parents.any():
            return same
        children = np.arange(int(starts[parents][0]), int(ends[parents][-1]))
        nodes = np.searchsorted(keys, in_trie[sub.parent[children]] * 256 + sub.byte[children])
        in_trie[children] = nodes
        same[nodes] = children
        level = children


# Per byte, how many continuation bytes follow it in a UTF-8 character (-1: it cannot start one).
_CONTINUATIONS = np.array([0] * 0x80 + [-1] * 0x42 + [1] * 0x1E + [2] * 0x10 + [3] * 5 + [-1] * 11,
                          dtype=np.int64)


def build_token_trie(token_bytes: list[bytes | None]) -> TokenTrie:
    entries = sorted(
        (data, token_id) for token_id, data in enumerate(token_bytes) if data
    )
    max_len = max((len(data) for data, _ in entries), default=0)
    # levels[d] collects (parent node index within level d-1, byte) in creation order.
    level_parent: list[list[int]] = [[] for _ in range(max_len + 1)]
    level_byte: list[list[int]] = [[] for _ in range(max_len + 1)]
    level_parent[0].append(-1)
    level_byte[0].append(0)
    level_first: list[list[int]] = [[0]] + [[] for _ in range(max_len)]  # entry making a node
    current = [0] * (max_len + 1)  # node index (within its level) of the current prefix
    token_level_index: list[tuple[int, int, int]] = []
    previous = b""
    for entry, (data, token_id) in enumerate(entries):
        common = 0
        limit = min(len(previous), len(data))
        while common < limit and previous[common] == data[common]:
            common += 1
        for d in range(common + 1, len(data) + 1):
            level_parent[d].append(current[d - 1])
            level_byte[d].append(data[d - 1])
            level_first[d].append(entry)
            current[d] = len(level_parent[d]) - 1
        token_level_index.append((token_id, len(data), current[len(data)]))
        previous = data
    offsets = np.cumsum([0] + [len(p) for p in level_parent])
    total = int(offsets[-1])
    byte = np.zeros(total, dtype=np.uint8)
    child_start = np.zeros(total, dtype=np.int64)
    child_end = np.zeros(total, dtype=np.int64)
    for d in range(max_len + 1):
        lo = offsets[d]
        byte[lo : offsets[d + 1]] = level_byte[d]
        if d + 1 <= max_len and level_parent[d + 1]:
            parents = np.asarray(level_parent[d + 1], dtype=np.int64)
            count = offsets[d + 1] - offsets[d]
            starts = np.searchsorted(parents, np.arange(count), side="left")
            ends = np.searchsorted(parents, np.arange(count), side="right")
            child_start[lo : offsets[d + 1]] = starts + offsets[d + 1]
            child_end[lo : offsets[d + 1]] = ends + offsets[d + 1]
        else:
            child_start[lo : offsets[d + 1]] = 0
            child_end[lo : offsets[d + 1]] = 0
    first_entry = np.concatenate([np.asarray(level, dtype=np.int64) for level in level_first])
    end_entry = np.full(total, len(entries), dtype=np.int64)
    pending = np.zeros(total, dtype=np.int64)  # continuation bytes the node's bytes lack
    for d in range(1, max_len + 1):
        lo, hi = offsets[d], offsets[d + 1]
        parents = np.asarray(level_parent[d], dtype=np.int64) + offsets[d - 1]
        # A node's range ends where its next sibling's starts, or where its parent's ends.
        ends = end_entry[parents]
        sibling = parents[1:] == parents[:-1]
        ends[:-1][sibling] = first_entry[lo + 1 : hi][sibling]
        end_entry[lo:hi] = ends
        level = byte[lo:hi]
        before = pending[parents]
        continues = (level & 0xC0) == 0x80
        pending[lo:hi] = np.where(before > 0, np.where(continues, before - 1, -1),
                                  np.where(before < 0, -1, _CONTINUATIONS[level]))
    token_node = np.full(len(token_bytes), -1, dtype=np.int64)
    node_token = np.full(total, -1, dtype=np.int64)
    duplicates: list[tuple[int, int]] = []
    for token_id, level, index in token_level_index:
        node = offsets[level] + index
        token_node[token_id] = node
        if node_token[node] < 0:
            node_token[node] = token_id
        else:
            duplicates.append((node, token_id))
    duplicate = np.asarray(duplicates, dtype=np.int64).reshape(-1, 2)
    height = np.zeros(total, dtype=np.int64)  # every leaf ends a token
    for d in range(max_len, 0, -1):
        parents = np.asarray(level_parent[d], dtype=np.int64) + offsets[d - 1]
        np.maximum.at(height, parents, height[offsets[d] : offsets[d + 1]] + 1)
    return TokenTrie(
        byte, child_start, child_end, token_node, node_token, duplicate[:, 0], duplicate[:, 1],
        max_len, len(token_level_index),
        np.asarray([token_id for _, token_id in entries], dtype=np.int64), first_entry, end_entry,
        pending == 0, height, np.zeros(0, dtype=np.int64), None,
    )
