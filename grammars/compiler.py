"""Grammars bound to a vocabulary (xgrammar's compiler side): `CompiledGrammar`, and
`GrammarCompiler`, which keeps them for reuse across requests.

`CompiledGrammar` is built in layers, one concept a module, each using those below it:
`Configurations` (the lazily determinized configurations and their transitions), `PlainText`
(how much plain text a configuration survives), `TrieWalk` (walks of the vocabulary trie),
`TokenMasks` (a configuration's mask and the mask cache). Its matchers are in
`pegmask.grammars.matcher`.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from pegmask.grammars.completion import Completions, Distances
from pegmask.grammars.ir import JSON_WHITESPACE
from pegmask.grammars.limits import DEFAULT_LIMITS, GrammarLimits
from pegmask.grammars.masks import DEFAULT_MASK_CACHE_BYTES, TokenMasks
from pegmask.grammars.matcher import GrammarMatcher
from pegmask.grammars.program import accept_table
from pegmask.grammars.runtime import DEFAULT_MAX_DEPTH
from pegmask.grammars.token_trie import run_trie, token_trie

if TYPE_CHECKING:
    from pegmask.grammars.grammar import Grammar
    from pegmask.grammars.vocab import Vocabulary

DEFAULT_COMPILER_CACHE_BYTES = 1024 * 1024 * 1024
_ROW_BYTES = 1024 + 64  # an array('i') of 256 transitions and its header
_PAIR_BYTES = 72  # a (pc, stack) tuple of two small ints and its slot in a configuration
_TOKEN_NEXT_BYTES = 100  # an accepted token's entry in its configuration's dict
_SUCCESSORS_BYTES = 300  # a configuration's set of successors after plain text, and its slot


class CompiledGrammar(TokenMasks):
    """A grammar bound to a vocabulary: shared transition tables and mask cache for all the
    matchers it creates (one matcher per generation). Its closing computations walk within
    `grammar.limits`. `distances`: the grammar's `program_distances` for this vocabulary,
    where they were computed elsewhere (the engine's compile workers)."""

    def __init__(
        self,
        grammar: Grammar,
        vocab: Vocabulary,
        *,
        stop_token_ids: Iterable[int] | None = None,
        max_depth: int = DEFAULT_MAX_DEPTH,
        mask_cache_bytes: int = DEFAULT_MASK_CACHE_BYTES,
        distances: Distances | None = None,
    ):
        super().__init__(grammar, vocab, max_depth, stop_token_ids=stop_token_ids,
                         mask_cache_bytes=mask_cache_bytes)
        self._distances = distances

    def matcher(self) -> GrammarMatcher:
        return GrammarMatcher(self)

    @functools.cached_property
    def completions(self) -> Completions:
        """Shortest completions of this grammar's configurations (made on first use: the
        per-instruction distances are computed once per compiled grammar)."""
        distances, self._distances = self._distances, None
        return Completions(self, distances)

    @property
    def memory_bytes(self) -> int:
        """An estimate of the memory this grammar holds for its vocabulary: cached masks, the
        transition table and rows, the configurations' threads and accepted tokens. It grows
        as generations reach new configurations; `GrammarCompiler` bounds the sum over its
        grammars."""
        rows = len(self._rows) * (2 if self._lexed else 1)
        completions = self.__dict__.get("completions")  # (made on first use)
        return ((completions.memory_bytes if completions is not None else 0)
                + self.cached_mask_bytes + self._table.nbytes + rows * _ROW_BYTES
                + self._pair_count * _PAIR_BYTES + self._token_next_count * _TOKEN_NEXT_BYTES
                + (len(self._ascii_next) + len(self._multibyte_next)) * _SUCCESSORS_BYTES)


def prepare_vocabulary(vocab: Vocabulary) -> None:
    """Build now, once per vocabulary, what every grammar compiled for it shares and the
    first mask would otherwise build: the token trie and its split after JSON whitespace
    (0.1-0.2 s on SmolLM2 and DeepSeek V4)."""
    token_trie(vocab)
    run_trie(vocab, accept_table(JSON_WHITESPACE.ranges))


def compile_grammar(grammar: Grammar, vocab: Vocabulary, **options: Any) -> CompiledGrammar:
    """Bind `grammar` to `vocab` (see `CompiledGrammar` for options)."""
    return CompiledGrammar(grammar, vocab, **options)


class GrammarCompiler:
    """Compiles grammars for one vocabulary and keeps the compiled ones for reuse across
    requests (xgrammar's GrammarCompiler): at most `max_entries` of them, and, counted at each
    `compile`, at most `cache_limit_bytes` of their `memory_bytes` (None: no byte limit). The
    least recently compiled go first; the one just compiled always stays. Every grammar is
    compiled and closed under `limits` (`Grammar.with_limits`), whatever it was built with."""

    def __init__(self, vocab: Vocabulary, *, max_entries: int = 64,
                 cache_limit_bytes: int | None = DEFAULT_COMPILER_CACHE_BYTES,
                 limits: GrammarLimits = DEFAULT_LIMITS, **options: Any):
        if max_entries < 1:
            raise ValueError(f"max_entries must be at least 1, not {max_entries}")
        if cache_limit_bytes is not None and cache_limit_bytes < 0:
            raise ValueError(f"cache_limit_bytes must be None or at least 0, not {cache_limit_bytes}")
        prepare_vocabulary(vocab)
        self.vocab = vocab
        self.max_entries = max_entries
        self.cache_limit_bytes = cache_limit_bytes
        self.limits = limits
        self.options = options
        self._cache: OrderedDict[tuple, CompiledGrammar] = OrderedDict()

    def compile(self, grammar: Grammar) -> CompiledGrammar:
        compiled = self.cached(grammar)
        if compiled is None:
            compiled = self.keep(CompiledGrammar(grammar.with_limits(self.limits), self.vocab,
                                                 **self.options))
        return compiled

    def cached(self, grammar: Grammar) -> CompiledGrammar | None:
        """The kept compiled form of `grammar` (now the most recently used), or None."""
        key = grammar.key
        compiled = self._cache.get(key)
        if compiled is not None:
            self._cache.move_to_end(key)
            self._evict()
        return compiled

    def keep(self, compiled: CompiledGrammar) -> CompiledGrammar:
        """Keep `compiled` (made with this compiler's vocabulary and `options`, perhaps from a
        program compiled elsewhere: the engine's compile workers); returns it."""
        self._cache[compiled.grammar.key] = compiled
        self._evict()
        return compiled

    def _evict(self) -> None:
        cache, limit = self._cache, self.cache_limit_bytes
        while len(cache) > self.max_entries:
            cache.popitem(last=False)
        if limit is not None:
            held = self.cache_size_bytes
            while held > limit and len(cache) > 1:
                held -= cache.popitem(last=False)[1].memory_bytes

    @property
    def cache_size_bytes(self) -> int:
        """The `memory_bytes` of the compiled grammars kept."""
        return sum(compiled.memory_bytes for compiled in self._cache.values())

    def __len__(self) -> int:
        """How many compiled grammars are kept."""
        return len(self._cache)

    def clear_cache(self) -> None:
        self._cache.clear()
