"""Whether a heavy request stalls the other clients of a server: a slow grammar compile, or a
large body.

Starts `pegmask serve` (the embedded model) in a subprocess, and measures ordinary streaming
chat requests (one client with two small tools and `tool_choice="required"`, their grammar
compiled at warm-up; one without tools) in phases:

* **alone**: nothing else runs;
* **beside compiles**: while another client sends, back to back, requests that each compile a
  new grammar as slow as the default compile budget allows (a response format of distinct
  nested objects, sized here, before the server starts, to take about 80% of
  `--compile-timeout` in one worker, or as large as the compiler's instruction limit allows);
* **beside large bodies**: while another client sends, back to back, bodies of
  `--large-messages` short messages (40,000: 1.6 MB, far past the context: each ends in a 400
  after the server decoded, converted, rendered and tokenized it on its background lane,
  engine/background.py);
* **in-process compiles** (baseline, `--no-baseline` skips it): the compiles on a server started
  with `--compile-workers 0`, which compiles in its own process as pegmask did before the
  compile workers (the issue: a 16-token request took 31.5 s instead of 0.4 s).

Reported per phase: time to first token and inter-token latency (p50, p99; serve_bench's
client and percentiles), and their ratio to the alone phase; the target is 1.5x at most. The
compile requests ask for one token without closing (`max_tokens=1`, `close_on_length=false`):
what is measured is their compile, not their decoding.

    pegmask bench isolation [--quick] [--requests N] [--max-tokens 32] [--compile-timeout 10]
        [--large-messages 40000] [--no-baseline] [--out bench/results/isolation.md]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from pegmask.bench import plots
from pegmask.bench.reporting import (
    RESULTS_DIR,
    command_line,
    load_average,
    machine,
    machine_info,
    publish,
    write_json,
)
from pegmask.bench.serve_bench import (
    Sample,
    milliseconds,
    quantile,
    request_body,
    run_phase,
    stream_once,
)
from pegmask.bench.servers import served

TARGET = 1.5  # ratio to the alone phase, at most
QUESTION = "Fill in the form for my house."


def form_schema(objects: int, tag: str = "") -> dict[str, Any]:
    """A JSON Schema of `objects` distinct nested objects (their names start with `tag`): a
    grammar whose compile grows with `objects`, no shortcut making it cheap, up to the
    compiler's instruction limit at about 2,300. As a response format, not a tool: a tool's
    schema is written into the prompt, and this one would not fit in the model's context."""
    properties = {f"{tag}section_{i}": {
        "type": "object",
        "properties": {f"field_{i}_{j}": {"type": ["string", "integer"] if j % 2 else "number"}
                       for j in range(5)},
        "required": [f"field_{i}_0"]} for i in range(objects)}
    return {"type": "object", "properties": properties, "required": [f"{tag}section_0"]}


def form_format(objects: int, tag: str = "") -> dict[str, Any]:
    """`form_schema` as a `response_format`."""
    return {"type": "json_schema", "json_schema": {"name": "form",
                                                   "schema": form_schema(objects, tag)}}


def request_tag(number: int) -> str:
    """The names' prefix of the `number`th compile request: new in every request and run, and
    of one length, so that the size sizing found fits the compiler's limits in every request
    (a longer name makes a larger program)."""
    return f"r{os.getpid() % 10**7:07d}_{number % 10**4:04d}_"


# --------------------------------------------------------------------------- the slow grammar
def compile_seconds(objects: int) -> float | None:
    """What one compile worker spends on the hermes dialect's grammar for `form_format(objects)`
    (the embedded model's dialect), measured in this process; None past the compiler's limits."""
    from pegmask.dialects import get_dialect
    from pegmask.engine.compile_worker import compile_job
    from pegmask.engine.requests import build_request

    chat = build_request([{"role": "user", "content": QUESTION}],
                         response_format=form_format(objects, request_tag(0))).chat
    grammar = get_dialect("hermes").grammar(chat)
    started = time.perf_counter()
    reply = compile_job(grammar, _special_ids())
    return time.perf_counter() - started if reply[0] == "ok" else None


