"""Engine tests on the embedded SmolLM2-135M-Instruct (CPU, offline): completions, structured
outputs, stop conditions, streaming, batching and request validation."""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from vocabularies import smollm2_tokenizer

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from pegmask import Engine, Grammar  # noqa: E402
from pegmask.bench.data import JSONSCHEMA_DIR, TEMPLATES_DIR  # noqa: E402
from pegmask.dialects import accumulate, detect_dialect, dialect_names  # noqa: E402
from pegmask.engine import scheduler  # noqa: E402
from pegmask.engine.decode import StopStrings  # noqa: E402
from pegmask.engine.engine import GenerationStream, renders_tools  # noqa: E402
from pegmask.engine.requests import InvalidRequestError, build_request  # noqa: E402
from pegmask.engine.scheduler import Submission  # noqa: E402

SCHEMAS = JSONSCHEMA_DIR
TEMPLATES = TEMPLATES_DIR
# Small real-world schemas (function-calling arguments) that a 135M model fills in time.
SCHEMA_SAMPLE = [
    "BFCL_simple_11.json",
    "BFCL_simple_251.json",
    "BFCL_simple_189.json",
    "BFCL_simple_281.json",
    "Glaiveai2K---generate_random_password_def83a6c.json",
    "Glaiveai2K---search_product_c8556430.json",
]


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    with Engine() as engine:
        yield engine


def test_default_engine_is_smollm2_hermes(engine: Engine) -> None:
    assert "SmolLM2" in engine.model_name
    assert engine.dialect_name == "hermes"
    assert engine.vocab.size == engine.backend.logits_width
    # Same weights for a second engine in the process: loading is cached.
    with Engine(prewarm=False) as second:
        assert second.backend is engine.backend


def test_completion_greedy(engine: Engine) -> None:
    result = engine.generate("The capital of France is", max_tokens=8, temperature=0)
    assert "Paris" in result.text
    assert result.message["content"] == result.text
    assert result.finish_reason in ("stop", "length")
    assert result.usage["completion_tokens"] == len(result.token_ids) <= 8
    assert result.usage["total_tokens"] == result.usage["prompt_tokens"] + len(result.token_ids)


@pytest.mark.parametrize("prefill_chunk", [256, 7])
def test_every_choice_decodes_after_the_whole_prompt(prefill_chunk: int) -> None:
    """Choices after the first are copies of the prefilled sequence: greedy, each says what one
    choice says (copies made before the prompt's last chunk was in saw none or part of it)."""
    with Engine(prefill_chunk=prefill_chunk, prefix_cache=0, prewarm=False) as engine:
        messages = [{"role": "user", "content": "What is the capital of France?"}]
        alone = engine.generate(messages, max_tokens=8, temperature=0)
        several = engine.generate(messages, n=3, max_tokens=8, temperature=0)
        assert "Paris" in alone.text
        assert [choice.token_ids for choice in several.choices] == [alone.token_ids] * 3


def test_chat_stops_at_end_of_turn(engine: Engine) -> None:
    result = engine.generate([{"role": "user", "content": "What is the capital of France?"}],
                             max_tokens=40, temperature=0)
    assert result.finish_reason == "stop"
    assert "Paris" in result.message["content"]
    assert result.message["tool_calls"] == []
    assert "<|im_end|>" not in result.text


def test_streaming_equals_non_streaming(engine: Engine) -> None:
    options = {"max_tokens": 12, "temperature": 1.0, "seed": 7}
    whole = engine.generate("Once upon a time", **options)
    stream = engine.generate("Once upon a time", stream=True, **options)
    pieces = [delta["text"] for delta in stream]
    assert "".join(pieces) == whole.text
    # the same prompt again: kept whole by the prefix cache, the rest as the first time
    assert stream.result.usage["prompt_tokens_details"] == {"cached_tokens": 4}
    assert replace(stream.result, usage=whole.usage) == whole

    chat = [{"role": "user", "content": "Name three colors."}]
    whole = engine.generate(chat, **options)
    deltas = list(engine.generate(chat, stream=True, **options))
    assert deltas[0] == {"role": "assistant"}
    assert accumulate(deltas[1:]) == whole.message


