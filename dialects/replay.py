"""A bounded memory of the raw text of assistant turns the engine generated, keyed by call id.

Clients send tool calls back without what surrounded them (reasoning, the exact spacing and
JSON layout the model wrote), so a prompt rebuilt from the client's copy differs from what the
model actually produced, and the model then reads a history it never wrote. When every call of a
turn is found here with the same names and arguments, the renderer replays the stored bytes;
after a miss, an eviction or unknown ids it rebuilds the turn from the structured history.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pegmask.dialects.history import ToolCall, parse_arguments

__all__ = ["ReplayMemory"]


def _fingerprint(call: ToolCall) -> tuple[str, str, str]:
    """Identity of a call as the client may send it back: argument key order does not matter."""
    arguments = call.arguments
    canonical = (
        arguments
        if isinstance(arguments, str)
        else json.dumps(arguments, sort_keys=True, ensure_ascii=False)
    )
    return call.id, call.name, canonical


def _as_call(call: ToolCall | Mapping[str, Any]) -> ToolCall:
    if isinstance(call, ToolCall):
        return call
    function = call.get("function") or call
    return ToolCall(
        str(call.get("id") or call.get("call_id") or ""),
        function.get("name", ""),
        parse_arguments(function.get("arguments")),
    )


@dataclass(frozen=True)
class _Entry:
    text: str
    calls: tuple[tuple[str, str, str], ...]


class ReplayMemory:
    """LRU memory of generated assistant turns (``max_entries`` turns at most), thread-safe."""

    def __init__(self, max_entries: int = 1024) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self.max_entries = max_entries
        self._entries: OrderedDict[tuple[str, ...], _Entry] = OrderedDict()
        self._by_id: dict[str, tuple[str, ...]] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def remember(self, calls: Sequence[ToolCall | Mapping[str, Any]], text: str) -> None:
        """Store ``text``, the turn as generated, for the calls it made (OpenAI dicts or ToolCalls).

        ``text`` is the turn after the dialect's assistant header, without the stop token; see
        :func:`pegmask.dialects.native.replay_text`.
        """
        parsed = [_as_call(call) for call in calls]
        if not parsed or any(not call.id for call in parsed):
            raise ValueError("a remembered turn needs at least one call, each with an id")
        key = tuple(call.id for call in parsed)
        entry = _Entry(text, tuple(_fingerprint(call) for call in parsed))
        with self._lock:
            for call_id in key:
                self._drop(self._by_id.get(call_id))
            self._entries[key] = entry
            self._by_id.update(dict.fromkeys(key, key))
            while len(self._entries) > self.max_entries:
                self._drop(next(iter(self._entries)))

    def recall(self, calls: Sequence[ToolCall]) -> list[str] | None:
        """The stored texts covering ``calls`` in order, or ``None`` unless all of them match."""
        if not calls:
            return None
        texts = []
        position = 0
        with self._lock:
            while position < len(calls):
                key = self._by_id.get(calls[position].id)
                entry = self._entries.get(key) if key else None
                span = calls[position : position + len(key)] if key else ()
                if entry is None or tuple(_fingerprint(call) for call in span) != entry.calls:
                    return None
                texts.append(entry.text)
                position += len(key)
            for call in calls:
                self._entries.move_to_end(self._by_id[call.id])
        return texts

    def forget(self, call_id: str) -> None:
        """Drop the turn that made ``call_id`` (for example when the client edited it)."""
        with self._lock:
            self._drop(self._by_id.get(call_id))

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._by_id.clear()

    def _drop(self, key: tuple[str, ...] | None) -> None:
        if key is None or key not in self._entries:
            return
        del self._entries[key]
        for call_id in key:
            if self._by_id.get(call_id) == key:
                del self._by_id[call_id]
