"""The dialect registry: the family classes of `pegmask.dialects`, found by themselves, and
which dialect a chat template writes.

    get_dialect("hermes", reasoning=False) -> Dialect
    detect_dialect(chat_template) -> "hermes" | "mistral" | ... | "derived" | "unknown"
    get_dialect(detect_dialect(t), chat_template=t)   # options the template implies applied

A family is a `Dialect` subclass that declares its `name` and `priority`, defined in a module of
this package: adding one edits no shared file. Detection renders a probe conversation with the
template (one assistant call of a tool named `pegmask_probe`, as transformers would render it)
and asks each family, in ascending `priority`, whether the rendering is its format
(`Dialect.owns_template`); more specific formats come first. A template no family claims is
"derived" where its turn structure can be derived from its own renderings
(`pegmask.dialects.derive`; `get_dialect("derived", chat_template=t)` builds that dialect), else
"unknown": a wrong guess would constrain the model to a format it was never trained on, and
parse its calls as content.
"""

from __future__ import annotations

import functools
import json
import logging
import pkgutil
from collections.abc import Mapping
from importlib import import_module
from typing import Any

from pegmask.dialects.base import Dialect
from pegmask.dialects.derive import DERIVED, derive_dialect, derives

logger = logging.getLogger(__name__)

UNKNOWN = "unknown"


def discover(package: str) -> dict[str, type[Dialect]]:
    """The families defined in the modules of `package` (by name, in detection order). A module
    that fails to import is logged and its families left out, so one broken family never breaks
    the others."""
    families: dict[str, type[Dialect]] = {}
    for module_info in pkgutil.iter_modules(import_module(package).__path__):
        module_name = f"{package}.{module_info.name}"
        try:
            module = import_module(module_name)
        except Exception:  # noqa: BLE001 - whatever breaks a family module, the rest still work
            logger.exception("dialect module %s failed to import: its families are left out",
                             module_name)
            continue
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, Dialect) \
                    and value.__module__ == module_name and vars(value).get("name"):
                if value.name in families:
                    logger.error("dialect %r of %s is already defined by %s: left out",
                                 value.name, module_name, families[value.name].__module__)
                    continue
                families[value.name] = value
    return dict(sorted(families.items(), key=lambda item: (item[1].priority, item[0])))


@functools.cache
def _families() -> dict[str, type[Dialect]]:
    return discover(__package__)


def dialect_names() -> list[str]:
    """Every registered dialect, in detection priority order."""
    return list(_families())


def dialect_classes() -> list[type[Dialect]]:
    """Every registered dialect's class, in detection priority order."""
    return list(_families().values())


def dialect_class(name: str) -> type[Dialect]:
    """The class of dialect `name`."""
    try:
        return _families()[name]
    except KeyError:
        raise ValueError(f"unknown dialect {name!r}; known: {sorted(_families())}") from None


def get_dialect(name: str, **options: Any) -> Dialect:
    """The dialect called `name`, configured by its options (e.g. ``version="v3.2"``). With a
    ``chat_template``, the options that template implies come first (explicit ones win).
    "derived": the dialect derived from ``chat_template`` (`derive_dialect`)."""
    if name == DERIVED:
        template = options.pop("chat_template", None)
        if not template:
            raise ValueError('dialect "derived" is derived from a chat template: pass '
                             "chat_template=")
        return derive_dialect(template, **options)
    cls = dialect_class(name)
    template = options.get("chat_template")
    if template:
        options = {**cls.template_options(template), **options}
    return cls(**options)


def dialect_options(name: str, template: str | None,
                    template_tokens: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The options `template` implies for dialect `name` (empty without a template). A derived
    dialect reads them off the template itself, rendered with the tokenizer's special tokens
    (`template_tokens`: `eos_token`, `bos_token`, ...; Mistral's templates end a turn with
    `eos_token`)."""
    if not template:
        return {}
    if name == DERIVED:
        return dict(template_tokens or {})
    return dialect_class(name).template_options(template)


def detect_dialect(template: str | None, template_tokens: Mapping[str, str] | None = None) -> str:
    """The registered dialect whose calls `template` writes, else "derived" where the template's
    own renderings (with the tokenizer's `template_tokens`, see `dialect_options`) give its
    format, else "unknown" (also for no template): never a guess."""
    if not template:
        return UNKNOWN
    renderings = probe_renderings(template)
    for name, cls in _families().items():
        if cls.owns_template(template, renderings):
            return name
    return DERIVED if derives(template, **(template_tokens or {})) else UNKNOWN


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
