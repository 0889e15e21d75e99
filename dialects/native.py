"""Native prompt renderers: the structured history written in each dialect's own protocol.

Model templates lose tool history in ways the dialects do not (gpt-oss's template keeps only the
first call of a turn and JSON-encodes string arguments a second time; templates differ on where
results go). These renderers write every call, argument and result the way each model family was
trained to read it (reference/dialects.md):

* ``hermes``: Qwen3 / Hermes ``<tool_call>`` blocks, results as ``<tool_response>`` in a user
  turn (byte-identical to the Qwen3 template);
* ``hermes-xml``: Qwen3-Coder ``<function=NAME>`` / ``<parameter=KEY>`` calls, tools declared
  in XML (byte-identical to the Qwen3-Coder template where it renders at all);
* ``harmony``: gpt-oss messages as the ``openai-harmony`` renderer writes them;
* ``llmjp-harmony``: the LLM-jp-4.1 template (every parallel call, string arguments verbatim);
* ``dsml`` / ``dsml-v3.2`` and ``dsml-v4``: DeepSeek's reference encoders.

Assistant turns still in the live tool loop are replayed byte for byte from a
:class:`~pegmask.dialects.replay.ReplayMemory` when all their calls are found there.
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date
from typing import Any

from pegmask.dialects.history import (
    History,
    HistoryError,
    Message,
    ToolCall,
    normalize_history,
    normalize_tools,
)
from pegmask.dialects.replay import ReplayMemory

__all__ = [
    "NATIVE_DIALECTS",
    "llmjp_prompt_form",
    "render_dsml_v32",
    "render_dsml_v4",
    "render_harmony",
    "render_hermes",
    "render_hermes_xml",
    "render_llmjp_harmony",
    "render_native",
    "replay_text",
]


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _last_index(messages: Sequence[Message], roles: tuple[str, ...]) -> int:
    return next((i for i in range(len(messages) - 1, -1, -1) if messages[i].role in roles), -1)


def _replayed(
    replay: ReplayMemory | None, message: Message, frame: Callable[[str], str]
) -> str | None:
    if replay is None or not message.tool_calls:
        return None
    texts = replay.recall(message.tool_calls)
    return None if texts is None else "".join(frame(text) for text in texts)


def _check_continuable(messages: Sequence[Message]) -> None:
    if not messages or messages[-1].role != "assistant":
        raise ValueError("continue_final_message needs an assistant message at the end")
    if messages[-1].tool_calls:
        raise ValueError("continue_final_message cannot continue a turn that ended with tool calls")


def _check_modes(add_generation_prompt: bool, continue_final_message: bool) -> None:
    if add_generation_prompt and continue_final_message:
        raise ValueError("continue_final_message and add_generation_prompt are not compatible")


# ---------------------------------------------------------------------------------------------
# Hermes / Qwen3 and Qwen3-Coder: ChatML turns, results in a user turn
# ---------------------------------------------------------------------------------------------

_IM_END = "<|im_end|>"
_ASSISTANT_HEADER = "<|im_start|>assistant\n"


@dataclass(frozen=True)
class _ChatMLSpec:
    """What differs between Qwen3's JSON calls and Qwen3-Coder's XML calls."""

    system: Callable[[str | None, Sequence[Mapping[str, Any]]], str]  # system text, tools
    assistant: Callable[[Message, bool, bool], str]  # turn without its end: message, live, is_last
    results_open: str  # opens the user turn of a run of results
    result: Callable[[str], str]  # one result block


def _render_chatml(
    history: History | Iterable[Mapping[str, Any]],
    tools: Iterable[Mapping[str, Any]] | None,
    spec: _ChatMLSpec,
    *,
    add_generation_prompt: bool,
    continue_final_message: bool,
    replay: ReplayMemory | None,
) -> str:
    """The turns both Qwen families share; assistant turns after the last real user query are live
    (replayed when remembered)."""
    _check_modes(add_generation_prompt, continue_final_message)
    messages = [
        Message("system", m.content) if m.role == "developer" else m
        for m in normalize_history(history).messages
    ]
    if continue_final_message:
        _check_continuable(messages)
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
        end = "" if continue_final_message and is_last else f"{_IM_END}\n"
        if message.role == "user" or (message.role == "system" and i > 0):
            out.append(f"<|im_start|>{message.role}\n{message.content}{end}")
        elif message.role == "assistant":
            live = i > last_query
            replayed = live and _replayed(
                replay,
                message,
                lambda text: f"{_ASSISTANT_HEADER}{text.removesuffix(_IM_END)}{_IM_END}\n",
            )
            out.append(replayed or spec.assistant(message, live, is_last) + end)
        elif message.role == "tool":
            if i == 0 or messages[i - 1].role != "tool":
                out.append(spec.results_open)
            out.append(spec.result(message.content))
            if is_last or messages[i + 1].role != "tool":
                out.append(f"{_IM_END}\n")
    if add_generation_prompt:
        out.append(_ASSISTANT_HEADER)
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


def _plain_system(system: str | None) -> str:
    return "" if system is None else f"<|im_start|>system\n{system}{_IM_END}\n"


def _hermes_system(system: str | None, tools: Sequence[Mapping[str, Any]]) -> str:
    if not tools:
        return _plain_system(system)
    head = "" if system is None else system + "\n\n"
    body = "".join("\n" + _dumps(tool) for tool in tools)
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
        out = [f"{_ASSISTANT_HEADER}<think>\n{thought}\n</think>\n\n", content.lstrip("\n")]
    else:
        out = [_ASSISTANT_HEADER + content]
    for j, call in enumerate(message.tool_calls):
        if j > 0 or content:
            out.append("\n")
        out.append(
            f'<tool_call>\n{{"name": "{call.name}", "arguments": {call.arguments_json}}}\n</tool_call>'
        )
    return "".join(out)


_HERMES = _ChatMLSpec(
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
    prompt = _render_chatml(
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
    return _dumps(value) if isinstance(value, Mapping) else str(value)


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
        return _plain_system(system)
    head = _CODER_DEFAULT_SYSTEM if system is None else system
    declared = "".join(_coder_tool(tool) for tool in tools)
    return (
        f"<|im_start|>system\n{head}\n\nYou have access to the following functions:\n\n"
        f"<tools>{declared}{_CODER_TOOLS_TAIL}{_IM_END}\n"
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
        return _ASSISTANT_HEADER + message.content
    content = message.content.strip()
    head = f"{_ASSISTANT_HEADER}{content}\n" if content else "<|im_start|>assistant"
    return head + "".join(_coder_call(call) for call in message.tool_calls)


_CODER = _ChatMLSpec(
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
    return _render_chatml(
        history,
        tools,
        _CODER,
        add_generation_prompt=add_generation_prompt,
        continue_final_message=continue_final_message,
        replay=replay,
    )


# ---------------------------------------------------------------------------------------------
# Harmony (gpt-oss) and its TypeScript-like tool declarations
# ---------------------------------------------------------------------------------------------


def _rust_lines(text: str) -> list[str]:
    """``str::lines`` semantics (split on newlines, drop one trailing empty line)."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


