"""Whether one long prompt stalls the other clients of a server.

Starts `pegmask serve` (the embedded model) once per configuration given (default: as it ships,
then `--no-decode-first`, which takes `--prefill-chunk` prompt tokens a step whatever decodes).
In each, `--clients` streaming chat clients send plain requests of `--max-tokens` tokens
(`ignore_eos`) back to back; after `--lead` seconds one more request brings a prompt of about
`--prompt-tokens` tokens (a repeated word) and asks for 4 tokens. Reported per configuration:
the clients' inter-token gaps while the long request is in flight and outside it (p50, p99;
serve_bench's client and percentiles), how long the long request took, the clients' tokens per
second in both windows, and the server's peak resident memory.

    pegmask bench long_prompt [--clients 31] [--prompt-tokens 7000] [--max-tokens 128]
        [--lead 3] [--config NAME=FLAGS ...] [--out bench/results/long_prompt.md]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import sys
import time
from dataclasses import dataclass
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
    QUESTIONS,
    Sample,
    milliseconds,
    quantile,
    request_body,
    stream_once,
)
from pegmask.bench.serve_compare import process_tree
from pegmask.bench.servers import served

DEFAULT_CONFIGS = ["default=", "no-decode-first=--no-decode-first"]


@dataclass
class Run:
    """One configuration's clients' samples, the long request's window and the server's peak
    memory."""

    name: str
    flags: list[str]
    samples: list[Sample]
    long_start: float
    long_end: float
    long_status: int
    long_prompt_tokens: int
    peak_rss_bytes: int

    def gaps(self, during: bool) -> list[float]:
        """Inter-token gaps that end inside (or outside) the long request's window."""
        return [b - a for s in self.samples if s.error is None
                for a, b in zip(s.piece_times, s.piece_times[1:], strict=False)
                if (self.long_start < b <= self.long_end) == during]

    def summary(self) -> dict[str, Any]:
        during, outside = self.gaps(True), self.gaps(False)
        window = self.long_end - self.long_start
        return {
            "config": self.name, "flags": " ".join(self.flags),
            "requests": len(self.samples),
            "errors": sum(1 for s in self.samples if s.error is not None),
            "long_s": window, "long_status": self.long_status,
            "long_prompt_tokens": self.long_prompt_tokens,
            "itl_during_p50_s": quantile(during, 0.5), "itl_during_p99_s": quantile(during, 0.99),
            "itl_outside_p50_s": quantile(outside, 0.5),
            "itl_outside_p99_s": quantile(outside, 0.99),
            "tokens_per_s_during": len(during) / window if window > 0 else None,
            "peak_rss_bytes": self.peak_rss_bytes,
        }


def tree_rss(root: int) -> int:
    """Resident bytes of a process and its descendants (Linux /proc)."""
    total = 0
    for pid in process_tree(root):
        try:
            with open(f"/proc/{pid}/statm") as statm:
                total += int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError):
            pass
    return total


async def drive(url: str, model: str, pid: int, clients: int, max_tokens: int,
                prompt_tokens: int, lead_s: float) -> tuple[list[Sample], float, float, int,
                                                           int, int]:
    """The clients, the long request after `lead_s`, and a memory watch; returns (samples,
    long start, long end, its HTTP status, its prompt tokens, peak resident bytes)."""
    stop = asyncio.Event()
    samples: list[Sample] = []
    peak = 0

    async def client(index: int) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=None) as http:
            number = 0
            while not stop.is_set():
                question = QUESTIONS[(index + number) % len(QUESTIONS)]
                path, body = request_body("chat", question, "unconstrained", max_tokens, model,
                                          None, {"ignore_eos": True})
                samples.append(await stream_once(http, "chat", path, body))
                number += 1

    async def watch() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, tree_rss(pid))
            await asyncio.sleep(0.1)

    tasks = [asyncio.ensure_future(client(i)) for i in range(clients)]
    watcher = asyncio.ensure_future(watch())
    await asyncio.sleep(lead_s)
    body = {"model": model, "max_tokens": 4,
            "messages": [{"role": "user", "content": "word " * prompt_tokens}]}
    async with httpx.AsyncClient(base_url=url, timeout=None) as http:
        start = time.perf_counter()
        response = await http.post("/v1/chat/completions", json=body)
        end = time.perf_counter()
    usage = (response.json().get("usage") or {}) if response.status_code == 200 else {}
    await asyncio.sleep(lead_s)  # the clients' steps after it, for the outside window
    stop.set()
    await asyncio.gather(*tasks, watcher)
    return samples, start, end, response.status_code, usage.get("prompt_tokens", 0), peak


