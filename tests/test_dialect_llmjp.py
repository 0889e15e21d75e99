"""The `llmjp-harmony` dialect (LLM-jp-4.1): every output example of reference/dialects.md
section 2, parsed whole and streamed in random chunkings, as text and as the token ids the model
emits on its real SentencePiece vocabulary (a `▁` after each special token); per-request
grammars; template detection; random sampling under the token mask."""

from __future__ import annotations

import functools
import json
import random
import re
import types
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_dialect_base import (
    TOOL_CHOICES,
    TOOLS,
    assert_stream_matches,
    call_summary,
    check_calls,
    sample_tokens,
    without_ids,
)
from test_dialect_harmony import expected_accepts, harmony_tiers, message

from pegmask.bench.data import DATA
from pegmask.dialects import ChatRequest, get_dialect
from pegmask.dialects.llmjp_harmony import detect_dialect_from_template, llmjp_prompt_form

DIALECT = get_dialect("llmjp-harmony")

CHUNKINGS = settings(max_examples=6, deadline=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture])

TOKYO = ("get_weather", '{"city": "Tokyo"}')
OSAKA = ("get_weather", '{"city": "Osaka"}')


def spaced_call(name: str, arguments: str, end: str = "") -> str:
    return (f"<|start|> assistant to=functions.{name}<|channel|> commentary <|constrain|>  json"
            f"<|message|> {arguments}{end}")


# name -> (output as llama-server / vLLM show it, expected message); reference/dialects.md
EXAMPLES: dict[str, tuple[str, dict[str, Any]]] = {
    "2.3 reasoning then final": (
        "<|channel|> analysis<|message|> I'm\nthinking<|end|><|start|> assistant<|channel|> final"
        "<|message|> Hello, world!\nWhat's up?", message("Hello, world!\nWhat's up?", "I'm\nthinking")),
    "2.3 call with two spaces after <|constrain|>": (
        spaced_call("special_function", '{"arg1": 1}'),
        message(None, None, [("special_function", '{"arg1": 1}')])),
    "2.3 structured output": (
        '<|channel|> final <|constrain|>  json<|message|> {"amount": 123.45, "date": "2025-12-03"}',
        message('{"amount": 123.45, "date": "2025-12-03"}')),
    "2.3 one-space rule: a second space is content": (
        "<|channel|> final<|message|>  padded", message(" padded")),
    "2.3 one-space rule: a newline after the space is content": (
        "<|channel|> final<|message|> \nHello", message("\nHello")),
    "2.4 plain answer with reasoning": (
        "<|channel|> analysis<|message|> 東京の天気を調べる。<|end|><|start|> assistant<|channel|> final"
        "<|message|> 東京は晴れです。<|return|>", message("東京は晴れです。", "東京の天気を調べる。")),
    "2.4 first message is the call": (
        ' to=functions.get_weather<|channel|> commentary <|constrain|>  json<|message|> {"city": "大阪"}',
        message(None, None, [("get_weather", '{"city": "大阪"}')])),
    "2.4 call after reasoning": (
        "<|channel|> analysis<|message|> Two cities.<|end|>"
        + spaced_call("get_weather", '{"city": "Tokyo"}', "<|call|>"),
        message(None, "Two cities.", [TOKYO])),
    "2.4 parallel calls": (
        spaced_call("get_weather", '{"city": "Tokyo"}', "<|end|>")
        + spaced_call("get_weather", '{"city": "Osaka"}', "<|call|>"),
        message(None, None, [TOKYO, OSAKA])),
    "2.4 three calls keep their order, names with a dash": (
        "<|channel|> analysis<|message|> Look up three.<|end|>"
        + spaced_call("look-up", '{"q": "a"}', "<|end|>") + spaced_call("get_weather", '{"city": "Tokyo"}', "<|end|>")
        + spaced_call("look-up", '{"q": "c"}'),
        message(None, "Look up three.", [("look-up", '{"q": "a"}'), TOKYO, ("look-up", '{"q": "c"}')])),
    "2.4 recipient after the channel": (
        '<|channel|> commentary to=functions.get_weather <|constrain|>  json<|message|> {"city": "Tokyo"}',
        message(None, None, [TOKYO])),
    "2.3 the unspaced gpt-oss form is still accepted": (
        "<|channel|>analysis<|message|>Hmm.<|end|><|start|>assistant to=functions.get_weather"
        '<|channel|>commentary <|constrain|>json<|message|>{"city": "Tokyo"}<|call|>',
        message(None, "Hmm.", [TOKYO])),
    "2.6 preamble before the call (commentary without recipient)": (
        "<|channel|> analysis<|message|> Hmm.<|end|><|start|> assistant<|channel|> commentary"
        "<|message|> Checking.<|end|>" + spaced_call("get_weather", '{"city": "Tokyo"}'),
        message("Checking.", "Hmm.", [TOKYO])),
    "2.8 a cut-off last call is dropped, the others kept": (
        spaced_call("get_weather", '{"city": "Tokyo"}', "<|end|>")
        + spaced_call("get_weather", '{"city": "Osa'), message(None, None, [TOKYO])),
}


