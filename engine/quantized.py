"""A GGUF file's quantized weights run as stored, through torch's int4 weight-only product.

Why: one decoding row reads every weight once per token, so its step is bound by the bytes read
(SmolLM2's Q4_1 blocks are 0.625 bytes a weight, a float16 copy 2, bfloat16 2). Torch's CPU
kernel `_weight_int4pack_mm_for_cpu` multiplies bfloat16 rows by 4-bit weights packed with a
scale and a zero per group of 32 inputs, `w = (q - 8) * scale + zero`, without a float copy of
the matrix; it is fast with bfloat16 rows only (float32 and float16 rows take a scalar path,
100x slower).

Every block format whose groups hold 32 weights maps onto it exactly as `w = scale * v + offset`
with `v` the block's unsigned integer value, as ggml dequantizes:

* Q4_0 (`d * (q - 8)`), Q4_1 (`d * q + m`), Q4_K (`d * sc * q - dmin * m` per 32-weight
  sub-block): one 4-bit plane;
* Q5_0, Q5_1, Q5_K (5-bit values) and Q8_0 (8-bit, `d * q` with q signed): two planes, the
  value's low and high four bits (`v = lo + 16 * hi`), each a product of its own, summed.

Q6_K, Q3_K and Q2_K group 16 weights, which the kernel cannot (32 at least): such tensors, and
float ones, keep the float product. What the kernel rounds: rows, scales and zeros to bfloat16
(`QuantizedWeight.dequantize` gives the weights it multiplies by; tests/test_quantized.py checks
the planes against gguf's own dequantizer and the product against it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

GROUP = 32  # weights per scale: the kernel's smallest group
# Whether a format maps onto int4 planes, and its bytes per block of `BLOCK[name]` weights.
BLOCK = {"Q4_0": 32, "Q4_1": 32, "Q5_0": 32, "Q5_1": 32, "Q8_0": 32, "Q4_K": 256, "Q5_K": 256}
SUPPORTED_FORMATS = frozenset(BLOCK)


@dataclass
class AffineGroups:
    """A matrix as `w[n, k] = scale[n, k // 32] * values[n, k] + offset[n, k // 32]`, with
    unsigned integer values of `bits` bits: the common form of the block formats."""

    values: np.ndarray  # uint8 (N, K)
    scale: np.ndarray  # float32 (N, K // 32)
    offset: np.ndarray  # float32 (N, K // 32)
    bits: int

    def dequantize(self) -> np.ndarray:
        """float32 (N, K), computed as ggml does (`scale * v + offset` in float32)."""
        n, k = self.values.shape
        v = self.values.reshape(n, k // GROUP, GROUP).astype(np.float32)
        w = self.scale[..., None] * v + self.offset[..., None]
        return w.reshape(n, k)


def _half(raw: np.ndarray, at: int) -> np.ndarray:
    """The float16 at byte `at` of each block, as float32 (blocks, 1)."""
    return np.ascontiguousarray(raw[:, at:at + 2]).view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """16 bytes a block -> 32 values: the low four bits first, then the high four."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _high_bits(qh: np.ndarray) -> np.ndarray:
    """Q5_0 / Q5_1: 4 bytes a block, bit j (little-endian) the fifth bit of weight j."""
    bits = np.unpackbits(qh, axis=-1, bitorder="little")
    return bits.astype(np.uint8)


