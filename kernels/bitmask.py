"""Token bitmasks: allocation, numpy packing, and the device-independent torch apply path.

The layout is the one xgrammar, llguidance and outlines-core share, so masks can be checked
against theirs and handed to their kernels: int32 words, shape `(batch, ceil(V / 32))`, bit
`i % 32` of word `i // 32` set when token `i` is allowed. Words are int32 rather than uint32
because older torch versions have no uint32 arithmetic.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
import torch

BITMASK_DTYPE = torch.int32
"""dtype of every bitmask tensor."""


def bitmask_words(vocab_size: int) -> int:
    """Number of int32 words that hold one bit per token of a `vocab_size`-wide vocabulary."""
    return (vocab_size + 31) // 32


def allocate_token_bitmask(
    batch: int, vocab_size: int, *, device: torch.device | str | None = None
) -> torch.Tensor:
    """A `(batch, ceil(vocab_size / 32))` int32 bitmask with every bit set (everything allowed).

    Allocate it with the logits' width, which can exceed the tokenizer's size: padding ids then
    get real bits that the grammar clears instead of being left unmasked.
    """
    return torch.full((batch, bitmask_words(vocab_size)), -1, dtype=BITMASK_DTYPE, device=device)


def reset_token_bitmask(bitmask: torch.Tensor) -> None:
    """Set every bit again (everything allowed), e.g. for rows whose request is unconstrained."""
    bitmask.fill_(-1)


def pack_bool_mask(allowed: np.ndarray, vocab_size: int | None = None) -> np.ndarray:
    """Pack a boolean allowed-vector (last axis = token id) into int32 bitmask words.

    `vocab_size` sets the number of words (`ceil(vocab_size / 32)`); ids at or past
    `allowed.shape[-1]` are disallowed. Bits past `vocab_size` are always clear.
    """
    allowed = np.asarray(allowed, dtype=bool)
    width = allowed.shape[-1] if vocab_size is None else vocab_size
    if allowed.shape[-1] > width:
        raise ValueError(f"allowed has {allowed.shape[-1]} entries, more than vocab_size {width}")
    words = bitmask_words(width)
    packed = np.packbits(allowed, axis=-1, bitorder="little")
    if packed.shape[-1] != 4 * words:
        pad = [(0, 0)] * (packed.ndim - 1) + [(0, 4 * words - packed.shape[-1])]
        packed = np.pad(packed, pad)
    # Little-endian bytes so that byte k of a word holds bits 8k..8k+7 on any host.
    return np.ascontiguousarray(packed).view("<i4").astype(np.int32, copy=False)


def pack_token_ids(token_ids: np.ndarray, vocab_size: int) -> np.ndarray:
    """The int32 bitmask words of a `vocab_size`-wide vocabulary with exactly the distinct ids
    `token_ids` allowed: for fewer ids than words, `pack_bool_mask` without a whole boolean
    vector (cheaper: a mask computed cold touches less memory)."""
    ids = np.asarray(token_ids, dtype=np.int64)
    count = bitmask_words(vocab_size)
    if len(ids) > count:  # many ids: a boolean vector packs them faster
        if ids.min() < 0 or ids.max() >= vocab_size:
            raise ValueError(f"token ids must be in [0, {vocab_size})")
        allowed = np.zeros(vocab_size, dtype=bool)
        allowed[ids] = True
        return pack_bool_mask(allowed, vocab_size)
    # The distinct bits of one word add up exactly in float64 (the weights bincount takes);
    # a negative id is bincount's error, one past the vocabulary shows in the last words.
    words = np.bincount(ids >> 5, weights=np.ldexp(1.0, ids & 31), minlength=count)
    if len(words) > count or words[-1] >= 2.0 ** (vocab_size - 32 * (count - 1)):
        raise ValueError(f"token ids must be in [0, {vocab_size})")
    return words.astype(np.uint32).view(np.int32)


def unpack_bitmask(bitmask: np.ndarray, vocab_size: int) -> np.ndarray:
    """The boolean allowed-vector of each row of `bitmask` (int32 words), `vocab_size` wide."""
    words = np.ascontiguousarray(np.asarray(bitmask, dtype=np.int32).astype("<i4", copy=False))
    if words.shape[-1] * 32 < vocab_size:
        raise ValueError(f"{words.shape[-1]} words cannot hold {vocab_size} tokens")
    bits = np.unpackbits(words.view(np.uint8), axis=-1, count=vocab_size, bitorder="little")
    return bits.view(bool)


def _blocked_numpy(bitmask: torch.Tensor, vocab_size: int) -> np.ndarray:
    """Bool `(rows, vocab_size)`, True where the token is masked out (CPU tensors)."""
    words = bitmask[:, : bitmask_words(vocab_size)].contiguous().numpy()
    inverted = np.invert(words.astype("<i4", copy=False)).view(np.uint8)
    bits = np.unpackbits(inverted, axis=-1, count=vocab_size, bitorder="little")
    return bits.view(bool)


def _blocked_torch(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Bool `(rows, vocab_size)`, True where the token is masked out, on any torch device."""
    words = bitmask[:, : bitmask_words(vocab_size)]
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = (words.unsqueeze(-1) >> shifts) & 1
    return bits.reshape(words.shape[0], -1)[:, :vocab_size] == 0


