"""The `hermes-xml` dialect: Qwen3-Coder / Qwen3.5 / Nemotron 3 `<tool_call>` blocks with one
`<function=NAME>` and a `<parameter=KEY>` block per argument (hermes_xml.peg).

String parameters are written raw, their schema (lengths, pattern, format, enum) applied to the
raw text; every other type is JSON, constrained by the parameter's schema. Option ``reasoning`` as
for `hermes` (Qwen3.5 puts `<think>` in the prompt: pass ``reasoning=True``).

Native renderer ``hermes-xml``: the prompt as the Qwen3-Coder template writes it (tools declared in
XML, byte-identical to the template where it renders at all).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pegmask.dialects.base import TurnDialect
from pegmask.dialects.hermes import (
    ASSISTANT_HEADER,
    IM_END,
    ChatMLSpec,
    plain_system,
    render_chatml,
)
from pegmask.dialects.history import History, Message, ToolCall
from pegmask.dialects.rendering import dumps
from pegmask.dialects.replay import ReplayMemory

# Qwen3-Coder writes schemas and values with Jinja's ``string`` filter, i.e. Python's ``str``:
# nested objects, lists and booleans reach the prompt as Python literals ({'a': 1}, True).
_CODER_DEFAULT_SYSTEM = (
    "You are Qwen, a helpful AI assistant that can interact with a computer to solve tasks."
)
_CODER_TOOLS_TAIL = (
    "\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO "
    "suffix:\n\n<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\n"
    "value_1\n</parameter>\n<parameter=example_parameter_2>\nThis is the value for the second "
    "parameter\nthat can span\nmultiple lines\n</parameter>\n</function>\n</tool_call>\n\n"
    "<IMPORTANT>\nReminder:\n- Function calls MUST follow the specified format: an inner "
    "<function=...></function> block must be nested within <tool_call></tool_call> XML tags\n"
    "- Required parameters MUST be specified\n- You may provide optional reasoning for your "
    "function call in natural language BEFORE the function call, but NOT after\n- If there is no "
    "function call available, answer the question like normal with your current knowledge and "
    "do not tell the user about function calls\n</IMPORTANT>"
)
_CODER_HANDLED_KEYS = ("type", "description", "enum", "required")


def _coder_item_list(items: Any) -> str:
    """The template's ``render_item_list``: ``[`a`, `b`]`` in ``<required>`` tags, if non-empty."""
    if not isinstance(items, (Sequence, Mapping)) or not items:  # Jinja's `sequence` test
        return ""
    listed = ", ".join(f"`{item}`" if isinstance(item, str) else str(item) for item in items)
    return f"\n<required>[{listed}]</required>"


def _coder_value(value: Any) -> str:
    return dumps(value) if isinstance(value, Mapping) else str(value)


def _coder_parameter(name: str, fields: Any) -> str:
    """One property as XML: type, description, then every other key (objects as JSON)."""
    out = [f"\n<parameter>\n<name>{name}</name>"]
    if isinstance(fields, Mapping):
        if "type" in fields:
            out.append(f"\n<type>{fields['type']}</type>")
        if "description" in fields:
            out.append(f"\n<description>{str(fields['description']).strip()}</description>")
        for key, value in fields.items():
            if key and key not in _CODER_HANDLED_KEYS and value is not None:
                tag = key.replace("-", "_").replace(" ", "_").replace("$", "")
                out.append(f"\n<{tag}>{_coder_value(value)}</{tag}>")
        out.append(_coder_item_list(fields.get("required")))
    out.append("\n</parameter>")
    return "".join(out)


def _coder_tool(tool: Mapping[str, Any]) -> str:
    """A tool as the template declares it; one without parameters declares none (the template
    raises there)."""
    function = tool["function"]
    description = str(function["description"]).strip() if "description" in function else ""
    parameters = function.get("parameters")
    parameters = parameters if isinstance(parameters, Mapping) else {}
    properties = parameters.get("properties")
    out = [f"\n<function>\n<name>{function.get('name', '')}</name>"]
    out.append(f"\n<description>{description}</description>\n<parameters>")
    if isinstance(properties, Mapping):
        out.extend(_coder_parameter(name, fields) for name, fields in properties.items())
    out.append(_coder_item_list(parameters.get("required")) + "\n</parameters>")
    if "return" in function:
        out.append(f"\n<return>{_coder_value(function['return'])}</return>")
    out.append("\n</function>")
    return "".join(out)


def _coder_system(system: str | None, tools: Sequence[Mapping[str, Any]]) -> str:
    if not tools:
        return plain_system(system)
    head = _CODER_DEFAULT_SYSTEM if system is None else system
    declared = "".join(_coder_tool(tool) for tool in tools)
    return (
        f"<|im_start|>system\n{head}\n\nYou have access to the following functions:\n\n"
        f"<tools>{declared}{_CODER_TOOLS_TAIL}{IM_END}\n"
    )


def _coder_call(call: ToolCall) -> str:
    """A ``<function=...>`` block; raw (non-object) arguments stand verbatim for the parameters."""
    if isinstance(call.arguments, str):
        body = call.arguments + "\n"
    else:
        body = "".join(
            f"<parameter={key}>\n{value}\n</parameter>\n"  # str(value), as said above
            for key, value in call.arguments.items()
        )
    return f"\n<tool_call>\n<function={call.name}>\n{body}</function>\n</tool_call>"


def _coder_assistant(message: Message, live: bool, is_last: bool) -> str:
    """Content as is, or trimmed before calls; reasoning is never shown."""
    if not message.tool_calls:
        return ASSISTANT_HEADER + message.content
    content = message.content.strip()
    head = f"{ASSISTANT_HEADER}{content}\n" if content else "<|im_start|>assistant"
    return head + "".join(_coder_call(call) for call in message.tool_calls)


_CODER = ChatMLSpec(
    _coder_system,
    _coder_assistant,
    "<|im_start|>user\n",
    lambda text: f"<tool_response>\n{text}\n</tool_response>\n",
)


def render_hermes_xml(
    history: History | Iterable[Mapping[str, Any]],
    tools: Iterable[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    *,
    continue_final_message: bool = False,
    replay: ReplayMemory | None = None,
) -> str:
    """Qwen3-Coder prompt (byte-identical to its template): tools declared in XML, calls as
    ``<function=NAME>`` with one ``<parameter=KEY>`` block per argument, no reasoning.

    Where the template fails or misframes, this writes what it would for the nearest valid
    history: a tool without parameters declares none, raw arguments are written verbatim, and a
    result right after the system prompt still opens its user turn.
    """
    return render_chatml(
        history,
        tools,
        _CODER,
        add_generation_prompt=add_generation_prompt,
        continue_final_message=continue_final_message,
        replay=replay,
    )


_PROBE_CALL = re.compile(r"<tool_call>\s*<function=pegmask_probe>\s*<parameter=pegmask_arg>")


class HermesXmlDialect(TurnDialect):
    name = "hermes-xml"
    priority = 280
    probe = (_PROBE_CALL,)
    peg_file = "hermes_xml.peg"
    renderer = render_hermes_xml
    turn_header = ASSISTANT_HEADER
    raw_until = "\n</parameter>"

    @classmethod
    def template_options(cls, template: str) -> dict[str, Any]:
        """Without `<think>` in the template, no reasoning."""
        return {} if "<think>" in template else {"reasoning": False}
