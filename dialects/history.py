"""One structured conversation history for the three request APIs.

OpenAI Chat Completions messages, Responses API input items and Anthropic Messages describe the
same things (text, reasoning, tool calls with ids, results tied to those ids) in three shapes. Every
prompt renderer (model templates and native dialect renderers) reads this one shape instead, so a
call, its arguments or its result can never be lost or re-encoded on the way.

Renderers read histories leniently (a result without an id answers the first unanswered call).
Servers pass ``strict=True``: a tool result that answers no call is refused with its API's own
rule and wording, where the model would otherwise read a result out of nowhere.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import groupby
from typing import Any, Literal

__all__ = [
    "History",
    "HistoryError",
    "Message",
    "Role",
    "ToolCall",
    "from_anthropic",
    "from_chat_completions",
    "from_responses",
    "normalize_history",
    "normalize_tools",
    "parse_arguments",
]

Role = Literal["system", "developer", "user", "assistant", "tool"]
Api = Literal["auto", "chat", "responses", "anthropic"]

_TEXT_PART_TYPES = {"text", "input_text", "output_text"}
_RESPONSES_ITEM_TYPES = {
    "message",
    "function_call",
    "function_call_output",
    "reasoning",
    "custom_tool_call",
    "custom_tool_call_output",
}
_ANTHROPIC_BLOCK_TYPES = {"tool_use", "tool_result", "thinking", "redacted_thinking"}


class HistoryError(ValueError):
    """A request history cannot be understood (never silently dropped)."""


def parse_arguments(arguments: Any) -> dict[str, Any] | str:
    """Tool-call arguments as an object, or the raw text when they are not a JSON object.

    Clients send arguments as JSON text (OpenAI) or as an object (Anthropic, some SDKs). Malformed
    or non-object arguments are kept verbatim, so the model sees exactly what it wrote.
    """
    if arguments is None:
        return {}
    if isinstance(arguments, Mapping):
        return dict(arguments)
    if not isinstance(arguments, str):
        return json.dumps(arguments, ensure_ascii=False)
    if not arguments.strip():
        return {}
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return arguments
    return parsed if isinstance(parsed, dict) else arguments


@dataclass(frozen=True)
class ToolCall:
    """One function call: its id ties the result to it."""

    id: str
    name: str
    arguments: dict[str, Any] | str

    @property
    def arguments_json(self) -> str:
        """The arguments as prompt text: objects serialized once, raw text as is (no double encoding)."""
        if isinstance(self.arguments, str):
            return self.arguments
        return json.dumps(self.arguments, ensure_ascii=False)


@dataclass
class Message:
    """A turn of the history.

    ``content`` is the text (text parts joined by newlines); ``parts`` keeps the client's list of
    content parts when it sent one (images included). A tool result has role ``tool``, the
    ``tool_call_id`` of its call and, in ``name``, the called function's name.
    """

    role: Role
    content: str = ""
    parts: list[dict[str, Any]] | None = None
    reasoning: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None
    is_error: bool = False

    def content_parts(self) -> list[dict[str, Any]]:
        """The content as OpenAI content parts (for templates that iterate over content)."""
        if self.parts is not None:
            return [dict(part) for part in self.parts]
        return [{"type": "text", "text": self.content}] if self.content else []


@dataclass
class History:
    """The normalized conversation, in order."""

    messages: list[Message] = field(default_factory=list)

    def calls(self) -> dict[str, ToolCall]:
        """Every tool call by id."""
        return {call.id: call for message in self.messages for call in message.tool_calls}

    def result_for(self, call_id: str) -> Message | None:
        """The tool result answering ``call_id``, if the history has one."""
        return next(
            (m for m in self.messages if m.role == "tool" and m.tool_call_id == call_id), None
        )

    def to_template_messages(
        self, content_format: Literal["string", "openai"] = "string"
    ) -> list[dict[str, Any]]:
        """OpenAI-shaped message dicts for Jinja chat templates.

        Arguments are objects when they parsed (what tool-use templates expect, as in vLLM), an
        empty ``tool_calls`` list is left out, and content is a string or a list of parts
        depending on what the template iterates over.
        """
        out = []
        for message in self.messages:
            content: Any = (
                message.content_parts() if content_format == "openai" else message.content
            )
            item: dict[str, Any] = {"role": message.role, "content": content}
            if message.reasoning is not None:
                item["reasoning_content"] = message.reasoning
            if message.tool_calls:
                item["tool_calls"] = [
                    {
                        "id": call.id,
                        "type": "function",
                        "function": {"name": call.name, "arguments": call.arguments},
                    }
                    for call in message.tool_calls
                ]
            if message.role == "tool" and message.tool_call_id is not None:
                item["tool_call_id"] = message.tool_call_id
            if message.name is not None:
                item["name"] = message.name
            out.append(item)
        return out


# ---------------------------------------------------------------------------------------------
# Shared helpers
# ---------------------------------------------------------------------------------------------


def _content(value: Any) -> tuple[str, list[dict[str, Any]] | None]:
    """(text, parts) from a string or a list of content parts / blocks."""
    if value is None:
        return "", None
    if isinstance(value, str):
        return value, None
    if not isinstance(value, Sequence):
        raise HistoryError(f"content must be a string or a list of parts, got {value!r}")
    texts, parts = [], []
    for part in value:
        if isinstance(part, str):
            part = {"type": "text", "text": part}
        if not isinstance(part, Mapping):
            raise HistoryError(f"content part must be an object, got {part!r}")
        kind = part.get("type", "text")
        if kind in _TEXT_PART_TYPES or kind == "refusal":
            key = "refusal" if kind == "refusal" else "text"
            text = part.get(key) or ""
            if not isinstance(text, str):
                raise HistoryError(f"a {kind} part's {key} must be a string, got {text!r}")
            texts.append(text)
            parts.append({"type": "text", "text": text})
        else:
            parts.append(dict(part))
    return "\n".join(texts), parts


class _Builder:
    """Accumulates messages and ties each result to its call (by id, else positionally)."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.calls: dict[str, ToolCall] = {}
        self.unanswered: list[ToolCall] = []

    def add(self, message: Message) -> Message:
        self.messages.append(message)
        return message

    def last_assistant(self) -> Message | None:
        last = self.messages[-1] if self.messages else None
        return last if last is not None and last.role == "assistant" else None

    def new_call_id(self) -> str:
        """An id for a call the client sent without one (legacy ``function_call``)."""
        n = len(self.calls)
        while f"call_{n}" in self.calls:
            n += 1
        return f"call_{n}"

    def add_call(self, message: Message, call_id: str | None, name: str, arguments: Any) -> None:
        if call_id is not None and not isinstance(call_id, str):
            raise HistoryError(f"a tool call id must be a string, got {call_id!r}")
        if not isinstance(name, str):
            raise HistoryError(f"a tool call's name must be a string, got {name!r}")
        call = ToolCall(call_id or self.new_call_id(), name, parse_arguments(arguments))
        message.tool_calls.append(call)
        self.calls[call.id] = call
        self.unanswered.append(call)

    def add_result(
        self,
        call_id: str | None,
        content: Any,
        *,
        name: str | None = None,
        is_error: bool = False,
    ) -> None:
        if call_id is not None and not isinstance(call_id, str):
            raise HistoryError(f"a tool result's call id must be a string, got {call_id!r}")
        call = self.calls.get(call_id) if call_id else None
        if call is None and call_id is None:
            candidates = [c for c in self.unanswered if name is None or c.name == name]
            call = candidates[0] if candidates else None
        if call is not None:
            call_id = call.id
            name = call.name
            if call in self.unanswered:
                self.unanswered.remove(call)
        text, parts = _content(content)
        self.add(
            Message(
                "tool",
                text,
                parts=parts,
                tool_call_id=call_id,
                name=name,
                is_error=is_error,
            )
        )

    def history(self) -> History:
        return History(self.messages)


