"""Helpers the native prompt renderers share (each family's renderer lives in its module).

A native renderer writes a structured history (`pegmask.dialects.history`) in the family's own
protocol; assistant turns still in the live tool loop are replayed byte for byte from a
`ReplayMemory` when all their calls are found there (`replayed`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pegmask.dialects.history import (
    History,
    Message,
    ToolCall,
    normalize_history,
    normalize_tools,
)
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


@dataclass(frozen=True)
class TurnFormat:
    """How a family whose template pegmask lacks writes a conversation (`render_turns`).

    `system(text, tools)` is the opening system turn (text None: none was given); `turn(role,
    text)` a user turn or a later system turn, without `end`; `assistant(message, show)` an
    assistant turn's body after `header` (`show`: the turn's reasoning is written back);
    `results(messages)` a run of tool results, a whole turn; `opening(thinking)` what the
    generation prompt writes after `header` (thinking on, off, or None: the model decides);
    `eos` the token that ends a generated turn, `end` what ends every turn in the prompt.
    """

    system: Callable[[str | None, list[dict[str, Any]]], str]
    turn: Callable[[str, str], str]
    header: str
    assistant: Callable[[Message, bool], str]
    results: Callable[[list[Message]], str]
    opening: Callable[[bool | None], str]
    eos: str
    end: str


def thinking_on(default: bool | None, enable_thinking: Any = None,
                reasoning_effort: Any = None) -> bool | None:
    """Whether a native prompt opens reasoning, from the request's template variables
    (`reasoning_effort` wins, "none" is off; else a literal `enable_thinking`; else `default`)."""
    if reasoning_effort is not None:
        return str(reasoning_effort).lower() != "none"
    if isinstance(enable_thinking, bool):
        return enable_thinking
    return default


def split_reasoning(message: Message) -> tuple[str | None, str]:
    """(reasoning, content) of an assistant turn: its reasoning field, else the text before a
    `</think>` in the content (as templates split it)."""
    content = message.content
    reasoning = message.reasoning
    if "</think>" in content:
        before, content = content.rsplit("</think>", 1)
        if reasoning is None:
            reasoning = before.split("<think>")[-1].strip()
        content = content.strip()
    return reasoning, content


def render_turns(
    history: History | Iterable[Mapping[str, Any]],
    tools: Iterable[Mapping[str, Any]] | None,
    spec: TurnFormat,
    *,
    add_generation_prompt: bool,
    continue_final_message: bool,
    replay: ReplayMemory | None,
    thinking: bool | None,
    show_reasoning: Callable[[int, int, int], bool],
) -> str:
    """A conversation in `spec`'s format. `show_reasoning(index, last_user, count)` says whether
    the assistant turn at `index` writes its reasoning back; assistant turns after the last user
    message are replayed from `replay` when all their calls are remembered."""
    check_modes(add_generation_prompt, continue_final_message)
    messages = [Message("system", m.content) if m.role == "developer" else m
                for m in normalize_history(history).messages]
    if continue_final_message:
        check_continuable(messages)
    system = messages[0].content if messages and messages[0].role == "system" else None
    out = [spec.system(system, normalize_tools(tools))]
    last_user = last_index(messages, ("user",))
    i = 0 if system is None else 1
    while i < len(messages):
        message, is_last = messages[i], i == len(messages) - 1
        end = "" if continue_final_message and is_last else spec.end
        if message.role == "assistant":
            remembered = i > last_user and replayed(
                replay, message, lambda text: spec.header + text.removesuffix(spec.eos) + spec.end)
            show = show_reasoning(i, last_user, len(messages))
            out.append(remembered or spec.header + spec.assistant(message, show) + end)
        elif message.role == "tool":
            run = i
            while run < len(messages) and messages[run].role == "tool":
                run += 1
            out.append(spec.results(messages[i:run]))
            i = run
            continue
        else:
            out.append(spec.turn(message.role, message.content) + end)
        i += 1
    if add_generation_prompt:
        out.append(spec.header + spec.opening(thinking))
    return "".join(out)


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
