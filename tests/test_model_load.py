"""Loading a GGUF checkpoint with each file parsed once (`engine/model.py`, `_gguf_parsed_once`)
gives what transformers' own load gives: the same weights, config and tokenizer."""

from __future__ import annotations

import os

import gguf
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from pegmask.engine.model import _gguf_parsed_once, load_backend  # noqa: E402


def test_parsing_a_gguf_file_once_loads_the_same_model() -> None:
    backend = load_backend()  # the embedded GGUF model, loaded through `_gguf_parsed_once`
    path = backend.path
    source = {"pretrained_model_name_or_path": str(path.parent), "gguf_file": path.name,
              "local_files_only": True}
    tokenizer = AutoTokenizer.from_pretrained(**source)
    model = AutoModelForCausalLM.from_pretrained(**source, dtype=torch.float32)

    assert backend.model.config.to_dict() == model.config.to_dict()
    ours, theirs = backend.model.state_dict(), model.state_dict()
    assert ours.keys() == theirs.keys()
    for name, tensor in theirs.items():
        assert torch.equal(ours[name], tensor), name
    assert backend.tokenizer.get_vocab() == tokenizer.get_vocab()
    assert backend.tokenizer.chat_template == tokenizer.chat_template
    text = "<|im_start|>user\nWie spät ist es in Zürich? 12:30 🙂<|im_end|>"
    assert backend.tokenizer(text)["input_ids"] == tokenizer(text)["input_ids"]


def test_the_gguf_module_is_left_as_it_was() -> None:
    reader_class, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    with _gguf_parsed_once():
        assert gguf.GGUFReader is not reader_class
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == (reader_class, name_map)
