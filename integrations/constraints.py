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
(True, False, or None: detected from the output). The same compiled grammars and matchers as
the engine's are used; `Constraints` keeps them per vocabulary.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import Any

from pegmask.dialects import ChatRequest, Dialect, RequestError, get_dialect
from pegmask.engine.requests import InvalidRequestError, grammar_for_format
from pegmask.grammars import Grammar
from pegmask.grammars.compiler import CompiledGrammar, GrammarCompiler
from pegmask.grammars.matcher import GrammarMatcher
from pegmask.grammars.vocab import Vocabulary

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


def grammar_for_spec(spec: Mapping[str, Any] | str) -> Grammar:
    """The grammar a spec asks for (cached: equal specs share one grammar object, hence one
    compiled grammar per vocabulary)."""
    spec = parse_spec(spec)
    kind = spec_kind(spec)
    if kind == "dialect":
        dialect, request = chat_request(spec)
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

    def compiled(self, constraint: Constraint) -> CompiledGrammar:
        """`constraint` bound to this vocabulary; bad specs and grammars raise
        `InvalidRequestError`."""
        if isinstance(constraint, CompiledGrammar):
            if constraint.vocab is not self.vocab:
                raise ValueError("the compiled grammar was compiled for another vocabulary")
            return constraint
        grammar = constraint if isinstance(constraint, Grammar) else grammar_for_spec(constraint)
        try:
            return self.compiler.compile(grammar)
        except (ValueError, RecursionError) as exc:
            raise InvalidRequestError(f"cannot compile the grammar: {exc}", "pegmask") from exc

    def matcher(self, constraint: Constraint) -> GrammarMatcher:
        """A fresh matcher (one generation) for `constraint`."""
        return self.compiled(constraint).matcher()


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
