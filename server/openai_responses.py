"""OpenAI Responses (`POST /v1/responses`, `GET` / `DELETE /v1/responses/{id}`).

A request's `input` (a string or items: `message`, `function_call`, `function_call_output`,
`reasoning`), `instructions` and, with `previous_response_id`, the stored conversation before
it, are normalized by `pegmask.dialects.history` into the chat history every renderer reads.
Function tools, `tool_choice`, `parallel_tool_calls`, `text.format` (json_schema, json_object),
`max_output_tokens` and `reasoning.effort` map onto the engine's chat request. The answer is a
list of output items (reasoning, message, function calls); streamed, the documented event
sequence: `response.created`, `response.in_progress`, then per item `output_item.added`, its
content part, text or argument deltas and their `.done` events, `output_item.done`, and finally
`response.completed` (`response.incomplete` when `max_output_tokens` cut it short; `error` and
`response.failed` when it fails once started).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request

from pegmask.dialects.history import HistoryError, normalize_history, normalize_tools
from pegmask.engine.decode import TokenLogprob
from pegmask.engine.engine import GenerationResult, GenerationStream
from pegmask.engine.requests import int_field
from pegmask.grammars.vocab import Vocabulary
from pegmask.server import sse
from pegmask.server.errors import APIError
from pegmask.server.gateway import (
    ServerContext,
    boolean,
    log_unknown_fields,
    string_or_none,
    text_only,
)
from pegmask.server.openai_chat import token_text

# Request fields this module reads (the rest are descriptive or logged as unknown).
_FIELDS = frozenset({"input", "instructions", "tools", "tool_choice", "parallel_tool_calls",
                     "text", "max_output_tokens", "reasoning", "previous_response_id",
                     "include", "truncation", "top_logprobs", "background", "conversation",
                     "prompt", "max_tool_calls"})
# Sampling fields passed through as they are (OpenAI's and pegmask's extensions).
_PASSED = ("temperature", "top_p", "top_k", "min_p", "seed", "stop", "frequency_penalty",
           "presence_penalty", "repetition_penalty", "logit_bias", "stop_token_ids",
           "ignore_eos", "min_tokens", "close_on_length")
_LOGPROBS_INCLUDE = "message.output_text.logprobs"
# Engine options by the request field they come from.
_RENAMED = {"max_tokens": "max_output_tokens", "response_format": "text",
            "chat_template_kwargs": "reasoning"}


def register(app: FastAPI, context: ServerContext) -> None:
    """Add the Responses routes to `app`."""
    store = ResponseStore(context.config.response_store_size)

    @app.post("/v1/responses")
    async def create(request: Request) -> Any:
        body = await context.body(request)
        context.check_model(body.get("model"))
        plan = await context.convert(request, _plan, body, store)
        streamed = boolean(body, "stream")
        stream = await context.start(request, plan.messages, plan.options, _RENAMED)
        vocab = context.engine.vocab
        if not streamed:
            result = await context.finish(request, stream)
            builder = _OutputBuilder(vocab, plan.logprobs)
            builder.message(result)
            response = _response(plan, context.model, builder.items, result, "completed")
            store.keep(plan, response)
            return response
        builder = _OutputBuilder(vocab, plan.logprobs)
        events = _stream(plan, stream, context.model, builder, store)
        return sse.streaming_response(
            events, lambda error: _failed(plan, context.model, builder, error), stream.close)

    @app.get("/v1/responses/{response_id}")
    async def retrieve(response_id: str) -> Any:
        return store.response(response_id)

    @app.delete("/v1/responses/{response_id}")
    async def delete(response_id: str) -> Any:
        store.delete(response_id)
        return {"id": response_id, "object": "response.deleted", "deleted": True}


# --------------------------------------------------------------------------- the request
@dataclass
class _Plan:
    """A Responses request mapped onto the engine: messages and options, plus what the
    response echoes back."""

    body: dict[str, Any]
    items: list[Any]  # the whole conversation as Responses input items
    messages: list[dict[str, Any]]
    options: dict[str, Any]
    logprobs: bool
    id: str = field(default_factory=lambda: f"resp_{uuid.uuid4().hex}")


def _plan(body: dict[str, Any], store: ResponseStore) -> _Plan:
    log_unknown_fields(body, "responses", _FIELDS | set(_PASSED))
    for name in ("background", "conversation", "prompt", "max_tool_calls"):
        if body.get(name) is not None and body[name] is not False:
            raise APIError(400, f"{name} is not supported by this server", name)
    instructions = string_or_none(body, "instructions")
    source = body.get("input")
    if isinstance(source, str):
        items: list[Any] = [{"type": "message", "role": "user", "content": source}]
    elif isinstance(source, list) and all(isinstance(item, dict) for item in source):
        items = list(source)
    else:
        raise APIError(400, "input must be a string or a list of items", "input")
    previous = string_or_none(body, "previous_response_id")
    if previous is not None:
        items = store.conversation(previous) + items
    if not items:
        raise APIError(400, "input is empty", "input")
    try:
        history = normalize_history(items, "responses", instructions=instructions,
                                    strict=True)
    except HistoryError as exc:
        raise APIError(400, str(exc), "input") from exc
    text_only(history, "input")
    boolean(body, "store", True)
    options: dict[str, Any] = {name: body[name] for name in _PASSED if body.get(name) is not None}
    if body.get("max_output_tokens") is not None:
        options["max_tokens"] = body["max_output_tokens"]
    tools = _tools(body.get("tools"))
    if tools:
        options["tools"] = tools
    if body.get("tool_choice") is not None:
        options["tool_choice"] = _tool_choice(body["tool_choice"])
    if body.get("parallel_tool_calls") is not None:
        options["parallel_tool_calls"] = body["parallel_tool_calls"]
    response_format = _text_format(body.get("text"))
    if response_format is not None:
        options["response_format"] = response_format
    reasoning = body.get("reasoning")
    if reasoning is not None:
        if not isinstance(reasoning, Mapping):
            raise APIError(400, "reasoning must be an object", "reasoning")
        if reasoning.get("effort") is not None:
            if not isinstance(reasoning["effort"], str):
                raise APIError(400, "reasoning.effort must be a string", "reasoning")
            options["chat_template_kwargs"] = {"reasoning_effort": reasoning["effort"]}
    include = body.get("include")
    if include is None:
        include = []
    if not isinstance(include, list) or not all(isinstance(item, str) for item in include):
        raise APIError(400, "include must be a list of strings", "include")
    top_logprobs = int_field("top_logprobs", body.get("top_logprobs"), 0)
    logprobs = _LOGPROBS_INCLUDE in include or top_logprobs > 0
    if logprobs:
        options["logprobs"] = True
        options["top_logprobs"] = top_logprobs
    return _Plan(body, items, history.to_template_messages(), options, logprobs)


def _tools(tools: Any) -> list[dict[str, Any]]:
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise APIError(400, "tools must be a list", "tools")
    for i, tool in enumerate(tools):
        if not isinstance(tool, Mapping) or tool.get("type", "function") != "function":
            kind = tool.get("type") if isinstance(tool, Mapping) else type(tool).__name__
            raise APIError(400, f"tools[{i}]: only function tools are supported, not {kind!r}",
                           "tools")
        if not isinstance(tool.get("name"), str):
            raise APIError(400, f"tools[{i}] needs a name", "tools")
    try:
        return normalize_tools(tools)
    except HistoryError as exc:
        raise APIError(400, str(exc), "tools") from exc


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, str):
        return choice
    if isinstance(choice, Mapping) and choice.get("type") == "function" and choice.get("name"):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise APIError(400, "tool_choice must be auto, none, required or "
                        '{"type": "function", "name": ...}', "tool_choice")


def _text_format(text: Any) -> dict[str, Any] | None:
    if text is None:
        return None
    if not isinstance(text, Mapping):
        raise APIError(400, "text must be an object", "text")
    spec = text.get("format")
    if spec is None:
        return None
    if not isinstance(spec, Mapping):
        raise APIError(400, "text.format must be an object", "text")
    kind = spec.get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        strict = spec.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise APIError(400, "text.format.strict must be a boolean", "text")
        return {"type": "json_schema", "json_schema": {
            "name": spec.get("name", "output"), "schema": spec.get("schema", {}),
            "strict": bool(strict)}}
    raise APIError(400, f"text.format type {kind!r} is not supported", "text")


# --------------------------------------------------------------------------- the store
class ResponseStore:
    """The last `size` responses (LRU), for `previous_response_id` and `GET`."""

    def __init__(self, size: int):
        self.size = size
        self._entries: OrderedDict[str, tuple[list[Any], dict[str, Any]]] = OrderedDict()
        self._lock = threading.Lock()

    def keep(self, plan: _Plan, response: dict[str, Any]) -> None:
        if plan.body.get("store") is False or self.size < 1:
            return
        with self._lock:
            self._entries[response["id"]] = (plan.items, response)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)

    def _get(self, response_id: str, param: str | None) -> tuple[list[Any], dict[str, Any]]:
        with self._lock:
            entry = self._entries.get(response_id)
            if entry is not None:
                self._entries.move_to_end(response_id)
        if entry is None:
            raise APIError(404, f"no stored response with id {response_id!r}", param)
        return entry

    def conversation(self, response_id: str) -> list[Any]:
        """The items a follow-up of `response_id` starts from: its input and its output."""
        items, response = self._get(response_id, "previous_response_id")
        return items + [_as_input(item) for item in response["output"]]

    def response(self, response_id: str) -> dict[str, Any]:
        return self._get(response_id, None)[1]

    def delete(self, response_id: str) -> None:
        self._get(response_id, None)
        with self._lock:
            self._entries.pop(response_id, None)


def _as_input(item: dict[str, Any]) -> dict[str, Any]:
    """An output item as input for the next turn (what a client would send back)."""
    return {key: value for key, value in item.items() if key not in ("status", "id")} | (
        {"id": item["id"]} if item.get("type") == "reasoning" else {})


# --------------------------------------------------------------------------- the answer
def _response(plan: _Plan, model: str, items: list[dict[str, Any]],
              result: GenerationResult | None, status: str) -> dict[str, Any]:
    body = plan.body
    incomplete = result is not None and result.finish_reason == "length"
    if result is not None:
        status = "incomplete" if incomplete else "completed"
    usage = None
    if result is not None:
        usage = {"input_tokens": result.usage["prompt_tokens"],
                 "input_tokens_details": result.usage["prompt_tokens_details"],
                 "output_tokens": result.usage["completion_tokens"],
                 "output_tokens_details": {"reasoning_tokens": 0},
                 "total_tokens": result.usage["total_tokens"]}
    text_format = (body.get("text") or {}).get("format") or {"type": "text"}
    return {
        "id": plan.id, "object": "response", "created_at": int(time.time()),
        "status": status, "model": model, "output": items,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "instructions": body.get("instructions"),
        "tools": body.get("tools") or [], "tool_choice": body.get("tool_choice", "auto"),
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "temperature": body.get("temperature"), "top_p": body.get("top_p"),
        "max_output_tokens": body.get("max_output_tokens"),
        "previous_response_id": body.get("previous_response_id"),
        "reasoning": body.get("reasoning"), "text": {"format": text_format},
        "metadata": body.get("metadata") or {}, "store": body.get("store", True),
        "usage": usage,
    }


class _OutputBuilder:
    """Output items from chat deltas, and the stream events that build them."""

    def __init__(self, vocab: Vocabulary, logprobs: bool):
        self.vocab = vocab
        self.logprobs = logprobs
        self.items: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None
        self._sequence = 0

    def event(self, kind: str, **payload: Any) -> str:
        body = {"type": kind, "sequence_number": self._sequence, **payload}
        self._sequence += 1
        return sse.named(kind, body)

    def message(self, result: GenerationResult) -> None:
        """The items of a whole (non-streamed) answer."""
        message = result.message
        deltas: list[dict[str, Any]] = []
        if message.get("reasoning_content"):
            deltas.append({"reasoning_content": message["reasoning_content"]})
        if message.get("content"):
            deltas.append({"content": message["content"]})
        for index, call in enumerate(message.get("tool_calls") or []):
            deltas.append({"tool_calls": [{"index": index, "id": call["id"], "type": "function",
                                           "function": {"name": call["function"]["name"],
                                                        "arguments": ""}}]})
            deltas.append({"tool_calls": [{"index": index, "function": {
                "arguments": call["function"]["arguments"]}}]})
        for i, delta in enumerate(deltas):
            entries = result.logprobs if i == 0 and "content" in delta else ()
            for _ in self.feed(delta, entries or ()):
                pass
        for _ in self.close():
            pass

    def feed(self, delta: dict[str, Any], logprobs: Any = ()) -> list[str]:
        """Events for one chat delta (opening and closing items as its kind changes)."""
        out: list[str] = []
        if delta.get("reasoning_content"):
            out += self._ensure("reasoning")
            out += self._text(delta["reasoning_content"], "response.reasoning_text.delta", ())
        if delta.get("content"):
            out += self._ensure("message")
            out += self._text(delta["content"], "response.output_text.delta", logprobs)
        for call in delta.get("tool_calls") or []:
            function = call.get("function") or {}
            if call.get("id") is not None:
                out += self.close()
                item = {"type": "function_call", "id": f"fc_{uuid.uuid4().hex}",
                        "call_id": call["id"], "name": function.get("name", ""),
                        "arguments": "", "status": "in_progress"}
                out += self._add(item)
            piece = function.get("arguments") or ""
            if piece and self._open is not None and self._open["type"] == "function_call":
                self._open["arguments"] += piece
                out.append(self.event("response.function_call_arguments.delta",
                                      item_id=self._open["id"], output_index=len(self.items) - 1,
                                      delta=piece))
        return out

    def close(self, status: str = "completed") -> list[str]:
        """Close the open item (its `.done` events)."""
        item, self._open = self._open, None
        if item is None:
            return []
        index = len(self.items) - 1
        out = []
        item["status"] = status
        if item["type"] == "function_call":
            out.append(self.event("response.function_call_arguments.done", item_id=item["id"],
                                  output_index=index, arguments=item["arguments"],
                                  name=item["name"]))
        else:
            part = item["content"][0]
            kind = "output_text" if item["type"] == "message" else "reasoning_text"
            done = {"item_id": item["id"], "output_index": index, "content_index": 0,
                    "text": part["text"]}
            if kind == "output_text":
                done["logprobs"] = part.get("logprobs", [])
            out.append(self.event(f"response.{kind}.done", **done))
            out.append(self.event("response.content_part.done", item_id=item["id"],
                                  output_index=index, content_index=0, part=part))
        if item["type"] == "reasoning":
            del item["status"]
        out.append(self.event("response.output_item.done", output_index=index, item=item))
        return out

    def _ensure(self, kind: str) -> list[str]:
        if self._open is not None and self._open["type"] == kind:
            return []
        out = self.close()
        if kind == "message":
            part: dict[str, Any] = {"type": "output_text", "text": "", "annotations": []}
            if self.logprobs:
                part["logprobs"] = []
            item = {"type": "message", "id": f"msg_{uuid.uuid4().hex}", "role": "assistant",
                    "status": "in_progress", "content": [part]}
        else:
            part = {"type": "reasoning_text", "text": ""}
            item = {"type": "reasoning", "id": f"rs_{uuid.uuid4().hex}", "summary": [],
                    "content": [part]}
        out += self._add(item)
        index = len(self.items) - 1
        out.append(self.event("response.content_part.added", item_id=item["id"],
                              output_index=index, content_index=0, part=dict(part)))
        return out

    def _add(self, item: dict[str, Any]) -> list[str]:
        self.items.append(item)
        self._open = item
        snapshot = {key: (list(value) if isinstance(value, list) else value)
                    for key, value in item.items()}
        if item["type"] != "function_call":
            snapshot["content"] = []
        return [self.event("response.output_item.added", output_index=len(self.items) - 1,
                           item=snapshot)]

    def _text(self, piece: str, kind: str, logprobs: Any) -> list[str]:
        item = self._open
        assert item is not None
        part = item["content"][0]
        part["text"] += piece
        payload: dict[str, Any] = {"item_id": item["id"], "output_index": len(self.items) - 1,
                                   "content_index": 0, "delta": piece}
        if kind == "response.output_text.delta":
            entries = [self._logprob(entry) for entry in logprobs] if self.logprobs else []
            if self.logprobs:
                part["logprobs"].extend(entries)
            payload["logprobs"] = entries
        return [self.event(kind, **payload)]

    def _logprob(self, entry: TokenLogprob) -> dict[str, Any]:
        text, data = token_text(self.vocab, entry.token_id)
        top = []
        for token_id, logprob in entry.top:
            alt, alt_data = token_text(self.vocab, token_id)
            top.append({"token": alt, "logprob": logprob, "bytes": alt_data})
        return {"token": text, "logprob": entry.logprob, "bytes": data, "top_logprobs": top}


async def _stream(plan: _Plan, stream: GenerationStream, model: str, builder: _OutputBuilder,
                  store: ResponseStore) -> AsyncIterator[str]:
    yield builder.event("response.created",
                        response=_response(plan, model, [], None, "in_progress"))
    yield builder.event("response.in_progress",
                        response=_response(plan, model, [], None, "in_progress"))
    async for event in stream.aevents():
        pending = list(event.logprobs)
        for delta in event.deltas:
            for chunk in builder.feed(delta, pending if "content" in delta else ()):
                yield chunk
            if "content" in delta:
                pending = []
    result = stream.result
    assert result is not None
    for chunk in builder.close("incomplete" if result.finish_reason == "length" else
                               "completed"):
        yield chunk
    response = _response(plan, model, builder.items, result, "completed")
    store.keep(plan, response)
    kind = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
    yield builder.event(kind, response=response)


def _failed(plan: _Plan, model: str, builder: _OutputBuilder, error: APIError) -> list[str]:
    """The events of a stream that failed once started: `error`, then `response.failed` with
    the output so far."""
    code = str(error.status)
    response = _response(plan, model, builder.items, None, "failed")
    response["error"] = {"code": code, "message": error.message}
    return [builder.event("error", code=code, message=error.message, param=error.param),
            builder.event("response.failed", response=response)]
