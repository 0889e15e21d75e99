"""The `phi4-mini` dialect: Phi-4-mini's `functools[...]` calls, a JSON list of
`{"name", "arguments"}` objects after the text `functools`, and the same objects bare, comma
separated, as the whole turn (phi4_mini.peg).

No reasoning. Text before a `functools` list is content (vLLM's phi4_mini_json parser drops it;
the template writes a turn's content or its calls). vLLM's tool template (data/templates)
writes a past call turn in the bare form, which a model shown that history may copy: both
forms are read, and the strict grammar allows both. Past calls are still written into the
turn's content as the model is told to write them (`template_inputs`), before the template
runs.
"""

from __future__ import annotations

from typing import Any

from pegmask.dialects.base import TurnDialect
from pegmask.dialects.rendering import calls_in_content, json_call_list
from pegmask.dialects.request import ChatRequest

# What the template tells the model (its tools system prompt): calls as a functools list.
_INSTRUCTION = 'functools[{"name": [function name], "arguments": [function arguments as JSON]}'


class Phi4MiniDialect(TurnDialect):
    name = "phi4-mini"
    priority = 240
    probe = (_INSTRUCTION,)
    peg_file = "phi4_mini.peg"
    peg_includes = ("json_calls.peg",)
    reasons = False
    answer_rule = "answer"

    def root_rule(self, request: ChatRequest, strict: bool) -> tuple[str, Any]:
        """The TurnDialect root, its body led by the bare form: a turn that parses as bare
        calls is calls (under the strict grammar an answer cannot start with `{`, as Llama 3's)."""
        root, schema = super().root_rule(request, strict)
        if strict and request.max_calls == 0:
            return root, schema
        bare = "bare_one" if strict and request.max_calls == 1 else "bare_many"
        return root.replace("\nbody = ", f"\nbody = {bare} ws eos? | ", 1), schema

    def template_inputs(self, messages: Any, tools: list[dict[str, Any]] | None
                        ) -> tuple[list[dict], list[dict[str, Any]] | None]:
        return calls_in_content(messages, lambda calls: "functools" + json_call_list(calls)), tools