def test_json_schema_outputs_validate(engine: Engine) -> None:
    """Real-world schemas, decoded as one batch; strict mode closes objects, as OpenAI's does."""
    schemas = [json.loads((SCHEMAS / name).read_text())["schema"] for name in SCHEMA_SAMPLE]
    results = engine.generate_batch([
        {"messages": [{"role": "user", "content": "Reply with a JSON object for this schema:\n"
                       + json.dumps(schema)}],
         "max_tokens": 100, "temperature": 0.8, "seed": i,
         "response_format": {"type": "json_schema",
                             "json_schema": {"name": "answer", "schema": schema, "strict": True}}}
        for i, schema in enumerate(schemas)
    ])
    finished = 0
    for schema, result in zip(schemas, results, strict=True):
        if result.finish_reason == "length":  # cut by the budget: a valid prefix, or complete
            # where closing under the budget (close_on_length) finished it on the last token
            parser = Grammar.from_json_schema(schema, strict=True).stream_parser()
            parser.feed(result.message["content"])
            assert parser.status in ("prefix", "complete")
            continue
        assert result.finish_reason == "stop", result.text
        jsonschema.validate(json.loads(result.message["content"]), schema)
        finished += 1
    assert finished >= len(schemas) - 1


def test_json_schema_for_completion_keeps_property_order(engine: Engine) -> None:
    schema = {"type": "object", "properties": {"zeta": {"type": "integer"},
                                               "alpha": {"type": "boolean"}},
              "required": ["zeta", "alpha"], "additionalProperties": False}
    result = engine.generate("A JSON object:", max_tokens=40, temperature=0.5, seed=3,
                             response_format={"type": "json_schema",
                                              "json_schema": {"schema": schema}})
    value = json.loads(result.text)
    jsonschema.validate(value, schema)
    assert list(value) == ["zeta", "alpha"]


def test_regex_choice_and_peg_formats(engine: Engine) -> None:
    results = engine.generate_batch([
        {"prompt": "My phone number is", "max_tokens": 20, "seed": 0,
         "response_format": {"type": "regex", "regex": r"[0-9]{3}-[0-9]{4}"}},
        {"messages": [{"role": "user", "content": "Is the sky blue?"}], "max_tokens": 8,
         "response_format": {"type": "choice", "choice": ["yes", "no", "maybe"]}},
        {"prompt": "Answer:", "max_tokens": 12, "seed": 1,
         "grammar": 'root = ("yes" | "no") ", " [a-z]{2,5} "."'},
    ])
    assert re.fullmatch(r"[0-9]{3}-[0-9]{4}", results[0].text)
    assert results[1].message["content"] in ("yes", "no", "maybe")
    assert re.fullmatch(r"(yes|no), [a-z]{2,5}\.", results[2].text)
    assert [r.finish_reason for r in results] == ["stop"] * 3


def test_grammar_object_and_jump_forward(engine: Engine) -> None:
    grammar = Grammar.from_peg('root = "The answer is: " [0-9]{1,2} "!"')
    result = engine.generate("Q: 2+2?", grammar=grammar, max_tokens=16, temperature=0)
    assert re.fullmatch(r"The answer is: [0-9]{1,2}!", result.text)
    # The forced prefix was appended without sampling: fewer steps than tokens.
    stream = engine.generate("Q: 2+2?", grammar=grammar, max_tokens=16, temperature=0,
                             stream=True)
    steps_before = engine.stats.steps
    assert "".join(d["text"] for d in stream) == result.text
    assert engine.stats.steps - steps_before < len(result.token_ids)


def test_unsatisfiable_within_max_tokens_ends_with_length(engine: Engine) -> None:
    """Without closing under the budget (by default such a request is a 400 naming max_tokens:
    tests/test_close_on_length.py), the output is cut at max_tokens."""
    result = engine.generate("Count:", grammar='root = ("a" | "b"){200}', max_tokens=5,
                             temperature=1.0, seed=0, close_on_length=False)
    assert result.finish_reason == "length"
    assert re.fullmatch("[ab]+", result.text)
    assert len(result.token_ids) == 5


def test_stop_strings(engine: Engine) -> None:
    result = engine.generate("1, 2, 3, 4, 5,", max_tokens=30, temperature=0, stop=[" 8", "x"])
    assert result.finish_reason == "stop"
    assert " 8" not in result.text and result.text.endswith("7,")
    stream = engine.generate("1, 2, 3, 4, 5,", max_tokens=30, temperature=0, stop=[" 8", "x"],
                             stream=True)
    assert "".join(d["text"] for d in stream) == result.text


