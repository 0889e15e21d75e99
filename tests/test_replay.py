"""The bounded memory of generated turns: exact hits, misses, eviction."""

from __future__ import annotations

import threading

import pytest

from pegmask.dialects.history import ToolCall
from pegmask.dialects.replay import ReplayMemory

A = ToolCall("a", "weather", {"city": "Tokyo", "days": 2})
B = ToolCall("b", "weather", {"city": "Osaka"})
RAW = '<think>\nTwo cities.\n</think>\n\n<tool_call>\n{"name":"weather","arguments":{"city":"Tokyo","days":2}}\n</tool_call>'


def test_hit_returns_the_stored_bytes():
    memory = ReplayMemory()
    memory.remember([A, B], RAW)
    assert memory.recall([A, B]) == [RAW]
    reordered_keys = ToolCall("a", "weather", {"days": 2, "city": "Tokyo"})
    assert memory.recall([reordered_keys, B]) == [RAW]  # key order is not a change


def test_openai_dicts_are_accepted_when_remembering():
    memory = ReplayMemory()
    memory.remember(
        [
            {
                "id": "a",
                "type": "function",
                "function": {"name": "weather", "arguments": '{"city": "Tokyo", "days": 2}'},
            }
        ],
        "text",
    )
    assert memory.recall([A]) == ["text"]


@pytest.mark.parametrize(
    "calls",
    [
        [A],  # only part of the turn
        [B, A],  # other order
        [A, ToolCall("b", "weather", {"city": "Kyoto"})],  # edited arguments
        [A, ToolCall("b", "forecast", {"city": "Osaka"})],  # other name
        [A, B, ToolCall("c", "weather", {})],  # an unknown id
        [ToolCall("zzz", "weather", {})],
        [],
    ],
)
def test_any_mismatch_is_a_miss(calls):
    memory = ReplayMemory()
    memory.remember([A, B], RAW)
    assert memory.recall(calls) is None


def test_a_turn_covered_by_several_generations():
    memory = ReplayMemory()
    memory.remember([A], "first")
    memory.remember([B], "second")
    assert memory.recall([A, B]) == ["first", "second"]


def test_lru_eviction_and_refresh():
    memory = ReplayMemory(max_entries=2)
    calls = [ToolCall(str(n), "f", {"n": n}) for n in range(3)]
    memory.remember([calls[0]], "0")
    memory.remember([calls[1]], "1")
    assert memory.recall([calls[0]]) == ["0"]  # refreshed: 1 is now the oldest
    memory.remember([calls[2]], "2")
    assert len(memory) == 2
    assert memory.recall([calls[1]]) is None
    assert memory.recall([calls[0]]) == ["0"] and memory.recall([calls[2]]) == ["2"]


def test_remembering_a_call_again_replaces_its_turn():
    memory = ReplayMemory()
    memory.remember([A, B], "old")
    memory.remember([A], "new")
    assert memory.recall([A]) == ["new"]
    assert memory.recall([A, B]) is None
    assert len(memory) == 1


def test_forget_and_clear():
    memory = ReplayMemory()
    memory.remember([A, B], RAW)
    memory.forget("b")
    assert memory.recall([A, B]) is None and len(memory) == 0
    memory.remember([A], "x")
    memory.clear()
    assert memory.recall([A]) is None


def test_invalid_use():
    with pytest.raises(ValueError):
        ReplayMemory(max_entries=0)
    with pytest.raises(ValueError):
        ReplayMemory().remember([], "text")
    with pytest.raises(ValueError):
        ReplayMemory().remember([ToolCall("", "f", {})], "text")


def test_concurrent_use_stays_consistent():
    memory = ReplayMemory(max_entries=64)

    def worker(offset: int) -> None:
        for n in range(300):
            call = ToolCall(f"{offset}-{n}", "f", {"n": n})
            memory.remember([call], str(n))
            assert memory.recall([call]) in (None, [str(n)])

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(memory) == 64
