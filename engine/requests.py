"""Request validation: everything about a generation request that can be checked before the
model runs, so a bad request fails with a clear `InvalidRequestError` instead of mid-stream.

A request is either a completion (a prompt string; a grammar constrains the whole output) or a
chat (messages; tools, tool_choice and response_format go through the dialect as a
`ChatRequest`). The structured-output formats are OpenAI's `json_schema` and `json_object` plus
three pegmask extensions::

    {"type": "regex", "regex": "[0-9]{3}-[0-9]{4}"}
    {"type": "grammar", "grammar": "root = \\"yes\\" | \\"no\\""}     # the PEG DSL
    {"type": "choice", "choice": ["red", "green", "blue"]}
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pegmask.dialects.request import ChatRequest, RequestError
from pegmask.grammars import Grammar
from pegmask.grammars.ir import Literal, choice, json_schema_node
from pegmask.grammars.regex import regex_to_node

DEFAULT_MAX_TOKENS = 512
MAX_TOP_LOGPROBS = 20  # OpenAI's bound
# Logits are divided by the temperature, and divided or multiplied by the repetition penalty,
# in float32 (float16 on some devices): far enough outside these bounds they become inf or 0/0,
# their softmax NaN and the sampled id one past the vocabulary. The bounds keep a wide margin;
# no useful setting lies beyond them.
MIN_TEMPERATURE = 1e-2  # vLLM's floor: a smaller positive temperature is raised to it
MAX_TEMPERATURE = 1e4
REPETITION_PENALTY_RANGE = (1e-2, 1e2)
SEED_RANGE = (-(2**63), 2**63 - 1)  # a torch generator's seed (vLLM's bounds)
GRAMMAR_FORMATS = ("regex", "grammar", "choice")


class InvalidRequestError(ValueError):
    """A request that cannot be served. `param` names the offending field, as in OpenAI's error
    objects (the server answers HTTP 400 with it)."""

    def __init__(self, message: str, param: str | None = None):
        self.param = param
        super().__init__(message)


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens and when to stop (beyond EOS and the grammar), per choice.

    `logprobs` asks for each sampled token's log-probability under the distribution it was
    drawn from (after the grammar mask, bias and penalties, at the request's temperature), with
    `top_logprobs` alternatives. `stop_token_ids` end the output like EOS; `ignore_eos` keeps
    decoding past EOS (it is never sampled); `min_tokens` forbids EOS and stop tokens before that
    many tokens (the grammar wins where it allows nothing else). `close_on_length` closes a
    constrained region before `max_tokens` runs out. `max_tokens` None: what fits in the
    context after the prompt, at most `DEFAULT_MAX_TOKENS` (a number asked for must fit)."""

    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    logprobs: bool = False
    top_logprobs: int = 0
    ignore_eos: bool = False
    min_tokens: int = 0
    n: int = 1
    close_on_length: bool = True

    @property
    def penalized(self) -> bool:
        return bool(self.frequency_penalty or self.presence_penalty
                    or self.repetition_penalty != 1.0)


@dataclass
class GenerationRequest:
    """A validated request. Exactly one of `prompt` and `messages` is set. `grammar` constrains
    a completion's whole output, or a chat's content when a non-JSON format was asked for;
    `chat` carries the answer-shaping options of a chat. `grammar` is not compiled yet: the
    engine compiles it in a worker process (engine/compile_service.py)."""

    prompt: str | None
    messages: list[dict[str, Any]] | None
    sampling: SamplingParams
    chat: ChatRequest | None = None
    grammar: Grammar | None = None
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    grammar_param: str = "grammar"  # the field `grammar` came from, for its compile errors

    @property
    def is_chat(self) -> bool:
        return self.messages is not None


