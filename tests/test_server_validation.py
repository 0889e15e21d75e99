"""Validation like vLLM's, against the real server and the official clients: a body nested too
deep, an output budget past the context left after the prompt, a wrong type where only null
means absent (`tool_choice: 0`), and a tool result that answers no call are each a 400 in the
API's own shape, naming the field; valid neighbours still pass."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import openai
import pytest
from server_harness import Server, serve

from pegmask import Engine
from pegmask.engine.requests import MIN_TEMPERATURE, build_request
from pegmask.server import ServerConfig
from pegmask.server.gateway import nesting_depth

USER = [{"role": "user", "content": "hi"}]
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
CONTEXT = 256  # the engine's max_model_len: small, so that budgets past it are cheap to ask


@pytest.fixture(scope="module")
def engine():
    with Engine(max_model_len=CONTEXT) as engine:
        yield engine


@pytest.fixture(scope="module")
def server(engine: Engine):
    with serve(engine) as running:
        yield running


def _post(server: Server, path: str, body: Any) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, timeout=120)


def _openai_error(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    return error


def _anthropic_error(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 400, response.text
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    return body["error"]


# --------------------------------------------------------------------------- body nesting
@pytest.mark.parametrize(("text", "depth"), [
    (b'{"a": 1}', 1),
    (b'{"a": [[{"b": []}]], "c": {}}', 5),
    (b'{"s": "[[[[{{{{", "t": "\\"]]]"}', 1),  # brackets in strings, escaped quotes
    (b"[" * 100_000, 100_000),
    (b'["' + b'\\"' * 50_000 + b"[[", 1),  # an unterminated string swallows the rest
    (b"", 0),
])
def test_nesting_depth(text: bytes, depth: int) -> None:
    assert nesting_depth(text) == depth


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/responses",
                                  "/v1/messages", "/v1/messages/count_tokens"])
def test_deep_body_is_400_naming_the_limit(server: Server, path: str) -> None:
    """100,000 nested arrays (a RecursionError in the JSON decoder, before): refused before
    decoding, in the route's shape."""
    response = httpx.post(f"{server.url}{path}", content=b"[" * 100_000 + b"]" * 100_000,
                          headers={"content-type": "application/json"}, timeout=60)
    message = (_anthropic_error(response) if path.startswith("/v1/messages")
               else _openai_error(response))["message"]
    assert message == ("the request body nests arrays and objects 100000 levels deep; the limit "
                       "is 128 (--max-body-depth)")


def test_body_depth_limit_is_configurable(engine: Engine) -> None:
    with serve(engine, ServerConfig(max_body_depth=4)) as tight:
        schema = {"type": "object", "properties": {"a": {"type": "string"}}}  # 6 levels
        body = {"messages": USER, "max_tokens": 1, "response_format": {
            "type": "json_schema", "json_schema": {"schema": schema}}}
        assert "6 levels deep; the limit is 4" in _openai_error(_post(tight, "/v1/chat/completions",
                                                   body))["message"]
        assert _post(tight, "/v1/chat/completions",
                     {"messages": USER, "max_tokens": 1}).status_code == 200
    with pytest.raises(ValueError, match="max_body_depth"):
        ServerConfig(max_body_depth=0)


# --------------------------------------------------------------------------- output budget
def _too_large(message: str, field: str, asked: int) -> None:
    """vLLM's wording, with the numbers."""
    prefix = f"{field} is too large: {asked}. This model's maximum context length is {CONTEXT} "
    assert message.startswith(prefix), message
    prompt = int(message.split("your request has ")[1].split(" input tokens")[0])
    assert message.endswith(f"({asked} > {CONTEXT} - {prompt}).")


@pytest.mark.parametrize(("path", "body", "field"), [
    ("/v1/chat/completions", {"messages": USER, "max_tokens": 10**12}, "max_tokens"),
    ("/v1/chat/completions", {"messages": USER, "max_completion_tokens": CONTEXT},
     "max_completion_tokens"),
    ("/v1/completions", {"prompt": "Once upon a time", "max_tokens": CONTEXT}, "max_tokens"),
    ("/v1/responses", {"input": "hi", "max_output_tokens": 10**12}, "max_output_tokens"),
])
def test_openai_budget_past_the_context_is_400(server: Server, path: str, body: dict,
                                               field: str) -> None:
    error = _openai_error(_post(server, path, body))
    assert error["param"] == field
    _too_large(error["message"], field, body[field])


