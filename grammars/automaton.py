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

import functools
from array import array
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from pegmask.grammars.completion import UNREACHABLE, Completions
from pegmask.grammars.grammar import Grammar
from pegmask.grammars.ir import JSON_WHITESPACE
from pegmask.grammars.program import SPECIAL, SPECIAL_BASE, Program, accept_table
from pegmask.grammars.runtime import DEFAULT_MAX_DEPTH, Runtime
from pegmask.grammars.spelling import Lexeme, spelled_specials
from pegmask.grammars.token_trie import (
    PLAIN_ASCII,
    PLAIN_MULTIBYTE,
    TokenTrie,
    run_trie,
    token_trie,
)
from pegmask.kernels.bitmask import pack_bool_mask, pack_token_ids

if TYPE_CHECKING:
    from pegmask.grammars.vocab import Vocabulary

DEAD = 0
UNKNOWN = -1
DEFAULT_MASK_CACHE_BYTES = 256 * 1024 * 1024
DEFAULT_COMPILER_CACHE_BYTES = 1024 * 1024 * 1024
_ROW_BYTES = 1024 + 64  # an array('i') of 256 transitions and its header
_PAIR_BYTES = 72  # a (pc, stack) tuple of two small ints and its slot in a configuration
_TOKEN_NEXT_BYTES = 100  # an accepted token's entry in its configuration's dict
_SUCCESSORS_BYTES = 300  # a configuration's set of successors after plain text, and its slot
_NARROW_FRONTIER = 48  # walk depth-first below a level with at most this many children to read
_CUT_FRONTIER = 512  # a walk looks for plain-text regions on a level with at least this many children
_PLAIN_SEARCH = 64  # configurations a search for plain text that dies may visit ...
_LOOP_AHEAD_SEARCH = 8  # ... and one from where text leads on to a loop (see `_plain_depth`)
_FRAME_SEARCH = 1024  # ... and one for the threads of one frame (see `_one_frame_survives`)
_PLAIN_DEPTH = 32  # characters it looks ahead for one that dies, at most
_PLAIN_DEPTH_USEFUL = 8  # fewer let walks cut nowhere: not worth searching UTF-8 sequences
_PLAIN_ALWAYS = 32767  # its answer where none dies
_NARROW_ROOT = 8  # a configuration that may read at most this many bytes steps on each
_FEW_CHILDREN = 4  # ... and looks its bytes up among a node's children (a binary search each)
                   # where the node has more than this many children per byte
_ROW_THREADS = 8  # a configuration with more threads gets ...
_ROW_AT = 8  # ... a whole row only when a walk level needs more bytes of it at once

_UNKNOWN_ROW = array("i", [UNKNOWN] * 256)
ALL_BYTES = (1 << 256) - 1
Threads = tuple[tuple[int, int], ...]  # a configuration's (pc, stack) pairs


@functools.lru_cache(maxsize=4096)
def _byte_groups(accepted: tuple[int, ...]) -> tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]:
    """The bytes some of `accepted` (sets of bytes as bits) hold, grouped by which of them hold
    each byte: (indices of those sets, the bytes), in the order of each group's first byte.
    Bytes of one group lead threads parked on those sets to one configuration.

    Found by refining a partition one set at a time: a few int operations per set and part,
    where a configuration of many threads reads a few groups."""
    union = 0
    for bits in accepted:
        union |= bits
    parts: list[tuple[int, tuple[int, ...]]] = [(union, ())]
    for index, bits in enumerate(accepted):
        refined = []
        for part, members in parts:
            inside = part & bits
            if not inside:
                refined.append((part, members))
                continue
            refined.append((inside, (*members, index)))
            if inside != part:
                refined.append((part ^ inside, members))
        parts = refined
    parts.sort(key=lambda part: part[0] & -part[0])
    return tuple((members, _bytes_in(part)) for part, members in parts if part)


def _bits(values: Iterable[int]) -> int:
    """A set of bytes as the bits of an int (byte b is bit b)."""
    return sum(1 << byte for byte in values)


@functools.lru_cache(maxsize=4096)
def _bytes_in(bits: int) -> tuple[int, ...]:
    """The bytes whose bits are set, in increasing order (memoized: literals of a grammar
    read the same few bytes)."""
    found = []
    while bits:
        low = bits & -bits
        bits ^= low
        found.append(low.bit_length() - 1)
    return tuple(found)


@functools.lru_cache(maxsize=4096)
def _bits_of(table: bytes) -> int:
    """The bytes an accept table accepts, as bits (memoized: grammars share their byte
    classes)."""
    packed = np.packbits(np.frombuffer(table, dtype=np.uint8), bitorder="little")
    return int.from_bytes(packed.tobytes(), "little")


def _flat_ranges(starts: np.ndarray, counts: np.ndarray, total: int) -> np.ndarray:
    """The indices of the ranges [starts[i], starts[i] + counts[i]), one after the other
    (`total` is the sum of `counts`)."""
    return np.repeat(starts - np.cumsum(counts) + counts, counts) + np.arange(total)


