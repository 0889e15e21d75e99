"""Helpers the native prompt renderers share (each family's renderer lives in its module).

A native renderer writes a structured history (`pegmask.dialects.history`) in the family's own
protocol; assistant turns still in the live tool loop are replayed byte for byte from a
`ReplayMemory` when all their calls are found there (`replayed`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from pegmask.dialects.history import Message
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
