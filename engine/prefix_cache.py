"""Prompt prefixes kept in the model's cache, so that requests sharing one skip its prefill.

Why: a chat server's prompts share long beginnings (the system prompt and the tool definitions,
identical for every request of a client; the whole conversation so far, a turn later), and on a
CPU the prefill of those tokens costs more than the whole answer of a small model (a 299-token
tool prompt takes about a second on two cores). vLLM keeps prefixes too (automatic prefix
caching, in blocks of 16 tokens); here a kept prefix is a copy of its keys and values saved from
the runner (`SequenceRunner.save`, outside the batch: it costs no attention and only its
tokens' memory), and a request that starts with it begins as a sequence restored from it.

Prefixes are kept and reused in whole blocks of `block` tokens (16), kept as soon as a block is
in, so that requests that arrived together share it too; at least the prompt's last token is
prefilled, its logits being the first step's. A whole prompt is kept too, with those logits
(`keep(..., final=)`): the same prompt again (a retry, a seeded request repeated, the same
question) skips its prefill altogether and decodes exactly as the first time did, where the
batch around it is the same. Blocks of the prefill chunk (256 tokens, as before) kept that
exactness for every reuse, but left every prompt shorter than a chunk uncached: 8 clients asking
short questions waited 270 ms for their first token against vLLM's 146. A prompt that only
begins like a kept one decodes as a fresh prefill within float rounding (bfloat16 products
depend on how many rows they take), as it does in vLLM.

Sequences that begin with the same kept prefix also share it in attention
(`SequenceRunner.share`: the runner may read it once for all of them): a `_Root`, the whole
beginning that the kept prompts agree on, to the token (the serve bench's prompts agree on 284
tokens, the system prompt, tool block and the user turn's opening; shared in whole blocks of 128,
256 of them were read once and 28 again per row, a quarter of the 117 a row's own part read on
average at 32 clients, whose tool-call steps' forward took 58.2-58.9 ms against 56.6-57.3). A
beginning shorter than `SHARED_MIN` tokens is not shared.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pegmask.engine.runner import SequenceRunner

BLOCK = 16
# Shorter shared beginnings are not worth an attention call of their own: at 32 rows of
# SmolLM2 sharing one, 128 tokens read once made a step 6% faster than read per row, 64 tokens
# 2% slower (and four groups of 128, 12% slower).
SHARED_MIN = 128


@dataclass
class _Root:
    """A beginning that sequences share in attention: a saved cache and how many of its tokens.
    A root kept by one prompt alone is `settled` by the first other prompt that joins it, at
    their agreement: from then on every prompt that agrees that far shares it as it is (one
    attention group for all of them), and one that agrees less gets a root of its own (the
    same cache, fewer tokens) rather than shortening everyone's."""

    saved: Any
    length: int
    settled: bool = False
    size: int = 0  # the tokens `saved` holds (its memory), `length` or more


@dataclass
class _Entry:
    tokens: tuple[int, ...]
    saved: Any  # the runner's saved cache of exactly `tokens`
    used: int  # when last kept or reused (a step counter), for eviction
    final: Any  # a whole prompt's logits after its last token; None for whole blocks
    root: _Root | None  # the beginning of `tokens` shared in attention (None: too short)


