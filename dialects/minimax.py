"""The `minimax` dialect: MiniMax M2 / M2.5 `<minimax:tool_call>` blocks of `<invoke name=...>`
calls with one `<parameter name=...>` per argument (minimax.peg).

String values are raw text (a constrained string's schema applies to that text), any other
type JSON; parsing also reads Python literals. ``reasoning`` defaults to True when the
template's generation prompt ends with `<think>` (M2's does): the output starts in reasoning.

Prompts come from the model's template.
"""

from __future__ import annotations

import re
from typing import Any

from pegmask.dialects.base import TurnDialect
from pegmask.dialects.registry import generation_prompt

_PROBE_CALL = re.compile(r'<minimax:tool_call>\s*<invoke name="pegmask_probe">')


class MiniMaxDialect(TurnDialect):
    name = "minimax"
    priority = 80
    probe = (_PROBE_CALL,)
    peg_file = "minimax.peg"
    raw_until = "</parameter>"

    @classmethod
    def template_options(cls, template: str) -> dict[str, Any]:
        """A generation prompt ending with `<think>` opens reasoning."""
        return {"reasoning": generation_prompt(template).rstrip().endswith("<think>")}
