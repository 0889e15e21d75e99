"""Native dialect renderers: byte parity with the reference renderers, nothing lost, replay."""

from __future__ import annotations

import json

import harmony_oracle
import jinja2
import pytest

from pegmask.bench.data import TEMPLATES_DIR
from pegmask.dialects import get_dialect
from pegmask.dialects.dsml import render_dsml_v4
from pegmask.dialects.history import HistoryError, normalize_history, normalize_tools
from pegmask.dialects.llmjp_harmony import llmjp_prompt_form
from pegmask.dialects.native import native_renderers, render_native, replay_text
from pegmask.dialects.replay import ReplayMemory
from pegmask.dialects.templating import render_history

TEMPLATES = TEMPLATES_DIR
DATE = "2025-06-28"

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city.\nSecond line <b>&</b>",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "City name", "examples": ["Paris"]},
                    "unit": {"type": "string", "enum": ["c", "f"], "default": "c"},
                    "days": {"type": "integer", "default": 1},
                    "opts": {
                        "type": "object",
                        "description": "Options",
                        "properties": {
                            "zz": {"type": "integer"},
                            "aa": {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "properties": {"q": {"type": "string"}},
                                },
                            },
                        },
                        "required": ["zz"],
                    },
                    "mode": {
                        "description": "A mode",
                        "oneOf": [
                            {"type": "string", "description": "named"},
                            {"type": "integer", "default": 3},
                        ],
                    },
                    "tags": {"type": "array", "items": {"type": "string"}, "nullable": True},
                    "maybe": {"type": ["string", "null"]},
                    "anything": {"type": "array"},
                },
                "required": ["city"],
            },
        },
    },
    {"type": "function", "function": {"name": "now", "description": "Current time."}},
]


def _call(call_id: str, name: str, arguments) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


TOOL_LOOP = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in 東京 and Osaka?"},
    {
        "role": "assistant",
        "content": None,
        "reasoning_content": "Two cities <&>.",
        "tool_calls": [
            _call("call_a", "get_weather", '{"city": "東京", "days": 2}'),
            _call("call_b", "get_weather", {"city": "Osaka", "opts": {"zz": 1}}),
        ],
    },
    {"role": "tool", "tool_call_id": "call_a", "content": '{"temp": 20}'},
    {"role": "tool", "tool_call_id": "call_b", "content": '22°C & "dry"'},
]
CLOSED_LOOP = TOOL_LOOP + [
    {"role": "assistant", "content": "東京 20, Osaka 22.", "reasoning_content": "Summarize."},
    {"role": "user", "content": "Thanks! Now Kyoto?"},
]
HISTORIES = {
    "plain": [{"role": "user", "content": "Hello <b>"}],
    "multi_turn_reasoning": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "Easy."},
        {"role": "user", "content": "3+3?"},
    ],
    "tool_loop": TOOL_LOOP,
    "closed_loop": CLOSED_LOOP,
    "content_before_call": [
        {"role": "user", "content": "Time?"},
        {"role": "assistant", "content": "Let me check.", "tool_calls": [_call("n1", "now", "{}")]},
        {"role": "tool", "tool_call_id": "n1", "content": "12:00"},
    ],
}


def _template(name: str) -> str:
    return (TEMPLATES / name).read_text(encoding="utf-8")


