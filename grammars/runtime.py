"""Execution of a `Program`: the one stepping function shared by the parser and the automaton.

A *thread* is (pc, stack, log): an instruction waiting to consume a symbol, an interned call
stack, and a persistent log of capture events (None when captures are not tracked). Threads
are kept in priority order (Pike VM); a (pc, stack) pair reached twice keeps only its first,
highest-priority thread, which bounds the work per symbol.
"""

from __future__ import annotations

from pegmask.grammars.errors import GrammarTooLarge
from pegmask.grammars.program import (
    CALL,
    CLOSE,
    JUMP,
    MATCH,
    OPEN,
    RET,
    SPECIAL,
    SPLIT,
    Program,
)

DEFAULT_MAX_DEPTH = 256
DEFAULT_MEMO_LIMIT = 100_000

# A log node: (kind, tag, position, parent, depth); kind is OPEN or CLOSE.
Log = tuple | None
Thread = tuple[int, int, Log]


def _extend(extended: dict[tuple, Log], events: tuple, position: int) -> Log:
    """The seed's log with capture `events` ((kind, tag) pairs) appended at `position`, reusing
    the nodes already made for any prefix of `events` (`extended` maps prefixes to logs)."""
    if events in extended:
        return extended[events]
    parent = _extend(extended, events[:-1], position)
    kind, tag = events[-1]
    log = (kind, tag, position, parent, parent[4] + 1 if parent is not None else 1)
    extended[events] = log
    return log


class StackTable:
    """Interns call stacks as small ints so threads hash and compare in O(1).

    Stack 0 is the empty stack; `push(ret, parent)` returns the id of the stack with return pc
    `ret` on top of `parent`.
    """

    def __init__(self, max_depth: int = DEFAULT_MAX_DEPTH):
        self.max_depth = max_depth
        self.ret: list[int] = [-1]
        self.parent: list[int] = [-1]
        self.depth: list[int] = [0]
        self._ids: dict[tuple[int, int], int] = {}

    def push(self, ret: int, parent: int) -> int:
        key = (ret, parent)
        sid = self._ids.get(key)
        if sid is None:
            sid = len(self.ret)
            self._ids[key] = sid
            self.ret.append(ret)
            self.parent.append(parent)
            self.depth.append(self.depth[parent] + 1)
        return sid

    def __len__(self) -> int:
        return len(self.ret)


