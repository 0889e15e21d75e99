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

    pegmask bench e2e [--quick] [--prompts N] [--max-tokens N] [--model PATH] [--out F.md]

Results go to bench/results/decode_throughput[_quick].md, with JSON and a PNG beside it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import torch

from pegmask.bench.data import JSONSCHEMA_DIR
from pegmask.bench.plots import bars
from pegmask.bench.reporting import (
    RESULTS_DIR,
    command_line,
    machine,
    machine_info,
    publish,
    write_json,
)
from pegmask.bench.vllm_check import valid as valid_json
from pegmask.engine import Engine
from pegmask.engine.decode import DecodeStats

QUICK = {"prompts": 3, "max_tokens": 32}
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
    def tokens_per_s(self) -> float:
        """Output tokens (forced ones included) per second of decoding."""
        return self.stats.tokens / self.decode_s if self.decode_s else float("nan")

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


# The engine's own decode statistics (pegmask.engine.decode.DecodeStats, kept in
# `engine.stats`): the one internal this bench reads, here and in `Run`.
def _stats_snapshot(engine: Engine) -> DecodeStats:
    return dataclasses.replace(engine.stats)


def _stats_since(engine: Engine, before: DecodeStats) -> DecodeStats:
    after = engine.stats
    return DecodeStats(**{f.name: getattr(after, f.name) - getattr(before, f.name)
                          for f in dataclasses.fields(DecodeStats)})


def _measure(engine: Engine, requests: list[dict[str, Any]], schemas: list[dict[str, Any]],
             batch: bool, progress: Any) -> Run:
    before = _stats_snapshot(engine)
    if batch:
        results = engine.generate_batch(requests)
        progress.update(len(requests))
    else:
        results = []
        for request in map(dict, requests):
            results.append(engine.generate(request.pop("prompt"), **request))
            progress.update()
    valid = sum(valid_json(r.text, s) for r, s in zip(results, schemas, strict=True))
    return Run(_stats_since(engine, before), valid, len(results))


def run(engine: Engine, *, count: int, max_tokens: int, seed: int) -> dict[str, Run]:
    """The five modes: constrained cold, then unconstrained and constrained, one at a time and
    as one batch."""
    from tqdm import tqdm

    progress = tqdm(total=5 * count, desc="e2e", unit="request", file=sys.stderr,
                    dynamic_ncols=True)
    prompts = _prompts(engine, count)
    schemas = [schema for _, schema in prompts]
    plain = [{"prompt": p, "max_tokens": max_tokens, "temperature": 0.7, "seed": seed + i}
             for i, (p, _) in enumerate(prompts)]
    constrained = [{**r, "response_format": {"type": "json_schema", "json_schema": {
        "name": "answer", "schema": schema, "strict": True}}}
        for r, schema in zip(plain, schemas, strict=True)]
    with progress:
        runs = {"constrained, cold (compile + first masks)": _measure(
            engine, constrained, schemas, batch=False, progress=progress)}
        for batch in (False, True):
            label = f"batch of {count}" if batch else "one at a time"
            runs[f"unconstrained, {label}"] = _measure(engine, plain, schemas, batch, progress)
            runs[f"constrained, {label}"] = _measure(engine, constrained, schemas, batch,
                                                     progress)
    return runs