# The Qwen3-Coder template raises on a tool without parameters: `now` gets an empty object there.
NOW = {"type": "object", "properties": {}}
CODER_TOOLS = [
    TOOLS[0],
    {"type": "function", "function": {**TOOLS[1]["function"], "parameters": NOW}},
]
# Schema keys and values the Qwen3-Coder template writes each in its own way.
XML_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "edit",
            "description": "  Edit a file.\n",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {
                        "type": "string",
                        "description": " Path ",
                        "enum": ["a.py"],
                        "x-order": 1,
                        "min length": 0,
                        "$comment": "c",
                        "title": None,
                        "": "skipped",
                        "required": ["z", 3],
                    },
                    "flag": {"type": "boolean", "default": False},
                    "ratio": {
                        "type": ["number", "null"],
                        "default": 0.5,
                        "nested": {"a": [1, "é"]},
                    },
                    "free": True,
                },
                "required": ["path", "flag"],
            },
            "return": {"type": "string"},
        },
    },
    {"type": "function", "function": {"name": "ping", "parameters": NOW, "return": "nothing"}},
]
XML_HISTORIES = {
    "typed_values": [
        {"role": "system", "content": ""},
        {"role": "user", "content": "Edit it"},
        {
            "role": "assistant",
            "content": "  \n Editing now.\n ",
            "tool_calls": [
                _call(
                    "e1",
                    "edit",
                    {
                        "path": "a b.py",
                        "flag": True,
                        "ratio": None,
                        "list": [1, "x", {"k": False}],
                        "f": 1.5,
                        "multi": "line1\nline2\n",
                    },
                ),
                _call("e2", "ping", None),
            ],
        },
        {"role": "tool", "tool_call_id": "e1", "content": "ok"},
        {"role": "tool", "tool_call_id": "e2", "content": ""},
        {"role": "assistant", "content": "<think>\nhm\n</think>\n\ndone "},
        {"role": "system", "content": "Later rule."},
        {"role": "user", "content": "<tool_response>x</tool_response>"},
    ],
}


# --------------------------------------------------------------------------------------------
# Byte parity with each dialect's reference
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("history", sorted(HISTORIES))
def test_hermes_matches_the_qwen3_template(history: str):
    template = _template("Qwen-Qwen3-0.6B.jinja")
    messages = HISTORIES[history]
    for tools in (None, TOOLS):
        for add_generation_prompt in (True, False):
            for enable_thinking in (True, False):
                expected = render_history(
                    template,
                    messages,
                    tools,
                    add_generation_prompt,
                    enable_thinking=enable_thinking,
                )
                got = render_native(
                    "hermes",
                    messages,
                    tools,
                    add_generation_prompt,
                    enable_thinking=enable_thinking,
                )
                assert got == expected


@pytest.mark.parametrize("history", sorted(HISTORIES) + sorted(XML_HISTORIES))
def test_hermes_xml_matches_the_qwen3_coder_template(history: str):
    template = _template("Qwen3-Coder.jinja")
    messages = HISTORIES.get(history) or XML_HISTORIES[history]
    for tools in (None, CODER_TOOLS, XML_TOOLS):
        for add_generation_prompt in (True, False):
            expected = render_history(template, messages, tools, add_generation_prompt)
            got = render_native("hermes-xml", messages, tools, add_generation_prompt)
            assert got == expected


def test_hermes_xml_where_the_template_fails():
    template = _template("Qwen3-Coder.jinja")
    with pytest.raises(jinja2.UndefinedError):  # `now` has no parameters
        render_history(template, TOOL_LOOP, TOOLS)
    assert render_native("hermes-xml", TOOL_LOOP, TOOLS) == render_native(
        "hermes-xml", TOOL_LOOP, CODER_TOOLS
    )
    # the template would leave a first result outside any turn
    first = [{"role": "tool", "tool_call_id": "q", "content": "r"}]
    assert render_native("hermes-xml", first, add_generation_prompt=False) == (
        "<|im_start|>user\n<tool_response>\nr\n</tool_response>\n<|im_end|>\n"
    )


def test_hermes_xml_is_the_dialect_default():
    messages = HISTORIES["tool_loop"]
    assert get_dialect("hermes-xml").render(messages, CODER_TOOLS) == render_native(
        "hermes-xml", messages, CODER_TOOLS
    )
    template = _template("Qwen3-Coder.jinja")
    dialect = get_dialect("hermes-xml", chat_template=template)
    assert dialect.render(HISTORIES["plain"], CODER_TOOLS) == render_native(
        "hermes-xml", HISTORIES["plain"], CODER_TOOLS
    )


