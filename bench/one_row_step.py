"""The single stream's decode step: one sequence's one-token forward, eager against the
compiled step (engine/compiled_step.py), on the same weights in one process.

For each context length, a sequence holds that many prompt tokens; then `--steps` one-token
forwards are timed, each followed by a truncate back to the prompt (the same cache and
positions every time), alternating eager and compiled runners in rounds so that a change of
the machine's speed touches both alike. Reported: the median and p99 of each, their ratio,
and the build time of the compiled step (a first build on a machine, or one from inductor's
on-disk cache: the report says which it measured only by its size).

    pegmask bench one_row_step [--contexts 100,230,1000] [--steps 200] [--weights auto]
        [--model PATH] [--out bench/results/one_row_step.md]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from pegmask.bench.reporting import (
    RESULTS_DIR,
    command_line,
    load_average,
    machine,
    machine_info,
    publish,
    write_json,
)
from pegmask.bench.serve_bench import quantile
from pegmask.engine.model import load_backend

ROUNDS = 5  # eager and compiled alternate this many times per context length


def time_steps(runner, seq: int, context: int, steps: int) -> list[float]:
    """Seconds of each of `steps` one-token forwards at position `context`."""
    times = []
    for k in range(steps):
        start = time.perf_counter()
        runner.forward([(seq, [400 + k % 1000])])
        times.append(time.perf_counter() - start)
        runner.truncate(seq, context)
    return times


def measure(args: argparse.Namespace) -> dict:
    backend = load_backend(args.model)
    step = backend.one_row_step(args.weights)
    start = time.perf_counter()
    step.warm()
    build_s = time.perf_counter() - start
    runners = {"eager": backend.runner(weights=args.weights),
               "compiled": backend.runner(weights=args.weights, compiled_step=True)}
    rows = []
    for context in args.contexts:
        prompt = [100 + k % 1000 for k in range(context)]
        seqs = {}
        for name, runner in runners.items():
            seqs[name] = runner.add()
            runner.forward([(seqs[name], prompt)])
        times: dict[str, list[float]] = {name: [] for name in runners}
        runs = step.runs
        for _ in range(ROUNDS):
            for name, runner in runners.items():
                times[name] += time_steps(runner, seqs[name], context, args.steps // ROUNDS)
        if step.runs - runs != len(times["compiled"]):
            raise RuntimeError("some compiled steps ran eagerly: the figures would mix paths")
        for name, runner in runners.items():
            runner.remove(seqs[name])
        rows.append({"context": context, **{
            name: {"median_ms": statistics.median(values) * 1e3,
                   "p99_ms": quantile(values, 0.99) * 1e3, "steps": len(values)}
            for name, values in times.items()}})
    return {"build_s": build_s, "rows": rows}


def report(result: dict, meta: dict) -> str:
    lines = ["# The single stream's step: eager and compiled", "", machine_info(), "",
             f"Command: `{meta['command']}`; weights `{meta['weights']}`, "
             f"{torch.get_num_threads()} threads; load average {meta['load_start']:.2f} at the "
             f"start, {meta['load_end']:.2f} at the end.", "",
             "One sequence's one-token forward (logits of the next token), timed over "
             f"{meta['steps']} steps per path at each context length, eager and compiled "
             f"alternating in {ROUNDS} rounds, each step at the same position (the sequence "
             "truncated back after it). Compiled: engine/compiled_step.py, built in "
             f"{result['build_s']:.1f} s in this run.", "",
             "| context tokens | eager median / p99 ms | compiled median / p99 ms | eager / "
             "compiled (median) |", "|---|---|---|---|"]
    for row in result["rows"]:
        eager, compiled = row["eager"], row["compiled"]
        lines.append(f"| {row['context']} | {eager['median_ms']:.2f} / {eager['p99_ms']:.2f} | "
                     f"{compiled['median_ms']:.2f} / {compiled['p99_ms']:.2f} | "
                     f"{eager['median_ms'] / compiled['median_ms']:.2f}x |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pegmask bench one_row_step", description=__doc__)
    parser.add_argument("--contexts", type=lambda text: [int(x) for x in text.split(",")],
                        default=[100, 230, 1000])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--weights", default="auto")
    parser.add_argument("--model", default=None)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "one_row_step.md")
    args = parser.parse_args(argv)
    meta = {"command": command_line("one_row_step", argv if argv is not None else sys.argv[1:]),
            "load_start": load_average(), "weights": args.weights, "steps": args.steps}
    with torch.inference_mode():
        result = measure(args)
    meta["load_end"] = load_average()
    publish(report(result, meta), args.out)
    write_json({"meta": meta, "machine": machine(()), **result}, args.out.with_suffix(".json"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
