"""pegmask.engine: the `Engine`, its scheduler and decode loop, model backends and runners, the
prefix cache. The HTTP server over an `Engine` is `pegmask.server`."""

from pegmask.engine.engine import Engine, GenerationResult, GenerationStream
from pegmask.engine.requests import InvalidRequestError

__all__ = ["Engine", "GenerationResult", "GenerationStream", "InvalidRequestError"]
