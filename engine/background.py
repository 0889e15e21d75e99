"""The background lane: where the work a large request brings runs, at the lowest priority.

Decoding a request's JSON, converting it to the engine's request, rendering and tokenizing it
cost time linear in its size, and a body of a few megabytes (200,000 short messages) takes
seconds of it. In a thread of the serving process at normal priority, that work takes one of the
cores the decode loop's OpenMP team steps on, and, being mostly Python, the interpreter's lock
the loop needs between its torch calls. Measured through the server beside one streaming client
(23-28 ms between its tokens alone): a 1.65 MB body of 40,000 messages took 2.0 s, during which
the client got 13 tokens (gaps p50 102 ms, max 640 ms). On the lane (one thread at niceness
19) the client's gaps stayed at p50 27 / p99 60 ms; the large request took 57 s instead. Under
Linux's SCHED_IDLE class (the compile workers') it took 320 s for the same protection: too
long a wait for a legitimate long prompt. The cyclic garbage collector waits while a job runs:
a full collection, which the job's hundreds of thousands of new objects trigger, walks them all
holding the interpreter's lock, whichever thread it runs in (the same probe's longest gap:
941 ms with it, 280 ms without); refcounting still frees what the job drops, and a job is
bounded by the body's size limit.

Requests of ordinary size never use the lane (`LARGE_REQUEST_SIZE`): under load it keeps them
waiting. A document of 100 KB (1,600 tokens) beside 8 streaming clients was answered in 2.8 s
(median of 5) on the lane, 0.35 s off it; so the lane takes what no real request reaches: a
megabyte of text, or some 20,000 JSON items (messages, keys, list elements).
"""

from __future__ import annotations

import asyncio
import gc
import os
import sys
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")

# What makes a request large (`text_size`, `body_size`): its characters, and `ITEM_CHARS` for
# each item of its JSON. Converting and rendering 200,000 messages took 3.5 s of Python, about
# 6 us an item, holding the interpreter's lock in bursts; tokenizing takes about 1 us a
# character on one core, the lock released. Past 1 MiB: a megabyte of text (1 s of
# tokenizing), or 20,000 items (0.1-0.3 s of Python).
ITEM_CHARS = 50
LARGE_REQUEST_SIZE = 1024 * 1024
LANE_NICENESS = 19


def text_size(value: Any, limit: int = LARGE_REQUEST_SIZE) -> int:
    """The characters of the strings in a JSON-like value, and `ITEM_CHARS` for each item of its
    lists and objects, counted until past `limit` (so the count costs at most about
    `limit` / `ITEM_CHARS` items, whatever the value's size)."""
    size, pending = 0, [value]
    while pending and size <= limit:
        item = pending.pop()
        if isinstance(item, str):
            size += len(item)
        elif isinstance(item, Mapping):
            size += ITEM_CHARS * len(item)
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, (list, tuple)):
            size += ITEM_CHARS * len(item)
            pending.extend(item)
    return size


def body_size(raw: bytes) -> int:
    """`text_size` of a JSON body, estimated from its bytes without decoding it: each object,
    list and key (`{`, `[`, `:`, inside strings too) counts as an item."""
    return len(raw) + ITEM_CHARS * (raw.count(b"{") + raw.count(b"[") + raw.count(b":"))


def _lower_priority() -> None:
    """The calling thread at `LANE_NICENESS` (Linux, where niceness is per thread; elsewhere it
    is the process's, and the server's other threads must keep theirs: left as it is)."""
    if sys.platform.startswith("linux"):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), LANE_NICENESS)


def _without_collections(job: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`job(*args, **kwargs)` with the cyclic garbage collector paused (see the module
    docstring); only the lane's one thread pauses and resumes it."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return job(*args, **kwargs)
    finally:
        if enabled:
            gc.enable()


class BackgroundLane:
    """One low-priority thread (started with the first job) that runs jobs in turn. A job
    submitted from the lane's own thread runs at once (a large request's prompt, asked for by
    a job already on the lane, must not wait behind that job)."""

    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="pegmask-background",
                                            initializer=self._enter)
        self._thread: threading.Thread | None = None

    def _enter(self) -> None:
        self._thread = threading.current_thread()
        _lower_priority()

    def run(self, job: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`job(*args, **kwargs)` on the lane, waited for; its exception is raised here."""
        if threading.current_thread() is self._thread:
            return job(*args, **kwargs)
        return self._executor.submit(_without_collections, job, *args, **kwargs).result()

    async def arun(self, job: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`run` for asyncio: the event loop goes on while the lane works (a job not started
        when the caller is cancelled never runs)."""
        return await asyncio.wrap_future(
            self._executor.submit(_without_collections, job, *args, **kwargs))

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
