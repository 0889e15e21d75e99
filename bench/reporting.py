"""What every bench report states and how it is written: the machine (and waiting for it to be
idle), the package versions, the checkout measured, and the files (markdown printed and saved,
JSON beside it) under bench/results/."""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent / "results"
PEER_PACKAGES = ("xgrammar", "llguidance", "outlines_core")
MODEL_PACKAGES = ("transformers", "tokenizers", "numpy", "torch")
SETTLE_TIMEOUT_S = 300.0  # longest wait for the load average to come down (`settle`)
READ_SET_MIB = (64, 256, 1024)  # working sets of `memory_read_speed`: cache, a model, memory


def checkout_state() -> str:
    """The pegmask commit measured, and whether the working tree differed from it."""
    root = str(Path(__file__).resolve().parents[1])
    try:
        head, changes = (
            subprocess.run(["git", "-C", root, *args], capture_output=True, text=True,
                           check=True).stdout.strip()
            for args in (["rev-parse", "--short", "HEAD"], ["status", "--porcelain", "-uno"])
        )
    except (OSError, subprocess.CalledProcessError):
        return "not a git checkout"
    return f"commit {head}" + (" with uncommitted changes" if changes else "")


def cpu_name() -> str:
    """The CPU's model name (Linux), else what `platform` knows."""
    try:
        with open("/proc/cpuinfo") as info:
            return next((line.split(":", 1)[1].strip() for line in info
                         if line.startswith("model name")), platform.processor())
    except OSError:
        return platform.processor() or platform.machine()


def last_level_cache() -> str | None:
    """The size of the CPU's last-level cache as Linux states it ("480 MiB"), None elsewhere."""
    folder = Path("/sys/devices/system/cpu/cpu0/cache")
    sizes = sorted((int((index / "level").read_text()), (index / "size").read_text().strip())
                   for index in folder.glob("index*") if (index / "level").exists())
    if not sizes:
        return None
    size = sizes[-1][1]  # "491520K"
    if size.endswith("K") and size[:-1].isdigit() and int(size[:-1]) % 1024 == 0:
        return f"{int(size[:-1]) // 1024} MiB"
    return size


def memory_read_speed(sizes_mib: Sequence[int] = READ_SET_MIB) -> dict[int, float]:
    """GiB/s at which this process reads working sets of `sizes_mib` MiB (a float32 sum on all
    cores, the median of 7). Why: a VM's share of a host's last-level cache (480 MiB here, one
    for the host) moves with its neighbours, and with it how fast a decode step reads a model's
    weights (SmolLM2 in bfloat16: 270 MB). Runs of the same code took 22.9 and 30-34 ms for a
    one-row step hours apart on one day; these figures, taken at a run's start and end, say
    which kind of hour it was."""
    import torch

    speeds = {}
    for size in sizes_mib:
        data = torch.ones(size << 18)  # float32: 2**18 per MiB
        data.sum()
        times = []
        for _ in range(7):
            start = time.perf_counter()
            data.sum()
            times.append(time.perf_counter() - start)
        speeds[size] = size / 1024 / statistics.median(times)
        del data
    return speeds


def describe_read_speed(speeds: dict[int, float]) -> str:
    """"47 / 21 / 21 GiB/s at 64 / 256 / 1024 MiB"."""
    return (" / ".join(f"{speed:.0f}" for speed in speeds.values()) + " GiB/s at "
            + " / ".join(map(str, speeds)) + " MiB")


def versions(packages: Sequence[str]) -> dict[str, str]:
    """Installed version of each package ("not installed" when absent)."""
    found = {}
    for package in packages:
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[package] = "not installed"
    return found


def machine(packages: Sequence[str] = PEER_PACKAGES + MODEL_PACKAGES) -> dict[str, Any]:
    """The facts `machine_info` prints, as data for a JSON report."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "date": f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}",
        "usable_cores": cores,
        "online_cores": os.cpu_count(),
        "cpu": cpu_name(),
        "last_level_cache": last_level_cache(),
        "system": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "load_average": load_average() if hasattr(os, "getloadavg") else None,
        "versions": versions(("pegmask", *packages)),
        "checkout": checkout_state(),
    }


def machine_info(packages: Sequence[str] = PEER_PACKAGES + MODEL_PACKAGES) -> str:
    """Date, cores, CPU, Python, package versions and checkout, as markdown lines."""
    facts = machine(packages)
    load = facts["load_average"]
    return "\n".join([
        f"- date: {facts['date']}",
        f"- machine: {facts['usable_cores']} usable cores ({facts['online_cores']} online), "
        f"{facts['cpu']}, {facts['system']}"
        + (f" (load average {load:.1f} at the end: other jobs may share the cores)"
           if load is not None else ""),
        f"- python {facts['python']} ({sys.executable})",
        "- " + ", ".join(f"{name} {version}" for name, version in facts["versions"].items()),
        f"- pegmask checkout: {facts['checkout']}",
    ])


def command_line(module: str, argv: Sequence[str]) -> str:
    """How a user reruns this report: the `pegmask bench` command with the same options."""
    return " ".join(["pegmask bench", module, *argv])


def publish(report: str, out: Path | None) -> None:
    """Print a markdown report, and write it to `out` as well when given."""
    print(report)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(report, encoding="utf-8")


def load_average() -> float:
    """The 1-minute load average (what the benches' load checks read)."""
    return os.getloadavg()[0]


def settle(bound: Callable[[], float], timeout_s: float = SETTLE_TIMEOUT_S) -> float:
    """Wait until the 1-minute load average is at most `bound()` (a bench's start limit, or a
    phase's own share plus a margin), and return it. A server's start-up (vLLM's takes a minute
    of both cores), a test step just before, or a job that has just ended lingers in that
    average for minutes; without this a load check would fail a run for work that was over, not
    for other jobs. Gives up after `timeout_s`: the check then says so."""
    deadline = time.monotonic() + timeout_s
    while load_average() > bound() and time.monotonic() < deadline:
        time.sleep(2.0)
    return load_average()


def write_json(data: Any, out: Path) -> None:
    """A report's figures as indented JSON (NaN written as null)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(_finite(data), indent=1, ensure_ascii=False) + "\n",
                   encoding="utf-8")


def _finite(value: Any) -> Any:
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value
