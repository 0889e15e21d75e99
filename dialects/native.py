"""Native prompt renderers: the structured history written in each family's own protocol.

Model templates lose tool history in ways the dialects do not (gpt-oss's template keeps only the
first call of a turn and JSON-encodes string arguments a second time; templates differ on where
results go). Each family's module holds its renderer (`Dialect.renderers`), written the way the
family was trained to read it; this module dispatches to them by name:

* ``hermes`` and ``hermes-xml`` (pegmask.dialects.hermes, hermes_xml);
* ``harmony`` and ``llmjp-harmony`` (pegmask.dialects.harmony, llmjp_harmony);
* ``dsml`` / ``dsml-v3.2`` and ``dsml-v4`` (pegmask.dialects.dsml);
* and the renderers of the other registered families.

Assistant turns still in the live tool loop are replayed byte for byte from a
:class:`~pegmask.dialects.replay.ReplayMemory` when all their calls are found there.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pegmask.dialects.dsml import render_dsml_v4, render_dsml_v32
from pegmask.dialects.harmony import render_harmony
from pegmask.dialects.hermes import render_hermes
from pegmask.dialects.hermes_xml import render_hermes_xml
from pegmask.dialects.history import History
from pegmask.dialects.llmjp_harmony import llmjp_prompt_form, render_llmjp_harmony
from pegmask.dialects.registry import dialect_class, dialect_names

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


def _collect() -> tuple[dict[str, Callable[..., str]], dict[str, str | None]]:
    """Every registered family's renderers, and where a turn starts in each one's prompt."""
    renderers: dict[str, Callable[..., str]] = {}
    headers: dict[str, str | None] = {}
    for name in dialect_names():
        cls = dialect_class(name)
        for key, renderer in cls.renderers.items():
            renderers[key] = renderer
            headers[key] = cls.turn_header
    return renderers, headers


NATIVE_DIALECTS, _TURN_HEADERS = _collect()


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
