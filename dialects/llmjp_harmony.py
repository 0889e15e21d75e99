"""The `llmjp-harmony` dialect: LLM-jp-4.1's Harmony (reference/dialects.md section 2).

It is the gpt-oss grammar with LLM-jp's spacing (llmjp_harmony.peg): any number of spaces after
each special token, exactly one space dropped after `<|message|>`, and the unspaced gpt-oss form
still accepted. Parallel calls are consecutive assistant messages, all but the last closed by
`<|end|>`, which the shared grammar already allows.

A chat template selects this dialect by declaring ``chat_format=llm-jp-harmony-v1`` in a Jinja
comment on its first line (`detect_dialect_from_template`).

Native renderer ``llmjp-harmony``: the LLM-jp-4.1 template (every parallel call, string arguments
verbatim).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import date
from typing import Any

from pegmask.dialects.harmony import HarmonyDialect, HarmonySpec, harmony_messages
from pegmask.dialects.history import History, normalize_history, normalize_tools
from pegmask.dialects.rendering import check_continuable, check_modes, dumps
from pegmask.dialects.replay import ReplayMemory

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
                    out.append("                    // default: " + dumps(variant["default"]))
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
                out.append(f"{separator}// default: {dumps(spec['default'])}")
            out.append(",\n")
        out.append("}) => any;\n\n")
    out.append("} // namespace functions")
    return "".join(out)


_LLMJP = HarmonySpec("<|constrain|> json", dumps, "<|end|>", True)


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
    check_modes(add_generation_prompt, continue_final_message)
    messages = list(normalize_history(history).messages)
    if continue_final_message:
        check_continuable(messages)
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

    out += harmony_messages(
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


class LlmJpHarmonyDialect(HarmonyDialect):
    name = "llmjp-harmony"
    priority = 10
    renderer = render_llmjp_harmony
    spacing_file = "llmjp_harmony.peg"

    @classmethod
    def owns_template(cls, template: str, renderings: Sequence[str]) -> bool:
        """The template declares ``chat_format=llm-jp-harmony-v1`` on its first line."""
        return detect_dialect_from_template(template) == cls.name


# `chat_format=` values a template can declare on its first line -> dialect name
CHAT_FORMATS = {"llm-jp-harmony-v1": LlmJpHarmonyDialect.name}
_DECLARATION = re.compile(r"\{#-?\s*chat_format\s*=\s*([\w.\-]+)\s*-?#\}")


def detect_dialect_from_template(template_text: str) -> str | None:
    """The dialect a chat template declares (``{#- chat_format=NAME -#}`` on its first line),
    or None when it declares none that pegmask knows."""
    first_line = template_text.lstrip("\ufeff").split("\n", 1)[0]
    match = _DECLARATION.search(first_line)
    return CHAT_FORMATS.get(match.group(1)) if match else None
