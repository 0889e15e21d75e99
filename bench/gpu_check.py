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
the checkout's current code runs, whatever it holds when the check starts. So this file imports
no pegmask module up front: the measurements (bench/gpu_measure.py) and the tables
(bench/gpu_report.py) are imported when their subcommand runs.

On CUDA every forward is followed by `torch.cuda.synchronize()` in the decode check, so the
engine's own step accounting (forward / masks / sampling) charges the GPU's work to the
forward instead of to whichever later op waits for it.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable
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


def step_budget(seconds: float) -> float:
    """`seconds`, cut to what the calling step's time limit leaves (GPU_CHECK_STEP_LIMIT, set
    by scripts/device_check.sh) less 15 s to write the results."""
    limit = os.environ.get("GPU_CHECK_STEP_LIMIT")
    return min(seconds, float(limit) - 15) if limit else seconds


def error_text(exc: BaseException) -> str:
    """An exception as a result file records it (its type and message, 1000 characters)."""
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
        found["error"] = error_text(exc)
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
        facts["nvidia_smi"] = error_text(exc)
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


# --------------------------------------------------------------------------- main
def _later(module: str, name: str) -> Callable[[argparse.Namespace], int]:
    """Subcommand `name` of `pegmask.bench.<module>`, imported when it runs (this file needs
    only the standard library: `install` runs before pegmask is importable)."""
    def run(args: argparse.Namespace) -> int:
        return getattr(importlib.import_module(f"pegmask.bench.{module}"), name)(args)

    return run


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
    p.set_defaults(run=_later("gpu_measure", "cmd_kernels"))

    p = commands.add_parser("decode", help="Engine.generate_batch, three modes")
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="auto")
    p.add_argument("--batches", default="1,8,32")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--budget", type=float, default=120.0, help="seconds; later runs skipped")
    p.set_defaults(run=_later("gpu_measure", "cmd_decode"))

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
    p.set_defaults(run=_later("gpu_measure", "cmd_serve"))

    p = commands.add_parser("report", help="markdown tables from a folder of results")
    p.add_argument("dir")
    p.add_argument("--out", help="also write the tables to this file")
    p.set_defaults(run=_later("gpu_report", "cmd_report"))

    args = parser.parse_args(argv)
    return int(args.run(args) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