def _k_scales(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K: the 6-bit scales and mins of a super-block's 8 sub-blocks, packed in 12
    bytes (the first four of each in the low six bits of bytes 0-3 and 4-7, the last four in
    bytes 8-11's nibbles with their top two bits in bytes 0-7's top bits)."""
    low, mid, high = scales[:, 0:4], scales[:, 4:8], scales[:, 8:12]
    sc = np.concatenate([low & 0x3F, (high & 0x0F) | ((low >> 2) & 0x30)], axis=-1)
    mins = np.concatenate([mid & 0x3F, (high >> 4) | ((mid >> 2) & 0x30)], axis=-1)
    return sc.astype(np.float32), mins.astype(np.float32)


def affine_groups(kind: str, raw: np.ndarray, columns: int) -> AffineGroups:
    """The blocks of a matrix stored as `kind` (raw bytes, one row of blocks per output row)
    in affine form."""
    if kind not in SUPPORTED_FORMATS:
        raise ValueError(f"{kind} weights have no int4 form (supported: "
                         f"{', '.join(sorted(SUPPORTED_FORMATS))})")
    rows = raw.shape[0]
    blocks = raw.reshape(rows * (columns // BLOCK[kind]), -1)
    if kind in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"):
        d = _half(blocks, 0)
        if kind == "Q4_0":
            values, bits, offset = _nibbles(blocks[:, 2:18]), 4, -8 * d
        elif kind == "Q4_1":
            values, bits, offset = _nibbles(blocks[:, 4:20]), 4, _half(blocks, 2)
        elif kind == "Q5_0":
            values = _nibbles(blocks[:, 6:22]) | (_high_bits(blocks[:, 2:6]) << 4)
            bits, offset = 5, -16 * d
        elif kind == "Q5_1":
            values = _nibbles(blocks[:, 8:24]) | (_high_bits(blocks[:, 4:8]) << 4)
            bits, offset = 5, _half(blocks, 2)
        else:  # Q8_0: signed bytes, shifted to unsigned
            signed = np.ascontiguousarray(blocks[:, 2:34]).view(np.int8)
            values, bits, offset = (signed.astype(np.int16) + 128).astype(np.uint8), 8, -128 * d
        scale = d
    else:  # Q4_K, Q5_K: super-blocks of 256, 8 sub-blocks of 32 with 6-bit scales and mins
        d, dmin = _half(blocks, 0), _half(blocks, 2)
        sc, mins = _k_scales(blocks[:, 4:16])
        if kind == "Q4_K":
            qs, high, bits = blocks[:, 16:144], None, 4
        else:
            qs, high, bits = blocks[:, 48:176], blocks[:, 16:48], 5
        # 4 chunks of 32 bytes, each the low nibbles of one sub-block then the high of the next
        low = qs.reshape(-1, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
        values = (low & 0x0F).reshape(-1, 8, 32)
        if high is not None:  # bit j of byte l: the fifth bit of weight l of sub-block j
            shifts = np.arange(8, dtype=np.uint8).reshape(1, 8, 1)
            values = values | (((high[:, None, :] >> shifts) & 1) << 4)
        values = values.reshape(-1, 256)
        scale, offset = d * sc, -(dmin * mins)  # per sub-block: (blocks, 8)
    groups = columns // GROUP
    return AffineGroups(values=values.reshape(rows, columns).astype(np.uint8),
                        scale=np.asarray(scale, np.float32).reshape(rows, groups),
                        offset=np.asarray(offset, np.float32).reshape(rows, groups),
                        bits=bits)


def concat_rows(parts: list[AffineGroups]) -> AffineGroups:
    """Matrices stacked along their output rows (fused q/k/v or gate/up products)."""
    return AffineGroups(values=np.concatenate([p.values for p in parts]),
                        scale=np.concatenate([p.scale for p in parts]),
                        offset=np.concatenate([p.offset for p in parts]),
                        bits=max(p.bits for p in parts))


def int4_shape_ok(rows: int, columns: int) -> bool:
    """Whether the packed kernel takes an (rows, columns) weight."""
    return rows % 16 == 0 and columns % (2 * GROUP) == 0


class QuantizedWeight:
    """`x W^T` for float32 rows `x`, over `AffineGroups` packed as int4 planes: one product per
    four bits of value (`v = sum_p 16**p * plane_p`), each with its scales and zeros, summed
    in float32."""

    def __init__(self, groups: AffineGroups):
        self.rows, self.columns = groups.values.shape
        if not int4_shape_ok(self.rows, self.columns):
            raise ValueError(f"a {self.rows}x{self.columns} weight does not fit the int4 "
                             "kernel (rows a multiple of 16, columns of 64)")
        values = groups.values.astype(np.int32)
        scale = torch.from_numpy(groups.scale.T.copy())  # (groups, N) as the kernel reads
        offset = torch.from_numpy(groups.offset.T.copy())
        # Each plane's weights centred on its own range, the rest of the offset carried by
        # the first: no plane adds a large constant that another takes away (the kernel
        # rounds each product to bfloat16). A plane of fewer than 16 levels (a 5-bit value's
        # top bit) is stored shifted to the kernel's centre, 8, so its zero stays small too.
        levels = [min(16, 2 ** (groups.bits - 4 * p)) for p in range((groups.bits + 3) // 4)]
        centres = [(n - 1) / 2 for n in levels]
        rest = offset + scale * sum(16**p * c for p, c in enumerate(centres))
        nibbles, pairs = [], []
        for p, (count, centre) in enumerate(zip(levels, centres, strict=True)):
            shift = 8 - count // 2
            nibble = torch.from_numpy(((values >> (4 * p)) & 0x0F) + shift).contiguous()
            nibbles.append(nibble)
            step = scale * 16**p
            # the kernel computes (q + shift - 8) * step + zero = (q - centre) * step (+ rest)
            zero = (count // 2 - centre) * step + (rest if p == 0 else 0)
            pairs.append(torch.stack([step, zero], dim=-1).to(torch.bfloat16))
        # the planes stacked as one weight of planes * N rows: one kernel call a product
        self.planes = len(nibbles)
        self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(torch.cat(nibbles), 1)
        self.scales_zeros = torch.cat(pairs, dim=1).contiguous()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = self._planes(x)
        out = y[:, : self.rows].float()
        for p in range(1, self.planes):
            out.add_(y[:, p * self.rows : (p + 1) * self.rows])
        return out

    def add_to(self, residual: torch.Tensor, x: torch.Tensor) -> None:
        """residual += x W^T: one plane's bfloat16 product added as it is (the same sum as
        adding its float32 copy, without the copy)."""
        residual.add_(self._planes(x) if self.planes == 1 else self(x))

    def _planes(self, x: torch.Tensor) -> torch.Tensor:
        """Every plane's bfloat16 product, side by side: (rows, planes * N)."""
        return torch.ops.aten._weight_int4pack_mm_for_cpu(
            x.to(torch.bfloat16), self.packed, GROUP, self.scales_zeros)

    def dequantize(self) -> torch.Tensor:
        """The float32 (N, K) matrix the products multiply by (scales and zeros in bfloat16):
        the identity's rows through the kernel, transposed."""
        return self(torch.eye(self.columns)).T.contiguous()


