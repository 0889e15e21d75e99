"""The `granite` dialect: IBM Granite 3.x calls, `<|tool_call|>` then a JSON list of
`{"name", "arguments"}` objects (granite.peg).

No reasoning in tool use (Granite 3.3's template asks for `<think>`/`<response>` only in chats
without tools). Text before the calls is content (the template asks for calls alone, and vLLM's
granite parser reads calls only at the start of the output). Granite 3.3's template renders tools but writes an assistant turn's content alone (its past
calls are lost): the dialect writes past calls into the turn's content as the model wrote them
(`template_inputs`) before the template runs. (Granite 4.0 writes Hermes calls: `hermes`.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pegmask.dialects.base import TurnDialect
from pegmask.dialects.registry import tools_prompt
from pegmask.dialects.rendering import calls_in_content, json_call_list

# What the template tells the model (its system prompt when there are tools).
_INSTRUCTION = "respond only with <|tool_call|> followed by a JSON list of tools used"


class GraniteDialect(TurnDialect):
    name = "granite"
    priority = 250
    probe = (_INSTRUCTION, "<|start_of_role|>available_tools<|end_of_role|>")
    peg_file = "granite.peg"
    peg_includes = ("json_calls.peg",)
    reasons = False

    def template_inputs(self, messages: Any, tools: list[dict[str, Any]] | None
                        ) -> tuple[list[dict], list[dict[str, Any]] | None]:
        return calls_in_content(messages, lambda calls: "<|tool_call|>" + json_call_list(calls)), tools

    @classmethod
    def owns_template(cls, template: str, renderings: Sequence[str]) -> bool:
        """The probe is the tools prompt (without a system message of the user's): it asks for
        `<|tool_call|>` and a JSON list, with the tools in an `available_tools` turn."""
        return super().owns_template(template, [tools_prompt(template)])
