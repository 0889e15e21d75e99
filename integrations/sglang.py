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

SGLang pins a CUDA torch that this project does not install, so the classes derive from
SGLang's base classes when SGLang is importable and from the minimal stand-ins below
otherwise; the tests run them on the stand-ins. Untested on a live SGLang server.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from pegmask.grammars.matcher import GrammarMatcher
from pegmask.grammars.vocab import Vocabulary
from pegmask.integrations.constraints import Constraint, Constraints
from pegmask.kernels import allocate_token_bitmask, apply_token_bitmask_inplace

logger = logging.getLogger(__name__)
BACKEND_NAME = "pegmask"

try:
    from sglang.srt.constrained.base_grammar_backend import (
        BaseGrammarBackend,
        BaseGrammarObject,
        InvalidGrammarObject,
    )

    SGLANG = True
except ImportError:  # the interface SGLang 0.5.23 calls, for tests without SGLang
    SGLANG = False

    class BaseGrammarObject:  # type: ignore[no-redef]
        """Stand-in for `sglang.srt.constrained.base_grammar_backend.BaseGrammarObject`."""

        def __init__(self) -> None:
            self.finished = False
            self.grammar_stats = None
            self.current_token = None

        @staticmethod
        def fill_vocab_mask_batched(entries: list[Any], vocab_mask: torch.Tensor) -> None:
            for entry in entries:
                entry.grammar.fill_vocab_mask(vocab_mask, entry.row)

    class InvalidGrammarObject(BaseGrammarObject):  # type: ignore[no-redef]
        """Stand-in: a grammar that failed to compile, with the reason."""

        def __init__(self, error_message: str = "Unknown grammar error"):
            super().__init__()
            self.error_message = error_message

    class BaseGrammarBackend:  # type: ignore[no-redef]
        """Stand-in for SGLang's backend base: a compile executor and a grammar cache."""

        def __init__(self) -> None:
            self.executor = ThreadPoolExecutor()
            self.cache: dict[tuple[str, str], BaseGrammarObject] = {}


class PegmaskGrammar(BaseGrammarObject):
    """One request's grammar: a pegmask matcher behind SGLang's grammar-object interface."""

    def __init__(self, matcher: GrammarMatcher):
        super().__init__()
        self.matcher = matcher

    def accept_token(self, token: int) -> None:
        """Advance; a token outside the grammar raises ValueError (SGLang aborts the request)."""
        if self.finished:
            return
        if not self.matcher.accept_token(token):
            raise ValueError(f"token {token} is outside the pegmask grammar")

    def rollback(self, k: int) -> None:
        if k > 0:
            self.matcher.rollback(k)
            self.finished = False

    def is_terminated(self) -> bool:
        return self.matcher.is_terminated()

    def allocate_vocab_mask(self, vocab_size: int, batch_size: int, device: Any) -> torch.Tensor:
        """Every bit set: rows SGLang does not fill stay unconstrained."""
        return allocate_token_bitmask(batch_size, vocab_size)

    def fill_vocab_mask(self, vocab_mask: torch.Tensor, idx: int) -> None:
        self.matcher.fill_next_token_bitmask(vocab_mask, idx)

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
        return PegmaskGrammar(self.matcher.compiled.matcher())

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
            return PegmaskGrammar(self.constraints.matcher(constraint))
        except ValueError as exc:
            logger.error("pegmask: invalid grammar: %s", exc)
            return InvalidGrammarObject(str(exc))


def create_backend(server_args: Any, tokenizer: Any, vocab_size: int,
                   eos_token_ids: Any = None) -> PegmaskGrammarBackend:
    """The `init_func` SGLang calls for `--grammar-backend pegmask`."""
    return PegmaskGrammarBackend(tokenizer, vocab_size, eos_token_ids)


def register() -> None:
    """The `sglang.srt.plugins` entry point: make `pegmask` a grammar backend choice."""
    from sglang.srt.constrained.base_grammar_backend import register_grammar_backend
    from sglang.srt.server_args import add_grammar_backend_choices

    register_grammar_backend(BACKEND_NAME, create_backend)
    if BACKEND_NAME not in _choices():
        add_grammar_backend_choices([BACKEND_NAME])


def _choices() -> list[str]:
    from sglang.srt.server_args import GRAMMAR_BACKEND_CHOICES

    return list(GRAMMAR_BACKEND_CHOICES)
