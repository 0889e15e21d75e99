"""The `phi4-mini` dialect: Phi-4-mini's `functools[...]` calls, a JSON list of
`{"name", "arguments"}` objects after the text `functools` (phi4_mini.peg).

No reasoning. Text before the calls is content (vLLM's phi4_mini_json parser drops it; the
template writes a turn's content or its calls). vLLM's tool template (data/templates) renders tools, but
writes a past call turn as bare objects without `functools[...]`: the dialect writes past calls
into the turn's content as the model wrote them (`template_inputs`) before the template runs.
"""

from __future__ import annotations

from typing import Any

from pegmask.dialects.base import TurnDialect
from pegmask.dialects.rendering import calls_in_content, json_call_list

# What the template tells the model (its tools system prompt): calls as a functools list.
_INSTRUCTION = 'functools[{"name": [function name], "arguments": [function arguments as JSON]}'


class Phi4MiniDialect(TurnDialect):
    name = "phi4-mini"
    priority = 240
    probe = (_INSTRUCTION,)
    peg_file = "phi4_mini.peg"
    peg_includes = ("json_calls.peg",)
    reasons = False

    def template_inputs(self, messages: Any, tools: list[dict[str, Any]] | None
                        ) -> tuple[list[dict], list[dict[str, Any]] | None]:
        return calls_in_content(messages, lambda calls: "functools" + json_call_list(calls)), tools
