"""Errors, in each API's own shape and status, against the real server and the official clients:
400 naming the field at fault, 401 (API key), 404 (unknown model or route), 413 (body size), 429
(queue full), 408 (request time), never a 500 for a malformed body, and an error after a stream
started sent as the API's error event, the stream then ending cleanly."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import anthropic
import httpx
import openai
import pytest
from server_harness import Server, serve

from pegmask import Engine
from pegmask.engine import engine as engine_module
from pegmask.server import ServerConfig, gateway

USER = [{"role": "user", "content": "hi"}]
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
SECRET = "secret-key"


@pytest.fixture(scope="module")
def engine():
    with Engine() as engine:
        yield engine


@pytest.fixture(scope="module")
def server(engine: Engine):
    with serve(engine) as running:
        yield running


@pytest.fixture(scope="module")
def guarded(engine: Engine):
    """The same engine behind an API key and a 4 KiB body limit."""
    with serve(engine, ServerConfig(api_key=SECRET, max_body_bytes=4096)) as running:
        yield running


# --------------------------------------------------------------------------- 400 naming the field
OPENAI_CHAT_CASES = [
    ({"temperature": "hot"}, "temperature"),
    ({"temperature": 3.5, "top_p": 0}, "top_p"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": 5}}]}, "tools"),
    ({"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice"),
    ({"tools": [TOOL], "tool_choice": "sometimes"}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "nonsense"}}}},
     "response_format"),
    ({"response_format": {"type": "regex", "regex": "("}}, "response_format"),
    ({"n": 0}, "n"),
    ({"logit_bias": {"not-a-token": 1}}, "logit_bias"),
    ({"logprobs": False, "top_logprobs": 2}, "top_logprobs"),
    ({"stop_token_ids": [10**9]}, "stop_token_ids"),
    ({"parallel_tool_calls": "no"}, "parallel_tool_calls"),
    ({"stream_options": "yes"}, "stream_options"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
     "messages"),
    ({"functions": [{"name": "f"}]}, "functions"),
]


@pytest.mark.parametrize(("fields", "param"), OPENAI_CHAT_CASES,
                         ids=[param for _, param in OPENAI_CHAT_CASES])
def test_chat_400_names_the_field(server: Server, fields: dict, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as error:
        server.openai().chat.completions.create(model=server.engine.model_name, messages=USER,
                                                max_tokens=4, extra_body=fields)
    assert error.value.status_code == 400
    assert error.value.type == "invalid_request_error"
    assert error.value.param == param
    assert error.value.message


RESPONSES_CASES = [
    ({"temperature": "hot"}, "temperature"),
    ({"tools": [{"type": "web_search"}]}, "tools"),
    ({"tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
      "tool_choice": {"type": "function"}}, "tool_choice"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "nonsense"}}}},
     "text"),
    ({"input": [{"type": "function_call_output", "call_id": 5, "output": "x"}]}, "input"),
    ({"include": "everything"}, "include"),
]


@pytest.mark.parametrize(("fields", "param"), RESPONSES_CASES,
                         ids=[param for _, param in RESPONSES_CASES])
def test_responses_400_names_the_field(server: Server, fields: dict, param: str) -> None:
    body = {"input": "hi", "max_output_tokens": 4, **fields}
    with pytest.raises(openai.BadRequestError) as error:
        server.openai().responses.create(model=server.engine.model_name, **body)
    assert error.value.type == "invalid_request_error"
    assert error.value.param == param


ANTHROPIC_CASES = [
    ({"extra_body": {"temperature": "hot"}}, "temperature"),
    ({"tools": [{"name": "f"}]}, "tools"),
    ({"tools": [{"name": "f", "input_schema": {"type": "object"}}],
      "tool_choice": {"type": "tool"}}, "tool_choice"),
    ({"stop_sequences": [5]}, "stop_sequences"),
    ({"thinking": {"type": "sometimes"}}, "thinking"),
    ({"messages": [{"role": "system", "content": "x"}]}, "role"),
    ({"output_config": {"format": {"type": "regex", "schema": {}}}}, "output_config"),
]


@pytest.mark.parametrize(("fields", "name"), ANTHROPIC_CASES,
                         ids=[name for _, name in ANTHROPIC_CASES])
def test_messages_400_names_the_field(server: Server, fields: dict, name: str) -> None:
    body = {"messages": USER, "max_tokens": 4, **fields}
    with pytest.raises(anthropic.BadRequestError) as error:
        server.anthropic().messages.create(model=server.engine.model_name, **body)
    assert error.value.status_code == 400
    assert error.value.body["type"] == "error"
    assert error.value.body["error"]["type"] == "invalid_request_error"
    assert name in error.value.body["error"]["message"]


def test_messages_needs_max_tokens(server: Server) -> None:
    for path in ("/v1/messages",):
        response = httpx.post(f"{server.url}{path}", json={"messages": USER}, timeout=60)
        assert response.status_code == 400
        assert response.json() == {"type": "error", "error": {
            "type": "invalid_request_error", "message": "max_tokens is required"}}


# --------------------------------------------------------------------------- malformed bodies
MALFORMED = [
    ("/v1/chat/completions", {"messages": "hi"}),
    ("/v1/chat/completions", {"messages": [1]}),
    ("/v1/chat/completions", {"messages": [{"role": 1}]}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"text": 5}]}]}),
    ("/v1/chat/completions", {"messages": [{"role": "assistant", "tool_calls": "x"}]}),
    ("/v1/chat/completions", {"messages": [{"role": "assistant", "tool_calls": [
        {"id": 1, "function": {"name": 5, "arguments": 7}}]}]}),
    ("/v1/chat/completions", {"messages": USER, "tools": "x"}),
    ("/v1/chat/completions", {"messages": USER, "tools": [1]}),
    ("/v1/chat/completions", {"messages": USER, "tools": [TOOL], "tool_choice": 5}),
    ("/v1/chat/completions", {"messages": USER, "n": "2"}),
    ("/v1/chat/completions", {"messages": USER, "stop": [1]}),
    ("/v1/chat/completions", {"messages": USER, "logit_bias": [1]}),
    ("/v1/chat/completions", {"messages": USER, "response_format": "json"}),
    ("/v1/chat/completions", {"messages": USER, "max_tokens": "10"}),
    ("/v1/chat/completions", {"messages": USER, "seed": 1.5}),
    ("/v1/chat/completions", {"messages": USER, "stream": "yes"}),
    ("/v1/chat/completions", {"messages": USER, "chat_template_kwargs": 5}),
    ("/v1/chat/completions", {"messages": USER, "reasoning_effort": 5}),
    ("/v1/chat/completions", {"messages": USER, "model": 5}),
    ("/v1/chat/completions", {"messages": USER, "grammar": 5}),
    ("/v1/chat/completions", [USER]),
    ("/v1/completions", {"prompt": 5}),
    ("/v1/completions", {"prompt": [[1, 2]]}),
    ("/v1/completions", {"prompt": "x", "logprobs": "a"}),
    ("/v1/completions", {"prompt": "x", "best_of": 3}),
    ("/v1/responses", {"input": 5}),
    ("/v1/responses", {"input": [1]}),
    ("/v1/responses", {"input": [{"type": "message", "role": "user", "content": 5}]}),
    ("/v1/responses", {"input": [{"type": "function_call", "call_id": 5, "name": 5}]}),
    ("/v1/responses", {"input": [{"role": "user", "content": [{"type": "input_text",
                                                               "text": 5}]}]}),
    ("/v1/responses", {"input": "hi", "instructions": 5}),
    ("/v1/responses", {"input": "hi", "text": {"format": 5}}),
    ("/v1/responses", {"input": "hi", "reasoning": {"effort": 5}}),
    ("/v1/responses", {"input": "hi", "tools": "x"}),
    ("/v1/responses", {"input": "hi", "previous_response_id": 5}),
    ("/v1/responses", {"input": "hi", "store": "x"}),
    ("/v1/messages", {"max_tokens": 4, "messages": "x"}),
    ("/v1/messages", {"max_tokens": 4, "messages": [{"role": "user", "content": 5}]}),
    ("/v1/messages", {"max_tokens": 4, "messages": [{"role": "user", "content": [5]}]}),
    ("/v1/messages", {"max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "text", "text": 5}]}]}),
    ("/v1/messages", {"max_tokens": 4, "messages": [{"role": "assistant", "content": [
        {"type": "tool_use", "id": 5, "name": 5, "input": 5}]}]}),
    ("/v1/messages", {"max_tokens": 4, "messages": USER, "system": [{"type": "text",
                                                                     "text": 5}]}),
    ("/v1/messages", {"max_tokens": 4, "messages": USER, "tools": [5]}),
    ("/v1/messages", {"max_tokens": 4, "messages": USER, "tool_choice": "auto"}),
    ("/v1/messages", {"max_tokens": 4, "messages": USER, "stop_sequences": "x"}),
    ("/v1/messages", {"max_tokens": 4, "messages": USER, "thinking": {
        "type": "enabled", "budget_tokens": "x"}}),
    ("/v1/messages", {"max_tokens": "4", "messages": USER}),
    ("/v1/messages", {"max_tokens": 4, "messages": USER, "stream": "x"}),
    ("/v1/messages/count_tokens", {"messages": [{"role": "user", "content": 5}]}),
    ("/v1/messages/count_tokens", {"messages": USER, "system": 5}),
]


@pytest.mark.parametrize(("path", "body"), MALFORMED,
                         ids=[f"{path}-{i}" for i, (path, _) in enumerate(MALFORMED)])
def test_malformed_bodies_are_4xx(server: Server, path: str, body: Any) -> None:
    """Wrong types everywhere: a 400 in the route's error shape, never a 500."""
    response = httpx.post(f"{server.url}{path}", json=body, timeout=60)
    assert response.status_code == 400, response.text
    payload = response.json()
    if path.startswith("/v1/messages"):
        assert payload["type"] == "error" and payload["error"]["message"]
    else:
        assert payload["error"]["type"] == "invalid_request_error" and payload["error"]["message"]


