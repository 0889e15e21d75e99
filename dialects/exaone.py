"""The `exaone` dialect: LG EXAONE 4.0 `<tool_call>{"name": ..., "arguments": ...}</tool_call>`
calls, compact (no newlines inside the tags), one per call, after `<think>` reasoning
(exaone.peg).

Reasoning is on when the request turns it on: EXAONE's template opens `<think>\\n` in the
generation prompt only for ``enable_thinking: true`` (the output then starts in reasoning and
closes it with `</think>\\n\\n`), else it writes an empty `<think>\\n\\n</think>\\n\\n` block.

Native renderer ``exaone``: EXAONE-4.0's chat template (as quoted in the Berkeley Function
Calling Leaderboard's EXAONE 4 handler, bfcl_eval; none is in data/templates): `[|system|]`,
`[|user|]`, `[|assistant|]`, `[|tool|]` turns ended by `[|endofturn|]\\n`, tools declared as
`<tool>JSON</tool>` lines, results as `<tool_result>{"result": ...}</tool_result>`. One
deliberate difference: the template drops the reasoning of a turn that has calls and no text;
this renderer keeps it. Detection: a template with `[|assistant|]` whose probe call is a
compact `<tool_call>{"name": ...}`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from pegmask.dialects.base import TurnDialect
from pegmask.dialects.history import History, Message
from pegmask.dialects.rendering import (
    TurnFormat,
    dumps,
    render_turns,
    split_reasoning,
    thinking_on,
)
from pegmask.dialects.replay import ReplayMemory
from pegmask.dialects.request import ChatRequest

ASSISTANT = "[|assistant|]\n"
EOS = "[|endofturn|]"
END = EOS + "\n"
EMPTY_THOUGHT = "<think>\n\n</think>\n\n"
_TOOLS_HEAD = (
    "# Available Tools\nYou can use none, one, or multiple of the following tools by calling them "
    "as functions to help with the user\u2019s query.\nHere are the tools available to you in JSON "
    "format within <tool> and </tool> tags:\n"
)
_TOOLS_TAIL = (
    "\nFor each function call you want to make, return a JSON object with function name and "
    "arguments within <tool_call> and </tool_call> tags, like:\n<tool_call>{\"name\": "
    "function_1_name, \"arguments\": {argument_1_name: argument_1_value, argument_2_name: "
    "argument_2_value}}</tool_call>\n<tool_call>{\"name\": function_2_name, \"arguments\": "
    "{...}}</tool_call>\n...\nNote that if no argument name is specified for a tool, you can just "
    "print the argument value directly, without the argument name or JSON formatting."
)
_PROBE_CALL = re.compile(r'<tool_call>\{"name": "pegmask_probe", "arguments": ')


def _system(text: str | None, tools: list[dict[str, Any]]) -> str:
    declared = "".join(f"<tool>{dumps(tool)}</tool>\n" for tool in tools)
    if tools:
        head = "" if text is None else text + "\n\n"
        return f"[|system|]\n{head}{_TOOLS_HEAD}{declared}{_TOOLS_TAIL}{END}"
    return "" if text is None else f"[|system|]\n{text}{END}"


def _assistant(message: Message, show: bool) -> str:
    reasoning, content = split_reasoning(message)
    thought = (f"<think>\n{reasoning}\n</think>\n\n" if show and reasoning is not None
               else EMPTY_THOUGHT)
    calls = "\n".join(f'<tool_call>{{"name": "{call.name}", "arguments": '
                      f"{call.arguments_json}}}</tool_call>" for call in message.tool_calls)
    if not content and not calls:
        return ""
    return thought + content + ("\n" if content and calls else "") + calls


def _results(messages: list[Message]) -> str:
    results = "\n".join(f'<tool_result>{{"result": {dumps(m.content)}}}</tool_result>'
                        for m in messages)
    return f"[|tool|]\n{results}{END}"


FORMAT = TurnFormat(
    system=_system,
    turn=lambda role, text: f"[|{role}|]\n{text}",
    header=ASSISTANT,
    assistant=_assistant,
    results=_results,
    opening=lambda thinking: "<think>\n" if thinking else EMPTY_THOUGHT,
    eos=EOS,
    end=END,
)


def render_exaone(
    history: History | Iterable[Mapping[str, Any]],
    tools: Iterable[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    *,
    continue_final_message: bool = False,
    replay: ReplayMemory | None = None,
    enable_thinking: bool | None = None,
    reasoning_effort: str | None = None,
    skip_think: bool = True,
) -> str:
    """EXAONE 4.0 prompt. The generation prompt opens `<think>` for ``enable_thinking: true``;
    the last message's reasoning is written back when ``skip_think`` is false (the template's
    variables)."""
    return render_turns(
        history, tools, FORMAT, add_generation_prompt=add_generation_prompt,
        continue_final_message=continue_final_message, replay=replay,
        thinking=thinking_on(False, enable_thinking, reasoning_effort),
        show_reasoning=lambda i, last_user, count: not skip_think and i == count - 1)


class ExaoneDialect(TurnDialect):
    name = "exaone"
    priority = 270
    probe = ("[|assistant|]", _PROBE_CALL)
    peg_file = "exaone.peg"
    reasoning_default = False
    renderer = render_exaone
    turn_header = ASSISTANT

    def reasoning_mode(self, request: ChatRequest | None) -> bool | None:
        """On for a literal ``enable_thinking: true`` too (what opens the template's `<think>`)."""
        if request is not None and "reasoning_effort" not in request.chat_template_kwargs \
                and request.chat_template_kwargs.get("enable_thinking") is True:
            return True
        return super().reasoning_mode(request)
