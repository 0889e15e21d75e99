"""The GPU check's measurements (`python -m pegmask.bench.gpu_check kernels|decode|serve`): the
triton mask kernel against the torch path, the decode loop, and `pegmask serve` under load;
out of bench/gpu_check.py, whose `install` runs on the bare device before pegmask is importable.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from pegmask.bench.gpu_check import (
    error_text,
    log,
    step_budget,
    triton_probe,
    use_torch_masks,
    write_json,
)
from pegmask.bench.serve_bench import QUESTIONS, TOOLS
from pegmask.bench.servers import free_port, stop, wait_ready

CITY_SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string"},
    "population_millions": {"type": "number"},
    "landmarks": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
}, "required": ["name", "population_millions", "landmarks"], "additionalProperties": False}
MODES = ("unconstrained", "tool_required", "json_schema")


# --------------------------------------------------------------------------- kernels
def _bench_ms(fn: Any, cuda: bool, repeats: int) -> float:
    """Median ms of one call: triton's do_bench (CUDA events, cache flushed) on CUDA, a
    perf_counter loop elsewhere."""
    if cuda:
        from triton.testing import do_bench

        return float(do_bench(fn, warmup=10, rep=40, return_mode="median"))
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    times.sort()
    return 1000 * times[len(times) // 2]


def _host_us(fn: Any, cuda: bool, calls: int) -> float:
    """Wall µs per call of back-to-back calls (launch and Python overhead included)."""
    import torch

    fn()
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    if cuda:
        torch.cuda.synchronize()
    return 1e6 * (time.perf_counter() - start) / calls


def cmd_kernels(args: argparse.Namespace) -> int:
    import torch
    import triton

    from pegmask import kernels

    cuda = torch.cuda.is_available() and not args.cpu
    device = "cuda" if cuda else "cpu"
    if not cuda and os.environ.get("TRITON_INTERPRET") != "1":
        log("no CUDA: set TRITON_INTERPRET=1 to run the triton kernel in its interpreter")
    batches = [int(b) for b in args.batches.split(",")]
    vocabs = [int(v) for v in args.vocabs.split(",")]
    dtypes = [getattr(torch, d) for d in args.dtypes.split(",")]
    generator = torch.Generator().manual_seed(0)
    cases, failures = [], 0
    deadline = time.monotonic() + step_budget(args.budget)
    for dtype in dtypes:
        for vocab in vocabs:
            for batch in batches:
                case: dict[str, Any] = {"dtype": str(dtype).replace("torch.", ""),
                                        "vocab": vocab, "batch": batch}
                if time.monotonic() > deadline:
                    cases.append({**case, "skipped": "time budget"})
                    continue
                try:
                    case.update(_kernel_case(kernels, batch, vocab, dtype, device, cuda,
                                             generator, args))
                except Exception as exc:  # noqa: BLE001 - recorded, the next case runs
                    case["error"] = error_text(exc)
                failures += not case.get("equal", False)
                cases.append(case)
                log(json.dumps(case))
    sampling = _sampling_timings(kernels, vocabs, device, cuda, args)
    result = {"device": torch.cuda.get_device_name(0) if cuda else "cpu (TRITON_INTERPRET="
              f"{os.environ.get('TRITON_INTERPRET', '0')})", "torch": torch.__version__,
              "triton": triton.__version__, "cases": cases, "sampling": sampling,
              "all_equal": failures == 0,
              "timing": "triton.testing.do_bench median (CUDA events, L2 flushed) per call; "
                        "host_us: wall time per call of 200 back-to-back calls of the public "
                        "apply_token_bitmask_inplace (argument checks and launch included)"
              if cuda else "perf_counter medians (CPU, interpreter: not meaningful)"}
    write_json(result, Path(args.out))
    return 0 if failures == 0 else 1


def _kernel_case(kernels: Any, batch: int, vocab: int, dtype: Any, device: str, cuda: bool,
                 generator: Any, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from pegmask.kernels.bitmask import apply_token_bitmask_torch as torch_path
    from pegmask.kernels.triton_apply import apply_token_bitmask_triton as triton_apply

    words = kernels.bitmask_words(vocab)
    logits_cpu = torch.randn(batch, vocab, generator=generator).to(dtype)
    # Random words (about half the tokens allowed), one row all allowed, one all blocked, one
    # sparse (a few tokens allowed: a typical grammar position).
    bits = torch.randint(-2**31, 2**31 - 1, (batch, words), generator=generator,
                         dtype=torch.int64).to(torch.int32)
    if batch > 1:
        bits[1] = -1
    if batch > 2:
        bits[2] = 0
    if batch > 3:
        bits[3] = 0
        bits[3, :: max(1, words // 8)] = 1
    reference = logits_cpu.clone()
    kernels.apply_token_bitmask_inplace(reference, bits)  # the CPU (numpy) path
    logits = logits_cpu.to(device)
    bitmask = bits.to(device)
    found: dict[str, Any] = {}

    # The public entry (triton on CUDA tensors), the kernel called directly, the torch path.
    checks = {}
    if cuda:
        out = logits.clone()
        kernels.apply_token_bitmask_inplace(out, bitmask)
        checks["public"] = torch.equal(out.cpu(), reference)
    out = logits.clone()
    triton_apply(out, bitmask, vocab, None)
    checks["triton"] = torch.equal(out.cpu(), reference)
    out = logits.clone()
    torch_path(out, bitmask, vocab, None)
    checks["torch"] = torch.equal(out.cpu(), reference)
    # Selected rows (a batch mixing constrained and free rows), and a vocab_size below the
    # width that ends inside a word.
    rows = list(range(0, batch, 2))
    expected = logits_cpu.clone()
    kernels.apply_token_bitmask_inplace(expected, bits, indices=rows)
    out = logits.clone()
    triton_apply(out, bitmask, vocab, rows)
    checks["triton_rows"] = torch.equal(out.cpu(), expected)
    partial = max(1, vocab - 17)
    expected = logits_cpu.clone()
    kernels.apply_token_bitmask_inplace(expected, bits, vocab_size=partial)
    out = logits.clone()
    triton_apply(out, bitmask, partial, None)
    checks["triton_partial_vocab"] = torch.equal(out.cpu(), expected)
    found["checks"] = checks
    found["equal"] = all(checks.values())
    found["masked_share"] = float((reference == float("-inf")).float().mean())

    work = logits.clone()
    found["triton_us"] = 1000 * _bench_ms(lambda: triton_apply(work, bitmask, vocab, None),
                                          cuda, args.repeats)
    found["torch_us"] = 1000 * _bench_ms(lambda: torch_path(work, bitmask, vocab, None),
                                         cuda, args.repeats)
    found["host_us"] = _host_us(lambda: kernels.apply_token_bitmask_inplace(work, bitmask),
                                cuda, args.calls)
    if cuda:
        # What a decode step adds: the step's bitmask filled on the CPU, copied over.
        host = bits.clone()
        found["h2d_us"] = _host_us(lambda: host.to(device), cuda, args.calls)
    return found


def _sampling_timings(kernels: Any, vocabs: list[int], device: str, cuda: bool,
                      args: argparse.Namespace) -> dict[str, Any]:
    """`sample_masked` over masked logits, per row as the engine calls it: greedy, and
    temperature 1 with top-p 0.9."""
    import torch

    found: dict[str, Any] = {"cases": []}
    for vocab in vocabs[:2]:
        logits = torch.randn(vocab, device=device)
        bits = kernels.allocate_token_bitmask(1, vocab, device=device)
        bits[0, ::2] = 0
        kernels.apply_token_bitmask_inplace(logits, bits[0])
        for label, options in (("greedy", (0.0, 1.0, 0)), ("t1_top_p0.9", (1.0, 0.9, 0))):
            case = {"vocab": vocab, "mode": label}
            try:
                case["us"] = 1000 * _bench_ms(
                    lambda o=options, x=logits: kernels.sample_masked(x, *o), cuda, args.repeats)
                case["host_us"] = _host_us(
                    lambda o=options, x=logits: int(kernels.sample_masked(x, *o)), cuda, 50)
            except Exception as exc:  # noqa: BLE001
                case["error"] = error_text(exc)
            found["cases"].append(case)
            log(json.dumps(case))
    return found


# --------------------------------------------------------------------------- decode
def _requests(mode: str, batch: int, max_tokens: int, temperature: float) -> list[dict]:
    requests = []
    for i in range(batch):
        question = QUESTIONS[i % len(QUESTIONS)] + f" (request {i})"
        item: dict[str, Any] = {"messages": [{"role": "user", "content": question}],
                                "max_tokens": max_tokens, "ignore_eos": True,
                                "temperature": temperature, "seed": i}
        if mode == "tool_required":
            item["tools"] = [{"type": "function", "function": tool} for tool in TOOLS]
            item["tool_choice"] = "required"
        elif mode == "json_schema":
            item["messages"] = [{"role": "user",
                                 "content": f"Describe city number {i} as JSON."}]
            item["response_format"] = {"type": "json_schema", "json_schema": {
                "name": "city", "schema": CITY_SCHEMA, "strict": True}}
        requests.append(item)
    return requests


def _stats(engine: Any) -> dict[str, float]:
    return dataclasses.asdict(engine.stats)


def _valid(mode: str, result: Any) -> bool | None:
    message = getattr(result, "message", None) or {}
    if mode == "tool_required":
        calls = message.get("tool_calls") or []
        try:
            return bool(calls) and all(
                isinstance(json.loads(c["function"]["arguments"]), dict) for c in calls)
        except (ValueError, KeyError, TypeError):
            return False
    if mode == "json_schema":
        try:
            return isinstance(json.loads(message.get("content") or ""), dict)
        except ValueError:
            return False
    return None


def _decode_run(engine: Any, mode: str, batch: int, max_tokens: int,
                temperature: float) -> dict[str, Any]:
    import torch

    requests = _requests(mode, batch, max_tokens, temperature)
    before = _stats(engine)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    started = time.perf_counter()
    results = engine.generate_batch(requests, return_errors=True)
    wall = time.perf_counter() - started
    after = _stats(engine)
    delta = {k: after[k] - before.get(k, 0) for k in after}
    errors = [str(r) for r in results if isinstance(r, Exception)]
    done = [r for r in results if not isinstance(r, Exception)]
    completion = sum(r.usage["completion_tokens"] for r in done)
    busy = sum(delta.get(k, 0.0) for k in ("prefill_s", "forward_s", "mask_s", "sample_s"))
    decode = sum(delta.get(k, 0.0) for k in ("forward_s", "mask_s", "sample_s"))
    steps = max(1, int(delta.get("steps", 0)))
    valid = [_valid(mode, r) for r in done]
    run = {
        "mode": mode, "batch": batch, "temperature": temperature, "max_tokens": max_tokens,
        "requests": len(requests), "errors": len(errors), "error_examples": errors[:2],
        "completion_tokens": completion, "wall_s": wall,
        "tokens_per_s": completion / wall if wall else None,
        "decode_tokens_per_s": delta.get("tokens", 0) / decode if decode else None,
        "ms_per_step": 1000 * busy / steps, "steps": steps,
        "forward_ms_per_step": 1000 * delta.get("forward_s", 0) / steps,
        "prefill_ms_per_step": 1000 * delta.get("prefill_s", 0) / steps,
        "mask_ms_per_step": 1000 * delta.get("mask_s", 0) / steps,
        "sample_ms_per_step": 1000 * delta.get("sample_s", 0) / steps,
        "mask_share": delta.get("mask_s", 0) / busy if busy else None,
        "sample_share": delta.get("sample_s", 0) / busy if busy else None,
        "prepare_and_wait_s": wall - busy,
        "stats": delta,
        "finish_reasons": sorted({r.finish_reason for r in done}),
        "valid": sum(1 for v in valid if v) if mode != "unconstrained" else None,
    }
    if done:
        run["sample_output"] = (done[0].text or "")[:300]
    return run


def cmd_decode(args: argparse.Namespace) -> int:
    import torch

    from pegmask import Engine

    started = time.monotonic()
    deadline = started + step_budget(args.budget)
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    batches = [int(b) for b in args.batches.split(",")]
    result: dict[str, Any] = {"device": device, "model": args.model, "runs": [],
                              "max_tokens": args.max_tokens}
    out = Path(args.out)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(f"{signal.SIGTERM!r} received"))
    result["triton_probe"] = triton = triton_probe(device)
    if not triton["ok"]:
        use_torch_masks()
        result["torch_masks"] = True
        log(f"the triton kernel fails here ({triton.get('error')}): masks on the torch path")
    try:
        engine = Engine(args.model, device=device, max_running=max(batches), prewarm=True)
    except Exception as exc:  # noqa: BLE001 - recorded for the report
        result["error"] = f"the engine did not start: {error_text(exc)}"
        log(result["error"])
        write_json(result, out)
        return 1
    result["load_s"] = time.monotonic() - started
    result["engine"] = {"model": engine.model_name, "dialect": engine.dialect_name,
                        "dtype": str(engine.backend.dtype), "vocab": engine.vocab.size,
                        "runner": type(engine.runner).__name__}
    log(f"engine ready in {result['load_s']:.1f} s: {result['engine']}")
    if device.startswith("cuda"):
        runner = engine.runner
        forward = runner.forward

        def synchronized(*args: Any) -> Any:
            logits = forward(*args)
            torch.cuda.synchronize()
            return logits

        runner.forward = synchronized
        result["synchronized_forward"] = True
    try:
        # Warm-up: each mode once, few tokens, a greedy and a sampled row (kernels compile,
        # grammars compile, caches), so no measured run pays a first call.
        warm = time.monotonic()
        for mode in MODES:
            requests = _requests(mode, 2, min(48, args.max_tokens), 0.0)
            requests[1]["temperature"] = 1.0
            try:
                engine.generate_batch(requests, return_errors=True)
            except Exception as exc:  # noqa: BLE001 - the measured runs will show it too
                result.setdefault("warmup_errors", {})[mode] = error_text(exc)
                log(f"warm-up {mode}: {error_text(exc)}")
        result["warmup_s"] = time.monotonic() - warm
        plan = [(mode, batch, 0.0) for batch in batches for mode in MODES]
        plan += [(mode, batch, 1.0) for batch in batches for mode in MODES]
        for mode, batch, temperature in plan:
            if time.monotonic() > deadline:
                result["runs"].append({"mode": mode, "batch": batch,
                                       "temperature": temperature, "skipped": "time budget"})
                continue
            try:
                run = _decode_run(engine, mode, batch, args.max_tokens, temperature)
            except Exception as exc:  # noqa: BLE001 - recorded, the next run goes on
                run = {"mode": mode, "batch": batch, "temperature": temperature,
                       "error": error_text(exc)}
            result["runs"].append(run)
            log(json.dumps({k: v for k, v in run.items()
                            if k not in ("stats", "sample_output")}))
            write_json(result, out)  # after every run: a later timeout loses nothing
        if device.startswith("cuda"):
            result["max_memory_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
    finally:
        result["total_s"] = time.monotonic() - started
        write_json(result, out)
        engine.close()
    return 0


# --------------------------------------------------------------------------- serve
def cmd_serve(args: argparse.Namespace) -> int:
    """`pegmask serve` on the device (its log kept), driven by `pegmask bench serve --url`."""
    started = time.monotonic()
    deadline = started + step_budget(args.budget)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    out = Path(args.out)
    result: dict[str, Any] = {"device": args.device, "model": args.model, "status": "started"}
    result["triton_probe"] = triton = triton_probe(args.device)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    serve_args = ["serve", "--model", args.model, "--device", args.device, "--host",
                  "127.0.0.1", "--port", str(port), "--log-level", "warning",
                  "--max-running", str(args.max_running)]
    entry = ["-m", "pegmask.cli"]
    if not triton["ok"]:
        result["torch_masks"] = True
        entry = ["-c", "import sys\nfrom pegmask.bench.gpu_check import use_torch_masks\n"
                 "use_torch_masks()\nfrom pegmask.cli import main\nsys.exit(main(sys.argv[1:]))"]
    server_cmd = [sys.executable, *entry, *serve_args]
    result["server_command"] = " ".join(["pegmask", *serve_args]) + (
        " (torch masks)" if not triton["ok"] else "")
    server_log = work / "server.log"
    log(f"starting {result['server_command']}")
    # The step's time limit ends this process with SIGTERM: leave through `finally`, which
    # stops the server and writes what was measured.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(f"{signal.SIGTERM!r} received"))
    with server_log.open("wb") as sink:
        server = subprocess.Popen(server_cmd, stdout=sink, stderr=subprocess.STDOUT)
    try:
        try:
            ready: str | None = wait_ready(
                url, server, min(deadline, started + args.start_timeout) - time.monotonic())
        except RuntimeError:
            ready = None
        result["server_start_s"] = time.monotonic() - started
        if ready is None:
            result["status"] = "server did not start"
            return 1
        log(f"server ready in {result['server_start_s']:.1f} s: {ready}")
        bench_out = work / "serve_bench.md"
        bench_cmd = [sys.executable, "-m", "pegmask.cli", "bench", "serve", "--url", url,
                     "--clients", args.clients, "--max-tokens", str(args.max_tokens),
                     "--time-limit", str(args.time_limit), "--no-probe",
                     "--out", str(bench_out)]
        if args.requests:
            bench_cmd += ["--requests", str(args.requests)]
        result["bench_command"] = " ".join(["pegmask", *bench_cmd[3:]])
        remaining = deadline - time.monotonic()
        log(f"{result['bench_command']} (at most {remaining:.0f} s)")
        bench_started = time.monotonic()
        try:
            completed = subprocess.run(bench_cmd, timeout=max(10, remaining))
            result["bench_rc"] = completed.returncode
        except subprocess.TimeoutExpired:
            result["bench_rc"] = "timeout"
        result["bench_s"] = time.monotonic() - bench_started
        data = bench_out.with_suffix(".json")
        if data.is_file():
            result["bench"] = json.loads(data.read_text())
            result["status"] = "ok"
        else:
            result["status"] = "no bench results"
        try:
            response = httpx.get(f"{url}/metrics", timeout=5)
            response.raise_for_status()
            metrics = response.text
            result["metrics"] = [line for line in metrics.splitlines()
                                 if line.startswith("pegmask_") and "_bucket" not in line
                                 and "_created" not in line][:80]
        except httpx.HTTPError as exc:
            result["metrics"] = [error_text(exc)]
    finally:
        stop(server, timeout_s=15)
        result["server_rc"] = server.returncode
        lines = server_log.read_text(errors="replace").splitlines() if server_log.exists() \
            else []
        result["server_log_lines"] = len(lines)
        result["server_log_tail"] = lines[-120:]
        result["total_s"] = time.monotonic() - started
        write_json(result, out)
    return 0 if result["status"] == "ok" else 1
