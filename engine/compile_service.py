"""Grammar compiles in worker processes, with time and memory budgets.

Why processes: compiling a large grammar is seconds of pure Python, and a thread of the
serving process would hold the GIL that the decode loop and the event loop need, stretching
every other request's latency (an `enum` of 20,000 strings once stalled a 16-token request
from 0.4 s to 31.5 s). A worker process holds only its own.

What crosses the process boundary: the `Grammar` (its IR) goes to a worker; the worker
compiles its program (the JSON Schema front-end's expansion included) and the program's
instruction distances (`completion.program_distances`, what the close-on-length budget check
and steering need; the worker got the vocabulary's special-token ids at start), and sends both
back. The parent binds them to the vocabulary (`CompiledGrammar`, whose transitions and masks
are made lazily, during decoding), so nothing left in the parent costs more than pickling.

Budgets: a compile that takes more than `timeout_s` of its worker's CPU time (or ten times
that of wall time) has its worker killed and replaced, and fails with
`GrammarTooLarge("compile_time")`; CPU time, because workers run in the idle scheduling
class (a compile gets only the cycles decoding leaves: engine/compile_worker.py), and a grammar's verdict should
not depend on how busy the server is; one that needs more than `memory_bytes` on top of
the worker's own (its address space is limited: `RLIMIT_AS`) raises MemoryError there, or one
whose worker dies, fails with `GrammarTooLarge("compile_memory")`. Either is the request's 400;
the server goes on with a fresh worker.

Workers are interpreters of their own (engine/compile_worker.py says why not
`multiprocessing`), started with the engine so that the first request does not wait for their
imports (about 2 s), and replaced as soon as one is killed or dies.
"""

from __future__ import annotations

import contextlib
import os
import queue
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from multiprocessing.connection import Connection
from typing import Any

from pegmask.grammars import Grammar, GrammarError, GrammarTooLarge
from pegmask.grammars.compiler import CompiledGrammar, GrammarCompiler
from pegmask.grammars.completion import Distances
from pegmask.grammars.limits import DEFAULT_LIMITS, GrammarLimits
from pegmask.grammars.program import Program
from pegmask.grammars.vocab import Vocabulary

DEFAULT_COMPILE_WORKERS = 1
DEFAULT_COMPILE_TIMEOUT_S = 10.0
DEFAULT_COMPILE_MEMORY_BYTES = 2 << 30
# A worker's start (imports, before any grammar) is the server's cost, not a grammar's.
_START_TIMEOUT_S = 120.0
# The compile budget is CPU time, so that a grammar's verdict does not depend on the load (a
# worker yields to decoding: it runs in the idle scheduling class); past this many times the budget
# in wall time, a starved compile ends all the same.
_WALL_FACTOR = 10
_POLL_S = 0.05  # how often a waiting request reads its worker's CPU time
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

# (outcome, seconds) after each compile: "ok", "invalid", "compile_time", "compile_memory",
# "error" (a worker that could not start).
CompileHook = Callable[[str, float], None]


class WorkerLost(RuntimeError):
    """A worker that ended without a grammar's fault (it could not start, or the service was
    closed under it)."""


