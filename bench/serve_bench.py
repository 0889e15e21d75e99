"""Load on a serving endpoint: concurrent streaming clients with tools, across the three APIs.

By default it starts `pegmask serve` (the embedded model, or `--model`) in a subprocess on a
free loopback port, so the load generator never shares the server's interpreter; `--url` drives
any other OpenAI-compatible server with the same load instead (vLLM, say), through the APIs it
has (`--apis chat` for a server with Chat Completions only).

For each number of clients C (`--clients 1,8,32`) and each mode, C clients send streaming
requests back to back (each client cycles through the APIs) until `--requests` have been sent
(at least C) or `--time-limit` seconds have passed:

* **constrained**: a tool-call request with two tools and `tool_choice="required"` (`any` for
  Anthropic): the grammar is in force from the first token;
* **unconstrained**: the same conversation without tools: plain text.

Reported per phase: requests, output tokens (the usage the server reports), aggregate output
tokens/s over the phase's wall time, time to first token and inter-token latency (p50, p99; a
token is one streamed piece of text, a call's name or its arguments: a server that sends a call's
name at once and its arguments at the end has its first token at the name), and how many
constrained answers held a call
whose arguments parse as JSON. A probe then measures what a newcomer waits for: with C - 1
clients decoding, one more request's time to first token, against its time to first token alone.

    pegmask bench serve [--quick] [--url URL] [--clients 1,8,32] [--requests N]
        [--max-tokens 128] [--apis chat,responses,messages] [--modes constrained,unconstrained]
        [--model PATH] [--time-limit S] [--out bench/results/serve.md]

With `--compare`, `--peer` or `--peer-command` it is instead pegmask against other servers in one
invocation, under a fixed protocol and a load check (pegmask.bench.serve_compare, whose options
it then takes).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from pegmask.bench.reporting import RESULTS_DIR, publish, write_json
from pegmask.bench.servers import free_port, start_server, stop, wait_ready

APIS = ("chat", "responses", "messages")
MODES = ("constrained", "unconstrained")
# Options that make this bench the comparison of pegmask against peers (serve_compare.py).
COMPARE_FLAGS = {"--compare", "--peer", "--peer-command"}
QUESTIONS = [
    "What is the weather like in Paris today?",
    "Find me a flight from Oslo to Rome next Friday.",
    "How warm is it in Tokyo right now, in celsius?",
    "Book a flight from Lima to Quito for two people.",
]
TOOLS = [
    {"name": "get_weather", "description": "Current weather in a city",
     "parameters": {"type": "object", "properties": {
         "city": {"type": "string"},
         "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
     }, "required": ["city"]}},
    {"name": "search_flights", "description": "Flights between two cities on a date",
     "parameters": {"type": "object", "properties": {
         "origin": {"type": "string"}, "destination": {"type": "string"},
         "date": {"type": "string"}, "passengers": {"type": "integer"},
     }, "required": ["origin", "destination"]}},
]


# --------------------------------------------------------------------------- one request
@dataclass
class Sample:
    """One streamed request: when its pieces arrived and what it produced."""

    api: str
    started: float
    piece_times: list[float] = field(default_factory=list)
    tokens: int = 0
    ended: float = 0.0
    names: list[str] = field(default_factory=list)
    arguments: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def ttft(self) -> float | None:
        return self.piece_times[0] - self.started if self.piece_times else None

    def gaps(self) -> list[float]:
        times = self.piece_times
        return [b - a for a, b in zip(times, times[1:], strict=False)]


def request_body(api: str, question: str, mode: str, max_tokens: int, model: str,
                 seed: int | None, sampling: dict[str, Any] | None = None,
                 ) -> tuple[str, dict[str, Any]]:
    """(path, body) of one streaming request in an API's own shape. `seed` None sends none (a
    seeded request takes a slower sampling path in some servers); `sampling` (Chat Completions
    only: `temperature`, `ignore_eos`, ...) is added to the body as it is."""
    constrained = mode == "constrained"
    if api == "chat":
        body: dict[str, Any] = {"model": model, "stream": True, "max_tokens": max_tokens,
                                "stream_options": {"include_usage": True},
                                "messages": [{"role": "user", "content": question}],
                                **(sampling or {})}
        if seed is not None:
            body["seed"] = seed
        if constrained:
            body["tools"] = [{"type": "function", "function": tool} for tool in TOOLS]
            body["tool_choice"] = "required"
        return "/v1/chat/completions", body
    if api == "responses":
        body = {"model": model, "stream": True, "max_output_tokens": max_tokens,
                "input": question}
        if constrained:
            body["tools"] = [{"type": "function", **tool} for tool in TOOLS]
            body["tool_choice"] = "required"
        return "/v1/responses", body
    body = {"model": model, "stream": True, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": question}]}
    if constrained:
        body["tools"] = [{"name": t["name"], "description": t["description"],
                          "input_schema": t["parameters"]} for t in TOOLS]
        body["tool_choice"] = {"type": "any"}
    return "/v1/messages", body


async def _events(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    """The stream's `data:` events. Lines end at LF (after an optional CR), as the servers'
    do: httpx's `aiter_lines` also ends them at NEL, U+2028 and U+2029, which a server may
    send raw inside a JSON string."""
    rest = ""
    async for text in response.aiter_text():
        *lines, rest = (rest + text).split("\n")
        for line in lines:
            if line.startswith("data: ") and line[6:].strip() != "[DONE]":
                yield json.loads(line[6:].rstrip("\r"))


async def stream_once(client: httpx.AsyncClient, api: str, path: str,
                      body: dict[str, Any]) -> Sample:
    """Send one streaming request; record the arrival of every text or argument piece."""
    sample = Sample(api, time.perf_counter())
    calls: dict[int, list[str]] = {}
    try:
        async with client.stream("POST", path, json=body) as response:
            if response.status_code != 200:
                sample.error = f"HTTP {response.status_code}: {(await response.aread())[:200]!r}"
                return sample
            async for event in _events(response):
                now = time.perf_counter()
                piece, usage = _piece(api, event, calls)
                if piece:
                    sample.piece_times.append(now)
                if usage is not None:
                    sample.tokens = usage
    except httpx.HTTPError as exc:
        sample.error = f"{type(exc).__name__}: {exc}"
    sample.ended = time.perf_counter()
    sample.names = [calls[i][0] for i in sorted(calls)]
    sample.arguments = [calls[i][1] for i in sorted(calls)]
    return sample


def _add(calls: dict[int, list[str]], index: int, name: str = "", arguments: str = "") -> None:
    """Append streamed pieces of call `index`'s name and arguments."""
    call = calls.setdefault(index, ["", ""])
    call[0] += name
    call[1] += arguments


