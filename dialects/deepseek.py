"""The `deepseek-r1` and `deepseek-v3.1` dialects: DeepSeek V3 / R1 and V3.1 calls in a
`<｜tool▁calls▁begin｜>` block (deepseek.peg).

R1 (and V3-0324, R1-0528) writes `function<｜tool▁sep｜>NAME` and the arguments in a ```json
fence, calls separated by a newline; its prompt ends with `<think>\\n`, so the output starts in
reasoning (``reasoning`` defaults to True). V3.1 (and V3.2-Exp) writes `NAME<｜tool▁sep｜>` and
bare JSON arguments, calls back to back; its template opens `<think>` only in thinking mode, so
reasoning is detected from the output (`</think>`) unless the request or option says. Parsing
reads both versions' call bodies.

Prompts come from the model's template.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import ClassVar

from pegmask.dialects.base import TurnDialect


class DeepSeekR1Dialect(TurnDialect):
    name = "deepseek-r1"
    peg_file = "deepseek.peg"
    reasoning_default = True
    section: ClassVar[str] = "per tool, r1"
    call_sep: ClassVar[str] = '"\\n"'
    probe_call: ClassVar[re.Pattern[str]] = re.compile(
        r"<｜tool▁call▁begin｜>function<｜tool▁sep｜>pegmask_probe\n```json\n")

    def tool_section(self) -> str:
        return self.section

    def substitutions(self, strict: bool) -> dict[str, str]:
        return {"call_sep": self.call_sep}

    @classmethod
    def owns_template(cls, template: str, renderings: Sequence[str]) -> bool:
        """The version's call body after `<｜tool▁call▁begin｜>`."""
        return any(cls.probe_call.search(text) for text in renderings)


class DeepSeekV31Dialect(DeepSeekR1Dialect):
    name = "deepseek-v3.1"
    reasoning_default = None
    section = "per tool, v3.1"
    call_sep = '""'
    probe_call = re.compile(r"<｜tool▁call▁begin｜>pegmask_probe<｜tool▁sep｜>\{")