def test_stop_strings_hold_back_partial_matches(engine: Engine) -> None:
    vocab, encode = engine.vocab, engine.backend.encode
    stops = StopStrings(["END."], vocab)
    first = encode("Hello E")
    released, tail, matched = stops.push(first)
    assert (released, tail, matched) == (first[:-1], b"", False)  # "E" may start "END."
    more, tail, matched = stops.push(encode("ND. more"))
    assert matched
    assert b"".join(vocab.token_bytes[t] for t in released + more) + tail == b"Hello "


def test_batch_mixes_requests(engine: Engine) -> None:
    chat = [{"role": "user", "content": "Say hi."}]
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0,
                                                     "maximum": 999}}, "required": ["n"]}
    batch = engine.generate_batch([
        {"prompt": "The capital of France is", "max_tokens": 6, "temperature": 0},
        {"messages": chat, "max_tokens": 10, "temperature": 0},
        {"prompt": "JSON:", "max_tokens": 60, "seed": 2, "response_format": {
            "type": "json_schema", "json_schema": {"schema": schema, "strict": True}}},
    ])
    assert batch[2].finish_reason == "stop"
    single = engine.generate("The capital of France is", max_tokens=6, temperature=0)
    assert batch[0].text == single.text
    assert batch[1].message["content"]
    jsonschema.validate(json.loads(batch[2].text), schema)


def test_a_long_prompt_decodes_in_a_cache_tier_of_its_own() -> None:
    """A prompt longer than the key/value cache's first tier goes to the tier of its length
    before its first chunk (the scheduler tells the runner its length), so the slots of the
    short requests beside it stay as long as they need; every answer is the one it gets
    alone, and the long one's tier is given back when it ends."""
    with Engine(prefix_cache=0, prewarm=False) as engine:
        long_prompt = "Fruit list: " + "apple, banana, cherry, " * 200 + "and the last one is"
        short = ["The capital of France is", "One, two, three,"]
        alone = [engine.generate(p, max_tokens=5, temperature=0).text
                 for p in [long_prompt, *short]]
        tiers = engine.scheduler.runner._tiers
        assert [tier.limit for tier in tiers] == [1024, 4096, 8192]
        assert tiers[0].time_cap == 256 and tiers[1].time_cap == 0
        batch = engine.generate_batch([{"prompt": p, "max_tokens": 5, "temperature": 0}
                                       for p in [long_prompt, *short]])
        assert batch[0].usage["prompt_tokens"] > 1024
        assert [result.text for result in batch] == alone
        assert tiers[0].time_cap == 256 and tiers[1].time_cap == 0


@pytest.mark.parametrize(("options", "param"), [
    ({"messages": []}, "messages"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}],
      "tool_choice": {"type": "function", "function": {"name": "g"}}}, "tool_choice"),
    ({"response_format": {"type": "json_schema",
                          "json_schema": {"schema": {"type": "object", "minProperties": "x"}}}},
     "response_format"),
    ({"grammar": 'root = "a"', "response_format": {"type": "json_object"}}, "grammar"),
    ({"temperature": -1}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"stop": [""]}, "stop"),
    ({"response_format": {"type": "regex", "regex": "(unclosed"}}, "response_format"),
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"grammar": "root = undefined_rule"}, "grammar"),
])
def test_bad_requests_fail_before_decoding(engine: Engine, options: dict, param: str) -> None:
    messages = options.pop("messages", [{"role": "user", "content": "hi"}])
    steps = engine.stats.steps
    with pytest.raises(InvalidRequestError) as info:
        engine.generate(messages, **options)
    assert info.value.param == param
    assert engine.stats.steps == steps


def test_completion_rejects_tools() -> None:
    with pytest.raises(InvalidRequestError):
        build_request("hi", tools=[{"type": "function", "function": {"name": "f"}}])
    with pytest.raises(InvalidRequestError):
        build_request("")


