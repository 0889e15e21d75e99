"""OpenAI Chat Completions (`POST /v1/chat/completions`) and Completions (`POST /v1/completions`).

Request bodies are read here (`openai_request`: checked, then mapped onto `Engine.request`'s
options); responses and `chat.completion.chunk` / `text_completion` streams follow OpenAI's
shapes, `n` choices and log-probabilities included.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request

from pegmask.dialects.history import HistoryError, normalize_history
from pegmask.engine.decode import TokenLogprob
from pegmask.engine.engine import Choice, GenerationResult, GenerationStream
from pegmask.engine.requests import InvalidRequestError, int_field
from pegmask.grammars.vocab import Vocabulary
from pegmask.server import sse
from pegmask.server.errors import APIError, error_body
from pegmask.server.gateway import ServerContext, boolean, log_unknown_fields

LEGACY_COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
CHAT_ROLES = ("system", "developer", "user", "assistant", "tool", "function")
# Request fields passed to `build_request` as they are, when present and not null.
_SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids",
                    "frequency_penalty", "presence_penalty", "repetition_penalty", "logit_bias",
                    "ignore_eos", "min_tokens", "n", "close_on_length")
_SHAPE_FIELDS = ("tools", "tool_choice", "parallel_tool_calls", "response_format", "grammar")
# Fields that would change the response in ways this server does not implement, with the values
# that mean "off": anything else is a 400 naming the field.
_UNSUPPORTED = {"echo": (None, False), "best_of": (None, 1), "suffix": (None, ""),
                "prompt_logprobs": (None, 0), "guided_decoding_backend": (None,),
                # The legacy function calling: `tools` and `tool_choice` replace it.
                "functions": (None, []), "function_call": (None,)}
# Every field this module reads or refuses: the others are logged (`log_unknown_fields`).
_KNOWN = frozenset({*_SAMPLING_FIELDS, *_SHAPE_FIELDS, *_UNSUPPORTED})


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
    source, options = await context.convert(http, openai_request, body, chat=chat)
    streamed = boolean(body, "stream")
    stream_options = body.get("stream_options")
    if stream_options is None:
        stream_options = {}
    if not isinstance(stream_options, dict):
        raise APIError(400, "stream_options must be an object", "stream_options")
    include_usage = boolean(stream_options, "include_usage")
    # An error about the output budget names the field the client sent.
    fields = ({"max_tokens": "max_completion_tokens"}
              if body.get("max_completion_tokens") is not None else None)
    stream = await context.start(http, source, options, fields)
    if not streamed:
        result = await context.finish(http, stream)
        return completion_response(result, context.model, chat=chat,
                                   vocab=context.engine.vocab)
    chunks = _chunks(stream, context.model, context.engine.vocab, chat=chat,
                     include_usage=include_usage)
    return sse.streaming_response(
        chunks, lambda error: [sse.data(error_body(error)), sse.data("[DONE]")], stream.close)


# --------------------------------------------------------------------------- requests
def openai_request(body: Any, *, chat: bool) -> tuple[Any, dict[str, Any]]:
    """(prompt or messages, `Engine.generate` options) of an OpenAI request body: chat
    completions when `chat`, else legacy completions. `grammar` (PEG text), `top_k`, `min_p`,
    `repetition_penalty`, `stop_token_ids`, `ignore_eos`, `min_tokens` (vLLM's names) and
    `close_on_length` are extensions. Fields pegmask does not know are logged and ignored."""
    if not isinstance(body, Mapping):
        raise InvalidRequestError("the request body must be a JSON object")
    for name, off in _UNSUPPORTED.items():
        value = body.get(name)
        # By type too: `echo: 0` or `best_of: true` is not the value that means off.
        if not any(value == o and type(value) is type(o) for o in off):
            raise InvalidRequestError(f"{name}={value!r} is not supported", name)
    log_unknown_fields(body, ("chat" if chat else "completions"), _KNOWN)
    options = {name: body[name] for name in _SAMPLING_FIELDS if body.get(name) is not None}
    max_tokens = body.get("max_completion_tokens")
    if max_tokens is None:
        max_tokens = body.get("max_tokens")
    if max_tokens is not None:
        options["max_tokens"] = max_tokens
    elif not chat:
        options["max_tokens"] = LEGACY_COMPLETION_MAX_TOKENS
    options.update({name: body[name] for name in _SHAPE_FIELDS if body.get(name) is not None})
    logprobs = body.get("logprobs")
    if not chat:
        # Completions: `logprobs` is the number of alternatives (0-5), null for none.
        if logprobs is not None:
            options["logprobs"] = True
            options["top_logprobs"] = int_field("logprobs", logprobs, 0)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise InvalidRequestError("prompt must be a string", "prompt")
        return prompt, options
    if logprobs is not None:
        options["logprobs"] = logprobs
    if body.get("top_logprobs") is not None:
        options["top_logprobs"] = body["top_logprobs"]
    if "messages" not in body:
        raise InvalidRequestError("messages is required", "messages")
    _check_chat_messages(body["messages"])
    kwargs = body.get("chat_template_kwargs")
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, Mapping):
        raise InvalidRequestError("chat_template_kwargs must be an object", "chat_template_kwargs")
    kwargs = dict(kwargs)
    if body.get("reasoning_effort") is not None:
        if not isinstance(body["reasoning_effort"], str):
            raise InvalidRequestError("reasoning_effort must be a string", "reasoning_effort")
        kwargs.setdefault("reasoning_effort", body["reasoning_effort"])
    if kwargs:
        options["chat_template_kwargs"] = kwargs
    return body["messages"], options


def _check_chat_messages(messages: Any) -> None:
    """The shape of Chat Completions `messages` (roles, content, tool calls): the chat template
    would otherwise fail on a bad one in ways that do not say which message is at fault."""
    if not isinstance(messages, list):  # a string would read as a completion prompt
        raise InvalidRequestError("messages must be a list of message objects", "messages")
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, Mapping):
            raise InvalidRequestError(f"{where} must be an object", "messages")
        role = message.get("role")
        if role not in CHAT_ROLES:
            raise InvalidRequestError(
                f"{where}.role must be one of {', '.join(CHAT_ROLES)}, not {role!r}", "messages")
        content = message.get("content")
        if content is None and role not in ("assistant", "function"):
            raise InvalidRequestError(f"{where} needs content", "messages")
        if not (content is None or isinstance(content, str) or (
                isinstance(content, list) and all(_content_part(part) for part in content))):
            raise InvalidRequestError(
                f"{where}.content must be a string or a list of text parts (this server's "
                "model reads text only)", "messages")
        for name in ("name", "tool_call_id", "reasoning_content"):
            if message.get(name) is not None and not isinstance(message[name], str):
                raise InvalidRequestError(f"{where}.{name} must be a string", "messages")
        calls = message.get("tool_calls")
        if calls is not None and not (isinstance(calls, list) and all(map(_tool_call, calls))):
            raise InvalidRequestError(
                f"{where}.tool_calls must be a list of "
                '{"id", "type": "function", "function": {"name", "arguments"}}', "messages")
        legacy = message.get("function_call")
        if legacy is not None and not _function(legacy):
            raise InvalidRequestError(f'{where}.function_call must be {{"name", "arguments"}}',
                                      "messages")
    try:  # each tool message answers the tool_calls before it
        normalize_history(messages, "chat", strict=True)
    except HistoryError as exc:
        raise InvalidRequestError(str(exc), "messages") from exc


def _content_part(part: Any) -> bool:
    """A text part: the model reads text only, and an image left out of the prompt would be
    an ignored input."""
    if not isinstance(part, Mapping):
        return False
    key = "refusal" if part.get("type") == "refusal" else "text"
    return part.get("type") in ("text", "refusal") and isinstance(part.get(key), str)


def _tool_call(call: Any) -> bool:
    return (isinstance(call, Mapping) and isinstance(call.get("id", ""), str)
            and _function(call.get("function")))


def _function(function: Any) -> bool:
    """A call's `{"name", "arguments"}` (arguments as JSON text or an object)."""
    return (isinstance(function, Mapping) and isinstance(function.get("name"), str)
            and isinstance(function.get("arguments", ""), (str, Mapping)))


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
