"""Decode throughput with and without grammar constraints, on the same prompts and model.

Each prompt asks for a JSON object following a real-world schema from data/jsonschema. It is
rendered as a chat once, then decoded as a plain completion twice: unconstrained, and under the
schema's grammar (`response_format` json_schema). Both runs take the same code path, so the
difference is the cost of constraining: filling and applying the token bitmask (and what
jump-forward saves). Reported per mode, single requests and one batch of all prompts:

* tokens/s (output tokens, forced ones included) and decode steps/s;
* mean time per step in the forward, in masks (fill + apply) and in sampling;
* overhead: constrained time per step over unconstrained time per step, minus one;
* how many outputs are valid JSON under their schema (what the constraint buys).

Run: `python -m pegmask.bench.decode_throughput` (or `pegmask bench e2e`); results go to
bench/results/decode_throughput.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
from pathlib import Path
from typing import Any

import jsonschema
import torch

from pegmask.bench.data import JSONSCHEMA_DIR
from pegmask.engine import Engine
from pegmask.engine.decode import DecodeStats

RESULTS = Path(__file__).parent / "results" / "decode_throughput.md"
SCHEMAS = [
    "BFCL_simple_11.json", "BFCL_simple_251.json", "BFCL_simple_189.json",
    "BFCL_parallel_41.json", "BFCL_simple_281.json", "BFCL_parallel_148.json",
    "Glaiveai2K---generate_random_password_def83a6c.json",
    "Glaiveai2K---search_product_c8556430.json",
]


@dataclasses.dataclass
class Run:
    """Totals of one mode: decode statistics, valid outputs. Times are normalized per sampled
    token (a row in a step), so batches whose rows finish at different times compare too."""

    stats: DecodeStats
    valid: int
    outputs: int

    @property
    def sampled(self) -> int:
        return max(1, self.stats.tokens - self.stats.forced_tokens)

    @property
    def decode_s(self) -> float:
        s = self.stats
        return s.forward_s + s.mask_s + s.sample_s

    def per_token_ms(self, seconds: float) -> float:
        return 1000 * seconds / self.sampled

    @property
    def grammar_ms(self) -> float:
        """Masks (fill + apply) and sampling with its matcher and output work."""
        return self.per_token_ms(self.stats.mask_s + self.stats.sample_s)


def _prompts(engine: Engine, count: int) -> list[tuple[str, dict[str, Any]]]:
    from pegmask.engine.requests import build_request

    prompts = []
    for name in SCHEMAS[:count]:
        schema = json.loads((JSONSCHEMA_DIR / name).read_text())["schema"]
        messages = [{"role": "user", "content": "Reply with only a JSON object for this schema:\n"
                     + json.dumps(schema)}]
        prompts.append((engine.render(build_request(messages)), schema))
    return prompts


def _valid(text: str, schema: dict[str, Any]) -> bool:
    try:
        jsonschema.validate(json.loads(text), schema)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def _measure(engine: Engine, requests: list[dict[str, Any]], schemas: list[dict[str, Any]],
             batch: bool) -> Run:
    before = dataclasses.replace(engine.stats)
    if batch:
        results = engine.generate_batch(requests)
    else:
        results = [engine.generate(r.pop("prompt"), **r) for r in map(dict, requests)]
    after = engine.stats
    delta = DecodeStats(**{f.name: getattr(after, f.name) - getattr(before, f.name)
                           for f in dataclasses.fields(DecodeStats)})
    valid = sum(_valid(r.text, s) for r, s in zip(results, schemas, strict=True))
    return Run(delta, valid, len(results))


def run(engine: Engine, *, count: int, max_tokens: int, seed: int) -> dict[str, Run]:
    prompts = _prompts(engine, count)
    schemas = [schema for _, schema in prompts]
    plain = [{"prompt": p, "max_tokens": max_tokens, "temperature": 0.7, "seed": seed + i}
             for i, (p, _) in enumerate(prompts)]
    constrained = [{**r, "response_format": {"type": "json_schema", "json_schema": {
        "name": "answer", "schema": schema, "strict": True}}}
        for r, schema in zip(plain, schemas, strict=True)]
    runs = {"constrained, cold (compile + first masks)": _measure(engine, constrained, schemas,
                                                                   batch=False)}
    for batch in (False, True):
        label = f"batch of {count}" if batch else "one at a time"
        runs[f"unconstrained, {label}"] = _measure(engine, plain, schemas, batch)
        runs[f"constrained, {label}"] = _measure(engine, constrained, schemas, batch)
    return runs


def report(engine: Engine, runs: dict[str, Run], *, count: int, max_tokens: int) -> str:
    lines = [
        "# Decode throughput: constrained vs unconstrained",
        "",
        f"{datetime.date.today()}, model {engine.model_name} on {engine.backend.device} "
        f"({engine.backend.dtype}), torch {torch.__version__}, {torch.get_num_threads()} "
        f"threads, {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs (load average {os.getloadavg()[0]:.1f} at the end: other jobs "
        f"share them); max_tokens {max_tokens}, temperature 0.7.",
        "",
        "Same chat-rendered prompts (a JSON object for a data/jsonschema schema), decoded as "
        "completions: unconstrained, and under the schema's grammar (strict json_schema). "
        "The prompts' forward (prefill) is counted apart. Times are per sampled token (one "
        "row of one step); `forced` tokens were appended by jump-forward without sampling. "
        "`grammar` is the masks (fill + apply) plus sampling with the matcher, jump-forward "
        "and output work.",
        "",
        "| mode | prefill s | steps | rows/step | tokens (forced) | decode tokens/s | "
        "decode ms/token | mask ms/token | grammar ms/token | valid JSON |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label, r in runs.items():
        s = r.stats
        lines.append(
            f"| {label} | {s.prefill_s:.2f} | {s.steps} | {r.sampled / max(1, s.steps):.1f} | "
            f"{s.tokens} ({s.forced_tokens}) | "
            f"{s.tokens / r.decode_s:.1f} | {r.per_token_ms(r.decode_s):.1f} | "
            f"{r.per_token_ms(s.mask_s):.2f} | {r.grammar_ms:.2f} | {r.valid}/{r.outputs} |")
    lines += ["", "Cost of constraining: the extra grammar time per sampled token over the "
              "unconstrained run, relative to its whole decode time per token (target <= 5%); "
              "and the decode tokens/s ratio (constrained / unconstrained, jump-forward "
              "included). Constrained rows stop when their JSON closes while unconstrained ones "
              "run to max_tokens, so a constrained batch decodes with fewer rows per step "
              "(`rows/step`): its lower batch tokens/s comes from that, not from masking.", ""]
    for label in ("one at a time", f"batch of {count}"):
        free, bound = runs[f"unconstrained, {label}"], runs[f"constrained, {label}"]
        overhead = (bound.grammar_ms - free.grammar_ms) / free.per_token_ms(free.decode_s)
        speed = (bound.stats.tokens / bound.decode_s) / (free.stats.tokens / free.decode_s)
        lines.append(f"* {label}: {overhead:+.1%}; tokens/s ratio {speed:.2f}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="GGUF file or HF folder (default: embedded SmolLM2)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--prompts", type=int, default=len(SCHEMAS))
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    engine = Engine(args.model, device=args.device)
    count = min(args.prompts, len(SCHEMAS))
    runs = run(engine, count=count, max_tokens=args.max_tokens, seed=args.seed)
    text = report(engine, runs, count=count, max_tokens=args.max_tokens)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
