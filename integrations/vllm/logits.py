"""pegmask's masks inside vLLM: one logits-processor class for both model runners.

    vllm serve MODEL --logits-processors pegmask.integrations.vllm.logits:PegmaskLogitsProcessor

A request asks for a grammar with `vllm_xargs={"pegmask": <constraint>}` (a JSON object or its
text, see `pegmask.integrations.constraints`; the pegmask tool parsers fill it in for requests
with tools). vLLM has no out-of-tree structured-output backend, so the mask is a logits
processor: the V1 runner's interface (`__init__(vllm_config, device, is_pin_memory)`,
`update_state`, `apply(logits)`) and the V2 runner's (`__init__(vllm_config, req_states)`,
`add_request`, `apply_staged_writes`, `apply(logits, ctx)`) on the same class, whichever the
engine loads. Tokens are read in `apply`, where they are real ids: with async scheduling the
output lists hold `-1` placeholders before that (and only a processor passed with
`--logits-processors` gets them patched in).

Without `vllm_xargs`: started with `PEGMASK_VLLM_STRUCTURED_OUTPUTS=1` in its environment, the
server hands pegmask what vLLM's own structured-output backend would have enforced: a
request's `response_format` (json_schema, json_object), `structured_outputs` json, json_object,
regex or choice, and the JSON schema a vLLM tool parser sets for `tool_choice` "required" or a
named function (`take_structured_outputs`, at admission). EBNF/Lark grammars and structural tags
stay with vLLM's backend. (With a pegmask tool parser, requests with tools get the dialect's
whole-turn grammar either way.)

Closing within the budget, as pegmask's server (`close_on_length`): a constrained request heads
for the end of its grammar as its `max_tokens` runs out, so an answer cut by the budget is still
complete (`fill_within_budget`). On by default; `vllm_xargs={"close_on_length": false}` turns it
off for a request.

A `dialect` constraint starts inside reasoning or not as the rendered prompt's tail says where
the runner hands the prompt (V1's `update_state`); V2's `add_request` does not, and there the
request's switches decide.

A request whose output leaves its grammar (a token from outside the mask, e.g. a placeholder)
or that has no allowed token left is ended: only EOS stays allowed, and the error is logged.
Speculative decoding is not supported (one logits row per request).
"""

from __future__ import annotations

import functools
import json
import logging
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality
from vllm.v1.sample.logits_processor import LogitsProcessor as V1LogitsProcessor
from vllm.v1.worker.gpu.sample.logits_processor import LogitsProcessor as V2LogitsProcessor

from pegmask.grammars.vocab import Vocabulary
from pegmask.integrations.constraints import (
    Constraints,
    OutputFollower,
    TokenRejected,
    fill_within_budget,
    grammar_for_spec,
)
from pegmask.integrations.vllm.parsers import XARGS_KEY
from pegmask.kernels import allocate_token_bitmask, apply_token_bitmask_inplace
from pegmask.kernels.bitmask import pack_token_ids

logger = logging.getLogger(__name__)
CLOSE_KEY = "close_on_length"  # the vllm_xargs field that turns closing off (false)
STRUCTURED_ENV = "PEGMASK_VLLM_STRUCTURED_OUTPUTS"  # "1": take vLLM's structured outputs over


def request_spec(sampling_params: Any) -> Any:
    """The pegmask constraint a request carries in `extra_args` (`vllm_xargs`), or None."""
    extra = getattr(sampling_params, "extra_args", None) or {}
    return extra.get(XARGS_KEY)


def take_structured_outputs(sampling_params: Any) -> None:
    """Where `STRUCTURED_ENV` is "1" and a request carries no pegmask constraint, move its vLLM
    structured output (json schema, json_object, regex, choice) into `extra_args` as a pegmask
    constraint and take it from vLLM's backend, so unchanged OpenAI clients get pegmask's grammar
    (and its closing within `max_tokens`). Runs in `validate_params`: the one hook that sees
    every request's final `SamplingParams` in the frontend, after vLLM's serving layer and tool
    parsers filled in `structured_outputs` and before the engine reads them."""
    if os.environ.get(STRUCTURED_ENV, "") != "1" or request_spec(sampling_params) is not None:
        return
    wanted = getattr(sampling_params, "structured_outputs", None)
    if wanted is None:
        return
    if wanted.json is not None:
        spec: dict[str, Any] = {"json_schema": wanted.json}
    elif wanted.json_object:
        spec = {"json_object": True}
    elif wanted.regex is not None:
        spec = {"regex": wanted.regex}
    elif wanted.choice is not None:
        spec = {"choice": list(wanted.choice)}
    else:
        return  # an EBNF/Lark grammar or a structural tag: vLLM's backend keeps it
    extra = dict(sampling_params.extra_args or {})
    extra[XARGS_KEY] = json.dumps(spec, ensure_ascii=False)
    sampling_params.extra_args = extra
    sampling_params.structured_outputs = None


