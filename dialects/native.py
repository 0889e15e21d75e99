"""Native prompt renderers: the structured history written in each family's own protocol.

Model templates lose tool history in ways the dialects do not (gpt-oss's template keeps only the
first call of a turn and JSON-encodes string arguments a second time; templates differ on where
results go). Each family's module holds its renderer (`Dialect.renderer`, and
`Dialect.version_renderers` for a family's versions), written the way the family was trained
to read it; this module dispatches to them by name: the family's (``hermes``, ``harmony``,
``deepseek-r1``, ...) or the family's and a version (``dsml-v4``). Import a renderer itself from
its family's module.

Assistant turns still in the live tool loop are replayed byte for byte from a
:class:`~pegmask.dialects.replay.ReplayMemory` when all their calls are found there.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Iterable, Mapping
from typing import Any

from pegmask.dialects.base import Renderer
from pegmask.dialects.history import History
from pegmask.dialects.registry import dialect_classes


@functools.cache
def native_renderers() -> dict[str, tuple[Renderer, str | None]]:
    """Every registered family's native renderers by name, each with where a turn starts in its
    prompts (`Dialect.turn_header`)."""
    out: dict[str, tuple[Renderer, str | None]] = {}
    for cls in dialect_classes():
        if cls.renderer is not None:
            out[cls.name] = (cls.renderer, cls.turn_header)
        for version, renderer in cls.version_renderers.items():
            out[f"{cls.name}-{version}"] = (renderer, cls.turn_header)
    return out


def _native(dialect: str) -> tuple[Renderer, str | None]:
    try:
        return native_renderers()[dialect]
    except KeyError:
        raise ValueError(
            f"unknown dialect {dialect!r}; known: {sorted(native_renderers())}") from None


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
    renderer, _ = _native(dialect)
    read = _keywords(renderer)
    return renderer(history, tools, add_generation_prompt,
                    **{name: value for name, value in options.items() if name in read})


@functools.cache
def _keywords(renderer: Renderer) -> frozenset[str]:
    """The keyword options a renderer takes."""
    return frozenset(name for name, parameter in inspect.signature(renderer).parameters.items()
                     if parameter.kind is inspect.Parameter.KEYWORD_ONLY)


def replay_text(dialect: str, prompt: str, generated: str) -> str:
    """The text to remember for a generated turn: prompt tail after the turn header + output.

    For Hermes and Harmony the generation prompt may already hold part of the turn (``<think>\\n``
    or an empty think block); DSML turns start after the prompt's ``<think>``/``</think>``, so only
    the generated text counts there. ``generated`` excludes the stop token.
    """
    _, header = _native(dialect)
    if header is None:
        return generated
    at = prompt.rfind(header)
    if at < 0:
        raise ValueError(f"the prompt has no {header!r} turn header")
    return prompt[at + len(header) :] + generated
