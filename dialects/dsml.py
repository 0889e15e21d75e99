"""The `dsml` dialect: DeepSeek V3.2 (`function_calls`) and V4 (`tool_calls`) DSML blocks with
`string="true|false"` parameters (dsml.peg).

Options: ``version`` ("v4", the default, or "v3.2") picks the block name the grammar enforces
and the native prompt renderer; parsing accepts both. ``reasoning`` defaults to True (the
prompt ends with `<think>`); chat mode is ``reasoning=False`` or ``enable_thinking: false`` in
the request. Plain string parameters are raw (`string="true"`); constrained strings and every
other type are JSON (`string="false"`), checked by the parameter's schema.
"""

from __future__ import annotations

from typing import Any

from pegmask.dialects.base import TurnDialect, alternatives, peg_literal

_BLOCKS = {"v4": "tool_calls", "v3.2": "function_calls"}


class DsmlDialect(TurnDialect):
    name = "dsml"
    peg_file = "dsml.peg"
    reasoning_default = True

    def __init__(self, *, version: str = "v4", **options: Any):
        if version not in _BLOCKS:
            raise ValueError(f"dsml version must be one of {sorted(_BLOCKS)}, not {version!r}")
        super().__init__(**options)
        self.version = version
        self.native_renderer = f"dsml-{version}"

    def substitutions(self, strict: bool) -> dict[str, str]:
        names = [_BLOCKS[self.version]] if strict else list(_BLOCKS.values())
        return {"block": alternatives([peg_literal(name) for name in names])}
