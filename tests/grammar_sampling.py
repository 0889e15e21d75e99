"""Random sentences of a grammar, drawn by walking its program (test helper)."""

from __future__ import annotations

import random

from pegmask.grammars.program import SPECIAL, Program
from pegmask.grammars.runtime import Runtime

PREFERRED = b"abcxyz019 {}[]\":,\n<>/"


def next_symbols(program: Program, threads: list) -> list[int]:
    """Every symbol some thread can consume next."""
    symbols: set[int] = set()
    for pc, _, _ in threads:
        for leaf in program.leaves[pc]:
            symbols.update(i for i, ok in enumerate(program.accept[leaf]) if ok)
        if program.kind[pc] == SPECIAL:
            symbols.add(program.aux[pc])
    return sorted(symbols)


def sample_symbols(program: Program, rng: random.Random, max_len: int = 80,
                   stop_probability: float = 0.15) -> list[int] | None:
    """A random sentence as program symbols, or None if the walk did not end in time.

    Bytes from a small readable set are preferred so that samples look like real text.
    """
    runtime = Runtime(program)
    threads, matched = runtime.initial()
    out: list[int] = []
    while len(out) < max_len:
        if matched and (not threads or rng.random() < stop_probability):
            return out
        options = next_symbols(program, threads)
        nice = [s for s in options if s >= 256 or s in PREFERRED]
        pool = nice if nice and rng.random() < 0.9 else options
        rng.shuffle(pool)
        for symbol in pool:
            nxt, nxt_matched = runtime.step(threads, symbol, 0, False)
            if nxt or nxt_matched:
                threads, matched = nxt, nxt_matched
                out.append(symbol)
                break
        else:
            return None
    return out if matched else None