@functools.cache
def _special_ids() -> dict[str, int]:
    from pegmask.engine.model import default_model_path
    from pegmask.grammars.vocab import Vocabulary

    return dict(Vocabulary.from_gguf(default_model_path()).special_ids)


def calibrate(budget_s: float, steps: int) -> tuple[int, float]:
    """(objects, seconds): the largest `form_schema` found in `steps` compiles (doubling, then
    halving the interval) whose compile takes at most 80% of `budget_s`; (0, 0) if none."""
    good: tuple[int, float] = (0, 0.0)
    bad: int | None = None
    objects = 250
    for _ in range(steps):
        seconds = compile_seconds(objects)
        print(f"sizing the slow grammar: {objects} objects, "
              f"{'past the limits' if seconds is None else f'{seconds:.2f} s'}", file=sys.stderr)
        if seconds is not None and seconds <= 0.8 * budget_s:
            good = (objects, seconds)
        else:
            bad = objects
        if bad is None:
            objects *= 2
            continue
        if bad - good[0] <= max(10, good[0] // 20):
            break
        objects = (good[0] + bad) // 2
    return good


# --------------------------------------------------------------------------- phases
@dataclass
class Phase:
    """The ordinary requests of one phase, and the heavy requests beside them."""

    name: str
    samples: list[Sample]
    wall_s: float
    beside: list[tuple[float, int]] = field(default_factory=list)  # (seconds, HTTP status)
    unexpected: list[str] = field(default_factory=list)  # heavy requests answered otherwise
    expected_status: int = 200

    def summary(self) -> dict[str, Any]:
        done = [s for s in self.samples if s.error is None]
        ttft = [s.ttft for s in done if s.ttft is not None]
        gaps = [g for s in done for g in s.gaps()]
        return {
            "phase": self.name, "requests": len(self.samples),
            "errors": len(self.samples) - len(done), "wall_s": self.wall_s,
            "ttft_p50_s": quantile(ttft, 0.5), "ttft_p99_s": quantile(ttft, 0.99),
            "itl_p50_s": quantile(gaps, 0.5), "itl_p99_s": quantile(gaps, 0.99),
            "beside": len(self.beside),
            "beside_expected": sum(1 for _, status in self.beside
                                   if status == self.expected_status),
            "beside_p50_s": quantile([s for s, _ in self.beside], 0.5),
            "unexpected": sorted(set(self.unexpected))[:3],
        }

    def gaps(self) -> list[float]:
        return [g for s in self.samples if s.error is None for g in s.gaps()]


@dataclass
class Heavy:
    """What a phase's other client sends back to back: `body(model, number)` for its
    `number`-th request, answered with `expected_status` (a heavy request answered otherwise
    is reported)."""

    body: Callable[[str, int], dict[str, Any]]  # (model, number) -> body
    expected_status: int


def compile_heavy(objects: int) -> Heavy:
    """Requests that each compile a new `form_schema(objects)`."""
    return Heavy(lambda model, number: {
        "model": model, "messages": [{"role": "user", "content": QUESTION}],
        "response_format": form_format(objects, request_tag(number)),
        "max_tokens": 1, "close_on_length": False}, 200)


def large_body_heavy(messages: int) -> Heavy:
    """Bodies of `messages` short messages: a 400 (past the context) once rendered and
    tokenized."""
    turns = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i}"}
             for i in range(messages)] + [{"role": "user", "content": QUESTION}]
    return Heavy(lambda model, _: {"model": model, "messages": turns, "max_tokens": 1}, 400)


class _Quiet:
    def update(self, _: int) -> None:
        pass


async def ordinary(url: str, model: str, requests: int, max_tokens: int) -> list[Sample]:
    """Two streaming clients, one with tools (compiled at warm-up) and one without."""
    phases = await asyncio.gather(*(
        run_phase(url, model, ["chat"], mode, 1, requests, max_tokens, 3600.0, {}, _Quiet())
        for mode in ("constrained", "unconstrained")))
    return [sample for phase in phases for sample in phase.samples]


