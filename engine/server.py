"""The OpenAI-compatible HTTP server: /v1/chat/completions, /v1/completions (streamed as SSE
or not) and /v1/models, on one `Engine`.

Bodies are parsed with `json.loads`, which keeps key order: the order of a JSON Schema's
properties is the order the grammar writes them in. Bad requests get OpenAI's 400 error shape
before any decoding; generation runs in worker threads, one at a time (the engine's lock).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from pegmask.engine.engine import Engine, GenerationResult, GenerationStream
from pegmask.engine.requests import InvalidRequestError, openai_request


def error_body(message: str, param: str | None = None, code: str | None = None,
               kind: str = "invalid_request_error") -> dict[str, Any]:
    """OpenAI's error object."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def chat_message(message: dict[str, Any]) -> dict[str, Any]:
    """An assistant message as the API returns it: no empty `tool_calls`, no null reasoning."""
    out = {"role": "assistant", "content": message.get("content")}
    if message.get("reasoning_content") is not None:
        out["reasoning_content"] = message["reasoning_content"]
    if message.get("tool_calls"):
        out["tool_calls"] = message["tool_calls"]
    return out


def completion_response(result: GenerationResult, model: str, *, chat: bool,
                        response_id: str | None = None) -> dict[str, Any]:
    """The non-streamed response object (chat.completion or text_completion)."""
    choice: dict[str, Any] = {"index": 0, "finish_reason": result.finish_reason,
                              "logprobs": None}
    if chat:
        choice["message"] = chat_message(result.message)
    else:
        choice["text"] = result.text
    return {
        "id": response_id or _new_id(chat),
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": result.usage,
    }


def create_app(engine: Engine) -> FastAPI:
    """The FastAPI application serving `engine`."""
    app = FastAPI(title="pegmask", version="0.1.0")
    model = engine.model_name

    @app.exception_handler(InvalidRequestError)
    async def invalid_request(_: Request, exc: InvalidRequestError) -> JSONResponse:
        return JSONResponse(error_body(str(exc), exc.param), status_code=400)

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, exc: HTTPException) -> JSONResponse:
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        return JSONResponse(error_body(str(exc.detail), kind=kind), status_code=exc.status_code)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [
            {"id": model, "object": "model", "created": 0, "owned_by": "pegmask"},
        ]}

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        return await _complete(engine, model, await _json_body(request), chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        return await _complete(engine, model, await _json_body(request), chat=False)

    return app


async def _json_body(request: Request) -> Any:
    try:
        return json.loads(await request.body())
    except ValueError as exc:
        raise InvalidRequestError(f"the request body is not valid JSON: {exc}") from exc


async def _complete(engine: Engine, model: str, body: Any, *, chat: bool) -> Any:
    source, options = openai_request(body, chat=chat)
    stream = bool(body.get("stream"))
    if not stream:
        result = await run_in_threadpool(engine.generate, source, **options)
        return completion_response(result, model, chat=chat)
    # Validation and preparation happen here, so errors are still a 400, not a broken stream.
    deltas = await run_in_threadpool(engine.generate, source, stream=True, **options)
    stream_options = body.get("stream_options") or {}
    include_usage = isinstance(stream_options, dict) and bool(stream_options.get("include_usage"))
    events = _sse(deltas, model, chat=chat, include_usage=include_usage)
    return StreamingResponse(events, media_type="text/event-stream")


def _sse(stream: GenerationStream, model: str, *, chat: bool,
         include_usage: bool) -> Iterator[str]:
    """Server-sent events: one chunk per delta, a chunk with the finish_reason, the usage chunk
    when asked for, then `[DONE]`."""
    response_id = _new_id(chat)
    created = int(time.time())

    def chunk(choices: list[dict[str, Any]], **extra: Any) -> str:
        body = {"id": response_id, "object": "chat.completion.chunk" if chat else
                "text_completion", "created": created, "model": model, "choices": choices,
                **extra}
        return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

    def choice(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        if chat:
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return {"index": 0, "text": delta.get("text", ""), "logprobs": None,
                "finish_reason": finish_reason}

    try:
        for delta in stream:
            yield chunk([choice(delta)])
        result = stream.result
        yield chunk([choice({}, result.finish_reason)])
        if include_usage:
            yield chunk([], usage=result.usage)
    except Exception as exc:  # noqa: BLE001 - the stream has started: report, then end it
        yield f"data: {json.dumps(error_body(str(exc), kind='server_error'))}\n\n"
    finally:
        stream.close()  # a client that went away frees the engine
    yield "data: [DONE]\n\n"


def _new_id(chat: bool) -> str:
    return f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