@pytest.mark.parametrize("name", EXAMPLES)
def test_reference_examples(name):
    output, expected = EXAMPLES[name]
    assert without_ids(DIALECT.parse(output)) == expected


@pytest.mark.parametrize("name", EXAMPLES)
@CHUNKINGS
@given(data=st.data())
def test_streaming_matches_whole_parse_for_any_chunking(name, data):
    output = EXAMPLES[name][0]
    cuts = data.draw(st.lists(st.integers(0, len(output)), max_size=8))
    assert_stream_matches(DIALECT, output, cuts)


# --------------------------------------------------------------------------- the real vocabulary
@functools.cache
def llmjp4() -> tuple[Any, Any]:
    """The LLM-jp-4 vocabulary (its SentencePiece model, with the Harmony names that
    tokenizer_config.json gives ids 0-351) and the SentencePiece processor."""
    import sentencepiece

    from pegmask.grammars.vocab import Vocabulary

    folder = DATA / "llm-jp-4-tokenizer"
    processor = sentencepiece.SentencePieceProcessor(
        model_file=str(folder / "llm-jp-tokenizer_ver4.0_alpha1.0.model"))
    config = json.loads((folder / "tokenizer_config.json").read_text())
    added = {int(i): types.SimpleNamespace(content=token["content"])
             for i, token in config["added_tokens_decoder"].items()}
    tokenizer = types.SimpleNamespace(sp_model=processor, added_tokens_decoder=added,
                                      eos_token_id=2, name_or_path="llm-jp-4")
    return Vocabulary.from_hf(tokenizer), processor


SPECIAL = re.compile(r"(<\|(?:start|channel|constrain|message|end|call|return)\|>)")


def model_tokens(output: str) -> list[int]:
    """The ids LLM-jp-4.1 writes for `output`: each text segment between special tokens is
    encoded on its own, so SentencePiece's dummy prefix puts a `▁` after every special token."""
    vocab, processor = llmjp4()
    ids: list[int] = []
    for piece in SPECIAL.split(llmjp_prompt_form(output)):
        if SPECIAL.fullmatch(piece):
            ids.append(vocab.special_ids[piece])
        elif piece:
            ids += processor.encode(piece)
    return ids


def detokenize(ids: list[int]) -> str:
    vocab, _ = llmjp4()
    return b"".join(vocab.token_bytes[i] or vocab.special_names[i].encode() for i in ids).decode()


def test_harmony_specials_are_single_ids_and_text_gets_a_leading_space():
    vocab, processor = llmjp4()
    assert {n: vocab.special_ids[n] for n in ("<|return|>", "<|constrain|>", "<|channel|>",
                                              "<|start|>", "<|end|>", "<|message|>",
                                              "<|call|>")} == {
        "<|return|>": 2, "<|constrain|>": 8, "<|channel|>": 9, "<|start|>": 10, "<|end|>": 11,
        "<|message|>": 12, "<|call|>": 13}
    assert vocab.eos_ids == (2,)
    ids = model_tokens("<|channel|>final<|message|>x")
    assert detokenize(ids) == "<|channel|> final<|message|> x"


@pytest.mark.parametrize("name", EXAMPLES)
@CHUNKINGS
@given(data=st.data())
def test_model_token_ids_parse_like_their_text(name, data):
    vocab, _ = llmjp4()
    ids = model_tokens(EXAMPLES[name][0])
    text = detokenize(ids)
    assert DIALECT.parse(ids, vocab=vocab, seed=1) == DIALECT.parse(text, seed=1)
    cuts = data.draw(st.lists(st.integers(0, len(ids)), max_size=6))
    assert_stream_matches(DIALECT, ids, cuts, vocab=vocab)


def test_model_tokens_of_a_parallel_call_parse_into_both_calls():
    vocab, _ = llmjp4()
    output = EXAMPLES["2.4 parallel calls"][0] + "<|call|>"
    assert call_summary(DIALECT.parse(model_tokens(output), vocab=vocab)) == [
        ("get_weather", {"city": "Tokyo"}), ("get_weather", {"city": "Osaka"})]


# --------------------------------------------------------------------------- templates
def test_a_template_selects_the_dialect_by_its_first_line():
    for name in ("llm-jp-llm-jp-4.1-8b-thinking.jinja",
                 "llm-jp-tokenizer-alpha_2.0-chat_template.jinja"):
        template = (DATA / "templates" / name).read_text()
        assert detect_dialect_from_template(template) == "llmjp-harmony"
    assert detect_dialect_from_template(
        (DATA / "templates" / "openai-gpt-oss-120b.jinja").read_text()) is None
    assert detect_dialect_from_template("{{ x }}\n{#- chat_format=llm-jp-harmony-v1 -#}") is None
    assert detect_dialect_from_template("{# chat_format=llm-jp-harmony-v1 #}\n") == "llmjp-harmony"


