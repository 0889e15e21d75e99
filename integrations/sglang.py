"""pegmask as an SGLang grammar backend: `--grammar-backend pegmask` (`pip install
pegmask[sglang]`; the `sglang.srt.plugins` entry point registers it in every SGLang process).

SGLang asks its backend for one grammar object per request (json, regex, ebnf or structural
tag) and drives it between steps: `accept_token`, `rollback`, `fill_vocab_mask` into an int32
bitmask (pegmask's layout is the one SGLang's xgrammar and llguidance backends use),
`apply_vocab_mask`, `is_terminated`, and `copy` for a cached grammar. Keys map to pegmask's
constraints (`pegmask.integrations.constraints`):

* `json` -> a JSON schema (`$$ANY$$`: any JSON value); `regex` -> a regex;
* `ebnf` -> pegmask's PEG DSL, or, when the text is a JSON object, a pegmask constraint
  (`{"dialect": "hermes", "tools": [...], "tool_choice": "required"}` for a dialect's
  tool-call grammar); GBNF (`::=`) is not read;
* `structural_tag` -> not supported (an invalid grammar that says so).

Closing within the budget, as pegmask's server (`close_on_length`): a constrained request heads
for the end of its grammar as its `max_new_tokens` runs out, so an answer cut by the budget is
still complete (`fill_within_budget`). SGLang hands a grammar object nothing of its request, so
`register()` also hooks, through SGLang's plugin `HookRegistry`, the two `GrammarManager` methods
that bind a grammar to its request (a cache hit in `process_req_with_grammar`, a compiled one in
`get_ready_grammar_requests`) and gives each pegmask grammar its request's `max_new_tokens`,
and a dialect grammar its request's prompt ids: the output starts in reasoning or not as the
rendered prompt's tail says (a template that opens `<think>` itself, or closes an empty block),
the grammar for the other start compiled there the first time one is met.
`custom_params={"close_on_length": false}` turns closing off for a request.

Tested against the installed SGLang 0.5.23's own classes in `.venv-sglang`
(`scripts/make_sglang_venv.sh`: SGLang without its CUDA dependencies); untested on a live
server (SGLang's model runner needs a GPU).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import torch
from sglang.srt.constrained.base_grammar_backend import (
    BaseGrammarBackend,
    BaseGrammarObject,
    InvalidGrammarObject,
)

from pegmask.grammars.matcher import GrammarMatcher
from pegmask.grammars.vocab import Vocabulary
from pegmask.integrations.constraints import (
    Constraint,
    Constraints,
    fill_within_budget,
    parse_spec,
    spec_kind,
)
from pegmask.kernels import allocate_token_bitmask, apply_token_bitmask_inplace

logger = logging.getLogger(__name__)
BACKEND_NAME = "pegmask"
CLOSE_KEY = "close_on_length"  # the custom_params field that turns closing off (false)
_MANAGER = "sglang.srt.constrained.grammar_manager.GrammarManager"


class PegmaskGrammar(BaseGrammarObject):
    """One request's grammar: a pegmask matcher behind SGLang's grammar-object interface.
    `after_prompt`, for a dialect constraint: the matcher for a request's prompt ids (its
    reasoning start read from the prompt's tail), which `bind_request` swaps in."""

    def __init__(self, matcher: GrammarMatcher,
                 after_prompt: Callable[[list[int]], GrammarMatcher] | None = None):
        super().__init__()
        self.matcher = matcher
        self.after_prompt = after_prompt
        self.budget: int | None = None  # the request's max_new_tokens, where it closes
        self.accepted = 0  # output tokens read (SGLang rolls back by count)

    def accept_token(self, token: int) -> None:
        """Advance; a token outside the grammar raises ValueError (SGLang aborts the request)."""
        if self.finished:
            return
        if not self.matcher.accept_token(token):
            raise ValueError(f"token {token} is outside the pegmask grammar")
        self.accepted += 1

    def rollback(self, k: int) -> None:
        if k > 0:
            self.matcher.rollback(k)
            self.accepted -= k
            self.finished = False

    def is_terminated(self) -> bool:
        return self.matcher.is_terminated()

    def allocate_vocab_mask(self, vocab_size: int, batch_size: int, device: Any) -> torch.Tensor:
        """Every bit set: rows SGLang does not fill stay unconstrained."""
        return allocate_token_bitmask(batch_size, vocab_size)

    def fill_vocab_mask(self, vocab_mask: torch.Tensor, idx: int) -> None:
        remaining = None if self.budget is None else self.budget - self.accepted
        fill_within_budget(self.matcher, vocab_mask, idx, remaining)

    @staticmethod
    def reset_vocab_mask(vocab_mask: torch.Tensor) -> None:
        vocab_mask.fill_(-1)

    @staticmethod
    def move_vocab_mask(vocab_mask: torch.Tensor, device: Any) -> torch.Tensor:
        return vocab_mask.to(device, non_blocking=True)

    @staticmethod
    def apply_vocab_mask(logits: torch.Tensor, vocab_mask: torch.Tensor) -> None:
        apply_token_bitmask_inplace(logits, vocab_mask)

    def copy(self) -> PegmaskGrammar:
        """A fresh grammar for a new request (cached templates are never advanced)."""
        return PegmaskGrammar(self.matcher.compiled.matcher(), self.after_prompt)

    def try_jump_forward(self, tokenizer: Any) -> None:
        """Jump-forward is not offered through SGLang (its retokenizing protocol)."""
        return None


