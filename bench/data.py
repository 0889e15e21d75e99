"""Where the repository's data lies (`data/` at the checkout's root, see data/README.md), or
`$PEGMASK_DATA`. One place for benches and tests alike; nothing outside the checkout is read."""

from __future__ import annotations

import os
from pathlib import Path

_CHECKOUT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("PEGMASK_DATA") or _CHECKOUT / "data")
JSONSCHEMA_DIR = DATA / "jsonschema"  # real-world schemas with valid / invalid instances
TEMPLATES_DIR = DATA / "templates"  # real chat templates (PROVENANCE.tsv)
LLMJP_TOKENIZER_DIR = DATA / "llm-jp-4-tokenizer"  # LLM-jp-4 SentencePiece model
