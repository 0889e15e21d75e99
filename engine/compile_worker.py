"""The grammar compile worker: a process of its own (`python -c ...main(fd)`, started by
`CompileWorkers` in engine/compile_service.py) that compiles the grammars sent over a socket.

Its own interpreter rather than a `multiprocessing` child: a spawned or forkserver child
re-imports the parent's `__main__` script, so a plain script that makes an `Engine` would run
again in every worker; and a plain fork would copy a serving process's torch and decode threads
half-way. Why a process at all: see engine/compile_service.py.
"""

from __future__ import annotations

import gc
import os
import signal
from collections.abc import Mapping
from multiprocessing.connection import Connection
from typing import Any

from pegmask.grammars import Grammar
from pegmask.grammars.completion import program_distances
from pegmask.grammars.spelling import specials_lexer

# Where SCHED_IDLE is missing (not Linux): below the serving process, which then gets about
# nine tenths of a core both want.
_NICENESS = 10


def main(fd: int) -> None:
    """A worker's life: read its settings (the vocabulary's special-token ids, the memory
    budget), say it is ready, then compile each grammar received until the parent hangs up.
    Ends after a MemoryError, whose half-built heap the next job should not inherit."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group
    _yield_to_decoding()
    conn = Connection(fd)
    special_ids, memory_bytes = conn.recv()
    import pegmask.grammars.json_schema  # noqa: F401 - now rather than in the first job

    if memory_bytes is not None:
        _limit_address_space(memory_bytes)
    gc.freeze()  # what is imported: never scanned again by the collections below
    conn.send("ready")
    while True:
        try:
            grammar: Grammar = conn.recv()
        except (EOFError, OSError):  # the parent hung up
            return
        reply = compile_job(grammar, special_ids)
        del grammar
        gc.collect()
        try:
            try:
                conn.send(reply)
            except MemoryError:
                reply = ("compile_memory",)
                conn.send(reply)
        except OSError:  # the parent went away meanwhile
            return
        if reply[0] == "compile_memory":
            return


def compile_job(grammar: Grammar, special_ids: Mapping[str, int]) -> tuple[Any, ...]:
    """A worker's job: ("ok", program, distances), ("invalid", message) or
    ("compile_memory",). The cyclic collector is off meanwhile: a compile allocates millions
    of containers and no garbage cycles worth a full collection every few hundred thousand
    of them."""
    gc.disable()
    try:
        program = grammar.program
        distances = program_distances(program, specials_lexer(program, special_ids))
        return "ok", program, distances
    except MemoryError:
        return ("compile_memory",)
    except (ValueError, TypeError, RecursionError) as exc:
        return "invalid", str(exc)
    finally:
        gc.enable()


def _yield_to_decoding() -> None:
    """Run only on a core nothing else wants. A niced worker still takes a share of a busy
    core, and each time it preempts one of the decode loop's OpenMP threads the whole step
    waits at the team's barrier: that was the inter-token latency's p99 beside compiles. The
    compile budget counts the worker's CPU time, not the time it waited, so the verdict on a
    grammar does not change; a compile starved for ten times its budget ends all the same."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        os.nice(_NICENESS)


def _limit_address_space(extra_bytes: int) -> None:
    """Let this process map at most `extra_bytes` beyond what it maps now (Linux: elsewhere
    there is no /proc/self/statm and no limit)."""
    import resource

    try:
        with open("/proc/self/statm") as statm:
            mapped = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + extra_bytes
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
