"""The `functionary-v3.1` dialect: MeetKai Functionary v3.1 (Llama 3.1) calls,
`<function=NAME>{arguments}</function>` after the turn's content (functionary_v31.peg).

No reasoning. Prompts come from the model's template, which renders tools and past calls.
Not spoken: the built-in `python` tool, which the model calls as `<|python_tag|>` and raw code
(not JSON arguments); such output is read as content.
"""

from __future__ import annotations

import re

from pegmask.dialects.base import TurnDialect

# The probe call as the template writes it.
_PROBE_CALL = re.compile(r'<function=pegmask_probe>\{"pegmask_arg"')


class FunctionaryV31Dialect(TurnDialect):
    name = "functionary-v3.1"
    priority = 230
    probe = (_PROBE_CALL,)
    peg_file = "functionary_v31.peg"
    reasons = False
