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
import re
from collections.abc import Collection, Mapping
from importlib import import_module
from pathlib import Path
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


def detect_dialect(template: str | None, template_tokens: Mapping[str, str] | None = None,
                   special_tokens: Collection[str] = ()) -> str:
    """The registered dialect whose calls `template` writes, else "derived" where the template's
    own renderings (with the tokenizer's `template_tokens`, see `dialect_options`) give its
    format, else the family whose call token the vocabulary holds (`special_tokens`, see
    `vocabulary_dialect`), else "unknown" (also for no template): never a guess."""
    return detection(template, template_tokens, special_tokens)[0]


def detection(template: str | None, template_tokens: Mapping[str, str] | None = None,
              special_tokens: Collection[str] = ()) -> tuple[str, str]:
    """`detect_dialect`'s answer and what decided it (what `pegmask dialect` prints)."""
    if not template:
        return UNKNOWN, "no chat template"
    renderings = probe_renderings(template)
    for name, cls in _families().items():
        if cls.owns_template(template, renderings):
            return name, "the template's rendering of a probe call (or its source's marker)"
    if derives(template, **(template_tokens or {})):
        return DERIVED, "derived from the template's own renderings"
    found = vocabulary_dialect(template, special_tokens)
    if found is not None:
        return found[0], (f"the vocabulary's special token {found[1]}: the template uses tools "
                          f"but writes no call")
    return UNKNOWN, "no family claims the template, none derives, and the vocabulary says none"


# The special tokens that open a family's calls, most specific first: what a model was trained
# to emit, where its template writes no call (Kimi K2 releases that only declare tools; DeepSeek
# R1's distills drop past calls but write tool results).
VOCABULARY_MARKERS = (
    ("<|tool_calls_section_begin|>", "kimi"),
    ("<\uff5ctool\u2581calls\u2581begin\uff5c>", "deepseek-r1"),
    ("<tool_call>", "hermes"),
)


def vocabulary_dialect(template: str, special_tokens: Collection[str]) -> tuple[str, str] | None:
    """(family, the token that decided) for a template that uses tools (renders their
    declaration, or a tool's result) but writes no call: the first of `VOCABULARY_MARKERS`
    among the vocabulary's `special_tokens`; None where the template uses no tools."""
    if not special_tokens:
        return None
    uses_tools = PROBE_TOOL["function"]["name"] in tools_prompt(template) or any(
        _TOOL_RESULT.search(text) for text in probe_renderings(template))
    if not uses_tools:
        return None
    tokens = set(special_tokens)
    return next(((name, token) for token, name in VOCABULARY_MARKERS if token in tokens), None)


def tokenizer_special_tokens(path: str | Path) -> list[str]:
    """The special (added) tokens of a tokenizer: a `tokenizer.json`, a `tokenizer_config.json`
    (its `added_tokens_decoder` and `additional_special_tokens`), or a folder holding either."""
    path = Path(path)
    if path.is_dir():
        found = [path / name for name in ("tokenizer_config.json", "tokenizer.json")
                 if (path / name).is_file()]
        if not found:
            raise ValueError(f"{path} holds no tokenizer.json or tokenizer_config.json")
        path = found[0]
    data = json.loads(path.read_text(encoding="utf-8"))
    tokens = [item["content"] for item in data.get("added_tokens", [])]
    tokens += [item["content"] for item in data.get("added_tokens_decoder", {}).values()]
    tokens += [t if isinstance(t, str) else t["content"]
               for t in data.get("additional_special_tokens", [])]
    return list(dict.fromkeys(tokens))


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


_PROBE_RESULT = "Result."
# The probe's tool result as a template that uses tools writes it: after a tool token.
_TOOL_RESULT = re.compile(r"<[^<>\s]*tool[^<>\s]*>\s*" + re.escape(_PROBE_RESULT))


def _probe_messages(arguments: Any) -> list[dict[str, Any]]:
    call = {"id": PROBE_CALL_ID, "type": "function",
            "function": {"name": "pegmask_probe", "arguments": arguments}}
    return [
        {"role": "system", "content": "System."},
        {"role": "user", "content": "Question?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": PROBE_CALL_ID, "name": "pegmask_probe",
         "content": _PROBE_RESULT},
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
