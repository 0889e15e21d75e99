"""The triton kernel that applies a token bitmask to logits in place (CUDA tensors).

Importing this module imports triton, so `pegmask.kernels` imports it only when a CUDA tensor
arrives. With `TRITON_INTERPRET=1` set before the import, the same kernel runs on CPU tensors,
which is how the tests check it on machines without a GPU.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

BLOCK_SIZE = 4096
"""Tokens handled by one program: 128 words, enough work per program to hide the launch."""


@triton.jit
def _apply_bitmask_kernel(
    logits_ptr,
    bitmask_ptr,
    rows_ptr,
    vocab_size,
    logits_stride,
    bitmask_stride,
    BLOCK: tl.constexpr,
):
    """Grid (rows, blocks): program (r, b) masks tokens [b*BLOCK, (b+1)*BLOCK) of row r (or of
    row rows_ptr[r] when rows are given)."""
    if rows_ptr is None:
        row = tl.program_id(0).to(tl.int64)
    else:
        row = tl.load(rows_ptr + tl.program_id(0)).to(tl.int64)
    block = tl.program_id(1)
    words = block * (BLOCK // 32) + tl.arange(0, BLOCK // 32)
    # Words past the vocabulary read as "all allowed" so nothing is stored for them.
    packed = tl.load(
        bitmask_ptr + row * bitmask_stride + words, mask=words * 32 < vocab_size, other=-1
    )
    blocked = ((packed[:, None] >> tl.arange(0, 32)[None, :]) & 1) == 0
    blocked = tl.reshape(blocked, (BLOCK,))
    tokens = block * BLOCK + tl.arange(0, BLOCK)
    tl.store(
        logits_ptr + row * logits_stride + tokens,
        float("-inf"),
        mask=blocked & (tokens < vocab_size),
    )


def apply_token_bitmask_triton(
    logits: torch.Tensor,
    bitmask: torch.Tensor,
    vocab_size: int,
    rows: Sequence[int] | None,
) -> None:
    """Set masked-out logits to -inf in place; same contract as `apply_token_bitmask_torch`.

    The token axis of both tensors must be contiguous (stride 1); rows may be strided.
    """
    if logits.stride(-1) != 1 or bitmask.stride(-1) != 1:
        raise ValueError("the triton kernel needs a contiguous last axis in logits and bitmask")
    if rows is None:
        num_rows = logits.shape[0]
        rows_tensor = None
    else:
        rows_tensor = torch.as_tensor(rows, dtype=torch.int32).to(logits.device, non_blocking=True)
        num_rows = rows_tensor.numel()
    if num_rows == 0 or vocab_size == 0:
        return
    grid = (num_rows, triton.cdiv(vocab_size, BLOCK_SIZE))
    _apply_bitmask_kernel[grid](
        logits,
        bitmask,
        rows_tensor,
        vocab_size,
        logits.stride(0),
        bitmask.stride(0),
        BLOCK=BLOCK_SIZE,
    )
