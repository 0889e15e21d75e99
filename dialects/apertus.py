"""The `apertus` dialect: Swiss AI Apertus calls, a JSON list of `{"NAME": {arguments}}`
objects between `<|tools_prefix|>` and `<|tools_suffix|>` (apertus.peg).

``reasoning``: the model deliberates between `<|inner_prefix|>` and `<|inner_suffix|>` when the
request enables thinking (the template's "Deliberation: enabled"); by default it is detected
from the output. Prompts come from the model's template, which reads each tool's `name`,
`description` and `parameters` at the top level: the dialect hands it the tools without
OpenAI's `function` wrapper (`template_inputs`), which transformers would pass as is (the
template then fails).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from pegmask.dialects.base import TurnDialect
from pegmask.dialects.registry import probe_renderings

# The probe call as Apertus' template writes it: the name is the object's key.
_PROBE_CALL = re.compile(r'<\|tools_prefix\|>\[\{"pegmask_probe": \{')


class ApertusDialect(TurnDialect):
    name = "apertus"
    priority = 210
    probe = (_PROBE_CALL,)
    peg_file = "apertus.peg"
    peg_includes = ("json_calls.peg",)

    def template_inputs(self, messages: Any, tools: list[dict[str, Any]] | None
                        ) -> tuple[Any, list[dict[str, Any]] | None]:
        return messages, tools and [tool.get("function", tool) for tool in tools]

    @classmethod
    def owns_template(cls, template: str, renderings: Sequence[str]) -> bool:
        """The probe rendered with the tool without its `function` wrapper (how the template
        reads tools)."""
        return super().owns_template(template, probe_renderings(template, True))
