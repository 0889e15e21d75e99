"""The stream parser: one model output, parsed under a dialect's grammar, turned into OpenAI
streaming deltas and the final message (`Dialect.stream_parser`, `Dialect.parse`).

Messages are ``{"role": "assistant", "content": str | None, "reasoning_content": str | None,
"tool_calls": [{"id", "type": "function", "function": {"name", "arguments"}}]}``. Deltas are
chat.completion.chunk ``delta`` objects: ``{"content": ...}``, ``{"reasoning_content": ...}``,
``{"tool_calls": [{"index", "id", "type", "function": {"name", "arguments": ""}}]}`` once per
call, then ``{"tool_calls": [{"index", "function": {"arguments": piece}}]}``. The role is the
engine's to add.

Capture tags a dialect grammar reports (everything else is framing):

* ``reasoning`` / ``content``: text of reasoning_content / content;
* ``calls``: optional, a region of calls released together (DSML's block);
* ``call``: one tool call; inside it ``name`` (raw text) or ``name_json`` (a JSON string
  literal), and either ``arguments`` (the JSON arguments text) or ``param`` captures, each with
  ``key`` and one value: ``string`` (raw text, a JSON string), ``json`` (JSON text), ``value``
  (raw text typed by the tool schema, or guessed when there is none) or a family's own syntax
  (``gemma``: Gemma's JSON dialect, ``m3``: MiniMax M3's XML, ``cofl``: Cohere's XML), read by
  the reader that family declares (`Dialect.value_readers`).

Streaming and whole parsing agree for every chunking: input is fed to the grammar parser one
character (text) or one token (ids) at a time, so what is certain when an error shows up does not
depend on chunk boundaries. Calls are released whole once they close, unless ``trusted=True``
(the output was generated under ``grammar(request)``'s mask): then their name and argument
pieces stream as they are written. Malformed output never raises: from a call (or call region)
that cannot parse, the raw text becomes content, and so does the rest; a call cut off by the
end of the output is dropped (trusted: kept, and ``incomplete`` is set).
"""

from __future__ import annotations

import codecs
import json
import random
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pegmask.dialects.request import ChatRequest
from pegmask.dialects.values import VALUE_TAGS, dumps, schema_type, value_json, value_readers
from pegmask.grammars import Event, Grammar, ParseError

if TYPE_CHECKING:
    from pegmask.grammars.vocab import Vocabulary

Message = dict[str, Any]
Delta = dict[str, Any]


class _Call:
    """A tool call being assembled from captures."""

    def __init__(self, index: int, call_id: str):
        self.index = index
        self.id = call_id
        self.name_parts: list[str] = []
        self.name: str | None = None
        self.pending: list[str] = []  # argument pieces written before the name was known
        self.has_params = False
        self.has_arguments = False
        self.param: _Param | None = None


class _Param:
    """A parameter of an XML / DSML call: its key and value text."""

    def __init__(self) -> None:
        self.key_parts: list[str] = []
        self.key: str | None = None
        self.parts: list[str] = []
        self.streamed = False