async def heavy_beside(url: str, model: str, heavy: Heavy, stop: asyncio.Event,
                       results: list[tuple[float, int]], unexpected: list[str]) -> None:
    """`heavy`'s requests, back to back, until `stop`."""
    async with httpx.AsyncClient(base_url=url, timeout=None) as client:
        number = 0
        while not stop.is_set():
            body = heavy.body(model, number)
            number += 1
            started = time.perf_counter()
            response = await client.post("/v1/chat/completions", json=body)
            results.append((time.perf_counter() - started, response.status_code))
            if response.status_code != heavy.expected_status:
                unexpected.append(f"HTTP {response.status_code}: {response.text[:160]}")


async def warm_up(url: str, model: str) -> None:
    """One request per kind, so that no phase pays the server's first compiles."""
    async with httpx.AsyncClient(base_url=url, timeout=None) as client:
        for mode in ("constrained", "unconstrained"):
            path, body = request_body("chat", QUESTION, mode, 4, model, 0)
            await stream_once(client, "chat", path, body)


async def run_phase_with(url: str, model: str, name: str, requests: int, max_tokens: int,
                         heavy: Heavy | None, lead_s: float) -> Phase:
    """The ordinary load, alone (`heavy` None) or beside heavy requests, which start `lead_s`
    earlier so that one is under way from the first ordinary request on."""
    stop = asyncio.Event()
    beside: list[tuple[float, int]] = []
    unexpected: list[str] = []
    task = None
    if heavy is not None:
        task = asyncio.ensure_future(heavy_beside(url, model, heavy, stop, beside, unexpected))
        await asyncio.sleep(lead_s)
    started = time.perf_counter()
    samples = await ordinary(url, model, requests, max_tokens)
    wall = time.perf_counter() - started
    stop.set()
    if task is not None:
        await task
    return Phase(name, samples, wall, beside, unexpected,
                 heavy.expected_status if heavy is not None else 200)


def serve_and_run(extra: list[str], plan: list[tuple[str, Heavy | None]], requests: int,
                  max_tokens: int) -> list[Phase]:
    with served(extra) as (url, model, _):

        async def phases() -> list[Phase]:
            await warm_up(url, model)
            return [await run_phase_with(url, model, name, requests, max_tokens, heavy, 1.0)
                    for name, heavy in plan]

        return asyncio.run(phases())


# --------------------------------------------------------------------------- report
def report(phases: list[Phase], meta: dict[str, Any]) -> str:
    rows = [p.summary() for p in phases]
    alone = rows[0]
    lines = [
        "# Serving beside heavy requests", "",
        machine_info(()), f"- load average (1 min) at the start: {meta['load_start']:.1f}",
        f"- command: `{meta['command']}`", "",
        f"Ordinary requests: 2 streaming chat clients (two small tools with tool_choice "
        f"required, and no tools), {meta['requests']} requests each, max_tokens "
        f"{meta['max_tokens']}. Beside them, back to back: requests that each compile a new "
        f"grammar of {meta['objects']} nested objects ({meta['compile_s']:.2f} s in one "
        f"worker, measured before the server started; compile budget "
        f"{meta['compile_timeout_s']:g} s), or bodies of {meta['large_messages']} short "
        f"messages ({meta['large_body_bytes'] / 1e6:.2f} MB, past the context: a 400 once "
        "rendered and tokenized).", "",
        "| phase | requests | errors | heavy beside (as expected) | heavy request p50 | "
        "TTFT p50 | TTFT p99 | ITL p50 | ITL p99 | TTFT p99 / alone | ITL p99 / alone |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['phase']} | {r['requests']} | {r['errors']} | "
            f"{r['beside']} ({r['beside_expected']}) | "
            f"{milliseconds(r['beside_p50_s'])} | {milliseconds(r['ttft_p50_s'])} | "
            f"{milliseconds(r['ttft_p99_s'])} | {milliseconds(r['itl_p50_s'])} | "
            f"{milliseconds(r['itl_p99_s'])} | {_ratio(r['ttft_p99_s'], alone['ttft_p99_s'])} | "
            f"{_ratio(r['itl_p99_s'], alone['itl_p99_s'])} |")
    unexpected = [f"{r['phase']}: {e}" for r in rows for e in r["unexpected"]]
    if unexpected:
        lines += ["", "Heavy requests answered otherwise: " + "; ".join(unexpected)]
    for r in rows[1:]:
        if r["phase"] not in ISOLATED:
            continue
        worst = max(_value(r[k], alone[k]) for k in
                    ("ttft_p50_s", "ttft_p99_s", "itl_p50_s", "itl_p99_s"))
        verdict = "within" if worst <= TARGET else "NOT within"
        lines += ["", f"{ISOLATED[r['phase']]}, the worst of the four figures is "
                      f"{worst:.2f}x the alone phase's: {verdict} the {TARGET}x target."]
    lines += ["", "The heavy requests pay for it: compile workers and the background lane "
                  "yield the cores to decoding (heavy request p50)."]
    return "\n".join(lines) + "\n"


