"""The `mistral` dialect: `[TOOL_CALLS]` calls of Mistral's models (mistral.peg).

Option ``version``: "v11" (the default; Mistral Small 3.1+, Magistral, Ministral 3, Devstral:
each call is `[TOOL_CALLS]NAME[ARGS]{...}`, with Small 3.2's optional `[CALL_ID]` and nine
alphanumerics before `[ARGS]`) or "v3" (Mistral Nemo and older: `[TOOL_CALLS]` then a JSON list
of `{"name", "arguments", "id"?}` objects). The strict grammar writes the version's form;
parsing reads both. ``reasoning``: Magistral-style `[THINK]...[/THINK]` written by the model
(detected from the output by default; a template without `[THINK]` makes it False). Content
before the calls is content, as vLLM reads it.

Prompts come from the model's template (Mistral's templates render tools and results).
"""

from __future__ import annotations

import re
from typing import Any

from pegmask.dialects.base import TurnDialect

_CALLS = {
    # version -> (one call, one or more calls) under the strict grammar
    "v11": ("call", "call (ws call)*"),
    "v3": ("json_one", "json_list"),
}
# The probe call as Mistral's templates write it, in either version's form.
_PROBE_CALL = re.compile(
    r'\[TOOL_CALLS\](pegmask_probe(\[CALL_ID\]pgmprobe1)?\[ARGS\]\{|\[\{"name": "pegmask_probe")')


class MistralDialect(TurnDialect):
    name = "mistral"
    priority = 180
    probe = (_PROBE_CALL,)
    peg_file = "mistral.peg"

    def __init__(self, *, version: str = "v11", **options: Any):
        if version not in _CALLS:
            raise ValueError(f"mistral version must be one of {sorted(_CALLS)}, not {version!r}")
        super().__init__(**options)
        self.version = version

    def tool_section(self) -> str:
        return "per tool" if self.version == "v11" else "per tool, v3"

    def substitutions(self, strict: bool) -> dict[str, str]:
        one, many = _CALLS[self.version]
        return {"calls_one": one, "calls_many": many,
                "tools_v3": "tool" if strict else "any_tool_v3"}

    @classmethod
    def template_options(cls, template: str) -> dict[str, Any]:
        """Nemo-style templates write `[TOOL_CALLS][` (v3); without `[THINK]`, no reasoning."""
        options: dict[str, Any] = {"version": "v3" if "[TOOL_CALLS][" in template else "v11"}
        if "[THINK]" not in template:
            options["reasoning"] = False
        return options
