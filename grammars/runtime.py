"""Execution of a `Program`: the one stepping function shared by the parser and the automaton.

A *thread* is (pc, stack, log): an instruction waiting to consume a symbol, an interned call
stack, and a persistent log of capture events (None when captures are not tracked). Threads
are kept in priority order (Pike VM); a (pc, stack) pair reached twice keeps only its first,
highest-priority thread, which bounds the work per symbol.
"""

from __future__ import annotations

from pegmask.grammars.program import (
    BYTE,
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

# A log node: (kind, tag, position, parent, depth); kind is OPEN or CLOSE.
Log = tuple | None
Thread = tuple[int, int, Log]


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

    def __init__(self, program: Program, max_depth: int = DEFAULT_MAX_DEPTH):
        self.program = program
        self.stacks = StackTable(max_depth)

    def initial(self, log: Log = None, track: bool = False) -> tuple[list[Thread], list[Log]]:
        return self.closure([(self.program.start, 0, log)], 0, track)

    def closure(
        self, seeds: list[Thread], position: int, track: bool
    ) -> tuple[list[Thread], list[Log]]:
        """Follow epsilon instructions from `seeds` (in priority order).

        Returns the threads parked on consuming instructions and the logs of derivations that
        reached MATCH, both in priority order. `track` records capture events in the logs.
        """
        prog = self.program
        kind, arg, aux, targets = prog.kind, prog.arg, prog.aux, prog.targets
        stacks = self.stacks
        s_ret, s_parent, s_depth = stacks.ret, stacks.parent, stacks.depth
        max_depth = stacks.max_depth
        seen: set[tuple[int, int]] = set()
        out: list[Thread] = []
        matched: list[Log] = []
        todo = list(reversed(seeds))
        while todo:
            pc, stack, log = todo.pop()
            while True:
                key = (pc, stack)
                if key in seen:
                    break
                seen.add(key)
                k = kind[pc]
                if k == BYTE or k == SPECIAL:
                    out.append((pc, stack, log))
                    break
                if k == JUMP:
                    pc = arg[pc]
                elif k == SPLIT:
                    alts = targets[pc]
                    for alt in reversed(alts[1:]):
                        todo.append((alt, stack, log))
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
                    if track:
                        depth = log[4] + 1 if log is not None else 1
                        log = (k, aux[pc], position, log, depth)
                    pc = arg[pc]
                elif k == MATCH:
                    matched.append(log)
                    break
                else:  # pragma: no cover - the compiler emits no other kinds
                    raise AssertionError(f"bad instruction kind {k}")
        return out, matched

    def step(
        self, threads: list[Thread], symbol: int, position: int, track: bool
    ) -> tuple[list[Thread], list[Log]]:
        """Consume one symbol (a byte, or 256+ for a special token) from every thread."""
        prog = self.program
        kind, arg, aux, accept = prog.kind, prog.arg, prog.aux, prog.accept
        seeds: list[Thread] = []
        if symbol < 256:
            for pc, stack, log in threads:
                if kind[pc] == BYTE and accept[pc][symbol]:
                    seeds.append((arg[pc], stack, log))
        else:
            for pc, stack, log in threads:
                if kind[pc] == SPECIAL and aux[pc] == symbol:
                    seeds.append((arg[pc], stack, log))
        if not seeds:
            return [], []
        return self.closure(seeds, position, track)
