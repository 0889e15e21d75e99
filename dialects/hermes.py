"""The `hermes` dialect: Hermes 2 Pro / Qwen2.5 / Qwen3 `<tool_call>` blocks holding one JSON
object `{"name": ..., "arguments": {...}}`, with optional `<think>` reasoning (hermes.peg).

Options: ``reasoning`` (True: the output starts in reasoning, as when `<think>` ends the prompt;
False: none; None, the default: detected from the output) and ``arguments_first`` (constrain
calls to Hermes 2 Pro's `{"arguments": ..., "name": ...}` key order; parsing accepts both).
"""

from __future__ import annotations

from typing import Any

from pegmask.dialects.base import TurnDialect


class HermesDialect(TurnDialect):
    name = "hermes"
    peg_file = "hermes.peg"
    native_renderer = "hermes"
    implicit_reasoning_end = False  # a <tool_call> written while thinking stays reasoning

    def __init__(self, *, arguments_first: bool = False, **options: Any):
        super().__init__(**options)
        self.arguments_first = arguments_first

    def tool_section(self) -> str:
        return "per tool, arguments first" if self.arguments_first else "per tool"