@pytest.mark.parametrize(
    ("template_file", "keep"),
    [
        ("llm-jp-llm-jp-4.1-8b-thinking.jinja", True),
        ("llm-jp-tokenizer-alpha_2.0-chat_template.jinja", False),
    ],
)
@pytest.mark.parametrize("history", sorted(HISTORIES))
def test_llmjp_matches_its_templates(template_file: str, keep: bool, history: str):
    template = _template(template_file)
    messages = HISTORIES[history]
    for tools in (None, TOOLS):
        for add_generation_prompt in (True, False):
            expected = render_history(
                template, messages, tools, add_generation_prompt, conversation_start_date=DATE
            )
            got = render_native(
                "llmjp-harmony",
                messages,
                tools,
                add_generation_prompt,
                conversation_start_date=DATE,
                keep_tool_loop_reasoning=keep,
            )
            assert got == expected


def test_continue_final_message_matches_the_templates():
    messages = [
        {"role": "user", "content": "Write a haiku"},
        {"role": "assistant", "content": "Autumn moon", "reasoning_content": "A poem."},
    ]
    qwen3 = render_history(
        _template("Qwen-Qwen3-0.6B.jinja"),
        messages,
        add_generation_prompt=False,
        continue_final_message=True,
    )
    assert (
        render_native("hermes", messages, add_generation_prompt=False, continue_final_message=True)
        == qwen3
    )
    llmjp = render_history(
        _template("llm-jp-llm-jp-4.1-8b-thinking.jinja"),
        messages,
        add_generation_prompt=False,
        continue_final_message=True,
        conversation_start_date=DATE,
    )
    got = render_native(
        "llmjp-harmony",
        messages,
        add_generation_prompt=False,
        continue_final_message=True,
        conversation_start_date=DATE,
    )
    assert got == llmjp
    coder = render_history(
        _template("Qwen3-Coder.jinja"),
        messages,
        add_generation_prompt=False,
        continue_final_message=True,
    )
    assert (
        render_native(
            "hermes-xml", messages, add_generation_prompt=False, continue_final_message=True
        )
        == coder
    )
    for dialect in ("harmony", "dsml", "dsml-v4"):
        prompt = render_native(
            dialect, messages, add_generation_prompt=False, continue_final_message=True
        )
        assert prompt.endswith("Autumn moon")
    with pytest.raises(ValueError):
        render_native(
            "hermes", messages[:1], add_generation_prompt=False, continue_final_message=True
        )
    with pytest.raises(ValueError):
        render_native("hermes", messages, add_generation_prompt=True, continue_final_message=True)


@pytest.fixture(scope="module")
def harmony_encoding():
    """openai-harmony, offline (see tests/harmony_oracle.py)."""
    import openai_harmony

    return openai_harmony, harmony_oracle.harmony_encoding()


def _harmony_reference(harmony, encoding, messages, tools, *, auto_drop: bool) -> str:
    """The same conversation built with openai-harmony's own types and rendered by it."""
    h = harmony
    history = normalize_history(messages).messages
    system = h.SystemContent.new().with_conversation_start_date(DATE)
    convo = [h.Message.from_role_and_content(h.Role.SYSTEM, system)]
    developer = h.DeveloperContent.new()
    if history[0].role == "system":
        developer = developer.with_instructions(history[0].content)
        history = history[1:]
    if tools:
        developer = developer.with_function_tools(
            [
                h.ToolDescription.new(
                    t["function"]["name"],
                    t["function"].get("description", ""),
                    parameters=t["function"].get("parameters"),
                )
                for t in normalize_tools(tools)
            ]
        )
    if developer.instructions or tools:
        convo.append(h.Message.from_role_and_content(h.Role.DEVELOPER, developer))
    for i, message in enumerate(history):
        if message.role == "user":
            convo.append(h.Message.from_role_and_content(h.Role.USER, message.content))
        elif message.role == "tool":
            author = h.Author.new(h.Role.TOOL, f"functions.{message.name}")
            convo.append(
                h.Message.from_author_and_content(author, message.content)
                .with_channel("commentary")
                .with_recipient("assistant")
            )
        elif message.tool_calls:
            later_final = any(m.role == "assistant" and not m.tool_calls for m in history[i + 1 :])
            analysis = message.reasoning or message.content
            if analysis and (auto_drop or not later_final):
                convo.append(
                    h.Message.from_role_and_content(h.Role.ASSISTANT, analysis).with_channel(
                        "analysis"
                    )
                )
            for call in message.tool_calls:
                convo.append(
                    h.Message.from_role_and_content(h.Role.ASSISTANT, call.arguments_json)
                    .with_channel("commentary")
                    .with_recipient(f"functions.{call.name}")
                    .with_content_type("<|constrain|>json")
                )
        else:
            convo.append(
                h.Message.from_role_and_content(h.Role.ASSISTANT, message.content).with_channel(
                    "final"
                )
            )
    config = h.RenderConversationConfig(auto_drop_analysis=auto_drop)
    tokens = encoding.render_conversation_for_completion(
        h.Conversation.from_messages(convo), h.Role.ASSISTANT, config
    )
    return encoding.decode_utf8(tokens)


