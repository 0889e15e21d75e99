"""pegmask.engine: the `Engine`, its decode loop, model backends and the OpenAI-compatible
server (`pegmask.engine.server`)."""

from pegmask.engine.engine import Engine, GenerationResult, GenerationStream
from pegmask.engine.requests import InvalidRequestError

__all__ = ["Engine", "GenerationResult", "GenerationStream", "InvalidRequestError"]