def test_invalid_json_is_400_in_each_shape(server: Server) -> None:
    for path, shape in (("/v1/chat/completions", "openai"), ("/v1/messages", "anthropic")):
        response = httpx.post(f"{server.url}{path}", content=b"{not json",
                              headers={"content-type": "application/json"}, timeout=60)
        assert response.status_code == 400
        body = response.json()
        assert (body["error"]["type"] if shape == "openai" else body["type"]) in (
            "invalid_request_error", "error")


# --------------------------------------------------------------------------- 404
def test_unknown_model_and_route_are_404(server: Server) -> None:
    with pytest.raises(openai.NotFoundError) as error:
        server.openai().chat.completions.create(model="gpt-nothing", messages=USER)
    assert error.value.param == "model" and "gpt-nothing" in error.value.message
    with pytest.raises(anthropic.NotFoundError) as missing:
        server.anthropic().messages.create(model="claude-nothing", messages=USER, max_tokens=4)
    assert missing.value.body["error"]["type"] == "not_found_error"

    route = httpx.get(f"{server.url}/v1/nothing", timeout=30)
    assert route.status_code == 404 and route.json()["error"]["code"] == "not_found"
    route = httpx.post(f"{server.url}/v1/messages/batches", json={}, timeout=30)
    assert route.status_code == 404 and route.json()["error"]["type"] == "not_found_error"
    assert server.metric("pegmask_requests_total", api="other", status="404") >= 1