class DialectStreamParser:
    """Turns one output into OpenAI deltas and the final message (see the module docstring)."""

    def __init__(self, grammar: Grammar, request: ChatRequest | None,
                 vocab: Vocabulary | None, *, trusted: bool = False, seed: int | None = None):
        self._parser = grammar.stream_parser()
        self._schemas = request.tool_schemas if request is not None else {}
        self._readers = value_readers()
        self._value_tags = frozenset(VALUE_TAGS).union(self._readers)
        self._vocab = vocab
        self._trusted = trusted
        self._rng = random.Random(seed) if seed is not None else None
        self._raw = bytearray()  # the whole output (special tokens as their spelling)
        self._covered = 0  # bytes of the output that text events accounted for
        self._delivered = 0  # bytes of the output that emitted deltas accounted for
        self._failed = False  # after an error, everything else is content
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._call: _Call | None = None
        self._in_region = False  # inside a call region (DSML's block)
        self._next_index = 0
        self._reasoned = False  # some reasoning text was written
        self._reasoning_sep = ""  # written before the next reasoning text
        self._held: list[Delta] = []  # deltas of an untrusted call, released when it closes
        self._out: list[Delta] = []
        self._finished = False
        self.incomplete = False  # a streamed (trusted) call was cut off or malformed
        self.message: Message = {"role": "assistant", "content": None,
                                 "reasoning_content": None, "tool_calls": []}

    @property
    def finish_reason(self) -> str:
        """"tool_calls" when the message has calls, else "stop" (the engine sets "length")."""
        return "tool_calls" if self.message["tool_calls"] else "stop"

    # ----------------------------------------------------------------- input
    def feed(self, text: str) -> list[Delta]:
        """Feed output text (special tokens recognized by their spelling)."""
        for ch in text:
            self._unit(ch.encode("utf-8"), lambda ch=ch: self._parser.feed(ch))
        return self._take()

    def feed_tokens(self, token_ids: Sequence[int]) -> list[Delta]:
        """Feed token ids (special tokens by id, so text cannot fake them); needs the vocab."""
        if self._vocab is None:
            raise ValueError("feed_tokens needs the vocabulary (pass vocab=)")
        vocab = self._vocab
        for token_id in token_ids:
            data = vocab.token_bytes[token_id]
            if data is None:
                data = vocab.special_names.get(token_id, "").encode("utf-8")
            self._unit(data, lambda t=token_id: self._parser.feed_tokens([t], vocab))
        return self._take()

    def finish(self) -> list[Delta]:
        """End of output: flush, drop (or flag) a cut-off call, return the last deltas."""
        if self._finished:
            return []
        self._finished = True
        if not self._failed:
            try:
                self._events(self._parser.finish())
            except ParseError:  # cut off inside a call or its framing: drop it (or flag it)
                self._fail()
        self._content(self._decoder.decode(b"", final=True))
        return self._take()

    # ----------------------------------------------------------------- internals
    def _unit(self, data: bytes, feed: Any) -> None:
        if self._finished:
            raise ValueError("input after finish()")
        self._raw += data
        if self._failed:
            self._content(self._decoder.decode(data))
            return
        try:
            events = feed()
        except ParseError:
            self._malformed()
            return
        self._events(events)

    def _take(self) -> list[Delta]:
        out, self._out = _merge(self._out), []
        return out

    def _malformed(self) -> None:
        """Input that the grammar cannot parse: every byte after the last emitted delta becomes
        content (the framing read since, an unreleased call or call region, the unparsed rest),
        except inside a streamed call, whose delivered part stays a call."""
        streaming_call = self._trusted and self._call is not None
        start = self._covered if streaming_call else self._delivered
        self._fail()
        self._content(self._decoder.decode(bytes(self._raw[start:])))

    def _fail(self) -> None:
        """Stop parsing: unreleased calls are dropped, a streamed one is flagged."""
        if self._call is not None and self._trusted:
            self.incomplete = True
        self._held, self._call, self._in_region = [], None, False
        self._failed = True

    def _holding(self) -> bool:
        return not self._trusted and (self._call is not None or self._in_region)

    def _emit(self, delta: Delta) -> None:
        if self._holding():
            self._held.append(delta)
            return
        self._out.append(delta)
        _apply(self.message, delta)
        self._delivered = self._covered

    def _content(self, text: str, field: str = "content") -> None:
        if text:
            self._emit({field: text})

    def _events(self, events: list[Event]) -> None:
        for event in events:
            if event.kind == "text":
                self._covered += len(event.text.encode("utf-8"))
                self._text(event)
            elif event.kind == "open":
                self._open(event.tag)
            else:
                self._close(event.tag)

    def _text(self, event: Event) -> None:
        tag, text, call = event.tag, event.text, self._call
        if tag == "content":
            self._content(text)
        elif tag == "end":  # a section's closing delimiter goes with the section
            if not self._holding():
                self._delivered = self._covered
        elif tag == "reasoning":
            if text:
                self._content(self._reasoning_sep + text, "reasoning_content")
                self._reasoned, self._reasoning_sep = True, ""
        elif call is None:
            return
        elif tag in ("name", "name_json"):
            call.name_parts.append(text)
        elif tag == "arguments":
            self._arguments(text)
        elif call.param is not None:
            param = call.param
            if tag == "key":
                param.key_parts.append(text)
            elif tag in self._value_tags:
                if param.streamed:
                    self._arguments(_escape(text) if tag == "string" else text)
                else:
                    param.parts.append(text)

    def _open(self, tag: str) -> None:
        call = self._call
        if tag == "reasoning":
            # Several reasoning messages (Harmony's analysis channel) join with a newline,
            # as vLLM joins them; empty ones add nothing.
            self._reasoning_sep = "\n" if self._reasoned else ""
        elif tag == "calls":
            self._in_region = True
        elif tag == "call":
            self._call = _Call(self._next_index, self._new_id())
            self._next_index += 1
        elif call is None:
            return
        elif tag == "arguments":
            call.has_arguments = True
        elif tag == "param":
            call.param = _Param()
        elif tag in self._value_tags and call.param is not None:
            param = call.param
            param.streamed = self._streams(tag, param.key)
            if param.streamed and tag == "string":
                self._arguments('"')

    def _close(self, tag: str) -> None:
        call = self._call
        if tag == "calls":
            self._in_region = False
            self._release()
        if call is None:
            return
        if tag in ("name", "name_json"):
            text = "".join(call.name_parts)
            call.name = _json_text(text) if tag == "name_json" else text
            self._emit({"tool_calls": [{"index": call.index, "id": call.id, "type": "function",
                                        "function": {"name": call.name, "arguments": ""}}]})
            if call.pending:
                self._arguments("".join(call.pending))
                call.pending = []
        elif tag == "key" and call.param is not None:
            param = call.param
            param.key = "".join(param.key_parts)
            self._arguments(("{" if not call.has_params else ", ") + dumps(param.key) + ": ")
            call.has_params = True
        elif tag in self._value_tags and call.param is not None:
            param = call.param
            if param.streamed:
                if tag == "string":
                    self._arguments('"')
            else:
                self._arguments(self._convert(tag, param.key, "".join(param.parts)))
        elif tag == "param":
            call.param = None
        elif tag == "call":
            if not call.has_arguments:
                self._arguments("}" if call.has_params else "{}")
            self._call = None
            self._release()

    def _release(self) -> None:
        """Emit the held deltas once nothing holds them any more."""
        if not self._holding():
            held, self._held = self._held, []
            for delta in held:
                self._emit(delta)

    def _arguments(self, piece: str) -> None:
        call = self._call
        if call is None or not piece:
            return
        if call.name is None:
            call.pending.append(piece)
            return
        self._emit({"tool_calls": [{"index": call.index, "function": {"arguments": piece}}]})

    def _property_schema(self, key: str | None) -> Any:
        call = self._call
        if call is None or key is None or call.name not in self._schemas:
            return None
        properties = self._schemas[call.name].get("properties")
        return properties.get(key) if isinstance(properties, dict) else None

    def _streams(self, kind: str, key: str | None) -> bool:
        """Whether a value's pieces can be written as they come (its JSON form is known)."""
        if kind == "string":
            return schema_type(self._property_schema(key)) in ("string", None)
        return kind == "json" and self._trusted

    def _convert(self, kind: str, key: str | None, raw: str) -> str:
        """The JSON text of a whole parameter value, typed by the tool's schema when known."""
        return value_json(kind, raw, self._property_schema(key), self._readers.get(kind))

    def _new_id(self) -> str:
        if self._rng is not None:
            return f"call_{self._rng.getrandbits(96):024x}"
        return f"call_{uuid.uuid4().hex[:24]}"