def test_missing_specials_are_spelled_and_stay_atomic(engine: Engine) -> None:
    # SmolLM2 has <|im_end|> but no <tool_call>: the model writes its spelling, which is the
    # special token wherever it appears (so never free text), for the mask and the parser.
    grammar = Grammar.from_peg('root = ([a-z<>_ ]* token("<tool_call>") "x")? token("<|im_end|>")')
    compiled = engine.compiled(grammar)
    assert compiled.lexer.spellings and "<|im_end|>" in engine.vocab.special_ids
    matcher = compiled.matcher()
    assert matcher.accept_tokens(engine.backend.encode("ab <tool_call>x"))
    assert matcher.accept_token(engine.vocab.special_ids["<|im_end|>"])
    matcher = compiled.matcher()  # the spelling cannot be text before the call
    assert not matcher.accept_tokens(engine.backend.encode("<tool_call> <tool_call>x"))


@pytest.mark.parametrize(("template", "dialect"), [
    ("Qwen-Qwen3-0.6B.jinja", "hermes"),
    ("Qwen-Qwen2.5-7B-Instruct.jinja", "hermes"),
    ("NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja", "hermes"),
    ("Qwen3-Coder.jinja", "hermes-xml"),
    ("openai-gpt-oss-120b.jinja", "harmony"),
    ("llm-jp-llm-jp-4.1-8b-thinking.jinja", "llmjp-harmony"),
    ("DeepSeek-V3.2.jinja", "dsml"),
    ("CohereForAI-c4ai-command-r-plus-tool_use.jinja", "command-r"),
])
def test_detect_dialect(template: str, dialect: str) -> None:
    text = (TEMPLATES / template).read_text()
    assert detect_dialect(text) == dialect
    assert renders_tools(text)


def test_command_r_template_renders_any_tool_and_past_calls() -> None:
    """An engine on Command R+'s template: a tool its signature macro cannot type alone (no
    descriptions, an object parameter) and a past call with arguments as JSON text render, the
    call as the model writes it."""
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {
        "type": "object", "properties": {"q": {"type": "string"}, "f": {"type": "object"}},
        "required": ["q"]}}}
    call = {"id": "c1", "type": "function",
            "function": {"name": "lookup", "arguments": '{"q": "x", "f": {"a": 1}}'}}
    messages = [{"role": "user", "content": "Go."},
                {"role": "assistant", "content": "Looking.", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "Found."}]
    engine = Engine(chat_template=(TEMPLATES / "CohereForAI-c4ai-command-r-plus-tool_use.jinja")
                    .read_text())
    assert engine.dialect_name == "command-r"
    prompt = engine.render(build_request(messages, tools=[tool]))
    engine.close()
    assert "def lookup(q: str, f: Optional[Dict[str, Any]] = None) -> List[Dict]:" in prompt
    assert ('Looking.\nAction:\n```json\n[\n    {\n        "tool_name": "lookup",\n'
            '        "parameters": {\n            "q": "x",\n            "f": {\n'
            '                "a": 1\n            }\n        }\n    }\n]```\n'
            "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|><results>\nFound.</results>") in prompt
    assert prompt.endswith("<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>")


def test_detect_dialect_says_unknown_rather_than_guess() -> None:
    assert detect_dialect("{{ messages }}") == "unknown"
    assert detect_dialect(None) == "unknown"
    engine = Engine(chat_template="{{ messages }}")  # prewarmed without a tool-call grammar
    assert engine.dialect_name == "unknown"
    engine.close()



@pytest.fixture(scope="module")
def noise_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    """`Engine(model=folder)` on a transformers folder: a tiny random Llama with SmolLM2's real
    tokenizer, saved offline. Its output is noise, which is what the grammar must contain."""
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = tmp_path_factory.mktemp("models") / "tiny"
    tokenizer = smollm2_tokenizer()
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                         max_position_embeddings=2048, eos_token_id=tokenizer.eos_token_id)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    with Engine(model=folder, dtype="float32") as engine:
        yield engine


def test_a_local_hf_folder_and_bad_model_paths(noise_engine: Engine, tmp_path: Path) -> None:
    from pegmask.engine.model import ModelNotFoundError

    assert noise_engine.model_name == "tiny" and noise_engine.dialect_name == "hermes"
    for bad in (tmp_path / "absent.gguf", tmp_path, noise_engine.backend.path / "config.json"):
        with pytest.raises(ModelNotFoundError):
            Engine(model=bad)


