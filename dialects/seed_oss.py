"""The `seed-oss` dialect: ByteDance Seed-OSS `<seed:tool_call>` blocks with one
`<function=NAME>` and a `<parameter=KEY>VALUE</parameter>` per argument (seed_oss.peg).

Close to Qwen3-Coder's format (hermes-xml), but with Seed's own tags and no newline around a
value. String values are raw text; any other value is JSON under the strict grammar, and read
as JSON or a Python literal (the template writes `str(value)`: `True`, `{'a': 1}`) when parsing.
``reasoning``: the model writes `<seed:think>...</seed:think>`, detected from the output.

Prompts come from the model's template.
"""

from __future__ import annotations

import re

from pegmask.dialects.base import TurnDialect

_PROBE_CALL = re.compile(r"<seed:tool_call>\s*<function=pegmask_probe>")


class SeedOssDialect(TurnDialect):
    name = "seed-oss"
    priority = 140
    probe = (_PROBE_CALL,)
    peg_file = "seed_oss.peg"
    raw_until = "</parameter>"
