"""The `dsml` dialect: DeepSeek V3.2 (`function_calls`) and V4 (`tool_calls`) DSML blocks with
`string="true|false"` parameters (dsml.peg).

Options: ``version`` ("v4", the default, "v3.2", or "v4.1": `<｜DSML｜ calls>` with a space after
｜DSML｜ in every tag, as xgrammar's deepseek_v4_1) picks the block name the grammar enforces
and the native prompt renderer; parsing accepts both. ``reasoning`` defaults to True (the
prompt ends with `<think>`); chat mode is ``reasoning=False`` or ``enable_thinking: false`` in
the request. Plain string parameters are raw (`string="true"`); constrained strings and every
other type are JSON (`string="false"`), checked by the parameter's schema.

Native renderers ``dsml`` / ``dsml-v3.2`` and ``dsml-v4``: DeepSeek's reference encoders
(``encoding_dsv32`` / ``encoding_dsv4``). A template that writes `function_calls` blocks is V3.2.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pegmask.dialects.base import TurnDialect, alternatives, peg_literal
from pegmask.dialects.history import (
    History,
    HistoryError,
    Message,
    ToolCall,
    normalize_history,
    normalize_tools,
)
from pegmask.dialects.rendering import (
    check_continuable,
    check_modes,
    dumps,
    json_scalar,
    last_index,
    replayed,
)
from pegmask.dialects.replay import ReplayMemory

_BOS = "<｜begin▁of▁sentence｜>"
_EOS = "<｜end▁of▁sentence｜>"
_USER = "<｜User｜>"
_ASSISTANT = "<｜Assistant｜>"
_DSML = "｜DSML｜"

_DSML_V32_TOOLS = f"""## Tools
You have access to a set of tools you can use to answer the user's question.
You can invoke functions by writing a "<{_DSML}function_calls>" block like the following as part of your reply to the user:
<{_DSML}function_calls>
<{_DSML}invoke name="$FUNCTION_NAME">
<{_DSML}parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</{_DSML}parameter>
...
</{_DSML}invoke>
<{_DSML}invoke name="$FUNCTION_NAME2">
...
</{_DSML}invoke>
</{_DSML}function_calls>
String and scalar parameters should be specified as is without any escaping or quotes, while lists and objects should use JSON format. The "string" attribute should be set to "true" for string type parameters and "false" for other types (numbers, booleans, arrays, objects).
If the thinking_mode is enabled, then after function results you should strongly consider outputting a thinking block. Here is an example:
<{_DSML}function_calls>
...
</{_DSML}function_calls>
<function_results>
...
</function_results>
<think>...thinking about results</think>
Here are the functions available in JSONSchema format:
<functions>
{{schemas}}
</functions>
"""

_DSML_V4_TOOLS = f"""## Tools

You have access to a set of tools to help answer the user's question. You can invoke tools by writing a "<{_DSML}tool_calls>" block like the following:

<{_DSML}tool_calls>
<{_DSML}invoke name="$TOOL_NAME">
<{_DSML}parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</{_DSML}parameter>
...
</{_DSML}invoke>
<{_DSML}invoke name="$TOOL_NAME2">
...
</{_DSML}invoke>
</{_DSML}tool_calls>

String parameters should be specified as is and set `string="true"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string="false"`.

If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside <think>...</think> BEFORE any tool calls or final response.

Otherwise, output directly after </think> with tool calls or final response.

### Available Tool Schemas

{{schemas}}