def run_config(name: str, flags: list[str], args: argparse.Namespace) -> Run:
    with served(flags) as (url, model, process):
        outcome = asyncio.run(drive(url, model, process.pid, args.clients, args.max_tokens,
                                    args.prompt_tokens, args.lead))
    return Run(name, flags, *outcome)


def report(runs: list[Run], meta: dict[str, Any]) -> str:
    rows = [run.summary() for run in runs]
    lines = [
        "# Serving beside one long prompt", "",
        machine_info(()), f"- load average (1 min) at the start: {meta['load_start']:.1f}",
        f"- command: `{meta['command']}`", "",
        f"{meta['clients']} streaming chat clients, back to back, {meta['max_tokens']} tokens "
        f"a request (`ignore_eos`); after {meta['lead_s']:g} s one request with a "
        f"{rows[0]['long_prompt_tokens']}-token prompt asking for 4 tokens. Gaps \"during\" end "
        "while the long request is in flight.", "",
        "| config | flags | long request | clients' ITL p50 / p99 during | outside | "
        "during / outside (p50) | clients' tokens/s during | peak memory | errors |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ratio = (r["itl_during_p50_s"] / r["itl_outside_p50_s"]
                 if r["itl_during_p50_s"] and r["itl_outside_p50_s"] else None)
        lines.append(
            f"| {r['config']} | `{r['flags'] or '-'}` | {r['long_s']:.1f} s "
            f"(HTTP {r['long_status']}) | {milliseconds(r['itl_during_p50_s'])} / "
            f"{milliseconds(r['itl_during_p99_s'])} | {milliseconds(r['itl_outside_p50_s'])} / "
            f"{milliseconds(r['itl_outside_p99_s'])} | "
            f"{'-' if ratio is None else f'{ratio:.2f}x'} | "
            f"{r['tokens_per_s_during'] or 0:.0f} | {r['peak_rss_bytes'] / 2**30:.2f} GiB | "
            f"{r['errors']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pegmask bench long_prompt", description=__doc__)
    parser.add_argument("--clients", type=int, default=31)
    parser.add_argument("--prompt-tokens", type=int, default=7000)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--lead", type=float, default=3.0,
                        help="seconds of the clients alone before (and after) the long request")
    parser.add_argument("--config", action="append", default=None,
                        help="NAME=FLAGS: a server configuration (repeatable; default: as it "
                             "ships, and --no-decode-first)")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "long_prompt.md")
    args = parser.parse_args(argv)
    meta = {"command": command_line("long_prompt", argv if argv is not None else
                                     sys.argv[1:]), "load_start": load_average(),
            "clients": args.clients, "max_tokens": args.max_tokens, "lead_s": args.lead}
    runs = []
    for config in args.config or DEFAULT_CONFIGS:
        name, _, flags = config.partition("=")
        runs.append(run_config(name, shlex.split(flags), args))
    publish(report(runs, meta), args.out)
    write_json({"meta": meta, "machine": machine(()),
                "runs": [run.summary() for run in runs]}, args.out.with_suffix(".json"))
    plots.distributions({f"{run.name}, during": run.gaps(True) for run in runs}
                        | {f"{run.name}, outside": run.gaps(False) for run in runs},
                        title="Clients' inter-token latency", ylabel="seconds",
                        out=args.out.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
