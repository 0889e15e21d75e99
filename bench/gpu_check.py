"""GPU check: the triton mask kernel, the decode loop and `pegmask serve` on one CUDA device.

Run by `scripts/device_check.sh` on a lent GPU machine (no network), one subcommand per step,
each in its own process and with its own time limit, each writing one JSON file:

    python3 bench/gpu_check.py install --wheels .whl --target DIR   # stdlib only, run first
    python -m pegmask.bench.gpu_check env       --out env.json
    python -m pegmask.bench.gpu_check make-model --config .gpudata/smollm2 --out DIR
    python -m pegmask.bench.gpu_check kernels   --out kernels.json
    python -m pegmask.bench.gpu_check decode    --model DIR --out decode.json
    python -m pegmask.bench.gpu_check serve     --model DIR --out serve.json
    python -m pegmask.bench.gpu_check report DIR [--out gpu.md]

and here, once, to make what the device run carries (both folders are git-ignored):

    python -m pegmask.bench.gpu_check prepare   # .gpudata/smollm2 (config, tokenizer) + .whl

The model: the embedded SmolLM2-135M-Instruct is a 98 MB GGUF, too big to carry, so the device
builds a model of exactly its architecture (the GGUF's LlamaConfig) and its tokenizer and chat
template, with random weights (fixed seed), in bfloat16. Speed does not depend on weight
values; what random weights change is which tokens are drawn (so output lengths and the share
of forced tokens), not the cost of a step.

`install` needs nothing but the standard library: it unzips the carried wheels into a folder
for PYTHONPATH (the ones pegmask pins always, the others only when missing or too old on the
machine) and lays `pegmask` out there as symlinks following pyproject.toml's package-dir, so
the checkout's current code runs, whatever it holds when the check starts.

On CUDA every forward is followed by `torch.cuda.synchronize()` in the decode check, so the
engine's own step accounting (forward / masks / sampling) charges the GPU's work to the
forward instead of to whichever later op waits for it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

# What the device lacks, pinned to the versions pegmask's tests pass with (`prepare` fetches
# them for CPython 3.12 on manylinux x86_64). ALWAYS: installed over whatever the machine
# has (pydantic and pydantic-core must match each other exactly); the others only when missing
# or older than MINIMUM (the machine's own copies are what its other packages were built with).
WHEELS = [
    "fastapi==0.165.0", "starlette==1.10.0", "pydantic==2.14.4",
    "pydantic-core==2.50.5", "uvicorn==0.55.0", "typing-inspection==0.4.5",
    "annotated-types==0.8.0", "annotated-doc==0.0.7", "opentelemetry-api==1.45.2",
    "typing-extensions==4.16.0", "click==8.5.1", "h11==0.16.0", "anyio==4.16.0",
    "tqdm==4.70.1", "idna==3.20",
]
ALWAYS = {"fastapi", "starlette", "pydantic", "pydantic_core", "uvicorn",
          "typing_inspection", "annotated_types", "annotated_doc", "opentelemetry_api"}
MINIMUM = {"typing_extensions": "4.16.0", "anyio": "4.1.0", "click": "7.0", "h11": "0.8",
           "tqdm": "4.0", "idna": "2.8"}
# Imported after `install` to prove the set is whole (the server's and the grammars' needs).
IMPORTS = ["pydantic", "pydantic_core", "fastapi", "starlette", "uvicorn", "anyio",
           "h11", "click", "tqdm", "httpx", "prometheus_client", "jinja2", "tokenizers"]

CITY_SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string"},
    "population_millions": {"type": "number"},
    "landmarks": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
}, "required": ["name", "population_millions", "landmarks"], "additionalProperties": False}
MODES = ("unconstrained", "tool_required", "json_schema")


def log(message: str) -> None:
    print(f"[gpu_check {time.strftime('%H:%M:%S')}] {message}", flush=True)


def write_json(data: Any, out: Path) -> None:
    """reporting.write_json's twin, kept here on purpose: `install` runs on the bare device
    before pegmask is importable (this file must need only the standard library there)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(_finite(data), indent=1, ensure_ascii=False) + "\n",
                   encoding="utf-8")
    log(f"wrote {out}")


def _finite(value: Any) -> Any:
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