def test_a_corrupt_model_file_is_a_clear_error_in_the_caller(tmp_path: Path) -> None:
    """Loading runs in a passing thread (engine/model.py): its failure reaches the caller,
    naming the file."""
    from pegmask.engine.model import ModelLoadError

    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF but not really")
    with pytest.raises(ModelLoadError, match="broken.gguf could not be loaded"):
        Engine(model=broken)


NOISE_TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {
    "type": "object", "properties": {"q": {"type": "string", "maxLength": 8},
                                     "n": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["q"], "additionalProperties": False}}}


@pytest.mark.parametrize("options", [
    {"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {
        "type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
        "additionalProperties": False}}}},
    {"tools": [NOISE_TOOL], "tool_choice": "required"},
    {"tools": [NOISE_TOOL], "tool_choice": {"type": "function", "function": {"name": "lookup"}},
     "parallel_tool_calls": False},
    {"tools": [NOISE_TOOL], "tool_choice": "none"},
    {"tools": [NOISE_TOOL]},
], ids=["json_schema", "required", "named", "none", "auto"])
def test_noise_stays_inside_the_grammar(noise_engine: Engine, options: dict) -> None:
    """Random weights at temperature 1: every finished output obeys the request."""
    results = noise_engine.generate_batch([
        {"messages": [{"role": "user", "content": "Go."}], "max_tokens": 120, "seed": seed,
         "temperature": 1.0, **options} for seed in range(4)])
    choice = options.get("tool_choice", "auto" if "tools" in options else None)
    for result in results:
        calls = result.message["tool_calls"]
        if choice == "none" or choice is None:
            assert calls == []
        if result.finish_reason == "length":
            continue  # cut off: what max_tokens left open is not checked
        if "response_format" in options:
            schema = options["response_format"]["json_schema"]["schema"]
            jsonschema.validate(json.loads(result.message["content"]), schema)
            continue
        if choice in ("required", "named") or isinstance(choice, dict):
            assert calls and result.finish_reason == "tool_calls", result.text
        if isinstance(choice, dict):
            assert len(calls) == 1
        for call in calls:
            assert call["function"]["name"] == "lookup"
            jsonschema.validate(json.loads(call["function"]["arguments"]),
                                NOISE_TOOL["function"]["parameters"])


# DeepSeek R1's prompt opens <think> whatever a request's switches say, so its output starts
# inside reasoning, which a noise model never leaves (its sampling is in test_families.py).
@pytest.mark.parametrize("dialect", [name for name in dialect_names()
                                     if name not in ("hermes", "deepseek-r1")])
def test_noise_writes_every_dialects_calls(noise_engine: Engine, dialect: str) -> None:
    """The other dialects on the same model: SmolLM2's vocabulary has none of their special
    tokens, so every tag is spelled, and still each finished call is well-formed and valid.
    One call each (a noise model writes calls until max_tokens when it may write several;
    parallel calls are sampled in test_families.py), 250 tokens (spelled, Kimi K3's framing alone
    takes about 100), reasoning off as each prompt spells it."""
    with Engine(model=noise_engine.backend.path, dialect=dialect, dtype="float32") as engine:
        results = engine.generate_batch([
            {"messages": [{"role": "user", "content": "Go."}], "max_tokens": 250, "seed": seed,
             "temperature": 1.0, "tools": [NOISE_TOOL], "tool_choice": "required",
             "parallel_tool_calls": False,
             "chat_template_kwargs": {"reasoning_effort": "none", "enable_thinking": False}}
            for seed in range(3)])
    finished = [result for result in results if result.finish_reason != "length"]
    assert finished, [result.text for result in results]
    for result in finished:
        calls = result.message["tool_calls"]
        assert calls and result.finish_reason == "tool_calls", result.text
        for call in calls:
            assert call["function"]["name"] == "lookup"
            jsonschema.validate(json.loads(call["function"]["arguments"]),
                                NOISE_TOOL["function"]["parameters"])


