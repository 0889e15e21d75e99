"""What every API route of the server shares: reading the body, checking the model name, handing
the request to the engine off the event loop, and waiting for it (cancelled when the client goes
away), with field checks the three APIs share. Plus the ASGI middleware that checks the API key
and the body size, answers a route's errors in its API's shape, and counts requests by API and
status for /metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import json
import logging
import re
from collections.abc import Awaitable, Callable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
from fastapi import Request
from starlette.concurrency import run_in_threadpool

from pegmask.dialects.history import History
from pegmask.engine.background import LARGE_REQUEST_SIZE, body_size
from pegmask.engine.engine import Engine, GenerationResult, GenerationStream
from pegmask.engine.requests import InvalidRequestError
from pegmask.server.errors import APIError, ApiStyle, as_api_error, error_body

logger = logging.getLogger("pegmask.server")
T = TypeVar("T")

DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
# Arrays and objects nested deeper than this are refused before decoding: real requests nest
# a few tens of levels (a tool's schema included), while a deep body would exhaust the
# decoder's and every later walk's recursion (100,000 nested arrays: a RecursionError).
DEFAULT_MAX_BODY_DEPTH = 128
_DISCONNECT_POLL_S = 0.25
# Fields that only describe the request (accepted, no effect on the output).
DESCRIPTIVE_FIELDS = frozenset({
    "model", "user", "metadata", "store", "service_tier", "stream", "stream_options",
    "prediction", "modalities", "audio", "web_search_options", "request_id",
    "safety_identifier", "prompt_cache_key", "verbosity", "messages", "prompt", "max_tokens",
    "max_completion_tokens", "logprobs", "top_logprobs", "chat_template_kwargs",
    "reasoning_effort", "skip_special_tokens", "spaces_between_special_tokens",
    "include_stop_str_in_output", "add_generation_prompt",
})

# URL path -> (API name for /metrics, error style)
_ROUTES: dict[str, tuple[str, ApiStyle]] = {
    "/v1/chat/completions": ("chat_completions", "openai"),
    "/v1/completions": ("completions", "openai"),
    "/v1/responses": ("responses", "openai"),
    "/v1/messages": ("messages", "anthropic"),
    "/v1/messages/count_tokens": ("count_tokens", "anthropic"),
    "/v1/models": ("models", "openai"),
}
_OPEN_PATHS = ("/health", "/metrics")  # no API key asked


def route_of(path: str) -> tuple[str, ApiStyle]:
    """(API name, error style) of a URL path."""
    if path in _ROUTES:
        return _ROUTES[path]
    if path.startswith("/v1/responses/"):
        return "responses", "openai"
    if path.startswith("/v1/messages"):
        return "messages", "anthropic"
    return "other", "openai"


@dataclass
class ServerConfig:
    """Options of `pegmask serve`: the API key (None: no key asked), the model names clients may
    use (the engine's model name first), the largest request body and its deepest nesting of
    arrays and objects, and how many Responses API responses `previous_response_id` can refer
    to."""

    api_key: str | None = None
    served_model_names: tuple[str, ...] = ()
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_body_depth: int = DEFAULT_MAX_BODY_DEPTH
    response_store_size: int = 1024

    def __post_init__(self) -> None:
        if self.max_body_depth < 1:
            raise ValueError(f"max_body_depth must be at least 1, not {self.max_body_depth}")


@dataclass
class ServerContext:
    """The engine and options a route works with."""

    engine: Engine
    config: ServerConfig
    model_names: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        self.model_names = tuple(dict.fromkeys(
            (*self.config.served_model_names, self.engine.model_name)))

    @property
    def model(self) -> str:
        """The name responses report."""
        return self.model_names[0]

    def check_model(self, name: Any) -> None:
        """404 for a model this server does not serve (a missing name means the default)."""
        if name in (None, ""):
            return
        if not isinstance(name, str):
            raise APIError(400, "model must be a string", "model")
        if name not in self.model_names:
            raise APIError(404, f"the model `{name}` does not exist; this server serves "
                                f"{', '.join(self.model_names)}", "model")

    async def body(self, request: Request) -> dict[str, Any]:
        """The JSON object of a request body (413 past the size limit, 400 if it nests too deep
        or is not an object), decoded in a worker thread: a large body never stalls the event
        loop; a large one (`body_size` past `LARGE_REQUEST_SIZE`) is decoded, converted and
        validated on the engine's background lane (`convert`, `start`; engine/background.py).
        `json.loads` keeps key order: a schema's properties are written in the order sent."""
        raw = await request.body()
        if len(raw) > self.config.max_body_bytes:
            raise APIError(413, f"the request body has {len(raw)} bytes; the limit is "
                                f"{self.config.max_body_bytes}")
        request.state.large = body_size(raw) > LARGE_REQUEST_SIZE
        body = await self._work(request, decode_body, raw, self.config.max_body_depth)
        if not isinstance(body, dict):
            raise APIError(400, "the request body must be a JSON object")
        return body

    async def convert(self, http: Request, job: Callable[..., T], *args: Any,
                      **kwargs: Any) -> T:
        """An API's conversion of a request body `job(*args, **kwargs)`: on the event loop
        (microseconds), on the background lane for a large body (seconds for 200,000
        messages)."""
        if http.state.large:
            return await self.engine.background.arun(job, *args, **kwargs)
        return job(*args, **kwargs)

    async def _work(self, http: Request, job: Callable[..., T], *args: Any) -> T:
        """`job(*args)` off the event loop: in a worker thread, or on the background lane for a
        large body."""
        if http.state.large:
            return await self.engine.background.arun(job, *args)
        return await run_in_threadpool(job, *args)

    async def start(self, http: Request, source: Any, options: Mapping[str, Any],
                    fields: Mapping[str, str] | None = None) -> GenerationStream:
        """Validate `Engine.generate`'s arguments, then prepare and queue the request, in a
        worker thread (parsing a grammar, rendering, and waiting for a grammar's compile in
        its worker process never block the event loop). Errors are raised here, before any
        response is sent; `fields` maps the engine's option names to the API's own, so that
        an error names the field the client sent."""
        engine = self.engine
        with _api_fields(fields):
            request = await self._work(http, functools.partial(engine.request, source,
                                                               **options))
            submission = await run_in_threadpool(engine.submit, request)
        return GenerationStream(engine, submission, request.is_chat)

    async def prompt_tokens(self, http: Request, source: Any, options: Mapping[str, Any],
                            fields: Mapping[str, str] | None = None) -> int:
        """How many tokens the request's prompt takes (`start`'s validation, no decoding)."""
        with _api_fields(fields):
            request = await self._work(http, functools.partial(self.engine.request, source,
                                                               **options))
            return await run_in_threadpool(self.engine.prompt_tokens, request)

    async def finish(self, http: Request, stream: GenerationStream) -> GenerationResult:
        """Wait for a request that is not streamed; a client that disconnects meanwhile has its
        request cancelled."""
        consumer = asyncio.ensure_future(_drain(stream))
        try:
            while True:
                done, _ = await asyncio.wait({consumer}, timeout=_DISCONNECT_POLL_S)
                if done:
                    break
                if await http.is_disconnected():
                    stream.close()
                    raise APIError(499, "the client disconnected")
        finally:
            if not consumer.done():
                consumer.cancel()
        consumer.result()
        assert stream.result is not None
        return stream.result


def decode_body(raw: bytes, max_depth: int) -> Any:
    """A request body's JSON value; 400 when it is not JSON or nests deeper than `max_depth`
    (checked before decoding, so no depth reaches the decoder's recursion)."""
    # Fewer opening brackets than the limit cannot nest deeper: most bodies skip the scan.
    opening = raw.count(b"[") + raw.count(b"{")
    depth = nesting_depth(raw) if opening > max_depth else 0
    if depth > max_depth:
        raise APIError(400, f"the request body nests arrays and objects {depth} levels deep; "
                            f"the limit is {max_depth} (--max-body-depth)")
    try:
        return json.loads(raw)
    except RecursionError as exc:  # a limit raised past the interpreter's recursion
        raise APIError(400, "the request body nests arrays and objects too deep to decode") \
            from exc
    except ValueError as exc:
        raise APIError(400, f"the request body is not valid JSON: {exc}") from exc


# A JSON string, or the rest of the text after an unterminated one: every match ends where it
# can, so the scan stays linear on hostile text (a quote followed by escaped quotes).
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"?', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def nesting_depth(raw: bytes) -> int:
    """How deep the arrays and objects of a JSON text nest (brackets inside strings do not
    count), in linear time and without recursion."""
    brackets = _JSON_STRING.sub(b"", raw).translate(None, _NOT_BRACKETS)
    if not brackets:
        return 0
    codes = np.frombuffer(brackets, dtype=np.uint8)
    steps = np.where((codes == ord("[")) | (codes == ord("{")), 1, -1).astype(np.int32)
    return int(np.cumsum(steps, dtype=np.int32).max())


@contextlib.contextmanager
def _api_fields(fields: Mapping[str, str] | None) -> Iterator[None]:
    """Errors about an engine option renamed to the API field it came from."""
    try:
        yield
    except InvalidRequestError as exc:
        param = exc.param
        name = (fields or {}).get(param) if param is not None else None
        if param is None or name is None:
            raise
        message = str(exc)
        if message.startswith(param):
            message = name + message[len(param):]
        raise APIError(400, message, name) from exc


async def _drain(stream: GenerationStream) -> None:
    async for _ in stream.aevents():
        pass


def string_or_none(body: Mapping[str, Any], name: str) -> str | None:
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise APIError(400, f"{name} must be a string", name)
    return value


def boolean(body: Mapping[str, Any], name: str, default: bool = False) -> bool:
    """A boolean field (`stream`, `store`, ...): a string such as "no" is a 400, not true."""
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise APIError(400, f"{name} must be a boolean", name)
    return value


def text_only(history: History, param: str) -> None:
    """400 for content the model cannot read (images, documents, audio), which the prompt would
    otherwise silently leave out."""
    for message in history.messages:
        for part in message.parts or ():
            if part.get("type") != "text":
                raise APIError(400, f"{part.get('type')!r} content is not supported: this "
                                    "server's model reads text only", param)


# --------------------------------------------------------------------------- ASGI middleware
ASGIApp = Callable[[MutableMapping[str, Any], Callable[..., Awaitable[Any]],
                    Callable[..., Awaitable[Any]]], Awaitable[None]]


class GatewayMiddleware:
    """API key, body size and request counting, before any route runs, and the error answer
    of a route that raised (in its API's shape; a 500 only for the server's own faults). Pure
    ASGI, so streaming responses and client disconnects pass through untouched; and it answers
    errors itself, where Starlette's catch-all handler would re-raise them to the server and
    drop the connection."""

    def __init__(self, app: ASGIApp, context: ServerContext):
        self.app = app
        self.context = context

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        api, style = route_of(path)
        status: dict[str, int | None] = {"code": None}  # set when the response starts

        async def counting_send(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            error = self._refuse(scope, path)
            if error is None:
                try:
                    await self.app(scope, receive, counting_send)
                    return
                except Exception as exc:
                    if status["code"] is not None:  # the response has started: nothing to add
                        raise
                    error = as_api_error(exc)
                    if error.status >= 500:
                        logger.error("request failed", exc_info=exc)
            await _send_error(send, error, style)
            status["code"] = error.status
        finally:
            if path not in _OPEN_PATHS:
                self.context.engine.metrics.http(api, status["code"] or 500)

    def _refuse(self, scope: MutableMapping[str, Any], path: str) -> APIError | None:
        headers = {key.decode("latin-1").lower(): value.decode("latin-1")
                   for key, value in scope.get("headers", [])}
        key = self.context.config.api_key
        if key is not None and path not in _OPEN_PATHS:
            given = headers.get("x-api-key")
            authorization = headers.get("authorization", "")
            if authorization.lower().startswith("bearer "):
                given = authorization[len("bearer "):].strip()
            if given is None or not hmac.compare_digest(given.encode(), key.encode()):
                return APIError(401, "a valid API key is required (Authorization: Bearer KEY, "
                                     "or x-api-key: KEY)")
        length = headers.get("content-length")
        if length is not None and length.isdigit():
            if int(length) > self.context.config.max_body_bytes:
                return APIError(413, f"the request body has {length} bytes; the limit is "
                                     f"{self.context.config.max_body_bytes}")
        return None


async def _send_error(send: Any, error: APIError, style: ApiStyle) -> None:
    payload = json.dumps(error_body(error, style)).encode()
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(payload)).encode())]
    if error.status == 429:
        headers.append((b"retry-after", b"1"))
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


def log_unknown_fields(body: Mapping[str, Any], api: str,
                       known: frozenset[str] = frozenset()) -> None:
    """Log the fields of a request body that pegmask neither uses nor knows to be harmless."""
    unknown = sorted(set(body) - DESCRIPTIVE_FIELDS - known)
    if unknown:
        logger.warning("%s request: ignoring unknown fields %s", api, ", ".join(unknown))
