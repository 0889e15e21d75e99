"""Token-aware text diffs of a template's renderings: common prefixes and suffixes that cut no
special token in two, a turn's overlap with its header, where a JSON value is written. What
`pegmask.dialects.probe` reads a turn's structure with."""

from __future__ import annotations

import json
import os
import re
from typing import Any

# A special token's spelling: <tag>, </tag>, <|tag|>, <|tag>, <tag|>, <｜tag｜>, [UPPER_CASE];
# between pipes, any text but whitespace (Gemma 4's string quote <|"|>).
TOKEN = re.compile(r"<\|[^<>\s|]+\|>|<[^<>\s\"']+>|\[/?[A-Z][A-Z_]*\]")


def _snap_end(text: str, n: int) -> int:
    """`n`, moved back to the start of a token that `text[:n]` cuts in two."""
    for start, end in token_spans(text):
        if start < n < end:
            return start
    return n


def _snap_start(text: str, n: int) -> int:
    """`n`, moved on to the end of a token that `text[n:]` starts inside."""
    for start, end in token_spans(text):
        if start < n < end:
            return end
    return n


def token_spans(text: str) -> list[tuple[int, int]]:
    """Where `text` writes special tokens (start, end), in order."""
    return [match.span() for match in TOKEN.finditer(text)]


def common_prefix(a: str, b: str) -> int:
    """Length of the longest common prefix of `a` and `b` that cuts no token of `a` nor an
    opening `<` or `[` from the rest of its tag (`<function=` vs `</function>`)."""
    n = _snap_end(a, len(os.path.commonprefix([a, b])))
    opened = max(a.rfind("<", 0, n), a.rfind("[", 0, n))
    if opened >= 0 and not re.search(r"[>\]]", a[opened:n]):
        return opened
    return n


def common_suffix(a: str, b: str) -> int:
    """Length of the longest common suffix of `a` and `b` that cuts no token of `a`."""
    n = len(os.path.commonprefix([a[::-1], b[::-1]]))
    return len(a) - _snap_start(a, len(a) - n)


def header_overlap(turn: str, header: str) -> int:
    """How much of a rendered `turn` is the generation prompt's turn header: their common
    prefix, or a longer end of the header holding a token that the turn starts with. (Mistral
    Nemo's template writes the system message into the last user turn only while it is the last
    message: after the assistant's, the header's start is missing, `Question?[/INST]` is not.)"""
    shared = common_prefix(turn, header)
    for start, _ in token_spans(header):
        for begin in range(start + 1):
            end = header[begin:]
            if len(end) > shared and turn.startswith(end) and _snap_start(header, begin) == begin:
                return len(end)
    return shared


def first_token(text: str) -> str | None:
    """The token `text` starts with (after whitespace), if it starts with one."""
    match = TOKEN.match(text.lstrip())
    return match.group() if match else None


def json_at(text: str, start: int) -> tuple[Any, int] | None:
    """The JSON value at `text[start:]` and where it ends, or None."""
    try:
        return json.JSONDecoder().raw_decode(text, start)
    except ValueError:
        return None


def find_json(text: str, value: Any) -> tuple[int, int] | None:
    """Where `text` writes `value` as a JSON object (first place), or None."""
    for match in re.finditer(r"\{", text):
        found = json_at(text, match.start())
        if found is not None and found[0] == value:
            return match.start(), found[1]
    return None
