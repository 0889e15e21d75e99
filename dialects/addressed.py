"""Turns whose parts are addressed, as MeetKai Functionary v3.2's `>>>recipient\\nmessage`: the
content goes to a recipient of its own (rule `to_content`, `all\\n`), each call to its tool,
parts separated by `sep`, and the generation prompt opens the first part (so a turn starts with
its first recipient). `addressed_root` is such a turn's `root` rule; the dialect's grammar
defines `to_content`, `sep`, `calls_one`, `calls_many`, `region` and `eos`."""

from __future__ import annotations

from typing import Any

from pegmask.dialects.request import ChatRequest


def addressed_root(request: ChatRequest, strict: bool) -> tuple[str, Any]:
    """The `root` rule and the answer's schema: the content's recipient and the content, then
    calls after `sep` (unless the request forbids them), or calls alone; leniently also any
    text as content."""
    schema = request.response_grammar if strict else None
    if strict:
        answer = "to_content @content:json(response)" if schema is not None else \
            "to_content (@content:text)?"
        calls = "calls_one" if request.max_calls == 1 else "calls_many"
        if request.min_calls:
            body = calls
        elif request.max_calls == 0:
            body = answer
        elif schema is not None:  # the JSON answer is due, unless calls come instead
            body = f"{answer} | {calls}"
        else:
            body = f"{answer} (sep {calls})? | {calls}"
    else:
        body = "to_content (@content:text)? (sep region)? | region | @content:text"
    optional = "" if strict and request.min_calls else "?"
    return f"root = ({body}){optional} ws eos?\n", schema
