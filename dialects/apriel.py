"""The `apriel` dialect: ServiceNow Apriel 1.5 calls, a JSON list of `{"name", "arguments"}`
objects between `<tool_calls>` and `</tool_calls>` after the turn's content (apriel.peg).

``reasoning``: the model may open `<thinking>...</thinking>` (llama.cpp's reading of Apriel
1.5), so it is detected from the output by default. Prompts come from the model's template,
which renders tools and past calls (with arguments as JSON text).
"""

from __future__ import annotations

import re

from pegmask.dialects.base import TurnDialect

# The probe call as Apriel's template writes it (its arguments as the JSON text given).
_PROBE_CALL = re.compile(r'<tool_calls>\[\{"name": "pegmask_probe", "arguments": \{')


class AprielDialect(TurnDialect):
    name = "apriel"
    priority = 200
    probe = (_PROBE_CALL,)
    peg_file = "apriel.peg"
    peg_includes = ("json_calls.peg",)