def build_request(
    prompt_or_messages: str | Sequence[Mapping[str, Any]],
    *,
    max_tokens: int | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    seed: int | None = None,
    stop: str | Sequence[str] | None = None,
    min_p: float | None = None,
    stop_token_ids: Sequence[int] | None = None,
    frequency_penalty: float | None = None,
    presence_penalty: float | None = None,
    repetition_penalty: float | None = None,
    logit_bias: Mapping[Any, float] | None = None,
    logprobs: bool | None = None,
    top_logprobs: int | None = None,
    ignore_eos: bool | None = None,
    min_tokens: int | None = None,
    n: int | None = None,
    close_on_length: bool | None = None,
    strict_tool_arguments: bool = True,
    tools: Sequence[Mapping[str, Any]] | None = None,
    tool_choice: str | Mapping[str, Any] | None = None,
    parallel_tool_calls: bool | None = None,
    response_format: Mapping[str, Any] | None = None,
    grammar: Grammar | str | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> GenerationRequest:
    """Validate the arguments of `Engine.generate` (see the module docstring)."""
    sampling = SamplingParams(
        max_tokens=_max_tokens(max_tokens),
        temperature=_temperature(temperature),
        top_p=_top_p(top_p),
        top_k=_top_k(top_k),
        min_p=_number("min_p", min_p, 0.0, low=0.0, high=1.0),
        seed=_seed(seed),
        stop=_stop(stop),
        stop_token_ids=_token_ids("stop_token_ids", stop_token_ids),
        frequency_penalty=_number("frequency_penalty", frequency_penalty, 0.0, low=-2.0,
                                  high=2.0),
        presence_penalty=_number("presence_penalty", presence_penalty, 0.0, low=-2.0, high=2.0),
        repetition_penalty=_repetition_penalty(repetition_penalty),
        logit_bias=_logit_bias(logit_bias),
        logprobs=_flag("logprobs", logprobs),
        top_logprobs=_top_logprobs(top_logprobs, logprobs),
        ignore_eos=_flag("ignore_eos", ignore_eos),
        min_tokens=int_field("min_tokens", min_tokens, 0),
        n=int_field("n", n, 1, low=1),
        close_on_length=_flag("close_on_length", close_on_length, True),
    )
    if sampling.min_tokens > (sampling.max_tokens or DEFAULT_MAX_TOKENS):
        raise InvalidRequestError("min_tokens must not exceed max_tokens", "min_tokens")
    if grammar is not None and response_format is not None:
        raise InvalidRequestError("pass either grammar or response_format, not both", "grammar")
    kind = _format_type(response_format)
    constraint = _grammar_arg(grammar) if grammar is not None else None
    param = "grammar" if grammar is not None else "response_format"
    if kind in GRAMMAR_FORMATS:
        constraint = grammar_for_format(response_format, compile=False)
    if isinstance(prompt_or_messages, str):
        if not prompt_or_messages:
            raise InvalidRequestError("prompt is empty", "prompt")
        if tools not in (None, [], ()):
            raise InvalidRequestError("tools needs a chat (a list of messages)", "tools")
        if tool_choice is not None:
            raise InvalidRequestError("tool_choice needs a chat (a list of messages)",
                                      "tool_choice")
        if kind in ("json_schema", "json_object"):
            constraint = grammar_for_format(response_format, compile=False)
        return GenerationRequest(prompt_or_messages, None, sampling, grammar=constraint,
                                 grammar_param=param)
    messages = _messages(prompt_or_messages)
    if tools is not None and not isinstance(tools, (list, tuple)):
        raise InvalidRequestError("tools must be a list", "tools")
    if chat_template_kwargs is not None and not isinstance(chat_template_kwargs, Mapping):
        raise InvalidRequestError("chat_template_kwargs must be an object", "chat_template_kwargs")
    if constraint is not None and tools:
        raise InvalidRequestError(
            "a grammar, regex or choice cannot be combined with tools; use json_schema",
            "grammar" if grammar is not None else "response_format",
        )
    template_kwargs = dict(chat_template_kwargs or {})
    try:
        chat = ChatRequest(
            tools=list(tools or ()),
            tool_choice="auto" if tool_choice is None else tool_choice,
            parallel_tool_calls=_flag("parallel_tool_calls", parallel_tool_calls, True),
            chat_template_kwargs=template_kwargs,
            # A non-JSON format is enforced by `constraint` instead of the dialect.
            response_format=dict(response_format) if constraint is None and kind else None,
            strict_tool_arguments=strict_tool_arguments,
        )
    except RequestError as exc:
        raise InvalidRequestError(str(exc), exc.param) from exc
    return GenerationRequest(None, messages, sampling, chat=chat, grammar=constraint,
                             template_kwargs=template_kwargs, grammar_param=param)


def grammar_for_format(response_format: Mapping[str, Any], *, compile: bool = True) -> Grammar:
    """The grammar a structured-output `response_format` asks for (json_schema, json_object,
    regex, grammar, choice); cached, so repeated formats share one compiled grammar. With
    `compile=False` only the front-end's parse runs now (the engine compiles in a worker
    process), so errors of a schema or a grammar's rules surface at its compile."""
    kind = _format_type(response_format)
    if kind == "json_object":
        return _grammar("json_schema", '{"type": "object"}', False, compile)
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, Mapping) or not isinstance(spec.get("schema", {}), (dict, bool)):
            raise InvalidRequestError(
                "response_format json_schema needs {'json_schema': {'schema': {...}}}",
                "response_format",
            )
        # OpenAI's strict mode: objects take no properties beyond the declared ones.
        return _grammar(kind, json.dumps(spec.get("schema", {})), bool(spec.get("strict")),
                        compile)
    value = response_format.get(kind)
    valid = (_string_list(value) and len(value) > 0) if kind == "choice" else isinstance(value, str)
    if not valid:
        expected = "a non-empty list of strings" if kind == "choice" else "a string"
        raise InvalidRequestError(f"response_format {kind!r} needs {expected} under {kind!r}",
                                  "response_format")
    return _grammar(kind, json.dumps(value), False, compile)