@pytest.mark.parametrize("history", sorted(HISTORIES))
def test_harmony_matches_openai_harmony(harmony_encoding, history: str):
    harmony, encoding = harmony_encoding
    messages = HISTORIES[history]
    for tools in (None, TOOLS):
        expected = _harmony_reference(harmony, encoding, messages, tools, auto_drop=False)
        assert render_native("harmony", messages, tools, conversation_start_date=DATE) == expected


def test_harmony_drops_analysis_once_a_final_answer_exists(harmony_encoding):
    harmony, encoding = harmony_encoding
    expected = _harmony_reference(harmony, encoding, CLOSED_LOOP, TOOLS, auto_drop=True)
    prompt = render_native("harmony", CLOSED_LOOP, TOOLS, conversation_start_date=DATE)
    assert prompt == expected
    assert "Two cities" not in prompt and "Two cities" in render_native("harmony", TOOL_LOOP, TOOLS)


# --------------------------------------------------------------------------------------------
# DeepSeek DSML: the reference encoders' bytes (reference/dialects.md §4)
# --------------------------------------------------------------------------------------------

DSML_DOC = [
    {"role": "system", "content": "You are helpful."},
    {"role": "user", "content": "What's the weather in Tokyo and Osaka?"},
    {
        "role": "assistant",
        "content": "",
        "reasoning_content": "Need weather for two cities.",
        "tool_calls": [
            _call("t1", "get_weather", '{"city": "Tokyo", "days": 3}'),
            _call("t2", "get_weather", '{"city": "Osaka", "days": 3}'),
        ],
    },
    {"role": "tool", "tool_call_id": "t1", "content": '{"temp": 20}'},
    {"role": "tool", "tool_call_id": "t2", "content": '{"temp": 22}'},
]
DSML_PROMPT = "<｜begin▁of▁sentence｜>You are helpful.<｜User｜>What's the weather in Tokyo and Osaka?<｜Assistant｜><think>"
DSML_OUTPUT = (
    'Need weather for two cities.</think>\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name="get_weather">\n'
    '<｜DSML｜parameter name="city" string="true">Tokyo</｜DSML｜parameter>\n'
    '<｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>\n</｜DSML｜invoke>\n'
    '<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">Osaka</｜DSML｜parameter>\n'
    '<｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>\n</｜DSML｜invoke>\n'
    "</｜DSML｜function_calls><｜end▁of▁sentence｜>"
)
DSML_RESULTS = '\n\n<function_results>\n<result>{"temp": 20}</result>\n<result>{"temp": 22}</result>\n</function_results>\n\n<think>'


def test_dsml_v32_reference_bytes():
    assert render_native("dsml", DSML_DOC[:2]) == DSML_PROMPT
    assert render_native("dsml-v3.2", DSML_DOC) == DSML_PROMPT + DSML_OUTPUT + DSML_RESULTS
    swapped = DSML_DOC[:3] + [DSML_DOC[4], DSML_DOC[3]]  # results come back in call order
    assert render_native("dsml", swapped) == DSML_PROMPT + DSML_OUTPUT + DSML_RESULTS
    chat = render_native("dsml", DSML_DOC, enable_thinking=False)
    assert chat.startswith(
        DSML_PROMPT.replace("<think>", "</think>") + "\n\n<｜DSML｜function_calls>"
    )
    assert chat.endswith("</function_results>\n\n</think>")


