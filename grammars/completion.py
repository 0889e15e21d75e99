"""Shortest completions: how few symbols finish a grammar from a configuration, and which.

Why: a generation that reaches `max_tokens` inside a constrained region should still end in a
complete parse. The engine steers it there with three figures per configuration of the token
automaton: the *distance* (the fewest symbols that complete the grammar: bytes, and special
tokens the vocabulary has, one each; a special it lacks is its spelling's bytes), one shortest
completion (the *witness*), and the fewest tokens that spell that witness (the *plan*).

Two levels:

* Per program (`instruction_distances`, once per compiled grammar): for every instruction the
  fewest symbols from it to its rule's return, by Knuth's generalization of Dijkstra's
  algorithm (a CALL costs its callee's entry plus its return address). A thread's bound is its
  instruction's figure plus that of every return address on its stack; a configuration's is
  the least over its threads, 0 where it accepts.
* Per configuration (`Completions`): that bound ignores what the automaton adds to the program:
  the spelled-specials lexer (held-back bytes, text that may not spell a special) and the
  depth limit. So the distance is proven on the automaton's own transitions: a chain of them,
  each lowering the bound by one, that ends where the grammar may end (the bound is then
  exact along the whole chain); where no such chain is found, an A* search with the bound as
  its heuristic finds the exact figure. The chain's transitions are kept per configuration,
  so the witness from any configuration continues the witness of the one before it: the
  plan's tokens lead from plan to plan, each one token shorter.

Bounded work: the per-program figures are numbers, however many symbols they count (a
counted repetition's `x{1000000000}` is a figure of its rules, not a walk), kept at most
`_FAR`. Only the per-configuration proof walks, one configuration per symbol, so it is
refused (`GrammarTooLarge`, `GrammarLimits.max_completion_length`) where the lower bound is
already past the budget; `token_floor` answers "can this fit in so many tokens" without any
walk (the engine's check at prepare time).
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

import numpy as np

from pegmask.grammars.configurations import DEAD
from pegmask.grammars.errors import GrammarError
from pegmask.grammars.program import (
    BYTE,
    CALL,
    MATCH,
    RET,
    SPECIAL,
    SPECIAL_BASE,
    SPLIT,
    Program,
)

if TYPE_CHECKING:
    from pegmask.grammars.compiler import CompiledGrammar
    from pegmask.grammars.spelling import SpellingLexer

# Per instruction, the fewest symbols to its rule's return, and the instruction a shortest
# path goes on to (`instruction_distances`).
Distances = tuple[list[int], list[int]]

UNREACHABLE = 1 << 62  # the distance where no completion exists
# Finite figures are kept at most this: beyond any budget, a lower bound still, and two of
# them add up below UNREACHABLE (and within int64).
_FAR = 1 << 60
_NO_BYTE = bytes(256)  # the accept table of the empty union
_ENTRY_BYTES = 100  # a memoized figure: its dictionary slot and its int or tuple
_SEARCH_LIMIT = 20_000  # configurations an exact search may expand before it gives up


def _add(a: int, b: int) -> int:
    """`a + b` for figures: UNREACHABLE if either is, else at most `_FAR`."""
    total = a + b
    return UNREACHABLE if total >= UNREACHABLE else min(total, _FAR)


# Bytes a witness prefers where a class allows several (readable ones first).
_PREFERRED = (b"abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ "
              + bytes(b for b in range(0x21, 0x7F) if not chr(b).isalnum())
              + bytes(range(0x80, 0x100)) + bytes(range(0x20)) + b"\x7f")


def instruction_distances(program: Program, special_cost: Mapping[int, int]) -> Distances:
    """Per instruction, the fewest symbols from it to its rule's return (RET, or MATCH for the
    start rule's caller), UNREACHABLE where none; and the instruction a shortest path goes on
    to (a SPLIT's chosen alternative; -1 for CALL, RET, MATCH and unreachable ones).

    `special_cost[symbol]` is what reading special `symbol` costs. Instructions are settled in
    order of distance, each from a successor settled before it, so following `via` never
    loops (epsilon cycles included)."""
    kind, arg, aux, targets, accept = (program.kind, program.arg, program.aux, program.targets,
                                       program.accept)
    size = len(kind)
    before: list[list[int]] = [[] for _ in range(size)]  # instructions that lead to each
    for pc in range(size):
        k = kind[pc]
        if k == SPLIT:
            for target in targets[pc]:
                before[target].append(pc)
        elif k == CALL:
            before[arg[pc]].append(pc)
            before[aux[pc]].append(pc)
        elif k == BYTE:
            if accept[pc] != _NO_BYTE:  # (the empty union reads no byte)
                before[arg[pc]].append(pc)
        elif k not in (RET, MATCH):
            before[arg[pc]].append(pc)
    dist = [UNREACHABLE] * size
    via = [-1] * size
    settled = bytearray(size)
    heap: list[tuple[int, int]] = []
    for pc in range(size):
        if kind[pc] in (RET, MATCH):
            dist[pc] = 0
            heap.append((0, pc))
    heapq.heapify(heap)
    while heap:
        here, pc = heapq.heappop(heap)
        if settled[pc]:
            continue
        settled[pc] = 1
        for prev in before[pc]:
            if settled[prev]:
                continue
            k = kind[prev]
            if k == CALL:
                entry, back = arg[prev], aux[prev]
                if not (settled[entry] and settled[back]):
                    continue
                candidate = _add(dist[entry], dist[back])
            elif k == BYTE:
                candidate = here + 1
            elif k == SPECIAL:
                candidate = here + special_cost[aux[prev]]
            else:
                candidate = here
            if candidate < dist[prev]:
                dist[prev] = candidate
                via[prev] = -1 if k == CALL else pc
                heapq.heappush(heap, (candidate, prev))
    return dist, via


def program_distances(program: Program, lexer: SpellingLexer) -> Distances:
    """`instruction_distances` where specials the vocabulary has cost one symbol and those it
    lacks (spelled by `lexer`) their spelling's bytes: all a grammar's `Completions` need of
    the vocabulary beforehand, so the engine computes them in its compile workers."""
    cost = {SPECIAL_BASE + i: 1 for i in range(len(program.specials))}
    cost.update({symbol: len(spelling) for spelling, symbol in lexer.spellings.items()})
    return instruction_distances(program, cost)


class Completions:
    """Distances, witnesses and plans of one compiled grammar's configurations (memoized per
    configuration; see the module docstring). `distances`: `program_distances`, where they
    were computed already."""

    def __init__(self, compiled: CompiledGrammar, distances: Distances | None = None):
        self.compiled = compiled
        program = compiled.program
        self.program = program
        lexer = compiled.lexer
        # Specials the vocabulary has are one token; the others are written as their spelling.
        self.special_token = {symbol: token for token, symbol in compiled.special_symbol.items()}
        self.spelling = {symbol: spelling for spelling, symbol in lexer.spellings.items()}
        self.dist, self.via = distances or program_distances(program, lexer)
        self.limits = compiled.grammar.limits
        self._longest = max(1, int(compiled.trie.height[0]))  # bytes of the longest token
        self._first_bytes = lexer.first_bytes
        self._frames: list[int] = [0]  # per call stack: the distances of its return addresses
        self._bounds: dict[int, int] = {}
        self._exact: dict[int, int] = {DEAD: UNREACHABLE}
        self._toward: dict[int, tuple[int, int]] = {}  # a witness's (symbol, next config)
        self._plans: dict[int, tuple[int, int, int]] = {}  # (tokens, first token, after it)
        self._nice: dict[int, int] = {}  # per BYTE instruction, the byte a witness writes
        self._closing: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._moves: dict[int, tuple[np.ndarray, np.ndarray, list[int]]] = {}

    @property
    def memory_bytes(self) -> int:
        """An estimate of what this holds: two figures per instruction, a few per
        configuration met, the closing candidates (for `CompiledGrammar.memory_bytes`)."""
        entries = (len(self._bounds) + len(self._exact) + len(self._toward) + len(self._plans)
                   + len(self._frames))
        candidates = sum(tokens.nbytes + lengths.nbytes for tokens, lengths
                         in self._closing.values())
        candidates += sum(tokens.nbytes + index.nbytes + 8 * len(targets)
                          for tokens, index, targets in self._moves.values())
        return 16 * len(self.dist) + _ENTRY_BYTES * entries + candidates

    # ----------------------------------------------------------------- lower bounds
    def _frame_cost(self, stack: int) -> int:
        """The distances of the return addresses on `stack` (memoized per interned stack)."""
        frames = self._frames
        if stack < len(frames):
            return frames[stack]
        stacks, dist = self.compiled.runtime.stacks, self.dist
        for sid in range(len(frames), len(stacks)):  # parents are interned before children
            frames.append(_add(dist[stacks.ret[sid]], frames[stacks.parent[sid]]))
        return frames[stack]

    def bound(self, config: int) -> int:
        """A lower bound on `config`'s distance: exact unless the lexer or the depth limit
        forbids every shortest path of the program."""
        known = self._bounds.get(config)
        if known is None:
            compiled = self.compiled
            if config == DEAD:
                known = UNREACHABLE
            elif compiled._accepting[config]:
                known = 0
            elif compiled._held[config]:
                known = self._held_bound(compiled._base[config], compiled._held[config])
            else:
                dist, frame_cost = self.dist, self._frame_cost
                known = min([_add(dist[pc], frame_cost(stack))
                             for pc, stack in compiled._threads[config]], default=UNREACHABLE)
            self._bounds[config] = known
        return known

    def _held_bound(self, base: int, held: bytes) -> int:
        """`bound` of the threads of `base` with `held` held back: a completion either ends
        a spelling that `held` starts (what is left of it, then that special's bound) or reads
        the first held byte as plain text, and the rest of `held` the same way."""
        compiled, best = self.compiled, UNREACHABLE
        while held:
            for symbol, spelling in self.spelling.items():
                if spelling.startswith(held):  # (what follows a plain byte may be a whole one)
                    after = compiled._thread_step(base, symbol)
                    if after != DEAD:
                        best = min(best, len(spelling) - len(held) + self.bound(after))
            base = compiled._thread_step(base, held[0])
            if base == DEAD:
                return best
            held = held[1:]
        return min(best, self.bound(base))

    def token_floor(self, config: int) -> int:
        """A lower bound on `plan_length` that walks nothing: no token spells more symbols
        than the vocabulary's longest token has bytes (UNREACHABLE: no completion)."""
        bound = self.bound(config)
        return bound if bound >= UNREACHABLE else -(-bound // self._longest)

    # ----------------------------------------------------------------- exact distances
    def distance(self, config: int) -> int:
        """The fewest symbols that complete the grammar from `config` (UNREACHABLE: none).
        Raises `GrammarTooLarge` where even its lower bound is past
        `limits.max_completion_length`: proving it would walk that many configurations."""
        known = self._exact.get(config)
        if known is None:
            bound = self.bound(config)
            if bound < UNREACHABLE:
                self.limits.check("max_completion_length", bound,
                                  "the shortest completion is too long to walk (symbols)")
            if not self._prove_by_chain(config):
                self._search(config)
            known = self._exact[config]
        return known

    def _prove_by_chain(self, config: int) -> bool:
        """Follow transitions that lower the bound by one each from `config`; if they reach a
        configuration that accepts (or one whose distance is known and fits), the bound was
        exact all along: keep the chain. False where it breaks off."""
        compiled, bound = self.compiled, self.bound(config)
        if bound >= UNREACHABLE:
            self._exact[config] = UNREACHABLE
            return True
        chain: list[tuple[int, int, int]] = []
        current, left = config, bound
        while True:
            known = self._exact.get(current)
            if known is not None:
                if known != left:
                    return False
                break
            if left == 0:
                if not compiled._accepting[current]:
                    return False
                self._exact[current] = 0
                break
            step = self._tight_step(current, left)
            if step is None:
                return False
            chain.append((current, *step))
            current, left = step[1], left - 1
        for offset, (at, symbol, after) in enumerate(chain):
            self._exact[at] = bound - offset
            self._toward[at] = (symbol, after)
        return True

    def _tight_step(self, config: int, left: int) -> tuple[int, int] | None:
        """A (symbol, next configuration) whose bound is `left - 1` (the shortest path's next
        symbol first, then every other), or None."""
        for symbol in self._preferred_symbols(config):
            after = self._after(config, symbol)
            if after != DEAD and self._estimate(after) == left - 1:
                return symbol, after
        for symbol, after in self._successors(config):
            if self._estimate(after) == left - 1:
                return symbol, after
        return None

    def _estimate(self, config: int) -> int:
        known = self._exact.get(config)
        return self.bound(config) if known is None else known

    def _preferred_symbols(self, config: int) -> Iterator[int]:
        """The next symbol of the program's shortest path from `config`'s nearest thread (a
        spelled special's next byte where bytes are held back)."""
        compiled = self.compiled
        held = compiled._held[config]
        if held:
            for spelling in self.spelling.values():
                if len(spelling) > len(held) and spelling.startswith(held):
                    yield spelling[len(held)]
            return
        threads = compiled._threads[config]
        if not threads:
            return
        dist, frame_cost = self.dist, self._frame_cost
        pc, _ = min(threads, key=lambda thread: dist[thread[0]] + frame_cost(thread[1]))
        kind, via = self.program.kind, self.via
        while kind[pc] == SPLIT:  # a choice of bytes: the alternative on the shortest path
            pc = via[pc]
        if kind[pc] == SPECIAL:
            symbol = self.program.aux[pc]
            yield symbol if symbol in self.special_token else self.spelling[symbol][0]
        elif kind[pc] == BYTE:
            yield self._nice_byte(pc)

    def _nice_byte(self, pc: int) -> int:
        """The byte a witness writes at BYTE instruction `pc`: readable if it may be, and not
        the start of a spelled special if it need not be."""
        byte = self._nice.get(pc)
        if byte is None:
            accept = self.program.accept[pc]
            allowed = [b for b in _PREFERRED if accept[b]]
            plain = [b for b in allowed if b not in self._first_bytes]
            byte = self._nice[pc] = (plain or allowed)[0]
        return byte

    def _after(self, config: int, symbol: int) -> int:
        compiled = self.compiled
        return compiled._step(config, symbol) if symbol < SPECIAL_BASE else \
            compiled.next_state(config, symbol)

    def _successors(self, config: int) -> Iterator[tuple[int, int]]:
        """Every live next configuration of `config`, with the symbol that leads there (the
        most readable byte, or a special token the vocabulary has)."""
        row = self.compiled._row(config)
        seen: set[int] = {DEAD}
        for byte in _PREFERRED:
            after = row[byte]
            if after not in seen:
                seen.add(after)
                yield byte, after
        for symbol in self.special_token:
            after = self.compiled.next_state(config, symbol)
            if after not in seen:
                seen.add(after)
                yield symbol, after

    def _search(self, config: int) -> None:
        """The exact distance of `config` by A* over the automaton's transitions (each costs
        one symbol), with `bound` as the heuristic (admissible: it never overestimates);
        configurations of known distance end the search at that distance."""
        compiled = self.compiled
        cost = {config: 0}
        came: dict[int, tuple[int, int]] = {}
        heap = [(self._estimate(config), 0, config)]
        expanded, goal = 0, None
        while heap:
            total, here, current = heapq.heappop(heap)
            if here > cost[current]:
                continue
            known = self._exact.get(current)
            if compiled._accepting[current] or known is not None:
                rest = 0 if compiled._accepting[current] else known
                if total < here + rest:  # its bound was below its distance: queue it again
                    heapq.heappush(heap, (here + rest, here, current))
                    continue
                goal = current
                break
            expanded += 1
            if expanded > _SEARCH_LIMIT:
                raise GrammarError(
                    f"no shortest completion found within {_SEARCH_LIMIT} configurations")
            for symbol, after in self._successors(current):
                estimate = self._estimate(after)
                if estimate >= UNREACHABLE or here + 1 >= cost.get(after, UNREACHABLE):
                    continue
                cost[after] = here + 1
                came[after] = (current, symbol)
                heapq.heappush(heap, (here + 1 + estimate, here + 1, after))
        if goal is None:  # nothing reachable completes
            for seen in cost:
                self._exact[seen] = UNREACHABLE
            return
        if compiled._accepting[goal]:
            self._exact[goal] = 0
        total = cost[goal] + self._exact[goal]
        current = goal
        while current != config:
            previous, symbol = came[current]
            self._exact[previous] = total - cost[previous]
            self._toward[previous] = (symbol, current)
            current = previous

    # ----------------------------------------------------------------- witnesses and plans
    def witness(self, config: int) -> list[tuple[int, int]]:
        """One shortest completion from `config`: its (symbol, configuration after it) pairs
        (empty where the grammar may end; raises where it cannot be completed)."""
        left = self.distance(config)
        if left >= UNREACHABLE:
            raise GrammarError("the grammar cannot be completed from here")
        steps = []
        while left:
            step = self._toward[config]
            steps.append(step)
            config, left = step[1], left - 1
        return steps

    def pieces(self, config: int) -> list[bytes | int]:
        """The witness as runs of bytes and special-token ids."""
        pieces: list[bytes | int] = []
        run = bytearray()
        for symbol, _ in self.witness(config):
            if symbol < SPECIAL_BASE:
                run.append(symbol)
                continue
            if run:
                pieces.append(bytes(run))
                run = bytearray()
            pieces.append(self.special_token[symbol])
        if run:
            pieces.append(bytes(run))
        return pieces

    def plan_length(self, config: int) -> int:
        """The fewest tokens that spell `config`'s witness (UNREACHABLE: no completion)."""
        plan = self._plans.get(config)
        if plan is None:
            if self.distance(config) >= UNREACHABLE:
                return UNREACHABLE
            self._make_plans(config)
            plan = self._plans[config]
        return plan[0]

    def plan(self, config: int) -> list[int]:
        """The tokens of `plan_length` (accepted one after the other from `config`)."""
        self.plan_length(config)
        tokens = []
        count, token, after = self._plans[config]
        while count:
            tokens.append(token)
            count, token, after = self._plans[after]
        return tokens

    def _make_plans(self, config: int) -> None:
        """Plans for `config` and the witness after it up to a configuration that has one:
        from the last back, each takes the first token that leaves the shortest plan after
        it (the longest of those), read off the vocabulary's trie along the witness."""
        plans, toward, exact = self._plans, self._toward, self._exact
        chain = [config]
        while chain[-1] not in plans and exact[chain[-1]]:
            chain.append(toward[chain[-1]][1])
        last = chain[-1]
        if last not in plans:
            plans[last] = (0, -1, last)
        trie = self.compiled.trie
        child_start, child_end, child_byte = trie.lists
        node_token = trie._token_lists[0]
        for current in reversed(chain[:-1]):
            symbol, after = toward[current]
            if symbol >= SPECIAL_BASE:
                best = (plans[after][0] + 1, self.special_token[symbol], after)
            else:
                best, node, at = None, 0, current
                while exact[at] and toward[at][0] < SPECIAL_BASE:
                    byte, at = toward[at]
                    start, end = child_start[node], child_end[node]
                    node = bisect_left(child_byte, byte, start, end)
                    if node == end or child_byte[node] != byte:
                        break
                    token = node_token[node]
                    if token >= 0 and (best is None or plans[at][0] + 1 <= best[0]):
                        best = (plans[at][0] + 1, token, at)
                if best is None:
                    raise GrammarError(
                        f"the vocabulary has no token for byte {symbol:#04x} of a completion")
            plans[current] = best

    # ----------------------------------------------------------------- closing
    def closing_candidates(self, config: int) -> tuple[np.ndarray, np.ndarray]:
        """The allowed tokens after which the distance is lower than at `config`, and the
        plan length after each (memoized per configuration).

        Tokens that lead back to `config` (`CompiledGrammar.moves` leaves out most) never
        lower it."""
        found = self._closing.get(config)
        if found is not None:
            return found
        here = self.distance(config)
        tokens = lengths = np.zeros(0, dtype=np.int64)
        if 0 < here < UNREACHABLE:
            tokens, states = self.compiled.moves(config)
            targets, index = np.unique(states, return_inverse=True)
            # (A target whose bound is not lower is not closer: its distance is not walked.)
            closer = np.array([self.bound(t) < here and self.distance(t) < here
                               for t in targets.tolist()], dtype=bool)
            plans = np.array([self.plan_length(t) if near else UNREACHABLE
                              for t, near in zip(targets.tolist(), closer.tolist(), strict=True)],
                             dtype=np.int64)
            keep = closer[index]
            tokens, lengths = tokens[keep], plans[index][keep]
        found = (tokens, lengths)
        self._closing[config] = found
        return found

    def overlong_tokens(self, config: int, limit: int) -> np.ndarray:
        """The allowed tokens after which the plan is longer than `limit` tokens (or nothing
        completes the grammar): what a host that cannot take a sampled token back (a logits
        processor) leaves out of the mask near the budget's end, where the engine would take
        such a token back instead.

        Tokens that lead back to `config` (left out of `CompiledGrammar.moves`) keep its plan
        and are never among them. Where each token leads is memoized per configuration; a
        target whose `token_floor` is past `limit` is not walked, and one whose completion is
        too long to walk (`GrammarTooLarge`) counts as past it."""
        found = self._moves.get(config)
        if found is None:
            tokens, states = self.compiled.moves(config)
            targets, index = np.unique(states, return_inverse=True)
            found = self._moves[config] = (tokens, index, targets.tolist())
        tokens, index, targets = found
        over = np.array([self._plan_past(target, limit) for target in targets], dtype=bool)
        return tokens[over[index]] if len(tokens) else tokens

    def _plan_past(self, config: int, limit: int) -> bool:
        if self.token_floor(config) > limit:
            return True
        try:
            return self.plan_length(config) > limit
        except GrammarError:  # GrammarTooLarge: past any budget the engine walks
            return True