def _budget(seconds: float) -> float:
    """`seconds`, cut to what the calling step's time limit leaves (GPU_CHECK_STEP_LIMIT, set
    by scripts/device_check.sh) less 15 s to write the results."""
    limit = os.environ.get("GPU_CHECK_STEP_LIMIT")
    return min(seconds, float(limit) - 15) if limit else seconds


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:1000]


# --------------------------------------------------------------------------- install
def _version_key(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split("."):
        digits = "".join(c for c in piece if c.isdigit()) if piece[:1].isdigit() else ""
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def _wheel_fits(filename: str) -> bool:
    """Whether a wheel's python/abi tags fit this interpreter (pure, abi3, or cpXY = ours)."""
    parts = filename[:-4].split("-")
    python_tags, abi = parts[-3].split("."), parts[-2]
    ours = f"cp{sys.version_info.major}{sys.version_info.minor}"
    if any(tag in ("py3", f"py{sys.version_info.major}{sys.version_info.minor}")
           for tag in python_tags):
        return True
    if abi == "abi3":
        return any(tag.startswith("cp3") and _version_key(tag[3:] or "0") <= (
            sys.version_info.minor,) for tag in python_tags)
    return ours in python_tags


def _installed_version(name: str) -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _unzip_wheel(wheel: Path, target: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.infolist():
            path = archive.extract(member, target)
            mode = member.external_attr >> 16
            if mode & 0o111:
                os.chmod(path, 0o755)
    # <name>.data/purelib and platlib belong at the top; scripts and headers are not needed.
    for data in target.glob("*.data"):
        for scheme in ("purelib", "platlib"):
            folder = data / scheme
            if folder.is_dir():
                for item in folder.iterdir():
                    shutil.move(str(item), str(target / item.name))
        shutil.rmtree(data)


def _lay_out_pegmask(repo: Path, target: Path) -> list[str]:
    """`pegmask` under target as symlinks into the checkout, following pyproject.toml's
    packages and package-dir (so `import pegmask.engine` is `<repo>/engine`)."""
    import tomllib

    config = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages = sorted(config.get("packages", ["pegmask"]), key=lambda p: p.count("."))
    mapping = config.get("package-dir", {})

    def source(package: str) -> Path:
        if package in mapping:
            return repo / mapping[package]
        if "." in package:
            parent, _, last = package.rpartition(".")
            return source(parent) / last
        return repo / mapping.get("", ".") / package

    laid = []
    for package in packages:
        place = target.joinpath(*package.split("."))
        origin = source(package)
        if not origin.is_dir():
            raise FileNotFoundError(f"{package}: {origin} is not a folder")
        if place.exists():  # inside a folder linked for its parent
            if place.resolve() != origin.resolve():
                raise RuntimeError(f"{package}: {place} is {place.resolve()}, not {origin}")
            continue
        place.parent.mkdir(parents=True, exist_ok=True)
        if "." in package:
            place.symlink_to(origin.resolve(), target_is_directory=True)
        else:  # the top package: a real folder, its files linked one by one
            place.mkdir()
            for item in origin.iterdir():
                if item.name != "__pycache__":
                    (place / item.name).symlink_to(item.resolve())
        laid.append(f"{package} -> {origin}")
    return laid


def cmd_install(args: argparse.Namespace) -> int:
    target = Path(args.target).resolve()
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    wheels: dict[str, Path] = {}
    for folder in [Path(args.wheels), *map(Path, args.extra_wheels)]:
        for wheel in sorted(folder.glob("*.whl")):
            if _wheel_fits(wheel.name):
                wheels[wheel.name.split("-")[0].lower()] = wheel
            else:
                log(f"skip {wheel.name}: not for this Python")
    record: dict[str, Any] = {"python": sys.version.split()[0], "target": str(target),
                              "installed": {}, "kept": {}}
    for name, wheel in sorted(wheels.items()):
        version = wheel.name.split("-")[1]
        present = _installed_version(name)
        needed = MINIMUM.get(name)
        if name not in ALWAYS and present is not None and (
                needed is None or _version_key(present) >= _version_key(needed)):
            record["kept"][name] = present
            log(f"keep {name} {present} (machine's)")
            continue
        _unzip_wheel(wheel, target)
        record["installed"][name] = version + (f" (over {present})" if present else "")
        log(f"install {name} {version}" + (f" over the machine's {present}" if present else ""))
    record["pegmask"] = _lay_out_pegmask(Path(args.repo).resolve(), target)
    log("pegmask: " + "; ".join(record["pegmask"]))
    # Prove the set imports in a fresh process with the target first on the path.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(target), *filter(None, [os.environ.get("PYTHONPATH")])]), "PYTHONSAFEPATH": "1"}
    probe = ("import importlib, sys\nbad = []\n"
             f"for name in {IMPORTS + ['pegmask', 'pegmask.cli', 'pegmask.kernels']!r}:\n"
             "    try:\n        importlib.import_module(name)\n"
             "    except Exception as exc:\n        bad.append(f'{name}: {exc!r}')\n"
             "print('\\n'.join(bad) or 'all imports ok'); sys.exit(1 if bad else 0)\n")
    result = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                            text=True, cwd=str(target))
    record["imports"] = (result.stdout + result.stderr).strip()
    log(record["imports"])
    if args.record:
        write_json(record, Path(args.record))
    return result.returncode


# --------------------------------------------------------------------------- prepare (here)
def cmd_prepare(args: argparse.Namespace) -> int:
    """Write the model's config, tokenizer and chat template (from the embedded GGUF) and
    download the wheels the device lacks."""
    if not args.no_model:
        from transformers import AutoConfig, AutoTokenizer, GenerationConfig
        from transformers.utils import logging as hf_logging

        from pegmask.engine.model import default_model_path

        hf_logging.set_verbosity_error()
        gguf = Path(args.gguf) if args.gguf else default_model_path()
        source = {"pretrained_model_name_or_path": str(gguf.parent), "gguf_file": gguf.name,
                  "local_files_only": True}
        config = AutoConfig.from_pretrained(**source)
        tokenizer = AutoTokenizer.from_pretrained(**source)
        out = Path(args.config_out)
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        config.save_pretrained(out)
        GenerationConfig.from_model_config(config).save_pretrained(out)
        tokenizer.save_pretrained(out)
        # Older transformers read the template from tokenizer_config.json only.
        settings = json.loads((out / "tokenizer_config.json").read_text())
        settings["chat_template"] = tokenizer.chat_template
        for key in ("is_local", "local_files_only"):
            settings.pop(key, None)
        (out / "tokenizer_config.json").write_text(json.dumps(settings, indent=2) + "\n")
        (out / "SOURCE").write_text(f"config and tokenizer of {gguf.name}, written by "
                                    "`python -m pegmask.bench.gpu_check prepare`\n")
        log(f"{out}: {sorted(p.name for p in out.iterdir())}")
    if not args.no_wheels:
        folder = Path(args.wheels_out)
        folder.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                   "--python-version", "3.12", "--implementation", "cp",
                   "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_17_x86_64",
                   "--platform", "manylinux2014_x86_64", "-d", str(folder), *WHEELS]
        log(" ".join(command))
        subprocess.run(command, check=True)
    return 0


