"""The `harmony` dialect: gpt-oss messages (harmony.peg, reference/dialects.md section 1).

Mapping to OpenAI fields: the analysis channel is reasoning_content; final, and commentary
without a recipient (a preamble, as vLLM shows it), are content; a message to
``functions.NAME`` (commentary or analysis channel) is a tool call with JSON arguments; messages
to the built-in tools (browser, python, container) are parsed and dropped, as llama.cpp does.
The texts of several messages of one field are concatenated.

Per request the strict grammar changes: tool_choice none / auto / required / a named tool and
parallel_tool_calls pick the turn (an answer, calls, or either; one call, or several as
consecutive messages), the allowed tools' schemas constrain the arguments, response_format
constrains the final message's text (and then excludes preambles, which would be content too),
and reasoning off (``reasoning_effort: "none"``) forbids analysis messages. Content types are
`json` only, where parsing accepts any word (`code` for the built-in tools).

Native renderer ``harmony``: gpt-oss messages as the ``openai-harmony`` renderer writes them
(TypeScript-like tool declarations; `harmony_messages` is shared with LLM-jp's renderer).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date
from typing import Any, ClassVar

from pegmask.dialects.base import Dialect, alternatives, fill, load_peg, peg_literal, peg_sections
from pegmask.dialects.history import (
    History,
    HistoryError,
    Message,
    normalize_history,
    normalize_tools,
)
from pegmask.dialects.rendering import check_continuable, check_modes, replayed
from pegmask.dialects.replay import ReplayMemory
from pegmask.dialects.request import ChatRequest


def _rust_lines(text: str) -> list[str]:
    """``str::lines`` semantics (split on newlines, drop one trailing empty line)."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


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
class HarmonySpec:
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


def harmony_messages(
    messages: Sequence[Message],
    spec: HarmonySpec,
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
            remembered = live(i) and replayed(
                replay,
                message,
                lambda text: f"<|start|>assistant{text.removesuffix('<|call|>')}<|call|>",
            )
            if remembered:
                out.append(remembered)
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


_HARMONY = HarmonySpec("<|constrain|>json", lambda text: text, "<|call|>", False)


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
    check_modes(add_generation_prompt, continue_final_message)
    messages = list(normalize_history(history).messages)
    if continue_final_message:
        check_continuable(messages)
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
    out += harmony_messages(
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


# (a call may start, one is required, several may come) -> strict turn rule of harmony.peg
_TURNS = {
    (False, False, False): "turn_free",
    (True, False, False): "turn_auto",
    (True, True, False): "turn_required",
    (True, False, True): "turn_parallel_auto",
    (True, True, True): "turn_parallel_required",
}


class HarmonyDialect(Dialect):
    name = "harmony"
    priority = 20
    template_marker = "<|channel|>"  # Harmony's channel headers
    renderer = render_harmony
    turn_header = "<|start|>assistant"
    reasoning_default = True
    #: a `.peg` file that replaces harmony.peg's spacing section (None: keep gpt-oss spacing);
    #: its `$spaces` is the bound on a run of spaces, none when parsing leniently
    spacing_file: ClassVar[str | None] = None
    STRICT_SPACES: ClassVar[int] = 4

    def grammar_source(self, request: ChatRequest, strict: bool) -> tuple[str, dict[str, Any]]:
        sections = peg_sections(load_peg("harmony.peg"))
        spacing = (fill(load_peg(self.spacing_file), spaces=self.STRICT_SPACES if strict else "")
                   if self.spacing_file else sections["spacing"])
        tools = request.allowed_tools if strict else []
        schemas: dict[str, Any] = {f"s_{i}": request.arguments_grammar(n, request.tool_schemas[n])
                                   for i, n in enumerate(tools)}
        if tools:
            instances = [(str(i), peg_literal(name), f"json(s_{i})") for i, name in enumerate(tools)]
        else:  # lenient: any name, any JSON; strict without tools: defined but unreachable
            instances = [("any", "tool_name", "json()")]
        calls = "".join(fill(sections["per tool"], i=i, name=name, arguments=arguments)
                        for i, name, arguments in instances)
        values = {"root": "any_turn", "prelude": "thoughts", "thought": "analysis | preamble",
                  "final_body": "text", "content_type": "word",
                  "calls": alternatives([f"call_{i}" for i, _, _ in instances])}
        if strict:
            values["root"] = _TURNS[(bool(tools), request.min_calls > 0, request.max_calls is None)]
            values["content_type"] = '"json"'
            # a preamble is content: under a response_format only the final message may be
            thoughts = ["analysis"] if self.reasoning_mode(request) else []
            if request.response_schema is None:
                thoughts.append("preamble")
            else:
                schemas["response"] = request.response_grammar
                values["final_body"] = "json(response)"
            values["prelude"] = "thoughts" if thoughts else '""'
            values["thought"] = " | ".join(thoughts) if thoughts else "analysis"  # then unused
        return fill(sections[""], **values) + calls + spacing, schemas
