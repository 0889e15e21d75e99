"""The `hermes` dialect: Hermes 2 Pro / Qwen2.5 / Qwen3 `<tool_call>` blocks holding one JSON
object `{"name": ..., "arguments": {...}}`, with optional `<think>` reasoning (hermes.peg).

Options: ``reasoning`` (True: the output starts in reasoning, as when `<think>` ends the prompt;
False: none; None, the default: detected from the output) and ``arguments_first`` (constrain
calls to Hermes 2 Pro's `{"arguments": ..., "name": ...}` key order; parsing accepts both).
A template that never writes `<think>` makes ``reasoning`` False.

Native renderer ``hermes``: Qwen3 / Hermes ``<tool_call>`` blocks, results as ``<tool_response>``
in a user turn (byte-identical to the Qwen3 template). Its ChatML framing (`render_chatml`) is
shared with Qwen3-Coder's renderer (`pegmask.dialects.hermes_xml`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pegmask.dialects.base import TurnDialect
from pegmask.dialects.history import History, Message, normalize_history, normalize_tools
from pegmask.dialects.rendering import check_continuable, check_modes, dumps, replayed
from pegmask.dialects.replay import ReplayMemory

IM_END = "<|im_end|>"
ASSISTANT_HEADER = "<|im_start|>assistant\n"


@dataclass(frozen=True)
class ChatMLSpec:
    """What differs between Qwen3's JSON calls and Qwen3-Coder's XML calls."""

    system: Callable[[str | None, Sequence[Mapping[str, Any]]], str]  # system text, tools
    assistant: Callable[[Message, bool, bool], str]  # turn without its end: message, live, is_last
    results_open: str  # opens the user turn of a run of results
    result: Callable[[str], str]  # one result block


def render_chatml(
    history: History | Iterable[Mapping[str, Any]],
    tools: Iterable[Mapping[str, Any]] | None,
    spec: ChatMLSpec,
    *,
    add_generation_prompt: bool,
    continue_final_message: bool,
    replay: ReplayMemory | None,
) -> str:
    """The turns both Qwen families share; assistant turns after the last real user query are live
    (replayed when remembered)."""
    check_modes(add_generation_prompt, continue_final_message)
    messages = [
        Message("system", m.content) if m.role == "developer" else m
        for m in normalize_history(history).messages
    ]
    if continue_final_message:
        check_continuable(messages)
    system = messages[0].content if messages and messages[0].role == "system" else None
    out = [spec.system(system, normalize_tools(tools))]
    last_query = len(messages) - 1
    for i in range(len(messages) - 1, -1, -1):
        text = messages[i].content
        if messages[i].role == "user" and not (
            text.startswith("<tool_response>") and text.endswith("</tool_response>")
        ):
            last_query = i
            break
    for i, message in enumerate(messages):
        is_last = i == len(messages) - 1
        end = "" if continue_final_message and is_last else f"{IM_END}\n"
        if message.role == "user" or (message.role == "system" and i > 0):
            out.append(f"<|im_start|>{message.role}\n{message.content}{end}")
        elif message.role == "assistant":
            live = i > last_query
            remembered = live and replayed(
                replay,
                message,
                lambda text: f"{ASSISTANT_HEADER}{text.removesuffix(IM_END)}{IM_END}\n",
            )
            out.append(remembered or spec.assistant(message, live, is_last) + end)
        elif message.role == "tool":
            if i == 0 or messages[i - 1].role != "tool":
                out.append(spec.results_open)
            out.append(spec.result(message.content))
            if is_last or messages[i + 1].role != "tool":
                out.append(f"{IM_END}\n")
    if add_generation_prompt:
        out.append(ASSISTANT_HEADER)
    return "".join(out)


_HERMES_TOOLS_HEAD = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_HERMES_TOOLS_TAIL = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
    'within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, '
    '"arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
)


def plain_system(system: str | None) -> str:
    return "" if system is None else f"<|im_start|>system\n{system}{IM_END}\n"


def _hermes_system(system: str | None, tools: Sequence[Mapping[str, Any]]) -> str:
    if not tools:
        return plain_system(system)
    head = "" if system is None else system + "\n\n"
    body = "".join("\n" + dumps(tool) for tool in tools)
    return f"<|im_start|>system\n{head}{_HERMES_TOOLS_HEAD}{body}{_HERMES_TOOLS_TAIL}"


def _hermes_split_reasoning(message: Message) -> tuple[str, str]:
    """(content, reasoning), reading a ``<think>`` block from content when none is given."""
    content = message.content
    if message.reasoning is not None:
        return content, message.reasoning
    if "</think>" in content:
        reasoning = content.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
        return content.split("</think>")[-1].lstrip("\n"), reasoning
    return content, ""


def _hermes_assistant(message: Message, live: bool, is_last: bool) -> str:
    """Reasoning only in the live tool loop; a ``\\n`` before each call but a leading one."""
    content, reasoning = _hermes_split_reasoning(message)
    if live and (is_last or reasoning):
        thought = reasoning.strip("\n")
        out = [f"{ASSISTANT_HEADER}<think>\n{thought}\n</think>\n\n", content.lstrip("\n")]
    else:
        out = [ASSISTANT_HEADER + content]
    for j, call in enumerate(message.tool_calls):
        if j > 0 or content:
            out.append("\n")
        out.append(
            f'<tool_call>\n{{"name": "{call.name}", "arguments": {call.arguments_json}}}\n</tool_call>'
        )
    return "".join(out)


_HERMES = ChatMLSpec(
    _hermes_system,
    _hermes_assistant,
    "<|im_start|>user",
    lambda text: f"\n<tool_response>\n{text}\n</tool_response>",
)


def render_hermes(
    history: History | Iterable[Mapping[str, Any]],
    tools: Iterable[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    *,
    continue_final_message: bool = False,
    replay: ReplayMemory | None = None,
    enable_thinking: bool = True,
) -> str:
    """Qwen3-style Hermes prompt: ``<tool_call>`` blocks, results in ``<tool_response>`` blocks.

    Reasoning is kept for assistant turns after the last real user query (the live tool loop).
    ``enable_thinking=False`` pre-fills an empty think block in the generation prompt.
    """
    prompt = render_chatml(
        history,
        tools,
        _HERMES,
        add_generation_prompt=add_generation_prompt,
        continue_final_message=continue_final_message,
        replay=replay,
    )
    if add_generation_prompt and not enable_thinking:
        prompt += "<think>\n\n</think>\n\n"
    return prompt


# Qwen3-Coder writes schemas and values with Jinja's ``string`` filter, i.e. Python's ``str``:
# nested objects, lists and booleans reach the prompt as Python literals ({'a': 1}, True).


# A call as the probe conversation renders it: a JSON object naming the tool, in either key order.
_PROBE_CALL = re.compile(r'<tool_call>\s*\{\s*"(name": "pegmask_probe"|arguments": )')


class HermesDialect(TurnDialect):
    name = "hermes"
    priority = 290
    probe = (_PROBE_CALL,)
    peg_file = "hermes.peg"
    renderer = render_hermes
    turn_header = ASSISTANT_HEADER
    implicit_reasoning_end = False  # a <tool_call> written while thinking stays reasoning

    def __init__(self, *, arguments_first: bool = False, **options: Any):
        super().__init__(**options)
        self.arguments_first = arguments_first

    def tool_section(self) -> str:
        return "per tool, arguments first" if self.arguments_first else "per tool"

    @classmethod
    def owns_template(cls, template: str, renderings: Sequence[str]) -> bool:
        """`<tool_call>` blocks holding a JSON object (Qwen2.5 / Qwen3, Hermes 2 Pro, Granite 4,
        MiMo), or a ChatML template that knows no tools at all (SmolLM2)."""
        return super().owns_template(template, renderings) or (
            "<|im_start|>" in template and "tool" not in template)

    @classmethod
    def template_options(cls, template: str) -> dict[str, Any]:
        """A template that never writes `<think>` belongs to a model that does not reason."""
        return {} if "<think>" in template else {"reasoning": False}
