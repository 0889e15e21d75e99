"""The `kimi-k3` dialect: Kimi K3's block messages, `<|open|>NAME<|sep|>...<|close|>NAME<|sep|>`:
a think block, a response block (the content, possibly empty), an optional tools block of
`call` blocks with one `argument` block per argument, then `<|close|>message<|sep|>`
(kimi_k3.peg).

The prompt opens the first block: think when the template's ``thinking`` is on (its default:
``reasoning`` True), else response. String arguments are raw text (`type="string"`), any other
JSON; a call may also carry its arguments as one JSON block. Content and calls sit in separate
blocks, so a turn may hold both; under tool_choice required or a named tool the response block
is empty.

Prompts come from the model's template.
"""

from __future__ import annotations

import re
from typing import Any

from pegmask.dialects.base import TurnDialect
from pegmask.dialects.registry import generation_prompt
from pegmask.dialects.request import ChatRequest

#: what the generation prompt ends with: the think block opened, or the response block
THINK_BLOCK, RESPONSE_BLOCK = "<|open|>think<|sep|>", "<|open|>response<|sep|>"
_PROBE_CALL = re.compile(r'<\|open\|>call tool="pegmask_probe" index="1"<\|sep\|>')


class KimiK3Dialect(TurnDialect):
    name = "kimi-k3"
    priority = 50
    probe = (_PROBE_CALL,)
    peg_file = "kimi_k3.peg"
    reasoning_default = True

    def root_rule(self, request: ChatRequest, strict: bool) -> tuple[str, Any]:
        """Reasoning (when the prompt opened think), the response block, the tools block."""
        reasoning = self.reasoning_mode(request)
        schema = request.response_grammar if strict else None
        think = "ws (@reasoning:thought ws)? @end:think_close resp_open"
        if not strict:
            body = "ws (@content:text ws)? resp_close ws (region ws)? (msg_end eos?)?"
            opening = {True: think, False: "", None: f"({think})?"}[reasoning]
            return f"root = {opening} {body}\n", None
        calls = "calls_one" if request.max_calls == 1 else "calls_many"
        answer = "@content:json(response) ws" if schema is not None else "(@content:text ws)?"
        if request.min_calls:
            body = f"ws resp_close {calls}"
        elif request.max_calls == 0:
            body = f"ws {answer} resp_close"
        elif schema is not None:  # the JSON answer is due, unless calls come instead
            body = f"ws ({answer} resp_close | resp_close {calls})"
        else:
            body = f"ws {answer} resp_close ({calls})?"
        opening = think if reasoning else ""
        return f"root = {opening} {body} msg_end eos?\n", schema

    def prompt_reasoning(self, prompt: str, request: ChatRequest) -> bool | None:
        """The prompt opens the think block (reasoning) or the response block (none)."""
        if prompt.endswith(THINK_BLOCK):
            return True
        return False if prompt.endswith(RESPONSE_BLOCK) else self.unsaid_reasoning(request)

    @classmethod
    def template_options(cls, template: str) -> dict[str, Any]:
        """The generation prompt opens think (reasoning) or response."""
        return {"reasoning": generation_prompt(template).endswith(THINK_BLOCK)}
