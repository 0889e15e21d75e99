"""What the prefix cache saves: the serve bench's constrained requests (its questions, its two
tools, `tool_choice="required"`) decoded together in process, by an engine that keeps prompt
prefixes and one that does not, in alternating rounds so both see the same machine load.

    python -m pegmask.bench.prefix_cache [--requests 8] [--max-tokens 64] [--rounds 2]
        [--out bench/results/prefix_cache.md]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

from pegmask.bench.reporting import RESULTS_DIR, machine_info, publish
from pegmask.bench.serve_bench import QUESTIONS, TOOLS
from pegmask.engine import Engine


def batch(engine: Engine, requests: int, max_tokens: int) -> dict[str, Any]:
    """One batch of constrained requests: wall time, tokens, prompt tokens read from the cache."""
    bodies = [{"messages": [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}],
               "tools": [{"type": "function", "function": tool} for tool in TOOLS],
               "tool_choice": "required", "max_tokens": max_tokens, "seed": i}
              for i in range(requests)]
    start = time.perf_counter()
    results = engine.generate_batch(bodies)
    wall = time.perf_counter() - start
    return {"wall_s": wall,
            "tokens": sum(r.usage["completion_tokens"] for r in results),
            "prompt_tokens": sum(r.usage["prompt_tokens"] for r in results),
            "cached_tokens": sum(r.usage["prompt_tokens_details"]["cached_tokens"]
                                 for r in results),
            "outputs": [r.token_ids for r in results]}


def report(rounds: dict[str, list[dict[str, Any]]], requests: int, max_tokens: int,
           command: str) -> str:
    lines = ["# Prefix cache: constrained requests with and without it", "",
             machine_info(()), "", f"Command: `{command}`", "",
             f"{requests} requests with the serve bench's two tools under "
             f'`tool_choice="required"`, decoded together (`Engine.generate_batch`), '
             f"max_tokens {max_tokens}; the two engines alternate, round by round.", "",
             "| engine | round | wall | output tokens | tokens/s | prompt tokens | from the cache |",
             "|---|---|---|---|---|---|---|"]
    for name, runs in rounds.items():
        for i, run in enumerate(runs):
            lines.append(f"| {name} | {i} | {run['wall_s']:.1f} s | {run['tokens']} | "
                         f"{run['tokens'] / run['wall_s']:.1f} | {run['prompt_tokens']} | "
                         f"{run['cached_tokens']} |")
    kept = statistics.median(r["wall_s"] for r in rounds["prefix cache"])
    none = statistics.median(r["wall_s"] for r in rounds["no prefix cache"])
    same = all(a["outputs"] == b["outputs"]
               for a, b in zip(rounds["prefix cache"], rounds["no prefix cache"], strict=True))
    lines += ["", f"Median wall time: {kept:.1f} s with the cache, {none:.1f} s without "
              f"({none / kept:.2f}x). Same output tokens in both: {'yes' if same else 'no'}"
              + ("." if same else
                 " (bfloat16 products depend on how many rows they take, and a prompt that "
                 "starts from a kept prefix prefills fewer: the seeded draws part ways; the "
                 "float16-weight products, the same whatever the rows, keep them together)."), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "prefix_cache.md")
    args = parser.parse_args(argv)
    engines = {"prefix cache": Engine(prefix_cache=4), "no prefix cache": Engine(prefix_cache=0)}
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in engines}
    for _ in range(args.rounds):
        for name, engine in engines.items():
            rounds[name].append(batch(engine, args.requests, args.max_tokens))
    command = (f"python -m pegmask.bench.prefix_cache --requests {args.requests} "
               f"--max-tokens {args.max_tokens} --rounds {args.rounds}")
    publish(report(rounds, args.requests, args.max_tokens, command), args.out)


if __name__ == "__main__":
    main()