You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.
"""

_REASONING_EFFORT_MAX = (
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to "
    "resolve the root cause, rigorously stress-testing your logic against all potential paths, "
    "edge cases, and adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, "
    "considered alternative, and rejected hypothesis to ensure absolutely no assumption is left "
    "unchecked.\n\n"
)


def _dsml_tools(template: str, tools: Sequence[Mapping[str, Any]]) -> str:
    return template.replace("{schemas}", "\n".join(dumps(t["function"]) for t in tools))


def _dsml_calls(calls: Sequence[ToolCall], block: str) -> str:
    """The DSML block: string values raw, everything else JSON; raw text under ``arguments``."""
    invokes = []
    for call in calls:
        arguments = (
            call.arguments if isinstance(call.arguments, dict) else {"arguments": call.arguments}
        )
        params = "\n".join(
            f'<{_DSML}parameter name="{key}" string="{"true" if isinstance(value, str) else "false"}">'
            f"{json_scalar(value)}</{_DSML}parameter>"
            for key, value in arguments.items()
        )
        invokes.append(f'<{_DSML}invoke name="{call.name}">\n{params}\n</{_DSML}invoke>')
    return f"\n\n<{_DSML}{block}>\n" + "\n".join(invokes) + f"\n</{_DSML}{block}>"


def _dsml_prepare(
    history: History | Iterable[Mapping[str, Any]], tools: Iterable[Mapping[str, Any]] | None
) -> tuple[list[Message], list[dict[str, Any]]]:
    """Developer messages read as system ones; tools live on the (first) system message."""
    messages = [
        Message("system", m.content) if m.role == "developer" else m
        for m in normalize_history(history).messages
    ]
    tool_list = normalize_tools(tools)
    if tool_list and (not messages or messages[0].role != "system"):
        messages.insert(0, Message("system", ""))
    return messages, tool_list


def _by_call_order(results: list[Message], calls: Sequence[ToolCall]) -> list[Message]:
    """Results in the order of the calls that asked for them (unknown ids first, as the encoder)."""
    order = {call.id: n for n, call in enumerate(calls)}
    return sorted(results, key=lambda m: order.get(m.tool_call_id or "", 0))


def _dsml_assistant(message: Message, *, thinking_part: bool, block: str, end: str) -> str:
    reasoning = (message.reasoning or "") + "</think>" if thinking_part else ""
    calls = _dsml_calls(message.tool_calls, block) if message.tool_calls else ""
    return f"{reasoning}{message.content}{calls}{end}"


def _dsml_replay(text: str) -> str:
    return text.removesuffix(_EOS) + _EOS


def render_dsml_v32(
    history: History | Iterable[Mapping[str, Any]],
    tools: Iterable[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    *,
    continue_final_message: bool = False,
    replay: ReplayMemory | None = None,
    enable_thinking: bool = True,
) -> str:
    """DeepSeek-V3.2 prompt as its reference encoder writes it (``encoding_dsv32``).

    Results follow the calls' ``<｜end▁of▁sentence｜>`` in a ``<function_results>`` block, in call
    order. The generation prompt is part of the last user turn or result block, so
    ``add_generation_prompt`` changes nothing here.
    """
    check_modes(add_generation_prompt, continue_final_message)
    messages, tool_list = _dsml_prepare(history, tools)
    if continue_final_message:
        check_continuable(messages)
    last_user = last_index(messages, ("user",))
    out = [_BOS]
    i = 0
    while i < len(messages):
        message = messages[i]
        if message.role == "system":
            out.append(message.content)
            if tool_list and i == 0:
                out.append("\n\n" + _dsml_tools(_DSML_V32_TOOLS, tool_list))
        elif message.role == "user":
            think = "<think>" if i == last_user and enable_thinking else "</think>"
            out.append(f"{_USER}{message.content}{_ASSISTANT}{think}")
        elif message.role == "assistant":
            is_last = i == len(messages) - 1
            end = "" if continue_final_message and is_last else _EOS
            remembered = i > last_user and replayed(replay, message, _dsml_replay)
            out.append(
                remembered
                or _dsml_assistant(
                    message,
                    thinking_part=enable_thinking and i > last_user,
                    block="function_calls",
                    end=end,
                )
            )
        else:
            start = i
            while i < len(messages) and messages[i].role == "tool":
                i += 1
            owner = messages[start - 1] if start else None
            if owner is None or owner.role != "assistant" or not owner.tool_calls:
                raise HistoryError("tool results must follow an assistant turn with tool calls")
            results = _by_call_order(list(messages[start:i]), owner.tool_calls)
            out.append("\n\n<function_results>")
            out.extend(f"\n<result>{result.content}</result>" for result in results)
            if len(results) >= len(owner.tool_calls):
                think = "<think>" if i - 1 >= last_user and enable_thinking else "</think>"
                out.append(f"\n</function_results>\n\n{think}")
            continue
        i += 1
    return "".join(out)


@dataclass
class _V4Turn:
    """A V4 message: tool results merge into user turns as ``<tool_result>`` blocks."""

    role: str
    message: Message | None = None
    blocks: list[Message] | None = None


def _v4_turns(messages: Sequence[Message]) -> list[_V4Turn]:
    turns: list[_V4Turn] = []
    for message in messages:
        if message.role in ("user", "tool"):
            if turns and turns[-1].role == "user":
                turns[-1].blocks.append(message)
            else:
                turns.append(_V4Turn("user", blocks=[message]))
        else:
            turns.append(_V4Turn(message.role, message=message))
    calls: Sequence[ToolCall] = ()
    for turn in turns:
        if turn.role == "assistant" and turn.message.tool_calls:
            calls = turn.message.tool_calls
        elif turn.role == "user" and calls:
            results = iter(_by_call_order([b for b in turn.blocks if b.role == "tool"], calls))
            turn.blocks = [next(results) if b.role == "tool" else b for b in turn.blocks]
    return turns


def render_dsml_v4(
    history: History | Iterable[Mapping[str, Any]],
    tools: Iterable[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    *,
    continue_final_message: bool = False,
    replay: ReplayMemory | None = None,
    enable_thinking: bool = True,
    drop_thinking: bool = True,
    reasoning_effort: str | None = None,
) -> str:
    """DeepSeek-V4 prompt as its reference encoder writes it (``encoding_dsv4``).

    There is no tool role: results become ``<tool_result>`` blocks of a user turn, sorted by the
    order of the calls while user text between them stays in place. With tools, reasoning is
    never dropped from history. ``reasoning_effort="max"`` prepends the maximum-effort preamble.
    """
    check_modes(add_generation_prompt, continue_final_message)
    messages, tool_list = _dsml_prepare(history, tools)
    if continue_final_message:
        check_continuable(messages)
    turns = _v4_turns(messages)
    drop = drop_thinking and not tool_list
    last_user = last_index([Message(t.role) for t in turns], ("user",))
    out = [_BOS]
    if enable_thinking and reasoning_effort == "max":
        out.append(_REASONING_EFFORT_MAX)
    for i, turn in enumerate(turns):
        is_last = i == len(turns) - 1
        if turn.role == "system":
            out.append(turn.message.content)
            if tool_list and i == 0:
                out.append("\n\n" + _dsml_tools(_DSML_V4_TOOLS, tool_list))
        elif turn.role == "user":
            out.append(
                _USER
                + "\n\n".join(
                    f"<tool_result>{b.content}</tool_result>" if b.role == "tool" else b.content
                    for b in turn.blocks
                )
            )
            if is_last or turns[i + 1].role == "assistant":
                keep = enable_thinking and (not drop or i >= last_user)
                out.append(_ASSISTANT + ("<think>" if keep else "</think>"))
        else:
            message = turn.message
            live = not drop or i > last_user
            end = "" if continue_final_message and is_last else _EOS
            remembered = live and replayed(replay, message, _dsml_replay)
            out.append(
                remembered
                or _dsml_assistant(
                    message, thinking_part=enable_thinking and live, block="tool_calls", end=end
                )
            )
    return "".join(out)


_BLOCKS = {"v4": "tool_calls", "v3.2": "function_calls", "v4.1": "calls"}


class DsmlDialect(TurnDialect):
    name = "dsml"
    priority = 30
    template_marker = "｜DSML｜"  # DeepSeek's markup
    peg_file = "dsml.peg"
    reasoning_default = True
    renderer = render_dsml_v32
    version_renderers = {"v3.2": render_dsml_v32, "v4": render_dsml_v4}

    def __init__(self, *, version: str = "v4", **options: Any):
        if version not in _BLOCKS:
            raise ValueError(f"dsml version must be one of {sorted(_BLOCKS)}, not {version!r}")
        super().__init__(**options)
        self.version = version
        # no reference encoder of V4.1 here: its prompts come from its template
        self.native_renderer = f"{self.name}-{version}" if version in self.version_renderers \
            else None

    def substitutions(self, strict: bool) -> dict[str, str]:
        names = [_BLOCKS[self.version]] if strict else list(_BLOCKS.values())
        space = '" "' if self.version == "v4.1" else '""'
        return {"block": alternatives([peg_literal(name) for name in names]),
                "space": space if strict else '" "?'}

    @classmethod
    def template_options(cls, template: str) -> dict[str, Any]:
        """V3.2's templates write `function_calls` blocks, V4's `tool_calls`, V4.1's `calls`
        after a space."""
        if "function_calls" in template:
            return {"version": "v3.2"}
        return {"version": "v4.1" if "｜DSML｜ " in template else "v4"}