@functools.lru_cache(maxsize=64)
def _grammar(kind: str, value_json: str, strict: bool, compile: bool) -> Grammar:
    """Build a grammar from a format's JSON payload (and compile it, if asked, so that errors
    show now)."""
    value = json.loads(value_json)
    try:
        if kind == "json_schema":
            grammar = Grammar.from_node(json_schema_node(value, strict=strict))
        elif kind == "regex":
            grammar = Grammar.from_node(regex_to_node(value))
        elif kind == "choice":
            grammar = Grammar.from_node(choice(*(Literal.of(item) for item in value)))
        else:
            grammar = Grammar.from_peg(value)
        return grammar.compile() if compile else grammar
    except (ValueError, RecursionError) as exc:
        param = "grammar" if kind == "grammar" else "response_format"
        raise InvalidRequestError(f"invalid {kind}: {exc}", param) from exc


# --------------------------------------------------------------------------- field checks
def _format_type(response_format: Mapping[str, Any] | None) -> str | None:
    if response_format is None:
        return None
    if not isinstance(response_format, Mapping):
        raise InvalidRequestError("response_format must be an object", "response_format")
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind not in ("json_schema", "json_object", *GRAMMAR_FORMATS):
        raise InvalidRequestError(
            f"unsupported response_format type {kind!r}; expected text, json_schema, "
            "json_object, regex, grammar or choice",
            "response_format",
        )
    return kind


def _grammar_arg(grammar: Grammar | str) -> Grammar:
    if isinstance(grammar, Grammar):
        return grammar
    if not isinstance(grammar, str):
        raise InvalidRequestError("grammar must be a Grammar or PEG text", "grammar")
    return _grammar("grammar", json.dumps(grammar), False, False)


def _messages(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, Sequence) or isinstance(messages, (bytes, str)):
        raise InvalidRequestError("messages must be a list of message objects", "messages")
    if not messages:
        raise InvalidRequestError("messages is empty", "messages")
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise InvalidRequestError(f"messages[{i}] must be an object with a role", "messages")
    return [dict(message) for message in messages]