def test_anthropic_budget_past_the_context_is_400(server: Server) -> None:
    with pytest.raises(anthropic.BadRequestError) as error:
        server.anthropic().messages.create(model=server.engine.model_name, messages=USER,
                                           max_tokens=10**12)
    assert error.value.body["error"]["type"] == "invalid_request_error"
    _too_large(error.value.body["error"]["message"], "max_tokens", 10**12)


def test_budget_that_fits_is_served(server: Server) -> None:
    """The whole room may be asked for (the stream is accepted, then closed)."""
    client = server.openai()
    model = server.engine.model_name
    prompt = client.chat.completions.create(model=model, messages=USER,
                                            max_tokens=1).usage.prompt_tokens
    stream = client.chat.completions.create(model=model, messages=USER, stream=True,
                                            max_tokens=CONTEXT - prompt)
    with stream:
        assert next(iter(stream)).choices[0].delta.role == "assistant"


def test_a_request_past_the_key_value_budget_is_400_naming_the_field(
        engine: Engine) -> None:
    """A server whose cache holds 100 tokens: a request whose prompt and output budget exceed
    it is refused in the field the client sent, and one that fits is served."""
    with Engine(max_model_len=CONTEXT, kv_cache_bytes=100 * engine.runner.token_bytes,
                prewarm=False) as small, serve(small) as tight:
        client = tight.openai()
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model=small.model_name, messages=USER,
                                           max_completion_tokens=120)
        error = caught.value.body
        assert error["param"] == "max_completion_tokens"
        assert error["message"].startswith("max_completion_tokens is too large: 120.")
        assert "at most 100 (kv_cache_bytes)" in error["message"]
        served = client.chat.completions.create(model=small.model_name, messages=USER,
                                                max_tokens=5)
        assert served.usage.completion_tokens <= 5


# --------------------------------------------------------------------------- numbers at the edges
@pytest.mark.parametrize(("fields", "param"), [
    ({"seed": 2**63}, "seed"),
    ({"seed": -(2**63) - 1}, "seed"),
    ({"temperature": 10**400}, "temperature"),
    ({"temperature": 1e39}, "temperature"),
    ({"top_p": 10**400}, "top_p"),
    ({"repetition_penalty": 1e-308}, "repetition_penalty"),
    ({"repetition_penalty": 1e39}, "repetition_penalty"),
    ({"logit_bias": {"1": 10**400}}, "logit_bias"),
])
def test_numbers_float32_or_int64_cannot_hold_are_400(server: Server, fields: dict,
                                                      param: str) -> None:
    """Once 500s (an int64 seed overflow, logits divided to inf and NaN)."""
    error = _openai_error(_post(server, "/v1/chat/completions",
                                {"messages": USER, "max_tokens": 1, **fields}))
    assert error["param"] == param, error


def test_tiny_temperature_is_raised_to_vllms_floor() -> None:
    assert build_request("hi", temperature=1e-300).sampling.temperature == MIN_TEMPERATURE
    assert build_request("hi", temperature=0).sampling.temperature == 0.0
    assert build_request("hi", seed=2**63 - 1).sampling.seed == 2**63 - 1


@pytest.mark.parametrize("item", [{"type": "reasoning", "content": 5},
                                  {"type": "reasoning", "summary": [{"text": 5}]},
                                  {"type": "reasoning", "summary": ["x"]}])
def test_responses_malformed_reasoning_is_400(server: Server, item: dict) -> None:
    error = _openai_error(_post(server, "/v1/responses",
                                {"input": [item], "max_output_tokens": 1}))
    assert error["param"] == "input" and "reasoning item" in error["message"]


# --------------------------------------------------------------------------- only null is absent
CHAT_WRONG_TYPES = [
    ({"tool_choice": 0}, "tool_choice"),
    ({"tools": [TOOL], "tool_choice": 0}, "tool_choice"),
    ({"tools": [TOOL], "tool_choice": []}, "tool_choice"),
    ({"tools": [TOOL], "tool_choice": True}, "tool_choice"),
    ({"tools": [TOOL], "tool_choice": ""}, "tool_choice"),
    ({"tools": [TOOL], "tool_choice": {"type": "function"}}, "tool_choice"),
    ({"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": 5}}},
     "tool_choice"),
    ({"tools": 0}, "tools"),
    ({"tools": ""}, "tools"),
    ({"stop": 0}, "stop"),
    ({"stop": ""}, "stop"),
    ({"response_format": 0}, "response_format"),
    ({"response_format": ""}, "response_format"),
    ({"grammar": ""}, "grammar"),
    ({"parallel_tool_calls": 0}, "parallel_tool_calls"),
    ({"stream_options": 0}, "stream_options"),
    ({"stream_options": []}, "stream_options"),
    ({"chat_template_kwargs": 0}, "chat_template_kwargs"),
    ({"echo": 0}, "echo"),
    ({"best_of": True}, "best_of"),
    ({"tools": [{"type": "function", "function": {"name": "f", "strict": 0}}]}, "tools"),
]