def _json_scalar(value: Any) -> str:
    return _dumps(value) if not isinstance(value, str) else value


def _is_enum(schema: Mapping[str, Any]) -> bool:
    return isinstance(schema.get("enum"), list) and bool(schema["enum"])


def _default_comment(schema: Mapping[str, Any], *, enum_as_json: bool = False) -> str:
    """``default: ...`` as harmony writes it (strings quoted unless an enum value)."""
    default = schema["default"]
    if isinstance(default, str) and not _is_enum(schema):
        return f'default: "{default}"'
    if isinstance(default, str) and not enum_as_json:
        return f"default: {default}"
    return f"default: {json.dumps(default, ensure_ascii=False, separators=(',', ':'))}"


def _harmony_type(schema: Any, indent: str) -> str:
    """JSON Schema to the TypeScript-like type ``openai-harmony`` writes into the prompt."""
    if not isinstance(schema, Mapping):
        return "any"
    variants = schema.get("oneOf")
    if isinstance(variants, list):
        out = []
        for variant in variants:
            text = _harmony_type(variant, indent + "   ")
            if (
                isinstance(variant, Mapping)
                and variant.get("nullable") is True
                and "null" not in text
            ):
                text += " | null"
            comments = []
            if isinstance(variant, Mapping):
                if isinstance(variant.get("description"), str):
                    comments.append(variant["description"])
                if "default" in variant:
                    comments.append(_default_comment(variant, enum_as_json=True))
            out.append(f"\n{indent} | {text}" + (f" // {' '.join(comments)}" if comments else ""))
        return "".join(out)
    kind = schema.get("type")
    if isinstance(kind, list):
        names = ["number" if t == "integer" else t for t in kind if isinstance(t, str)]
        if names:
            return " | ".join(names)
        kind = None
    if kind == "object":
        return _harmony_object(schema, indent)
    if kind == "string":
        enum = [f'"{value}"' for value in schema.get("enum") or () if isinstance(value, str)]
        return " | ".join(enum) if enum else "string"
    if kind in ("number", "integer"):
        return "number"
    if kind == "boolean":
        return "boolean"
    if kind == "array":
        return f"{_harmony_type(schema['items'], indent)}[]" if "items" in schema else "Array<any>"
    return "any"


