"""The `cohere` dialect: Cohere Command R7B / Command A actions, a JSON list of
`{"tool_call_id", "tool_name", "parameters"}` objects between `<|START_ACTION|>` and
`<|END_ACTION|>`, after `<|START_THINKING|>` reasoning (cohere.peg).

``reasoning`` defaults to True when the template's generation prompt ends with
`<|START_THINKING|>` (the output starts in reasoning), to None (read from the output) when the
prompt opens none but the template's turns write a thinking block. The list may be indented as the template
writes it (whitespace up to 32 characters a run under the strict grammar).

Prompts come from the model's template. (xgrammar's "cohere" key is another format, the
`<cofl:tool_calls>` XML of later Command models: the `cohere-xml` dialect.)
"""

from __future__ import annotations

import re
from typing import Any

from pegmask.dialects.base import TurnDialect
from pegmask.dialects.registry import generation_prompt

_PROBE_CALL = re.compile(
    r'<\|START_ACTION\|>\[\s*\{"tool_call_id": "[^"]*", "tool_name": "pegmask_probe"')


class CohereDialect(TurnDialect):
    name = "cohere"
    priority = 100
    probe = (_PROBE_CALL,)
    peg_file = "cohere.peg"
    peg_includes = ("tool_name_calls.peg",)

    def substitutions(self, strict: bool) -> dict[str, str]:
        return {"jws": "[ \\t\\r\\n]{0,32}" if strict else "ws"}

    @classmethod
    def template_options(cls, template: str) -> dict[str, Any]:
        """A generation prompt ending with `<|START_THINKING|>` opens reasoning; one that opens
        none, of a template whose turns write `<|START_THINKING|>` (Cohere's own R7B template,
        its `tool_plan` before every action), leaves the model to open it (None: read from the
        output); else there is none."""
        prompt = generation_prompt(template).rstrip()
        if prompt.endswith("<|START_THINKING|>"):
            return {"reasoning": True}
        if not prompt.endswith("<|END_THINKING|>") and "<|START_THINKING|>{{" in template:
            return {"reasoning": None}
        return {"reasoning": False}
