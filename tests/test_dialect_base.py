"""The dialect framework: requests, grammar-text helpers, delta accumulation; and the helpers
the per-dialect tests share (streamed-vs-whole checks, sampling under the token mask)."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from itertools import pairwise
from typing import Any

import jsonschema
import numpy as np
import pytest
from hypothesis import HealthCheck, settings

from pegmask.dialects import ChatRequest, Dialect, RequestError, accumulate, get_dialect
from pegmask.dialects.base import peg_literal, raw_string_values, separated
from pegmask.dialects.values import schema_type
from pegmask.grammars import Grammar

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "enum": ["UTC", "JST"]}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}
TOOLS = [WEATHER, TIME]
TOOL_CHOICES: list[Any] = ["auto", "required", "none",
                           {"type": "function", "function": {"name": "get_time"}}]


# --------------------------------------------------------------------------- shared helpers
CHUNKINGS = settings(max_examples=8, deadline=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture])


def message(content: str | None = None, reasoning: str | None = None,
            calls: Sequence[tuple[str, str]] = ()) -> dict[str, Any]:
    """An expected assistant message; call ids are their positions (see `without_ids`)."""
    return {"role": "assistant", "content": content, "reasoning_content": reasoning,
            "tool_calls": [{"id": i, "type": "function",
                            "function": {"name": name, "arguments": arguments}}
                           for i, (name, arguments) in enumerate(calls)]}


def without_ids(message: dict[str, Any]) -> dict[str, Any]:
    """The message with call ids replaced by their position (ids are random by default)."""
    calls = [{**call, "id": i} for i, call in enumerate(message["tool_calls"])]
    return {**message, "tool_calls": calls}


def split_at(items: Sequence[Any], cuts: Sequence[int]) -> list[Sequence[Any]]:
    """`items` cut at the given positions (any order, duplicates and out-of-range allowed)."""
    points = sorted({min(max(c, 0), len(items)) for c in cuts} | {0, len(items)})
    return [items[a:b] for a, b in pairwise(points)]


def assert_stream_matches(dialect: Dialect, output: str | Sequence[int], cuts: Sequence[int],
                          request: ChatRequest | None = None, vocab: Any = None,
                          trusted: bool = False) -> dict[str, Any]:
    """Streaming `output` in the chunks given by `cuts` yields the message of a whole parse,
    the accumulated deltas equal it, and a call's name comes once, in its first delta."""
    whole = dialect.parse(output, request, vocab, trusted=trusted, seed=7)
    parser = dialect.stream_parser(request, vocab, trusted=trusted, seed=7)
    deltas: list[dict[str, Any]] = []
    for chunk in split_at(output, cuts):
        deltas += parser.feed(chunk) if isinstance(output, str) else parser.feed_tokens(chunk)
    deltas += parser.finish()
    assert parser.message == whole
    assert accumulate(deltas) == whole
    named = [piece["index"] for d in deltas for piece in d.get("tool_calls", [])
             if "name" in piece.get("function", {})]
    assert named == list(range(len(whole["tool_calls"])))
    expected_reason = "tool_calls" if whole["tool_calls"] else "stop"
    assert parser.finish_reason == expected_reason
    return whole


def call_summary(message: dict[str, Any]) -> list[tuple[str, Any]]:
    """(name, decoded arguments) of each call."""
    return [(c["function"]["name"], json.loads(c["function"]["arguments"]))
            for c in message["tool_calls"]]


def allowed_ids(matcher: Any, bitmask: np.ndarray, size: int) -> np.ndarray:
    matcher.fill_next_token_bitmask(bitmask, 0)
    bits = np.unpackbits(bitmask[0].view(np.uint8), bitorder="little")
    return np.flatnonzero(bits[:size])


def structure_tiers(vocab: Any) -> list[tuple[float, np.ndarray]]:
    """Sampling preferences: special tokens 30% of the time, short non-blank ASCII tokens 60%
    (so random text reaches structure and the end within a small budget), else any token."""
    special = np.zeros(vocab.size, dtype=bool)
    special[list(vocab.special_names)] = True
    short = np.array([data is not None and len(data) <= 2 and data.isascii()
                      and not data.isspace() for data in vocab.token_bytes])
    return [(0.3, special), (0.9, short)]