@pytest.mark.parametrize(("fields", "param"), CHAT_WRONG_TYPES,
                         ids=[f"{p}-{i}" for i, (_, p) in enumerate(CHAT_WRONG_TYPES)])
def test_chat_falsy_wrong_types_are_400(server: Server, fields: dict, param: str) -> None:
    error = _openai_error(_post(server, "/v1/chat/completions",
                                {"messages": USER, "max_tokens": 1, **fields}))
    assert error["param"] == param, error


@pytest.mark.parametrize(("fields", "param"), [
    ({"tool_choice": 0}, "tool_choice"),
    ({"tools": 0}, "tools"),
    ({"stop": 0}, "stop"),
    ({"response_format": 0}, "response_format"),
])
def test_completions_falsy_wrong_types_are_400(server: Server, fields: dict,
                                               param: str) -> None:
    error = _openai_error(_post(server, "/v1/completions",
                                {"prompt": "hi", "max_tokens": 1, **fields}))
    assert error["param"] == param, error


@pytest.mark.parametrize(("fields", "param"), [
    ({"tool_choice": 0}, "tool_choice"),
    ({"tool_choice": []}, "tool_choice"),
    ({"tool_choice": True}, "tool_choice"),
    ({"tool_choice": {"type": "function", "name": 5}}, "tool_choice"),
    ({"include": 0}, "include"),
    ({"include": ""}, "include"),
    ({"top_logprobs": []}, "top_logprobs"),
    ({"text": {"format": {"type": "json_schema", "schema": {}, "strict": "yes"}}}, "text"),
    ({"background": 0}, "background"),
    ({"stop": 0}, "stop"),
])
def test_responses_falsy_wrong_types_are_400(server: Server, fields: dict,
                                             param: str) -> None:
    body = {"input": "hi", "max_output_tokens": 1,
            "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
            **fields}
    error = _openai_error(_post(server, "/v1/responses", body))
    assert error["param"] == param, error


@pytest.mark.parametrize("fields", [
    {"tool_choice": 0}, {"tool_choice": []}, {"tool_choice": True},
    {"tool_choice": {"type": "tool"}}, {"tool_choice": {"type": "tool", "name": ""}},
    {"tool_choice": {"type": "tool", "name": "f", "disable_parallel_tool_use": 0}},
])
def test_messages_wrong_tool_choice_is_400(server: Server, fields: dict) -> None:
    body = {"messages": USER, "max_tokens": 1,
            "tools": [{"name": "f", "input_schema": {"type": "object"}}], **fields}
    assert "tool_choice" in _anthropic_error(_post(server, "/v1/messages", body))["message"]


@pytest.mark.parametrize("fields", [{"container": 0}, {"mcp_servers": 0}])
def test_messages_falsy_unsupported_fields_are_400(server: Server, fields: dict) -> None:
    body = {"messages": USER, "max_tokens": 1, **fields}
    assert "not supported" in _anthropic_error(_post(server, "/v1/messages", body))["message"]


# --------------------------------------------------------------------------- orphan tool results
ASSISTANT = {"role": "assistant", "content": None, "tool_calls": [CALL]}
RESULT = {"role": "tool", "tool_call_id": "call_1", "content": "17 C"}
CHAT_ORPHANS = [
    ([*USER, RESULT],
     "messages[1]: messages with role 'tool' must be a response to a preceding message with "
     "'tool_calls'"),
    ([*USER, ASSISTANT, RESULT, {"role": "user", "content": "and?"}, RESULT],
     "messages[4]: messages with role 'tool' must be a response to a preceding message with "
     "'tool_calls'"),
    ([*USER, ASSISTANT, {**RESULT, "tool_call_id": "call_2"}],
     "messages[2]: tool_call_id 'call_2' is not among the 'tool_calls' of the preceding "
     "assistant message"),
    ([*USER, {"role": "function", "name": "f", "content": "17 C"}],
     "messages[1]: messages with role 'function' must be a response to a preceding message "
     "with 'tool_calls'"),
    ([*USER, {"role": "assistant", "content": None, "function_call": "f"}],
     'messages[1].function_call must be {"name", "arguments"}'),
]