# the phases whose heavy requests are isolated, and how the verdict names them
ISOLATED = {"beside compiles": "Beside compiles in workers",
            "beside large bodies": "Beside large bodies on the background lane"}


def _value(value: float | None, base: float | None) -> float:
    return value / base if value is not None and base else float("inf")


def _ratio(value: float | None, base: float | None) -> str:
    ratio = _value(value, base)
    return "-" if ratio == float("inf") else f"{ratio:.2f}x"


# --------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pegmask bench isolation", description=__doc__)
    parser.add_argument("--requests", type=int, default=12,
                        help="ordinary requests per client and phase (default 12)")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--compile-timeout", type=float, default=10.0,
                        help="the server's compile budget, seconds (default: the default, 10)")
    parser.add_argument("--objects", type=int, help="the slow grammar's size (default: sized "
                                                    "to the budget)")
    parser.add_argument("--large-messages", type=int, default=40_000,
                        help="messages in each large body (default 40000)")
    parser.add_argument("--no-baseline", action="store_true",
                        help="skip the in-process compiles phase")
    parser.add_argument("--quick", action="store_true",
                        help="4 requests per client, 24 tokens, a coarse sizing")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "isolation.md")
    args = parser.parse_args(argv)
    if args.quick:
        args.requests, args.max_tokens = 4, 24
    load_start = load_average()
    if args.objects:
        objects, seconds = args.objects, compile_seconds(args.objects) or 0.0
    else:
        objects, seconds = calibrate(args.compile_timeout, 4 if args.quick else 8)
    if not objects:
        parser.error("no grammar compiles within the budget here")
    budget = ["--compile-timeout", f"{args.compile_timeout:g}"]
    large = large_body_heavy(args.large_messages)
    phases = serve_and_run(budget, [("alone", None),
                                    ("beside compiles", compile_heavy(objects)),
                                    ("beside large bodies", large)],
                           args.requests, args.max_tokens)
    if not args.no_baseline:
        phases += serve_and_run(["--compile-workers", "0"],
                                [("in-process compiles", compile_heavy(objects))],
                                args.requests, args.max_tokens)
    meta = {"command": command_line("isolation", argv if argv is not None else sys.argv[1:]),
            "requests": args.requests, "max_tokens": args.max_tokens, "objects": objects,
            "compile_s": seconds, "compile_timeout_s": args.compile_timeout,
            "large_messages": args.large_messages,
            "large_body_bytes": len(json.dumps(large.body("", 0))),
            "load_start": load_start}
    publish(report(phases, meta), args.out)
    write_json({"meta": meta, "machine": machine(()),
                "phases": [p.summary() for p in phases]}, args.out.with_suffix(".json"))
    plots.distributions({p.name: p.gaps() for p in phases}, title="Inter-token latency",
                        ylabel="seconds", out=args.out.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
