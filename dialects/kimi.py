"""The `kimi` dialect: Kimi K2 calls in a `<|tool_calls_section_begin|>` section, each
`<|tool_call_begin|>functions.NAME:INDEX<|tool_call_argument_begin|>{...}<|tool_call_end|>`
(kimi.peg).

``reasoning``: K2 Thinking writes `<think>...</think>` itself, so it is detected from the output
by default; a template without `<think>` (K2 Instruct) makes it False. Content before the
section is content.

Prompts come from the model's template (K2 Thinking's renders tools, calls and results).
"""

from __future__ import annotations

from typing import Any

from pegmask.dialects.base import TurnDialect


class KimiDialect(TurnDialect):
    name = "kimi"
    priority = 40
    # Kimi's call section token: its own templates use a list's `append`, which transformers'
    # sandbox refuses, so the source decides
    template_marker = "<|tool_calls_section_begin|>"
    peg_file = "kimi.peg"

    @classmethod
    def template_options(cls, template: str) -> dict[str, Any]:
        """Without `<think>` in the template (K2 Instruct), no reasoning."""
        return {} if "<think>" in template else {"reasoning": False}
