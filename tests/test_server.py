"""The server's three API surfaces, driven by the official `openai` and `anthropic` clients against
the real server (uvicorn on a loopback port) and the embedded model.

* each API plain and streamed: the streamed answer reassembles to the plain one for the same seed
  (tool-call ids differ between requests by design; everything else is compared);
* a tool round trip in each API (call -> result -> answer), and one across APIs (a call made
  through Chat Completions, its result sent back through Anthropic Messages): the second prompt
  holds the first turn's raw bytes, replayed from the engine's memory;
* tool_choice modes in each API, structured output, previous_response_id and GET /v1/responses,
  count_tokens, /v1/models and /health, and `pegmask run-batch`.
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from server_harness import Server, metric_value, recording, serve

from pegmask import Engine
from pegmask.dialects import accumulate

CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
        "required": ["city"], "additionalProperties": False}
ZONE = {"type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
        "required": ["zone"], "additionalProperties": False}
# The same two tools in each API's shape.
CHAT_TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                      "parameters": CITY}},
    {"type": "function", "function": {"name": "get_time", "description": "Time in a zone",
                                      "parameters": ZONE}},
]
RESPONSES_TOOLS = [{"type": "function", **tool["function"]} for tool in CHAT_TOOLS]
ANTHROPIC_TOOLS = [{"name": tool["function"]["name"],
                    "description": tool["function"]["description"],
                    "input_schema": tool["function"]["parameters"]} for tool in CHAT_TOOLS]
NAMES = {"get_weather", "get_time"}
QUESTION = "What's the weather in Oslo?"
RESULT = "Sunny, 21 C"
CALL_BUDGET = 48  # tokens: one call to either tool fits (about 36 with its forced tokens)


@pytest.fixture(scope="module")
def server():
    with Engine() as engine, serve(engine) as running:
        yield running


def _model(server: Server) -> str:
    return server.engine.model_name


def _replayed(prompt: str, raw_turn: str) -> None:
    """The second prompt holds the first turn's raw bytes (not a re-serialization): a call,
    after whatever whitespace the grammar let the model put before it."""
    assert raw_turn.lstrip().startswith("<tool_call>"), raw_turn
    assert raw_turn in prompt
    assert RESULT in prompt


# --------------------------------------------------------------------------- basics
def test_models_and_health(server: Server) -> None:
    models = server.openai().models.list()
    assert [model.id for model in models.data] == [server.engine.model_name]
    health = server.health()
    assert health["status"] == "ok" and health["model"] == server.engine.model_name
    assert health["running"] == 0 and health["queued"] == 0


# --------------------------------------------------------------------------- plain vs streamed
def test_chat_streamed_matches_plain(server: Server) -> None:
    client = server.openai()
    request = {"model": _model(server), "messages": [{"role": "user", "content": QUESTION}],
               "tools": CHAT_TOOLS, "tool_choice": "required", "parallel_tool_calls": False,
               "seed": 11, "max_tokens": CALL_BUDGET}
    plain = client.chat.completions.create(**request)
    chunks = list(client.chat.completions.create(
        **request, stream=True, stream_options={"include_usage": True}))

    assert plain.object == "chat.completion" and plain.id.startswith("chatcmpl-")
    (choice,) = plain.choices
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.function.name in NAMES and call.id.startswith("call_")
    json.loads(call.function.arguments)

    assert {chunk.id for chunk in chunks} == {chunks[0].id}
    assert all(chunk.object == "chat.completion.chunk" for chunk in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices == []
    usage = chunks[-1].usage
    assert usage.model_dump(exclude={"prompt_tokens_details"}) == \
        plain.usage.model_dump(exclude={"prompt_tokens_details"})
    # the same prompt again: the prefix cache kept it whole
    assert usage.prompt_tokens_details.cached_tokens == usage.prompt_tokens
    deltas = [chunk.choices[0].delta.model_dump(exclude_none=True) for chunk in chunks[:-1]]
    streamed = accumulate(deltas)
    assert chunks[-2].choices[0].finish_reason == choice.finish_reason
    assert streamed["content"] == choice.message.content
    (streamed_call,) = streamed["tool_calls"]
    assert streamed_call["function"] == {"name": call.function.name,
                                         "arguments": call.function.arguments}
    assert streamed_call["id"] != call.id  # ids are unique per request, whatever the seed


def test_completions_streamed_matches_plain(server: Server) -> None:
    client = server.openai()
    request = {"model": _model(server), "prompt": "The capital of France is", "max_tokens": 6,
               "temperature": 0}
    plain = client.completions.create(**request)
    assert plain.object == "text_completion"
    assert "Paris" in plain.choices[0].text
    chunks = list(client.completions.create(**request, stream=True))
    assert "".join(chunk.choices[0].text for chunk in chunks) == plain.choices[0].text
    assert chunks[-1].choices[0].finish_reason == plain.choices[0].finish_reason


def test_responses_streamed_matches_plain(server: Server) -> None:
    client = server.openai()
    request = {"model": _model(server), "input": QUESTION, "tools": RESPONSES_TOOLS,
               "tool_choice": "required", "parallel_tool_calls": False,
               "max_output_tokens": CALL_BUDGET, "extra_body": {"seed": 11}}
    plain = client.responses.create(**request)
    assert plain.object == "response" and plain.status == "completed"
    (item,) = plain.output
    assert item.type == "function_call" and item.name in NAMES
    json.loads(item.arguments)

    events = list(client.responses.create(**request, stream=True))
    kinds = [event.type for event in events]
    assert kinds[:3] == ["response.created", "response.in_progress",
                         "response.output_item.added"]
    assert kinds[-3:] == ["response.function_call_arguments.done", "response.output_item.done",
                          "response.completed"]
    assert set(kinds[3:-3]) == {"response.function_call_arguments.delta"}
    assert [event.sequence_number for event in events] == list(range(len(events)))
    assert "".join(event.delta for event in events[3:-3]) == item.arguments
    final = events[-1].response
    (streamed,) = final.output
    assert (streamed.name, streamed.arguments, streamed.status) == (item.name, item.arguments,
                                                                    "completed")
    assert streamed.call_id != item.call_id
    assert final.usage.model_dump(exclude={"input_tokens_details"}) == \
        plain.usage.model_dump(exclude={"input_tokens_details"})
    assert final.usage.input_tokens_details.cached_tokens == final.usage.input_tokens


def test_messages_streamed_matches_plain(server: Server) -> None:
    client = server.anthropic()
    request = {"model": _model(server), "max_tokens": CALL_BUDGET, "tools": ANTHROPIC_TOOLS,
               "messages": [{"role": "user", "content": QUESTION}],
               "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
               "extra_body": {"seed": 11}}
    plain = client.messages.create(**request)
    assert plain.type == "message" and plain.role == "assistant"
    assert plain.stop_reason == "tool_use"
    (block,) = plain.content
    assert block.type == "tool_use" and block.name in NAMES and isinstance(block.input, dict)

    with client.messages.stream(**request) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start"
    assert kinds[-2:] == ["message_delta", "message_stop"]
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") == 1
    assert final.stop_reason == plain.stop_reason
    (streamed,) = final.content
    assert (streamed.type, streamed.name, streamed.input) == ("tool_use", block.name, block.input)
    assert streamed.id != block.id
    assert final.usage.output_tokens == plain.usage.output_tokens
    assert plain.usage.input_tokens > 0

    # A text answer: text_delta events.
    text_request = {"model": _model(server), "max_tokens": 10, "system": "Be brief.",
                    "messages": [{"role": "user", "content": "What is the capital of France?"}],
                    "extra_body": {"seed": 3}}
    plain = client.messages.create(**text_request)
    with client.messages.stream(**text_request) as stream:
        pieces = [event.delta.text for event in stream if event.type == "content_block_delta"]
        final = stream.get_final_message()
    assert [block.type for block in plain.content] == ["text"]
    assert "".join(pieces) == final.content[0].text == plain.content[0].text
    assert final.stop_reason == plain.stop_reason


# --------------------------------------------------------------------------- tool round trips
def test_chat_tool_round_trip_replays_the_raw_turn(server: Server) -> None:
    client = server.openai()
    messages: list[Any] = [{"role": "user", "content": QUESTION}]
    with recording(server.engine) as recorder:
        first = client.chat.completions.create(
            model=_model(server), messages=messages, tools=CHAT_TOOLS,
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
            parallel_tool_calls=False, seed=2, max_tokens=CALL_BUDGET)
        (call,) = first.choices[0].message.tool_calls
        messages += [first.choices[0].message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": RESULT}]
        answer = client.chat.completions.create(
            model=_model(server), messages=messages, tools=CHAT_TOOLS, tool_choice="none",
            seed=2, max_tokens=12)
    assert answer.choices[0].message.content and not answer.choices[0].message.tool_calls
    _replayed(recorder.prompt(1), recorder.output(0))


def test_responses_tool_round_trip_replays_the_raw_turn(server: Server) -> None:
    client = server.openai()
    common = {"model": _model(server), "tools": RESPONSES_TOOLS, "extra_body": {"seed": 3}}
    with recording(server.engine) as recorder:
        first = client.responses.create(
            **common, input=QUESTION, tool_choice={"type": "function", "name": "get_weather"},
            parallel_tool_calls=False, max_output_tokens=CALL_BUDGET)
        (call,) = first.output
        result = {"type": "function_call_output", "call_id": call.call_id, "output": RESULT}
        # The whole conversation as items, then the same through previous_response_id.
        items = [{"role": "user", "content": QUESTION},
                 call.model_dump(exclude_none=True), result]
        by_items = client.responses.create(**common, input=items, tool_choice="none",
                                           max_output_tokens=12)
        by_reference = client.responses.create(**common, input=[result], tool_choice="none",
                                               previous_response_id=first.id,
                                               max_output_tokens=12)
    for answer in (by_items, by_reference):
        assert answer.output_text and all(item.type == "message" for item in answer.output)
    assert by_reference.previous_response_id == first.id
    raw = recorder.output(0)
    _replayed(recorder.prompt(1), raw)
    assert recorder.prompt(2) == recorder.prompt(1)


def test_messages_tool_round_trip_replays_the_raw_turn(server: Server) -> None:
    client = server.anthropic()
    messages: list[Any] = [{"role": "user", "content": QUESTION}]
    common = {"model": _model(server), "tools": ANTHROPIC_TOOLS, "extra_body": {"seed": 4}}
    with recording(server.engine) as recorder:
        first = client.messages.create(
            **common, messages=messages, max_tokens=CALL_BUDGET,
            tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True})
        (block,) = first.content
        messages += [{"role": "assistant", "content": [block.model_dump(exclude_none=True)]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": block.id,
                                                   "content": RESULT}]}]
        answer = client.messages.create(**common, messages=messages, max_tokens=12,
                                        tool_choice={"type": "none"})
    assert [b.type for b in answer.content] == ["text"] and answer.content[0].text
    _replayed(recorder.prompt(1), recorder.output(0))


def test_cross_api_round_trip_replays_the_raw_turn(server: Server) -> None:
    """A call made through Chat Completions, its result sent through Anthropic Messages: one
    replay memory behind every API."""
    with recording(server.engine) as recorder:
        first = server.openai().chat.completions.create(
            model=_model(server), messages=[{"role": "user", "content": QUESTION}],
            tools=CHAT_TOOLS, tool_choice={"type": "function", "function": {"name": "get_weather"}},
            parallel_tool_calls=False, seed=5, max_tokens=CALL_BUDGET)
        (call,) = first.choices[0].message.tool_calls
        answer = server.anthropic().messages.create(
            model=_model(server), tools=ANTHROPIC_TOOLS, max_tokens=12,
            tool_choice={"type": "none"}, messages=[
                {"role": "user", "content": QUESTION},
                {"role": "assistant", "content": [{
                    "type": "tool_use", "id": call.id, "name": call.function.name,
                    "input": json.loads(call.function.arguments)}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                              "content": RESULT}]},
            ])
    assert answer.content[0].type == "text"
    _replayed(recorder.prompt(1), recorder.output(0))


# --------------------------------------------------------------------------- tool_choice
MODES = ("auto", "required", "named", "none", "single")


def _chat_mode(server: Server, mode: str, seed: int) -> tuple[list[str], str]:
    choice = {"named": {"type": "function", "function": {"name": "get_time"}},
              "single": "required"}.get(mode, mode)
    response = server.openai().chat.completions.create(
        model=_model(server), messages=[{"role": "user", "content": QUESTION}],
        tools=CHAT_TOOLS, tool_choice=choice, parallel_tool_calls=mode != "single",
        seed=seed, max_tokens=CALL_BUDGET)
    message = response.choices[0].message
    finish = response.choices[0].finish_reason
    _complete([call.function.arguments for call in message.tool_calls or []], finish)
    return [call.function.name for call in message.tool_calls or []], finish


def _responses_mode(server: Server, mode: str, seed: int) -> tuple[list[str], str]:
    choice = {"named": {"type": "function", "name": "get_time"}, "single": "required"}.get(
        mode, mode)
    response = server.openai().responses.create(
        model=_model(server), input=QUESTION, tools=RESPONSES_TOOLS, tool_choice=choice,
        parallel_tool_calls=mode != "single", max_output_tokens=CALL_BUDGET,
        extra_body={"seed": seed})
    calls = [item for item in response.output if item.type == "function_call"]
    finish = "length" if response.status == "incomplete" else "tool_calls" if calls else "stop"
    _complete([call.arguments for call in calls], finish)
    return [call.name for call in calls], finish


def _messages_mode(server: Server, mode: str, seed: int) -> tuple[list[str], str]:
    choice = {"auto": {"type": "auto"}, "required": {"type": "any"},
              "named": {"type": "tool", "name": "get_time"}, "none": {"type": "none"},
              "single": {"type": "any", "disable_parallel_tool_use": True}}[mode]
    message = server.anthropic().messages.create(
        model=_model(server), max_tokens=CALL_BUDGET, tools=ANTHROPIC_TOOLS, tool_choice=choice,
        messages=[{"role": "user", "content": QUESTION}], extra_body={"seed": seed})
    calls = [block for block in message.content if block.type == "tool_use"]
    finish = {"tool_use": "tool_calls", "max_tokens": "length", "end_turn": "stop"}[
        message.stop_reason]
    _complete([json.dumps(call.input) for call in calls], finish)
    return [call.name for call in calls], finish


def _complete(arguments: list[str], finish: str) -> None:
    """Every call's arguments are a JSON object, but for a last one cut short by the budget."""
    for text in arguments[:-1] if finish == "length" else arguments:
        assert isinstance(json.loads(text), dict), text


