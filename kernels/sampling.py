"""Sampling from masked logits: greedy at temperature 0, else temperature, top-k, top-p and min-p.

Masked-out tokens hold -inf, so softmax gives them probability 0 and no filter here can bring
them back; a row with no allowed token is an error rather than a silent pick of token 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch


def sample_masked(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    generator: torch.Generator | Sequence[torch.Generator | None] | None = None,
    min_p: float = 0.0,
) -> torch.Tensor:
    """One token id per row of `logits` (`(batch, V)` -> `(batch,)`, `(V,)` -> scalar tensor).

    `temperature <= 0` is greedy (argmax). `top_k > 0` keeps the k best tokens; `top_p < 1`
    keeps the smallest set of best tokens whose probability reaches `top_p`; `min_p > 0` drops
    tokens less likely than `min_p` times the best one. `generator` makes the draw reproducible:
    one for all rows, or one per row of a `(batch, V)` draw (None: torch's default generator),
    so that rows of seeded requests drawn together draw what each would draw alone.
    """
    if not 0.0 <= min_p <= 1.0:
        raise ValueError(f"min_p must be in [0, 1], got {min_p}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0, got {top_k}")
    if not bool((logits.amax(dim=-1) > float("-inf")).all()):
        raise ValueError("a row of logits has no allowed token (all -inf)")
    if temperature <= 0.0:
        return logits.argmax(dim=-1)
    scores = logits.float() / temperature
    if 0 < top_k < scores.shape[-1]:
        kth_best = torch.topk(scores, top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth_best, float("-inf"))
    if top_p < 1.0:
        ordered, order = torch.sort(scores, dim=-1, descending=True)
        probs = ordered.softmax(dim=-1)
        # Drop a token once the better ones already reach top_p (the best one always stays).
        before = probs.cumsum(dim=-1) - probs
        ordered = ordered.masked_fill(before >= top_p, float("-inf"))
        scores = torch.empty_like(scores).scatter_(-1, order, ordered)
    if min_p > 0.0:
        # p_i >= min_p * p_max  <=>  score_i >= score_max + log(min_p)
        floor = scores.amax(dim=-1, keepdim=True) + math.log(min_p)
        scores = scores.masked_fill(scores < floor, float("-inf"))
    # Inverse-CDF draw: a cumulative sum and a binary search, some 30x cheaper than
    # torch.multinomial over a whole vocabulary on a CPU. A token of probability 0 spans an
    # empty interval of the CDF, so it is never drawn.
    cdf = scores.softmax(dim=-1).cumsum(dim=-1)
    total = cdf[..., -1:]
    if generator is None or isinstance(generator, torch.Generator):
        uniform = torch.rand(total.shape, generator=generator, dtype=cdf.dtype, device=cdf.device)
    else:
        if len(generator) != total.shape[0] or total.dim() != 2:
            raise ValueError("one generator per row of a (batch, V) draw")
        uniform = torch.cat([torch.rand(1, generator=g, dtype=cdf.dtype, device=cdf.device)
                             for g in generator])[:, None]
    point = uniform * total
    point = torch.minimum(point, torch.nextafter(total, torch.zeros_like(total)))  # < total
    return torch.searchsorted(cdf, point, right=True).squeeze(-1)