def _max_tokens(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidRequestError("max_tokens must be a positive integer", "max_tokens")
    return value


def _number(name: str, value: Any, default: float, *, low: float, high: float) -> float:
    """A finite number in [low, high]; compared before it becomes a float, since a JSON integer
    can be past any float (10**400)."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            isinstance(value, float) and not math.isfinite(value)):
        raise InvalidRequestError(f"{name} must be a number", name)
    if value < low:
        raise InvalidRequestError(f"{name} must be >= {low}", name)
    if value > high:
        raise InvalidRequestError(f"{name} must be <= {high}", name)
    return float(value)


def int_field(name: str, value: Any, default: int, *, low: int = 0) -> int:
    """An integer field of at least `low` (`default` when absent)."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise InvalidRequestError(f"{name} must be an integer >= {low}", name)
    return value


def _flag(name: str, value: Any, default: bool = False) -> bool:
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InvalidRequestError(f"{name} must be a boolean", name)
    return value


def _temperature(value: Any) -> float:
    """0 is greedy; a positive temperature below vLLM's floor is raised to it, as vLLM does."""
    temperature = _number("temperature", value, 1.0, low=0.0, high=MAX_TEMPERATURE)
    return max(temperature, MIN_TEMPERATURE) if temperature > 0 else 0.0


def _repetition_penalty(value: Any) -> float:
    low, high = REPETITION_PENALTY_RANGE
    return _number("repetition_penalty", value, 1.0, low=low, high=high)


def _top_logprobs(value: Any, logprobs: Any) -> int:
    count = int_field("top_logprobs", value, 0)
    if count > MAX_TOP_LOGPROBS:
        raise InvalidRequestError(f"top_logprobs must be <= {MAX_TOP_LOGPROBS}", "top_logprobs")
    if count and not logprobs:
        raise InvalidRequestError("top_logprobs needs logprobs=true", "top_logprobs")
    return count


def _token_ids(name: str, value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)) or not all(
            isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value):
        raise InvalidRequestError(f"{name} must be a list of token ids", name)
    return tuple(dict.fromkeys(value))


def _logit_bias(value: Any) -> tuple[tuple[int, float], ...]:
    """OpenAI's `logit_bias`: token ids (JSON object keys, so strings) to values in
    [-100, 100]."""
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise InvalidRequestError("logit_bias must be an object of token id -> bias",
                                  "logit_bias")
    out = []
    for key, bias in value.items():
        try:
            token = int(key)
        except (TypeError, ValueError):
            raise InvalidRequestError(f"logit_bias key {key!r} is not a token id",
                                      "logit_bias") from None
        if token < 0:
            raise InvalidRequestError(f"logit_bias key {key!r} is not a token id", "logit_bias")
        out.append((token, _number("logit_bias", bias, 0.0, low=-100.0, high=100.0)))
    return tuple(out)


def _top_p(value: Any) -> float:
    top_p = _number("top_p", value, 1.0, low=0.0, high=1.0)
    if not 0.0 < top_p <= 1.0:
        raise InvalidRequestError("top_p must be in (0, 1]", "top_p")
    return top_p


def _top_k(value: Any) -> int:
    """`None`, 0 and -1 (vLLM's spelling) disable top-k."""
    if value is None or value == -1:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidRequestError("top_k must be a non-negative integer (or -1)", "top_k")
    return value


def _seed(value: Any) -> int | None:
    low, high = SEED_RANGE
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                              or not low <= value <= high):
        raise InvalidRequestError(f"seed must be an integer in [{low}, {high}]", "seed")
    return value


def _stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not _string_list(items) or not all(items):
        raise InvalidRequestError("stop must be a non-empty string or a list of them", "stop")
    return tuple(dict.fromkeys(items))


def _string_list(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and all(isinstance(item, str) for item in value)
