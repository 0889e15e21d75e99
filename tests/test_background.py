"""The background lane (engine/background.py): what counts as a large request, and the thread
its work runs on (lowest priority, the collector paused, jobs in turn, errors raised to the
caller)."""

from __future__ import annotations

import asyncio
import gc
import os
import sys
import threading

import pytest

from pegmask.engine.background import (
    LANE_NICENESS,
    LARGE_REQUEST_CHARS,
    BackgroundLane,
    text_size,
)


def test_text_size_counts_strings_and_items():
    assert text_size("abc") == 3
    assert text_size([{"role": "user", "content": "hi"}]) == 8 + 16 + 4 + 4 + 7 + 2
    assert text_size(("a", 5, None)) == 24 + 1


def test_text_size_stops_past_the_limit():
    """200,000 messages: the count stops just past the limit instead of walking them all."""
    messages = [{"role": "user", "content": f"m{i}"} for i in range(200_000)]
    size = text_size(messages)
    assert LARGE_REQUEST_CHARS < size < 200_000 * 8 + LARGE_REQUEST_CHARS  # the list's items
    assert text_size(messages, limit=10) == 200_000 * 8  # the list itself, nothing inside
    assert text_size(["x" * 100] * 3, limit=150) == 24 + 200  # two strings: past 150, stop


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