@pytest.mark.parametrize("api", [_chat_mode, _responses_mode, _messages_mode],
                         ids=["chat", "responses", "messages"])
def test_tool_choice_modes(server: Server, api) -> None:
    """auto, required, a named tool, none, and required without parallel calls: decoded
    together, each obeyed."""
    with ThreadPoolExecutor(len(MODES)) as pool:
        outcomes = dict(zip(MODES, pool.map(lambda mode: api(server, mode, 7), MODES),
                            strict=True))
    for mode, (names, finish) in outcomes.items():
        assert set(names) <= NAMES, mode
        if finish != "length":
            assert (finish == "tool_calls") == bool(names), (mode, finish)
    assert outcomes["required"][0]
    assert outcomes["named"][0] and set(outcomes["named"][0]) == {"get_time"}
    assert outcomes["none"][0] == []
    assert len(outcomes["single"][0]) == 1


# --------------------------------------------------------------------------- structured output
# Properties out of alphabetical order: the order sent is the order written.
ANSWER = {"type": "object", "properties": {
    "warm": {"type": "boolean"},
    "city": {"type": "string", "maxLength": 12},
}, "required": ["warm", "city"], "additionalProperties": False}


def test_structured_output(server: Server) -> None:
    """Chat json_schema, regex and choice; Responses text.format; Anthropic output_config."""
    model = _model(server)
    user = [{"role": "user", "content": "Name a warm city as JSON."}]

    def chat(response_format: dict) -> str:
        response = server.openai().chat.completions.create(
            model=model, messages=user, response_format=response_format, seed=1, max_tokens=60)
        assert response.choices[0].finish_reason == "stop"
        return response.choices[0].message.content

    def responses() -> str:
        response = server.openai().responses.create(
            model=model, input=user, max_output_tokens=60, extra_body={"seed": 1},
            text={"format": {"type": "json_schema", "name": "answer", "schema": ANSWER}})
        assert response.status == "completed"
        return response.output_text

    def messages() -> str:
        message = server.anthropic().messages.create(
            model=model, messages=user, max_tokens=60, extra_body={"seed": 1},
            output_config={"format": {"type": "json_schema", "schema": ANSWER}})
        assert message.stop_reason == "end_turn"
        return message.content[0].text

    jobs = {
        "json_schema": lambda: chat({"type": "json_schema",
                                     "json_schema": {"name": "answer", "schema": ANSWER}}),
        "regex": lambda: chat({"type": "regex", "regex": "[A-Z][a-z]{2,8}, [0-9]{2} C"}),
        "choice": lambda: chat({"type": "choice", "choice": ["Lisbon", "Cairo", "Lima"]}),
        "responses": responses,
        "messages": messages,
    }
    with ThreadPoolExecutor(len(jobs)) as pool:
        futures = {name: pool.submit(job) for name, job in jobs.items()}
        out = {name: future.result() for name, future in futures.items()}
    for name in ("json_schema", "responses", "messages"):
        value = json.loads(out[name])
        jsonschema.validate(value, ANSWER)
        assert list(value) == ["warm", "city"]
    assert re.fullmatch("[A-Z][a-z]{2,8}, [0-9]{2} C", out["regex"])
    assert out["choice"] in ("Lisbon", "Cairo", "Lima")


