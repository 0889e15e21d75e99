"""Peak resident memory growth of a block of code (Linux), for the grammar bench's memory
column."""

from __future__ import annotations

import ctypes
import gc
from collections.abc import Iterator
from contextlib import contextmanager


def _status_kib(key: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(key):
                return int(line.split()[1])
    raise KeyError(key)


@contextmanager
def peak_rss(out: dict[str, float]) -> Iterator[None]:
    """Store in `out["rss_mib"]` the peak RSS growth (MiB) inside the block, or NaN.

    Garbage is collected and glibc's free memory handed back to the system first, so that
    less of what the block allocates is served unseen from memory the process already holds.
    """
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    try:
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")  # resets VmHWM to the current RSS
        before = _status_kib("VmRSS")
    except OSError:
        before = None
    try:
        yield
    finally:
        out["rss_mib"] = float("nan") if before is None else (_status_kib("VmHWM") - before) / 1024