class PrefixCache:
    """At most `capacity` prompt prefixes holding at most `max_tokens` tokens of keys and values
    together (None: no bound; a saved root counts until no entry shares it), least recently used
    evicted first; a prefix longer than `max_tokens` is not kept."""

    def __init__(self, runner: SequenceRunner, capacity: int, block: int = BLOCK,
                 max_tokens: int | None = None):
        if block < 1 or capacity < 0:
            raise ValueError("a prefix cache needs block >= 1 and capacity >= 0")
        self.runner = runner
        self.block = block
        self.capacity = capacity
        self.max_tokens = max_tokens
        self._entries: list[_Entry] = []
        self._clock = 0

    def __len__(self) -> int:
        return len(self._entries)

    def start(self, prompt: Sequence[int]) -> tuple[int, int, Any]:
        """A new runner sequence for `prompt`, how many of its tokens it already holds, and,
        where it holds them all (a prompt kept whole), the logits after its last token."""
        best: _Entry | None = None
        reused = 0
        whole = tuple(prompt)
        for entry in self._entries:
            if entry.final is not None and entry.tokens == whole:
                best, reused = entry, len(whole)
                break
            usable = self._usable(_shared(entry.tokens, prompt), len(prompt))
            if usable > reused:
                best, reused = entry, usable
        if best is None:
            return self.runner.add(), 0, None
        self._clock += 1
        best.used = self._clock
        seq = self.runner.restore(best.saved, reused)
        self._share(seq, best.root, reused)
        return seq, reused, best.final if reused == len(whole) else None

    def keep(self, seq: int, tokens: Sequence[int], final: Any = None) -> None:
        """`seq` holds `tokens` (a prompt or its beginning): save its whole blocks; or, with
        `final` (the logits after the last of them), the whole prompt."""
        length = len(tokens) if final is not None else len(tokens) // self.block * self.block
        too_long = self.max_tokens is not None and length > self.max_tokens
        if length == 0 or self.capacity == 0 or too_long:
            return
        tokens = tuple(tokens[:length])
        self._clock += 1
        for entry in self._entries:
            # held already, or inside a longer one (a whole prompt: held whole)
            held = entry.tokens == tokens and entry.final is not None if final is not None \
                else entry.tokens[:length] == tokens
            if held:
                entry.used = self._clock
                self._share(seq, entry.root, length)
                return
        saved = self.runner.save(seq, length)
        entry = _Entry(tokens, saved, self._clock, None if final is None else final.clone(),
                       self._root_for(tokens, saved))
        # A prefix that the new one extends goes: the new one serves every prompt it did.
        self._entries = [e for e in self._entries if tokens[:len(e.tokens)] != e.tokens]
        while len(self._entries) >= self.capacity:
            self._entries.remove(min(self._entries, key=lambda e: e.used))
        self._entries.append(entry)
        while self.max_tokens is not None and self.held_tokens() > self.max_tokens:
            others = [e for e in self._entries if e is not entry]
            if not others:  # its root's older cache alone is past the bound: not kept
                self._entries.remove(entry)
                return
            self._entries.remove(min(others, key=lambda e: e.used))
        self._share(seq, entry.root, length)

    def held_tokens(self) -> int:
        """The tokens of keys and values the kept prefixes and their roots hold, each saved
        cache once."""
        sizes = {id(e.saved): len(e.tokens) for e in self._entries}
        sizes.update({id(e.root.saved): e.root.size for e in self._entries
                      if e.root is not None})
        return sum(sizes.values())

    def _root_for(self, tokens: tuple[int, ...], saved: Any) -> _Root | None:
        """The root a new entry shares: that of the kept entry it agrees with longest, where it
        agrees for SHARED_MIN tokens. Joining a root held by one prompt settles it at their
        agreement; extending that prompt (kept block by block) grows it instead. Otherwise a
        root of its own whole tokens."""
        best, agree = None, 0
        for entry in self._entries:
            common = _shared(entry.tokens, tokens)
            if entry.root is not None and common > agree:
                best, agree = entry, common
        if best is None or agree < SHARED_MIN or (
                not best.root.settled and agree == len(best.tokens)):
            return (_Root(saved, len(tokens), size=len(tokens)) if len(tokens) >= SHARED_MIN
                    else None)
        root = best.root
        if not root.settled:
            root.length, root.settled = min(root.length, agree), True
            return root
        return root if agree >= root.length else _Root(root.saved, agree, settled=True,
                                                       size=root.size)

    def _share(self, seq: int, root: _Root | None, holds: int) -> None:
        """Tell the runner which root `seq` (holding `holds` tokens of it) begins with."""
        if root is None:
            return
        length = min(root.length, holds)
        if length >= SHARED_MIN:
            self.runner.share(seq, root.saved, length)

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
