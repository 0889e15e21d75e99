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

Small requests never use the lane (`LARGE_REQUEST_CHARS`): their few milliseconds of work
cost the others nothing, and under load the lane may keep them waiting for seconds.
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

# A request whose text (messages, tools, prompt: `text_size`) is longer goes to the lane: about
# 16,000 tokens, tens of milliseconds to render and tokenize. A server's JSON body of more
# bytes is decoded there too.
LARGE_REQUEST_CHARS = 64 * 1024
LANE_NICENESS = 19


def text_size(value: Any, limit: int = LARGE_REQUEST_CHARS) -> int:
    """The characters of the strings in a JSON-like value, and 8 for each item of its lists and
    objects, counted until past `limit` (so the count costs at most about `limit` / 8 items,
    whatever the value's size)."""
    size, pending = 0, [value]
    while pending and size <= limit:
        item = pending.pop()
        if isinstance(item, str):
            size += len(item)
        elif isinstance(item, Mapping):
            size += 8 * len(item)
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, (list, tuple)):
            size += 8 * len(item)
            pending.extend(item)
    return size


def _lower_priority() -> None:
    """The calling thread at `LANE_NICENESS` (Linux, where niceness is per thread; elsewhere it
    is the process's, and the server's other threads must keep theirs: left as it is)."""
    if sys.platform.startswith("linux"):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), LANE_NICENESS)


def _without_collections(job: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`job(*args, **kwargs)` with the cyclic garbage collector paused (see the module
    docstring); only the lane's one thread pauses and resumes it."""
    paused = gc.isenabled()
    gc.disable()
    try:
        return job(*args, **kwargs)
    finally:
        if paused:
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