def _accept_bits(program: Program) -> list[int]:
    """Per instruction, the bytes a thread there reads (`Program.leaves`), as bits."""
    accept = program.accept
    found = [0] * len(accept)
    for pc, leaves in enumerate(program.leaves):
        if leaves:
            bits = 0
            for leaf in leaves:
                bits |= _bits_of(accept[leaf])
            found[pc] = bits
    return found


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
        if mask_cache_bytes < 0:
            raise ValueError(f"mask_cache_bytes must be at least 0, not {mask_cache_bytes}")
        self.grammar = grammar
        self.vocab = vocab
        self.program = grammar.program
        self.runtime = Runtime(self.program, max_depth)
        # Special tokens the grammar uses, by vocabulary id -> program symbol; those the
        # vocabulary lacks are read from their spelling in the bytes of ordinary tokens.
        self.special_symbol: dict[int, int] = {}
        for name in self.program.specials:
            token_id = vocab.special_ids.get(name)
            if token_id is not None:
                self.special_symbol[token_id] = self.program.special_symbol(name)
        self.lexer = spelled_specials(self.program, vocab)
        self._lexed = bool(self.lexer)  # read often: a plain attribute
        self._split = functools.lru_cache(maxsize=None)(self.lexer.split)
        self._plain_ascii = tuple(b for b in PLAIN_ASCII if b not in self.lexer.first_bytes)
        self._plain_ascii_bits = _bits(self._plain_ascii)
        self._multibyte_spelled = any(b >= 0x80 for b in self.lexer.first_bytes)
        self.trie: TokenTrie = token_trie(vocab, self.lexer.first_bytes)
        self.words = (vocab.size + 31) // 32
        stops = vocab.eos_ids if stop_token_ids is None else tuple(stop_token_ids)
        # Stop tokens end the output without being part of it. One the grammar reads as a
        # symbol is read where the grammar reads it, and is a stop where the grammar may end
        # but does not read it.
        self.stop_ids = tuple(t for t in stops if t not in self.special_symbol)
        self._symbol_stop_ids = tuple(t for t in stops if t in self.special_symbol)
        self._mask_stop_ids = [t for t in stops if t < vocab.size]  # allowed where it may end
        # Configuration store: id -> threads; key -> id; accepting flags; byte transitions
        # (as Python rows for scalar lookups and mirrored in a numpy table for vector walks).
        # With spelled specials, a configuration may also hold back bytes that can still
        # become a special token: `_held[c]` (b"" for most) after the threads of `_base[c]`;
        # such configurations have no threads of their own.
        self._threads: list[Threads] = [()]
        self._ids: dict[tuple, int] = {(False, ()): DEAD}
        self._accepting: list[bool] = [False]
        # Transitions are computed one byte at a time where a walk needs only a few (deep in
        # the trie), a whole row at a time where it needs many; `_complete` marks whole rows.
        self._rows: list[array] = [array("i", bytes(1024))]  # DEAD everywhere
        self._thread_rows: list[array] = [self._rows[0]]
        self._complete: list[bool] = [True]
        self._held: list[bytes] = [b""]
        self._base: list[int] = [DEAD]
        self._table = np.full((64, 256), UNKNOWN, dtype=np.int32)
        self._table[DEAD] = DEAD
        # Per configuration, `_plain_depth` for vector walks: -1 not known yet.
        self._plain_depths = np.full(64, -1, dtype=np.int16)
        self._plain_depths[DEAD] = 0
        self._ascii_next: dict[int, set[int] | None] = {}  # see `_after_plain_ascii`
        self._undecided: set[int] = set()  # short searches that gave up
        self._multibyte_next: dict[int, set[int] | None] = {}  # `_after_plain_multibyte`
        self._special_next: dict[tuple[int, int], int] = {}
        self._closures: dict[tuple, int] = {}
        self._run_splits: dict[int, tuple[int, int, bytes, int] | None] = {}
        self._frames_at_depth: dict[int, int] = {}  # see `_framed`
        self._multibyte_pcs: dict[int, tuple[tuple[int, ...], ...] | None] = {}  # see `_multibyte_targets`
        self._leaves = self.program.leaves
        # Per instruction, the bytes a thread there reads; per configuration, the bytes that
        # may not lead to DEAD (those its threads read, and with spelled specials their first
        # bytes): a walk skips the others without a step.
        self._accept_bits = _accept_bits(self.program)
        self._lexer_bits = _bits(self.lexer.first_bytes)
        self._live_bits: list[int] = [0]
        self._few_bytes: list[tuple[int, ...] | None] = [()]  # the live bits, if few
        self._pair_count = 0  # threads over all configurations, for `memory_bytes`
        # Per configuration, the tokens accepted from it so far and where they led: a
        # generation reads most of its tokens again from configurations it has been in.
        self._token_next: list[dict[int, int]] = [{}]
        self._token_next_count = 0
        self._masks: OrderedDict[int, tuple[np.ndarray, bool, memoryview]] = OrderedDict()
        self._mask_cache_bytes = mask_cache_bytes
        self.initial_state = self._intern_closure(((self.program.start, 0),))

    # ----------------------------------------------------------------- configurations
    def _intern(self, threads: Threads, accepting: bool) -> int:
        if not threads and not accepting:
            return DEAD
        # Closure output never repeats a (pc, stack) pair, so sorting the pairs is canonical;
        # the configuration keeps the sorted tuple of its key.
        threads = tuple(sorted(threads))
        key = (accepting, threads)
        config = self._ids.get(key)
        if config is None:
            config = self._ids[key] = self._new_config(threads, accepting, b"")
        return config

    def _new_config(self, threads: Threads, accepting: bool, held: bytes,
                    base: int | None = None) -> int:
        config = len(self._threads)
        self._threads.append(threads)
        self._accepting.append(accepting)
        row = _UNKNOWN_ROW[:]
        self._rows.append(row)
        self._thread_rows.append(_UNKNOWN_ROW[:] if self._lexed else row)
        self._complete.append(False)
        self._held.append(held)
        self._base.append(config if base is None else base)
        self._token_next.append({})
        bits, accept_bits = self._lexer_bits, self._accept_bits
        for pc, _ in threads:
            bits |= accept_bits[pc]
        self._live_bits.append(ALL_BYTES if held else bits)
        self._few_bytes.append(None if held or bits.bit_count() > _NARROW_ROOT
                               else _bytes_in(bits))
        self._pair_count += len(threads)
        if config >= len(self._table):
            grown = np.full((len(self._table) * 2, 256), UNKNOWN, dtype=np.int32)
            grown[: len(self._table)] = self._table
            self._table = grown
            depths = np.full(len(grown), -1, dtype=np.int16)
            depths[: len(self._plain_depths)] = self._plain_depths
            self._plain_depths = depths
        return config

    def _holding(self, base: int, held: bytes) -> int:
        """The configuration of `base`'s threads with `held` (a proper prefix of a special's
        spelling) held back; DEAD when no continuation of it is in the language."""
        key = ("held", base, held)
        config = self._ids.get(key)
        if config is None:
            if self._held_is_alive(base, held):
                flushed = self._thread_walk(base, held)
                config = self._new_config((), self._accepting[flushed], held, base)
            else:
                config = DEAD
            self._ids[key] = config
        return config

    def _held_is_alive(self, base: int, held: bytes) -> bool:
        """Whether some input completes `held` after `base` (a search over the held-back
        configurations it reaches, which are few: spellings are short).

        Every continuation either completes a spelling that `held` starts, or reads `held[0]`
        as a plain byte; those two checks decide most cases without the search.
        """
        for spelling, symbol in self.lexer.spellings.items():
            if (spelling.startswith(held) and self._split(spelling)[0][0][0] == symbol
                    and self._thread_step(base, symbol) != DEAD):
                return True
        if self._thread_step(base, held[0]) == DEAD:
            return False
        seen: set[tuple[int, bytes]] = set()
        todo = [(base, held)]
        while todo:
            base, held = todo.pop()
            if (base, held) in seen:
                continue
            seen.add((base, held))
            flushed = self._thread_walk(base, held)  # the input ends, or a special token comes
            if flushed != DEAD and (self._accepting[flushed] or any(
                    self._thread_step(flushed, s) != DEAD for s in self.special_symbol.values())):
                return True
            for byte in range(256):
                lexemes, rest = self._split(held + bytes((byte,)))
                nxt = self._thread_walk(base, lexemes)
                if nxt == DEAD:
                    continue
                if not rest:
                    return True
                known = self._ids.get(("held", nxt, rest))
                if known is None:
                    todo.append((nxt, rest))
                elif known != DEAD:
                    return True
        return False

    def _intern_closure(self, seeds: Threads) -> int:
        """Configuration of the closure of `seeds`; memoized, since many byte steps of
        different configurations land on the same seeds."""
        config = self._closures.get(seeds)
        if config is None:
            config = self._closures[seeds] = self._intern(*self.runtime.reach(seeds))
        return config

    def _row(self, config: int) -> array:
        """All 256 byte transitions of `config` (through the spelled-specials lexer, if the
        grammar has any), computed on first use."""
        row = self._rows[config]
        if self._complete[config]:
            return row
        held = self._held[config]
        if held:
            base, split, walk = self._base[config], self._split, self._after_lexemes
            row[:] = array("i", [walk(base, *split(held + bytes((byte,)))) for byte in range(256)])
        elif self._lexed:
            row[:] = self._thread_row(config)
            for byte in self.lexer.first_bytes:
                row[byte] = self._after_lexemes(config, *self._split(bytes((byte,))))
        else:
            return self._thread_row(config)  # the same list
        self._complete[config] = True
        self._table[config] = row
        return row

    def _step(self, config: int, byte: int) -> int:
        """One byte transition of `config` (`_row(config)[byte]` without the whole row)."""
        row = self._rows[config]
        nxt = row[byte]
        if nxt != UNKNOWN:
            return nxt
        if not self._lexed:
            return self._thread_byte(config, byte)  # fills this row
        held = self._held[config]
        if held:
            nxt = self._after_lexemes(self._base[config], *self._split(held + bytes((byte,))))
        elif byte in self.lexer.first_bytes:
            nxt = self._after_lexemes(config, *self._split(bytes((byte,))))
        else:
            nxt = self._thread_byte(config, byte)
        row[byte] = nxt
        self._table[config, byte] = nxt
        return nxt

    def _thread_row(self, config: int) -> array:
        """The 256 byte transitions of a configuration's threads, read as plain bytes.

        Bytes accepted by the same subset of threads lead to the same configuration, so the
        runtime steps once per distinct subset (a handful), not once per byte.
        """
        row = self._thread_rows[config]
        if self._complete[config] or (self._lexed and UNKNOWN not in row):
            return row
        full = array("i", bytes(1024))
        for group, nxt in self._group_steps(config, ALL_BYTES):
            for byte in group:
                full[byte] = nxt
        row[:] = full
        if not self._lexed:
            self._complete[config] = True
            self._table[config] = row
        return row

    def _group_steps(self, config: int, wanted: int) -> list[tuple[tuple[int, ...], int]]:
        """(bytes, next configuration) for each group of the bytes among the bits `wanted` that
        the same threads of `config` accept (`_byte_groups`): one closure per group, read as
        plain bytes."""
        arg, accept_bits, leaves = self.program.arg, self._accept_bits, self._leaves
        movers = [(leaf, stack) for pc, stack in self._threads[config]
                  if accept_bits[pc] & wanted for leaf in leaves[pc] if accept_bits[leaf] & wanted]
        moved = [(arg[leaf], stack) for leaf, stack in movers]
        key = tuple([accept_bits[leaf] & wanted for leaf, _ in movers])
        return [(group, self._intern_closure(tuple([moved[i] for i in indices])))
                for indices, group in _byte_groups(key)]

    def _thread_byte(self, config: int, byte: int) -> int:
        """One byte transition of a configuration's threads, read as a plain byte."""
        row = self._thread_rows[config]
        nxt = row[byte]
        if nxt == UNKNOWN:
            arg, accept, leaves = self.program.arg, self.program.accept, self._leaves
            seeds = tuple([(arg[leaf], stack) for pc, stack in self._threads[config]
                           for leaf in leaves[pc] if accept[leaf][byte]])
            nxt = row[byte] = self._intern_closure(seeds) if seeds else DEAD
            if not self._lexed:
                self._table[config, byte] = nxt
        return nxt

    def _thread_step(self, config: int, symbol: int) -> int:
        """The threads of `config` after one symbol, read as such (no lexing)."""
        if config == DEAD:
            return DEAD
        if symbol < SPECIAL_BASE:
            return self._thread_byte(config, symbol)
        key = (config, symbol)
        nxt = self._special_next.get(key)
        if nxt is None:
            program = self.program
            seeds = tuple([(program.arg[pc], stack) for pc, stack in self._threads[config]
                           if program.kind[pc] == SPECIAL and program.aux[pc] == symbol])
            nxt = self._special_next[key] = self._intern_closure(seeds) if seeds else DEAD
        return nxt

    def _thread_walk(self, config: int, symbols: Iterable[int] | Iterable[Lexeme]) -> int:
        """`_thread_step` over several symbols (bytes, or lexemes)."""
        for symbol in symbols:
            config = self._thread_step(config, symbol if isinstance(symbol, int) else symbol[0])
            if config == DEAD:
                break
        return config

    def _after_lexemes(self, base: int, lexemes: tuple[Lexeme, ...], held: bytes) -> int:
        nxt = self._thread_walk(base, lexemes)
        return self._holding(nxt, held) if held and nxt != DEAD else nxt

    def next_state(self, config: int, symbol: int) -> int:
        """Configuration after consuming one symbol (byte or special symbol). Bytes held back
        before a special token are plain bytes."""
        if symbol < SPECIAL_BASE:
            return self._step(config, symbol)
        if self._held[config]:
            config = self._thread_walk(self._base[config], self._held[config])
        return self._thread_step(config, symbol)

    def state_after_token(self, config: int, token_id: int) -> int:
        """Configuration after a whole token (DEAD if the token is not allowed)."""
        symbol = self.special_symbol.get(token_id)
        if symbol is not None:
            return self.next_state(config, symbol)
        data = self.vocab.token_bytes[token_id] if token_id < len(self.vocab.token_bytes) else None
        if not data:
            return DEAD
        rows, step = self._rows, self._step
        for byte in data:
            nxt = rows[config][byte]
            config = step(config, byte) if nxt == UNKNOWN else nxt
            if config == DEAD:
                return DEAD
        return config

    def is_accepting(self, config: int) -> bool:
        return self._accepting[config]

    def can_continue(self, config: int) -> bool:
        return bool(self._threads[config]) or bool(self._held[config])

    def forced_bytes(self, config: int) -> bytes | None:
        """The single byte every continuation must start with, or None."""
        if self._accepting[config]:
            return None
        if self._lexed:  # read off the lexed transitions
            if any(self.next_state(config, s) != DEAD for s in self.special_symbol.values()):
                return None
            row = self._row(config)
            live = [byte for byte in range(256) if row[byte] != DEAD]
            return bytes(live) if len(live) == 1 else None
        kind = self.program.kind
        allowed: set[int] = set()
        for pc, _ in self._threads[config]:
            if kind[pc] == SPECIAL:
                return None
            allowed.update(_bytes_in(self._accept_bits[pc]))
            if len(allowed) > 1:
                return None
        return bytes(allowed) if allowed else None

    # ----------------------------------------------------------------- masks
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
        tokens = run.rests.tokens_at(self._live_nodes(after, run.rests))
        if remaining < run.longest_lead:
            tokens = tokens[run.lead[tokens] <= remaining]
        tokens = np.concatenate([tokens, run.run_only_within(remaining)])
        return (packed | pack_token_ids(tokens, self.vocab.size),
                free and len(tokens) == run.count)

    def _plain_text_stays_alive(self, config: int) -> bool:
        """Whether no plain text (see `token_trie.is_plain_text`) leads from `config` to DEAD,
        so that every plain token is allowed from it."""
        return self._plain_depth(config) == _PLAIN_ALWAYS

    def _plain_depth(self, config: int, search: int | None = None) -> int:
        """How many plain characters any plain text can read from `config` without dying (a
        lower bound, at most `_PLAIN_DEPTH`), `_PLAIN_ALWAYS` where no plain text dies: a walk
        allows every plain token below a node whose longest token after it is not longer
        (`TokenTrie.height`).

        Found by a breadth-first search of the configurations that plain characters reach:
        inside a JSON string or free text that is `config` itself; in a pattern such as
        `^.+\\.(csv|tsv)$` or a key that counts hex digits a few dozen; in a string of bounded
        length one per character up to its bound. ASCII steps are per group of bytes the
        same threads accept, UTF-8 sequences on thread sets. Every configuration of a search
        where nothing dies is `_PLAIN_ALWAYS` too; a search stops at the first character
        that may die, and one past `_PLAIN_SEARCH` configurations at that depth. Where a
        plain ASCII byte leads on to another configuration that loops on ASCII, a search
        past `_LOOP_AHEAD_SEARCH` gives up (0, not kept: other searches may cross it).
        `search` sets a limit of configurations instead, for a search that never gives up
        (`_one_frame_survives`).
        """
        known = int(self._plain_depths[config])
        if known >= 0:
            return known
        after = self._after_plain_ascii(config)
        # Text that leads on to a configuration that loops on it gets a short search: a key
        # beside a pattern's keys (a few configurations) is decided by it; one beside the
        # properties' names is not (but one frame of it may be), and walks stop at the loop,
        # at less cost than a search of every name.
        short = search is None and after is not None and after != {config} and any(
            self._after_plain_ascii(nxt) == {nxt} for nxt in after if nxt != config)
        if short and config in self._undecided:
            return 0
        if short and self._one_frame_survives(config):
            self._plain_depths[config] = _PLAIN_ALWAYS
            return _PLAIN_ALWAYS
        limit = search or (_LOOP_AHEAD_SEARCH if short else _PLAIN_SEARCH)
        dies, complete = self._ascii_look_ahead(config, _PLAIN_DEPTH_USEFUL, limit)
        if dies:
            self._plain_depths[config] = 0  # a lower bound: walks cut nowhere near it anyway
            return 0
        if short and not complete:
            self._undecided.add(config)
            return 0
        level = {config: 0}
        order = [config]  # grows while it is read: levels never decrease
        depth = _PLAIN_ALWAYS
        for current in order:
            here = level[current]
            if here >= min(depth, _PLAIN_DEPTH):
                depth = min(depth, here)
                break
            ascii_next = self._after_plain_ascii(current)
            multibyte_next = None if ascii_next is None else self._after_plain_multibyte(current)
            if ascii_next is None or multibyte_next is None:  # a character dies after `here`
                depth = here
                break
            for nxt in ascii_next | multibyte_next:
                known = int(self._plain_depths[nxt])  # (grown as configurations are made)
                if nxt in level or known == _PLAIN_ALWAYS:
                    continue
                if known >= 0:
                    depth = min(depth, here + 1 + known)
                elif len(order) < limit:
                    level[nxt] = here + 1
                    order.append(nxt)
                elif short:
                    self._undecided.add(config)
                    return 0
                else:
                    depth = min(depth, here + 1)
        if depth == _PLAIN_ALWAYS:
            self._plain_depths[order] = _PLAIN_ALWAYS
        else:
            self._plain_depths[config] = depth
        return depth

    def _one_frame_survives(self, config: int) -> bool:
        """Whether the threads of `config` at or above the deepest frame of their call stacks
        (a rule call and what it calls) whose threads read every plain ASCII byte, when not
        all of them, survive all plain text by themselves (see `_framed`): then `config`
        does too.

        A key beside the properties' names is such a configuration: its "any other key"
        threads are one rule's (the object's extra member, with the character rules it
        calls), and plain text never kills them; the names' threads die soon. The search of
        `_plain_depth` from the configuration itself visits every prefix of every name, at
        each key; that of the extra member's threads is the same at every key of the
        object, and made once."""
        threads = self._threads[config]
        if len(threads) < 2 or self._lexed:  # (held bytes live on where the input may end)
            return False
        parent, depth = self.runtime.stacks.parent, self.runtime.stacks.depth
        accept_bits = self._accept_bits
        covered: dict[int, int] = {}  # frame -> bytes its threads (at or above it) read
        for pc, stack in threads:
            bits = accept_bits[pc]
            while stack:
                covered[stack] = covered.get(stack, 0) | bits
                stack = parent[stack]
        wanted = self._plain_ascii_bits
        frames = [frame for frame, bits in covered.items() if not wanted & ~bits]
        if not frames:
            return False
        # The deepest such frame only: the frames below it hold more threads, and searching
        # each of them too multiplied the searches where names are many (hundreds of rules).
        framed = self._framed(threads, max(frames, key=depth.__getitem__))
        return framed is not None and self._plain_depth(framed, _FRAME_SEARCH) == _PLAIN_ALWAYS

    def _framed(self, threads: Threads, frame: int) -> int | None:
        """The configuration of the `threads` at or above `frame`, with `frame` and the frames
        below it replaced by as many that return to MATCH (the end of the input); None when
        that is all of them. Up to their return from `frame` they read what they read on
        their own stacks, and nothing after it: whatever plain text they survive, `threads`
        survive too (and calls meet the depth limit at the same depth)."""
        stacks = self.runtime.stacks
        parent, depth, ret = stacks.parent, stacks.depth, stacks.ret
        level = depth[frame]
        base = self._frames_at_depth.get(level)
        if base is None:
            end = self.program.aux[self.program.start]  # the MATCH after the start rule's call
            base = 0
            for _ in range(level):
                base = stacks.push(end, base)
            self._frames_at_depth[level] = base
        moved = []
        for pc, stack in threads:
            above = []
            while depth[stack] > level:
                above.append(ret[stack])
                stack = parent[stack]
            if stack == frame:
                stack = base
                for address in reversed(above):
                    stack = stacks.push(address, stack)
                moved.append((pc, stack))
        return None if len(moved) == len(threads) else self._intern(tuple(moved), False)

    def _ascii_look_ahead(self, config: int, characters: int, limit: int) -> tuple[bool, bool]:
        """(whether some plain ASCII text of at most `characters` bytes leads `config` to DEAD,
        whether the configurations shorter texts reach are at most `limit`): where text
        dies soon (a pattern's states) or branches widely (keys beside the properties'
        names), `_plain_depth` needs no search of UTF-8 sequences."""
        level = {config: 0}
        order = [config]
        for current in order:
            if level[current] == characters:
                break
            reached = self._after_plain_ascii(current)
            if reached is None:
                return True, True
            for nxt in reached:
                if nxt not in level and self._plain_depths[nxt] != _PLAIN_ALWAYS:
                    if len(order) == limit:
                        return False, False
                    level[nxt] = level[current] + 1
                    order.append(nxt)
        return False, True

    def _loops_on_plain_text(self, config: int) -> bool:
        """Whether every plain character leads `config` back to itself (inside a string)."""
        return (self._after_plain_ascii(config) == {config}
                and self._after_plain_multibyte(config) == {config})

    def _after_plain_ascii(self, config: int) -> set[int] | None:
        """The configurations that one plain ASCII byte leads `config` to; None when one leads
        to DEAD (or `config` holds bytes back for a spelled special). Memoized, as searches
        that give up cross the same configurations again.

        Computed per group of bytes that the same threads accept (one closure each, often a
        single group), and kept as those bytes' transitions, without the rest of the row."""
        if config in self._ascii_next:
            return self._ascii_next[config]
        result = None
        if not (self._plain_ascii_bits & ~self._live_bits[config] or self._held[config]):
            row = self._thread_rows[config]
            result = set()
            for group, nxt in self._group_steps(config, self._plain_ascii_bits):
                result.add(nxt)
                for byte in group:
                    row[byte] = nxt
                if not self._lexed:
                    self._table[config, group] = nxt
        self._ascii_next[config] = result
        return result

    def _after_plain_multibyte(self, config: int) -> set[int] | None:
        """The configurations that one plain non-ASCII character leads `config` to; None when
        one leads to DEAD. Memoized: it costs a few dozen closures."""
        if config in self._multibyte_next:
            return self._multibyte_next[config]
        reached = self._threads_after_multibyte(config)
        if reached is None:  # decided on the lexed transitions, configuration by configuration
            reached = set()
            for sequence in PLAIN_MULTIBYTE:
                states = {config}
                for lo, hi in sequence:
                    states = {nxt for s in states for nxt in self._row(s)[lo : hi + 1]}
                    if DEAD in states:
                        break
                reached |= states
        result = None if DEAD in reached else reached
        self._multibyte_next[config] = result
        return result

    def _threads_after_multibyte(self, config: int) -> set[int] | None:
        """`_after_plain_multibyte` on thread sets, with DEAD for a character that dies: each
        byte range of a plain UTF-8 sequence moves the threads that accept all of it, and no
        configuration is made for the states inside a character (a string at a new call site
        would make a dozen). None when that cannot decide: a thread accepts part of a range,
        or a byte may start a spelled special.

        Where the bytes of a character are read by instructions that lead to one another (a
        character class), the threads are followed to the end of each sequence by
        `_multibyte_targets`, and only there closed on their stacks."""
        if self._multibyte_spelled:
            return None
        bits = self._accept_bits
        # Only threads that read some byte past ASCII take part (most threads of a large
        # object's keys read only letters).
        threads = tuple([thread for thread in self._threads[config] if bits[thread[0]] >> 0x80])
        targets = [self._multibyte_targets(pc) for pc, _ in threads]
        if None in targets:
            return self._threads_after_multibyte_stepwise(threads)
        found = set()
        for sequence in range(len(PLAIN_MULTIBYTE)):
            seeds = tuple([(target, stack) for (_, stack), ends in zip(threads, targets, strict=True)
                           for target in ends[sequence]])
            if not seeds:
                return {DEAD}
            found.add(self._intern_closure(seeds))
        return found

    def _multibyte_targets(self, pc: int) -> tuple[tuple[int, ...], ...] | None:
        """Per plain UTF-8 sequence, the instructions that a thread waiting at `pc` goes to
        after the sequence's last byte, where each of its other bytes leads to instructions
        that wait for the next one (with no call or return between them: the same on every
        stack, so found once per instruction); None where one does not, or where one
        accepts part of a byte range (see `_threads_after_multibyte_stepwise`)."""
        if pc in self._multibyte_pcs:
            return self._multibyte_pcs[pc]
        parks = self.program.parks
        found: list[tuple[int, ...]] | None = []
        for sequence in PLAIN_MULTIBYTE:
            current: tuple[int, ...] = (pc,)
            for index, (lo, hi) in enumerate(sequence):
                reached: dict[int, None] = {}
                for at in current:
                    targets = self._range_targets(at, lo, hi)
                    if targets is None:
                        found = None
                        break
                    reached.update(dict.fromkeys(targets))
                current = tuple(reached)
                if found is None or (index + 1 < len(sequence)
                                     and not all(parks[at] for at in current)):
                    found = None
                    break
            if found is None:
                break
            found.append(current)
        result = None if found is None else tuple(found)
        self._multibyte_pcs[pc] = result
        return result

    def _range_targets(self, pc: int, lo: int, hi: int) -> list[int] | None:
        """Where a thread waiting at `pc` goes on any byte from `lo` to `hi` (the instructions
        after its BYTEs that accept all of them); None where one accepts only some."""
        bits, arg, span = self._accept_bits, self.program.arg, ((1 << (hi - lo + 1)) - 1) << lo
        targets = []
        for leaf in self._leaves[pc]:
            accepted = bits[leaf] & span
            if accepted == span:
                targets.append(arg[leaf])
            elif accepted:
                return None
        return targets

    def _threads_after_multibyte_stepwise(self, threads: Threads) -> set[int] | None:
        """`_threads_after_multibyte` by closures after every byte range."""
        # By thread set and range: sequences whose lead bytes lead to the same instruction
        # (the compiler shares continuations) share the steps after it.
        moved: dict[tuple, tuple[Threads, bool]] = {}
        ends: set[tuple[Threads, bool]] = set()
        for sequence in PLAIN_MULTIBYTE:
            current, matched = threads, False
            for lo, hi in sequence:
                known = moved.get((current, lo, hi))
                if known is None:
                    seeds = []
                    for pc, stack in current:
                        targets = self._range_targets(pc, lo, hi)
                        if targets is None:
                            return None
                        seeds += [(target, stack) for target in targets]
                    if not seeds:
                        return {DEAD}
                    known = moved[current, lo, hi] = self.runtime.reach(tuple(seeds))
                current, matched = known
            ends.add((current, matched))
        return {self._intern(current, matched) for current, matched in ends}

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

    def matcher(self) -> GrammarMatcher:
        return GrammarMatcher(self)

    @functools.cached_property
    def completions(self) -> Completions:
        """Shortest completions of this grammar's configurations (made on first use: the
        per-instruction distances are computed once per compiled grammar)."""
        return Completions(self)

    @property
    def state_count(self) -> int:
        return len(self._threads)

    @property
    def cached_mask_bytes(self) -> int:
        """Bytes of the cached masks (at most the `mask_cache_bytes` option, or one mask)."""
        return len(self._masks) * self.words * 4

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


