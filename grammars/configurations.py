"""A grammar's configurations over a vocabulary, determinized lazily: the states of the token
automaton and their transitions.

A *configuration* is the set of parser threads (pc, call stack) after some input; it is what
the streaming parser would hold, minus the capture logs, so the automaton accepts exactly the
parser's language. Configurations are interned as ints (0 is the dead configuration) and their
byte transitions are memoized in a dense table, so that `accept_token` is a few table lookups
(one per byte of the token). Special tokens the vocabulary lacks are read from their spelling
(`pegmask.grammars.spelling`): a configuration may hold back bytes that can still become one.
"""

from __future__ import annotations

import functools
from array import array
from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np

from pegmask.grammars.program import SPECIAL, SPECIAL_BASE, Program
from pegmask.grammars.runtime import Runtime
from pegmask.grammars.spelling import Lexeme, spelled_specials

if TYPE_CHECKING:
    from pegmask.grammars.grammar import Grammar
    from pegmask.grammars.vocab import Vocabulary

DEAD = 0
UNKNOWN = -1
_NARROW_ROOT = 8  # a configuration that reads at most this many bytes lists them (`_few_bytes`)

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


class Configurations:
    """The configurations of a grammar's program bound to a vocabulary, made as inputs reach
    them, and their transitions on bytes and special tokens (the first layer of
    `CompiledGrammar`)."""

    def __init__(self, grammar: Grammar, vocab: Vocabulary, max_depth: int):
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
        self._spelled_bytes = frozenset(byte for spelling in self.lexer.spellings
                                        for byte in spelling)  # see `_held_row`
        self._split = functools.lru_cache(maxsize=None)(self.lexer.split)
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
        # `forced_bytes` of the configurations asked (jump-forward asks every step of a row)
        self._forced: dict[int, bytes | None] = {}
        self._complete: list[bool] = [True]
        self._held: list[bytes] = [b""]
        self._base: list[int] = [DEAD]
        self._table = np.full((64, 256), UNKNOWN, dtype=np.int32)
        self._table[DEAD] = DEAD
        # Per configuration, `_plain_depth` for vector walks (`PlainText`; grown with the
        # table): -1 not known yet.
        self._plain_depths = np.full(64, -1, dtype=np.int16)
        self._plain_depths[DEAD] = 0
        self._special_next: dict[tuple[int, int], int] = {}
        self._closures: dict[tuple, int] = {}
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
        self.initial_state = self._intern_closure(((self.program.start, 0),))

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
            row[:] = self._held_row(config, held)
        elif self._lexed:
            row[:] = self._thread_row(config)
            for byte in self.lexer.first_bytes:
                row[byte] = self._after_lexemes(config, *self._split(bytes((byte,))))
        else:
            return self._thread_row(config)  # the same list
        self._complete[config] = True
        self._table[config] = row
        return row

    def _held_row(self, config: int, held: bytes) -> array:
        """The 256 transitions of a configuration holding `held` back. A byte that no spelling
        holds ends every spelling `held` may start, so the lexer splits `held` the same way
        before each such byte (then reads it as plain): those bytes read as the threads after
        that split do, one row of theirs; only the few spelled bytes are lexed one by one."""
        base, split, walk = self._base[config], self._split, self._after_lexemes
        spelled = self._spelled_bytes
        plain = next((byte for byte in range(256) if byte not in spelled), None)
        if plain is None:
            return array("i", [walk(base, *split(held + bytes((byte,)))) for byte in range(256)])
        lexemes, _ = split(held + bytes((plain,)))  # (nothing held back after a plain byte)
        flushed = self._thread_walk(base, lexemes[:-1])
        row = array("i", self._thread_row(flushed))
        for byte in spelled:
            row[byte] = walk(base, *split(held + bytes((byte,))))
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
        if config not in self._forced:
            self._forced[config] = self._find_forced_byte(config)
        return self._forced[config]

    def _find_forced_byte(self, config: int) -> bytes | None:
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

    @property
    def state_count(self) -> int:
        return len(self._threads)