# --------------------------------------------------------------------------- 401
def test_api_key(guarded: Server) -> None:
    model = guarded.engine.model_name
    with pytest.raises(openai.AuthenticationError) as error:
        guarded.openai(api_key="wrong").models.list()
    assert error.value.status_code == 401 and error.value.type == "authentication_error"
    with pytest.raises(anthropic.AuthenticationError) as refused:
        guarded.anthropic(api_key="wrong").messages.count_tokens(model=model, messages=USER)
    assert refused.value.body["error"]["type"] == "authentication_error"
    assert httpx.get(f"{guarded.url}/v1/models", timeout=30).status_code == 401  # no key

    assert [m.id for m in guarded.openai(api_key=SECRET).models.list().data] == [model]
    counted = guarded.anthropic(api_key=SECRET).messages.count_tokens(model=model,
                                                                      messages=USER)
    assert counted.input_tokens > 0  # the Anthropic client sends x-api-key
    assert httpx.get(f"{guarded.url}/health", timeout=30).status_code == 200  # open


# --------------------------------------------------------------------------- 413
def test_body_over_the_limit_is_413(guarded: Server) -> None:
    big = [{"role": "user", "content": "x" * 5000}]
    model = guarded.engine.model_name
    with pytest.raises(openai.APIStatusError) as error:
        guarded.openai().chat.completions.create(model=model, messages=big)
    assert error.value.status_code == 413 and error.value.code == "request_too_large"
    with pytest.raises(anthropic.APIStatusError) as refused:
        guarded.anthropic().messages.create(model=model, messages=big, max_tokens=4)
    assert refused.value.status_code == 413
    assert refused.value.body["error"]["type"] == "request_too_large"

    # Chunked, with no content-length to refuse it up front: refused once read.
    def chunks():
        yield json.dumps({"model": model, "messages": big}).encode()

    response = httpx.post(f"{guarded.url}/v1/chat/completions", content=chunks(),
                          headers={"Authorization": f"Bearer {SECRET}"}, timeout=30)
    assert response.status_code == 413


