"""The token-mask automaton: a lazily determinized view of a grammar's program over a vocabulary.

A *configuration* is the set of parser threads (pc, call stack) after some input; it is what
the streaming parser would hold, minus the capture logs, so the automaton accepts exactly the
parser's language. Configurations are interned as ints (0 is the dead configuration) and their
byte transitions are memoized in a dense table, so that:

* `accept_token` is a few table lookups (one per byte of the token);
* a mask is computed once per configuration by a vectorized walk of the vocabulary trie
  (`pegmask.grammars.token_trie`) and then cached (LRU, bounded by bytes).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from pegmask.grammars.grammar import Grammar
from pegmask.grammars.program import BYTE, SPECIAL, SPECIAL_BASE
from pegmask.grammars.runtime import DEFAULT_MAX_DEPTH, Runtime
from pegmask.grammars.token_trie import TokenTrie, token_trie
from pegmask.kernels.bitmask import pack_bool_mask

if TYPE_CHECKING:
    from pegmask.grammars.vocab import Vocabulary

DEAD = 0
UNKNOWN = -1
DEFAULT_MASK_CACHE_BYTES = 256 * 1024 * 1024
_NARROW_FRONTIER = 48


class CompiledGrammar:
    """A grammar bound to a vocabulary: shared transition tables and mask cache for all the
    matchers it creates (one matcher per generation)."""

    def __init__(
        self,
        grammar: Grammar,
        vocab: Vocabulary,
        *,
        stop_token_ids: Iterable[int] | None = None,
        max_depth: int = DEFAULT_MAX_DEPTH,
        mask_cache_bytes: int = DEFAULT_MASK_CACHE_BYTES,
    ):
        self.grammar = grammar
        self.vocab = vocab
        self.program = grammar.program
        self.runtime = Runtime(self.program, max_depth)
        self.trie: TokenTrie = token_trie(vocab)
        self.words = (vocab.size + 31) // 32
        # Special tokens the grammar uses, by vocabulary id -> program symbol.
        self.special_symbol: dict[int, int] = {}
        for name in self.program.specials:
            token_id = vocab.special_ids.get(name)
            if token_id is not None:
                self.special_symbol[token_id] = self.program.special_symbol(name)
        stops = vocab.eos_ids if stop_token_ids is None else tuple(stop_token_ids)
        self.stop_ids = tuple(t for t in stops if t not in self.special_symbol)
        # Configuration store: id -> threads; key -> id; accepting flags; byte transitions.
        self._threads: list[list[tuple[int, int, Any]]] = [[]]
        self._ids: dict[tuple, int] = {(): DEAD}
        self._accepting: list[bool] = [False]
        self._table = np.full((64, 256), UNKNOWN, dtype=np.int32)
        self._table[DEAD] = DEAD
        self._special_next: dict[tuple[int, int], int] = {}
        # Per instruction: its accepted bytes as a 0/1 vector (None for non-byte instructions).
        self._byte_accept: list[np.ndarray | None] = [
            np.frombuffer(table, dtype=np.uint8) if table is not None else None
            for table in self.program.accept
        ]
        self._masks: OrderedDict[int, tuple[np.ndarray, bool]] = OrderedDict()
        self._mask_cache_bytes = mask_cache_bytes
        threads, matched = self.runtime.initial()
        self.initial_state = self._intern(threads, bool(matched))

    # ----------------------------------------------------------------- configurations
    def _intern(self, threads: list[tuple[int, int, Any]], accepting: bool) -> int:
        key = (accepting, *sorted({(pc, stack) for pc, stack, _ in threads}))
        if not threads and not accepting:
            return DEAD
        config = self._ids.get(key)
        if config is None:
            config = len(self._threads)
            self._ids[key] = config
            self._threads.append(threads)
            self._accepting.append(accepting)
            if config >= len(self._table):
                grown = np.full((len(self._table) * 2, 256), UNKNOWN, dtype=np.int32)
                grown[: len(self._table)] = self._table
                self._table = grown
        return config

    def _compute(self, config: int, symbol: int) -> int:
        threads, matched = self.runtime.step(self._threads[config], symbol, 0, False)
        return self._intern(threads, bool(matched))

    def _fill_row(self, config: int) -> None:
        """Compute all 256 byte transitions of `config` at once.

        Bytes accepted by the same subset of threads lead to the same configuration, so the
        runtime steps once per distinct subset (a handful), not once per byte.
        """
        threads = self._threads[config]
        row = np.zeros(256, dtype=np.int32)
        byte_threads = [i for i, (pc, _, _) in enumerate(threads) if self._byte_accept[pc] is not None]
        if byte_threads:
            accepts = np.stack([self._byte_accept[threads[i][0]] for i in byte_threads])
            weights = np.left_shift(np.uint64(1), np.arange(len(byte_threads), dtype=np.uint64))
            signature = (accepts.astype(np.uint64) * weights[:, None]).sum(axis=0) if len(
                byte_threads
            ) < 64 else None
            if signature is None:  # too many threads for a bit signature: step per byte
                for byte in range(256):
                    row[byte] = self._compute(config, byte)
            else:
                for value in np.unique(signature):
                    if value == 0:
                        continue
                    members = [threads[byte_threads[i]] for i in range(len(byte_threads))
                               if int(value) >> i & 1]
                    byte = int(np.flatnonzero(signature == value)[0])
                    nxt_threads, matched = self.runtime.step(members, byte, 0, False)
                    row[signature == value] = self._intern(nxt_threads, bool(matched))
        self._table[config] = row

    def next_state(self, config: int, symbol: int) -> int:
        """Configuration after consuming one symbol (byte or special symbol)."""
        if symbol < SPECIAL_BASE:
            nxt = int(self._table[config, symbol])
            if nxt == UNKNOWN:
                self._fill_row(config)
                nxt = int(self._table[config, symbol])
            return nxt
        key = (config, symbol)
        nxt = self._special_next.get(key)
        if nxt is None:
            nxt = self._compute(config, symbol)
            self._special_next[key] = nxt
        return nxt

    def state_after_token(self, config: int, token_id: int) -> int:
        """Configuration after a whole token (DEAD if the token is not allowed)."""
        symbol = self.special_symbol.get(token_id)
        if symbol is not None:
            return self.next_state(config, symbol)
        data = self.vocab.token_bytes[token_id] if token_id < len(self.vocab.token_bytes) else None
        if not data:
            return DEAD
        table = self._table
        for byte in data:
            nxt = int(table[config, byte])
            if nxt == UNKNOWN:
                nxt = self.next_state(config, byte)
                table = self._table
            config = nxt
            if config == DEAD:
                return DEAD
        return config

    def is_accepting(self, config: int) -> bool:
        return self._accepting[config]

    def can_continue(self, config: int) -> bool:
        return bool(self._threads[config])

    def forced_bytes(self, config: int) -> bytes | None:
        """The single byte every continuation must start with, or None."""
        if self._accepting[config]:
            return None
        kind, accept = self.program.kind, self.program.accept
        allowed: np.ndarray | None = None
        for pc, _, _ in self._threads[config]:
            if kind[pc] == SPECIAL:
                return None
            row = np.frombuffer(accept[pc], dtype=np.uint8)
            allowed = row.copy() if allowed is None else allowed | row
        if allowed is None:
            return None
        nonzero = np.flatnonzero(allowed)
        return bytes((int(nonzero[0]),)) if len(nonzero) == 1 else None

    # ----------------------------------------------------------------- masks
    def mask(self, config: int) -> tuple[np.ndarray, bool]:
        """(packed int32 bitmask of allowed tokens, whether every ordinary token is allowed)."""
        cached = self._masks.get(config)
        if cached is not None:
            self._masks.move_to_end(config)
            return cached
        allowed = np.zeros(self.vocab.size, dtype=bool)
        free = False
        if config != DEAD:
            tokens = self.trie.tokens_at(self._live_nodes(config))
            allowed[tokens] = True
            free = len(tokens) == self.trie.token_count
            for token_id, symbol in self.special_symbol.items():
                if token_id < self.vocab.size and self.next_state(config, symbol) != DEAD:
                    allowed[token_id] = True
            if self._accepting[config]:
                allowed[[t for t in self.stop_ids if t < self.vocab.size]] = True
        packed = pack_bool_mask(allowed, self.vocab.size)
        entry = (packed, free)
        self._masks[config] = entry
        while len(self._masks) * packed.nbytes > self._mask_cache_bytes and len(self._masks) > 1:
            self._masks.popitem(last=False)
        return entry

    def _live_nodes(self, config: int) -> np.ndarray:
        """Trie nodes whose byte prefix `config` can consume (the root excluded).

        Levels are expanded with numpy while the frontier is wide; once it is narrow, a plain
        depth-first walk is cheaper than a dozen array operations per level.
        """
        trie = self.trie
        found: list[np.ndarray] = []
        live_nodes = np.zeros(1, dtype=np.int64)
        live_states = np.array([config], dtype=np.int32)
        while len(live_nodes):
            starts = trie.child_start[live_nodes]
            counts = trie.child_end[live_nodes] - starts
            total = int(counts.sum())
            if total == 0:
                break
            if total <= _NARROW_FRONTIER:
                found.append(self._walk_depth_first(live_nodes.tolist(), live_states.tolist()))
                break
            # Children of all live nodes, as one flat index array.
            children = np.repeat(starts - np.cumsum(counts) + counts, counts) + np.arange(total)
            parent_states = np.repeat(live_states, counts)
            child_bytes = trie.byte[children]
            next_states = self._table[parent_states, child_bytes]
            unknown = next_states == UNKNOWN
            if unknown.any():
                self._resolve(parent_states[unknown])
                next_states = self._table[parent_states, child_bytes]
            keep = next_states != DEAD
            live_nodes = children[keep]
            live_states = next_states[keep]
            found.append(live_nodes)
        return np.concatenate(found) if found else np.zeros(0, dtype=np.int64)

    def _walk_depth_first(self, nodes: list[int], states: list[int]) -> np.ndarray:
        trie = self.trie
        child_start, child_end, byte = trie.child_start, trie.child_end, trie.byte
        table = self._table
        live: list[int] = []
        stack = list(zip(nodes, states))
        while stack:
            node, state = stack.pop()
            for child in range(int(child_start[node]), int(child_end[node])):
                b = int(byte[child])
                nxt = int(table[state, b])
                if nxt == UNKNOWN:
                    nxt = self.next_state(state, b)
                    table = self._table
                if nxt != DEAD:
                    live.append(child)
                    stack.append((child, nxt))
        return np.asarray(live, dtype=np.int64)

    def _resolve(self, states: np.ndarray) -> None:
        for config in np.unique(states).tolist():
            self._fill_row(config)

    def matcher(self) -> GrammarMatcher:
        return GrammarMatcher(self)

    @property
    def state_count(self) -> int:
        return len(self._threads)


class GrammarMatcher:
    """Per-generation cursor over a `CompiledGrammar` (xgrammar's GrammarMatcher shape)."""

    def __init__(self, compiled: CompiledGrammar):
        self.compiled = compiled
        self.reset()

    def reset(self) -> None:
        self._history: list[int] = [self.compiled.initial_state]
        self._terminated = False

    @property
    def state(self) -> int:
        return self._history[-1]

    def fill_next_token_bitmask(self, bitmask: Any, index: int = 0) -> bool:
        """Write the allowed-token mask into row `index` of `bitmask` (torch or numpy int32).

        Returns False when every ordinary token is allowed (an unconstrained, lazy region: the
        caller may skip applying the mask); the row is filled exactly either way.
        """
        packed, free = self.compiled.mask(self.state if not self._terminated else DEAD)
        row = bitmask[index]
        target = row.numpy() if hasattr(row, "numpy") else row
        width = min(len(target), len(packed))
        target[:width] = packed[:width]
        if len(target) > width:
            target[width:] = 0
        return not free

    def accept_token(self, token_id: int) -> bool:
        """Advance by one token; returns False (state unchanged) if it is not allowed."""
        if self._terminated:
            return False
        compiled = self.compiled
        if token_id in compiled.stop_ids and compiled.is_accepting(self.state):
            self._history.append(self.state)
            self._terminated = True
            return True
        nxt = compiled.state_after_token(self.state, token_id)
        if nxt == DEAD:
            return False
        self._history.append(nxt)
        return True

    def accept_tokens(self, token_ids: Sequence[int]) -> bool:
        """Accept several tokens; on the first rejected one, undo them all and return False."""
        for count, token_id in enumerate(token_ids):
            if not self.accept_token(token_id):
                self.rollback(count)
                return False
        return True

    def accept_string(self, text: str | bytes) -> bool:
        """Advance by raw text bytes (used for jump-forward); False and no change if rejected."""
        data = text.encode() if isinstance(text, str) else text
        state = self.state
        for byte in data:
            state = self.compiled.next_state(state, byte)
            if state == DEAD:
                return False
        self._history.append(state)
        return True

    def rollback(self, num_tokens: int = 1) -> None:
        """Undo the last `num_tokens` accepted tokens (or strings)."""
        if num_tokens < 0 or num_tokens >= len(self._history):
            raise ValueError(f"cannot roll back {num_tokens} tokens (have {len(self._history) - 1})")
        if num_tokens:
            del self._history[-num_tokens:]
            self._terminated = False

    def is_terminated(self) -> bool:
        """True after a stop token was accepted, or when the grammar is complete and nothing
        more can follow."""
        state = self.state
        return self._terminated or (
            self.compiled.is_accepting(state) and not self.compiled.can_continue(state)
        )

    def is_accepting(self) -> bool:
        """True when the output so far is a complete sentence of the grammar."""
        return self.compiled.is_accepting(self.state)

    def find_jump_forward_string(self, limit: int = 4096) -> bytes:
        """The bytes that every continuation must start with (jump-forward decoding)."""
        compiled = self.compiled
        state = self.state
        forced = bytearray()
        while len(forced) < limit:
            byte = compiled.forced_bytes(state)
            if byte is None:
                break
            forced += byte
            state = compiled.next_state(state, byte[0])
        return bytes(forced)


def compile_grammar(grammar: Grammar, vocab: Vocabulary, **options: Any) -> CompiledGrammar:
    """Bind `grammar` to `vocab` (see `CompiledGrammar` for options)."""
    return CompiledGrammar(grammar, vocab, **options)


class GrammarCompiler:
    """Compiles grammars for one vocabulary, keeping the most recent `max_entries` compiled
    grammars (with their transition tables and masks) for reuse across requests."""

    def __init__(self, vocab: Vocabulary, *, max_entries: int = 64, **options: Any):
        self.vocab = vocab
        self.max_entries = max_entries
        self.options = options
        self._cache: OrderedDict[tuple, CompiledGrammar] = OrderedDict()

    def compile(self, grammar: Grammar) -> CompiledGrammar:
        key = grammar.key
        compiled = self._cache.get(key)
        if compiled is None:
            compiled = CompiledGrammar(grammar, self.vocab, **self.options)
            self._cache[key] = compiled
            while len(self._cache) > self.max_entries:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
        return compiled


def fill_next_token_bitmasks(matchers: Sequence[GrammarMatcher], bitmask: Any) -> list[bool]:
    """Fill one bitmask row per matcher (row i for matchers[i]); returns each row's `need`."""
    return [m.fill_next_token_bitmask(bitmask, i) for i, m in enumerate(matchers)]