def test_dsml_v32_tools_and_history():
    prompt = render_native("dsml", CLOSED_LOOP, TOOLS)
    head = "<｜begin▁of▁sentence｜>Be brief.\n\n## Tools\nYou have access to a set of tools"
    assert prompt.startswith(head)
    assert "<functions>\n" + json.dumps(TOOLS[0]["function"], ensure_ascii=False) + "\n" in prompt
    # the first turn is before the last user message: no thinking part, no reasoning
    assert "Two cities" not in prompt and "Summarize" not in prompt
    assert prompt.endswith("<｜User｜>Thanks! Now Kyoto?<｜Assistant｜><think>")
    assert render_native("dsml", [{"role": "user", "content": "x"}], TOOLS).startswith(
        "<｜begin▁of▁sentence｜>\n\n## Tools"
    )
    with pytest.raises(HistoryError):
        render_native(
            "dsml",
            [
                {"role": "user", "content": "x"},
                {"role": "tool", "tool_call_id": "q", "content": "r"},
            ],
        )


def test_dsml_v4_reference_bytes():
    prompt = render_native("dsml-v4", DSML_DOC, TOOLS)
    assert prompt.startswith(
        "<｜begin▁of▁sentence｜>You are helpful.\n\n## Tools\n\nYou have access"
    )
    turn = DSML_PROMPT.removeprefix("<｜begin▁of▁sentence｜>You are helpful.") + DSML_OUTPUT
    assert turn.replace("function_calls", "tool_calls") in prompt
    assert "function_calls" not in prompt
    assert prompt.endswith(
        '</｜DSML｜tool_calls><｜end▁of▁sentence｜><｜User｜><tool_result>{"temp": 20}</tool_result>\n\n'
        '<tool_result>{"temp": 22}</tool_result><｜Assistant｜><think>'
    )


def test_dsml_v4_orders_results_by_call_and_keeps_user_text_in_place():
    messages = DSML_DOC[:3] + [
        {"role": "tool", "tool_call_id": "t2", "content": "OSAKA"},
        {"role": "user", "content": "(also: hurry)"},
        {"role": "tool", "tool_call_id": "t1", "content": "TOKYO"},
    ]
    prompt = render_dsml_v4(messages)
    assert prompt.endswith(
        "<｜User｜><tool_result>TOKYO</tool_result>\n\n(also: hurry)\n\n<tool_result>OSAKA</tool_result><｜Assistant｜><think>"
    )
    anthropic = [
        {"role": "user", "content": "What's the weather in Tokyo and Osaka?"},
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Tokyo"}},
                {"type": "tool_use", "id": "t2", "name": "get_weather", "input": {"city": "Osaka"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t2", "content": "OSAKA"},
                {"type": "text", "text": "(also: hurry)"},
                {"type": "tool_result", "tool_use_id": "t1", "content": "TOKYO"},
            ],
        },
    ]
    assert render_dsml_v4(anthropic).endswith(
        "<tool_result>TOKYO</tool_result>\n\n(also: hurry)\n\n<tool_result>OSAKA</tool_result><｜Assistant｜><think>"
    )


def test_dsml_v4_thinking_rules():
    no_tools = [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "Easy."},
        {"role": "user", "content": "3+3?"},
    ]
    dropped = render_native("dsml-v4", no_tools)
    assert dropped == (
        "<｜begin▁of▁sentence｜><｜User｜>2+2?<｜Assistant｜></think>4<｜end▁of▁sentence｜>"
        "<｜User｜>3+3?<｜Assistant｜><think>"
    )
    kept = render_native("dsml-v4", no_tools, TOOLS)  # with tools, reasoning is never dropped
    assert "<｜Assistant｜><think>Easy.</think>4<｜end▁of▁sentence｜>" in kept
    chat = render_native("dsml-v4", no_tools, enable_thinking=False)
    assert chat.endswith("<｜User｜>3+3?<｜Assistant｜></think>") and "Easy" not in chat
    effort = render_native("dsml-v4", no_tools, reasoning_effort="max")
    assert effort.startswith("<｜begin▁of▁sentence｜>Reasoning Effort: Absolute maximum")


