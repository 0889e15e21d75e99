"""pegmask's masks in plain transformers: a `LogitsProcessor` for `model.generate`.

    from pegmask.integrations.transformers import PegmaskLogitsProcessor, model_vocabulary
    vocab = model_vocabulary(model, tokenizer)    # as wide as the logits, with the model's EOS
    processor = PegmaskLogitsProcessor(vocab, [{"json_schema": schema}, None], max_new_tokens=64)
    model.generate(**batch, logits_processor=[processor], max_new_tokens=64)

One matcher per row of the batch, each with its own constraint (a spec of
`pegmask.integrations.constraints`, a `Grammar`, a `CompiledGrammar`) or none. A `dialect`
spec reads the row's rendered prompt (the `input_ids` of the first call): a chat template that
opens `<think>` itself, or closes an empty block, sets whether the output starts in reasoning. Rows follow
`input_ids`: a processor reads each row's generated tokens from it at every call, so greedy
search, sampling, `num_return_sequences` (n rows per constraint) and beam search (rows reordered
between steps: a row's matcher rolls back to what the rows share) all work. A row stops being
constrained once its matcher has accepted a stop token (the grammar's end, then EOS); generate
pads it from then on. A token the mask did not allow (an earlier processor chose it) raises a
`ValueError` rather than letting the row leave its grammar. One processor serves one `generate`
call; compiled grammars outlive it in the `Constraints` it was given.

Closing within the budget: given generate's `max_new_tokens`, a constrained row heads for the
end of its grammar as the budget runs out (`close_on_length`, on by default, as in pegmask's
server), so an answer cut by the budget is still complete (`fill_within_budget`). A processor
does not see generate's arguments, hence the same number passed to both; without it the rows
are masked only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers import LogitsProcessor

from pegmask.grammars.vocab import Vocabulary
from pegmask.integrations.constraints import (
    Constraint,
    Constraints,
    OutputFollower,
    TokenRejected,
    fill_within_budget,
)
from pegmask.kernels import allocate_token_bitmask, apply_token_bitmask_inplace


def model_vocabulary(model: Any, tokenizer: Any) -> Vocabulary:
    """The grammar vocabulary of a transformers model: as wide as its logits (which may be
    wider than the tokenizer), ending on the tokenizer's and the generation config's EOS ids."""
    width = int(model.get_output_embeddings().weight.shape[0])
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    extra = [eos] if isinstance(eos, int) else list(eos or [])
    return Vocabulary.from_hf(tokenizer, width, extra_eos=extra)


class PegmaskLogitsProcessor(LogitsProcessor):
    """Masks each row's logits to the tokens its grammar allows (see the module docstring).

    `constraints`: one constraint for every row, or a list with one per input row (None leaves
    a row free). With `num_return_sequences` or beams, generate runs n rows per input row, next
    to each other; they share that row's constraint.

    `max_new_tokens`: generate's, for closing within it (None: no closing); `close_on_length`
    False masks only, and a row cut by the budget may be incomplete.
    """

    def __init__(self, vocab: Vocabulary | Constraints,
                 constraints: Constraint | Sequence[Constraint | None] | None,
                 max_new_tokens: int | None = None, close_on_length: bool = True):
        if max_new_tokens is not None and max_new_tokens < 1:
            raise ValueError("max_new_tokens must be at least 1")
        self.budget = max_new_tokens if close_on_length else None
        self.constraints = vocab if isinstance(vocab, Constraints) else Constraints(vocab)
        self.vocab = self.constraints.vocab
        if isinstance(constraints, (list, tuple)):
            if not constraints:
                raise ValueError("constraints is an empty list")
            self._per_input: list[Constraint | None] | None = list(constraints)
            self._shared: Constraint | None = None
        else:
            self._per_input, self._shared = None, constraints
        for constraint in self._per_input or [self._shared]:
            if constraint is not None:
                self.constraints.compiled(constraint)  # a bad one raises here, not in generate
        self.rows: list[OutputFollower | None] = []  # one per row of the batch
        self._prompt: torch.Tensor | None = None
        self._bitmask: torch.Tensor | None = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        if self._prompt is None:
            self._start(input_ids, scores)
        else:
            self._check_same_generation(input_ids)
        generated = input_ids[:, self._prompt.shape[1]:].tolist()
        bitmask = self._bitmask
        rows = []
        for row, follower in enumerate(self.rows):
            if follower is None:
                continue
            try:
                follower.follow(generated[row])
            except TokenRejected as exc:
                raise ValueError(f"row {row}: {exc}; a processor after the mask or a forced "
                                 "token chose it") from exc
            if follower.stopped:
                continue  # the row ended; generate pads it
            remaining = None if self.budget is None else self.budget - len(generated[row])
            fill_within_budget(follower.matcher, bitmask, row, remaining)
            rows.append(row)
        if rows:
            mask = bitmask if scores.device.type == "cpu" else bitmask.to(scores.device)
            apply_token_bitmask_inplace(scores, mask, indices=rows)
            self._check_not_empty(scores, rows)
        return scores

    # ----------------------------------------------------------------- internals
    def _start(self, input_ids: torch.Tensor, scores: torch.Tensor) -> None:
        """First call of a generation: one matcher per row, after that row's prompt (a
        dialect constraint starts in reasoning as the prompt's tail says)."""
        batch, width = input_ids.shape[0], scores.shape[-1]
        if width != self.vocab.size:
            raise ValueError(
                f"the logits have {width} columns but the vocabulary {self.vocab.size} ids: "
                "build it with model_vocabulary(model, tokenizer)")
        if self._per_input is None:
            per_row = [self._shared] * batch
        else:
            inputs = len(self._per_input)
            if batch % inputs:
                raise ValueError(f"{inputs} constraints for a batch of {batch} rows: give one "
                                 "per input row")
            per_row = [self._per_input[row // (batch // inputs)] for row in range(batch)]
        prompts = input_ids.tolist()
        self.rows = [None if c is None else OutputFollower(self.constraints.matcher(c, prompt))
                     for c, prompt in zip(per_row, prompts, strict=True)]
        self._prompt = input_ids.detach().clone()
        self._bitmask = allocate_token_bitmask(batch, width)

    def _check_same_generation(self, input_ids: torch.Tensor) -> None:
        prompt = self._prompt
        if (input_ids.shape[0] != prompt.shape[0] or input_ids.shape[1] < prompt.shape[1]
                or not torch.equal(input_ids[:, :prompt.shape[1]], prompt)):
            raise ValueError("a PegmaskLogitsProcessor serves one generate call: make a new one "
                             "(pass it the same Constraints to reuse compiled grammars)")

    def _check_not_empty(self, scores: torch.Tensor, rows: list[int]) -> None:
        """A row left with no finite logit would make sampling fail with NaNs, far from the
        cause: name it."""
        index = torch.tensor(rows, device=scores.device)
        dead = torch.isneginf(scores[index]).all(dim=-1)
        if bool(dead.any()):
            row = rows[int(dead.nonzero()[0, 0])]
            raise ValueError(
                f"row {row}: no token is allowed: the grammar's next tokens were all excluded "
                "before the mask (e.g. min_new_tokens suppressing EOS), or the grammar is "
                "complete and the vocabulary has no EOS id to end it")
