"""The OpenAI-compatible server through FastAPI's TestClient: chat and legacy completions,
streamed (SSE) and not, /v1/models, and OpenAI-shaped 400 errors."""

from __future__ import annotations

import json
import os

import pytest
from fastapi.testclient import TestClient

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from pegmask import Engine  # noqa: E402
from pegmask.dialects import accumulate  # noqa: E402
from pegmask.engine.server import create_app  # noqa: E402

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                   "required": ["city"], "additionalProperties": False},
}}
CHAT = [{"role": "user", "content": "What's the weather in Oslo?"}]


@pytest.fixture(scope="module")
def client() -> TestClient:
    return TestClient(create_app(Engine()))


def _events(response) -> list:
    """The data payloads of a server-sent event stream ([DONE] as the string)."""
    assert response.headers["content-type"].startswith("text/event-stream")
    events = []
    for block in response.text.split("\n\n"):
        if block:
            assert block.startswith("data: ")
            payload = block[len("data: "):]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def test_models(client: TestClient) -> None:
    body = client.get("/v1/models").json()
    assert body["object"] == "list"
    assert "SmolLM2" in body["data"][0]["id"]


def test_chat_tool_call(client: TestClient) -> None:
    response = client.post("/v1/chat/completions", json={
        "model": "any", "messages": CHAT, "tools": [WEATHER], "tool_choice": "required",
        "parallel_tool_calls": False, "temperature": 1.0, "seed": 4, "max_tokens": 80})
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert isinstance(json.loads(call["function"]["arguments"])["city"], str)
    assert body["usage"]["completion_tokens"] > 0


def test_chat_stream_matches_non_streamed(client: TestClient) -> None:
    request = {"messages": CHAT, "tools": [WEATHER], "temperature": 1.0, "seed": 11,
               "max_tokens": 48, "tool_choice": "required"}
    whole = client.post("/v1/chat/completions", json=request).json()
    response = client.post("/v1/chat/completions", json={
        **request, "stream": True, "stream_options": {"include_usage": True}})
    events = _events(response)
    assert events[-1] == "[DONE]"
    usage = events[-2]
    assert usage["choices"] == [] and usage["usage"] == whole["usage"]
    chunks = events[:-2]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant"}
    assert chunks[-1]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]
    message = accumulate([c["choices"][0]["delta"] for c in chunks])
    expected = whole["choices"][0]["message"]
    assert message["tool_calls"] == expected.get("tool_calls", [])
    assert message["content"] == expected["content"]


def test_json_schema_keeps_property_order(client: TestClient) -> None:
    # Sent as raw text: the body is parsed order-preserving, "b" before "a".
    body = ('{"messages": [{"role": "user", "content": "Two numbers as JSON."}],'
            ' "max_tokens": 40, "seed": 1, "response_format": {"type": "json_schema",'
            ' "json_schema": {"name": "pair", "schema": {"type": "object", "properties":'
            ' {"b": {"type": "integer"}, "a": {"type": "integer"}}, "required": ["b", "a"],'
            ' "additionalProperties": false}}}}')
    response = client.post("/v1/chat/completions", content=body,
                           headers={"content-type": "application/json"})
    content = response.json()["choices"][0]["message"]["content"]
    assert list(json.loads(content)) == ["b", "a"]


def test_completions(client: TestClient) -> None:
    request = {"prompt": "The capital of France is", "max_tokens": 6, "temperature": 0}
    body = client.post("/v1/completions", json=request).json()
    assert body["object"] == "text_completion"
    text = body["choices"][0]["text"]
    assert "Paris" in text
    events = _events(client.post("/v1/completions", json={**request, "stream": True}))
    assert events[-1] == "[DONE]"
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == text
    assert events[-2]["choices"][0]["finish_reason"] == body["choices"][0]["finish_reason"]


def test_completion_default_max_tokens_is_16(client: TestClient) -> None:
    body = client.post("/v1/completions", json={"prompt": "Once upon a time", "seed": 0}).json()
    assert body["usage"]["completion_tokens"] <= 16


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/chat/completions", {"messages": []}, "messages"),
    ("/v1/chat/completions", {}, "messages"),
    ("/v1/chat/completions", {"messages": CHAT, "tools": [WEATHER],
                              "tool_choice": {"type": "function",
                                              "function": {"name": "nope"}}}, "tool_choice"),
    ("/v1/chat/completions", {"messages": CHAT, "response_format": {
        "type": "json_schema", "json_schema": {"schema": {"type": "nonsense"}}}},
     "response_format"),
    ("/v1/chat/completions", {"messages": CHAT, "grammar": 'root = "a"',
                              "response_format": {"type": "json_object"}}, "grammar"),
    ("/v1/chat/completions", {"messages": CHAT, "n": 2}, "n"),
    ("/v1/chat/completions", {"messages": CHAT, "temperature": "hot"}, "temperature"),
    ("/v1/chat/completions", {"messages": CHAT, "stream": True, "max_tokens": -1},
     "max_tokens"),
    ("/v1/completions", {"prompt": ["a", "b"]}, "prompt"),
    ("/v1/completions", {"prompt": "x", "tools": [WEATHER]}, "tools"),
])
def test_bad_requests_are_openai_400s(client: TestClient, path: str, body: dict,
                                      param: str) -> None:
    response = client.post(path, json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert error["message"] and "code" in error


def test_invalid_json_body(client: TestClient) -> None:
    response = client.post("/v1/chat/completions", content=b"{not json",
                           headers={"content-type": "application/json"})
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"


def test_unknown_route_is_shaped_too(client: TestClient) -> None:
    response = client.get("/v1/nothing")
    assert response.status_code == 404
    assert "error" in response.json()


def test_cli_run_batch(tmp_path, client: TestClient) -> None:
    """`pegmask run-batch`: plain bodies and Batch API lines, answered in order; a bad line
    gets its error without failing the others. (The client fixture loaded the model.)"""
    from pegmask.cli import main

    lines = [
        {"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0},
        {"custom_id": "q2", "method": "POST", "url": "/v1/chat/completions",
         "body": {"messages": [{"role": "user", "content": "Pick one."}], "max_tokens": 8,
                  "response_format": {"type": "choice", "choice": ["red", "blue"]}}},
        {"messages": []},
    ]
    source, target = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    assert main(["run-batch", "-i", str(source), "-o", str(target)]) == 1  # one failed
    first, second, third = [json.loads(line) for line in target.read_text().splitlines()]
    assert "Paris" in first["choices"][0]["text"]
    assert second["custom_id"] == "q2" and second["response"]["status_code"] == 200
    assert second["response"]["body"]["choices"][0]["message"]["content"] in ("red", "blue")
    assert third["error"]["param"] == "messages"

