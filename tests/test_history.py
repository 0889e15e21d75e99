"""The three request APIs normalize into one structured history."""

from __future__ import annotations

import pytest

from pegmask.dialects.history import (
    HistoryError,
    Message,
    ToolCall,
    from_anthropic,
    from_chat_completions,
    from_responses,
    normalize_history,
    normalize_tools,
    parse_arguments,
)

# One conversation, written in each API's own shape.
CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Tokyo and Osaka?"},
    {
        "role": "assistant",
        "content": "Checking.",
        "reasoning_content": "Two cities.",
        "tool_calls": [
            {
                "id": "t1",
                "type": "function",
                "function": {"name": "weather", "arguments": '{"city": "Tokyo"}'},
            },
            {
                "id": "t2",
                "type": "function",
                "function": {"name": "weather", "arguments": '{"city": "Osaka"}'},
            },
        ],
    },
    {"role": "tool", "tool_call_id": "t1", "content": "20C"},
    {"role": "tool", "tool_call_id": "t2", "content": "22C"},
    {"role": "assistant", "content": "Tokyo 20C, Osaka 22C."},
]
RESPONSES = [
    {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": "Weather in Tokyo and Osaka?"}],
    },
    {
        "type": "reasoning",
        "id": "rs_1",
        "summary": [{"type": "summary_text", "text": "Two cities."}],
    },
    {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "Checking."}],
    },
    {"type": "function_call", "call_id": "t1", "name": "weather", "arguments": '{"city": "Tokyo"}'},
    {"type": "function_call", "call_id": "t2", "name": "weather", "arguments": '{"city": "Osaka"}'},
    {"type": "function_call_output", "call_id": "t1", "output": "20C"},
    {"type": "function_call_output", "call_id": "t2", "output": "22C"},
    {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "Tokyo 20C, Osaka 22C."}],
    },
]
ANTHROPIC = [
    {"role": "user", "content": "Weather in Tokyo and Osaka?"},
    {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "Two cities.", "signature": "sig"},
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "t1", "name": "weather", "input": {"city": "Tokyo"}},
            {"type": "tool_use", "id": "t2", "name": "weather", "input": {"city": "Osaka"}},
        ],
    },
    {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": "20C"},
            {
                "type": "tool_result",
                "tool_use_id": "t2",
                "content": [{"type": "text", "text": "22C"}],
            },
        ],
    },
    {"role": "assistant", "content": [{"type": "text", "text": "Tokyo 20C, Osaka 22C."}]},
]

EXPECTED = [
    Message("system", "Be brief."),
    Message("user", "Weather in Tokyo and Osaka?"),
    Message(
        "assistant",
        "Checking.",
        reasoning="Two cities.",
        tool_calls=[
            ToolCall("t1", "weather", {"city": "Tokyo"}),
            ToolCall("t2", "weather", {"city": "Osaka"}),
        ],
    ),
    Message("tool", "20C", tool_call_id="t1", name="weather"),
    Message("tool", "22C", tool_call_id="t2", name="weather"),
    Message("assistant", "Tokyo 20C, Osaka 22C."),
]


def _strip_parts(messages: list[Message]) -> list[Message]:
    for message in messages:
        message.parts = None
    return messages


def test_three_apis_give_the_same_history():
    assert from_chat_completions(CHAT).messages == EXPECTED
    assert _strip_parts(from_responses(RESPONSES, instructions="Be brief.").messages) == EXPECTED
    assert _strip_parts(from_anthropic(ANTHROPIC, system="Be brief.").messages) == EXPECTED
    assert normalize_history(CHAT).messages == EXPECTED
    assert _strip_parts(normalize_history(RESPONSES, instructions="Be brief.").messages) == EXPECTED
    assert _strip_parts(normalize_history(ANTHROPIC, system="Be brief.").messages) == EXPECTED


def test_arguments_are_objects_or_the_raw_text():
    assert parse_arguments('{"a": [1, {"b": null}]}') == {"a": [1, {"b": None}]}
    assert parse_arguments({"x": 1}) == {"x": 1}
    assert parse_arguments('{"city": "Tok') == '{"city": "Tok'  # malformed: kept verbatim
    assert parse_arguments("[1, 2]") == "[1, 2]"  # valid JSON but not an object
    assert parse_arguments('"just text"') == '"just text"'
    assert parse_arguments(["not", "an object"]) == '["not", "an object"]'
    assert parse_arguments(None) == {} and parse_arguments("  ") == {}
    call = ToolCall("i", "f", '{"city": "Tok')
    assert call.arguments_json == '{"city": "Tok'
    assert ToolCall("i", "f", {"city": "東京"}).arguments_json == '{"city": "東京"}'


