"""OpenAI Chat Completions (`POST /v1/chat/completions`) and Completions (`POST /v1/completions`).

Requests map onto `Engine.request` through `pegmask.engine.requests.openai_request`; responses
and `chat.completion.chunk` / `text_completion` streams follow OpenAI's shapes, `n` choices and
log-probabilities included.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

from fastapi import FastAPI, Request

from pegmask.engine import sse
from pegmask.engine.decode import TokenLogprob
from pegmask.engine.engine import Choice, GenerationResult, GenerationStream
from pegmask.engine.errors import APIError, error_body
from pegmask.engine.requests import openai_request
from pegmask.engine.serving import ServerContext, boolean
from pegmask.grammars.vocab import Vocabulary


def register(app: FastAPI, context: ServerContext) -> None:
    """Add the two routes to `app`."""

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        return await _complete(context, request, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        return await _complete(context, request, chat=False)


async def _complete(context: ServerContext, http: Request, *, chat: bool) -> Any:
    body = await context.body(http)
    context.check_model(body.get("model"))
    source, options = openai_request(body, chat=chat)
    streamed = boolean(body, "stream")
    stream_options = body.get("stream_options") or {}
    if not isinstance(stream_options, dict):
        raise APIError(400, "stream_options must be an object", "stream_options")
    include_usage = boolean(stream_options, "include_usage")
    stream = await context.start(source, options)
    if not streamed:
        result = await context.finish(http, stream)
        return completion_response(result, context.model, chat=chat,
                                   vocab=context.engine.vocab)
    chunks = _chunks(stream, context.model, context.engine.vocab, chat=chat,
                     include_usage=include_usage)
    return sse.streaming_response(
        chunks, lambda error: [sse.data(error_body(error)), sse.data("[DONE]")], stream.close)


# --------------------------------------------------------------------------- responses
def chat_message(message: dict[str, Any]) -> dict[str, Any]:
    """An assistant message as the API returns it: no empty `tool_calls`, no null reasoning."""
    out = {"role": "assistant", "content": message.get("content")}
    if message.get("reasoning_content") is not None:
        out["reasoning_content"] = message["reasoning_content"]
    if message.get("tool_calls"):
        out["tool_calls"] = message["tool_calls"]
    return out


def completion_response(result: GenerationResult, model: str, *, chat: bool,
                        vocab: Vocabulary | None = None,
                        response_id: str | None = None) -> dict[str, Any]:
    """The non-streamed response object (chat.completion or text_completion)."""
    return {
        "id": response_id or new_id(chat),
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [_choice(choice, chat, vocab) for choice in result.choices],
        "usage": result.usage,
    }


def _choice(choice: Choice, chat: bool, vocab: Vocabulary | None) -> dict[str, Any]:
    out: dict[str, Any] = {"index": choice.index, "finish_reason": choice.finish_reason,
                           "logprobs": None}
    if choice.logprobs is not None and vocab is not None:
        out["logprobs"] = logprobs_object(vocab, choice.logprobs, chat=chat)
    if chat:
        out["message"] = chat_message(choice.message)
    else:
        out["text"] = choice.text
    return out


def new_id(chat: bool) -> str:
    return f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"


# --------------------------------------------------------------------------- log-probabilities
def token_text(vocab: Vocabulary, token_id: int) -> tuple[str, list[int]]:
    """A token as OpenAI reports it: its text (a special token's spelling) and its bytes."""
    data = vocab.token_bytes[token_id]
    if data is None:
        data = vocab.special_names.get(token_id, "").encode()
    return data.decode("utf-8", errors="replace"), list(data)


def logprobs_object(vocab: Vocabulary, entries: Sequence[TokenLogprob], *, chat: bool,
                    offset: int = 0) -> dict[str, Any]:
    """Chat's `{"content": [...]}` or Completions' `{"tokens", "token_logprobs", ...}`."""
    if chat:
        content = []
        for entry in entries:
            text, data = token_text(vocab, entry.token_id)
            top = []
            for token_id, logprob in entry.top:
                alt_text, alt_data = token_text(vocab, token_id)
                top.append({"token": alt_text, "logprob": logprob, "bytes": alt_data})
            content.append({"token": text, "logprob": entry.logprob, "bytes": data,
                            "top_logprobs": top})
        return {"content": content}
    tokens, offsets = [], []
    for entry in entries:
        text, _ = token_text(vocab, entry.token_id)
        offsets.append(offset)
        offset += len(text)
        tokens.append(text)
    return {
        "tokens": tokens,
        "token_logprobs": [entry.logprob for entry in entries],
        "top_logprobs": [{token_text(vocab, t)[0]: lp for t, lp in entry.top}
                         for entry in entries],
        "text_offset": offsets,
    }


# --------------------------------------------------------------------------- streaming
async def _chunks(stream: GenerationStream, model: str, vocab: Vocabulary, *, chat: bool,
                  include_usage: bool) -> AsyncIterator[str]:
    """Server-sent events: the role first (chat), one chunk per delta with the log-probs of the
    tokens that released it, a chunk with each choice's finish_reason, the usage chunk when
    asked for, then `[DONE]`."""
    response_id = new_id(chat)
    created = int(time.time())
    kind = "chat.completion.chunk" if chat else "text_completion"
    offsets: dict[int, int] = {}

    def chunk(choices: list[dict[str, Any]], **extra: Any) -> str:
        return sse.data({"id": response_id, "object": kind, "created": created, "model": model,
                         "choices": choices, **extra})

    def choice(index: int, delta: dict[str, Any], finish_reason: str | None = None,
               logprobs: Sequence[TokenLogprob] = ()) -> dict[str, Any]:
        lp = None
        if logprobs:
            lp = logprobs_object(vocab, logprobs, chat=chat, offset=offsets.get(index, 0))
        if chat:
            return {"index": index, "delta": delta, "logprobs": lp,
                    "finish_reason": finish_reason}
        text = delta.get("text", "")
        offsets[index] = offsets.get(index, 0) + len(text)
        return {"index": index, "text": text, "logprobs": lp, "finish_reason": finish_reason}

    if chat:
        for index in range(stream.submission.spec.sampling.n):
            yield chunk([choice(index, {"role": "assistant"})])
    async for event in stream.aevents():
        pieces = event.deltas or ([{}] if event.logprobs else [])
        for i, delta in enumerate(pieces):
            logprobs = event.logprobs if i == 0 else ()
            yield chunk([choice(event.index, delta, None, logprobs)])
        if event.finish_reason is not None:
            yield chunk([choice(event.index, {}, event.finish_reason)])
    if include_usage:
        result = stream.result
        if result is None:
            raise APIError(500, "the stream ended without a result")
        yield chunk([], usage=result.usage)
    yield sse.data("[DONE]")