# GGUF names of a llama-family layer's linear weights, by the runner's product.
LAYER_TENSORS = {"qkv": ("attn_q", "attn_k", "attn_v"), "out": ("attn_output",),
                 "gate_up": ("ffn_gate", "ffn_up"), "down": ("ffn_down",)}


class GGUFWeights:
    """The quantized linear weights of a llama-family GGUF file, by layer and product, as
    `QuantizedWeight`s; None where a tensor's format (or shape) has no int4 form."""

    def __init__(self, reader: Any, heads: int, kv_heads: int):
        self._tensors = {t.name: t for t in reader.tensors}
        field = reader.fields.get("general.architecture")
        self.architecture = bytes(field.parts[field.data[0]]).decode() if field else ""
        self.heads, self.kv_heads = heads, kv_heads

    def _groups(self, name: str) -> AffineGroups | None:
        tensor = self._tensors.get(name)
        if tensor is None or tensor.tensor_type.name not in SUPPORTED_FORMATS:
            return None
        columns, rows = (int(n) for n in tensor.shape[:2])
        raw = np.asarray(tensor.data).reshape(rows, -1)
        if self.architecture == "llama" and (".attn_q." in name or ".attn_k." in name):
            # llama.cpp's converter interleaves q/k rows for its rotary layout; transformers
            # (and so the float weights) undo it: the same permutation of whole rows here.
            heads = self.heads if ".attn_q." in name else self.kv_heads
            raw = _unpermute_rows(raw, heads)
        return affine_groups(tensor.tensor_type.name, raw, columns)

    def product(self, names: list[str]) -> QuantizedWeight | None:
        """The product of these tensors' rows stacked, if each has an int4 form."""
        parts = [self._groups(name) for name in names]
        if any(part is None for part in parts):
            return None
        groups = concat_rows(parts)  # type: ignore[arg-type]
        if not int4_shape_ok(*groups.values.shape):
            return None
        return QuantizedWeight(groups)

    def layer(self, index: int, product: str) -> QuantizedWeight | None:
        return self.product([f"blk.{index}.{name}.weight" for name in LAYER_TENSORS[product]])

    def output(self) -> QuantizedWeight | None:
        """The output layer: its own tensor, or the token embedding where the two are tied."""
        name = "output.weight" if "output.weight" in self._tensors else "token_embd.weight"
        return self.product([name])


def _unpermute_rows(raw: np.ndarray, heads: int) -> np.ndarray:
    half = raw.shape[0] // heads // 2
    return raw.reshape(heads, half, 2, -1).swapaxes(1, 2).reshape(raw.shape)
