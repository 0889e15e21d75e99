"""The `glm` dialect: GLM 4.5 / 4.6 / 4.7 / 5 `<tool_call>NAME` blocks with an
`<arg_key>` / `<arg_value>` pair per argument (glm.peg).

String values are raw text (a constrained string's schema applies to that text), any other
type is JSON, constrained by the parameter's schema; parsing also reads Python literals where a
model writes them. 4.5 and 4.6 write `\\n` between the tags, 4.7 nothing: both are read, and the
strict grammar allows either. ``reasoning``: GLM-4.7's prompt ends with `<think>` (the output
starts in reasoning), earlier versions' output writes `<think>` itself (detected); the template's
generation prompt decides.

Prompts come from the model's template.
"""

from __future__ import annotations

import re
from typing import Any

from pegmask.dialects.base import TurnDialect
from pegmask.dialects.registry import generation_prompt

_PROBE_CALL = re.compile(r"<tool_call>pegmask_probe\s*<arg_key>pegmask_arg</arg_key>")


class GlmDialect(TurnDialect):
    name = "glm"
    priority = 70
    probe = (_PROBE_CALL,)
    peg_file = "glm.peg"
    raw_until = "</arg_value>"

    @classmethod
    def template_options(cls, template: str) -> dict[str, Any]:
        """A generation prompt ending with `<think>` opens reasoning (GLM-4.7); a template
        without `<think>` never reasons; else reasoning is detected from the output."""
        if "<think>" not in template:
            return {"reasoning": False}
        return {"reasoning": True} if generation_prompt(template).rstrip().endswith("<think>") else {}