def _harmony_object(schema: Mapping[str, Any], indent: str) -> str:
    out = []
    if isinstance(schema.get("description"), str):
        out.append(f"{indent}// {schema['description']}\n")
    out.append("{\n")
    required = {name for name in schema.get("required") or () if isinstance(name, str)}
    properties = schema.get("properties")
    for key, value in properties.items() if isinstance(properties, Mapping) else ():
        value = value if isinstance(value, Mapping) else {}
        optional = "" if key in required else "?"
        if isinstance(value.get("title"), str):
            out.append(f"{indent}// {value['title']}\n{indent}//\n")
        variants = value.get("oneOf")
        if "oneOf" not in value and isinstance(value.get("description"), str):
            out.append(f"{indent}// {value['description']}\n")
        examples = value.get("examples")
        if isinstance(examples, list) and examples:
            out.append(f"{indent}// Examples:\n")
            out.extend(f'{indent}// - "{ex}"\n' for ex in examples if isinstance(ex, str))
        if isinstance(variants, list):
            out.append(_harmony_one_of_property(key, optional, value, variants, indent))
            continue
        text = _harmony_type(value, indent + "    ")
        if value.get("nullable") is True and "null" not in text:
            text += " | null"
        out.append(f"{indent}{key}{optional}: {text},")
        if "default" in value and "oneOf" not in value:
            out.append(f" // {_default_comment(value)}")
        out.append("\n")
    out.append(f"{indent}}}")
    return "".join(out)


def _harmony_one_of_property(
    key: str, optional: str, value: Mapping[str, Any], variants: list, indent: str
) -> str:
    description = value.get("description") if isinstance(value.get("description"), str) else None
    first = variants[0] if variants and isinstance(variants[0], Mapping) else {}
    above = description is not None and description != first.get("description")
    out = [f"{indent}// {description}\n"] if above else []
    if "default" in value:
        out.append(f"{indent}// {_default_comment(value)}\n")
    out.append(f"{indent}{key}{optional}:\n")
    for i, variant in enumerate(variants):
        variant = variant if isinstance(variant, Mapping) else {}
        text = _harmony_type(variant, indent + "   ")
        if variant.get("nullable") is True and "null" not in text:
            text += " | null"
        comments = []
        variant_description = variant.get("description")
        if not (i == 0 and above) and isinstance(variant_description, str):
            if variant_description != description:
                comments.append(variant_description)
        if "default" in variant:
            comments.append(_default_comment(variant))
        out.append(f"{indent} | {text}" + (f" // {' '.join(comments)}" if comments else "") + "\n")
    out.append(f"{indent},\n")
    return "".join(out)


def _harmony_tools_section(tools: Sequence[Mapping[str, Any]]) -> str:
    lines = ["## functions\n", "namespace functions {\n"]
    for tool in tools:
        function = tool["function"]
        lines.extend(f"// {line}" for line in _rust_lines(function.get("description") or ""))
        parameters = function.get("parameters")
        if parameters is not None:
            lines.append(
                f"type {function['name']} = (_: {_harmony_type(parameters, '')}) => any;\n"
            )
        else:
            lines.append(f"type {function['name']} = () => any;\n")
    lines.append("} // namespace functions")
    return "# Tools\n\n" + "\n".join(lines)


@dataclass(frozen=True)
class _HarmonySpec:
    """What differs between gpt-oss Harmony and LLM-jp's Harmony."""

    call_content_type: str  # after "commentary ": "<|constrain|>json" or "<|constrain|> json"
    result_text: Callable[[str], str]  # raw text, or LLM-jp's JSON string literal
    between_calls: str  # what ends a call that another call of the same turn follows
    final_as_target: bool  # a closing final without generation prompt ends in <|return|>