# --------------------------------------------------------------------------------------------
# Tool history never disappears and is never double-encoded
# --------------------------------------------------------------------------------------------

DIALECTS = ["hermes", "hermes-xml", "harmony", "llmjp-harmony", "dsml", "dsml-v4"]


@pytest.mark.parametrize("dialect", DIALECTS)
def test_every_call_and_result_reaches_the_prompt_once_encoded(dialect: str):
    prompt = render_native(dialect, TOOL_LOOP, TOOLS)
    assert "東京" in prompt and "Osaka" in prompt
    assert '\\"city' not in prompt  # arguments are never a JSON string of JSON
    if dialect != "llmjp-harmony":  # LLM-jp's results are JSON string literals, as trained
        assert '"{' not in prompt
    # live tool-loop reasoning is kept, except by Qwen3-Coder, which never shows reasoning
    assert ("Two cities <&>." in prompt) == (dialect != "hermes-xml")
    for result in ('{"temp": 20}', '22°C & "dry"'):
        if dialect == "llmjp-harmony":
            result = json.dumps(result, ensure_ascii=False)
        assert result in prompt
    assert prompt.count("get_weather") >= 2 + (1 if dialect.startswith("dsml") else 0)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_malformed_arguments_are_kept_verbatim(dialect: str):
    messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "", "tool_calls": [_call("m", "now", '{"tz": "Asia/Tok')]},
        {"role": "tool", "tool_call_id": "m", "content": "error: bad json"},
    ]
    prompt = render_native(dialect, messages, TOOLS)
    assert '{"tz": "Asia/Tok' in prompt
    if dialect.startswith("dsml"):
        assert (
            '<｜DSML｜parameter name="arguments" string="true">{"tz": "Asia/Tok</｜DSML｜parameter>'
            in prompt
        )
    if dialect == "hermes-xml":  # the raw text stands for the parameters, as in hermes
        assert '<function=now>\n{"tz": "Asia/Tok\n</function>' in prompt


def test_the_gpt_oss_template_loses_what_the_native_renderer_keeps():
    gpt_oss = render_history(_template("openai-gpt-oss-120b.jinja"), TOOL_LOOP, TOOLS)
    native = render_native("harmony", TOOL_LOOP, TOOLS)
    assert '"city": "Osaka"' not in gpt_oss  # only the first call of a turn survives
    assert '"city": "Osaka"' in native and native.count("<|call|>") == 2
    raw = [dict(m) for m in TOOL_LOOP]
    from pegmask.dialects.templating import render_chat_template

    double = render_chat_template(_template("openai-gpt-oss-120b.jinja"), raw, TOOLS, True)
    assert (
        '"{\\"city\\": \\"東京\\"' in double
    )  # what clients sending strings get from the template


def test_tool_result_without_a_call_is_an_error_for_harmony():
    orphan = [
        {"role": "user", "content": "x"},
        {"role": "tool", "tool_call_id": "nope", "content": "r"},
    ]
    with pytest.raises(HistoryError):
        render_native("harmony", orphan)
    named = [
        {"role": "user", "content": "x"},
        {"role": "tool", "tool_call_id": "nope", "name": "f", "content": "r"},
    ]
    assert "<|start|>functions.f to=assistant" in render_native("harmony", named)


def test_unknown_dialect():
    with pytest.raises(ValueError, match="unknown dialect"):
        render_native("chatml", [{"role": "user", "content": "x"}])


# --------------------------------------------------------------------------------------------
# Replay of generated turns
# --------------------------------------------------------------------------------------------

