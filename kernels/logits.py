"""Per-request logits processing before sampling: logit bias and the repetition penalties.

Each function edits one row of logits in place. Masked-out tokens hold -inf and stay there: a
bias or penalty is finite, and the repetition penalty scales by a positive factor.

* `logit_bias` (OpenAI): a value added to the logit of each listed token.
* `frequency_penalty` / `presence_penalty` (OpenAI): subtract `frequency * count + presence`
  for every token the output already holds `count > 0` times.
* `repetition_penalty` (transformers, vLLM): divide positive logits, multiply negative ones, of
  every token seen in the prompt or the output.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def apply_logit_bias(logits: torch.Tensor, token_ids: torch.Tensor, bias: torch.Tensor) -> None:
    """`logits[token_ids] += bias` for one row."""
    logits.index_add_(0, token_ids, bias.to(logits.dtype))


def apply_penalties(
    logits: torch.Tensor,
    output_ids: Sequence[int],
    prompt_ids: Sequence[int] = (),
    *,
    frequency: float = 0.0,
    presence: float = 0.0,
    repetition: float = 1.0,
) -> None:
    """The three repetition penalties (see the module docstring) on one row of logits."""
    if (frequency or presence) and output_ids:
        ids, counts = torch.tensor(list(output_ids), dtype=torch.long).unique(return_counts=True)
        ids = ids.to(logits.device)
        penalty = frequency * counts.to(logits.device, logits.dtype) + presence
        logits.index_add_(0, ids, -penalty)
    if repetition != 1.0:
        seen = torch.tensor(list(prompt_ids) + list(output_ids), dtype=torch.long).unique()
        if seen.numel():
            seen = seen.to(logits.device)
            values = logits[seen]
            logits[seen] = torch.where(values > 0, values / repetition, values * repetition)
