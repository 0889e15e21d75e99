"""The GPU check's tables (`python -m pegmask.bench.gpu_check report DIR`): markdown from the
JSON files its steps wrote."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from pegmask.bench.gpu_check import log
from pegmask.bench.reporting import publish


def _fmt(value: Any, digits: int = 1, scale: float = 1.0, unit: str = "") -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, int | float):
        return f"{value * scale:.{digits}f}{unit}"
    return str(value)


def _load(folder: Path, name: str) -> dict[str, Any] | None:
    path = folder / name
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except ValueError:
        return None


def report(folder: Path) -> str:
    env, kernel, decode, serve = (_load(folder, f"{n}.json")
                                  for n in ("env", "kernels", "decode", "serve"))
    lines = ["# pegmask on a GPU", ""]
    if env:
        gpu = env.get("gpu") or {}
        versions = env.get("versions") or {}
        lines += [
            f"- date: {env.get('date')}; checkout {env.get('checkout')}",
            f"- GPU: {gpu.get('name', 'none')} (compute {gpu.get('capability', '-')}, "
            f"{gpu.get('memory_gib', '-')} GiB); nvidia-smi: {env.get('nvidia_smi')}",
            f"- Python {env.get('python')}, {env.get('cpus')} CPUs; torch {env.get('torch')} "
            f"(CUDA {env.get('cuda_version')}), " + ", ".join(
                f"{k} {v}" for k, v in versions.items() if v),
            "- model: SmolLM2-135M-Instruct's architecture, tokenizer and chat template with "
            "random weights (seed 0, bfloat16): speed does not depend on weight values, but "
            "outputs are random tokens, so output lengths differ from the real model's.",
        ]
        triton = env.get("triton_probe") or {}
        if triton and not triton.get("ok", True):
            lines.append(f"- **the triton kernel fails on this device** ({triton.get('error')}; "
                         f"compilers {triton.get('compilers')}): decode and serve used the "
                         "torch path for masks")
    lines.append("")
    if kernel:
        lines += [f"## Token bitmask kernel ({kernel.get('device')}, triton "
                  f"{kernel.get('triton')})", "",
                  f"Timing: {kernel.get('timing')}. `equal`: the triton kernel (public entry, "
                  "direct call, selected rows, a vocab_size ending inside a word) and the "
                  "torch path give exactly the CPU reference's logits.", "",
                  "| dtype | vocab | batch | triton µs | torch path µs | speedup | public call "
                  "host µs | bitmask H2D µs | masked | equal |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for c in kernel.get("cases", []):
            if "skipped" in c or "error" in c:
                lines.append(f"| {c.get('dtype')} | {c.get('vocab')} | {c.get('batch')} | "
                             f"{c.get('skipped') or c.get('error')} ||||||| NO |")
                continue
            speed = (c["torch_us"] / c["triton_us"]) if c.get("torch_us") and c.get(
                "triton_us") else None
            lines.append(
                f"| {c['dtype']} | {c['vocab']} | {c['batch']} | {_fmt(c.get('triton_us'))} | "
                f"{_fmt(c.get('torch_us'))} | {_fmt(speed, 1, unit='x')} | "
                f"{_fmt(c.get('host_us'))} | {_fmt(c.get('h2d_us'))} | "
                f"{_fmt(c.get('masked_share'), 0, 100, '%')} | {_fmt(c.get('equal'))} |")
        sampling = kernel.get("sampling") or {}
        if sampling.get("cases"):
            lines += ["", "`sample_masked` on one masked row (as the engine calls it):", "",
                      "| vocab | mode | µs | host µs per call (with .item) |", "|---|---|---|---|"]
            for c in sampling["cases"]:
                lines.append(f"| {c['vocab']} | {c['mode']} | "
                             f"{_fmt(c.get('us')) if 'error' not in c else c['error']} | "
                             f"{_fmt(c.get('host_us'))} |")
        lines.append("")
    if decode and decode.get("error"):
        lines += ["## Decode loop", "", f"**{decode['error']}**", ""]
    elif decode:
        engine = decode.get("engine") or {}
        lines += [f"## Decode loop (`Engine.generate_batch`, {decode.get('device')})", "",
                  f"Model {engine.get('model')} ({engine.get('dtype')}, {engine.get('runner')}, "
                  f"dialect {engine.get('dialect')}, vocab {engine.get('vocab')}); "
                  f"max_tokens {decode.get('max_tokens')}, ignore_eos; engine load "
                  f"{_fmt(decode.get('load_s'))} s, warm-up {_fmt(decode.get('warmup_s'))} s, "
                  f"peak GPU memory {_fmt(decode.get('max_memory_allocated_gib'), 2)} GiB. "
                  "Modes: a chat without tools; two tools with tool_choice=required; "
                  "response_format json_schema. tokens/s: completion tokens over the call's "
                  "wall time (prompt preparation and prefill included); decode tokens/s: over "
                  "forward + masks + sampling; from the engine's step accounting (forward "
                  "synchronized on CUDA): ms/step = (prefill + forward + masks + sampling) / "
                  "steps, and the forward, masks and sampling parts per step. masks = filling the step's "
                  "bitmask on the CPU, copying it over and applying it.", "",
                  "| mode | batch | temp | tokens | wall s | tokens/s | decode tokens/s | "
                  "steps | prefill s | ms/step | forward ms | masks ms | sampling ms | "
                  "masks share | valid | errors |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in decode.get("runs", []):
            if "skipped" in r or "error" in r:
                lines.append(f"| {r['mode']} | {r['batch']} | {r.get('temperature')} | "
                             f"{r.get('skipped') or r.get('error')} ||||||||||||")
                continue
            temp = f"{r['temperature']:g}"
            if r.get("errors") and not r.get("completion_tokens"):
                lines.append(f"| {r['mode']} | {r['batch']} | {temp} | all {r['errors']} "
                             f"failed: {'; '.join(r.get('error_examples', []))[:300]} "
                             "||||||||||||")
                continue
            valid = "-" if r.get("valid") is None else f"{r['valid']}/{r['requests']}"
            lines.append(
                f"| {r['mode']} | {r['batch']} | {temp} | {r['completion_tokens']} | "
                f"{_fmt(r['wall_s'], 2)} | {_fmt(r['tokens_per_s'])} | "
                f"{_fmt(r['decode_tokens_per_s'])} | {r['steps']} | "
                f"{_fmt(r['stats'].get('prefill_s'), 2)} | {_fmt(r['ms_per_step'], 2)} | "
                f"{_fmt(r['forward_ms_per_step'], 2)} | {_fmt(r['mask_ms_per_step'], 2)} | "
                f"{_fmt(r['sample_ms_per_step'], 2)} | {_fmt(r['mask_share'], 0, 100, '%')} | "
                f"{valid} | {r['errors']} |")
        lines.append("")
    if serve:
        lines += [f"## Serving (`pegmask serve --device {serve.get('device')}` driven by "
                  "`pegmask bench serve --url`)", "",
                  f"Status: {serve.get('status')}; server start {_fmt(serve.get('server_start_s'))}"
                  f" s; bench {_fmt(serve.get('bench_s'))} s (rc {serve.get('bench_rc')}).",
                  f"Command: `{serve.get('bench_command')}`", ""]
        bench = serve.get("bench") or {}
        if bench.get("phases"):
            lines += ["| clients | mode | requests | errors | output tokens | tokens/s | "
                      "TTFT p50 | TTFT p99 | ITL p50 | ITL p99 | calls valid |",
                      "|---|---|---|---|---|---|---|---|---|---|---|"]
            for p in bench["phases"]:
                calls = (f"{p['calls_valid']}/{p['with_calls']}" if p["mode"] == "constrained"
                         else "-")
                lines.append(
                    f"| {p['clients']} | {p['mode']} | {p['requests']} | {p['errors']} | "
                    f"{p['tokens']} | {_fmt(p['tokens_per_s'])} | "
                    f"{_fmt(p['ttft_p50_s'], 0, 1000, ' ms')} | "
                    f"{_fmt(p['ttft_p99_s'], 0, 1000, ' ms')} | "
                    f"{_fmt(p['itl_p50_s'], 1, 1000, ' ms')} | "
                    f"{_fmt(p['itl_p99_s'], 1, 1000, ' ms')} | {calls} |")
            errors = sorted({e for p in bench["phases"] for e in p.get("error_examples", [])})
            if errors:
                lines += ["", "Errors seen: " + "; ".join(errors)[:1500]]
        tail = [line for line in serve.get("server_log_tail", []) if line.strip()][-8:]
        if tail and serve.get("status") != "ok":
            lines += ["", "Server log (end):", "", "```", *tail, "```"]
        lines.append("")
    missing = [n for n, d in (("env", env), ("kernels", kernel), ("decode", decode),
                              ("serve", serve)) if d is None]
    if missing:
        lines += [f"Missing results: {', '.join(missing)} (see device_check.log).", ""]
    return "\n".join(lines)


def cmd_report(args: argparse.Namespace) -> int:
    """Print the tables; write them only to an explicit --out (bench/results/gpu.md adds
    prose by hand that a default would overwrite)."""
    out = Path(args.out) if args.out else None
    publish(report(Path(args.dir)), out)
    if out:
        log(f"wrote {out}")
    return 0
