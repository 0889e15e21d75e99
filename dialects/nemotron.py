"""The `nemotron` dialect: NVIDIA Llama-Nemotron calls, a JSON list of `{"name", "arguments"}`
objects between `<TOOLCALL>` and `</TOOLCALL>` (nemotron.peg).

``reasoning``: the model writes `<think>...</think>` (Super v1.5 reasons unless the system prompt
says `/no_think`), so it is detected from the output; a template without `<think>` makes it
False. Content before the list is content.

Prompts come from the model's template.
"""

from __future__ import annotations

import re
from typing import Any

from pegmask.dialects.base import TurnDialect

_PROBE_CALL = re.compile(r'<TOOLCALL>\[\s*\{"name": "pegmask_probe", "arguments": ')


class NemotronDialect(TurnDialect):
    name = "nemotron"
    priority = 130
    probe = (_PROBE_CALL,)
    peg_file = "nemotron.peg"

    @classmethod
    def template_options(cls, template: str) -> dict[str, Any]:
        """Without `<think>` in the template, no reasoning."""
        return {} if "<think>" in template else {"reasoning": False}
