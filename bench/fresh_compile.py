"""An engine's first compile in a fresh process, apart from the warm compiles that follow it.

The first compile pays for what an engine builds lazily (pegmask's compiled programs, a
library's caches and thread pools, the first page faults); a server pays it once per process,
a command-line tool on every call. `first_compiles` runs this module in one new process per
engine, which loads the tokenizer, sets the engine up (timed apart), then times the first
compile of the tool-call schema, its first mask, and a second compile of the same language
under another schema text (so no cache answers it).

    python -m pegmask.bench.fresh_compile ENGINE VOCAB   # prints one JSON object
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

from pegmask.bench.grammar_engines import NAMES, Compiled, make_engine
from pegmask.bench.grammar_inputs import load_model, tool_call_case

TIMEOUT_S = 300


def measure(name: str, vocab: str) -> dict[str, Any]:
    """Setup, first compile, first mask and second compile of engine `name`, in ms."""
    model = load_model(vocab)
    start = time.perf_counter_ns()
    engine = make_engine(name, "default", model, warm_up=False)
    setup_ns = time.perf_counter_ns() - start
    times = []
    for repeat in (0, 1):
        case = tool_call_case(repeat)
        start = time.perf_counter_ns()
        compiled = engine.compile(case.kind, case.source)
        compile_ns = time.perf_counter_ns() - start
        if isinstance(compiled, Compiled):  # built in outlines-core's helper process
            compiled, compile_ns = compiled.grammar, compiled.compile_ns
        start = time.perf_counter_ns()
        engine.fill(engine.matcher(compiled))()
        times.append((compile_ns, time.perf_counter_ns() - start))
    engine.close()
    return {"engine": name, "setup_ms": setup_ns / 1e6, "first_compile_ms": times[0][0] / 1e6,
            "first_mask_ms": times[0][1] / 1e6, "second_compile_ms": times[1][0] / 1e6}


def first_compiles(vocab: str, engines: tuple[str, ...] = NAMES) -> dict[str, dict[str, Any]]:
    """`measure` for each engine, each in a new Python process; an engine whose process fails
    gets its error text instead."""
    results = {}
    for name in engines:
        command = [sys.executable, "-m", "pegmask.bench.fresh_compile", name, vocab]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            results[name] = {"engine": name, "error": f"over {TIMEOUT_S} s"}
            continue
        lines = done.stdout.strip().splitlines()
        if done.returncode != 0 or not lines:
            error = (done.stderr.strip().splitlines() or ["no output"])[-1]
            results[name] = {"engine": name, "error": error[:200]}
        else:
            results[name] = json.loads(lines[-1])
    return results


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] not in NAMES:
        raise SystemExit(f"usage: python -m pegmask.bench.fresh_compile {{{','.join(NAMES)}}} "
                         "VOCAB")
    print(json.dumps(measure(args[0], args[1])))


if __name__ == "__main__":
    main()
