"""GGUF block formats run as stored (engine/quantized.py): every format's affine form against
gguf's own dequantizer, the int4 planes' product against the dequantized float32 matrix, and
the embedded SmolLM2 file's blocks against the weights transformers loaded from it."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from gguf.quants import dequantize

from pegmask.engine.model import load_backend
from pegmask.engine.quantized import (
    LAYER_TENSORS,
    SUPPORTED_FORMATS,
    AffineGroups,
    GGUFWeights,
    QuantizedWeight,
    affine_groups,
)
from pegmask.engine.runner import attention_heads

ROWS, COLUMNS = 48, 512


def random_blocks(kind: str, seed: int = 0) -> np.ndarray:
    """A (ROWS, bytes) matrix of `kind` blocks: random bits, with the float16 scale (and min)
    fields set to ordinary magnitudes, as a quantizer writes them."""
    rng = np.random.default_rng(seed)
    qtype = gguf.GGMLQuantizationType[kind]
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(ROWS, COLUMNS // block * size), dtype=np.uint8)
    halves = 2 if kind in ("Q4_1", "Q5_1", "Q4_K", "Q5_K") else 1  # d, then m / dmin
    blocks = raw.reshape(-1, size)
    for h in range(halves):
        scale = rng.uniform(1e-3, 2e-2, size=len(blocks)).astype(np.float16)
        blocks[:, 2 * h:2 * h + 2] = scale.view(np.uint8).reshape(-1, 2)
    return raw


@pytest.mark.parametrize("kind", sorted(SUPPORTED_FORMATS))
def test_affine_form_is_ggufs_dequantization(kind: str) -> None:
    raw = random_blocks(kind)
    expected = dequantize(raw, gguf.GGMLQuantizationType[kind]).reshape(ROWS, COLUMNS)
    groups = affine_groups(kind, raw, COLUMNS)
    assert groups.values.max() < 2**groups.bits
    np.testing.assert_array_equal(groups.dequantize(), expected)


@pytest.mark.parametrize("kind", sorted(SUPPORTED_FORMATS))
def test_int4_planes_multiply_like_bfloat16(kind: str) -> None:
    """The kernel rounds rows, scales and zeros to bfloat16: its product is as close to the
    float32 one as a bfloat16 product of the dequantized matrix (a 5-bit or 8-bit value is
    two planes, each centred so that neither carries a large constant)."""
    raw = random_blocks(kind, seed=1)
    matrix = torch.from_numpy(dequantize(raw, gguf.GGMLQuantizationType[kind])
                              .reshape(ROWS, COLUMNS))
    weight = QuantizedWeight(affine_groups(kind, raw, COLUMNS))
    assert weight.planes == (1 if kind in ("Q4_0", "Q4_1", "Q4_K") else 2)
    x = torch.randn(5, COLUMNS, generator=torch.Generator().manual_seed(2))
    exact = x @ matrix.T
    bf16 = (x.bfloat16() @ matrix.bfloat16().T).float()
    ours = weight(x)
    assert ours.dtype == torch.float32 and ours.shape == (5, ROWS)
    error = float((ours - exact).norm() / exact.norm())
    assert error < 2 * float((bf16 - exact).norm() / exact.norm()) + 1e-3, error
    # what it multiplies by is the file's matrix within bfloat16's rounding (of the scales,
    # the zeros and, here, of the products of the identity's rows)
    torch.testing.assert_close(weight.dequantize(), matrix, rtol=0.02,
                               atol=0.01 * float(matrix.abs().max()))


def test_formats_without_an_int4_form_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="Q6_K weights have no int4 form"):
        affine_groups("Q6_K", np.zeros((16, 210), np.uint8), 256)
    with pytest.raises(ValueError, match="does not fit the int4 kernel"):
        QuantizedWeight(AffineGroups(values=np.zeros((10, 64), np.uint8),
                                     scale=np.ones((10, 2), np.float32),
                                     offset=np.zeros((10, 2), np.float32), bits=4))


def test_smollm2_blocks_are_the_weights_transformers_loaded() -> None:
    """The embedded file (Q4_1 layers, a Q8_0 embedding tied to the output layer): each fused
    product's affine form equals transformers' dequantized float32 weights, q and k with
    llama.cpp's rotary row order undone."""
    backend = load_backend(None)
    heads, kv_heads, _ = attention_heads(backend.model.config)
    blocks = GGUFWeights(backend.gguf, heads, kv_heads)
    assert blocks.architecture == "llama"
    layer = backend.model.model.layers[3]
    attention, mlp = layer.self_attn, layer.mlp
    expected = {
        "qkv": torch.cat([attention.q_proj.weight, attention.k_proj.weight,
                          attention.v_proj.weight]),
        "out": attention.o_proj.weight,
        "gate_up": torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]),
        "down": mlp.down_proj.weight,
    }
    for product, weight in expected.items():
        names = [f"blk.3.{name}.weight" for name in LAYER_TENSORS[product]]
        groups = [blocks._groups(name) for name in names]
        ours = np.concatenate([g.dequantize() for g in groups])
        np.testing.assert_allclose(ours, weight.detach().numpy(), rtol=0, atol=1e-6)
        assert blocks.layer(3, product).rows == weight.shape[0]
    output = blocks.output()
    assert output is not None and output.rows == backend.model.config.vocab_size
    assert output.planes == 2  # Q8_0: two 4-bit planes
    x = torch.randn(2, output.columns)
    head = backend.model.get_output_embeddings().weight
    torch.testing.assert_close(output(x), x @ head.detach().T, rtol=0.02, atol=0.05)
