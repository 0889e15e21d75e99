"""HTTP errors in each API's own shape.

Every failure a route can meet maps to one status and one error kind here: a bad request 400
(naming the field at fault), a missing or wrong key 401, an unknown model or route 404, a body
over the limit 413, a full queue 429, a request past its time 408; anything else is the
server's own fault, 500. OpenAI clients read `{"error": {"message", "type", "param", "code"}}`,
Anthropic clients `{"type": "error", "error": {"type", "message"}}`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pegmask.engine.requests import InvalidRequestError
from pegmask.engine.scheduler import QueueFullError, RequestTimeoutError, SchedulerClosedError

ApiStyle = Literal["openai", "anthropic"]


class APIError(Exception):
    """An error a route answers with (status code, message, the field at fault)."""

    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param


@dataclass(frozen=True)
class _Kind:
    openai_type: str
    openai_code: str | None
    anthropic_type: str


_KINDS = {
    400: _Kind("invalid_request_error", None, "invalid_request_error"),
    401: _Kind("authentication_error", "invalid_api_key", "authentication_error"),
    404: _Kind("invalid_request_error", "not_found", "not_found_error"),
    405: _Kind("invalid_request_error", "method_not_allowed", "invalid_request_error"),
    408: _Kind("timeout_error", "request_timeout", "timeout_error"),
    413: _Kind("invalid_request_error", "request_too_large", "request_too_large"),
    422: _Kind("invalid_request_error", None, "invalid_request_error"),
    429: _Kind("rate_limit_error", "rate_limit_exceeded", "rate_limit_error"),
    500: _Kind("server_error", None, "api_error"),
    503: _Kind("server_error", "unavailable", "overloaded_error"),
}


def as_api_error(exc: BaseException) -> APIError:
    """The `APIError` a failure is reported as."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, InvalidRequestError):
        return APIError(400, str(exc), exc.param)
    if isinstance(exc, QueueFullError):
        return APIError(429, f"the server is busy: {exc}")
    if isinstance(exc, RequestTimeoutError):
        return APIError(408, str(exc))
    if isinstance(exc, SchedulerClosedError):
        return APIError(503, str(exc))
    return APIError(500, f"internal error: {type(exc).__name__}: {exc}")


def error_body(error: APIError, style: ApiStyle = "openai") -> dict[str, Any]:
    """The JSON body of `error` for an API style."""
    kind = _KINDS.get(error.status, _KINDS[500 if error.status >= 500 else 400])
    if style == "anthropic":
        return {"type": "error", "error": {"type": kind.anthropic_type, "message": error.message}}
    return {"error": {"message": error.message, "type": kind.openai_type, "param": error.param,
                      "code": kind.openai_code}}
