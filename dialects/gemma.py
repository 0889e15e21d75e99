"""The `gemma` dialect: Gemma 4 `<|tool_call>call:NAME{...}<tool_call|>` calls whose arguments
are Gemma's JSON dialect, unquoted keys and strings between `<|"|>` tokens (gemma.peg).

The strict grammar is written from each tool's schema here (`quoted_values`): keys in sorted order as
the template writes them, strings raw between the delimiters (a constrained string's schema
applies to that text), numbers and booleans as JSON, null as `null` or Python's `None` (which the
template writes), arrays and objects recursively
(objects take their declared properties only; a schema without properties any members).
`allOf`, `not`, `if` and `patternProperties` have no Gemma form here: such a tool is refused
with a clear error. Parsed values are converted to JSON (`read_value`; Python's `None`, `True`
read too). ``reasoning`` is detected from the output: the model writes
`<|channel>thought...<channel|>` when the template's ``enable_thinking`` is on (its prompt
otherwise closes an empty channel itself); a request's ``enable_thinking: false`` turns it off.

Prompts come from the model's template.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from pegmask.dialects import quoted_values
from pegmask.dialects.base import TurnDialect, peg_literal
from pegmask.dialects.quoted_values import quoted_params

QUOTE = '<|"|>'
_PROBE_CALL = re.compile(r"<\|tool_call>call:pegmask_probe\{pegmask_arg:")


def read_value(text: str, schema: Any = None) -> Any:
    """The JSON value of a Gemma-style value (ValueError if it is none)."""
    return quoted_values.read_value(text, schema, QUOTE)


class GemmaDialect(TurnDialect):
    name = "gemma"
    priority = 60
    probe = (_PROBE_CALL,)
    value_readers = {"gemma": read_value}
    peg_file = "gemma.peg"
    raw_until = QUOTE

    def substitutions(self, strict: bool) -> dict[str, str]:
        return {"gws": '""' if strict else "[ \\t\\r\\n]*"}

    def param_rules(self, sections: dict[str, str], index: int, schema: dict[str, Any],
                    grammar_of: Callable[[Any], Any]) -> tuple[str, str, dict[str, Any]]:
        """One `key:value` rule per declared property, in sorted order: strings captured raw
        between the delimiters, other values as Gemma text converted after parsing."""
        return quoted_params(index, schema, QUOTE, "gemma",
                             lambda key: f'@key:{peg_literal(key)} ":"')