def _piece(api: str, event: dict[str, Any],
           calls: dict[int, list[str]]) -> tuple[bool, int | None]:
    """(whether the event carries output text or arguments, output tokens if it reports them);
    the calls' names and arguments are accumulated in `calls` by index."""
    if api == "chat":
        if event.get("usage"):
            return False, event["usage"]["completion_tokens"]
        piece = False
        for choice in event.get("choices") or []:
            delta = choice.get("delta") or {}
            piece |= bool(delta.get("content") or delta.get("reasoning_content"))
            for call in delta.get("tool_calls") or []:
                function = call.get("function") or {}
                arguments = function.get("arguments") or ""
                _add(calls, call.get("index", 0), function.get("name") or "", arguments)
                piece |= bool(arguments or function.get("name"))
        return piece, None
    kind = event.get("type", "")
    if api == "responses":
        if kind in ("response.completed", "response.incomplete"):
            usage = event["response"].get("usage") or {}
            return False, usage.get("output_tokens")
        named = (kind == "response.output_item.added"
                 and event["item"].get("type") == "function_call")
        if named:
            _add(calls, event["output_index"], event["item"].get("name") or "")
        if kind == "response.function_call_arguments.delta":
            _add(calls, event["output_index"], arguments=event["delta"])
        return named or kind in ("response.output_text.delta",
                                 "response.function_call_arguments.delta",
                                 "response.reasoning_text.delta"), None
    if kind == "message_delta":
        return False, (event.get("usage") or {}).get("output_tokens")
    if kind == "content_block_start" and event["content_block"].get("type") == "tool_use":
        _add(calls, event["index"], event["content_block"].get("name") or "")
        return True, None
    if kind == "content_block_delta":
        delta = event["delta"]
        if delta.get("type") == "input_json_delta":
            _add(calls, event["index"], arguments=delta["partial_json"])
        return bool(delta.get("text") or delta.get("partial_json") or delta.get("thinking")), None
    return False, None


