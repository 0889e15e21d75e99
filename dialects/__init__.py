"""pegmask.dialects: chat dialects (one `.peg` grammar each), request specialization and prompt
rendering.

    from pegmask.dialects import ChatRequest, get_dialect, render_chat_template
    d = get_dialect("hermes")
    grammar = d.grammar(ChatRequest(tools=[...], tool_choice="required"))
    message = d.parse(output_text)
"""

from pegmask.dialects.base import (
    Dialect,
    DialectStreamParser,
    accumulate,
    dialect_names,
    get_dialect,
)
from pegmask.dialects.request import ChatRequest, RequestError
from pegmask.dialects.templating import render_chat_template

__all__ = [
    "ChatRequest",
    "Dialect",
    "DialectStreamParser",
    "RequestError",
    "accumulate",
    "dialect_names",
    "get_dialect",
    "render_chat_template",
]