def sample_tokens(compiled: Any, rng: random.Random, budget: int,
                  tiers: list[tuple[float, np.ndarray]]) -> list[int] | None:
    """Token ids drawn at random under the mask until the matcher terminates (None if the
    budget runs out first). `tiers`: (cumulative probability, favored ids as a bool array)."""
    vocab = compiled.vocab
    matcher = compiled.matcher()
    bitmask = np.zeros((1, (vocab.size + 31) // 32), dtype=np.int32)
    ids: list[int] = []
    while len(ids) < budget:
        if matcher.is_terminated():
            return ids
        allowed = allowed_ids(matcher, bitmask, vocab.size)
        assert len(allowed), "the mask allows nothing before the grammar ended"
        draw = rng.random()
        pool = next((favored for p, favored in ((p, allowed[f[allowed]]) for p, f in tiers)
                     if draw < p and len(favored)), allowed)
        token = int(pool[rng.randrange(len(pool))])
        assert matcher.accept_token(token)
        ids.append(token)
    return ids if matcher.is_terminated() else None


def check_calls(message: dict[str, Any], request: ChatRequest) -> None:
    """The calls obey tool_choice / parallel_tool_calls and validate against their schemas."""
    calls = message["tool_calls"]
    assert len(calls) >= request.min_calls
    if request.max_calls is not None:
        assert len(calls) <= request.max_calls
    for call in calls:
        name = call["function"]["name"]
        assert name in request.allowed_tools
        jsonschema.validate(json.loads(call["function"]["arguments"]), request.tool_schemas[name])
    assert len({call["id"] for call in calls}) == len(calls)


def assert_sampling_obeys(dialect: Dialect, request: ChatRequest, vocab: Any,
                          budget: int, seeds: int = 3) -> None:
    """Random sampling under the mask of `dialect.grammar(request)` yields outputs whose calls
    obey the request, parsed alike leniently and token by token as the engine does (trusted)."""
    from pegmask.grammars.compiler import compile_grammar

    compiled = compile_grammar(dialect.grammar(request), vocab)
    tiers = structure_tiers(vocab)
    finished = 0
    for seed in range(seeds):
        ids = sample_tokens(compiled, random.Random(seed), budget, tiers)
        if ids is None:
            continue
        finished += 1
        parsed = dialect.parse(ids, request, vocab, seed=7)
        check_calls(parsed, request)
        streamed = assert_stream_matches(dialect, ids, range(len(ids)), request, vocab,
                                         trusted=True)
        assert streamed == parsed
    assert finished, "no sample ended within the token budget"


SHAPES: dict[str, list[str]] = {
    "text": ["text"],
    "one call": ["weather"],
    "other tool": ["time"],
    "text then call": ["text", "weather"],
    "two calls": ["weather", "weather2"],
    "mixed calls": ["weather", "time"],
}
BAD_CALLS = ["bad schema", "bad type", "missing required", "unknown tool"]
CALL_TOOLS = {"weather": "get_weather", "weather2": "get_weather", "time": "get_time"}


def obeys(request: ChatRequest, parts: list[str], reasoning: bool, thought: bool,
          calls_alone: bool = False) -> bool:
    """Whether an output made of `parts` (after a reasoning block if `thought`) obeys the
    request (`calls_alone`: a call after text is part of the text)."""
    if calls_alone and "text" in parts:
        parts = ["text"]
    calls = [CALL_TOOLS[p] for p in parts if p != "text"]
    if reasoning != thought or len(calls) < request.min_calls:
        return False
    if any(name not in request.allowed_tools for name in calls):
        return False
    if request.max_calls is not None and len(calls) > request.max_calls:
        return False
    return not ("text" in parts and request.min_calls)


def assert_request_grammar(dialect: Dialect, request: ChatRequest, reasoning: bool,
                           render: Callable[[list[str]], str], thought: str,
                           ends: Sequence[str]) -> None:
    """`dialect.grammar(request)` accepts exactly the outputs that obey the request (every
    shape of `SHAPES`, with and without the reasoning block `thought`, before each end in
    `ends`), rejects calls that break their schema, and what it accepts the trusted parser
    reads as the lenient one does. `render(parts)` writes an output body; a family that does not
    reason has no `thought`."""
    grammar = dialect.grammar(request)
    calls_alone = getattr(dialect, "calls_alone", False)
    for with_thought in (True, False) if thought else (False,):
        prefix = thought if with_thought else ""
        for label, parts in SHAPES.items():
            want = obeys(request, parts, reasoning, with_thought, calls_alone)
            for end in ends:
                output = prefix + render(parts) + end
                assert grammar.matches(output) == want, (label, output)
                if want:
                    trusted = dialect.parse(output, request, trusted=True, seed=1)
                    assert trusted == dialect.parse(output, request, seed=1)
    for bad in BAD_CALLS:
        output = (thought if reasoning else "") + render([bad])
        assert not grammar.matches(output), bad


# --------------------------------------------------------------------------- requests
def test_request_views():
    request = ChatRequest(tools=TOOLS, tool_choice="required", parallel_tool_calls=False)
    assert list(request.tool_schemas) == ["get_weather", "get_time"]
    assert request.allowed_tools == ["get_weather", "get_time"]
    assert (request.min_calls, request.max_calls) == (1, 1)
    named = ChatRequest(tools=TOOLS, tool_choice={"type": "function",
                                                  "function": {"name": "get_time"}})
    assert named.allowed_tools == ["get_time"] and named.min_calls == 1
    assert named.max_calls == 1  # one call of the named tool, even with parallel calls allowed
    none = ChatRequest(tools=TOOLS, tool_choice="none")
    assert none.allowed_tools == [] and none.max_calls == 0
    assert ChatRequest().max_calls == 0  # auto without tools: no call can start


@pytest.mark.parametrize(("kwargs", "param"), [
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": [WEATHER, WEATHER]}, "tools"),
    ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools"),
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"response_format": {"type": "json_schema"}}, "response_format"),
])
def test_invalid_requests_raise_a_value_error(kwargs, param):
    with pytest.raises(RequestError) as info:
        ChatRequest(**kwargs)
    assert isinstance(info.value, ValueError) and info.value.param == param