# --------------------------------------------------------------------------- phases
@dataclass
class Phase:
    """The requests of one (clients, mode) phase and its wall time."""

    clients: int
    mode: str
    samples: list[Sample]
    wall_s: float
    probe_alone_s: float | None = None
    probe_loaded_s: float | None = None

    def summary(self) -> dict[str, Any]:
        done = [s for s in self.samples if s.error is None]
        ttft = [s.ttft for s in done if s.ttft is not None]
        gaps = [g for s in done for g in s.gaps()]
        tokens = sum(s.tokens for s in done)
        calls = [s for s in done if s.arguments]
        valid = sum(1 for s in calls if _all_json_objects(s.arguments))
        out = {
            "clients": self.clients, "mode": self.mode, "requests": len(self.samples),
            "errors": len(self.samples) - len(done), "tokens": tokens,
            "wall_s": self.wall_s, "tokens_per_s": tokens / self.wall_s if self.wall_s else 0,
            "ttft_p50_s": quantile(ttft, 0.5), "ttft_p99_s": quantile(ttft, 0.99),
            "itl_p50_s": quantile(gaps, 0.5), "itl_p99_s": quantile(gaps, 0.99),
            "with_calls": len(calls), "calls_valid": valid,
            "probe_alone_s": self.probe_alone_s, "probe_loaded_s": self.probe_loaded_s,
        }
        out["error_examples"] = sorted({s.error for s in self.samples if s.error})[:3]
        return out


def _all_json_objects(arguments: list[str]) -> bool:
    try:
        return all(isinstance(json.loads(a), dict) for a in arguments)
    except ValueError:
        return False


def quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run_phase(url: str, model: str, apis: list[str], mode: str, clients: int,
                    requests: int, max_tokens: int, time_limit: float,
                    headers: dict[str, str], progress: Any) -> Phase:
    """C clients sending streaming requests back to back until `requests` were sent."""
    counter = {"sent": 0}
    samples: list[Sample] = []
    deadline = time.perf_counter() + time_limit
    limits = httpx.Limits(max_connections=clients + 4)
    async with httpx.AsyncClient(base_url=url, timeout=None, limits=limits,
                                 headers=headers) as client:

        async def worker(index: int) -> None:
            while counter["sent"] < requests and time.perf_counter() < deadline:
                number = counter["sent"]
                counter["sent"] += 1
                api = apis[(index + number) % len(apis)]
                question = QUESTIONS[number % len(QUESTIONS)]
                path, body = request_body(api, question, mode, max_tokens, model, number)
                samples.append(await stream_once(client, api, path, body))
                progress.update(1)

        start = time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(clients)))
        wall = time.perf_counter() - start
    return Phase(clients, mode, samples, wall)


@dataclass
class _Background:
    """Requests that keep the server busy while a probe is measured."""

    wanted: int
    decoding: int = 0
    started: asyncio.Event = field(default_factory=asyncio.Event)
    stop: bool = False

    async def load(self, client: httpx.AsyncClient, api: str, path: str,
                   body: dict[str, Any]) -> None:
        async with client.stream("POST", path, json=body) as response:
            counted = False
            async for event in _events(response):
                if not counted and _piece(api, event, {})[0]:
                    counted = True
                    self.decoding += 1
                    if self.decoding == self.wanted:
                        self.started.set()
                if self.stop:
                    break