def test_streamed_events_are_one_line_for_any_line_splitter(server: Server) -> None:
    """Text with characters that `str.splitlines` (httpx's `iter_lines`) breaks lines at, but
    SSE does not (NEL, LINE SEPARATOR, PARAGRAPH SEPARATOR), arrives in whole events for a
    client reading the stream line by line that way: a chat choice, and an Anthropic answer
    whose JSON holds it."""
    text = "one\x85two\u2028three\u2029four"
    user = [{"role": "user", "content": "Say it."}]
    chat = {"model": _model(server), "messages": user, "max_tokens": 40, "stream": True,
            "response_format": {"type": "choice", "choice": [text]}}
    messages = {"model": _model(server), "messages": user, "max_tokens": 40, "stream": True,
                "output_config": {"format": {"type": "json_schema", "schema": {
                    "type": "object", "properties": {"said": {"enum": [text]}},
                    "required": ["said"], "additionalProperties": False}}}}
    answers = {}
    with server.http() as client:
        for path, body, piece in (
                ("/v1/chat/completions", chat,
                 lambda event: event["choices"][0]["delta"].get("content") or ""),
                ("/v1/messages", messages,
                 lambda event: event.get("delta", {}).get("text", ""))):
            with client.stream("POST", path, json=body) as response:
                assert response.status_code == 200
                lines = [line for line in response.iter_lines() if line.startswith("data: ")]
            events = [json.loads(line[6:]) for line in lines if line != "data: [DONE]"]
            answers[path] = "".join(piece(event) for event in events)
    assert answers["/v1/chat/completions"] == text
    assert json.loads(answers["/v1/messages"]) == {"said": text}