GENERATED = {
    "hermes": '<tool_call>\n{"name": "get_weather", "arguments": {"city":"東京","days":2}}\n</tool_call>\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Osaka", "opts": {"zz": 1}}}\n</tool_call>',
    "hermes-xml": 'Two  cities\n<tool_call>\n<function=get_weather>\n<parameter=city>\n東京\n</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n<parameter=city>\nOsaka\n</parameter>\n<parameter=opts>\n{"zz": 1}\n</parameter>\n</function>\n</tool_call>',
    "harmony": '<|channel|>analysis<|message|>Two  cities<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>{"city":"東京","days":2}<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>{"city":"Osaka","opts":{"zz":1}}',
    "llmjp-harmony": '<|channel|>analysis<|message|>Two  cities<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|> json<|message|>{"city":"東京","days":2}<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|> json<|message|>{"city":"Osaka","opts":{"zz":1}}',
    "dsml": 'Two  cities</think>\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">東京</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>',
    "dsml-v4": 'Two  cities</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">東京</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>',
}
FRAMES = {
    "hermes": ("<|im_start|>assistant\n<think>\n", "<|im_end|>\n"),
    "hermes-xml": ("<|im_start|>assistant\n", "<|im_end|>\n"),
    "harmony": ("<|start|>assistant", "<|call|>"),
    "llmjp-harmony": ("<|start|>assistant", "<|call|>"),
    "dsml": ("<｜Assistant｜><think>", "<｜end▁of▁sentence｜>"),
    "dsml-v4": ("<｜Assistant｜><think>", "<｜end▁of▁sentence｜>"),
}


@pytest.mark.parametrize("dialect", DIALECTS)
def test_replay_restores_the_generated_bytes(dialect: str):
    calls = normalize_history(TOOL_LOOP).messages[2].tool_calls
    prompt = render_native(dialect, TOOL_LOOP[:2], TOOLS)
    text = replay_text(
        dialect, prompt + ("<think>\n" if dialect == "hermes" else ""), GENERATED[dialect]
    )
    memory = ReplayMemory()
    memory.remember(calls, text)
    replayed = render_native(dialect, TOOL_LOOP, TOOLS, replay=memory)
    head, tail = FRAMES[dialect]
    assert head + GENERATED[dialect] + tail in replayed
    assert replayed.startswith(prompt.removesuffix("<|start|>assistant"))  # the prefix is unchanged
    rebuilt = render_native(dialect, TOOL_LOOP, TOOLS)
    assert "Two  cities" not in rebuilt

    edited = [dict(m) for m in TOOL_LOOP]
    edited[2] = dict(
        edited[2],
        tool_calls=[
            _call("call_a", "get_weather", '{"city": "Nara"}'),
            TOOL_LOOP[2]["tool_calls"][1],
        ],
    )
    assert render_native(dialect, edited, TOOLS, replay=memory) == render_native(
        dialect, edited, TOOLS
    )

    small = ReplayMemory(max_entries=1)
    small.remember(calls, text)
    small.remember([{"id": "other", "function": {"name": "now", "arguments": "{}"}}], "evicts it")
    assert render_native(dialect, TOOL_LOOP, TOOLS, replay=small) == rebuilt


@pytest.mark.parametrize("dialect", ["hermes", "hermes-xml"])
def test_replay_only_applies_to_the_live_tool_loop(dialect: str):
    calls = normalize_history(TOOL_LOOP).messages[2].tool_calls
    memory = ReplayMemory()
    memory.remember(calls, "<think>\nold reasoning\n</think>\n\n" + GENERATED[dialect])
    assert "old reasoning" in render_native(dialect, TOOL_LOOP, TOOLS, replay=memory)
    closed = render_native(dialect, CLOSED_LOOP, TOOLS, replay=memory)
    assert closed == render_native(dialect, CLOSED_LOOP, TOOLS)


def test_replay_text_takes_the_turn_from_the_prompt():
    assert (
        replay_text(
            "hermes",
            "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
            "hi",
        )
        == "<think>\n\n</think>\n\nhi"
    )
    assert (
        replay_text(
            "harmony", "...<|start|>user<|message|>x<|end|><|start|>assistant", "<|channel|>final"
        )
        == "<|channel|>final"
    )
    assert (
        replay_text("hermes-xml", "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n", "hi")
        == "hi"
    )
    assert replay_text("dsml", "<｜User｜>x<｜Assistant｜><think>", "r</think>y") == "r</think>y"
    with pytest.raises(ValueError):
        replay_text("hermes", "no header", "x")
    with pytest.raises(ValueError):
        replay_text("nope", "", "x")