# --------------------------------------------------------------------------- large bodies
def _lane_jobs(monkeypatch: pytest.MonkeyPatch, engine: Engine) -> list[str]:
    """The names of the jobs the engine's background lane is given from now on."""
    jobs: list[str] = []
    lane = engine.background
    run, arun = lane.run, lane.arun

    def name(job: Any) -> str:
        return getattr(job, "func", job).__name__  # a functools.partial's function

    def run_spy(job: Any, *args: Any, **kwargs: Any) -> Any:
        jobs.append(name(job))
        return run(job, *args, **kwargs)

    async def arun_spy(job: Any, *args: Any, **kwargs: Any) -> Any:
        jobs.append(name(job))
        return await arun(job, *args, **kwargs)

    monkeypatch.setattr(lane, "run", run_spy)
    monkeypatch.setattr(lane, "arun", arun_spy)
    return jobs


def test_a_large_body_is_worked_on_the_background_lane(server: Server,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A 100 KB document is an ordinary request; a body past `LARGE_REQUEST_SIZE` is decoded,
    converted, validated, rendered and tokenized on the lane (1.1 MB counted; and, with the
    bound lowered to 64 KiB so that such a request fits this model's context, answered like
    any other in each API)."""
    jobs = _lane_jobs(monkeypatch, server.engine)
    model = server.engine.model_name
    document = [{"role": "user", "content": " " * 100_000 + "Say hi."}]
    server.openai().chat.completions.create(model=model, messages=document, max_tokens=2)
    assert jobs == []
    huge = [{"role": "user", "content": " " * 1_100_000 + "Say hi."}]
    counted = server.anthropic().messages.count_tokens(model=model, messages=huge)
    assert counted.input_tokens > server.engine.max_model_len  # counting has no bound
    assert jobs == ["decode_body", "_request", "request", "_background_prompt"]

    for module in (engine_module, gateway):
        monkeypatch.setattr(module, "LARGE_REQUEST_SIZE", 64 * 1024)
    jobs.clear()
    answer = server.openai().chat.completions.create(model=model, messages=document,
                                                     max_tokens=3)
    assert jobs == ["decode_body", "openai_request", "request", "_background_prompt"]
    engine = server.engine
    rendered = engine.render(engine.request(document))
    assert answer.usage.prompt_tokens == len(engine.backend.encode(rendered)) > 1000
    assert answer.usage.completion_tokens >= 1 and answer.choices[0].finish_reason
    jobs.clear()
    response = server.openai().responses.create(model=model, input=document,
                                                max_output_tokens=3)
    assert response.usage.input_tokens > 1000
    assert jobs == ["decode_body", "_plan", "request", "_background_prompt"]


def test_a_large_body_past_the_context_is_a_400_from_the_lane(
        server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """40,000 short messages (1.6 MB, 450,000 tokens): the context-length 400 of each API,
    after the lane's work."""
    jobs = _lane_jobs(monkeypatch, server.engine)
    many = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i}"}
            for i in range(40_000)] + USER
    model = server.engine.model_name
    with pytest.raises(openai.BadRequestError) as error:
        server.openai().chat.completions.create(model=model, messages=many, max_tokens=2)
    assert error.value.param == "messages"
    assert "maximum context length is 8192 tokens" in error.value.message
    assert "_background_prompt" in jobs
    with pytest.raises(anthropic.BadRequestError) as refused:
        server.anthropic().messages.create(model=model, messages=many, max_tokens=2)
    assert "maximum context length" in refused.value.body["error"]["message"]
    assert jobs.count("_background_prompt") == 2


