"""The `functionary-v3.2` dialect: MeetKai Functionary v3.2's `>>>recipient\\nmessage` turns
(functionary.peg).

No reasoning. The prompt ends with `>>>`, so a turn starts with its first recipient: `all` and
the content (which calls may follow, each after `>>>`), or a tool's name and its JSON arguments.
Prompts come from the model's template, which renders tools and past calls. Functionary's
`python` tool takes raw code rather than JSON: it is read as any tool (JSON arguments only).
"""

from __future__ import annotations

import re
from typing import Any

from pegmask.dialects.base import TurnDialect
from pegmask.dialects.request import ChatRequest

# The probe call as the template writes it: recipient, newline, JSON arguments.
_PROBE_CALL = re.compile(r'<\|end_header_id\|>\n\n>>>pegmask_probe\n\{"pegmask_arg"')


class FunctionaryDialect(TurnDialect):
    name = "functionary-v3.2"
    priority = 220
    probe = (_PROBE_CALL,)
    peg_file = "functionary.peg"
    reasons = False

    def root_rule(self, request: ChatRequest, strict: bool) -> tuple[str, Any]:
        """`all` and the content, then calls after `>>>` (unless the request forbids them),
        or calls alone; leniently also any text as content."""
        schema = request.response_grammar if strict else None
        if strict:
            answer = "to_all @content:json(response)" if schema is not None else \
                "to_all (@content:text)?"
            calls = "calls_one" if request.max_calls == 1 else "calls_many"
            if request.min_calls:
                body = calls
            elif request.max_calls == 0:
                body = answer
            elif schema is not None:  # the JSON answer is due, unless calls come instead
                body = f"{answer} | {calls}"
            else:
                body = f"{answer} (sep {calls})? | {calls}"
        else:
            body = "to_all (@content:text)? (sep region)? | region | @content:text"
        optional = "" if strict and request.min_calls else "?"
        return f"root = ({body}){optional} ws eos?\n", schema