def report(engine: Engine, runs: dict[str, Run], *, count: int, max_tokens: int,
           command: str, plot: Path | None, out: Path) -> str:
    lines = [
        "# Decode throughput: constrained vs unconstrained",
        "",
        machine_info(("torch", "transformers")),
        "",
        f"Command: `{command}`",
        "",
        f"Model {engine.model_name} on {engine.backend.device} ({engine.backend.dtype}), "
        f"{torch.get_num_threads()} torch threads; {count} prompts, max_tokens {max_tokens}, "
        "temperature 0.7.",
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
            f"{r.tokens_per_s:.1f} | {r.per_token_ms(r.decode_s):.1f} | "
            f"{r.per_token_ms(s.mask_s):.2f} | {r.grammar_ms:.2f} | {r.valid}/{r.outputs} |")
    lines += ["", "Cost of constraining: the extra grammar time per sampled token over the "
              "unconstrained run, relative to its whole decode time per token (target <= 5%); "
              "and the decode tokens/s ratio (constrained / unconstrained, jump-forward "
              "included). Constrained rows stop when their JSON closes while unconstrained ones "
              "run to max_tokens, so a constrained batch decodes with fewer rows per step "
              "(`rows/step`): its lower batch tokens/s comes from that, not from masking.", ""]
    for label, (overhead, speed) in costs(runs, count).items():
        lines.append(f"* {label}: {overhead:+.1%}; tokens/s ratio {speed:.2f}")
    if plot:
        lines += ["", f"![decode throughput]({plot.relative_to(out.parent).as_posix()})"]
    return "\n".join(lines) + "\n"


def costs(runs: dict[str, Run], count: int) -> dict[str, tuple[float, float]]:
    """Per way of decoding: (grammar overhead per token, constrained / unconstrained
    tokens/s)."""
    found = {}
    for label in ("one at a time", f"batch of {count}"):
        free, bound = runs[f"unconstrained, {label}"], runs[f"constrained, {label}"]
        overhead = (bound.grammar_ms - free.grammar_ms) / free.per_token_ms(free.decode_s)
        found[label] = (overhead, bound.tokens_per_s / free.tokens_per_s)
    return found


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(prog="pegmask bench e2e",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"a few minutes: {QUICK['prompts']} prompts, max_tokens "
                        f"{QUICK['max_tokens']}")
    parser.add_argument("--model", help="GGUF file or HF folder (default: embedded SmolLM2)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--prompts", type=int, help=f"at most {len(SCHEMAS)} (the default)")
    parser.add_argument("--max-tokens", type=int, help="per output (default 64)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int)
    parser.add_argument("--no-plots", action="store_true")
    parser.add_argument("--out", "--output", type=Path, dest="out",
                        help="markdown report (JSON and PNG beside it; default "
                        "bench/results/decode_throughput[_quick].md)")
    args = parser.parse_args(argv)
    quick = QUICK if args.quick else {}
    count = min(args.prompts if args.prompts is not None
                else quick.get("prompts", len(SCHEMAS)), len(SCHEMAS))
    max_tokens = args.max_tokens if args.max_tokens is not None else quick.get("max_tokens", 64)
    if count < 1 or max_tokens < 1:
        parser.error("--prompts and --max-tokens must be at least 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    engine = Engine(args.model, device=args.device)
    runs = run(engine, count=count, max_tokens=max_tokens, seed=args.seed)
    out = args.out or RESULTS_DIR / ("decode_throughput_quick.md" if args.quick
                                     else "decode_throughput.md")
    plot = None if args.no_plots else bars(
        list(runs), {"decode tokens/s": [r.tokens_per_s for r in runs.values()]},
        title=f"Decode throughput, {engine.model_name}", ylabel="tokens/s",
        out=out.with_suffix(".png"))
    command = command_line("e2e", argv)
    publish(report(engine, runs, count=count, max_tokens=max_tokens, command=command,
                   plot=plot, out=out), out)
    write_json({"command": command, "machine": machine(("torch", "transformers")),
                "model": engine.model_name, "prompts": count, "max_tokens": max_tokens,
                "modes": {label: {**dataclasses.asdict(r.stats), "valid": r.valid,
                                  "outputs": r.outputs, "tokens_per_s": r.tokens_per_s}
                          for label, r in runs.items()},
                "costs": {label: {"grammar_overhead": overhead, "tokens_per_s_ratio": speed}
                          for label, (overhead, speed) in costs(runs, count).items()}},
               out.with_suffix(".json"))


if __name__ == "__main__":
    main()