# --------------------------------------------------------------------------- 429
def test_full_queue_is_429() -> None:
    """One running sequence, one queued request: the others at the same moment are refused,
    with Retry-After, in each API's shape. The first request is running before the others are
    sent (sent together, the first could still be waiting to be admitted, and then take the
    queue's one place itself)."""
    with Engine(max_running=1, max_queued=1) as engine, serve(engine) as tight:
        model = engine.model_name
        barrier = threading.Barrier(5)

        def call(i: int) -> Any:
            if i:
                barrier.wait()
            try:
                if i % 2:
                    return tight.anthropic().messages.create(
                        model=model, messages=USER, max_tokens=24,
                        extra_body={"ignore_eos": True, "temperature": 0})
                return tight.openai().chat.completions.create(
                    model=model, messages=USER, max_tokens=200 if i == 0 else 24,
                    extra_body={"ignore_eos": True}, temperature=0)
            except (openai.APIStatusError, anthropic.APIStatusError) as exc:
                return exc

        with ThreadPoolExecutor(6) as pool:
            first = pool.submit(call, 0)
            deadline = time.monotonic() + 60
            while engine.scheduler.running < 1 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert engine.scheduler.running == 1
            others = pool.map(call, range(1, 6))  # (submitted now, read after)
            outcomes = [first.result(), *others]
    refused = [o for o in outcomes if isinstance(o, (openai.APIStatusError,
                                                     anthropic.APIStatusError))]
    served = [o for o in outcomes if o not in refused]
    assert len(served) >= 2 and len(refused) >= 1, outcomes
    for error in refused:
        assert error.status_code == 429
        assert error.response.headers["retry-after"] == "1"
        if isinstance(error, openai.APIStatusError):
            assert isinstance(error, openai.RateLimitError)
            assert error.type == "rate_limit_error"
        else:
            assert isinstance(error, anthropic.RateLimitError)
            assert error.body["error"]["type"] == "rate_limit_error"