def _analysis_text(message: Message) -> tuple[str | None, str | None]:
    """(analysis, preamble) of a call turn: content counts as analysis when there is no reasoning."""
    if message.reasoning:
        return message.reasoning, message.content or None
    return message.content or None, None


def _harmony_system(
    model_identity: str,
    knowledge_cutoff: str,
    current_date: str,
    reasoning_effort: str,
    has_tools: bool,
) -> str:
    top = [model_identity, f"Knowledge cutoff: {knowledge_cutoff}", f"Current date: {current_date}"]
    channels = (
        "# Valid channels: analysis, commentary, final. Channel must be included for every message."
    )
    if has_tools:
        channels += "\nCalls to these tools must go to the commentary channel: 'functions'."
    body = "\n\n".join(["\n".join(top), f"Reasoning: {reasoning_effort}", channels])
    return f"<|start|>system<|message|>{body}<|end|>"


def _harmony_messages(
    messages: Sequence[Message],
    spec: _HarmonySpec,
    *,
    live: Callable[[int], bool],
    add_generation_prompt: bool,
    continue_final_message: bool,
    replay: ReplayMemory | None,
) -> list[str]:
    """Everything after the developer message, shared by both Harmony dialects."""
    out = []
    batch: list[str] = []  # names of the latest call turn, for results sent without a name
    answered = 0
    last_name: str | None = None
    for i, message in enumerate(messages):
        is_last = i == len(messages) - 1
        if message.role == "user":
            out.append(f"<|start|>user<|message|>{message.content}<|end|>")
        elif message.role in ("system", "developer"):
            out.append(f"<|start|>developer<|message|># Instructions\n\n{message.content}<|end|>")
        elif message.role == "tool":
            name = message.name or (batch[answered] if answered < len(batch) else last_name)
            answered += 1
            if not name:
                raise HistoryError(
                    f"tool result {message.tool_call_id!r} is not tied to any call, so its function is unknown"
                )
            out.append(
                f"<|start|>functions.{name} to=assistant<|channel|>commentary"
                f"<|message|>{spec.result_text(message.content)}<|end|>"
            )
        elif message.tool_calls or (message.reasoning and not message.content):
            if message.tool_calls:
                batch, answered = [call.name for call in message.tool_calls], 0
                last_name = batch[-1]
            replayed = live(i) and _replayed(
                replay,
                message,
                lambda text: f"<|start|>assistant{text.removesuffix('<|call|>')}<|call|>",
            )
            if replayed:
                out.append(replayed)
                continue
            analysis, preamble = _analysis_text(message)
            if analysis and live(i):
                out.append(f"<|start|>assistant<|channel|>analysis<|message|>{analysis}<|end|>")
            if preamble:
                out.append(f"<|start|>assistant<|channel|>commentary<|message|>{preamble}<|end|>")
            for j, call in enumerate(message.tool_calls):
                last_call = j == len(message.tool_calls) - 1
                out.append(
                    f"<|start|>assistant to=functions.{call.name}<|channel|>commentary "
                    f"{spec.call_content_type}<|message|>{call.arguments_json}"
                    + ("<|call|>" if last_call else spec.between_calls)
                )
        elif is_last and continue_final_message:
            if message.reasoning is not None:
                out.append(
                    f"<|start|>assistant<|channel|>analysis<|message|>{message.reasoning}<|end|>"
                )
            out.append(f"<|start|>assistant<|channel|>final<|message|>{message.content}")
        elif is_last and not add_generation_prompt and spec.final_as_target:
            # LLM-jp's template writes a closing final as a training target: CoT kept, <|return|>
            if message.reasoning is not None:
                out.append(
                    f"<|start|>assistant<|channel|>analysis<|message|>{message.reasoning}<|end|>"
                )
            out.append(f"<|start|>assistant<|channel|>final<|message|>{message.content}<|return|>")
        else:
            out.append(f"<|start|>assistant<|channel|>final<|message|>{message.content}<|end|>")
            last_name = None
    if add_generation_prompt:
        out.append("<|start|>assistant")
    return out


def _split_instructions(messages: Sequence[Message]) -> tuple[str | None, list[Message]]:
    leading = 0
    while leading < len(messages) and messages[leading].role in ("system", "developer"):
        leading += 1
    if not leading:
        return None, list(messages)
    return "\n\n".join(m.content for m in messages[:leading]), list(messages[leading:])