@pytest.mark.parametrize(("kwargs", "default", "expected"), [
    ({}, True, True),
    ({}, None, None),
    ({"enable_thinking": False}, True, False),
    ({"enable_thinking": True}, False, False),  # only a literal false changes the default
    ({"reasoning_effort": "none", "enable_thinking": True}, True, False),
    ({"reasoning_effort": "low", "enable_thinking": False}, False, True),  # effort wins
    ({"reasoning_effort": "high"}, None, True),
])
def test_reasoning_enabled(kwargs, default, expected):
    assert ChatRequest(chat_template_kwargs=kwargs).reasoning_enabled(default) is expected


def test_response_format_and_openai_body():
    assert ChatRequest(response_format={"type": "json_object"}).response_schema == {
        "type": "object"}
    assert ChatRequest(response_format={"type": "text"}).response_schema is None
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    request = ChatRequest.from_openai({
        "model": "x", "messages": [], "tools": TOOLS, "tool_choice": "required",
        "parallel_tool_calls": False, "reasoning_effort": "none",
        "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}},
    })
    assert request.response_schema == schema
    assert request.max_calls == 1 and request.min_calls == 1
    assert request.reasoning_enabled(True) is False


# --------------------------------------------------------------------------- grammar-text helpers
@pytest.mark.parametrize("name", ['get_weather', 'a"b\\c', "tab\there\nnl", "日本語", "\x01"])
def test_peg_literal_round_trips(name):
    grammar = Grammar.from_peg(f"root = {peg_literal(name)}")
    assert grammar.matches(name)
    assert not grammar.matches(name + "x")


def test_separated_lists_required_then_optional_items_once():
    grammar = Grammar.from_peg(f'root = {separated(["a"], ["b", "c"], "s")}\n'
                               'a = "A"\nb = "B"\nc = "C"\ns = ","')
    assert [grammar.matches(t) for t in ["A", "A,B", "A,C", "A,B,C", "A,C,B", "B", ""]] == [
        True, True, True, True, False, False, False]
    only_optional = Grammar.from_peg(f'root = {separated([], ["b", "c"], "s")}\n'
                                     'b = "B"\nc = "C"\ns = ","')
    assert [only_optional.matches(t) for t in ["", "B", "C", "B,C", "C,B", ","]] == [
        True, True, True, True, False, False]


def test_schema_helpers():
    assert schema_type({"type": "string"}) == "string"
    assert schema_type({"type": ["integer", "null"]}) is None
    assert schema_type({"enum": ["a", "b"]}) == "string"
    assert raw_string_values({"type": "string", "description": "d"}) == []
    assert raw_string_values({"type": "string", "enum": ["x", "y"]}) == ["x", "y"]
    assert raw_string_values({"type": "string", "pattern": "^a"}) is None
    assert raw_string_values({"type": "integer"}) is None


def test_accumulate_rebuilds_a_streamed_message():
    deltas = [
        {"reasoning_content": "Thinking"}, {"content": "Hi"},
        {"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                         "function": {"name": "f", "arguments": ""}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '{"a": '}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]},
    ]
    assert accumulate(deltas) == {
        "role": "assistant", "content": "Hi", "reasoning_content": "Thinking",
        "tool_calls": [{"id": "call_1", "type": "function",
                        "function": {"name": "f", "arguments": '{"a": 1}'}}],
    }


def test_get_dialect():
    assert get_dialect("hermes").name == "hermes"
    assert get_dialect("dsml", version="v3.2").version == "v3.2"
    with pytest.raises(ValueError, match="unknown dialect"):
        get_dialect("chatml")
    with pytest.raises(TypeError):
        get_dialect("hermes", colour="blue")
    with pytest.raises(ValueError):
        get_dialect("dsml", version="v9")


def test_call_ids_are_unique_and_seedable():
    dialect = get_dialect("hermes")
    text = ('<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>\n'
            '<tool_call>\n{"name": "g", "arguments": {}}\n</tool_call>')
    first, second = dialect.parse(text), dialect.parse(text)
    ids = [c["id"] for c in first["tool_calls"] + second["tool_calls"]]
    assert len(set(ids)) == 4 and all(i.startswith("call_") for i in ids)
    assert dialect.parse(text, seed=3) == dialect.parse(text, seed=3)


def test_grammars_are_cached_per_request_shape():
    dialect = get_dialect("hermes")
    a = dialect.grammar(ChatRequest(tools=TOOLS, tool_choice="required"))
    b = dialect.grammar(ChatRequest(tools=TOOLS, tool_choice="required"))
    c = dialect.grammar(ChatRequest(tools=TOOLS, tool_choice="auto"))
    assert a is b and a is not c
    assert dialect.parse_grammar() is dialect.parse_grammar(ChatRequest(tools=TOOLS))