def test_responses_text_streamed_matches_plain(server: Server) -> None:
    client = server.openai()
    request = {"model": _model(server), "input": "Name a warm city as JSON.",
               "instructions": "Answer in JSON.", "max_output_tokens": 60,
               "text": {"format": {"type": "json_schema", "name": "answer", "schema": ANSWER}},
               "extra_body": {"seed": 9}}
    plain = client.responses.create(**request)
    events = list(client.responses.create(**request, stream=True))
    kinds = [event.type for event in events]
    assert kinds[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    # the seeded draw is the CPU's (its weight format): it may end at the token budget, which
    # both forms report alike
    ending = "response.completed" if plain.status == "completed" else "response.incomplete"
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", ending]
    assert events[-1].response.status == plain.status
    text = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    assert text == plain.output_text == events[-1].response.output_text
    jsonschema.validate(json.loads(text), ANSWER)


# --------------------------------------------------------------------------- the response store
def test_previous_response_id_and_retrieve(server: Server) -> None:
    client = server.openai()
    model = _model(server)
    with recording(server.engine) as recorder:
        first = client.responses.create(model=model, input="My name is Ada. Say OK.",
                                        max_output_tokens=4, extra_body={"seed": 1})
        second = client.responses.create(model=model, input="What is my name?",
                                         previous_response_id=first.id, max_output_tokens=4)
    assert client.responses.retrieve(first.id).model_dump() == first.model_dump()
    prompt = recorder.prompt(1)
    assert "My name is Ada. Say OK." in prompt and first.output_text in prompt
    assert prompt.index("My name is Ada") < prompt.index("What is my name?")
    assert second.previous_response_id == first.id

    unstored = client.responses.create(model=model, input="Hi", store=False, max_output_tokens=2)
    for missing in (unstored.id, "resp_unknown"):
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(missing)
    with pytest.raises(openai.NotFoundError) as error:
        client.responses.create(model=model, input="Hi", previous_response_id="resp_unknown")
    assert error.value.body["param"] == "previous_response_id"
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)


