"""Token masks: the allowed tokens of a configuration, computed once by a walk of the
vocabulary trie (`TrieWalk`) or a shortcut, then cached (LRU, bounded by bytes).

Shortcuts: inside a bounded run of JSON whitespace the mask is the union of a mask computed
elsewhere (`_run_split`) and the tokens that leave the run, found by a walk of what they hold
after it (which, where free text follows, allows the plain ones below a node at once, as walks
of the whole trie do); inside a literal, a walk of a few nodes; where plain text never dies,
every plain token at once (`PlainText`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np

from pegmask.grammars.configurations import DEAD
from pegmask.grammars.token_trie import run_rests_split, run_trie
from pegmask.grammars.trie_walk import TrieWalk
from pegmask.kernels.bitmask import pack_bool_mask, pack_token_ids

if TYPE_CHECKING:
    from pegmask.grammars.grammar import Grammar
    from pegmask.grammars.vocab import Vocabulary

DEFAULT_MASK_CACHE_BYTES = 256 * 1024 * 1024


class TokenMasks(TrieWalk):
    """Per configuration, the packed bitmask of the tokens allowed from it, stop tokens
    included where the grammar may end (the fourth layer of `CompiledGrammar`)."""

    def __init__(self, grammar: Grammar, vocab: Vocabulary, max_depth: int, *,
                 stop_token_ids: Iterable[int] | None, mask_cache_bytes: int):
        if mask_cache_bytes < 0:
            raise ValueError(f"mask_cache_bytes must be at least 0, not {mask_cache_bytes}")
        super().__init__(grammar, vocab, max_depth)
        self.words = (vocab.size + 31) // 32
        stops = vocab.eos_ids if stop_token_ids is None else tuple(stop_token_ids)
        # Stop tokens end the output without being part of it. One the grammar reads as a
        # symbol is read where the grammar reads it, and is a stop where the grammar may end
        # but does not read it.
        self.stop_ids = tuple(t for t in stops if t not in self.special_symbol)
        self._symbol_stop_ids = tuple(t for t in stops if t in self.special_symbol)
        self._mask_stop_ids = [t for t in stops if t < vocab.size]  # allowed where it may end
        self._run_splits: dict[int, tuple[int, int, bytes, int] | None] = {}
        self._masks: OrderedDict[int, tuple[np.ndarray, bool, memoryview]] = OrderedDict()
        self._mask_cache_bytes = mask_cache_bytes

    def mask(self, config: int) -> tuple[np.ndarray, bool]:
        """(packed int32 bitmask of allowed tokens, whether every ordinary token is allowed)."""
        packed, free, _ = self.cached_mask(config)
        return packed, free

    def cached_mask(self, config: int) -> tuple[np.ndarray, bool, memoryview]:
        """`mask`, plus the bytes of the packed mask (a memoryview: the cheapest copy source)."""
        cached = self._masks.get(config)
        if cached is not None:
            self._masks.move_to_end(config)
            return cached
        split = self._run_split(config)
        packed, free = self._run_mask(*split) if split is not None else self._walked_mask(config)
        entry = self._masks[config] = (packed, free, memoryview(packed).cast("B"))
        while self.cached_mask_bytes > self._mask_cache_bytes and len(self._masks) > 1:
            self._masks.popitem(last=False)
        return entry

    def _walked_mask(self, config: int) -> tuple[np.ndarray, bool]:
        """`mask` by a walk of the whole vocabulary trie (of its non-plain tokens inside text,
        and below the nodes where the walk enters text)."""
        if config == DEAD:
            return np.zeros(self.words, dtype=np.int32), False
        trie = self.trie
        extra = [token_id for token_id, symbol in self.special_symbol.items()
                 if token_id < self.vocab.size and self.next_state(config, symbol) != DEAD]
        if self._accepting[config]:
            extra += self._mask_stop_ids
        narrow = self._narrow_walk(config, trie)
        if narrow is not None:  # inside a literal, most often
            tokens = trie.tokens_of(narrow)
            return (pack_token_ids(list(set(extra).union(tokens)), self.vocab.size),
                    len(tokens) == trie.token_count)
        if self._plain_text_stays_alive(config):
            # Plain-text tokens are all allowed: only walk the other tokens, which start
            # with most bytes (a whole row costs less than resolving them in the walk);
            # where plain text loops back here, only what follows their plain prefix.
            self._row(config)
            others = trie.after_plain if self._loops_on_plain_text(config) else trie.rest
            allowed = np.zeros(self.vocab.size, dtype=bool)
            allowed[: len(trie.plain_allowed)] = trie.plain_allowed
            allowed[others.tokens_at(self._live_nodes(config, others))] = True
        else:
            cuts: list[tuple[np.ndarray, np.ndarray]] = []
            tokens = trie.tokens_at(self._live_nodes(config, trie, cuts))
            if not cuts:  # a few tokens (a literal's, a number's): only their bits are set
                free = len(tokens) == trie.token_count
                return pack_token_ids(np.union1d(tokens, extra) if extra else tokens,
                                      self.vocab.size), free
            allowed = np.zeros(self.vocab.size, dtype=bool)
            allowed[tokens] = True
            self._allow_below_cuts(allowed, trie, cuts)
        free = int(np.count_nonzero(allowed)) == trie.token_count
        allowed[extra] = True
        return pack_bool_mask(allowed, self.vocab.size), free

    def _run_split(self, config: int) -> tuple[int, int, bytes, int] | None:
        """(rest, after, class, remaining) when threads of `config` are at one instruction of a
        bounded run of a byte class (`Program.runs`: whitespace between JSON tokens; one thread
        per call site of the rule) and its other threads read no byte of the class: `rest` is
        the configuration of the other threads (which may be inside runs of other classes,
        such as a number's optional sign), `after` that of the run's exits, where no byte of
        the class may follow either, and `remaining` how many bytes of the class the run may
        still read. None otherwise."""
        if config in self._run_splits:
            return self._run_splits[config]
        runs, result = self.program.runs, None
        threads, accept_bits = self._threads[config], self._accept_bits
        if not self._held[config]:
            for pc in dict.fromkeys(thread[0] for thread in threads if thread[0] in runs):
                members = accept_bits[pc]
                others = tuple(thread for thread in threads if thread[0] != pc)
                if members & self._lexer_bits or any(accept_bits[o] & members for o, _ in others):
                    continue
                remaining, exit_pc = runs[pc]
                after = self._intern_closure(
                    tuple([(exit_pc, stack) for at, stack in threads if at == pc]))
                if not any(accept_bits[o] & members for o, _ in self._threads[after]):
                    result = (self._intern(others, self._accepting[config]), after,
                              self.program.accept[pc], remaining)
                    break
        self._run_splits[config] = result
        return result

    def _run_mask(self, rest: int, after: int, table: bytes, remaining: int
                  ) -> tuple[np.ndarray, bool]:
        """The mask of a configuration inside a run (see `_run_split`), without stepping
        through the run byte by byte: tokens that `rest` allows (they cannot start with the
        class), plus those with a leading run of at most `remaining` bytes of the class
        followed by nothing or by what `after` allows."""
        packed, free = self.mask(rest)
        run = run_trie(self.vocab, table)
        cuts: list[tuple[np.ndarray, np.ndarray]] = []
        tokens = run.rests.tokens_at(self._live_nodes(after, run.rests, cuts))
        if cuts:  # free text after the run: its plain tokens below the cuts at once
            allowed = np.zeros(self.vocab.size, dtype=bool)
            allowed[tokens] = True
            self._allow_below_cuts(
                allowed, run_rests_split(self.vocab, table, self.lexer.first_bytes), cuts)
            tokens = np.flatnonzero(allowed)
        if remaining < run.longest_lead:
            tokens = tokens[run.lead[tokens] <= remaining]
        tokens = np.concatenate([tokens, run.run_only_within(remaining)])
        return (packed | pack_token_ids(tokens, self.vocab.size),
                free and len(tokens) == run.count)

    @property
    def cached_mask_bytes(self) -> int:
        """Bytes of the cached masks (at most the `mask_cache_bytes` option, or one mask)."""
        return len(self._masks) * self.words * 4
