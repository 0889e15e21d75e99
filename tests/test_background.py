"""The background lane (engine/background.py): what counts as a large request, and the thread
its work runs on (lowest priority, the collector paused, jobs in turn, errors raised to the
caller)."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import sys
import threading

import pytest

from pegmask.engine.background import (
    ITEM_CHARS,
    LANE_NICENESS,
    LARGE_REQUEST_SIZE,
    BackgroundLane,
    body_size,
    text_size,
)


def test_text_size_counts_strings_and_items():
    assert text_size("abc") == 3
    assert text_size([{"role": "user", "content": "hi"}]) == 3 * ITEM_CHARS + 4 + 4 + 7 + 2
    assert text_size(("a", 5, None)) == 3 * ITEM_CHARS + 1


def test_text_size_stops_past_the_limit():
    """200,000 messages: the count stops just past the limit instead of walking them all."""
    messages = [{"role": "user", "content": f"m{i}"} for i in range(200_000)]
    size = text_size(messages)
    assert LARGE_REQUEST_SIZE < size < 200_000 * ITEM_CHARS + LARGE_REQUEST_SIZE
    assert text_size(messages, limit=10) == 200_000 * ITEM_CHARS  # the list, nothing inside
    assert text_size(["x" * 100] * 3, limit=150) == 3 * ITEM_CHARS + 100  # one string: past


def test_what_is_large():
    """A megabyte of text, or some 20,000 items; not a 100 KB document or a long chat."""
    def body(messages):
        return json.dumps({"model": "m", "messages": messages}).encode()

    document = [{"role": "user", "content": " " * 100_000}]
    chat = [{"role": "user", "content": "x" * 200} for _ in range(1000)]
    many = [{"role": "user", "content": "m"} for _ in range(10_000)]
    book = [{"role": "user", "content": "x" * 1_100_000}]
    for messages, large in ((document, False), (chat, False), (many, True), (book, True)):
        assert (text_size(messages) > LARGE_REQUEST_SIZE) is large
        assert (body_size(body(messages)) > LARGE_REQUEST_SIZE) is large
    assert body_size(b'{"a": [1, 2]}') == 13 + 3 * ITEM_CHARS


def test_jobs_run_in_turn_on_one_low_priority_thread_with_the_collector_paused():
    lane = BackgroundLane()
    try:
        def where() -> tuple[int, int, bool]:
            native = threading.get_native_id()
            return native, os.getpriority(os.PRIO_PROCESS, native), gc.isenabled()

        first, second = lane.run(where), lane.run(where)
        assert first[0] == second[0] != threading.get_native_id()
        if sys.platform.startswith("linux"):  # niceness is per thread there
            assert first[1] == LANE_NICENESS
            assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) != LANE_NICENESS
        assert first[2] is False and gc.isenabled()  # paused during the job only
        assert asyncio.run(lane.arun(where))[0] == first[0]
    finally:
        lane.close()


def test_a_job_on_the_lane_asking_for_the_lane_runs_at_once():
    lane = BackgroundLane()
    try:
        assert lane.run(lambda: lane.run(threading.get_native_id)) != threading.get_native_id()
    finally:
        lane.close()


def test_a_jobs_error_reaches_its_caller_and_the_lane_goes_on():
    lane = BackgroundLane()
    try:
        with pytest.raises(ValueError, match="bad request"):
            lane.run(lambda: (_ for _ in ()).throw(ValueError("bad request")))
        with pytest.raises(KeyError):
            asyncio.run(lane.arun({}.__getitem__, "missing"))
        assert lane.run(lambda: 7) == 7 and gc.isenabled()
    finally:
        lane.close()
