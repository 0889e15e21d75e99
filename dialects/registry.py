"""The dialect registry: names to dialect classes, and which dialect a chat template writes.

    get_dialect("hermes", reasoning=False) -> Dialect
    detect_dialect(chat_template) -> "hermes" | "mistral" | ... | "unknown"
    get_dialect(detect_dialect(t), chat_template=t)   # options the template implies applied

Detection renders a probe conversation with the template (one assistant call of a tool named
`pegmask_probe`, as transformers would render it) and asks each dialect class, in the order of
`_REGISTRY`, whether the rendering is its format (`Dialect.owns_template`); more specific
formats come first. A template no dialect claims is "unknown": a wrong guess would constrain
the model to a format it was never trained on, and parse its calls as content.
"""

from __future__ import annotations

import functools
import importlib
import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pegmask.dialects.base import Dialect

UNKNOWN = "unknown"

# name -> "module:Class", in detection priority order (imported on first use, so one broken
# dialect module never breaks the others' use by name).
_REGISTRY: dict[str, str] = {
    "llmjp-harmony": "pegmask.dialects.llmjp_harmony:LlmJpHarmonyDialect",
    "harmony": "pegmask.dialects.harmony:HarmonyDialect",
    "dsml": "pegmask.dialects.dsml:DsmlDialect",
    "kimi": "pegmask.dialects.kimi:KimiDialect",
    "kimi-k3": "pegmask.dialects.kimi_k3:KimiK3Dialect",
    "gemma": "pegmask.dialects.gemma:GemmaDialect",
    "glm": "pegmask.dialects.glm:GlmDialect",
    "minimax": "pegmask.dialects.minimax:MiniMaxDialect",
    "minimax-m3": "pegmask.dialects.minimax_m3:MiniMaxM3Dialect",
    "cohere": "pegmask.dialects.cohere:CohereDialect",
    "command-r": "pegmask.dialects.command_r:CommandRDialect",
    "cohere-xml": "pegmask.dialects.cohere_xml:CohereXmlDialect",
    "nemotron": "pegmask.dialects.nemotron:NemotronDialect",
    "seed-oss": "pegmask.dialects.seed_oss:SeedOssDialect",
    "hunyuan": "pegmask.dialects.hunyuan:HunyuanDialect",
    "deepseek-v3.1": "pegmask.dialects.deepseek:DeepSeekV31Dialect",
    "deepseek-r1": "pegmask.dialects.deepseek:DeepSeekR1Dialect",
    "mistral": "pegmask.dialects.mistral:MistralDialect",
    "llama3": "pegmask.dialects.llama3:Llama3Dialect",
    "apriel": "pegmask.dialects.apriel:AprielDialect",
    "apertus": "pegmask.dialects.apertus:ApertusDialect",
    "functionary-v3.2": "pegmask.dialects.functionary:FunctionaryDialect",
    "functionary-v3.1": "pegmask.dialects.functionary_v31:FunctionaryV31Dialect",
    "phi4-mini": "pegmask.dialects.phi4_mini:Phi4MiniDialect",
    "granite": "pegmask.dialects.granite:GraniteDialect",
    "mimo": "pegmask.dialects.mimo:MimoDialect",
    "exaone": "pegmask.dialects.exaone:ExaoneDialect",
    "hermes-xml": "pegmask.dialects.hermes_xml:HermesXmlDialect",
    "hermes": "pegmask.dialects.hermes:HermesDialect",
}


def dialect_names() -> list[str]:
    """Every registered dialect, in detection priority order."""
    return list(_REGISTRY)


@functools.cache
def dialect_class(name: str) -> type[Dialect]:
    """The class of dialect `name`."""
    try:
        target = _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown dialect {name!r}; known: {sorted(_REGISTRY)}") from None
    module_name, class_name = target.split(":")
    return getattr(importlib.import_module(module_name), class_name)


def get_dialect(name: str, **options: Any) -> Dialect:
    """The dialect called `name`, configured by its options (e.g. ``version="v3.2"``). With a
    ``chat_template``, the options that template implies come first (explicit ones win)."""
    cls = dialect_class(name)
    template = options.get("chat_template")
    if template:
        options = {**cls.template_options(template), **options}
    return cls(**options)


def dialect_options(name: str, template: str | None) -> dict[str, Any]:
    """The options `template` implies for dialect `name` (empty without a template)."""
    return dialect_class(name).template_options(template) if template else {}


def detect_dialect(template: str | None) -> str:
    """The registered dialect whose calls `template` writes, or "unknown" (also for no
    template): never a guess."""
    if not template:
        return UNKNOWN
    renderings = probe_renderings(template)
    for name in _REGISTRY:
        if dialect_class(name).owns_template(template, renderings):
            return name
    return UNKNOWN


# ------------------------------------------------------------------------------ the probe
PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": "pegmask_probe",
        "description": "Probe.",
        "parameters": {
            "type": "object",
            "properties": {"pegmask_arg": {"type": "string", "description": "An argument."}},
            "required": ["pegmask_arg"],
        },
    },
}
PROBE_ARGUMENTS = {"pegmask_arg": "pegmask_value"}
PROBE_CALL_ID = "pgmprobe1"  # nine alphanumerics: Mistral's templates check the id's shape


def _probe_messages(arguments: Any) -> list[dict[str, Any]]:
    call = {"id": PROBE_CALL_ID, "type": "function",
            "function": {"name": "pegmask_probe", "arguments": arguments}}
    return [
        {"role": "system", "content": "System."},
        {"role": "user", "content": "Question?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": PROBE_CALL_ID, "name": "pegmask_probe",
         "content": "Result."},
    ]


@functools.lru_cache(maxsize=32)
def probe_renderings(template: str, flat_tools: bool = False) -> tuple[str, ...]:
    """The template's renderings of the probe conversation, with the call's arguments as an
    object and as JSON text (templates expect one or the other); those that fail are left out.
    `flat_tools`: the tool without OpenAI's `function` wrapper (what Apertus' template reads)."""
    from pegmask.dialects.templating import render_chat_template

    tool = PROBE_TOOL["function"] if flat_tools else PROBE_TOOL
    out = []
    for arguments in (PROBE_ARGUMENTS, json.dumps(PROBE_ARGUMENTS)):
        try:
            out.append(render_chat_template(template, _probe_messages(arguments),
                                            tools=[tool], add_generation_prompt=True,
                                            bos_token="", eos_token=""))
        except Exception:  # noqa: BLE001 - a template may fail in any way on one shape
            continue
    return tuple(out)


@functools.lru_cache(maxsize=32)
def tools_prompt(template: str) -> str:
    """What the template writes for the probe tool, one user message and the generation prompt,
    with no system message ("" if it cannot): where a template writes its own tool-use system
    prompt (Granite 3.3's instructions)."""
    from pegmask.dialects.templating import render_chat_template

    try:
        return render_chat_template(template, [{"role": "user", "content": "Question?"}],
                                    tools=[PROBE_TOOL], add_generation_prompt=True,
                                    bos_token="", eos_token="")
    except Exception:  # noqa: BLE001 - a template may fail in any way
        return ""


@functools.lru_cache(maxsize=32)
def generation_prompt(template: str) -> str:
    """What the template writes for one user message and the generation prompt ("" if it
    cannot): whether the model's turn starts inside reasoning, say."""
    from pegmask.dialects.templating import render_chat_template

    try:
        return render_chat_template(template, [{"role": "user", "content": "Question?"}],
                                    add_generation_prompt=True, bos_token="", eos_token="")
    except Exception:  # noqa: BLE001 - a template may fail in any way
        return ""
