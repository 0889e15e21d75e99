"""The `hunyuan` dialect: Tencent Hunyuan (Hy3) `<tool_calls:opensource>` blocks of
`<tool_call:opensource>NAME<tool_sep:opensource>` calls with `<arg_key:opensource>` /
`<arg_value:opensource>` pairs (hunyuan.peg).

String values are raw text, any other value JSON (schema-typed, Python literals read when
parsing). Reasoning follows the template's switch, ``reasoning_effort``: "low" or "high" open
`<think:opensource>` in the prompt (the output starts in reasoning), "no_think" (the template's
default) closes it; without it, the ``reasoning`` option decides (off by default).

Prompts come from the model's template.
"""

from __future__ import annotations

import re

from pegmask.dialects.base import TurnDialect
from pegmask.dialects.request import ChatRequest

_PROBE_CALL = re.compile(r"<tool_call:opensource>pegmask_probe<tool_sep:opensource>")


class HunyuanDialect(TurnDialect):
    name = "hunyuan"
    priority = 150
    probe = (_PROBE_CALL,)
    peg_file = "hunyuan.peg"
    raw_until = "</arg_value:opensource>"

    def reasoning_mode(self, request: ChatRequest | None) -> bool | None:
        """The request's `reasoning_effort` (low / high: on), else a literal
        `enable_thinking: false`, else the option (off by default, as the template)."""
        kwargs = request.chat_template_kwargs if request is not None else {}
        effort = kwargs.get("reasoning_effort")
        if effort is not None:
            return effort in ("low", "high")
        if kwargs.get("enable_thinking") is False:
            return False
        return bool(self.reasoning)
