"""The `deepseek-r1` and `deepseek-v3.1` dialects: DeepSeek V3 / R1 and V3.1 calls in a
`<｜tool▁calls▁begin｜>` block (deepseek.peg).

R1 (and V3-0324, R1-0528) writes `function<｜tool▁sep｜>NAME` and the arguments in a ```json
fence, calls separated by a newline; its prompt ends with `<think>\\n`, so the output starts in
reasoning (``reasoning`` defaults to True). V3.1 (and V3.2-Exp) writes `NAME<｜tool▁sep｜>` and
bare JSON arguments, calls back to back; its template opens `<think>` only in thinking mode, so
reasoning is detected from the output (`</think>`) unless the request or option says. Parsing
reads both versions' call bodies.

R1's template (R1-Distill) does not declare tools, so R1 has a native renderer, ``deepseek-r1``:
its template's turns (byte-identical where the template writes a history without tools) with
the tools declared in the system prompt as vLLM's R1 tool template words it, content before
the calls, and the results run closed before the next turn. V3.1's template renders tools and
calls itself.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar

from pegmask.dialects.base import TurnDialect
from pegmask.dialects.history import History, Message, ToolCall, normalize_history, normalize_tools
from pegmask.dialects.rendering import check_continuable, check_modes, dumps, replayed
from pegmask.dialects.replay import ReplayMemory

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
USER = "<｜User｜>"
ASSISTANT = "<｜Assistant｜>"
_R1_TOOLS_HEAD = (
    "You are a helpful assistant with tool calling capabilities. When a tool call is needed, you "
    "MUST use the following format to issue the call:\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>"
    "function<｜tool▁sep｜>FUNCTION_NAME\n```json\n{\"param1\": \"value1\", \"param2\": "
    "\"value2\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>\n\nMake sure the JSON is valid.## "
    "Tools\n\n### Function\n\nYou have the following functions available:\n\n"
)


def _r1_calls(calls: Sequence[ToolCall]) -> str:
    return "<｜tool▁calls▁begin｜>" + "\n".join(
        f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>{call.name}\n```json\n"
        f"{call.arguments_json}\n```<｜tool▁call▁end｜>" for call in calls) + "<｜tool▁calls▁end｜>"


def _r1_content(message: Message) -> str:
    """The answer without reasoning, as the template keeps it (after the last `</think>`)."""
    return message.content.split("</think>")[-1]


def render_deepseek_r1(
    history: History | Iterable[Mapping[str, Any]],
    tools: Iterable[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    *,
    continue_final_message: bool = False,
    replay: ReplayMemory | None = None,
) -> str:
    """DeepSeek-R1 prompt: R1-Distill's turns, tools declared in the system prompt.

    The generation prompt opens reasoning (`<think>\\n`). Assistant turns after the last user
    message are replayed from `replay` when all their calls are remembered.
    """
    check_modes(add_generation_prompt, continue_final_message)
    messages = [Message("system", m.content) if m.role == "developer" else m
                for m in normalize_history(history).messages]
    if continue_final_message:
        check_continuable(messages)
    system = next((m.content for m in reversed(messages) if m.role == "system"), "")
    tool_list = normalize_tools(tools)
    if tool_list:
        declared = "".join(f"\n```json\n{dumps(tool)}\n```\n" for tool in tool_list)
        system = f"{system}\n\n{_R1_TOOLS_HEAD}{declared}"
    last_user = max((i for i, m in enumerate(messages) if m.role == "user"), default=-1)
    out = [BOS, system]
    for i, message in enumerate(messages):
        is_last = i == len(messages) - 1
        if message.role == "user":
            out.append(USER + message.content)
        elif message.role == "assistant":
            end = "" if continue_final_message and is_last else EOS
            remembered = i > last_user and replayed(
                replay, message, lambda text: ASSISTANT + text.removesuffix(EOS) + EOS)
            calls = _r1_calls(message.tool_calls) if message.tool_calls else ""
            out.append(remembered or f"{ASSISTANT}{_r1_content(message)}{calls}{end}")
        elif message.role == "tool":
            first = i == 0 or messages[i - 1].role != "tool"
            out.append(("<｜tool▁outputs▁begin｜>" if first else "\n")
                       + f"<｜tool▁output▁begin｜>{message.content}<｜tool▁output▁end｜>")
            if is_last or messages[i + 1].role != "tool":
                out.append("<｜tool▁outputs▁end｜>")
    if add_generation_prompt:
        out.append(ASSISTANT + "<think>\n")
    return "".join(out)


class DeepSeekR1Dialect(TurnDialect):
    name = "deepseek-r1"
    priority = 170
    probe = (re.compile(r"<｜tool▁call▁begin｜>function<｜tool▁sep｜>pegmask_probe\n```json\n"),)
    peg_file = "deepseek.peg"
    reasoning_default = True
    renderer = render_deepseek_r1
    turn_header = ASSISTANT
    section: ClassVar[str] = "per tool, r1"
    call_sep: ClassVar[str] = '"\\n"'

    def tool_section(self) -> str:
        return self.section

    def substitutions(self, strict: bool) -> dict[str, str]:
        return {"call_sep": self.call_sep}


class DeepSeekV31Dialect(DeepSeekR1Dialect):
    name = "deepseek-v3.1"
    priority = 160
    probe = (re.compile(r"<｜tool▁call▁begin｜>pegmask_probe<｜tool▁sep｜>\{"),)
    reasoning_default = None
    renderer = None
    section = "per tool, v3.1"
    call_sep = '""'