# A chat template with tools in a format no dialect speaks and none can be derived for (calls
# as `name(arguments)`, with no marker before them).
UNKNOWN_FORMAT_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nTools: {{ tools | tojson }}. Call one as "
    "name(arguments).<|im_end|>\n{% endif %}"
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{%- for c in m.tool_calls or [] %}{{ c.function.name }}({{ c.function.arguments }})"
    "{%- endfor %}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_an_unknown_dialect_serves_plain_chats(caplog: pytest.LogCaptureFixture) -> None:
    """A template whose tool-call format no dialect claims: chats are plain text, tools a 400
    naming them, response formats still constrain the answer."""
    template = UNKNOWN_FORMAT_TEMPLATE
    with caplog.at_level("WARNING", logger="pegmask.engine"):
        engine = Engine(chat_template=template, prewarm=False)
    assert engine.dialect_name == "unknown" and engine.dialect is None
    assert "tools are refused" in caplog.text
    chat = [{"role": "user", "content": "Name a colour."}]
    result = engine.generate(chat, max_tokens=8, seed=0)
    assert result.message["tool_calls"] == [] and result.usage["completion_tokens"] > 0
    with pytest.raises(InvalidRequestError) as caught:
        engine.generate(chat, tools=[{"type": "function", "function": {"name": "f"}}])
    assert caught.value.param == "tools"
    answer = engine.generate(chat, max_tokens=8, response_format={
        "type": "choice", "choice": ["red", "green"]})
    assert answer.message["content"] in ("red", "green")
    colour = engine.generate(chat, max_tokens=24, response_format={
        "type": "json_schema", "json_schema": {"name": "c", "schema": {
            "type": "object", "properties": {"colour": {"type": "string", "maxLength": 8}},
            "required": ["colour"], "additionalProperties": False}}})
    assert set(json.loads(colour.message["content"])) == {"colour"}
    engine.close()


def test_max_model_len_bounds_prompt_and_output() -> None:
    """A prompt must leave room, and an explicit max_tokens must fit in it (vLLM's 400s); an
    unset one takes what fits."""
    engine = Engine(max_model_len=40, prewarm=False)
    long_chat = [{"role": "user", "content": "word " * 60}]
    with pytest.raises(InvalidRequestError) as caught:
        engine.generate(long_chat, max_tokens=4)
    assert caught.value.param == "messages"
    assert "maximum context length is 40 tokens. However, your request has" in str(caught.value)
    result = engine.generate("One two three", ignore_eos=True, seed=0)
    assert result.usage["total_tokens"] == 40 and result.finish_reason == "length"
    prompt = result.usage["prompt_tokens"]
    with pytest.raises(InvalidRequestError) as caught:
        engine.generate("One two three", max_tokens=500)
    assert caught.value.param == "max_tokens"
    assert str(caught.value) == (
        f"max_tokens is too large: 500. This model's maximum context length is 40 tokens and "
        f"your request has {prompt} input tokens (500 > 40 - {prompt}).")
    fits = engine.generate("One two three", max_tokens=40 - prompt, ignore_eos=True, seed=0)
    assert fits.usage["total_tokens"] == 40
    with pytest.raises(ValueError, match="max_model_len"):
        Engine(max_model_len=10**9, prewarm=False)
    engine.close()


