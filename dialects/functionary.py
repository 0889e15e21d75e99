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

from pegmask.dialects.addressed import addressed_root
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
        """`all` and the content, then calls after `>>>`, or calls alone (`addressed_root`)."""
        return addressed_root(request, strict)