# --------------------------------------------------------------------------- env
def triton_probe(device: str) -> dict[str, Any]:
    """Whether the triton bitmask kernel compiles and runs on `device` (it needs a C compiler
    for its launcher the first time)."""
    import torch

    if not device.startswith("cuda"):
        return {"ok": True, "skipped": f"not CUDA ({device})"}
    found: dict[str, Any] = {"compilers": {c: shutil.which(c) for c in ("cc", "gcc", "clang")}}
    try:
        from pegmask.kernels.triton_apply import apply_token_bitmask_triton

        logits = torch.zeros(1, 64, device=device)
        bits = torch.zeros(1, 2, dtype=torch.int32, device=device)
        bits[0, 0] = -1  # tokens 0-31 allowed, 32-63 not
        started = time.perf_counter()
        apply_token_bitmask_triton(logits, bits, 64, None)
        torch.cuda.synchronize()
        found["first_call_s"] = time.perf_counter() - started
        blocked = torch.isinf(logits[0]).cpu()
        found["ok"] = bool(blocked[32:].all()) and not bool(blocked[:32].any())
    except Exception as exc:  # noqa: BLE001 - recorded; the engine then gets the torch path
        found["ok"] = False
        found["error"] = _error(exc)
    return found


def use_torch_masks() -> None:
    """Masks on CUDA through the torch path, for a device where the triton kernel fails (the
    serve check's server calls this too)."""
    import pegmask.kernels.apply as apply

    apply._triton_available = lambda: False