# ---------------------------------------------------------------------------------------------
# OpenAI Chat Completions
# ---------------------------------------------------------------------------------------------


def _reasoning_of(message: Mapping[str, Any]) -> str | None:
    for key in ("reasoning_content", "reasoning", "thinking"):
        value = message.get(key)
        if isinstance(value, str):
            return value
    return None


def from_chat_completions(
    messages: Iterable[Mapping[str, Any]], *, strict: bool = False
) -> History:
    """Normalize OpenAI Chat Completions ``messages``.

    ``strict``: OpenAI's rule, a tool message answers the ``tool_calls`` of the assistant message
    before it (other tool messages may come between), and its ``tool_call_id`` is one of them.
    """
    builder = _Builder()
    answerable: set[str] = set()  # the call ids the next tool messages may answer
    for index, raw in enumerate(messages):
        role = raw.get("role")
        if strict and role in ("tool", "function"):
            _check_chat_result(index, raw, answerable)
        if role in ("system", "developer", "user"):
            text, parts = _content(raw.get("content"))
            builder.add(Message(role, text, parts=parts, name=raw.get("name")))
            answerable = set()
        elif role == "assistant":
            text, parts = _content(raw.get("content"))
            message = builder.add(
                Message(
                    "assistant",
                    text,
                    parts=parts,
                    reasoning=_reasoning_of(raw),
                    name=raw.get("name"),
                )
            )
            for call in raw.get("tool_calls") or ():
                function = call.get("function") if isinstance(call, Mapping) else None
                if function is None:
                    function = {}
                if not isinstance(call, Mapping) or not isinstance(function, Mapping):
                    raise HistoryError(
                        f"a tool call must be an object with a function, got {call!r}"
                    )
                builder.add_call(
                    message, call.get("id"), function.get("name", ""), function.get("arguments")
                )
            legacy = raw.get("function_call")
            if legacy is not None:
                if not isinstance(legacy, Mapping):
                    raise HistoryError(f"function_call must be an object, got {legacy!r}")
                builder.add_call(message, None, legacy.get("name", ""), legacy.get("arguments"))
            answerable = {call.id for call in message.tool_calls}
        elif role == "tool":
            builder.add_result(raw.get("tool_call_id"), raw.get("content"), name=raw.get("name"))
        elif role == "function":
            builder.add_result(None, raw.get("content"), name=raw.get("name"))
        else:
            raise HistoryError(f"unknown message role {role!r}")
    return builder.history()


