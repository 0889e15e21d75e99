"""The `apriel` dialect: ServiceNow Apriel 1.5 calls, a JSON list of `{"name", "arguments"}`
objects between `<tool_calls>` and `</tool_calls>` after the turn's content (apriel.peg).

``reasoning``: the model may open `<thinking>...</thinking>` (llama.cpp's reading of Apriel
1.5), so it is detected from the output by default. Prompts come from the model's template,
which renders tools and past calls (with arguments as JSON text).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from pegmask.dialects.base import TurnDialect

# The probe call as Apriel's template writes it (its arguments as the JSON text given).
_PROBE_CALL = re.compile(r'<tool_calls>\[\{"name": "pegmask_probe", "arguments": \{')


class AprielDialect(TurnDialect):
    name = "apriel"
    peg_file = "apriel.peg"
    peg_includes = ("json_calls.peg",)

    @classmethod
    def owns_template(cls, template: str, renderings: Sequence[str]) -> bool:
        """`<tool_calls>` and a list of `{"name", "arguments"}` objects."""
        return any(_PROBE_CALL.search(text) for text in renderings)