class GrammarMatcher:
    """Per-generation cursor over a `CompiledGrammar` (xgrammar's GrammarMatcher shape)."""

    def __init__(self, compiled: CompiledGrammar):
        self.compiled = compiled
        self._masks = compiled._masks
        self.reset()

    def reset(self) -> None:
        self._history: list[int] = [self.compiled.initial_state]
        self._terminated = False
        # What the next mask is for: the last configuration, DEAD once terminated (read
        # on every fill, so kept apart from the history).
        self._state = self.compiled.initial_state
        self._bitmask: Any = None
        self._bitmask_view: np.ndarray | None = None
        self._bitmask_bytes: memoryview | None = None  # of a C-contiguous bitmask
        self._row_bytes = self._row_count = 0
        self._row_index: int | None = None  # the row `_row_slice` is for
        self._row_slice = slice(0)

    @property
    def state(self) -> int:
        return self._history[-1]

    def fill_next_token_bitmask(self, bitmask: Any, index: int = 0) -> bool:
        """Write the allowed-token mask into row `index` of `bitmask` (torch CPU or numpy int32).

        Returns False when every ordinary token is allowed (an unconstrained, lazy region: the
        caller may skip applying the mask); the row is filled exactly either way.
        """
        # The warm path is a dictionary hit and a byte copy: each line here costs a few
        # percent of it, so the cache is read directly and the bitmask's views are kept.
        state = self._state
        entry = self._masks.get(state)
        if entry is None:
            entry = self.compiled.cached_mask(state)
        else:
            self._masks.move_to_end(state)  # least recently used goes first
        if bitmask is not self._bitmask:  # views of a tensor cost microseconds: made once
            self._bind(bitmask)
        raw = entry[2]
        if index == self._row_index:
            self._bitmask_bytes[self._row_slice] = raw
            return not entry[1]
        size = self._row_bytes
        if size == len(raw) and 0 <= index < self._row_count:  # half numpy's cost
            self._row_index, self._row_slice = index, slice(index * size, (index + 1) * size)
            self._bitmask_bytes[self._row_slice] = raw
            return not entry[1]
        self._copy_row(entry[0], index)
        return not entry[1]

    def _copy_row(self, packed: np.ndarray, index: int) -> None:
        """Write `packed` into row `index` of the bound bitmask (zeros past the vocabulary
        where the logits are wider)."""
        target = self._bitmask_view[index]
        width = len(packed)
        if len(target) == width:
            target[:] = packed
        else:
            width = min(width, len(target))
            target[:width] = packed[:width]
            target[width:] = 0

    # ----------------------------------------------------------------- closing under a budget
    def completion_distance(self) -> int | None:
        """The fewest symbols that complete the grammar from here (bytes; a special token the
        vocabulary has counts one, one it lacks the bytes of its spelling): 0 where the grammar
        may end (free text of a lazy grammar included, and after a stop token), None where no
        input completes it."""
        if self._terminated:
            return 0
        distance = self.compiled.completions.distance(self._state)
        return None if distance >= UNREACHABLE else distance

    def shortest_completion(self) -> list[bytes | int]:
        """One completion of `completion_distance` symbols, as runs of bytes and special-token
        ids (a special the vocabulary lacks is in the bytes, spelled); [] where the grammar may
        end. Raises `GrammarError` where no input completes the grammar."""
        return [] if self._terminated else self.compiled.completions.pieces(self._state)

    def completion_tokens(self) -> list[int]:
        """The fewest tokens that spell `shortest_completion` (`accept_tokens` takes them, and
        the grammar may end after them). After the first of them, this is the rest of them:
        each token of the plan shortens it by one. Raises `GrammarError` where no input
        completes the grammar."""
        return [] if self._terminated else self.compiled.completions.plan(self._state)

    def completion_token_count(self) -> int | None:
        """`len(completion_tokens())`, memoized per configuration; None where no input
        completes the grammar."""
        if self._terminated:
            return 0
        count = self.compiled.completions.plan_length(self._state)
        return None if count >= UNREACHABLE else count

    def fill_closing_bitmask(self, bitmask: Any, index: int, remaining: int) -> None:
        """Write into row `index` the tokens that close the output within `remaining` tokens
        (this one included): allowed tokens that lower `completion_distance` and leave a
        completion of at most `remaining - 1` tokens (`completion_token_count`); where the
        distance is 0, the stop tokens that end the output here (not one the grammar also reads
        as a symbol and would go on with: then none, and the output can only be cut here).

        With `remaining >= completion_token_count() > 0` the row is never empty (the plan's
        first token is in it) and sampling from such rows ends in a complete parse within the
        budget; with less, the row is that of `remaining = completion_token_count()` (the
        quickest way to a complete parse). No tokens where no input completes the grammar."""
        if bitmask is not self._bitmask:
            self._bind(bitmask)
        compiled = self.compiled
        count = self.completion_token_count()
        if count is None or self._terminated:
            tokens: Sequence[int] = []
        elif count == 0:
            tokens = [t for t in compiled._mask_stop_ids if t in compiled.stop_ids
                      or compiled.state_after_token(self._state, t) == DEAD]
        else:
            candidates, lengths = compiled.completions.closing_candidates(self._state)
            tokens = candidates[lengths <= max(remaining, count) - 1]
        self._copy_row(pack_token_ids(tokens, compiled.vocab.size), index)

    def _bind(self, bitmask: Any) -> None:
        self._bitmask = bitmask
        view = bitmask.numpy() if hasattr(bitmask, "numpy") else bitmask
        self._bitmask_view = view
        if view.ndim == 2 and view.dtype == np.int32 and view.flags.c_contiguous:
            self._bitmask_bytes = memoryview(view).cast("B")
            self._row_count, self._row_bytes = view.shape[0], view.shape[1] * 4
        else:
            self._bitmask_bytes, self._row_count, self._row_bytes = None, 0, 0
        self._row_index = None  # the row slice was for the bitmask bound before

    def accept_token(self, token_id: int) -> bool:
        """Advance by one token; returns False (state unchanged) if it is not allowed."""
        if self._terminated:
            return False
        compiled, state = self.compiled, self._state
        nxt = compiled._token_next[state].get(token_id)
        if nxt is None:
            if token_id in compiled.stop_ids and compiled._accepting[state]:
                return self._stop()
            nxt = compiled.state_after_token(state, token_id)
            if nxt == DEAD:
                if token_id in compiled._symbol_stop_ids and compiled._accepting[state]:
                    return self._stop()
                return False
            compiled._token_next[state][token_id] = nxt
            compiled._token_next_count += 1
        self._history.append(nxt)
        self._state = nxt
        return True

    def _stop(self) -> bool:
        self._history.append(self._state)
        self._terminated, self._state = True, DEAD
        return True

    @property
    def stopped(self) -> bool:
        """Whether a stop token ended the generation (it is not part of the output)."""
        return self._terminated

    def accept_tokens(self, token_ids: Sequence[int]) -> bool:
        """Accept several tokens; on the first rejected one, undo them all and return False."""
        for count, token_id in enumerate(token_ids):
            if not self.accept_token(token_id):
                self.rollback(count)
                return False
        return True

    def accept_string(self, text: str | bytes) -> bool:
        """Advance by raw text bytes (used for jump-forward); False and no change if rejected."""
        if self._terminated:
            return False
        data = text.encode() if isinstance(text, str) else text
        state = self._state
        for byte in data:
            state = self.compiled.next_state(state, byte)
            if state == DEAD:
                return False
        self._history.append(state)
        self._state = state
        return True

    def rollback(self, num_tokens: int = 1) -> None:
        """Undo the last `num_tokens` accepted tokens (or strings)."""
        if num_tokens < 0 or num_tokens >= len(self._history):
            raise ValueError(f"cannot roll back {num_tokens} tokens (have {len(self._history) - 1})")
        if num_tokens:
            del self._history[-num_tokens:]
            self._terminated = False
            self._state = self._history[-1]

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
    least recently compiled go first; the one just compiled always stays."""

    def __init__(self, vocab: Vocabulary, *, max_entries: int = 64,
                 cache_limit_bytes: int | None = DEFAULT_COMPILER_CACHE_BYTES, **options: Any):
        if max_entries < 1:
            raise ValueError(f"max_entries must be at least 1, not {max_entries}")
        if cache_limit_bytes is not None and cache_limit_bytes < 0:
            raise ValueError(f"cache_limit_bytes must be None or at least 0, not {cache_limit_bytes}")
        prepare_vocabulary(vocab)
        self.vocab = vocab
        self.max_entries = max_entries
        self.cache_limit_bytes = cache_limit_bytes
        self.options = options
        self._cache: OrderedDict[tuple, CompiledGrammar] = OrderedDict()

    def compile(self, grammar: Grammar) -> CompiledGrammar:
        key = grammar.key
        compiled = self._cache.get(key)
        if compiled is None:
            compiled = self._cache[key] = CompiledGrammar(grammar, self.vocab, **self.options)
        else:
            self._cache.move_to_end(key)
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


def fill_next_token_bitmasks(matchers: Sequence[GrammarMatcher], bitmask: Any) -> list[bool]:
    """Fill one bitmask row per matcher (row i for matchers[i]); returns each row's `need`."""
    return [m.fill_next_token_bitmask(bitmask, i) for i, m in enumerate(matchers)]
