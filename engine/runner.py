"""Sequence runners: the model's batched forward over many independent sequences.

The scheduler never sees a KV cache. It opens a sequence per request (`add`), appends tokens to
any set of sequences in one call (`forward`: a prompt chunk for one, a sampled token for each of
the others), gets the logits after each chunk's last token, copies a sequence to share a prompt's
prefill (`fork`, for `n > 1`), and drops sequences that end (`remove`). Sequences join and leave
between any two calls: that is what continuous batching needs from a model.

Two implementations: `LlamaRunner` (engine/llama_runner.py), a lean forward for llama-family
decoders whose KV cache is one tensor with a slot per sequence, and `TransformersRunner` below,
for any other causal LM transformers loads: each sequence keeps its own transformers cache and
is run on its own (correct for every architecture, not batched).
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Sequence
from typing import Any, Protocol

import torch

Chunk = tuple[int, Sequence[int]]  # (sequence id, token ids to append)


def attention_heads(config: Any) -> tuple[int, int, int]:
    """(query heads, key/value heads, head dimension) of a transformers text config, with the
    fallbacks of configs that leave the last two out (as many key/value heads as query heads;
    the hidden size split among the heads)."""
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return heads, kv_heads, head_dim


class SequenceRunner(Protocol):
    """What the scheduler needs from a model (see the module docstring)."""

    device: torch.device
    logits_width: int
    token_bytes: int  # the keys and values of one token of a sequence (every layer)

    def add(self) -> int:
        """Open an empty sequence; returns its id."""
        ...

    def fork(self, seq: int) -> int:
        """A new sequence holding a copy of `seq`'s tokens."""
        ...

    def remove(self, seq: int) -> None:
        """Drop a sequence and free its cache."""
        ...

    def save(self, seq: int, length: int) -> Any:
        """A copy of the cache of `seq`'s first `length` tokens, kept outside the runner."""
        ...

    def restore(self, saved: Any, length: int | None = None) -> int:
        """A new sequence holding the first `length` tokens of a `save`d cache (all of them:
        None)."""
        ...

    def share(self, seq: int, saved: Any, length: int) -> None:
        """`seq` begins with the first `length` tokens of `saved`, as other sequences may: the
        runner may read them once for all of them (or ignore this)."""
        ...

    def expect(self, seq: int, length: int) -> None:
        """`seq` will soon hold `length` tokens (its whole prompt, fed in chunks): the runner
        may make room for them now (or ignore this)."""
        ...

    def length(self, seq: int) -> int:
        """Tokens in the sequence so far."""
        ...

    def forward(self, chunks: Sequence[Chunk], scored: Sequence[int] | None = None,
                ) -> torch.Tensor:
        """Append each chunk's tokens to its sequence (at most one chunk per sequence, none
        empty); float32 logits `(sum(scored), logits_width)` after each of the last
        `scored[i]` tokens of chunk i, chunk by chunk (None: after each chunk's last token), a
        new tensor the caller may edit."""
        ...

    def truncate(self, seq: int, length: int) -> None:
        """Keep only the first `length` tokens of `seq` (a draft's tokens the samples did not
        keep: engine/speculation.py)."""
        ...


class TransformersRunner:
    """Any transformers causal LM, one forward per sequence (see the module docstring)."""

    def __init__(self, model: Any, device: torch.device):
        self.model = model
        self.device = device
        self.logits_width = int(model.get_output_embeddings().weight.shape[0])
        config = model.config.get_text_config()
        _, kv_heads, head_dim = attention_heads(config)
        self.token_bytes = (config.num_hidden_layers * 2 * kv_heads * head_dim
                            * model.dtype.itemsize)
        self._caches: dict[int, Any] = {}
        self._lengths: dict[int, int] = {}
        self._next = 0
        # transformers 5 renamed `past_key_values` to `cache`; accept either.
        params = inspect.signature(model.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"

    def add(self) -> int:
        from transformers import DynamicCache

        seq, self._next = self._next, self._next + 1
        self._caches[seq] = DynamicCache()
        self._lengths[seq] = 0
        return seq

    def fork(self, seq: int) -> int:
        new = self.add()
        self._caches[new] = copy.deepcopy(self._caches[seq])
        self._lengths[new] = self._lengths[seq]
        return new

    def remove(self, seq: int) -> None:
        self._caches.pop(seq, None)
        self._lengths.pop(seq, None)

    def save(self, seq: int, length: int) -> Any:
        return _first_tokens(self._caches[seq], length)

    def restore(self, saved: Any, length: int | None = None) -> int:
        seq = self.add()
        cache = _first_tokens(saved, length)
        self._caches[seq] = cache
        self._lengths[seq] = cache.get_seq_length()
        return seq

    def share(self, seq: int, saved: Any, length: int) -> None:
        """Nothing: each sequence runs on its own."""

    def expect(self, seq: int, length: int) -> None:
        """Nothing: each sequence's cache grows as it is fed."""

    def length(self, seq: int) -> int:
        return self._lengths[seq]

    def truncate(self, seq: int, length: int) -> None:
        held = self._lengths[seq]
        if not 0 <= length <= held:
            raise ValueError(f"cannot truncate a sequence of {held} tokens to {length}")
        if length < held:
            self._caches[seq].crop(length - held)  # negative: tokens to drop (any version)
        self._lengths[seq] = length

    @torch.inference_mode()
    def forward(self, chunks: Sequence[Chunk], scored: Sequence[int] | None = None,
                ) -> torch.Tensor:
        rows = []
        for index, (seq, tokens) in enumerate(chunks):
            start = self._lengths[seq]
            keep = 1 if scored is None else scored[index]
            ids = torch.tensor([list(tokens)], dtype=torch.long, device=self.device)
            positions = torch.arange(start, start + len(tokens), device=self.device)[None]
            out = self.model(input_ids=ids, position_ids=positions, use_cache=True,
                             logits_to_keep=keep, **{self._cache_arg: self._caches[seq]})
            self._lengths[seq] = start + len(tokens)
            rows.append(out.logits[0, -keep:].float())
        return torch.cat(rows)


def _first_tokens(cache: Any, length: int | None) -> Any:
    """A copy of a transformers cache holding its first `length` tokens (all of them: None)."""
    copied = copy.deepcopy(cache)
    held = copied.get_seq_length()
    if length is not None and length < held:
        copied.crop(length - held)  # negative: tokens to drop (any version)
    return copied