def _check_chat_result(index: int, raw: Mapping[str, Any], answerable: set[str]) -> None:
    """A tool (or legacy function) message must answer the assistant message before it."""
    if not answerable:
        raise HistoryError(
            f"messages[{index}]: messages with role {raw.get('role')!r} must be a response to a "
            "preceding message with 'tool_calls'"
        )
    call_id = raw.get("tool_call_id")
    if isinstance(call_id, str) and call_id not in answerable:
        raise HistoryError(
            f"messages[{index}]: tool_call_id {call_id!r} is not among the 'tool_calls' of the "
            "preceding assistant message"
        )


# ---------------------------------------------------------------------------------------------
# OpenAI Responses API
# ---------------------------------------------------------------------------------------------


def _reasoning_item_text(item: Mapping[str, Any]) -> str:
    content = _reasoning_parts(item, "content")
    if content:
        return "\n".join(content)
    return "\n\n".join(_reasoning_parts(item, "summary"))


def _reasoning_parts(item: Mapping[str, Any], key: str) -> list[str]:
    """The texts of a reasoning item's ``content`` or ``summary`` parts."""
    parts = item.get(key)
    if parts is None:
        return []
    if not isinstance(parts, list) or not all(
        isinstance(part, Mapping) and isinstance(part.get("text") or "", str) for part in parts
    ):
        raise HistoryError(f"a reasoning item's {key} must be a list of text parts, got {parts!r}")
    return [part.get("text") or "" for part in parts]


