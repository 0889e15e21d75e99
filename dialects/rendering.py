"""Helpers the native prompt renderers share (each family's renderer lives in its module).

A native renderer writes a structured history (`pegmask.dialects.history`) in the family's own
protocol; assistant turns still in the live tool loop are replayed byte for byte from a
`ReplayMemory` when all their calls are found there (`replayed`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from pegmask.dialects.history import Message, ToolCall, normalize_history
from pegmask.dialects.replay import ReplayMemory


def dumps(value: Any) -> str:
    """JSON as the families' templates write it (`tojson`: no ASCII escaping)."""
    return json.dumps(value, ensure_ascii=False)


def json_scalar(value: Any) -> str:
    """A string as is, anything else as JSON (how XML-style families write values)."""
    return dumps(value) if not isinstance(value, str) else value


def last_index(messages: Sequence[Message], roles: tuple[str, ...]) -> int:
    """Index of the last message with one of `roles`, -1 if none."""
    return next((i for i in range(len(messages) - 1, -1, -1) if messages[i].role in roles), -1)


def replayed(
    replay: ReplayMemory | None, message: Message, frame: Callable[[str], str]
) -> str | None:
    """The remembered text of an assistant turn's calls, each framed, or None on a miss."""
    if replay is None or not message.tool_calls:
        return None
    texts = replay.recall(message.tool_calls)
    return None if texts is None else "".join(frame(text) for text in texts)


def check_continuable(messages: Sequence[Message]) -> None:
    """`continue_final_message` needs an open assistant turn at the end."""
    if not messages or messages[-1].role != "assistant":
        raise ValueError("continue_final_message needs an assistant message at the end")
    if messages[-1].tool_calls:
        raise ValueError("continue_final_message cannot continue a turn that ended with tool calls")


def check_modes(add_generation_prompt: bool, continue_final_message: bool) -> None:
    """The two ways of ending a prompt exclude each other (as in transformers)."""
    if add_generation_prompt and continue_final_message:
        raise ValueError("continue_final_message and add_generation_prompt are not compatible")


def calls_in_content(messages: Any, write: Callable[[Sequence[ToolCall]], str]) -> list[dict]:
    """Chat messages with each assistant turn's calls written into its content by `write` (as
    the model writes them), for templates that drop past calls or write them in another form
    than the model's (Granite 3.3, Phi-4-mini's vLLM template)."""
    history = normalize_history(messages)
    for message in history.messages:
        if message.tool_calls:
            message.content += write(message.tool_calls)
            message.parts, message.tool_calls = None, []
    return history.to_template_messages()


def json_call_list(calls: Sequence[ToolCall]) -> str:
    """Calls as a JSON list of `{"name", "arguments"}` objects (json_calls.peg's form)."""
    return "[" + ", ".join(f'{{"name": {dumps(call.name)}, "arguments": {call.arguments_json}}}'
                           for call in calls) + "]"
