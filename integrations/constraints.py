"""One constraint format for every integration, and the compiled grammars it maps to.

A request asks pegmask to enforce one of these (a JSON object, or its JSON text)::

    {"json_schema": {...}}                  # a schema (or its JSON text); "strict": true closes
    {"json_schema": {...}, "strict": true}  # objects, as OpenAI's strict mode does
    {"json_object": true}                   # any JSON object
    {"regex": "[0-9]{3}-[0-9]{4}"}
    {"grammar": "root = \\"yes\\" | \\"no\\""}   # the PEG DSL
    {"choice": ["red", "green"]}
    {"dialect": "hermes", "tools": [...], "tool_choice": "required",
     "parallel_tool_calls": false, "reasoning": false,
     "chat_template_kwargs": {...}, "response_format": {...}}

The first five are the engine's structured-output formats (`grammar_for_format`); the last is
a dialect's whole-turn grammar for a chat request (`Dialect.grammar(ChatRequest(...))`): free
text and reasoning until the dialect's trigger, then tool calls under the tools' schemas, as
`tool_choice` and `parallel_tool_calls` allow. `reasoning` is the dialect's reasoning option
(True, False, or None: detected from the output); where the host hands the rendered prompt
(`Constraints.compiled(..., prompt_ids)`), the prompt's tail decides whether the output starts
inside reasoning (`ChatRequest.generation_prompt`), whatever switches the template read. The same compiled grammars and matchers as
the engine's are used; `Constraints` keeps them per vocabulary.

Closing within the budget (`fill_within_budget`): as pegmask's engine does (`close_on_length`),
a constrained output that reaches its token budget still ends in a complete parse; the hosts
hand the tokens left.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from pegmask.dialects import ChatRequest, Dialect, RequestError, get_dialect
from pegmask.engine.decode import CLOSING_MARGIN
from pegmask.engine.requests import InvalidRequestError, grammar_for_format
from pegmask.grammars import Grammar, GrammarError
from pegmask.grammars.compiler import CompiledGrammar, GrammarCompiler
from pegmask.grammars.matcher import GrammarMatcher
from pegmask.grammars.vocab import Vocabulary
from pegmask.kernels.bitmask import pack_token_ids

FORMAT_KINDS = ("json_schema", "json_object", "regex", "grammar", "choice")
KINDS = (*FORMAT_KINDS, "dialect")
_CHAT_KEYS = ("tools", "tool_choice", "parallel_tool_calls", "reasoning",
              "chat_template_kwargs", "response_format")
_ALLOWED_KEYS = {"json_schema": {"strict"}, "dialect": set(_CHAT_KEYS)}

Constraint = Grammar | CompiledGrammar | Mapping[str, Any] | str
"""What a caller may hand an integration: a grammar, a compiled grammar, or a spec."""


def parse_spec(spec: Mapping[str, Any] | str) -> dict[str, Any]:
    """The spec as a dict, checked: exactly one kind, no key it does not use.

    Raises `InvalidRequestError` (a ValueError) naming the key at fault.
    """
    if isinstance(spec, (str, bytes)):
        try:
            spec = json.loads(spec)
        except ValueError as exc:
            raise InvalidRequestError(f"the pegmask constraint is not JSON: {exc}",
                                      "pegmask") from exc
    if not isinstance(spec, Mapping):
        raise InvalidRequestError("the pegmask constraint must be a JSON object", "pegmask")
    kinds = [kind for kind in KINDS if kind in spec]
    if len(kinds) != 1:
        raise InvalidRequestError(
            f"the pegmask constraint needs exactly one of {', '.join(KINDS)}; got "
            f"{sorted(spec) if not kinds else kinds}", "pegmask")
    kind = kinds[0]
    unknown = set(spec) - {kind} - _ALLOWED_KEYS.get(kind, set())
    if unknown:
        raise InvalidRequestError(
            f"the pegmask constraint {kind!r} does not take {sorted(unknown)}", sorted(unknown)[0])
    return dict(spec)


def spec_kind(spec: Mapping[str, Any]) -> str:
    """Which of `KINDS` a checked spec is."""
    return next(kind for kind in KINDS if kind in spec)


def grammar_for_spec(spec: Mapping[str, Any] | str, prompt: str | None = None) -> Grammar:
    """The grammar a spec asks for (cached: equal specs share one grammar object, hence one
    compiled grammar per vocabulary). `prompt`: the rendered prompt the output continues, where
    the host knows it; a dialect's grammar starts in reasoning or not as its tail says
    (`ChatRequest.generation_prompt`), the other kinds ignore it."""
    spec = parse_spec(spec)
    kind = spec_kind(spec)
    if kind == "dialect":
        dialect, request = chat_request(spec)
        request.generation_prompt = prompt
        try:
            return dialect.grammar(request)
        except (ValueError, RecursionError) as exc:
            raise InvalidRequestError(f"invalid tools for dialect {dialect.name!r}: {exc}",
                                      "tools") from exc
    return grammar_for_format(_response_format(kind, spec))


def chat_request(spec: Mapping[str, Any] | str) -> tuple[Dialect, ChatRequest]:
    """The dialect and the `ChatRequest` of a `dialect` spec: what its grammar and its
    output parser are specialized with."""
    spec = parse_spec(spec)
    if spec_kind(spec) != "dialect":
        raise InvalidRequestError("not a dialect constraint", "dialect")
    reasoning = spec.get("reasoning")
    if reasoning is not None and not isinstance(reasoning, bool):
        raise InvalidRequestError("reasoning must be true, false or null", "reasoning")
    dialect = dialect_named(spec["dialect"], reasoning)
    parallel = spec.get("parallel_tool_calls")
    try:
        request = ChatRequest(
            tools=_list(spec.get("tools"), "tools"),
            tool_choice=spec.get("tool_choice") or "auto",
            parallel_tool_calls=True if parallel is None else bool(parallel),
            chat_template_kwargs=dict(_mapping(spec.get("chat_template_kwargs"),
                                               "chat_template_kwargs")),
            response_format=spec.get("response_format"),
        )
    except RequestError as exc:
        raise InvalidRequestError(str(exc), exc.param) from exc
    return dialect, request


@functools.lru_cache(maxsize=32)
def dialect_named(name: Any, reasoning: bool | None = None) -> Dialect:
    """The dialect `name` with its reasoning option, one instance per pair (each caches its
    grammars per request shape)."""
    if not isinstance(name, str):
        raise InvalidRequestError("dialect must be a dialect name", "dialect")
    try:
        return get_dialect(name, reasoning=reasoning)
    except ValueError as exc:
        raise InvalidRequestError(str(exc), "dialect") from exc


class Constraints:
    """Compiled grammars for one vocabulary, kept across requests (a `GrammarCompiler`), and
    matchers for whatever a caller hands in (see `Constraint`)."""

    def __init__(self, vocab: Vocabulary, **compiler_options: Any):
        self.vocab = vocab
        self.compiler = GrammarCompiler(vocab, **compiler_options)

    def compiled(self, constraint: Constraint,
                 prompt_ids: Sequence[int] | None = None) -> CompiledGrammar:
        """`constraint` bound to this vocabulary; bad specs and grammars raise
        `InvalidRequestError`. `prompt_ids`: the rendered prompt's ids, where the host has
        them: a dialect spec reads its reasoning start from the prompt (`grammar_for_spec`)."""
        if isinstance(constraint, CompiledGrammar):
            if constraint.vocab is not self.vocab:
                raise ValueError("the compiled grammar was compiled for another vocabulary")
            return constraint
        if isinstance(constraint, Grammar):
            grammar = constraint
        else:
            prompt = None if prompt_ids is None else self.vocab.text_of(prompt_ids)
            grammar = grammar_for_spec(constraint, prompt)
        try:
            return self.compiler.compile(grammar)
        except (ValueError, RecursionError) as exc:
            raise InvalidRequestError(f"cannot compile the grammar: {exc}", "pegmask") from exc

    def matcher(self, constraint: Constraint,
                prompt_ids: Sequence[int] | None = None) -> GrammarMatcher:
        """A fresh matcher (one generation) for `constraint` after `prompt_ids` (see
        `compiled`)."""
        return self.compiled(constraint, prompt_ids).matcher()


class OutputFollower:
    """A matcher kept in step with one output's token list, as hosts hand it over: the whole
    list so far at each step (transformers' `input_ids`, vLLM's output token ids).

    `follow` rolls back to what the list shares with what was read (beam search reorders
    rows) and reads the rest; once a stop token was read, what follows is padding.
    """

    def __init__(self, matcher: GrammarMatcher):
        self.matcher = matcher
        self.read: list[int] = []  # the tokens read, a stop token included

    @property
    def stopped(self) -> bool:
        """Whether a stop token ended the output (nothing to mask any more)."""
        return self.matcher.stopped

    def follow(self, tokens: list[int], start: int = 0) -> None:
        """Read `tokens`, the output from token `start` on (tokens before `start` are those
        already read, unchanged). Raises `TokenRejected` for a token the grammar refuses."""
        read, matcher = self.read, self.matcher
        if not 0 <= start <= len(read):
            raise ValueError(f"start {start} is past the {len(read)} tokens read")
        shared, limit = start, min(len(read), start + len(tokens))
        if tokens[:limit - start] == read[start:limit]:  # the usual case, compared in C
            shared = limit
        while shared < limit and read[shared] == tokens[shared - start]:
            shared += 1
        if shared < len(read):
            matcher.rollback(len(read) - shared)
            del read[shared:]
        for token in tokens[shared - start:]:
            if matcher.stopped:
                return
            if not matcher.accept_token(token):
                raise TokenRejected(token, matcher.compiled.vocab)
            read.append(token)


FIT_WINDOW = 64
"""Tokens left, beyond the fewest that complete the grammar, from which on the mask leaves out
the tokens whose completion would not fit (`fill_within_budget`)."""


def fill_within_budget(matcher: GrammarMatcher, bitmask: torch.Tensor | np.ndarray, index: int,
                       remaining: int | None) -> bool:
    """Fill row `index` of `bitmask` for the next token of an output that may have `remaining`
    more tokens, this one included (None: no budget); whether the mask must be applied (False
    in free text, as `fill_next_token_bitmask`).

    The engine's policy (`engine/decode.py`) where no token can be taken back: with `C` the
    fewest tokens that complete the grammar, the closing mask (tokens toward the end that
    leave room for it) once `remaining <= C + CLOSING_MARGIN`, so every path ends in a complete
    parse within the budget. A host samples under the plain mask before that, and a token
    there can raise `C` past what is left (an optional member with required ones inside, a
    long key); the engine takes such a token back, a logits processor cannot, so within
    `FIT_WINDOW` of the end the plain mask leaves out the tokens whose completion would not fit
    in the tokens left after them. Further out only a token that alone raises `C` by more than
    the window can still cut the output (the figures are walked only near the end: they cost
    a trie walk per configuration met there)."""
    need = matcher.fill_next_token_bitmask(bitmask, index)
    if not need or remaining is None:
        return need
    try:
        distance = matcher.completion_distance()  # symbols: bounds the count, and is cheaper
        if distance is None or distance < remaining - FIT_WINDOW:
            return need
        count = matcher.completion_token_count()
        if count is None:
            return need  # nothing completes the grammar: the plain mask, as the engine
        if count and remaining <= count + CLOSING_MARGIN:
            matcher.fill_closing_bitmask(bitmask, index, remaining)
        elif remaining <= count + FIT_WINDOW:
            over = matcher.overlong_tokens(remaining - 1)
            if len(over):
                keep = ~pack_token_ids(over, matcher.compiled.vocab.size)
                row = bitmask[index]
                row &= torch.from_numpy(keep) if isinstance(row, torch.Tensor) else keep
    except GrammarError:  # GrammarTooLarge above all: too long a completion to walk
        return need  # as the engine: nothing to close, the plain mask
    return True


class TokenRejected(ValueError):
    """An output holds a token its grammar does not allow: something other than the mask
    chose it (a processor after it, a forced token, a placeholder id)."""

    def __init__(self, token: int, vocab: Vocabulary):
        self.token = token
        text = vocab.token_text(token) if 0 <= token < vocab.size else "not a token id"
        super().__init__(f"token {token} ({text!r}) is outside the grammar")


def _response_format(kind: str, spec: Mapping[str, Any]) -> dict[str, Any]:
    """The engine's `response_format` object for a format spec."""
    value = spec[kind]
    if kind == "json_object":
        if value is not True:
            raise InvalidRequestError("json_object must be true", "json_object")
        return {"type": "json_object"}
    if kind == "json_schema":
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError as exc:
                raise InvalidRequestError(f"json_schema is not JSON: {exc}",
                                          "json_schema") from exc
        strict = spec.get("strict", False)
        if not isinstance(strict, bool):
            raise InvalidRequestError("strict must be a boolean", "strict")
        return {"type": "json_schema", "json_schema": {"schema": value, "strict": strict}}
    return {"type": kind, kind: value}


def _list(value: Any, name: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidRequestError(f"{name} must be a list", name)
    return value


def _mapping(value: Any, name: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidRequestError(f"{name} must be an object", name)
    return value