def test_render_writes_the_unspaced_form_with_parallel_calls():
    history = [
        {"role": "user", "content": "Weather in Tokyo and Osaka?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "a", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Tokyo"}'}},
            {"id": "b", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Osaka"}'}}]},
    ]
    tools = [{"type": "function", "function": {**tool["function"], "description": "Look up."}}
             for tool in TOOLS]  # the template reads every tool's description
    prompt = DIALECT.render(history, tools=tools, conversation_start_date="2025-12-01")
    assert ('<|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|> json'
            '<|message|>{"city": "Tokyo"}<|end|><|start|>assistant to=functions.get_weather'
            '<|channel|>commentary <|constrain|> json<|message|>{"city": "Osaka"}<|call|>') in prompt
    template = (DATA / "templates" / "llm-jp-llm-jp-4.1-8b-thinking.jinja").read_text()
    assert get_dialect("llmjp-harmony", chat_template=template).render(
        history, tools=tools, conversation_start_date="2025-12-01") == prompt


# --------------------------------------------------------------------------- per-request grammars
CALL_TEXT = {
    "weather": ' to=functions.get_weather<|channel|> commentary <|constrain|>  json<|message|> {"city": "Tokyo"}',
    "weather2": '<|channel|> commentary to=functions.get_weather <|constrain|>  json<|message|> {"city": "Osaka", "days": 3}',
    "time": ' to=functions.get_time<|channel|> commentary <|constrain|>  json<|message|> {"zone": "JST"}',
}


@pytest.mark.parametrize("parallel", [True, False])
@pytest.mark.parametrize("choice", range(len(TOOL_CHOICES)))
def test_request_grammar_accepts_exactly_what_the_request_allows(parallel, choice):
    request = ChatRequest(tools=TOOLS, tool_choice=TOOL_CHOICES[choice],
                          parallel_tool_calls=parallel)
    grammar = DIALECT.grammar(request)
    then = "<|end|><|start|> assistant"
    shapes = {
        "answer": ([], "<|channel|> final<|message|> Hello.", "<|return|>"),
        "one call": (["weather"], CALL_TEXT["weather"], "<|call|>"),
        "other tool": (["time"], CALL_TEXT["time"], "<|call|>"),
        "two calls": (["weather", "weather2"], CALL_TEXT["weather"] + then + CALL_TEXT["weather2"],
                      "<|call|>"),
        "mixed calls": (["weather", "time"], CALL_TEXT["weather"] + then + CALL_TEXT["time"],
                        "<|call|>"),
    }
    for thought in (True, False):
        prefix = "<|channel|> analysis<|message|> Hmm." + then if thought else ""
        for label, (calls, body, stop) in shapes.items():
            want = expected_accepts(request, calls, True, thought, not calls)
            for end in ("", stop):
                assert grammar.matches(prefix + body + end) == want, (label, prefix + body + end)
    assert not grammar.matches(' to=functions.get_time<|channel|> commentary <|constrain|>  json'
                               '<|message|> {"zone": "CET"}')


def test_runs_of_spaces_are_bounded_only_when_decoding_is_constrained():
    request = ChatRequest(tools=TOOLS, tool_choice="required")
    for spaces, constrained in ((1, True), (4, True), (5, False), (40, False)):
        text = "<|channel|>" + " " * spaces + CALL_TEXT["weather2"].removeprefix("<|channel|> ")
        assert DIALECT.grammar(request).matches(text) == constrained, spaces
        assert DIALECT.parse_grammar(request).matches(text), spaces


# --------------------------------------------------------------------------- sampling
@pytest.mark.parametrize("parallel", [True, False])
@pytest.mark.parametrize("choice", range(len(TOOL_CHOICES)))
def test_sampling_under_the_mask_yields_valid_calls(parallel, choice):
    from pegmask.grammars.compiler import compile_grammar

    vocab, _ = llmjp4()
    request = ChatRequest(tools=TOOLS, tool_choice=TOOL_CHOICES[choice],
                          parallel_tool_calls=parallel)
    compiled = compile_grammar(DIALECT.grammar(request), vocab)
    finished = 0
    for seed in range(3):
        ids = sample_tokens(compiled, random.Random(seed), 200, harmony_tiers(vocab))
        if ids is None:
            continue
        finished += 1
        for trusted in (False, True):
            check_calls(assert_stream_matches(DIALECT, ids, [seed * 7, 40], request, vocab,
                                              trusted), request)
    assert finished, "no sample ended within the token budget"