@pytest.mark.parametrize(("messages", "message"), CHAT_ORPHANS)
def test_chat_orphan_tool_message_is_400(server: Server, messages: list, message: str) -> None:
    """OpenAI's rule: a tool message answers the tool_calls of the assistant message before
    it."""
    with pytest.raises(openai.BadRequestError) as error:
        server.openai().chat.completions.create(model=server.engine.model_name,
                                                messages=messages, tools=[TOOL], max_tokens=1)
    assert error.value.param == "messages"
    assert error.value.body["message"] == message


def test_chat_tool_answers_after_each_other_are_served(server: Server) -> None:
    """Two results of one assistant turn, by id and without one (matched by position)."""
    second = {**CALL, "id": "call_2"}
    response = server.openai().chat.completions.create(
        model=server.engine.model_name, tools=[TOOL], max_tokens=1, messages=[
            *USER, {"role": "assistant", "content": None, "tool_calls": [CALL, second]},
            {"role": "tool", "tool_call_id": "call_1", "content": "1"},
            {"role": "tool", "content": "2"}])
    assert response.choices[0].finish_reason in ("stop", "length")


def test_responses_orphan_output_is_400(server: Server) -> None:
    """OpenAI's rule and wording: an output's call_id is that of an earlier call."""
    call = {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"}
    output = {"type": "function_call_output", "call_id": "call_1", "output": "17 C"}
    tools = [{"type": "function", "name": "f", "parameters": {"type": "object"}}]
    question = {"role": "user", "content": "hi"}
    for items in ([output], [call, {**output, "call_id": "call_9"}], [output, call]):
        with pytest.raises(openai.BadRequestError) as error:
            server.openai().responses.create(model=server.engine.model_name, tools=tools,
                                             input=[question, *items], max_output_tokens=1)
        assert error.value.param == "input"
        call_id = next(item for item in items if "output" in item)["call_id"]
        assert error.value.body["message"] == ("No tool call found for function call output with "
                                       f"call_id {call_id}.")
    answered = server.openai().responses.create(model=server.engine.model_name, tools=tools,
                                                input=[question, call, output],
                                                max_output_tokens=1)
    assert answered.status in ("completed", "incomplete")


def test_messages_orphan_tool_result_is_400(server: Server) -> None:
    tools = [{"name": "f", "input_schema": {"type": "object"}}]
    use = {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "f",
                                             "input": {}}]}

    def result(call_id: str) -> dict[str, Any]:
        return {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call_id,
                                             "content": "17 C"}]}

    histories = {
        "no tool_use": [*USER, {"role": "assistant", "content": "ok"}, result("toolu_1")],
        "another id": [*USER, use, result("toolu_2")],
        "not the previous message": [*USER, use, result("toolu_1"),
                                     {"role": "assistant", "content": "ok"}, result("toolu_1")],
    }
    where = {"no tool_use": 2, "another id": 2, "not the previous message": 4}
    for name, history in histories.items():
        with pytest.raises(anthropic.BadRequestError) as error:
            server.anthropic().messages.create(model=server.engine.model_name, tools=tools,
                                               messages=history, max_tokens=1)
        message = error.value.body["error"]["message"]
        call_id = history[-1]["content"][0]["tool_use_id"]
        assert message == (
            f"messages.{where[name]}.content.0: unexpected `tool_use_id` found in `tool_result` "
            f"blocks: {call_id}. Each `tool_result` block must have a corresponding `tool_use` "
            "block in the previous message."), name
    answered = server.anthropic().messages.create(
        model=server.engine.model_name, tools=tools, max_tokens=1,
        messages=[*USER, use, result("toolu_1")])
    assert answered.type == "message"
    counted = httpx.post(f"{server.url}/v1/messages/count_tokens", timeout=60, json={
        "messages": [*USER, use, result("toolu_2")]})
    assert "unexpected `tool_use_id`" in _anthropic_error(counted)["message"]


def test_hostile_string_is_read_in_linear_time(server: Server) -> None:
    """A string of 50,000 escaped quotes (a quadratic scan for a naive string matcher)."""
    raw = b'{"messages": "' + b'\\"' * 50_000 + b'"}'
    response = httpx.post(f"{server.url}/v1/chat/completions", content=raw,
                          headers={"content-type": "application/json"}, timeout=30)
    assert _openai_error(response)["param"] == "messages"
    assert json.loads(response.text)