class _Worker:
    """One worker process (engine/compile_worker.py) and the socket to it."""

    def __init__(self, special_ids: Mapping[str, int], memory_bytes: int | None):
        mine, theirs = socket.socketpair()
        code = f"from pegmask.engine.compile_worker import main; main({theirs.fileno()})"
        self.process = subprocess.Popen([sys.executable, "-c", code], pass_fds=[theirs.fileno()],
                                        stdin=subprocess.DEVNULL)
        theirs.close()
        self.conn = Connection(mine.detach())
        self.conn.send((dict(special_ids), memory_bytes))
        self.ready = False

    def send(self, grammar: Grammar) -> None:
        """Hand `grammar` to the worker (once it has started)."""
        if not self.ready:
            if not self.conn.poll(_START_TIMEOUT_S) or self._receive() != "ready":
                raise WorkerLost("a grammar compile worker did not start")
            self.ready = True
        try:
            self.conn.send(grammar)
        except OSError:  # (BrokenPipeError: it died between jobs)
            raise WorkerLost("a grammar compile worker ended before its job") from None

    def reply(self, timeout_s: float | None) -> tuple[Any, ...]:
        """The worker's reply to the grammar sent; ("compile_time",) once it has spent
        `timeout_s` of CPU time on it, or `_WALL_FACTOR` times that of wall time (the worker
        is then killed); ("compile_memory",) if it died meanwhile."""
        if timeout_s is not None:
            spent = self._cpu_seconds
            start, wall_deadline = spent(), time.monotonic() + _WALL_FACTOR * timeout_s
            while not self.conn.poll(_POLL_S):
                if spent() - start > timeout_s or time.monotonic() > wall_deadline:
                    self.kill()
                    return ("compile_time",)
        reply = self._receive()
        return ("compile_memory",) if reply is None else reply

    def _cpu_seconds(self) -> float:
        """The worker's CPU time so far (Linux's /proc; elsewhere, and once it has ended, the
        wall clock stands in)."""
        try:
            with open(f"/proc/{self.process.pid}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except OSError:
            return time.monotonic()
        return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS  # utime, stime

    def _receive(self) -> Any:
        try:
            return self.conn.recv()
        except (EOFError, OSError):
            return None

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()
        self.conn.close()


class CompileWorkers:
    """A pool of `workers` compile worker processes for one vocabulary. `run(grammar)` waits
    for a free worker (other callers' threads go on), then returns the program and distances,
    or raises `GrammarTooLarge` past a budget, or the grammar's own error (a GrammarError)."""

    def __init__(self, vocab: Vocabulary, workers: int, *, timeout_s: float | None,
                 memory_bytes: int | None):
        if workers < 1:
            raise ValueError(f"compile workers must be at least 1, not {workers}")
        for name, value in (("compile_timeout_s", timeout_s), ("compile_memory_bytes",
                                                              memory_bytes)):
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be positive or None, not {value}")
        self.timeout_s = timeout_s
        self.memory_bytes = memory_bytes
        self._special_ids = dict(vocab.special_ids)
        self._closed = False
        self._lock = threading.Lock()
        self.running = 0  # jobs a worker has now
        self._workers: list[_Worker] = []
        self._idle: queue.SimpleQueue[_Worker | None] = queue.SimpleQueue()  # None: closed
        for _ in range(workers):
            self._idle.put(self._start())
        weakref.finalize(self, _kill_all, self._workers)

    def _start(self) -> _Worker:
        with self._lock:
            if self._closed:
                raise WorkerLost("the grammar compile workers were closed")
            worker = _Worker(self._special_ids, self.memory_bytes)
            self._workers.append(worker)
            return worker

    def _replace(self, worker: _Worker) -> None:
        worker.kill()
        with self._lock:
            self._workers.remove(worker)
        with contextlib.suppress(WorkerLost):  # (closed: nobody needs one any more)
            self._idle.put(self._start())

    def run(self, grammar: Grammar, *, retry: bool = True) -> tuple[Program, Distances]:
        worker = self._idle.get()
        if worker is None or self._closed:
            self._idle.put(None)  # (for the next caller)
            raise WorkerLost("the grammar compile workers were closed")
        try:
            worker.send(grammar)
        except WorkerLost:
            self._replace(worker)
            if self._closed or not retry:
                raise
            # Not the grammar's fault: once more, on a fresh worker.
            return self.run(grammar, retry=False)
        with self._lock:
            self.running += 1
        try:
            reply = worker.reply(self.timeout_s)
        finally:
            with self._lock:
                self.running -= 1
        if reply[0] in ("ok", "invalid"):
            self._idle.put(worker)
        else:
            self._replace(worker)
        if reply[0] == "ok":
            return reply[1], reply[2]
        if reply[0] == "invalid":
            raise GrammarError(reply[1])
        if reply[0] == "compile_time":
            assert self.timeout_s is not None
            raise GrammarTooLarge(
                "compile_time", f"the grammar is too large: its compile exceeds the compile_time "
                f"limit of {self.timeout_s:g} s of CPU time (raise it with Engine("
                "compile_timeout_s=...) or `pegmask serve --compile-timeout`)",
                allowed=self.timeout_s)
        allowed = self.memory_bytes / (1 << 20) if self.memory_bytes else float("inf")
        raise GrammarTooLarge(
            "compile_memory", f"the grammar is too large: its compile exceeds the compile_memory "
            f"limit of {allowed:g} MiB (raise it with Engine(compile_memory_bytes=...) or "
            "`pegmask serve --compile-memory`)", allowed=allowed)

    @property
    def pids(self) -> list[int]:
        """The worker processes' ids (tests kill one)."""
        with self._lock:
            return [worker.process.pid for worker in self._workers]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            workers = list(self._workers)
        self._idle.put(None)
        _kill_all(workers)


def _kill_all(workers: list[_Worker]) -> None:
    for worker in list(workers):
        with contextlib.suppress(Exception):
            worker.kill()


class CompileService:
    """The engine's compiled grammars: kept across requests (a `GrammarCompiler`: same grammar,
    same vocabulary, one compile), compiled once however many requests ask for a grammar at
    the same time (the others wait for that compile, and only they), in `CompileWorkers`.

    `workers=0` compiles in the caller's thread instead, without budgets: for a script that
    compiles a grammar or two, not for a server. `compiles` counts the compiles run."""

    def __init__(self, vocab: Vocabulary, *, workers: int = DEFAULT_COMPILE_WORKERS,
                 timeout_s: float | None = DEFAULT_COMPILE_TIMEOUT_S,
                 memory_bytes: int | None = DEFAULT_COMPILE_MEMORY_BYTES,
                 limits: GrammarLimits = DEFAULT_LIMITS,
                 on_compile: CompileHook | None = None):
        if workers < 0:
            raise ValueError(f"compile workers must be at least 0, not {workers}")
        self.compiler = GrammarCompiler(vocab, limits=limits)
        self.workers = (CompileWorkers(vocab, workers, timeout_s=timeout_s,
                                       memory_bytes=memory_bytes) if workers else None)
        self.compiles = 0
        self._on_compile = on_compile
        self._lock = threading.Lock()  # the compiler's cache and the compiles under way
        self._pending: dict[tuple, Future[CompiledGrammar]] = {}

    def compile(self, grammar: Grammar) -> CompiledGrammar:
        """`grammar` bound to the vocabulary: kept, or compiled now (errors: the grammar's own,
        or `GrammarTooLarge`)."""
        key = grammar.key
        with self._lock:
            compiled = self.compiler.cached(grammar)
            if compiled is not None:
                return compiled
            pending = self._pending.get(key)
            owner = pending is None
            if pending is None:
                pending = self._pending[key] = Future()
                self.compiles += 1
        if not owner:
            return pending.result()
        try:
            compiled = self._compile(grammar)
        except BaseException as exc:
            pending.set_exception(exc)
            raise
        finally:
            with self._lock:
                del self._pending[key]
        pending.set_result(compiled)
        return compiled

    def _compile(self, grammar: Grammar) -> CompiledGrammar:
        grammar = grammar.with_limits(self.compiler.limits)
        started = time.monotonic()
        outcome = "error"
        try:
            if self.workers is None:
                made = CompiledGrammar(grammar, self.compiler.vocab, **self.compiler.options)
            else:
                program, distances = self.workers.run(grammar)
                made = CompiledGrammar(grammar.adopt(program), self.compiler.vocab,
                                       distances=distances, **self.compiler.options)
            outcome = "ok"
        except GrammarTooLarge as exc:
            outcome = exc.limit
            raise
        except (ValueError, TypeError, RecursionError):
            outcome = "invalid"
            raise
        finally:
            if self._on_compile is not None:
                self._on_compile(outcome, time.monotonic() - started)
        with self._lock:
            return self.compiler.keep(made)

    def close(self) -> None:
        """Stop the workers; a compile under way fails."""
        if self.workers is not None:
            self.workers.close()