def cmd_env(args: argparse.Namespace) -> int:
    import importlib.metadata

    import torch

    facts: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "python": platform.python_version(),
        "executable": sys.executable, "cpus": os.cpu_count(), "platform": platform.platform(),
        "torch": torch.__version__, "cuda_available": torch.cuda.is_available(),
        "cuda_version": torch.version.cuda, "pythonpath": os.environ.get("PYTHONPATH"),
        "checkout": _checkout(),
    }
    names = ["triton", "transformers", "tokenizers", "numpy", "safetensors", "accelerate",
             "huggingface_hub", "jinja2", "httpx", "prometheus_client", "pydantic",
             "pydantic_core", "fastapi", "starlette", "uvicorn", "anyio",
             "typing_extensions", "click", "h11", "tqdm", "matplotlib", "jsonschema", "gguf",
             "kernels"]
    facts["versions"] = {}
    for name in names:
        try:
            facts["versions"][name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            facts["versions"][name] = None
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        facts["gpu"] = {"name": props.name, "capability": f"{props.major}.{props.minor}",
                        "memory_gib": round(props.total_memory / 2**30, 1),
                        "multiprocessors": props.multi_processor_count}
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,"
                              "clocks.max.sm,power.limit,mig.mode.current",
                              "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=20)
        facts["nvidia_smi"] = smi.stdout.strip() or smi.stderr.strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        facts["nvidia_smi"] = _error(exc)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    facts["triton_probe"] = triton_probe(device)
    log(json.dumps(facts, indent=1))
    write_json(facts, Path(args.out))
    return 0


def _checkout() -> str:
    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
        return head or "not a git checkout"
    except (OSError, subprocess.TimeoutExpired):
        return "not a git checkout"


# --------------------------------------------------------------------------- make-model
def cmd_make_model(args: argparse.Namespace) -> int:
    """A randomly initialized model of the config's architecture, saved as an HF folder with
    the tokenizer files beside it."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    started = time.perf_counter()
    config_dir, out = Path(args.config), Path(args.out)
    config = AutoConfig.from_pretrained(str(config_dir), local_files_only=True)
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(args.seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    parameters = sum(p.numel() for p in model.parameters())
    if out.exists():
        shutil.rmtree(out)
    model.save_pretrained(str(out))
    for item in config_dir.iterdir():
        if item.is_file() and item.name != "config.json" and not (out / item.name).exists():
            shutil.copy(item, out / item.name)
    (out / "RANDOM_WEIGHTS").write_text(
        f"random weights, seed {args.seed}, architecture and tokenizer of {config_dir}\n")
    log(f"{type(model).__name__} {parameters / 1e6:.1f}M parameters, {dtype}, built on "
        f"{device} and saved to {out} in {time.perf_counter() - started:.1f} s: "
        f"{sorted(p.name for p in out.iterdir())}")
    return 0


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
    deadline = time.monotonic() + _budget(args.budget)
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
                    case["error"] = _error(exc)
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
                case["error"] = _error(exc)
            found["cases"].append(case)
            log(json.dumps(case))
    return found


# --------------------------------------------------------------------------- decode
def _requests(mode: str, batch: int, max_tokens: int, temperature: float) -> list[dict]:
    # The serve bench's tools and questions (imported here: `install` runs before pegmask can be).
    from pegmask.bench.serve_bench import QUESTIONS, TOOLS

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
    deadline = started + _budget(args.budget)
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
        result["error"] = f"the engine did not start: {_error(exc)}"
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
                result.setdefault("warmup_errors", {})[mode] = _error(exc)
                log(f"warm-up {mode}: {_error(exc)}")
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
                       "error": _error(exc)}
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
def _get(url: str, timeout: float) -> bytes:
    import urllib.request

    with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 - loopback
        return response.read()


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _stop(process: subprocess.Popen[Any]) -> None:
    """End the server: SIGTERM (uvicorn's graceful stop), SIGKILL after 15 s."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=15)


def cmd_serve(args: argparse.Namespace) -> int:
    """`pegmask serve` on the device (its log kept), driven by `pegmask bench serve --url`."""
    started = time.monotonic()
    deadline = started + _budget(args.budget)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    out = Path(args.out)
    result: dict[str, Any] = {"device": args.device, "model": args.model, "status": "started"}
    result["triton_probe"] = triton = triton_probe(args.device)
    port = _free_port()
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
        ready = None
        while time.monotonic() < min(deadline, started + args.start_timeout):
            if server.poll() is not None:
                break
            try:
                ready = json.loads(_get(f"{url}/v1/models", 2))
                break
            except (OSError, ValueError):
                time.sleep(1)
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
            metrics = _get(f"{url}/metrics", 5).decode()
            result["metrics"] = [line for line in metrics.splitlines()
                                 if line.startswith("pegmask_") and "_bucket" not in line
                                 and "_created" not in line][:80]
        except OSError as exc:
            result["metrics"] = [_error(exc)]
    finally:
        _stop(server)
        result["server_rc"] = server.returncode
        lines = server_log.read_text(errors="replace").splitlines() if server_log.exists() \
            else []
        result["server_log_lines"] = len(lines)
        result["server_log_tail"] = lines[-120:]
        result["total_s"] = time.monotonic() - started
        write_json(result, out)
    return 0 if result["status"] == "ok" else 1


# --------------------------------------------------------------------------- report
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
    text = report(Path(args.dir))
    print(text)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text, encoding="utf-8")
        log(f"wrote {out}")
    return 0


# --------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pegmask.bench.gpu_check",
                                     description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)

    p = commands.add_parser("install", help="unzip the carried wheels, lay out pegmask")
    p.add_argument("--wheels", default=str(REPO / ".whl"))
    p.add_argument("--extra-wheels", action="append", default=[],
                   help="another wheel folder (e.g. a cp311 pydantic-core for a local test)")
    p.add_argument("--target", required=True)
    p.add_argument("--repo", default=str(REPO))
    p.add_argument("--record", help="JSON file listing what was installed")
    p.set_defaults(run=cmd_install)

    p = commands.add_parser("prepare", help="(here) config + tokenizer from the GGUF, wheels")
    p.add_argument("--gguf", help="default: the embedded SmolLM2 GGUF")
    p.add_argument("--config-out", default=str(REPO / ".gpudata" / "smollm2"))
    p.add_argument("--wheels-out", default=str(REPO / ".whl"))
    p.add_argument("--no-model", action="store_true")
    p.add_argument("--no-wheels", action="store_true")
    p.set_defaults(run=cmd_prepare)

    p = commands.add_parser("env", help="machine, versions, triton probe")
    p.add_argument("--out", required=True)
    p.set_defaults(run=cmd_env)

    p = commands.add_parser("make-model", help="random weights, the config's architecture")
    p.add_argument("--config", default=str(REPO / ".gpudata" / "smollm2"))
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(run=cmd_make_model)

    p = commands.add_parser("kernels", help="triton bitmask kernel against the torch path")
    p.add_argument("--out", required=True)
    p.add_argument("--batches", default="1,8,32,128")
    p.add_argument("--vocabs", default="49152,129280,201088")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--repeats", type=int, default=5, help="CPU timing loops")
    p.add_argument("--calls", type=int, default=200, help="calls for the host timing")
    p.add_argument("--budget", type=float, default=90.0, help="seconds; later cases skipped")
    p.add_argument("--cpu", action="store_true", help="stay on the CPU even with CUDA")
    p.set_defaults(run=cmd_kernels)

    p = commands.add_parser("decode", help="Engine.generate_batch, three modes")
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="auto")
    p.add_argument("--batches", default="1,8,32")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--budget", type=float, default=120.0, help="seconds; later runs skipped")
    p.set_defaults(run=cmd_decode)

    p = commands.add_parser("serve", help="pegmask serve + pegmask bench serve --url")
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--work", default="/tmp/gpucheck/serve")
    p.add_argument("--device", default="cuda")
    p.add_argument("--clients", default="1,8,32")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--requests", type=int, default=0, help="per phase (bench default if 0)")
    p.add_argument("--time-limit", type=float, default=30.0, help="seconds per phase")
    p.add_argument("--max-running", type=int, default=32)
    p.add_argument("--start-timeout", type=float, default=150.0)
    p.add_argument("--budget", type=float, default=150.0)
    p.set_defaults(run=cmd_serve)

    p = commands.add_parser("report", help="markdown tables from a folder of results")
    p.add_argument("dir")
    p.add_argument("--out", help="also write the tables to this file")
    p.set_defaults(run=cmd_report)

    args = parser.parse_args(argv)
    return int(args.run(args) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