def test_llmjp_prompt_form_removes_one_tokenizer_space_per_special_token():
    decoded = (
        "<|channel|> analysis<|message|>  two<|end|><|start|> assistant to=functions.f<|channel|> commentary "
        '<|constrain|>  json<|message|> {"a": 1}'
    )
    assert llmjp_prompt_form(decoded) == (
        "<|channel|>analysis<|message|> two<|end|><|start|>assistant to=functions.f<|channel|>commentary "
        '<|constrain|> json<|message|>{"a": 1}'
    )
    assert llmjp_prompt_form("plain text") == "plain text"


@pytest.mark.parametrize("dialect", sorted(native_renderers()))
def test_template_variables_a_renderer_does_not_read_are_ignored(dialect: str) -> None:
    """As a chat template ignores variables it never reads (a request's reasoning_effort
    reaches Hermes too)."""
    messages = [{"role": "user", "content": "Hi"}]
    assert render_native(dialect, messages, None, True, reasoning_effort="low",
                         some_flag=True) == render_native(dialect, messages, None, True,
                                                          reasoning_effort="low")


# --------------------------------------------------------------------------------------------
# DeepSeek R1: its template's turns, tools declared in the system prompt
# --------------------------------------------------------------------------------------------

R1_TEMPLATE = "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja"


@pytest.mark.parametrize("history", ["plain", "multi_turn_reasoning"])
def test_deepseek_r1_matches_its_template_without_tools(history: str):
    messages = HISTORIES[history]
    expected = render_history(_template(R1_TEMPLATE), messages, add_generation_prompt=True,
                              bos_token="<｜begin▁of▁sentence｜>")
    assert render_native("deepseek-r1", messages) == expected
    assert get_dialect("deepseek-r1").render(messages) == expected


def test_deepseek_r1_declares_tools_and_writes_calls_it_reads_back():
    prompt = render_native("deepseek-r1", TOOL_LOOP, TOOLS)
    assert prompt.startswith("<｜begin▁of▁sentence｜>Be brief.\n\nYou are a helpful assistant")
    assert prompt.count("```json\n{\"type\": \"function\"") == len(TOOLS)
    assert prompt.endswith("<｜tool▁outputs▁end｜><｜Assistant｜><think>\n")
    assert "Two cities" not in prompt  # R1's history drops reasoning
    turn = prompt.split("<｜Assistant｜>")[1].split("<｜tool▁outputs▁begin｜>")[0]
    parsed = get_dialect("deepseek-r1", reasoning=False).parse(turn)
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"]))
            for c in parsed["tool_calls"]] == [
        ("get_weather", {"city": "東京", "days": 2}),
        ("get_weather", {"city": "Osaka", "opts": {"zz": 1}})]
    assert '<｜tool▁output▁begin｜>{"temp": 20}<｜tool▁output▁end｜>\n' in prompt


def test_deepseek_r1_replays_the_generated_turn():
    calls = normalize_history(TOOL_LOOP).messages[2].tool_calls
    generated = ("Two  cities\n</think>\n\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function"
                 "<｜tool▁sep｜>get_weather\n```json\n{\"city\":\"東京\",\"days\":2}\n```"
                 "<｜tool▁call▁end｜><｜tool▁calls▁end｜>")
    prompt = render_native("deepseek-r1", TOOL_LOOP[:2], TOOLS)
    memory = ReplayMemory()
    memory.remember(calls, replay_text("deepseek-r1", prompt, generated))
    replayed = render_native("deepseek-r1", TOOL_LOOP, TOOLS, replay=memory)
    assert "<｜Assistant｜><think>\n" + generated + "<｜end▁of▁sentence｜>" in replayed
    assert replayed.startswith(prompt.removesuffix("<｜Assistant｜><think>\n"))
