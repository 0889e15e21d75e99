"""The `llama3` dialect: Llama 3.1 / 3.2 / 3.3 JSON calls, `{"name": ..., "parameters": {...}}`
written as the whole turn, optionally after `<|python_tag|>` (llama3.peg).

No reasoning. A turn is an answer or calls (``calls_alone``): under the strict grammar an answer
cannot start with `{`, so a call the model begins is always a valid one. Several calls (which
the official templates cannot write back, but models do) are separated by `;`. Parsing also
accepts `"arguments"` for `"parameters"` and either key order, as vLLM's llama3_json parser.

Prompts come from the model's template (Meta's templates render tools and results; they allow
one call per assistant message).
"""

from __future__ import annotations

import re

from pegmask.dialects.base import TurnDialect

# The probe call as Llama 3 templates write it: the JSON object alone in the assistant turn.
_PROBE_CALL = re.compile(
    r'<\|end_header_id\|>\n\n(<\|python_tag\|>)?\{"name": "pegmask_probe", "parameters": ')


class Llama3Dialect(TurnDialect):
    name = "llama3"
    priority = 190
    probe = (_PROBE_CALL,)
    peg_file = "llama3.peg"
    reasons = False
    calls_alone = True
    answer_rule = "answer"