class PegmaskGrammarBackend(BaseGrammarBackend):
    """Compiles SGLang's grammar keys with pegmask for one model's vocabulary."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: Any = None):
        super().__init__()
        eos = [eos_token_ids] if isinstance(eos_token_ids, int) else list(eos_token_ids or [])
        self.constraints = Constraints(Vocabulary.from_hf(tokenizer, vocab_size, extra_eos=eos))

    def dispatch_json(self, key_string: str) -> BaseGrammarObject:
        if key_string == "$$ANY$$":
            return self._grammar({"json_schema": True})
        return self._grammar({"json_schema": key_string})

    def dispatch_regex(self, key_string: str) -> BaseGrammarObject:
        return self._grammar({"regex": key_string})

    def dispatch_ebnf(self, key_string: str) -> BaseGrammarObject:
        if key_string.lstrip().startswith("{"):
            return self._grammar(key_string)  # a pegmask constraint object
        if "::=" in key_string:
            return InvalidGrammarObject("pegmask reads its PEG DSL (rule = expression), not "
                                        "GBNF (::=); or send a pegmask constraint object")
        return self._grammar({"grammar": key_string})

    def dispatch_structural_tag(self, key_string: str) -> BaseGrammarObject:
        return InvalidGrammarObject("the pegmask backend does not read structural tags: send "
                                    "a pegmask constraint object as ebnf")

    def _grammar(self, constraint: Constraint) -> BaseGrammarObject:
        try:
            matcher = self.constraints.matcher(constraint)
        except ValueError as exc:
            logger.error("pegmask: invalid grammar: %s", exc)
            return InvalidGrammarObject(str(exc))
        after_prompt = None
        if isinstance(constraint, (str, dict)) and spec_kind(parse_spec(constraint)) == "dialect":
            after_prompt = functools.partial(self.constraints.matcher, constraint)
        return PegmaskGrammar(matcher, after_prompt)


def create_backend(server_args: Any, tokenizer: Any, vocab_size: int,
                   eos_token_ids: Any = None) -> PegmaskGrammarBackend:
    """The `init_func` SGLang calls for `--grammar-backend pegmask`."""
    return PegmaskGrammarBackend(tokenizer, vocab_size, eos_token_ids)


def bind_request(req: Any) -> None:
    """Give a request's pegmask grammar its budget: `max_new_tokens`, unless the request's
    `custom_params` say `close_on_length: false` (or it has no budget); and a dialect grammar
    its prompt (`origin_input_ids`: the rendered prompt, whose tail says whether the output
    starts in reasoning). Runs inside SGLang's scheduler loop, so it never raises: only an
    explicit false turns closing off, and a prompt that cannot be read leaves the grammar."""
    grammar = req.grammar
    if not isinstance(grammar, PegmaskGrammar):
        return
    prompt = getattr(req, "origin_input_ids", None)
    if grammar.after_prompt is not None and prompt is not None and grammar.accepted == 0:
        try:
            grammar.matcher = grammar.after_prompt(list(prompt))
        except ValueError as exc:
            logger.error("pegmask: the grammar after the prompt failed (%s); kept", exc)
    params = req.sampling_params
    custom = params.custom_params if isinstance(params.custom_params, dict) else {}
    grammar.budget = None if custom.get(CLOSE_KEY) is False else params.max_new_tokens


def _bound_after_lookup(added: bool, manager: Any, req: Any) -> None:
    """After `GrammarManager.process_req_with_grammar`: a cache hit is bound to its request."""
    bind_request(req)


def _bound_when_ready(ready: list[Any], manager: Any) -> None:
    """After `GrammarManager.get_ready_grammar_requests`: each compiled grammar is bound."""
    for req in ready:
        bind_request(req)


def register() -> None:
    """The `sglang.srt.plugins` entry point: make `pegmask` a grammar backend choice, and hook
    the grammar manager so grammars learn their request's budget (SGLang's `load_plugins`
    applies the hooks after running the plugins)."""
    from sglang.srt.constrained.base_grammar_backend import register_grammar_backend
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType
    from sglang.srt.server_args import add_grammar_backend_choices

    register_grammar_backend(BACKEND_NAME, create_backend)
    if BACKEND_NAME not in _choices():
        add_grammar_backend_choices([BACKEND_NAME])
    HookRegistry.register(f"{_MANAGER}.process_req_with_grammar", _bound_after_lookup,
                          HookType.AFTER)
    HookRegistry.register(f"{_MANAGER}.get_ready_grammar_requests", _bound_when_ready,
                          HookType.AFTER)


def _choices() -> list[str]:
    from sglang.srt.server_args import GRAMMAR_BACKEND_CHOICES

    return list(GRAMMAR_BACKEND_CHOICES)