def request_budget(sampling_params: Any) -> int | None:
    """The output tokens a request may write, for closing within them; None where it does not
    close (`vllm_xargs` "close_on_length" false, or no `max_tokens`)."""
    extra = getattr(sampling_params, "extra_args", None) or {}
    value = extra.get(CLOSE_KEY, True)
    if isinstance(value, str) and value.lower() in ("true", "false", "1", "0"):
        value = value.lower() in ("true", "1")
    if value not in (True, False):  # (1 and 0 are equal to True and False)
        raise ValueError(f"vllm_xargs {CLOSE_KEY} must be true or false, got {value!r}")
    return sampling_params.max_tokens if value else None


@functools.cache
def model_constraints(tokenizer_path: str, revision: str | None, trust_remote_code: bool,
                      width: int, extra_eos: tuple[int, ...]) -> Constraints:
    """The compiled-grammar cache of a served model (one per process)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path, revision=revision,
                                              trust_remote_code=trust_remote_code)
    return Constraints(Vocabulary.from_hf(tokenizer, width, extra_eos=extra_eos))


def _constraints(vllm_config: Any, width: int) -> Constraints:
    model = vllm_config.model_config
    eos = model.try_get_generation_config().get("eos_token_id")
    extra = (eos,) if isinstance(eos, int) else tuple(eos or ())
    return model_constraints(str(model.tokenizer), model.tokenizer_revision,
                             bool(model.trust_remote_code), width, extra)


@dataclass
class _Row:
    """One constrained request: its matcher and, on V1, its live output token list."""

    follower: OutputFollower
    request: str  # for logs
    budget: int | None  # max_tokens where the request closes within it
    output_ids: list[int] = field(default_factory=list)
    ended: bool = False  # forced to EOS after an error


class PegmaskLogitsProcessor(V1LogitsProcessor, V2LogitsProcessor):
    """Applies each request's pegmask grammar to its logits row (see the module docstring)."""

    @classmethod
    def validate_params(cls, sampling_params: Any) -> None:
        """Reject a malformed constraint at admission (HTTP 400 naming the problem); take over
        vLLM's structured outputs where the server says so (`take_structured_outputs`)."""
        take_structured_outputs(sampling_params)
        spec = request_spec(sampling_params)
        if spec is not None:
            grammar_for_spec(spec)  # raises InvalidRequestError, a ValueError
            request_budget(sampling_params)

    def __init__(self, vllm_config: Any, *args: Any):
        if vllm_config.speculative_config is not None:
            raise ValueError("pegmask's logits processor does not support speculative decoding")
        if len(args) == 1:  # V2: (req_states)
            self._states = args[0]
            self.device = self._states.device
            width, rows = self._states.vocab_size, self._states.max_num_reqs
        else:  # V1: (device, is_pin_memory)
            self._states = None
            self.device = args[0]
            width = vllm_config.model_config.get_vocab_size()
            rows = vllm_config.scheduler_config.max_num_seqs
        self.constraints = _constraints(vllm_config, width)
        self.rows: dict[int, _Row] = {}  # V1: batch index; V2: request slot
        self._bitmask = allocate_token_bitmask(rows, width)
        # The mask of a request that has to end: its EOS ids only.
        self._eos_only = torch.from_numpy(pack_token_ids(
            np.array(self.constraints.vocab.eos_ids, dtype=np.int64), width))

    # ----------------------------------------------------------------- shared
    def is_argmax_invariant(self) -> bool:
        return False  # a mask changes the greedy choice

    def _new_row(self, sampling_params: Any, name: str,
                 prompt_ids: list[int] | None = None) -> _Row | None:
        """The row of a request with a constraint; `prompt_ids`, where the runner hands them,
        let a dialect constraint read its reasoning start from the prompt."""
        spec = request_spec(sampling_params)
        if spec is None:
            return None
        return _Row(OutputFollower(self.constraints.matcher(spec, prompt_ids)), name,
                    request_budget(sampling_params))

    def _masked(self, logits: torch.Tensor, rows: list[int]) -> torch.Tensor:
        if rows:
            mask = self._bitmask[: logits.shape[0]]
            if logits.device.type != "cpu":
                mask = mask.to(logits.device, non_blocking=True)
            apply_token_bitmask_inplace(logits, mask, indices=rows)
        return logits

    def _fill(self, row: _Row, index: int, tokens: list[int], start: int) -> bool:
        """Bring the row's matcher to its tokens and write its mask at `index`; False when
        the request has ended (nothing to mask)."""
        if not row.ended:
            try:
                if any(token < 0 for token in tokens):
                    raise ValueError("its output ids hold async-scheduling placeholders (-1): "
                                     "pass the processor with --logits-processors")
                follower = row.follower
                follower.follow(tokens, start)
                if follower.stopped:
                    return False
                remaining = None if row.budget is None else row.budget - len(follower.read)
                fill_within_budget(follower.matcher, self._bitmask, index, remaining)
                if bool(self._bitmask[index].any()):
                    return True
                raise ValueError("no token is allowed")
            except (TokenRejected, ValueError) as exc:
                logger.error("pegmask: request %s left its grammar (%s); ending it",
                             row.request, exc)
                row.ended = True
        self._bitmask[index] = self._eos_only
        return True

    @staticmethod
    def _start(row: _Row) -> int:
        """Where to read a row's tokens from: the last token read (checked again), or 0."""
        return max(0, len(row.follower.read) - 1)

    # ----------------------------------------------------------------- V1 runner
    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        for index in batch_update.removed:
            self.rows.pop(index, None)
        for index, params, prompt_ids, output_ids in batch_update.added:
            row = self._new_row(params, f"at batch index {index}", prompt_ids)
            if row is None:
                self.rows.pop(index, None)
            else:
                row.output_ids = output_ids  # vLLM's live list: read in apply()
                self.rows[index] = row
        for a, b, direction in batch_update.moved:
            row_a, row_b = self.rows.pop(a, None), self.rows.pop(b, None)
            if row_a is not None:
                self.rows[b] = row_a
            if direction == MoveDirectionality.SWAP and row_b is not None:
                self.rows[a] = row_b

    def apply(self, logits: torch.Tensor, ctx: Any = None) -> torch.Tensor:
        if ctx is not None:
            return self._apply_v2(logits, ctx)
        masked = []
        for index, row in self.rows.items():
            if index >= logits.shape[0]:
                continue
            start = self._start(row)
            if self._fill(row, index, list(row.output_ids[start:]), start):
                masked.append(index)
        return self._masked(logits, masked)

    # ----------------------------------------------------------------- V2 runner
    def add_request(self, req_idx: int, sampling_params: Any) -> bool:
        """V2 hands no prompt here: a dialect constraint reads the request's switches (its
        `chat_template_kwargs`, `reasoning`), not the rendered prompt."""
        row = self._new_row(sampling_params, f"in slot {req_idx}")
        if row is None:
            self.rows.pop(req_idx, None)
            return False
        self.rows[req_idx] = row
        return True

    def apply_staged_writes(self) -> None:
        """Nothing staged: matchers live on the host."""

    def _apply_v2(self, logits: torch.Tensor, ctx: Any) -> torch.Tensor:
        slots = ctx.idx_mapping_np
        if logits.shape[0] != len(slots):
            raise ValueError("pegmask's logits processor needs one logits row per request")
        wanted = [(i, int(slot)) for i, slot in enumerate(slots) if int(slot) in self.rows]
        if not wanted:
            return logits
        states = self._states
        positions = ctx.pos.tolist()
        inputs = ctx.input_ids.tolist()
        masked = []
        for i, slot in wanted:
            row = self.rows[slot]
            prompt = int(states.prompt_len.np[slot])
            start, position = self._start(row), positions[i]
            # Output tokens sit at positions prompt..position; the newest (being fed now) is
            # in input_ids, the ones before it in all_token_ids.
            tokens = []
            if position >= prompt:
                committed = states.all_token_ids.gpu[slot, prompt + start: position]
                tokens = [*committed.tolist(), inputs[i]]
            if self._fill(row, i, tokens, start):
                masked.append(i)
        return self._masked(logits, masked)


def xargs(spec: dict[str, Any]) -> dict[str, str]:
    """`vllm_xargs` asking for `spec` (what an OpenAI client sends in `extra_body`)."""
    return {XARGS_KEY: json.dumps(spec, ensure_ascii=False)}