def _final_after(messages: Sequence[Message], i: int) -> bool:
    return any(m.role == "assistant" and not m.tool_calls for m in messages[i + 1 :])


_HARMONY = _HarmonySpec("<|constrain|>json", lambda text: text, "<|call|>", False)


def render_harmony(
    history: History | Iterable[Mapping[str, Any]],
    tools: Iterable[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    *,
    continue_final_message: bool = False,
    replay: ReplayMemory | None = None,
    model_identity: str = "You are ChatGPT, a large language model trained by OpenAI.",
    knowledge_cutoff: str = "2024-06",
    conversation_start_date: str | None = None,
    reasoning_effort: str = "medium",
) -> str:
    """gpt-oss prompt as ``openai-harmony`` renders it (``render_conversation_for_completion``).

    Leading system/developer messages become the developer ``# Instructions``; each call is its
    own ``<|call|>``-terminated message with ``<|constrain|>json`` and unencoded arguments; results
    are raw text. Analysis is kept only for turns in the live tool loop (no final answer after
    them). ``conversation_start_date`` defaults to today.
    """
    _check_modes(add_generation_prompt, continue_final_message)
    messages = list(normalize_history(history).messages)
    if continue_final_message:
        _check_continuable(messages)
    tool_list = normalize_tools(tools)
    instructions, rest = _split_instructions(messages)
    current_date = conversation_start_date or date.today().isoformat()
    out = [
        _harmony_system(
            model_identity, knowledge_cutoff, current_date, reasoning_effort, bool(tool_list)
        )
    ]
    sections = ["# Instructions", instructions] if instructions is not None else []
    if tool_list:
        sections.append(_harmony_tools_section(tool_list))
    if sections:
        out.append("<|start|>developer<|message|>" + "\n\n".join(sections) + "<|end|>")
    out += _harmony_messages(
        rest,
        _HARMONY,
        live=lambda i: not _final_after(rest, i),
        add_generation_prompt=add_generation_prompt,
        continue_final_message=continue_final_message,
        replay=replay,
    )
    return "".join(out)


# ---------------------------------------------------------------------------------------------
# LLM-jp-4.1 Harmony: the gpt-oss HF template's TypeScript rendering, every call kept
# ---------------------------------------------------------------------------------------------

_NESTED = "\n                "  # the LLM-jp template's own whitespace before a nested type


def _llmjp_type(spec: Any) -> str:
    """``render_typescript_type`` of the LLM-jp template, quirks included."""
    if not isinstance(spec, Mapping):
        return "any"
    kind = spec.get("type")
    if kind == "array":
        items = spec.get("items")
        if items:
            item_kind = items.get("type") if isinstance(items, Mapping) else None
            if item_kind in ("string", "boolean"):
                text = f"{item_kind}[]"
            elif item_kind in ("number", "integer"):
                text = "number[]"
            else:
                inner = _llmjp_type(items)
                text = "any[]" if inner == "object | object" or len(inner) > 50 else inner + "[]"
        else:
            text = "any[]"
        return text + (" | null" if spec.get("nullable") else "")
    if isinstance(kind, (list, tuple)) and kind:
        return " | ".join(map(str, kind)) if len(kind) > 1 else str(kind[0])
    if spec.get("oneOf"):
        out = []
        variants = spec["oneOf"]
        for n, variant in enumerate(variants):
            out.append(_llmjp_type(variant))
            if isinstance(variant, Mapping):
                if variant.get("description"):
                    out.append("// " + variant["description"])
                if "default" in variant:
                    out.append("                    // default: " + _dumps(variant["default"]))
            if n < len(variants) - 1:
                out.append(" | \n")
        return "".join(out)
    if kind == "string":
        if spec.get("enum"):
            return '"' + '" | "'.join(map(str, spec["enum"])) + '"'
        return "string" + (" | null" if spec.get("nullable") else "")
    if kind in ("number", "integer"):
        return "number"
    if kind == "boolean":
        return "boolean"
    if kind == "object":
        properties = spec.get("properties")
        if not properties:
            return "object"
        required = spec.get("required") or []
        fields = [
            f"{name}{'' if name in required else '?'}: {_NESTED}{_llmjp_type(value)}"
            for name, value in properties.items()
        ]
        return "{\n" + ", ".join(fields) + "}"
    return "any"


def _llmjp_tools_section(tools: Sequence[Mapping[str, Any]]) -> str:
    out = ["# Tools\n\n## functions\n\nnamespace functions {\n\n"]
    for tool in tools:
        function = tool["function"]
        out.append(f"// {function.get('description') or ''}\ntype {function['name']} = ")
        parameters = function.get("parameters")
        properties = parameters.get("properties") if parameters else None
        if not properties:
            out.append("() => any;\n\n")
            continue
        required = parameters.get("required") or []
        out.append("(_: {\n")
        for name, spec in properties.items():
            if spec.get("description"):
                out.append(f"// {spec['description']}\n")
            out.append(f"{name}{'' if name in required else '?'}: {_llmjp_type(spec)}")
            if "default" in spec:
                separator = "" if spec.get("oneOf") and not spec.get("enum") else ", "
                out.append(f"{separator}// default: {_dumps(spec['default'])}")
            out.append(",\n")
        out.append("}) => any;\n\n")
    out.append("} // namespace functions")
    return "".join(out)


_LLMJP = _HarmonySpec("<|constrain|> json", _dumps, "<|end|>", True)


def render_llmjp_harmony(
    history: History | Iterable[Mapping[str, Any]],
    tools: Iterable[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    *,
    continue_final_message: bool = False,
    replay: ReplayMemory | None = None,
    model_identity: str = "You are LLM-jp-4, a large language model trained by LLM-jp.",
    knowledge_cutoff: str = "2025-12",
    conversation_start_date: str | None = None,
    reasoning_effort: str = "medium",
    keep_tool_loop_reasoning: bool = True,
) -> str:
    """LLM-jp-4.1 prompt, byte-identical to its chat template for well-formed histories.

    Written in the unspaced form (the SentencePiece tokenizer adds the space after each special
    token itself). Parallel calls are consecutive messages, all but the last ending ``<|end|>``;
    results are JSON string literals. ``keep_tool_loop_reasoning=False`` follows the alpha_2.0
    template instead (no previous-turn reasoning at all).
    """
    _check_modes(add_generation_prompt, continue_final_message)
    messages = list(normalize_history(history).messages)
    if continue_final_message:
        _check_continuable(messages)
    tool_list = normalize_tools(tools)
    current_date = conversation_start_date or date.today().isoformat()
    out = [
        "<|start|>system<|message|>"
        f"{model_identity}\nKnowledge cutoff: {knowledge_cutoff}\nCurrent date: {current_date}\n\n"
        f"Reasoning: {reasoning_effort}\n\n"
        "# Valid channels: analysis, commentary, final. Channel must be included for every message."
        + (
            "\nCalls to these tools must go to the commentary channel: 'functions'."
            if tool_list
            else ""
        )
        + "<|end|>"
    ]
    developer = ""
    rest = messages
    if messages and messages[0].role in ("system", "developer"):
        developer, rest = messages[0].content, messages[1:]
    if developer or tool_list:
        out.append("<|start|>developer<|message|>")
        if developer:
            out.append(f"# Instructions\n\n{developer}\n\n")
        if tool_list:
            out.append(_llmjp_tools_section(tool_list))
        out.append("<|end|>")

    def live(i: int) -> bool:
        if not keep_tool_loop_reasoning:
            return False
        # the template ignores a final that is the very last message (it is the training target)
        return not any(m.role == "assistant" and not m.tool_calls for m in rest[i + 1 : -1])

    out += _harmony_messages(
        rest,
        _LLMJP,
        live=live,
        add_generation_prompt=add_generation_prompt,
        continue_final_message=continue_final_message,
        replay=replay,
    )
    return "".join(out)


_LLMJP_SPECIALS = (
    "<|start|>",
    "<|channel|>",
    "<|constrain|>",
    "<|message|>",
    "<|end|>",
    "<|call|>",
    "<|return|>",
)


def llmjp_prompt_form(decoded: str) -> str:
    """Decoded LLM-jp output to prompt text: drop the one tokenizer space after each special token.

    The SentencePiece tokenizer writes a ``▁`` after every special token, which decoders show as a
    space; fed back as text it would be encoded a second time. Apply this before remembering a
    decoded LLM-jp turn for replay.
    """
    out = []
    position = 0
    while position < len(decoded):
        special = next((s for s in _LLMJP_SPECIALS if decoded.startswith(s, position)), None)
        if special is None:
            out.append(decoded[position])
            position += 1
            continue
        out.append(special)
        position += len(special)
        if decoded.startswith(" ", position):
            position += 1
    return "".join(out)


# ---------------------------------------------------------------------------------------------
# DeepSeek DSML (V3.2 and V4)
# ---------------------------------------------------------------------------------------------

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
    return template.replace("{schemas}", "\n".join(_dumps(t["function"]) for t in tools))


def _dsml_calls(calls: Sequence[ToolCall], block: str) -> str:
    """The DSML block: string values raw, everything else JSON; raw text under ``arguments``."""
    invokes = []
    for call in calls:
        arguments = (
            call.arguments if isinstance(call.arguments, dict) else {"arguments": call.arguments}
        )
        params = "\n".join(
            f'<{_DSML}parameter name="{key}" string="{"true" if isinstance(value, str) else "false"}">'
            f"{_json_scalar(value)}</{_DSML}parameter>"
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
    _check_modes(add_generation_prompt, continue_final_message)
    messages, tool_list = _dsml_prepare(history, tools)
    if continue_final_message:
        _check_continuable(messages)
    last_user = _last_index(messages, ("user",))
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
            replayed = i > last_user and _replayed(replay, message, _dsml_replay)
            out.append(
                replayed
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
    _check_modes(add_generation_prompt, continue_final_message)
    messages, tool_list = _dsml_prepare(history, tools)
    if continue_final_message:
        _check_continuable(messages)
    turns = _v4_turns(messages)
    drop = drop_thinking and not tool_list
    last_user = _last_index([Message(t.role) for t in turns], ("user",))
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
            replayed = live and _replayed(replay, message, _dsml_replay)
            out.append(
                replayed
                or _dsml_assistant(
                    message, thinking_part=enable_thinking and live, block="tool_calls", end=end
                )
            )
    return "".join(out)


# ---------------------------------------------------------------------------------------------
# Dispatch and replay capture
# ---------------------------------------------------------------------------------------------

NATIVE_DIALECTS: dict[str, Callable[..., str]] = {
    "hermes": render_hermes,
    "hermes-xml": render_hermes_xml,
    "harmony": render_harmony,
    "llmjp-harmony": render_llmjp_harmony,
    "dsml": render_dsml_v32,
    "dsml-v3.2": render_dsml_v32,
    "dsml-v4": render_dsml_v4,
}

# Where an assistant turn starts in each dialect's prompt: replayed text is what follows it.
_TURN_HEADERS = {
    "hermes": _ASSISTANT_HEADER,
    "hermes-xml": _ASSISTANT_HEADER,
    "harmony": "<|start|>assistant",
    "llmjp-harmony": "<|start|>assistant",
}


def render_native(
    dialect: str,
    history: History | Iterable[Mapping[str, Any]],
    tools: Iterable[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    **options: Any,
) -> str:
    """Render ``history`` (a History, or messages of any of the three APIs) natively for ``dialect``.

    ``options`` are the request's template variables: those the renderer does not read (say
    ``reasoning_effort`` for Hermes) are ignored, as a chat template ignores them.
    """
    try:
        renderer = NATIVE_DIALECTS[dialect]
    except KeyError:
        raise ValueError(f"unknown dialect {dialect!r}; known: {sorted(NATIVE_DIALECTS)}") from None
    read = _keywords(renderer)
    return renderer(history, tools, add_generation_prompt,
                    **{name: value for name, value in options.items() if name in read})


@functools.cache
def _keywords(renderer: Callable[..., str]) -> frozenset[str]:
    """The keyword options a renderer takes."""
    return frozenset(name for name, parameter in inspect.signature(renderer).parameters.items()
                     if parameter.kind is inspect.Parameter.KEYWORD_ONLY)


def replay_text(dialect: str, prompt: str, generated: str) -> str:
    """The text to remember for a generated turn: prompt tail after the turn header + output.

    For Hermes and Harmony the generation prompt may already hold part of the turn (``<think>\\n``
    or an empty think block); DSML turns start after the prompt's ``<think>``/``</think>``, so only
    the generated text counts there. ``generated`` excludes the stop token.
    """
    if dialect not in NATIVE_DIALECTS:
        raise ValueError(f"unknown dialect {dialect!r}; known: {sorted(NATIVE_DIALECTS)}")
    header = _TURN_HEADERS.get(dialect)
    if header is None:
        return generated
    at = prompt.rfind(header)
    if at < 0:
        raise ValueError(f"the prompt has no {header!r} turn header")
    return prompt[at + len(header) :] + generated
