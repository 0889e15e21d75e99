"""Real vocabularies shipped by PyPI packages, loaded once per test session (test helper)."""

from __future__ import annotations

import functools

from pegmask.engine.model import default_model_path as smollm2_gguf_path
from pegmask.grammars.vocab import Vocabulary


@functools.cache
def smollm2() -> Vocabulary:
    return Vocabulary.from_gguf(smollm2_gguf_path())


@functools.cache
def smollm2_tokenizer():
    """The real SmolLM2 tokenizer (transformers reads it from the GGUF file)."""
    from transformers import AutoTokenizer

    path = smollm2_gguf_path()
    return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