def _escape(text: str) -> str:
    """`text` escaped for the inside of a JSON string (valid piece by piece)."""
    return dumps(text)[1:-1]


def _json_text(literal: str) -> str:
    """The string a JSON string literal spells (the literal itself if it is not one)."""
    try:
        value = json.loads(literal)
    except ValueError:
        return literal
    return value if isinstance(value, str) else literal


def _apply(message: Message, delta: Delta) -> None:
    """Accumulate one delta into a message (how clients rebuild a streamed message)."""
    for field in ("content", "reasoning_content"):
        if field in delta:
            message[field] = (message[field] or "") + delta[field]
    for piece in delta.get("tool_calls", []):
        calls = message["tool_calls"]
        if piece["index"] == len(calls):
            calls.append({"id": piece.get("id"), "type": "function",
                          "function": {"name": piece["function"].get("name"), "arguments": ""}})
        calls[piece["index"]]["function"]["arguments"] += piece["function"].get("arguments", "")


def accumulate(deltas: Sequence[Delta]) -> Message:
    """The message a client rebuilds from streamed deltas."""
    message: Message = {"role": "assistant", "content": None, "reasoning_content": None,
                        "tool_calls": []}
    for delta in deltas:
        _apply(message, delta)
    return message


def _merge(deltas: list[Delta]) -> list[Delta]:
    """Join adjacent text deltas of the same field and argument pieces of the same call."""
    out: list[Delta] = []
    for delta in deltas:
        last = out[-1] if out else None
        if last is not None and len(delta) == 1 and set(delta) == set(last):
            field = next(iter(delta))
            if field in ("content", "reasoning_content"):
                out[-1] = {field: last[field] + delta[field]}
                continue
            new, old = delta["tool_calls"][0], last["tool_calls"][0]
            if set(new) == {"index", "function"} and set(old) == {"index", "function"} \
                    and new["index"] == old["index"]:
                arguments = old["function"]["arguments"] + new["function"]["arguments"]
                out[-1] = {"tool_calls": [{"index": new["index"],
                                           "function": {"arguments": arguments}}]}
                continue
        out.append(delta)
    return out
