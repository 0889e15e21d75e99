"""Anthropic Messages (`POST /v1/messages`, `POST /v1/messages/count_tokens`).

`system`, content blocks (`text`, `tool_use`, `tool_result`, `thinking`) and tools with
`input_schema` are normalized by `pegmask.dialects.history` into the chat history every renderer
reads; `tool_choice` (`auto`, `any`, `tool`, `none`, `disable_parallel_tool_use`), `thinking`,
`stop_sequences`, `max_tokens` and `output_config` (effort, and a json_schema format) map onto
the engine's chat request. The answer's blocks are thinking, text and tool_use (input as an
object); streamed, Anthropic's event sequence:
`message_start`, per block `content_block_start`, `_delta` (`thinking_delta`, `text_delta`,
`input_json_delta`) and `_stop`, then `message_delta` (stop_reason, usage) and `message_stop`.
Tool-use ids are the engine's call ids, shared with the OpenAI APIs (one replay memory).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pydantic_core
from fastapi import FastAPI, Request

from pegmask.dialects.history import HistoryError, normalize_history, normalize_tools
from pegmask.engine.engine import GenerationResult, GenerationStream
from pegmask.server import sse
from pegmask.server.errors import APIError, error_body
from pegmask.server.gateway import ServerContext, boolean, log_unknown_fields, text_only

_FIELDS = frozenset({"system", "tools", "tool_choice", "thinking", "stop_sequences",
                     "max_tokens", "container", "mcp_servers", "output_config", "output_format"})
# Sampling fields passed through as they are (Anthropic's, and pegmask's extensions).
_PASSED = ("temperature", "top_p", "top_k", "min_p", "seed", "frequency_penalty",
           "presence_penalty", "repetition_penalty", "logit_bias", "stop_token_ids",
           "ignore_eos", "min_tokens", "close_on_length")
# Engine options by the request field they come from.
_RENAMED = {"stop": "stop_sequences", "response_format": "output_config",
            "chat_template_kwargs": "thinking"}
_STOP_REASONS = {"tool_calls": "tool_use", "length": "max_tokens", "stop": "end_turn"}


def register(app: FastAPI, context: ServerContext) -> None:
    """Add the Messages routes to `app`."""

    @app.post("/v1/messages")
    async def messages(request: Request) -> Any:
        body = await context.body(request)
        context.check_model(body.get("model"))
        if body.get("max_tokens") is None:
            raise APIError(400, "max_tokens is required", "max_tokens")
        messages, options = await context.convert(request, _request, body)
        streamed = boolean(body, "stream")
        stream = await context.start(request, messages, options, _RENAMED)
        message_id = f"msg_{uuid.uuid4().hex}"
        if not streamed:
            result = await context.finish(request, stream)
            return _message(message_id, context.model, result)
        events = _stream(message_id, context.model, stream)
        return sse.streaming_response(
            events, lambda error: [sse.named("error", error_body(error, "anthropic"))],
            stream.close)

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request) -> Any:
        body = await context.body(request)
        context.check_model(body.get("model"))
        messages, options = await context.convert(request, _request, body, counting=True)
        return {"input_tokens": await context.prompt_tokens(request, messages, options,
                                                            _RENAMED)}


# --------------------------------------------------------------------------- the request
def _request(body: dict[str, Any], *, counting: bool = False) -> tuple[list[Any], dict]:
    """(chat messages, engine options) of a Messages request body."""
    log_unknown_fields(body, "messages", _FIELDS | set(_PASSED))
    for name in ("container", "mcp_servers"):
        if body.get(name) not in (None, "", []):
            raise APIError(400, f"{name} is not supported by this server", name)
    source = body.get("messages")
    if not isinstance(source, list) or not all(isinstance(m, dict) for m in source):
        raise APIError(400, "messages must be a list of message objects", "messages")
    if not source:
        raise APIError(400, "messages is empty", "messages")
    system = body.get("system")
    if system is not None and not isinstance(system, (str, list)):
        raise APIError(400, "system must be a string or a list of text blocks", "system")
    try:
        history = normalize_history(source, "anthropic", system=system, strict=True)
    except HistoryError as exc:
        raise APIError(400, str(exc), "messages") from exc
    text_only(history, "messages")
    options: dict[str, Any] = {name: body[name] for name in _PASSED if body.get(name) is not None}
    if not counting:
        options["max_tokens"] = body["max_tokens"]
    tools = _tools(body.get("tools"))
    if tools:
        options["tools"] = tools
    choice = body.get("tool_choice")
    if choice is not None:
        options.update(_tool_choice(choice))
    if body.get("stop_sequences") is not None:
        stops = body["stop_sequences"]
        if not isinstance(stops, list):
            raise APIError(400, "stop_sequences must be a list of strings", "stop_sequences")
        if stops:
            options["stop"] = stops
    template_kwargs: dict[str, Any] = {}
    thinking = body.get("thinking")
    if thinking is not None:
        budget = thinking.get("budget_tokens") if isinstance(thinking, Mapping) else None
        if not isinstance(thinking, Mapping) or thinking.get("type") not in (
                "enabled", "disabled", "adaptive") or not (
                budget is None or (isinstance(budget, int) and not isinstance(budget, bool))):
            raise APIError(400, 'thinking must be {"type": "enabled" | "disabled", '
                                '"budget_tokens": an integer}', "thinking")
        template_kwargs["enable_thinking"] = thinking["type"] != "disabled"
    options.update(_output_config(body, template_kwargs))
    if template_kwargs:
        options["chat_template_kwargs"] = template_kwargs
    return history.to_template_messages(), options


def _output_config(body: Mapping[str, Any], template_kwargs: dict[str, Any]) -> dict[str, Any]:
    """Structured output (`output_config.format`, or the beta's top-level `output_format`:
    `{"type": "json_schema", "schema": {...}}`) as the engine's response_format; the effort
    goes to the chat template as the reasoning effort."""
    config = body.get("output_config")
    if config is None:
        config = {}
    if not isinstance(config, Mapping):
        raise APIError(400, "output_config must be an object", "output_config")
    effort = config.get("effort")
    if effort is not None:
        if not isinstance(effort, str):
            raise APIError(400, "output_config.effort must be a string", "output_config")
        template_kwargs["reasoning_effort"] = effort
    spec, param = config.get("format"), "output_config"
    if spec is None:
        spec, param = body.get("output_format"), "output_format"
    if spec is None:
        return {}
    if not isinstance(spec, Mapping) or spec.get("type") != "json_schema" or not isinstance(
            spec.get("schema"), Mapping):
        raise APIError(400, f'{param} format must be {{"type": "json_schema", "schema": {{...}}}}',
                       param)
    return {"response_format": {"type": "json_schema",
                                "json_schema": {"name": "output", "schema": spec["schema"]}}}


def _tools(tools: Any) -> list[dict[str, Any]]:
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise APIError(400, "tools must be a list", "tools")
    for i, tool in enumerate(tools):
        if not isinstance(tool, Mapping) or "input_schema" not in tool:
            kind = tool.get("type") if isinstance(tool, Mapping) else type(tool).__name__
            raise APIError(400, f"tools[{i}]: only custom tools with an input_schema are "
                                f"supported, not {kind!r}", "tools")
        if tool.get("type", "custom") != "custom":
            raise APIError(400, f"tools[{i}]: tool type {tool['type']!r} is not supported",
                           "tools")
    try:
        return normalize_tools([{k: v for k, v in tool.items() if k not in ("type",
                                                                              "cache_control")}
                                for tool in tools])
    except HistoryError as exc:
        raise APIError(400, str(exc), "tools") from exc


def _tool_choice(choice: Any) -> dict[str, Any]:
    if not isinstance(choice, Mapping):
        raise APIError(400, "tool_choice must be an object", "tool_choice")
    kind = choice.get("type")
    options: dict[str, Any] = {}
    single = choice.get("disable_parallel_tool_use")
    if single is not None and not isinstance(single, bool):
        raise APIError(400, "tool_choice.disable_parallel_tool_use must be a boolean",
                       "tool_choice")
    if single:
        options["parallel_tool_calls"] = False
    if kind == "auto":
        options["tool_choice"] = "auto"
    elif kind == "any":
        options["tool_choice"] = "required"
    elif kind == "none":
        options["tool_choice"] = "none"
    elif kind == "tool" and isinstance(choice.get("name"), str):
        options["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    else:
        raise APIError(400, "tool_choice type must be auto, any, tool (with a name) or none",
                       "tool_choice")
    return options


# --------------------------------------------------------------------------- the answer
def _stop_reason(result: GenerationResult) -> tuple[str, str | None]:
    choice = result.choices[0]
    if choice.stop_string is not None:
        return "stop_sequence", choice.stop_string
    return _STOP_REASONS.get(choice.finish_reason, "end_turn"), None


def _message(message_id: str, model: str, result: GenerationResult) -> dict[str, Any]:
    message = result.message
    content: list[dict[str, Any]] = []
    if message.get("reasoning_content"):
        content.append({"type": "thinking", "thinking": message["reasoning_content"],
                        "signature": ""})
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or []:
        content.append({"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
                        "input": _input(call["function"]["arguments"])})
    stop_reason, stop_sequence = _stop_reason(result)
    return {"id": message_id, "type": "message", "role": "assistant", "model": model,
            "content": content, "stop_reason": stop_reason, "stop_sequence": stop_sequence,
            "usage": {"input_tokens": result.usage["prompt_tokens"],
                      "output_tokens": result.usage["completion_tokens"]}}


def _input(arguments: str) -> dict[str, Any]:
    """A call's arguments as the object Anthropic's `input` holds. A call cut short by
    max_tokens keeps what its partial JSON holds, as the SDKs read the same arguments streamed
    (`input_json_delta`)."""
    try:
        value = pydantic_core.from_json(arguments, allow_partial=True)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


async def _stream(message_id: str, model: str, stream: GenerationStream) -> AsyncIterator[str]:
    prompt_tokens = len(stream.submission.spec.prompt_ids)
    yield sse.named("message_start", {"type": "message_start", "message": {
        "id": message_id, "type": "message", "role": "assistant", "model": model,
        "content": [], "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": prompt_tokens, "output_tokens": 0}}})
    yield sse.named("ping", {"type": "ping"})
    blocks = _Blocks()
    async for event in stream.aevents():
        for delta in event.deltas:
            for chunk in blocks.feed(delta):
                yield chunk
    for chunk in blocks.close():
        yield chunk
    result = stream.result
    assert result is not None
    stop_reason, stop_sequence = _stop_reason(result)
    yield sse.named("message_delta", {
        "type": "message_delta",
        "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
        "usage": {"output_tokens": result.usage["completion_tokens"]}})
    yield sse.named("message_stop", {"type": "message_stop"})


class _Blocks:
    """Content-block events from chat deltas: a block opens when the kind of delta changes."""

    def __init__(self) -> None:
        self.index = -1
        self.open: str | None = None

    def feed(self, delta: dict[str, Any]) -> list[str]:
        out: list[str] = []
        if delta.get("reasoning_content"):
            out += self._ensure("thinking", {"type": "thinking", "thinking": "",
                                             "signature": ""})
            out.append(self._delta({"type": "thinking_delta",
                                    "thinking": delta["reasoning_content"]}))
        if delta.get("content"):
            out += self._ensure("text", {"type": "text", "text": ""})
            out.append(self._delta({"type": "text_delta", "text": delta["content"]}))
        for call in delta.get("tool_calls") or []:
            function = call.get("function") or {}
            if call.get("id") is not None:
                out += self.close()
                out += self._ensure("tool_use", {"type": "tool_use", "id": call["id"],
                                                 "name": function.get("name", ""), "input": {}})
            piece = function.get("arguments") or ""
            if piece and self.open == "tool_use":
                out.append(self._delta({"type": "input_json_delta", "partial_json": piece}))
        return out

    def close(self) -> list[str]:
        if self.open is None:
            return []
        self.open = None
        return [sse.named("content_block_stop", {"type": "content_block_stop",
                                                 "index": self.index})]

    def _ensure(self, kind: str, block: dict[str, Any]) -> list[str]:
        if self.open == kind and kind != "tool_use":
            return []
        out = self.close()
        self.index += 1
        self.open = kind
        out.append(sse.named("content_block_start", {"type": "content_block_start",
                                                     "index": self.index,
                                                     "content_block": block}))
        return out

    def _delta(self, delta: dict[str, Any]) -> str:
        return sse.named("content_block_delta", {"type": "content_block_delta",
                                                 "index": self.index, "delta": delta})