# --------------------------------------------------------------------------- 408, and mid-stream
def _sse(response: httpx.Response) -> list[tuple[str | None, str]]:
    """(event name, data) of each server-sent event, read to the end of the body."""
    events = []
    for block in response.text.split("\n\n"):
        if not block.strip():
            continue
        name, data = None, ""
        for line in block.split("\n"):
            if line.startswith("event: "):
                name = line[len("event: "):]
            elif line.startswith("data: "):
                data = line[len("data: "):]
        events.append((name, data))
    return events


def test_request_timeout_is_408_and_a_mid_stream_error_event() -> None:
    """A request past request_timeout_s: 408 when not streamed; streamed, the API's error event
    after what was sent, then a clean end (the body reads to its end, no broken connection)."""
    with Engine(request_timeout_s=1.0) as engine, serve(engine) as slow:
        model = engine.model_name
        long = {"ignore_eos": True, "temperature": 0}
        chat = {"model": model, "messages": USER, "max_tokens": 400, **long}
        responses = {"model": model, "input": "hi", "max_output_tokens": 400, **long}
        messages = {"model": model, "messages": USER, "max_tokens": 400, **long}
        completion = {"model": model, "prompt": "Once upon a time", "max_tokens": 400, **long}
        http = slow.http()
        jobs = {
            "chat": lambda: http.post("/v1/chat/completions", json=chat),
            "responses": lambda: http.post("/v1/responses", json=responses),
            "messages": lambda: http.post("/v1/messages", json=messages),
            "chat-stream": lambda: http.post("/v1/chat/completions",
                                             json={**chat, "stream": True}),
            "completions-stream": lambda: http.post("/v1/completions",
                                                    json={**completion, "stream": True}),
            "responses-stream": lambda: http.post("/v1/responses",
                                                  json={**responses, "stream": True}),
            "messages-stream": lambda: http.post("/v1/messages",
                                                 json={**messages, "stream": True}),
        }
        with ThreadPoolExecutor(len(jobs)) as pool:
            futures = {name: pool.submit(job) for name, job in jobs.items()}
            out = {name: future.result() for name, future in futures.items()}

        # The clients see the same: a 408, or an error raised from the stream.
        with pytest.raises(openai.APIStatusError) as error:
            slow.openai().chat.completions.create(model=model, messages=USER, max_tokens=400,
                                                  temperature=0, extra_body=long)
        assert error.value.status_code == 408 and error.value.type == "timeout_error"
        with pytest.raises(anthropic.APIError) as stream_error:
            with slow.anthropic().messages.stream(
                    model=model, messages=USER, max_tokens=400,
                    extra_body=long) as stream:
                for _ in stream:
                    pass
        assert "ran past" in str(stream_error.value)

    for name in ("chat", "responses"):
        assert out[name].status_code == 408
        assert out[name].json()["error"]["type"] == "timeout_error"
    assert out["messages"].status_code == 408
    assert out["messages"].json()["error"]["type"] == "timeout_error"

    for name in ("chat-stream", "completions-stream"):
        events = _sse(out[name])
        assert out[name].status_code == 200
        assert events[-1] == (None, "[DONE]")
        assert "ran past" in json.loads(events[-2][1])["error"]["message"]
        assert all("error" not in json.loads(data) for _, data in events[:-2])
    first = json.loads(_sse(out["chat-stream"])[0][1])
    assert first["choices"][0]["delta"] == {"role": "assistant"}  # sent before the error

    events = [(name, json.loads(data)) for name, data in _sse(out["responses-stream"])]
    assert [name for name, _ in events][:2] == ["response.created", "response.in_progress"]
    assert [name for name, _ in events][-2:] == ["error", "response.failed"]
    assert events[-2][1]["code"] == "408" and "ran past" in events[-2][1]["message"]
    assert events[-1][1]["response"]["status"] == "failed"
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))

    events = [(name, json.loads(data)) for name, data in _sse(out["messages-stream"])]
    assert events[0][0] == "message_start" and events[-1][0] == "error"
    assert events[-1][1]["error"]["type"] == "timeout_error"
    assert "message_stop" not in [name for name, _ in events]
