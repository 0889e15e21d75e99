"""The `hermes-xml` dialect: Qwen3-Coder / Qwen3.5 `<tool_call>` blocks with one
`<function=NAME>` and a `<parameter=KEY>` block per argument (hermes_xml.peg).

String parameters are written raw, their schema (lengths, pattern, format, enum) applied to the
raw text; every other type is JSON, constrained by the parameter's schema. Option ``reasoning`` as
for `hermes` (Qwen3.5 puts `<think>` in the prompt: pass ``reasoning=True``). Without a chat
template, prompts are rendered as the Qwen3-Coder template writes them (native ``hermes-xml``).
"""

from __future__ import annotations

from pegmask.dialects.base import TurnDialect


class HermesXmlDialect(TurnDialect):
    name = "hermes-xml"
    peg_file = "hermes_xml.peg"
    native_renderer = "hermes-xml"

    raw_until = "\n</parameter>"
