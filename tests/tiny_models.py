"""Tiny random models of each llama-family architecture `LlamaRunner` computes: 2 layers,
32 wide, weights (biases too) drawn large enough to count."""

from __future__ import annotations

import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

COMMON = {"vocab_size": 97, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2}
ARCHITECTURES = {
    "llama": (LlamaConfig, LlamaForCausalLM, {}),
    "llama-bias": (LlamaConfig, LlamaForCausalLM, {"attention_bias": True, "mlp_bias": True}),
    "mistral": (MistralConfig, MistralForCausalLM, {"sliding_window": None}),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, {}),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, {"head_dim": 8}),  # q and k normalized per head
}


def tiny_model(name: str, positions: int = 128) -> torch.nn.Module:
    """Architecture `name` with a context of `positions` tokens."""
    config_class, model_class, extra = ARCHITECTURES[name]
    torch.manual_seed(0)
    config = config_class(**COMMON, max_position_embeddings=positions, **extra)
    model = model_class(config).eval()
    for parameter in model.parameters():  # biases start at zero: make them count
        torch.nn.init.normal_(parameter, std=0.2)
    return model
