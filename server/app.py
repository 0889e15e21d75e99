"""The HTTP server: one `Engine`, three API surfaces, shared health, metrics, auth and errors.

    POST /v1/chat/completions, /v1/completions     OpenAI (server/openai_chat.py)
    POST /v1/responses, GET /v1/responses/{id}     OpenAI Responses (server/openai_responses.py)
    POST /v1/messages, /v1/messages/count_tokens   Anthropic Messages (server/anthropic_messages.py)
    GET  /v1/models, /health, /metrics

Routes run on the event loop and never decode: requests are prepared in worker threads and
decoded by the engine's scheduler, which batches every request in flight. Errors take each
API's own shape (server/errors.py): routes raise, and the gateway middleware answers
(server/gateway.py); `--api-key` guards every route but /health and /metrics.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from pegmask.engine.engine import Engine
from pegmask.engine.metrics import CONTENT_TYPE
from pegmask.server import anthropic_messages, openai_chat, openai_responses
from pegmask.server.errors import APIError, error_body
from pegmask.server.gateway import GatewayMiddleware, ServerConfig, ServerContext, route_of


def create_app(engine: Engine, config: ServerConfig | None = None) -> FastAPI:
    """The FastAPI application serving `engine`."""
    context = ServerContext(engine, config or ServerConfig())
    app = FastAPI(title="pegmask", version="0.1.0")

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        message = "no such route" if exc.status_code == 404 else str(exc.detail)
        return _error_response(request, APIError(exc.status_code, message))

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [
            {"id": name, "object": "model", "created": 0, "owned_by": "pegmask",
             "max_model_len": engine.max_model_len}
            for name in context.model_names
        ]}

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": context.model, "running": engine.scheduler.running,
                "queued": engine.scheduler.queued}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(engine.metrics.render(), media_type=CONTENT_TYPE)

    openai_chat.register(app, context)
    openai_responses.register(app, context)
    anthropic_messages.register(app, context)
    app.add_middleware(GatewayMiddleware, context=context)
    return app


def _error_response(request: Request, error: APIError) -> JSONResponse:
    _, style = route_of(request.url.path)
    return JSONResponse(error_body(error, style), status_code=error.status)
