"""A step of many cold rows: 32 rows, each with its own new JSON Schema, stepping together, as
a GPU batch does (issue 60: a step of 32 rows takes a few milliseconds there, so 32 rows
each meeting a new state at once is what a mask's cold cost adds to a step). Measured on the
CPU, in one process, pegmask against xgrammar and llguidance at their defaults, on SmolLM2's
vocabulary.

Each row gets a real schema of data/jsonschema (`grammar_inputs.load_cases`, with a
description naming the run, so no compiled-grammar cache answers) and walks its valid instance
token by token. A step fills the mask of every row that has a token left, then each row
accepts its token (not timed). The **step** time is the masks of all the step's rows:
pegmask and the peers row by row (`fill_next_token_bitmask` per row), and the peers' batch
APIs as well (xgrammar's `BatchGrammarMatcher.batch_fill_next_token_bitmask`, llguidance's
`fill_next_token_bitmask_par` on an `LLExecutor`). The compiles come first and are reported
apart (total over the rows). Reported: median and p99 step time over the steps of `--runs` runs.

    pegmask bench batch_masks [--rows 32] [--runs 3] [--out FILE.md]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pegmask.bench.grammar_engines import CompileError, Engine, make_engine
from pegmask.bench.grammar_inputs import Case, Model, load_cases, load_model
from pegmask.bench.reporting import (
    RESULTS_DIR,
    command_line,
    machine,
    machine_info,
    publish,
    write_json,
)

ENGINES = ("pegmask", "xgrammar", "llguidance")
#: how each engine fills a step's masks: every engine row by row, the peers also batched
MODES = (("pegmask", "rows"), ("xgrammar", "rows"), ("xgrammar", "batch"),
         ("llguidance", "rows"), ("llguidance", "batch"))


def row_cases(engines: dict[str, Engine], rows: int) -> list[Case]:
    """`rows` object schemas spread over data/jsonschema that every engine compiles."""
    cases = []
    for case in load_cases(8 * rows):
        if len(cases) == rows:
            break
        if isinstance(case.schema, dict) and all(_compiles(e, case) for e in engines.values()):
            cases.append(case)
    if len(cases) < rows:
        raise ValueError(f"data/jsonschema has {len(cases)} schemas all engines compile, "
                         f"fewer than {rows}")
    return cases


def made_new(cases: Sequence[Case], label: str) -> list[Case]:
    """The cases with a description naming `label` and the row: texts no cache has seen."""
    return [Case(c.name, {**c.schema, "description": f"row {i}, {label}"}, c.instance)
            for i, c in enumerate(cases)]


def _compiles(engine: Engine, case: Case) -> bool:
    try:
        engine.compile("json_schema", case.source)
    except CompileError:
        return False
    return True


def _filler(engine: Engine, mode: str, bitmask: np.ndarray
            ) -> Callable[[list[tuple[Any, int]]], None]:
    """Fills the masks of (matcher, row) pairs into `bitmask` the way `mode` says."""
    if engine.name == "llguidance":
        import llguidance.numpy as lln

        if mode == "batch":
            executor = lln.LLExecutor()
            return lambda pairs: lln.fill_next_token_bitmask_par(executor, pairs, bitmask)
        return lambda pairs: [lln.fill_next_token_bitmask(m, bitmask, row) for m, row in pairs]
    if mode == "batch":
        import xgrammar as xgr

        batch = xgr.BatchGrammarMatcher()
        return lambda pairs: batch.batch_fill_next_token_bitmask(
            [m for m, _ in pairs], bitmask, [row for _, row in pairs])
    return lambda pairs: [m.fill_next_token_bitmask(bitmask, row) for m, row in pairs]


def run_steps(engine: Engine, mode: str, cases: Sequence[Case], model: Model
              ) -> dict[str, Any]:
    """Compile every row's schema, then step all rows together: the step times (ms)."""
    start = time.perf_counter()
    matchers = [engine.matcher(engine.compile("json_schema", c.source)) for c in cases]
    compile_ms = (time.perf_counter() - start) * 1e3
    tokens = [model.encode(c.text) for c in cases]
    bitmask = np.zeros((len(cases), (model.size + 31) // 32), dtype=np.int32)
    if engine.name == "xgrammar":  # its fill takes a torch tensor's memory
        import torch

        bitmask_arg: Any = torch.from_numpy(bitmask)
    else:
        bitmask_arg = bitmask
    fill = _filler(engine, mode, bitmask_arg)
    accepts = [engine.accept(m) for m in matchers]
    steps: list[float] = []
    full = 0  # the first steps, where every row has a token left
    for step in range(max(map(len, tokens))):
        pairs = [(matchers[row], row) for row in range(len(cases)) if step < len(tokens[row])]
        begin = time.perf_counter()
        fill(pairs)
        steps.append((time.perf_counter() - begin) * 1e3)
        full += len(pairs) == len(cases)
        for _, row in pairs:
            token = tokens[row][step]
            if not bitmask[row, token >> 5] >> (token & 31) & 1 or accepts[row](token) is False:
                raise AssertionError(f"{engine.name} rejects {cases[row].name}'s token {step}")
    return {"compile_ms": compile_ms, "steps_ms": steps, "full_steps_ms": steps[:full]}


def measure(engines: dict[str, Engine], model: Model, rows: int, runs: int
            ) -> dict[str, dict[str, Any]]:
    """Each mode's step times over `runs` runs (new schema texts each run and mode), modes
    rotating."""
    found: dict[str, dict[str, Any]] = {}
    base = row_cases(engines, rows)
    for run in range(runs):
        for offset in range(len(MODES)):
            name, mode = MODES[(run + offset) % len(MODES)]
            label = f"{name} ({mode})"
            figures = found.setdefault(label, {"compile_ms": [], "steps_ms": [],
                                               "full_steps_ms": []})
            if "error" in figures:
                continue
            gc.collect()
            try:
                result = run_steps(engines[name], mode, made_new(base, f"{label}, run {run}"),
                                   model)
            except CompileError as exc:
                figures["error"] = " ".join(str(exc).split())[:200]
                continue
            figures["compile_ms"].append(result["compile_ms"])
            figures["steps_ms"] += result["steps_ms"]
            figures["full_steps_ms"] += result["full_steps_ms"]
    return {label: summary(figures) for label, figures in found.items()}


def summary(figures: dict[str, Any]) -> dict[str, Any]:
    if "error" in figures:
        return {"error": figures["error"]}
    steps, full = figures["steps_ms"], figures["full_steps_ms"]
    return {"compile_ms": statistics.median(figures["compile_ms"]),
            "full_median_step_ms": statistics.median(full),
            "full_p99_step_ms": float(np.percentile(full, 99)),
            "steps": len(steps), "median_step_ms": statistics.median(steps),
            "p99_step_ms": float(np.percentile(steps, 99)), "max_step_ms": max(steps),
            "total_mask_ms": sum(steps) / len(figures["compile_ms"])}


def report(results: dict[str, dict[str, Any]], rows: int, argv: Sequence[str]) -> str:
    lines = [f"# A step of {rows} cold rows, each with its own new schema (SmolLM2's vocabulary)",
             "", __doc__.split("\n\n")[1].replace("\n", " "), "",
             f"Reproduce: `{command_line('batch_masks', argv)}`", "", machine_info(), "",
             "All steps, and the first ones, where every row has a token left (the instances' "
             "lengths differ, so later steps hold fewer rows):", "",
             "| engine (fill) | median step ms | p99 step ms | all rows: median / p99 ms "
             "| max step ms | masks per run ms | compiles ms | steps |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for label, r in results.items():
        if "error" in r:
            lines.append(f"| {label} | error: {r['error']} |||||||")
            continue
        lines.append(f"| {label} | {r['median_step_ms']:.3f} | {r['p99_step_ms']:.2f} | "
                     f"{r['full_median_step_ms']:.3f} / {r['full_p99_step_ms']:.2f} | "
                     f"{r['max_step_ms']:.2f} | {r['total_mask_ms']:.1f} | "
                     f"{r['compile_ms']:.1f} | {r['steps']} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(prog="pegmask bench batch_masks",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=32, help="rows stepping together")
    parser.add_argument("--runs", type=int, default=3, help="runs, new schemas each")
    parser.add_argument("--out", type=Path, help="markdown report (JSON beside it; default "
                        "bench/results/batch_masks.md)")
    args = parser.parse_args(argv)
    if args.rows < 1 or args.runs < 1:
        parser.error("--rows and --runs must be at least 1")
    model = load_model("smollm2")
    engines = {name: make_engine(name, "default", model) for name in ENGINES}
    measure(engines, model, 2, 1)  # warm-up: the process's one-time costs
    gc.collect()
    gc.freeze()
    results = measure(engines, model, args.rows, args.runs)
    for engine in engines.values():
        engine.close()
    out = args.out or RESULTS_DIR / "batch_masks.md"
    publish(report(results, args.rows, argv), out)
    write_json({"rows": args.rows, "runs": args.runs, "machine": machine(),
                "results": results}, out.with_suffix(".json"))


if __name__ == "__main__":
    main()
