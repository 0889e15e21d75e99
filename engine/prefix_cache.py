"""Prompt prefixes kept in the model's cache, so that requests sharing one skip its prefill.

Why: a chat server's prompts share long beginnings (the system prompt and the tool definitions,
identical for every request of a client), and on a CPU the prefill of those tokens costs more
than the whole answer of a small model (a 299-token tool prompt takes about a second on two
cores). vLLM keeps prefixes too (automatic prefix caching); here a kept prefix is a copy of
its keys and values saved from the runner (`SequenceRunner.save`, outside the batch: it costs
no attention and only its tokens' memory), and a request that starts with it begins as a
sequence restored from it.

Prefixes are kept and reused in whole blocks of `block` tokens, the scheduler's prefill chunk
(kept as soon as a block is in, so that requests that arrived together share it too):
a prompt prefilled alone is cut into the same chunks whether its beginning came from here or
not, so a repeated request decodes exactly as it did the first time (the forward's float
results depend on how rows are grouped and on the batch slot, which a saved prefix does not
take). At least the prompt's last token is always prefilled:
its logits are the first step's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pegmask.engine.runner import SequenceRunner


@dataclass
class _Entry:
    tokens: tuple[int, ...]
    saved: Any  # the runner's saved cache of exactly `tokens`
    used: int  # when last kept or reused (a step counter), for eviction


class PrefixCache:
    """At most `capacity` prompt prefixes, least recently used evicted first."""

    def __init__(self, runner: SequenceRunner, block: int, capacity: int):
        if block < 1 or capacity < 0:
            raise ValueError("a prefix cache needs block >= 1 and capacity >= 0")
        self.runner = runner
        self.block = block
        self.capacity = capacity
        self._entries: list[_Entry] = []
        self._clock = 0

    def __len__(self) -> int:
        return len(self._entries)

    def start(self, prompt: Sequence[int]) -> tuple[int, int]:
        """A new runner sequence for `prompt`, and how many of its tokens it already holds."""
        best: _Entry | None = None
        reused = 0
        for entry in self._entries:
            usable = self._usable(_shared(entry.tokens, prompt), len(prompt))
            if usable > reused:
                best, reused = entry, usable
        if best is None:
            return self.runner.add(), 0
        self._clock += 1
        best.used = self._clock
        return self.runner.restore(best.saved), reused

    def keep(self, seq: int, tokens: Sequence[int]) -> None:
        """`seq` holds `tokens` (a prompt or its beginning): save its whole blocks."""
        length = len(tokens) // self.block * self.block
        if length == 0 or self.capacity == 0:
            return
        tokens = tuple(tokens[:length])
        self._clock += 1
        for entry in self._entries:
            if entry.tokens[:length] == tokens:  # held already, or inside a longer one
                entry.used = self._clock
                return
        # A prefix that the new one extends goes: the new one serves every prompt it did.
        self._entries = [e for e in self._entries if tokens[:len(e.tokens)] != e.tokens]
        while len(self._entries) >= self.capacity:
            self._entries.remove(min(self._entries, key=lambda e: e.used))
        self._entries.append(_Entry(tokens, self.runner.save(seq, length), self._clock))

    def _usable(self, shared: int, prompt_length: int) -> int:
        """Whole blocks of a shared prefix, leaving the prompt's last token to prefill."""
        return min(shared, prompt_length - 1) // self.block * self.block


def _shared(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of the common beginning of `a` and `b`."""
    length = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        length += 1
    return length