def from_responses(
    items: str | Iterable[Mapping[str, Any]],
    instructions: str | None = None,
    *,
    strict: bool = False,
) -> History:
    """Normalize Responses API ``input`` (a string or items) and its ``instructions``.

    Reasoning, assistant text and function calls that follow each other form one assistant turn,
    as the model produced them. ``strict``: OpenAI's rule, an output's ``call_id`` is that of an
    earlier call.
    """
    builder = _Builder()
    if instructions:
        builder.add(Message("system", instructions))
    if isinstance(items, str):
        builder.add(Message("user", items))
        return builder.history()
    for index, item in enumerate(items):
        kind = item.get("type", "message" if "role" in item else None)
        last = builder.last_assistant()
        if kind == "message":
            role = item.get("role")
            if role not in ("system", "developer", "user", "assistant"):
                raise HistoryError(f"unknown message role {role!r}")
            text, parts = _content(item.get("content"))
            if (
                role == "assistant"
                and last is not None
                and not last.content
                and not last.tool_calls
            ):
                last.content, last.parts = text, parts  # the text after this turn's reasoning
            else:
                builder.add(Message(role, text, parts=parts))
        elif kind == "reasoning":
            text = _reasoning_item_text(item)
            if last is not None and not last.content and not last.tool_calls:
                last.reasoning = text if last.reasoning is None else f"{last.reasoning}\n\n{text}"
            else:
                builder.add(Message("assistant", reasoning=text))
        elif kind in ("function_call", "custom_tool_call"):
            message = last if last is not None else builder.add(Message("assistant"))
            arguments = item.get("arguments") if kind == "function_call" else item.get("input", "")
            builder.add_call(
                message, item.get("call_id") or item.get("id"), item.get("name", ""), arguments
            )
        elif kind in ("function_call_output", "custom_tool_call_output"):
            call_id = item.get("call_id")
            if strict and call_id is None:
                raise HistoryError(f"input[{index}]: a {kind} needs the call_id of its call")
            if strict and isinstance(call_id, str) and call_id not in builder.calls:
                raise HistoryError(
                    f"No tool call found for function call output with call_id {call_id}."
                )
            builder.add_result(call_id, item.get("output"))
        else:
            raise HistoryError(f"unsupported Responses input item type {kind!r}")
    return builder.history()


# ---------------------------------------------------------------------------------------------
# Anthropic Messages
# ---------------------------------------------------------------------------------------------


def _anthropic_result_content(content: Any) -> Any:
    if isinstance(content, Sequence) and not isinstance(content, str):
        return [block for block in content if isinstance(block, Mapping)]
    return content


def _block_content(blocks: Sequence[Mapping[str, Any]]) -> tuple[str, list[dict[str, Any]] | None]:
    """Anthropic blocks as (text, parts); parts only when a block is not text (an image)."""
    text, parts = _content(blocks)
    return text, parts if any(block.get("type") != "text" for block in blocks) else None


def from_anthropic(
    messages: Iterable[Mapping[str, Any]], system: Any = None, *, strict: bool = False
) -> History:
    """Normalize Anthropic Messages (``tool_use`` / ``tool_result`` / ``thinking`` blocks).

    A user turn holding tool results becomes tool messages and user text in block order, so text
    between results stays where the client put it. ``strict``: Anthropic's rule, each
    ``tool_result`` answers a ``tool_use`` block of the message before it.
    """
    builder = _Builder()
    if system:
        text, parts = _content(system)
        builder.add(Message("system", text, parts=parts))
    previous: set[str] = set()  # the tool_use ids of the previous message
    for index, raw in enumerate(messages):
        role = raw.get("role")
        content = raw.get("content")
        if role not in ("user", "assistant"):
            raise HistoryError(f"unknown message role {role!r}")
        if isinstance(content, str):
            blocks = [{"type": "text", "text": content}]
        elif content is None or (
            isinstance(content, list) and all(isinstance(block, Mapping) for block in content)
        ):
            blocks = list(content or ())
        else:
            raise HistoryError(f"content must be a string or a list of blocks, got {content!r}")
        if role == "assistant":
            message = builder.add(Message("assistant"))
            shown, thoughts = [], []
            for block in blocks:
                kind = block.get("type")
                if kind == "thinking":
                    thoughts.append(block.get("thinking") or "")
                elif kind in ("tool_use", "server_tool_use"):
                    builder.add_call(
                        message, block.get("id"), block.get("name", ""), block.get("input")
                    )
                elif kind != "redacted_thinking":  # encrypted: nothing a prompt can show
                    shown.append(block)
            message.content, message.parts = _block_content(shown)
            message.reasoning = "\n\n".join(thoughts) if thoughts else None
            previous = {call.id for call in message.tool_calls}
            continue
        if strict:
            _check_anthropic_results(index, blocks, previous)
        previous = set()
        for is_result, run in groupby(blocks, key=lambda b: b.get("type") == "tool_result"):
            if not is_result:
                text, parts = _block_content(list(run))
                builder.add(Message("user", text, parts=parts))
                continue
            for block in run:
                builder.add_result(
                    block.get("tool_use_id"),
                    _anthropic_result_content(block.get("content")),
                    is_error=bool(block.get("is_error")),
                )
    return builder.history()