@pytest.mark.parametrize("bounded", [True, False])
def test_the_key_value_budget_holds_requests_back_and_refuses_one_that_never_fits(
        bounded: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """With room for 300 tokens of cache, two requests that can each hold about 200 (prompt
    and max_tokens) decode one after the other, and one that can hold more than 300 is a bad
    request naming max_tokens; without a bound the two decode together."""
    token_bytes = 30 * 2 * 3 * 64 * 4  # SmolLM2's float32 keys and values, every layer
    budget = {"kv_cache_bytes": 300 * token_bytes} if bounded else {"kv_cache_bytes": None}
    with Engine(prefix_cache=0, prewarm=False, **budget) as engine:
        assert engine.runner.token_bytes == token_bytes
        assert engine.limits.kv_cache_tokens == (300 if bounded else None)
        running: list[int] = []
        step = engine.scheduler._step
        monkeypatch.setattr(engine.scheduler, "_step",
                            lambda: (running.append(engine.scheduler.running), step())[1])
        results = engine.generate_batch([{"prompt": f"Count to {k}:", "max_tokens": 190,
                                          "ignore_eos": True, "temperature": 0} for k in (5, 6)])
        assert [r.usage["completion_tokens"] for r in results] == [190, 190]
        assert max(running) == (1 if bounded else 2)
        if not bounded:
            return
        with pytest.raises(InvalidRequestError) as caught:
            engine.generate("Count to 7:", max_tokens=200, n=2)
        assert caught.value.param == "max_tokens"
        assert "can hold 4" in str(caught.value) and "at most 300" in str(caught.value)
    with pytest.raises(ValueError, match="holds no token"):
        Engine(kv_cache_bytes=100, prewarm=False)


@pytest.mark.parametrize("decode_first", [True, False])
def test_a_long_prompt_beside_a_decoding_row_takes_small_chunks_under_decode_first(
        decode_first: bool, engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 600-token prompt arrives while another request decodes: under decode_first (the
    default on a CPU) its chunks beside the decoding row are of 16 tokens (the floor; a row's
    worth beside more rows), so that row's steps stay short; without it, the first chunk is
    `prefill_chunk` long. Either way both answers are whole."""
    with Engine(prefix_cache=0, prewarm=False, decode_first=decode_first) as local:
        assert local.limits.decode_first is decode_first
        steps: list[list[int]] = []
        forward = local.runner.forward
        monkeypatch.setattr(local.runner, "forward", lambda chunks, *rest: (
            steps.append([len(tokens) for _, tokens in chunks]), forward(chunks, *rest))[1])
        first = local.generate("Once upon a time", stream=True, max_tokens=60,
                               ignore_eos=True, temperature=0)
        next(iter(first))  # decoding
        long_prompt = "Fruit list: " + "apple, banana, cherry, " * 100
        result = local.generate(long_prompt, max_tokens=3, temperature=0)
        assert sum(1 for _ in first) and first.result.usage["completion_tokens"] == 60
        assert result.usage["prompt_tokens"] > 600
        beside = [sizes for sizes in steps if len(sizes) == 2]  # the long chunk and the row
        assert beside
        assert max(max(sizes) for sizes in beside) == (16 if decode_first else 256)
    assert engine.limits.decode_first  # the default on a CPU


def test_a_step_wakes_a_request_once_after_all_its_choices_sampled(
        engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    # A consumer woken per choice would take the interpreter from the decode loop between rows.
    wakes: list[Submission] = []
    wake_all = scheduler._wake_all

    def counted(submissions: Iterable[Submission]) -> None:
        submissions = list(submissions)
        wakes.extend(submissions)
        wake_all(submissions)

    monkeypatch.setattr(scheduler, "_wake_all", counted)
    options = {"n": 3, "max_tokens": 5, "temperature": 1.0, "seed": 3, "ignore_eos": True}
    steps = engine.stats.steps
    stream = engine.generate("Once upon a time", stream=True, **options)
    deltas = list(stream)
    steps = engine.stats.steps - steps
    assert steps == 5  # the prefill step samples every choice's first token
    assert 0 < len(wakes) <= steps  # per step: three choices' events, at most one wake
    streamed = "".join(delta["text"] for delta in deltas)  # the choices' pieces interleaved
    assert sorted(streamed) == sorted("".join(c.text for c in stream.result.choices))
    assert [len(choice.token_ids) for choice in stream.result.choices] == [5, 5, 5]


def test_a_step_wakes_an_event_loop_once_for_all_its_requests(engine: Engine) -> None:
    """Requests streamed on one event loop are woken by one call into the loop per step, not
    one each (each call writes to the loop's self-pipe from the decode thread)."""
    calls: list[Any] = []

    async def consume_all() -> list[str]:
        loop = asyncio.get_running_loop()
        schedule = loop.call_soon_threadsafe

        def counted(callback: Any, *args: Any) -> Any:
            calls.append(callback)
            return schedule(callback, *args)

        loop.call_soon_threadsafe = counted  # type: ignore[method-assign]
        options = {"max_tokens": 6, "temperature": 0.0, "ignore_eos": True}
        streams = [engine.generate(prompt, stream=True, **options)
                   for prompt in ("One", "Two", "Three", "Four")]

        async def text(stream: GenerationStream) -> str:
            return "".join([delta.get("text", "") async for event in stream.aevents()
                            for delta in event.deltas])

        return await asyncio.gather(*(text(stream) for stream in streams))

    steps = engine.stats.steps
    texts = asyncio.run(consume_all())
    steps = engine.stats.steps - steps
    assert all(texts)
    assert 0 < len(calls) <= steps + 4  # a step's wake, and the end of each request
