"""The `llmjp-harmony` dialect: LLM-jp-4.1's Harmony (reference/dialects.md section 2).

It is the gpt-oss grammar with LLM-jp's spacing (llmjp_harmony.peg): any number of spaces after
each special token, exactly one space dropped after `<|message|>`, and the unspaced gpt-oss form
still accepted. Parallel calls are consecutive assistant messages, all but the last closed by
`<|end|>`, which the shared grammar already allows.

A chat template selects this dialect by declaring ``chat_format=llm-jp-harmony-v1`` in a Jinja
comment on its first line (`detect_dialect_from_template`).
"""

from __future__ import annotations

import re

from pegmask.dialects.harmony import HarmonyDialect

# `chat_format=` values a template can declare on its first line -> dialect name
CHAT_FORMATS = {"llm-jp-harmony-v1": "llmjp-harmony"}
_DECLARATION = re.compile(r"\{#-?\s*chat_format\s*=\s*([\w.\-]+)\s*-?#\}")


class LlmJpHarmonyDialect(HarmonyDialect):
    name = "llmjp-harmony"
    native_renderer = "llmjp-harmony"
    spacing_file = "llmjp_harmony.peg"


def detect_dialect_from_template(template_text: str) -> str | None:
    """The dialect a chat template declares (``{#- chat_format=NAME -#}`` on its first line),
    or None when it declares none that pegmask knows."""
    first_line = template_text.lstrip("\ufeff").split("\n", 1)[0]
    match = _DECLARATION.search(first_line)
    return CHAT_FORMATS.get(match.group(1)) if match else None