class Runtime:
    """Binds a program to a stack table and implements epsilon closure and symbol steps."""

    def __init__(self, program: Program, max_depth: int = DEFAULT_MAX_DEPTH,
                 memo_limit: int = DEFAULT_MEMO_LIMIT):
        if program.call_depth > max_depth:
            raise GrammarTooLarge(
                "max_depth", f"grammar too deep: its rules call each other {program.call_depth} "
                f"frames deep without recursion (> max_depth={max_depth}); raise it with "
                "CompiledGrammar(max_depth=...)", allowed=max_depth, value=program.call_depth)
        self.program = program
        self.stacks = StackTable(max_depth)
        self.memo_limit = memo_limit
        self._memo: dict[tuple[int, int], tuple[tuple, tuple]] = {}
        self._reach_memo: dict[tuple[int, int], tuple[tuple[tuple[int, int], ...], bool]] = {}

    def initial(self, log: Log = None, track: bool = False) -> tuple[list[Thread], list[Log]]:
        return self.closure([(self.program.start, 0, log)], 0, track)

    def closure(
        self, seeds: list[Thread], position: int, track: bool
    ) -> tuple[list[Thread], list[Log]]:
        """Follow epsilon instructions from `seeds` (in priority order).

        Returns the threads parked on consuming instructions and the logs of derivations that
        reached MATCH, both in priority order. `track` records capture events in the logs.

        The closure of several seeds is the concatenation of each seed's closure with repeats
        of a (pc, stack) dropped, the first (highest-priority) one kept: a lower-priority path
        that meets a node already reached can only lead to threads already found. So each
        seed's closure is memoized, with its capture events kept relative to the seed.
        """
        out: list[Thread] = []
        matched: list[Log] = []
        found: set[tuple[int, int]] = set()
        memo = self._memo
        for pc, stack, log in seeds:
            entry = memo.get((pc, stack))
            if entry is None:
                entry = self._closure_of(pc, stack)
                if len(memo) >= self.memo_limit:
                    memo.clear()
                memo[(pc, stack)] = entry
            consumers, matches = entry
            # Threads whose paths share events share their log nodes: the parser finds the
            # events all derivations agree on by node identity.
            extended: dict[tuple, Log] = {(): log}
            for target in consumers:
                key = target[0]
                if key in found:
                    continue
                found.add(key)
                out.append((*key, _extend(extended, target[1], position) if track else log))
            if matches and not matched:
                matched.append(_extend(extended, matches[0], position) if track else log)
        return out, matched

    def reach(self, seeds: tuple[tuple[int, int], ...]) -> tuple[tuple[tuple[int, int], ...], bool]:
        """The (pc, stack) pairs `closure` would park on from `seeds`, and whether it reaches
        MATCH: the closure without capture logs, as the automaton needs it (sets, no order)."""
        # A seed where a thread waits for a symbol (`Program.parks`: most seeds inside
        # literals and UTF-8 sequences) is its own closure, with no memo to consult.
        memo, parks = self._reach_memo, self.program.parks
        if len(seeds) == 1:
            if parks[seeds[0][0]]:
                return seeds, False
            entry = memo.get(seeds[0])
            return entry if entry is not None else self._reach_of(seeds[0])
        pairs: dict[tuple[int, int], None] = {}
        matched = False
        for seed in seeds:
            if parks[seed[0]]:
                pairs[seed] = None
                continue
            entry = memo.get(seed)
            if entry is None:
                entry = self._reach_of(seed)
            pairs.update(dict.fromkeys(entry[0]))
            matched = matched or entry[1]
        return tuple(pairs), matched

    def _reach_of(self, seed: tuple[int, int]) -> tuple[tuple[tuple[int, int], ...], bool]:
        entry = self._closure_of(*seed)
        reached = (tuple([key for key, _ in entry[0]]), bool(entry[1]))
        if len(self._reach_memo) >= self.memo_limit:
            self._reach_memo.clear()
        self._reach_memo[seed] = reached
        return reached

    def _closure_of(self, pc: int, stack: int) -> tuple[tuple, tuple]:
        """One seed's closure: ((((pc, stack), events), ...), (events of a MATCH, ...)); the
        callers memoize it, each in the form it needs."""
        prog = self.program
        kind, arg, aux, targets = prog.kind, prog.arg, prog.aux, prog.targets
        # A seed waiting for a symbol is its own closure (most seeds inside literals).
        parks = prog.parks
        if parks[pc]:
            return (((pc, stack), ()),), ()
        stacks = self.stacks
        s_ret, s_parent, s_depth = stacks.ret, stacks.parent, stacks.depth
        max_depth = stacks.max_depth
        seen: set[tuple[int, int]] = set()
        consumers: list[tuple[tuple[int, int], tuple]] = []
        matches: list[tuple] = []
        todo: list[tuple[int, int, tuple]] = [(pc, stack, ())]
        while todo:
            pc, stack, events = todo.pop()
            while True:
                key = (pc, stack)
                if key in seen:
                    break
                seen.add(key)
                if parks[pc]:
                    consumers.append((key, events))
                    break
                k = kind[pc]
                if k == JUMP:
                    pc = arg[pc]
                elif k == SPLIT:
                    alts = targets[pc]
                    for alt in reversed(alts[1:]):
                        todo.append((alt, stack, events))
                    pc = alts[0]
                elif k == CALL:
                    if s_depth[stack] >= max_depth:
                        break
                    stack = stacks.push(aux[pc], stack)
                    pc = arg[pc]
                elif k == RET:
                    pc = s_ret[stack]
                    stack = s_parent[stack]
                elif k == OPEN or k == CLOSE:
                    events = (*events, (k, aux[pc]))
                    pc = arg[pc]
                elif k == MATCH:
                    matches.append(events)
                    break
                else:  # pragma: no cover - the compiler emits no other kinds
                    raise AssertionError(f"bad instruction kind {k}")
        return tuple(consumers), tuple(matches)

    def step(
        self, threads: list[Thread], symbol: int, position: int, track: bool
    ) -> tuple[list[Thread], list[Log]]:
        """Consume one symbol (a byte, or 256+ for a special token) from every thread."""
        prog = self.program
        kind, arg, aux, accept, leaves = prog.kind, prog.arg, prog.aux, prog.accept, prog.leaves
        seeds: list[Thread] = []
        if symbol < 256:
            for pc, stack, log in threads:
                for leaf in leaves[pc]:
                    if accept[leaf][symbol]:
                        seeds.append((arg[leaf], stack, log))
        else:
            for pc, stack, log in threads:
                if kind[pc] == SPECIAL and aux[pc] == symbol:
                    seeds.append((arg[pc], stack, log))
        if not seeds:
            return [], []
        return self.closure(seeds, position, track)
