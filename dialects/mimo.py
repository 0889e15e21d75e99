"""The `mimo` dialect: Xiaomi MiMo-V2.6 `<tool_call><function=NAME>` calls with
`<parameter=KEY>VALUE</parameter>` arguments and no newlines between the tags (mimo.peg).

The compact form of Qwen3-Coder's format (hermes-xml writes a newline around each tag and
value). String values are raw text, any other value JSON; parsing reads Python literals too.
``reasoning``: the model writes `<think>...</think>` itself, detected from the output. (Older
MiMo models, MiMo-VL, write Hermes JSON calls: the hermes dialect.)

Prompts come from the model's template.
"""

from __future__ import annotations

import re

from pegmask.dialects.base import TurnDialect

# The compact form only: Qwen3-Coder's newline-framed calls are hermes-xml's.
_PROBE_CALL = re.compile(
    r"<tool_call><function=pegmask_probe><parameter=pegmask_arg>pegmask_value</parameter>")


class MimoDialect(TurnDialect):
    name = "mimo"
    priority = 260
    probe = (_PROBE_CALL,)
    peg_file = "mimo.peg"
    raw_until = "</parameter>"