async def probe(url: str, model: str, api: str, mode: str, background: int, max_tokens: int,
                headers: dict[str, str], repeats: int = 3) -> float | None:
    """Median time to first token of a request sent once `background` others are decoding."""
    async with httpx.AsyncClient(base_url=url, timeout=None, headers=headers,
                                 limits=httpx.Limits(max_connections=background + 4)) as client:
        times = []
        for attempt in range(repeats):
            load = _Background(background)
            tasks = []
            for i in range(background):
                path, body = request_body(api, QUESTIONS[i % len(QUESTIONS)], mode,
                                          max_tokens * 4, model, 1000 + i)
                tasks.append(asyncio.ensure_future(load.load(client, api, path, body)))
            if background:
                try:
                    await asyncio.wait_for(load.started.wait(), timeout=300)
                except asyncio.TimeoutError:
                    pass  # measure anyway, with whatever is decoding
            path, body = request_body(api, QUESTIONS[attempt % len(QUESTIONS)], mode,
                                      max_tokens, model, 2000 + attempt)
            sample = await stream_once(client, api, path, body)
            load.stop = True
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if sample.ttft is not None:
                times.append(sample.ttft)
        return statistics.median(times) if times else None


# --------------------------------------------------------------------------- report
def report(phases: list[Phase], meta: dict[str, Any]) -> str:
    rows = [p.summary() for p in phases]
    lines = [
        "# Serving under load", "",
        f"{meta['date']}; server: {meta['server']}; model `{meta['model']}`; "
        f"{meta['machine']}; APIs {', '.join(meta['apis'])}; max_tokens {meta['max_tokens']}.",
        f"Command: `{meta['command']}`", "",
        "| clients | mode | requests | errors | output tokens | tokens/s | vs 1 client | "
        "TTFT p50 | TTFT p99 | ITL p50 | ITL p99 | calls valid |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    single = {r["mode"]: r["tokens_per_s"] for r in rows if r["clients"] == 1}
    for r in rows:
        base = single.get(r["mode"])
        speedup = f"{r['tokens_per_s'] / base:.2f}x" if base else "-"
        calls = (f"{r['calls_valid']}/{r['with_calls']}" if r["mode"] == "constrained"
                 else "-")
        lines.append(
            f"| {r['clients']} | {r['mode']} | {r['requests']} | {r['errors']} | {r['tokens']} | "
            f"{r['tokens_per_s']:.1f} | {speedup} | {milliseconds(r['ttft_p50_s'])} | "
            f"{milliseconds(r['ttft_p99_s'])} | {milliseconds(r['itl_p50_s'])} | {milliseconds(r['itl_p99_s'])} | "
            f"{calls} |")
    probes = [r for r in rows if r["probe_loaded_s"] is not None]
    if probes:
        lines += ["", "A newcomer's time to first token (median of 3): alone, and sent while "
                  "C - 1 other clients decode.", "",
                  "| clients | mode | TTFT alone | TTFT with C - 1 decoding | ratio |",
                  "|---|---|---|---|---|"]
        for r in probes:
            ratio = (r["probe_loaded_s"] / r["probe_alone_s"]) if r["probe_alone_s"] else None
            lines.append(f"| {r['clients']} | {r['mode']} | {milliseconds(r['probe_alone_s'])} | "
                         f"{milliseconds(r['probe_loaded_s'])} | "
                         f"{f'{ratio:.2f}x' if ratio else '-'} |")
    errors = [e for r in rows for e in r["error_examples"]]
    if errors:
        lines += ["", "Errors seen: " + "; ".join(errors)]
    return "\n".join(lines) + "\n"


def milliseconds(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f} ms"


def plot(phases: list[Phase], path: Path) -> None:
    """Aggregate tokens/s by clients, one line per mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 4))
    for mode in MODES:
        points = sorted((p.clients, p.summary()["tokens_per_s"]) for p in phases
                        if p.mode == mode)
        if points:
            axis.plot(*zip(*points, strict=True), marker="o", label=mode)
    axis.set_xlabel("concurrent streaming clients")
    axis.set_ylabel("output tokens/s (all clients)")
    axis.set_xscale("log", base=2)
    axis.grid(True, alpha=0.3)
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


# --------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if {a.split("=")[0] for a in argv} & COMPARE_FLAGS:
        from pegmask.bench import serve_compare

        return serve_compare.main([a for a in argv if a != "--compare"])
    parser = argparse.ArgumentParser(prog="pegmask bench serve", description=__doc__)
    parser.add_argument("--url", help="drive this server instead of starting pegmask")
    parser.add_argument("--api-key", default=os.environ.get("PEGMASK_BENCH_API_KEY"))
    parser.add_argument("--model", help="model for the pegmask server (default: embedded)")
    parser.add_argument("--clients", default="1,8,32")
    parser.add_argument("--requests", type=int, default=0,
                        help="requests per phase (default: 2 per client, at least 8)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--apis", default=",".join(APIS))
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--time-limit", type=float, default=300.0,
                        help="seconds per phase at most")
    parser.add_argument("--no-probe", action="store_true", help="skip the newcomer probe")
    parser.add_argument("--quick", action="store_true",
                        help="1 and 8 clients, 64 tokens, one request per client")
    parser.add_argument("--server-arg", action="append", default=[],
                        help="extra argument for `pegmask serve` (repeatable)")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "serve.md")
    args = parser.parse_args(argv)
    if args.quick:
        args.clients, args.max_tokens, args.time_limit = "1,8", 64, 120.0
    clients = [int(c) for c in args.clients.split(",")]
    apis = [a for a in args.apis.split(",") if a]
    modes = [m for m in args.modes.split(",") if m]
    for name, values, allowed in (("apis", apis, APIS), ("modes", modes, MODES)):
        if not values or set(values) - set(allowed):
            parser.error(f"--{name} takes {', '.join(allowed)}")
    headers = {"Authorization": f"Bearer {args.api_key}", "x-api-key": args.api_key} \
        if args.api_key else {}

    process = None
    url = args.url
    if url is None:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        process = start_server(args.model, port, args.server_arg)
    try:
        model = wait_ready(url, process, timeout=600)
        phases = asyncio.run(_run_all(url, model, apis, modes, clients, args, headers))
    finally:
        if process is not None:
            stop(process)
    meta = {
        "date": datetime.date.today().isoformat(),
        "server": args.url or "pegmask serve (subprocess)", "model": model, "apis": apis,
        "max_tokens": args.max_tokens,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python "
                   f"{platform.python_version()}",
        "command": "pegmask bench serve " + " ".join(argv),
    }
    publish(report(phases, meta), args.out)
    write_json({"meta": meta, "phases": [p.summary() for p in phases]},
               args.out.with_suffix(".json"))
    plot(phases, args.out.with_suffix(".png"))
    return 0


async def _run_all(url: str, model: str, apis: list[str], modes: list[str],
                   clients: list[int], args: argparse.Namespace,
                   headers: dict[str, str]) -> list[Phase]:
    from tqdm import tqdm

    phases = []
    plan = [(c, m) for m in modes for c in clients]
    total = sum(args.requests or max(8, 2 * c) for c, _ in plan)
    if args.quick:
        total = sum(max(c, 2) for c, _ in plan)
    with tqdm(total=total, desc="requests", unit="req", file=sys.stderr) as progress:
        # One warm-up request per mode, so no phase pays the server's first compiles.
        for mode in modes:
            path, body = request_body(apis[0], QUESTIONS[0], mode, 8, model, 0)
            async with httpx.AsyncClient(base_url=url, timeout=None, headers=headers) as client:
                await stream_once(client, apis[0], path, body)
        for count, mode in plan:
            requests = args.requests or max(8, 2 * count)
            if args.quick:
                requests = max(count, 2)
            phase = await run_phase(url, model, apis, mode, count, requests, args.max_tokens,
                                    args.time_limit, headers, progress)
            if count > 1 and not args.no_probe:
                phase.probe_alone_s = await probe(url, model, apis[0], mode, 0,
                                                  args.max_tokens, headers)
                phase.probe_loaded_s = await probe(url, model, apis[0], mode, count - 1,
                                                   args.max_tokens, headers)
            phases.append(phase)
    return phases


if __name__ == "__main__":
    raise SystemExit(main())