def test_chat_completions_details():
    history = from_chat_completions(
        [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "a"},
                    {"type": "image_url", "image_url": {"url": "u"}},
                    {"type": "text", "text": "b"},
                ],
            },
            {"role": "assistant", "content": "", "tool_calls": []},
            {
                "role": "assistant",
                "content": None,
                "reasoning": "r",
                "tool_calls": [
                    {
                        "id": "x",
                        "type": "function",
                        "function": {"name": "f", "arguments": "not json"},
                    },
                    {"id": "y", "type": "function", "function": {"name": "g", "arguments": ""}},
                ],
            },
            {"role": "tool", "content": "first"},  # no id: the first unanswered call
            {
                "role": "tool",
                "tool_call_id": "y",
                "name": "wrong",
                "content": [{"type": "text", "text": "second"}],
            },
            {
                "role": "assistant",
                "content": None,
                "function_call": {"name": "legacy", "arguments": '{"k": 1}'},
            },
            {"role": "function", "name": "legacy", "content": "legacy result"},
        ]
    )
    user, empty, calls, first, second, legacy, legacy_result = history.messages
    assert user.content == "a\nb" and user.parts[1]["type"] == "image_url"
    assert empty.tool_calls == []
    assert calls.reasoning == "r" and calls.content == ""
    assert calls.tool_calls == [ToolCall("x", "f", "not json"), ToolCall("y", "g", {})]
    assert (first.tool_call_id, first.name, first.content) == ("x", "f", "first")
    assert (second.tool_call_id, second.name, second.content) == ("y", "g", "second")
    assert legacy.tool_calls[0].name == "legacy" and legacy.tool_calls[0].arguments == {"k": 1}
    assert legacy_result.tool_call_id == legacy.tool_calls[0].id
    assert history.result_for("x") is first
    assert set(history.calls()) == {"x", "y", legacy.tool_calls[0].id}
    with pytest.raises(HistoryError):
        from_chat_completions([{"role": "robot", "content": "?"}])


def test_responses_details():
    history = from_responses(
        [
            {"role": "user", "content": "hi"},  # an easy input message
            {
                "type": "reasoning",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": "full"}],
            },
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{bad"},
            {
                "type": "function_call_output",
                "call_id": "c",
                "output": [{"type": "input_text", "text": "out"}],
            },
            {"type": "custom_tool_call", "call_id": "d", "name": "patch", "input": "*** raw"},
            {"type": "custom_tool_call_output", "call_id": "d", "output": "ok"},
        ]
    )
    user, turn, result, custom, custom_result = history.messages
    assert user.content == "hi"
    assert turn.reasoning == "full" and turn.tool_calls == [ToolCall("c", "f", "{bad")]
    assert (result.tool_call_id, result.name, result.content) == ("c", "f", "out")
    assert (
        custom.tool_calls == [ToolCall("d", "patch", "*** raw")] and custom_result.name == "patch"
    )
    assert from_responses("plain").messages == [Message("user", "plain")]
    with pytest.raises(HistoryError):
        from_responses([{"type": "web_search_call", "id": "w"}])


def test_anthropic_keeps_user_text_between_results_in_place():
    history = from_anthropic(
        [
            {"role": "user", "content": [{"type": "text", "text": "go"}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "redacted_thinking", "data": "..."},
                    {"type": "tool_use", "id": "a", "name": "f", "input": {"n": 1}},
                    {"type": "tool_use", "id": "b", "name": "g", "input": {}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "b", "content": "B", "is_error": True},
                    {"type": "text", "text": "and also"},
                    {"type": "image", "source": {"type": "base64", "data": "x"}},
                    {"type": "tool_result", "tool_use_id": "a", "content": "A"},
                ],
            },
        ],
        system=[{"type": "text", "text": "sys"}],
    )
    roles = [(m.role, m.content) for m in history.messages]
    assert roles == [
        ("system", "sys"),
        ("user", "go"),
        ("assistant", ""),
        ("tool", "B"),
        ("user", "and also"),
        ("tool", "A"),
    ]
    assert history.messages[3].is_error and history.messages[3].name == "g"
    assert history.messages[4].parts[1]["type"] == "image"
    assert history.messages[2].reasoning is None


def test_template_messages():
    history = from_chat_completions(CHAT)
    messages = history.to_template_messages()
    assert messages[2] == {
        "role": "assistant",
        "content": "Checking.",
        "reasoning_content": "Two cities.",
        "tool_calls": [
            {
                "id": "t1",
                "type": "function",
                "function": {"name": "weather", "arguments": {"city": "Tokyo"}},
            },
            {
                "id": "t2",
                "type": "function",
                "function": {"name": "weather", "arguments": {"city": "Osaka"}},
            },
        ],
    }
    assert messages[3] == {
        "role": "tool",
        "content": "20C",
        "tool_call_id": "t1",
        "name": "weather",
    }
    assert "tool_calls" not in messages[5]
    parts = history.to_template_messages("openai")
    assert parts[0]["content"] == [{"type": "text", "text": "Be brief."}]
    empty = from_chat_completions([{"role": "assistant", "content": None}]).to_template_messages(
        "openai"
    )
    assert empty[0]["content"] == []


def test_normalize_tools_keeps_key_order():
    schema = {"type": "object", "properties": {"z": {"type": "string"}, "a": {"type": "integer"}}}
    chat = {"type": "function", "function": {"name": "f", "description": "d", "parameters": schema}}
    responses = {
        "type": "function",
        "name": "f",
        "description": "d",
        "parameters": schema,
        "strict": True,
    }
    anthropic = {"name": "f", "description": "d", "input_schema": schema}
    for tool in (chat, responses, anthropic):
        (normalized,) = normalize_tools([tool])
        assert normalized == chat
        assert list(normalized["function"]["parameters"]["properties"]) == ["z", "a"]
    with pytest.raises(HistoryError):
        normalize_tools([{"type": "web_search"}])
