"""openai-harmony as an offline test oracle for the Harmony dialects.

openai-harmony loads `o200k_base.tiktoken` from `TIKTOKEN_ENCODINGS_BASE` (or downloads it, which
tests must not). quicktok-v1 ships the same ranks, so the file is rebuilt from it once per process:
every non-special token as `base64(bytes) rank`, which reproduces the official file byte for byte
(the SHA-256 openai-harmony expects, `O200K_BASE_SHA256`, is checked here).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any

O200K_BASE_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"


def _write_o200k_base(folder: Path) -> None:
    import quicktok

    encoding = quicktok.get_encoding("o200k_base")
    lines: list[bytes] = []
    for rank in range(encoding.n_vocab):
        try:
            data = encoding.decode_single_token_bytes(rank)
        except KeyError:
            continue  # a hole in the id space (the specials' range)
        if not encoding.is_special_token(rank):
            lines.append(base64.b64encode(data) + b" " + str(rank).encode())
    content = b"\n".join(lines) + b"\n"
    digest = hashlib.sha256(content).hexdigest()
    if digest != O200K_BASE_SHA256:
        raise RuntimeError(f"quicktok's o200k_base does not reproduce the official file ({digest})")
    (folder / "o200k_base.tiktoken").write_bytes(content)


@functools.cache
def harmony_encoding() -> Any:
    """The gpt-oss `HarmonyEncoding`, loaded without network access."""
    from openai_harmony import HarmonyEncodingName, load_harmony_encoding

    folder = Path(tempfile.mkdtemp(prefix="pegmask-tiktoken-"))
    _write_o200k_base(folder)
    os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(folder)
    return load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)


def encode(text: str) -> list[int]:
    """o200k_harmony token ids of `text`, special-token spellings as special tokens."""
    return harmony_encoding().encode(text, allowed_special="all")


def oracle_message(token_ids: list[int]) -> dict[str, Any]:
    """What openai-harmony's StreamableParser reads from an assistant output, mapped to the
    OpenAI fields the way the dialect maps them (analysis -> reasoning, final and
    commentary without recipient -> content, `functions.NAME` -> a call, other recipients
    dropped; the texts of the messages of one field concatenated, analysis messages joined by a
    newline as vLLM joins them, None when empty)."""
    from openai_harmony import Role, StreamableParser

    parser = StreamableParser(harmony_encoding(), role=Role.ASSISTANT)
    for token in token_ids:
        parser.process(token)
    parser.process_eos()
    reasoning: list[str] = []
    content: list[str] = []
    calls: list[tuple[str, str]] = []
    for message in parser.messages:
        text = "".join(part.text for part in message.content)
        recipient = message.recipient
        if recipient and recipient.startswith("functions."):
            calls.append((recipient.removeprefix("functions."), text))
        elif recipient:
            continue
        elif message.channel == "analysis":
            reasoning.append(text)
        else:
            content.append(text)
    return {
        "content": "".join(content) or None,
        "reasoning_content": "\n".join(text for text in reasoning if text) or None,
        "calls": calls,
    }