# --------------------------------------------------------------------------- count_tokens
def test_count_tokens_matches_the_prompt(server: Server) -> None:
    client = server.anthropic()
    request = {"model": _model(server), "system": "Be brief.",
               "messages": [{"role": "user", "content": QUESTION}]}
    bare = client.messages.count_tokens(**request).input_tokens
    with_tools = client.messages.count_tokens(**request, tools=ANTHROPIC_TOOLS).input_tokens
    assert 0 < bare < with_tools
    message = client.messages.create(**request, tools=ANTHROPIC_TOOLS, max_tokens=1)
    assert message.usage.input_tokens == with_tools


# --------------------------------------------------------------------------- /metrics
def test_metrics_after_the_tests_above(server: Server) -> None:
    """Requests by API and status, tokens, time to first token and batch sizes, as Prometheus
    text (the module's earlier tests made the requests)."""
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    for api in ("chat_completions", "completions", "responses", "messages", "count_tokens"):
        assert metric_value(text, "pegmask_requests_total", api=api, status="200") >= 1, api
    assert metric_value(text, "pegmask_requests_total", api="responses", status="404") >= 1
    for name in ("pegmask_prompt_tokens_total", "pegmask_generation_tokens_total",
                 "pegmask_time_to_first_token_seconds_count", "pegmask_batch_size_count",
                 "pegmask_request_duration_seconds_count", "pegmask_mask_seconds_total",
                 "pegmask_prompt_tokens_cached_total"):
        assert metric_value(text, name) > 0, name
    assert "pegmask_running_rows 0.0" in text and "pegmask_queued_requests 0.0" in text


# --------------------------------------------------------------------------- run-batch
def test_cli_run_batch(tmp_path, server: Server) -> None:
    """`pegmask run-batch`: plain bodies and Batch API lines, answered in order; a bad line
    gets its error without failing the others. (The server fixture loaded the model.)"""
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


def test_cli_kv_cache_budget(tmp_path) -> None:
    """`--kv-cache-memory-bytes`: room for 50 tokens of the embedded model's cache; a request
    that can hold more is refused naming max_tokens, a smaller one is answered."""
    from pegmask.cli import main

    lines = [{"prompt": "The capital of France is", "max_tokens": 100},
             {"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}]
    source, target = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    token_bytes = 30 * 2 * 3 * 64 * 4
    assert main(["run-batch", "-i", str(source), "-o", str(target), "--no-decode-first",
                 "--kv-cache-memory-bytes", str(50 * token_bytes)]) == 1
    refused, answered = [json.loads(line) for line in target.read_text().splitlines()]
    assert refused["error"]["param"] == "max_tokens"
    assert "at most 50 (kv_cache_bytes)" in refused["error"]["message"]
    assert "Paris" in answered["choices"][0]["text"]
