"""Where the team's shared data lies: `shared/data` beside the checkout (or inside it, where a
copy was laid there), or `$PEGMASK_SHARED_DATA`. One place for benches and tests alike."""

from __future__ import annotations

import os
from pathlib import Path

_CHECKOUT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(
    os.environ.get("PEGMASK_SHARED_DATA")
    or next((p for p in (_CHECKOUT.parent / "shared" / "data", _CHECKOUT / "shared" / "data")
             if p.is_dir()), _CHECKOUT.parent / "shared" / "data")
)
JSONSCHEMA_DIR = SHARED_DATA / "jsonschema"  # real-world schemas with valid / invalid instances
TEMPLATES_DIR = SHARED_DATA / "templates"  # real chat templates (PROVENANCE.tsv)
LLMJP_TOKENIZER_DIR = SHARED_DATA / "llm-jp-4-tokenizer"  # LLM-jp-4 SentencePiece model
