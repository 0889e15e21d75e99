"""What shortest completions cost (`pegmask.grammars.completion`), beside what masks cost.

For the tool-call schema and an even spread of `data/jsonschema` schemas, on SmolLM2's
vocabulary: the per-program distances (once per compiled grammar) beside the compile, and
along each schema's valid instance, read byte by byte (every configuration a generation of it
passes), the first `completion_token_count` of each configuration (distance and plan, cold),
the same again (warm), and the closing candidates (the walk behind `fill_closing_bitmask`) at
every eighth configuration, beside the cold mask of that configuration.

    python -m pegmask.bench.completion_cost [--schemas 12] [--out bench/results/completion_cost.md]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

from pegmask.bench.grammar_bench import load_cases, tool_call_case
from pegmask.bench.reporting import RESULTS_DIR, load_average, publish
from pegmask.engine.model import default_model_path
from pegmask.grammars import Grammar
from pegmask.grammars.compiler import GrammarCompiler
from pegmask.grammars.vocab import Vocabulary

CLOSING_EVERY = 8


def measure(compiler: GrammarCompiler, name: str, schema: object, text: str) -> dict:
    start = time.perf_counter()
    grammar = Grammar.from_json_schema(schema)
    compiled = compiler.compile(grammar)
    compile_ms = (time.perf_counter() - start) * 1e3
    start = time.perf_counter()
    completions = compiled.completions
    program_ms = (time.perf_counter() - start) * 1e3
    matcher = compiled.matcher()
    cold, warm, closing, masks = [], [], [], []
    for position, byte in enumerate(text.encode()):
        state = matcher.state
        start = time.perf_counter()
        matcher.completion_token_count()
        cold.append(time.perf_counter() - start)
        start = time.perf_counter()
        matcher.completion_token_count()
        warm.append(time.perf_counter() - start)
        if position % CLOSING_EVERY == 0:
            start = time.perf_counter()
            compiled.mask(state)
            masks.append(time.perf_counter() - start)
            start = time.perf_counter()
            completions.closing_candidates(state)
            closing.append(time.perf_counter() - start)
        if not matcher.accept_string(bytes((byte,))):
            raise AssertionError(f"{name}: the valid instance is refused at byte {position}")
    return {
        "name": name, "instructions": len(grammar.program), "compile_ms": compile_ms,
        "program_ms": program_ms, "configurations": len(cold),
        "distance": completions.distance(compiled.initial_state),
        "cold_us": statistics.median(cold) * 1e6, "cold_max_ms": max(cold) * 1e3,
        "warm_us": statistics.median(warm) * 1e6,
        "closing_ms": statistics.median(closing) * 1e3,
        "closing_vs_mask": sum(closing) / sum(masks),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schemas", type=int, default=12)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "completion_cost.md")
    args = parser.parse_args(argv)
    compiler = GrammarCompiler(Vocabulary.from_gguf(default_model_path()))
    cases = [tool_call_case(0), *load_cases(args.schemas)]
    rows = []
    for case in cases:
        try:
            rows.append(measure(compiler, case.name, case.schema, case.text))
        except Exception as error:  # noqa: BLE001 - a schema the front-end refuses is listed
            print(f"{case.name}: skipped ({type(error).__name__}: {error})")
    header = ("| schema | instructions | compile ms | program distances ms (/ compile) "
              "| configurations "
              "| distance at start | completion cold µs (median) | cold max ms | warm µs "
              "| closing ms (median) | closing / cold mask |")
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for row in rows:
        lines.append(
            f"| {row['name']} | {row['instructions']} | {row['compile_ms']:.1f} "
            f"| {row['program_ms']:.1f} ({row['program_ms'] / row['compile_ms']:.2f}x) "
            f"| {row['configurations']} | {row['distance']} "
            f"| {row['cold_us']:.0f} | {row['cold_max_ms']:.1f} | {row['warm_us']:.1f} "
            f"| {row['closing_ms']:.2f} | {row['closing_vs_mask']:.2f}x |")
    load = (f"Load average at the end of the run: {load_average():.1f} on "
            f"{os.cpu_count()} CPUs (figures in ms scale with it; the ratios less so).")
    text = "\n".join(["# Shortest-completion cost (SmolLM2 vocabulary)", "",
                      __doc__.split("\n\n")[1].replace("\n", " "), "", load, "", *lines, ""])
    publish(text, args.out)


if __name__ == "__main__":
    main()