def _check_anthropic_results(
    index: int, blocks: Sequence[Mapping[str, Any]], previous: set[str]
) -> None:
    """Each ``tool_result`` block must answer a ``tool_use`` of the previous message."""
    for position, block in enumerate(blocks):
        if block.get("type") != "tool_result":
            continue
        where = f"messages.{index}.content.{position}"
        call_id = block.get("tool_use_id")
        if call_id is None:
            raise HistoryError(f"{where}.tool_use_id: Field required")
        if isinstance(call_id, str) and call_id not in previous:
            raise HistoryError(
                f"{where}: unexpected `tool_use_id` found in `tool_result` blocks: {call_id}. "
                "Each `tool_result` block must have a corresponding `tool_use` block in the "
                "previous message."
            )


def normalize_tools(tools: Iterable[Mapping[str, Any]] | None) -> list[dict[str, Any]]:
    """Tools in Chat Completions form (``{"type": "function", "function": {...}}``), order kept.

    Accepts the Chat Completions form, the flat Responses form and Anthropic's ``input_schema``.
    Keys are never re-sorted: the schema reaches the prompt in the order the request wrote it.
    """
    out = []
    for tool in tools or ():
        if "function" in tool:
            out.append(dict(tool))
        elif "input_schema" in tool:
            function = {"name": tool["name"]}
            if "description" in tool:
                function["description"] = tool["description"]
            function["parameters"] = tool["input_schema"]
            out.append({"type": "function", "function": function})
        elif "name" in tool:
            function = {key: value for key, value in tool.items() if key not in ("type", "strict")}
            out.append({"type": "function", "function": function})
        else:
            raise HistoryError(f"unsupported tool definition: {tool!r}")
    return out


# ---------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------


def _detect_api(data: Any) -> Api:
    if isinstance(data, str):
        return "responses"
    for item in data:
        kind = item.get("type")
        if kind in _RESPONSES_ITEM_TYPES or (kind is not None and "role" not in item):
            return "responses"
        content = item.get("content")
        if isinstance(content, Sequence) and not isinstance(content, str):
            if any(
                isinstance(b, Mapping) and b.get("type") in _ANTHROPIC_BLOCK_TYPES for b in content
            ):
                return "anthropic"
    return "chat"


def normalize_history(
    data: History | str | Iterable[Mapping[str, Any]],
    api: Api = "auto",
    *,
    system: Any = None,
    instructions: str | None = None,
    strict: bool = False,
) -> History:
    """Normalize a request's messages from any of the three APIs (detected when ``api="auto"``).

    ``system`` is Anthropic's top-level system prompt, ``instructions`` the Responses API's;
    ``strict`` refuses tool results that answer no call (see the module docstring).
    """
    if isinstance(data, History):
        return data
    items = data if isinstance(data, str) else list(data)
    kind = _detect_api(items) if api == "auto" else api
    if kind == "responses":
        return from_responses(items, instructions=instructions, strict=strict)
    if kind == "anthropic":
        return from_anthropic(items, system=system, strict=strict)
    if kind == "chat":
        return from_chat_completions(items, strict=strict)
    raise HistoryError(f"unknown api {api!r}")
