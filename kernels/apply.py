"""Applying a token bitmask to logits: the triton kernel on CUDA tensors, torch elsewhere.

triton is imported only when a CUDA tensor arrives, so CPU-only installs work.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Sequence

import torch

from pegmask.kernels.bitmask import (
    BITMASK_DTYPE,
    apply_token_bitmask_torch,
    effective_vocab_size,
)


def apply_token_bitmask_inplace(
    logits: torch.Tensor,
    bitmask: torch.Tensor,
    indices: Sequence[int] | torch.Tensor | None = None,
    vocab_size: int | None = None,
) -> None:
    """Set the logits of masked-out tokens to -inf, in place, with xgrammar's semantics.

    `logits` is `(batch, width)` or `(width,)`; `bitmask` is int32 `(rows, words)` or `(words,)`
    on the same device. Only the first `vocab_size` columns are touched: by default
    `min(width, 32 * words)`, with a warning when the mask is the narrower one, since trailing
    logits then stay unmasked. `indices` selects the rows to mask (logits row i with bitmask
    row i), so constrained and free requests can share a batch; the batch sizes then may differ.
    """
    if logits.device != bitmask.device:
        raise ValueError(f"logits on {logits.device} but bitmask on {bitmask.device}")
    if bitmask.dtype != BITMASK_DTYPE:
        raise ValueError(f"bitmask must be int32, got {bitmask.dtype}")
    if not logits.is_floating_point():
        raise ValueError(f"logits must be floating point, got {logits.dtype}")
    if logits.dim() not in (1, 2) or bitmask.dim() not in (1, 2):
        raise ValueError("logits and bitmask must be 1-D or 2-D")
    logits_2d = logits.unsqueeze(0) if logits.dim() == 1 else logits
    bitmask_2d = bitmask.unsqueeze(0) if bitmask.dim() == 1 else bitmask
    size = effective_vocab_size(logits_2d, bitmask_2d, vocab_size)
    rows = None if indices is None else [int(i) for i in indices]
    if rows is None:
        if bitmask_2d.shape[0] < logits_2d.shape[0]:
            raise ValueError(
                f"{logits_2d.shape[0]} logits rows but only {bitmask_2d.shape[0]} bitmask rows"
            )
    elif rows and not 0 <= min(rows) <= max(rows) < min(logits_2d.shape[0], bitmask_2d.shape[0]):
        raise ValueError(f"indices {rows} out of range for the logits or the bitmask")
    if logits_2d.is_cuda and _triton_available():
        from pegmask.kernels.triton_apply import apply_token_bitmask_triton

        apply_token_bitmask_triton(logits_2d, bitmask_2d, size, rows)
    else:
        apply_token_bitmask_torch(logits_2d, bitmask_2d, size, rows)


@functools.cache
def _triton_available() -> bool:
    """Whether triton can be imported (it ships with torch's CUDA wheels on Linux only)."""
    return importlib.util.find_spec("triton") is not None