_SAME_SIZE_INT = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def effective_vocab_size(
    logits: torch.Tensor, bitmask: torch.Tensor, vocab_size: int | None
) -> int:
    """The number of leading logits to mask, with xgrammar's rule: `vocab_size` if given (it must
    fit both tensors), else `min(logits width, 32 * words)`, warning when the mask is narrower."""
    covered = bitmask.shape[-1] * 32
    if vocab_size is None:
        if covered < logits.shape[-1]:
            warnings.warn(
                f"the bitmask covers {covered} tokens but the logits have {logits.shape[-1]}: "
                f"logits[..., {covered}:] stay unmasked; allocate the bitmask with the logits' "
                "width or pass vocab_size",
                stacklevel=3,
            )
        return min(logits.shape[-1], covered)
    if not 0 <= vocab_size <= min(logits.shape[-1], covered):
        raise ValueError(
            f"vocab_size {vocab_size} exceeds the logits ({logits.shape[-1]}) "
            f"or the bitmask ({covered} tokens)"
        )
    return vocab_size


def apply_token_bitmask_torch(
    logits: torch.Tensor,
    bitmask: torch.Tensor,
    vocab_size: int,
    rows: Sequence[int] | None,
) -> None:
    """Set masked-out logits to -inf in place (2-D logits and bitmask, checked by the caller).

    `rows` are the logits rows to mask, each with the bitmask row of the same index; other rows
    are left alone. Columns at or past `vocab_size` are never touched.
    """
    row_ids = list(range(logits.shape[0])) if rows is None else list(rows)
    if not row_ids or vocab_size == 0:
        return
    if logits.device.type == "cpu":
        _apply_cpu(logits, bitmask, vocab_size, row_ids)
        return
    index = torch.as_tensor(row_ids, dtype=torch.long, device=logits.device)
    blocked = _blocked_torch(bitmask[index.to(bitmask.device)], vocab_size)
    logits[index, :vocab_size] = logits[index, :vocab_size].masked_fill(blocked, float("-inf"))


# A row whose mask clears at most this share of its words is masked by index (free text: a
# few hundred special and malformed-byte tokens out of 49,152, 32 rows in 0.2 ms against 0.95);
# one that sets at most this share keeps its allowed tokens' logits and is filled with -inf
# around them (a tool call's JSON outside its strings allows a few dozen tokens: 80% of a tool
# call's masked rows; the steps of 32 tool-call rows in 0.87 ms against 1.15-1.24).
SPARSE_SHARE = 1 / 16


def _apply_cpu(
    logits: torch.Tensor, bitmask: torch.Tensor, vocab_size: int, rows: list[int]
) -> None:
    """Rows that block few tokens get -inf at those tokens only; rows that allow few get -inf
    around those tokens' logits; the others get a branch-free select through a numpy integer
    view of the logits (`_apply_dense`)."""
    words = bitmask[:, : bitmask_words(vocab_size)].numpy()[rows]
    limit = SPARSE_SHARE * words.shape[1]
    cleared = words != -1
    few_blocked = np.count_nonzero(cleared, axis=1) <= limit
    picked = np.flatnonzero(few_blocked).tolist()
    if picked:  # -inf at the tokens of the cleared bits: one indexed write for all rows
        blocked = _bit_tokens(np.invert(words[picked]), cleared[picked],
                              [rows[k] for k in picked], vocab_size)
        logits[blocked] = float("-inf")
    allowing = words != 0
    few_allowed = ~few_blocked & (np.count_nonzero(allowing, axis=1) <= limit)
    picked = np.flatnonzero(few_allowed).tolist()
    if picked:  # the allowed tokens' logits kept, the rows filled, those put back
        allowed = _bit_tokens(words[picked], allowing[picked], [rows[k] for k in picked],
                              vocab_size)
        kept = logits[allowed]
        logits[:, :vocab_size].index_fill_(
            0, torch.tensor([rows[k] for k in picked], dtype=torch.long), float("-inf"))
        logits[allowed] = kept
    dense = [rows[k] for k in np.flatnonzero(~(few_blocked | few_allowed)).tolist()]
    if dense:
        _apply_dense(logits, bitmask, vocab_size, dense)


def _bit_tokens(words: np.ndarray, picked: np.ndarray, rows: list[int],
                vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits row, token) of each set bit, below `vocab_size`, of the `picked` words (a boolean
    array shaped like `words`, whose k-th row is logits row `rows[k]`'s)."""
    entry, word = np.divmod(np.flatnonzero(picked), words.shape[1])
    chosen = words[entry, word].astype("<i4", copy=False)
    bits = np.unpackbits(chosen.view(np.uint8).reshape(-1, 4), axis=1, bitorder="little")
    which, bit = np.divmod(np.flatnonzero(bits), 32)
    tokens = word[which] * 32 + bit
    inside = tokens < vocab_size
    row_ids = np.asarray(rows, dtype=np.int64)[entry[which[inside]]]
    return torch.from_numpy(row_ids), torch.from_numpy(tokens[inside])


def _apply_dense(
    logits: torch.Tensor, bitmask: torch.Tensor, vocab_size: int, rows: list[int]
) -> None:
    """Write -inf's bit pattern through a numpy integer view of the logits with a branch-free
    select: constant time whatever the mask looks like, where masked_fill_ and boolean indexing
    slow down several-fold on scattered masks. Same-size ints also cover bfloat16."""
    as_int = _SAME_SIZE_INT[logits.element_size()]
    target = logits.detach()[:, :vocab_size].view(as_int).numpy()
    minus_inf = np.array(
        torch.tensor(float("-inf"), dtype=logits.dtype).view(as_int).item(), dtype=target.dtype
    )
    blocked = _blocked_numpy(bitmask[rows], vocab_size)
    for i, row in enumerate(rows):
        select = blocked[i].astype(target.dtype)
        np.negative(select, out=select)  # all ones where blocked, 0 elsewhere
        change = np.bitwise_xor(target[row], minus_inf)
        np.bitwise_and(change, select, out=change)
        np.bitwise_xor(target[row], change, out=target[row])
