"""pegmask.dialects: chat dialects (one `.peg` grammar and one module per model family), request
specialization, template detection and prompt rendering.

    from pegmask.dialects import ChatRequest, detect_dialect, get_dialect, render_chat_template
    d = get_dialect(detect_dialect(template), chat_template=template)  # a family, or "derived"
    d = derive_dialect(template)     # the dialect read off the template alone (DerivationError)
    grammar = d.grammar(ChatRequest(tools=[...], tool_choice="required"))
    message = d.parse(output_text)
"""

from pegmask.dialects.base import Dialect
from pegmask.dialects.derive import DERIVED, derive_dialect
from pegmask.dialects.probe import DerivationError
from pegmask.dialects.registry import (
    UNKNOWN,
    detect_dialect,
    dialect_names,
    dialect_options,
    get_dialect,
)
from pegmask.dialects.request import ChatRequest, RequestError
from pegmask.dialects.stream import DialectStreamParser, accumulate
from pegmask.dialects.templating import render_chat_template

__all__ = [
    "DERIVED",
    "UNKNOWN",
    "ChatRequest",
    "DerivationError",
    "Dialect",
    "DialectStreamParser",
    "RequestError",
    "accumulate",
    "derive_dialect",
    "detect_dialect",
    "dialect_names",
    "dialect_options",
    "get_dialect",
    "render_chat_template",
]
