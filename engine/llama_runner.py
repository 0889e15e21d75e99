"""A lean batched forward for llama-family decoders (Llama, Mistral, Qwen2, Qwen3, SmolLM2).

Why not transformers' own forward: its per-layer Python and mask building cost more than the
matrix products for a small model, its cache cannot take a sequence in or out of a running batch
without copying every row, and on CPUs the products it issues (float32, one per projection,
`(rows, hidden)` with few rows) are MKL's slow small-batch case. Here:

* the weights are read from the loaded transformers model once; the q/k/v projections are one
  product, gate/up another. On a CPU a product's weights take the form that is fastest for
  the step's row count (`weights`, `WEIGHT_MODES`). A step of a few rows reads every weight
  once and is bound by the bytes read: a GGUF file's quantized blocks run as stored through
  torch's int4 kernel (engine/quantized.py; Q4_1 is 0.625 bytes a weight, a float copy 2). A
  step of many rows (a prompt chunk, a large batch) is bound by arithmetic: prepacked bfloat16
  weights on CPUs with bfloat16 instructions (AMX or AVX512-BF16; oneDNN, rows rounded to
  bfloat16, float32 accumulation; with AMX keys and values cached in bfloat16), FBGEMM's
  float16-weight kernel elsewhere (float32 rows and accumulation; on an AVX2-only EPYC 3x
  float32 at 1-8 rows). `auto` keeps the blocks and the float form. Measured on a 2-core
  AVX512-BF16 EPYC (SmolLM2, fastest of 20 steps): one row 6.9 ms quantized, 9.8 float16,
  11.7 bfloat16; 32 one-token rows 33.2 bfloat16, 37.8 float16; a 256-token prompt chunk
  2,499 tokens/s bfloat16, 1,635 float16, 1,211 quantized.
  Rounding's bound, measured on SmolLM2 (tests/test_runner.py checks it for every rounded
  mode): greedy picks, teacher-forced on float32's, agree on 98% of steps, and where they
  differ float32's own best two were within 0.13 of each other (near-ties); float16 weights
  agree on all;
* every token of every sequence in a step is one row of the same products (a prompt chunk of
  one sequence next to the sampled and forced tokens of each other sequence); attention reads
  each cache once a step (`_AttentionPlan`): a saved prompt prefix shared by sequences once for
  all of their sampled and forced tokens (cascade attention), the other one-token rows in one
  call, forced chunks in another, one call per prompt chunk;
* the KV cache is one tensor per layer with a slot per sequence, `(slots, kv_heads, time,
  head_dim)`; a sequence that leaves gives its slot to the last one, so the live slots are
  always a prefix and attention reads runs of slots in place. Sequences are kept in a few such
  caches by length (`LlamaRunner`), so that one long sequence does not size every slot.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from pegmask.engine.compiled_step import OneRowStep
from pegmask.engine.quantized import GGUFWeights, QuantizedWeight
from pegmask.engine.runner import Chunk, attention_heads

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


def supports(model: Any) -> bool:
    """Whether `model` (a transformers causal LM) has the architecture this runner computes."""
    config = model.config
    if getattr(config, "model_type", None) not in SUPPORTED_MODEL_TYPES:
        return False
    if getattr(config, "hidden_act", "silu") != "silu":
        return False
    # A sliding window that the context can exceed changes attention: not computed here.
    window = getattr(config, "sliding_window", None)
    uses_window = getattr(config, "use_sliding_window", window is not None)
    return not (uses_window and window and window < config.max_position_embeddings)


# Steps of at most this many rows use a weight's quantized blocks where it has them; longer
# ones its float copy (when kept). On a 2-core AVX512-BF16 EPYC, SmolLM2's five product shapes
# (one thread, fastest of 30): 1 row int4 0.90 ms, bfloat16 prepacked 1.46, float16 weights
# 1.64; 4 rows 1.5 against 2.1 (float16); 8 rows 3.2 against 2.4 (bfloat16).
QUANTIZED_ROWS = 4


class _Linear:
    """y = x W^T + b for float32 rows, with W kept in the product's format on the CPU: prepacked
    for oneDNN's bfloat16 kernel ("bfloat16": rows rounded to bfloat16, float32 accumulation),
    prepacked for FBGEMM's float16-weight kernel ("float16": float32 rows and accumulation),
    as it is ("float32"), or none (None: `quantized` only); and, where given, a GGUF file's
    quantized blocks (`quantized`), used for steps of at most `QUANTIZED_ROWS` rows."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None,
                 weight_format: str | None, quantized: QuantizedWeight | None = None):
        self.format = weight_format
        self.bias = bias
        self.quantized = quantized
        self.weight: torch.Tensor | None
        if weight_format is None:
            if quantized is None:
                raise ValueError("a product needs a float format or quantized blocks")
            self.weight = None
        elif weight_format == "bfloat16":
            self.weight = _prepack_bf16(weight)
        elif weight_format == "float16":
            self.weight = torch.ops.quantized.linear_prepack_fp16(weight.float(), None)
        else:
            self.weight = weight.contiguous()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = self._product(x).float()
        return y if self.bias is None else y + self.bias

    def add_to(self, residual: torch.Tensor, x: torch.Tensor) -> None:
        """residual += x W^T + b in place: a bfloat16 product is added as it is, without a
        float32 copy of it first (the same sum; 2 of a layer's 4 conversions)."""
        if self.uses_quantized(x.shape[0]):
            self.quantized.add_to(residual, x)  # type: ignore[union-attr]
        else:
            residual.add_(self._product(x))
        if self.bias is not None:
            residual.add_(self.bias)

    def uses_quantized(self, rows: int) -> bool:
        return self.quantized is not None and (self.weight is None or rows <= QUANTIZED_ROWS)

    def _product(self, x: torch.Tensor) -> torch.Tensor:
        """x W^T in the product's output dtype (float32, or bfloat16), without the bias."""
        if self.uses_quantized(x.shape[0]):
            return self.quantized(x)  # type: ignore[misc]
        if self.format == "float16":
            return torch.ops.quantized.linear_dynamic_fp16(x, self.weight)
        if self.format == "bfloat16":
            return torch.ops.mkldnn._linear_pointwise(
                x.to(torch.bfloat16), self.weight, None, "none", [None], "")
        return F.linear(x, self.weight)


class _GatedMLP:
    """silu(x G^T + b) * (x U^T + c): the rows the down projection takes. On oneDNN's bfloat16
    kernel, two products with the activation and the multiplication done in them (post-ops):
    bfloat16 rows as the down projection reads them, with no float32 copy of the gate and up
    products and no separate activation or multiplication (in the same process, 32 one-token
    rows: 46.6 -> 45.8 ms a step; the activation is taken before rounding, closer to
    float32's). Elsewhere (or with biases, or on quantized blocks) one product of both, then
    the activation and multiplication."""

    def __init__(self, gate: Any, up: Any, weight_format: str | None,
                 quantized: QuantizedWeight | None = None):
        self.fused = weight_format == "bfloat16" and gate.bias is None and up.bias is None
        if self.fused:  # oneDNN-prepacked weights, each product called with its post-op
            self.gate, self.up = _prepack_bf16(gate.weight), _prepack_bf16(up.weight)
        # one product of both: the float one where not fused, the quantized one where given
        self.gate_up: _Linear | None = None
        if quantized is not None or not self.fused:
            self.gate_up = _Linear(torch.cat([gate.weight, up.weight]), _cat_bias(gate, up),
                                   None if self.fused else weight_format, quantized)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        few = x.shape[0] <= QUANTIZED_ROWS
        if self.gate_up is not None and (not self.fused or few and self.gate_up.quantized):
            gate, up = self.gate_up(x).chunk(2, dim=-1)
            return F.silu(gate) * up
        x = x.to(torch.bfloat16)
        gated = torch.ops.mkldnn._linear_pointwise(x, self.gate, None, "swish", [None], "")
        return torch.ops.mkldnn._linear_pointwise.binary(x, gated, self.up, None, "mul")


def _prepack_bf16(weight: torch.Tensor) -> torch.Tensor:
    """`weight` rounded to bfloat16 and laid out for oneDNN's product."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.bfloat16(), None)


def _fp16_kernel_available() -> bool:
    try:
        torch.ops.quantized.linear_prepack_fp16(torch.zeros(1, 1), None)
    except (RuntimeError, AttributeError):
        return False
    return True


def bf16_kernel_available() -> bool:
    """Whether this CPU has bfloat16 instructions for oneDNN's products: AMX (at 8 / 16 / 32
    rows, the 30 layers' products of SmolLM2 take 13.5 / 15.1 / 17.3 ms against 19.9 / 28.8 /
    39.2 with float16 weights on a Xeon) or AVX512-BF16 (a 2-core EPYC: SmolLM2's five product
    shapes at 32 / 128 rows, one thread, 6.0 / 18.3 ms against 17.8+ / 227 with float16
    weights)."""
    try:
        if not (_amx() or torch.cpu._is_avx512_bf16_supported()):
            return False
        weight = _prepack_bf16(torch.zeros(16, 16))
        torch.ops.mkldnn._linear_pointwise(torch.zeros(1, 16, dtype=torch.bfloat16), weight,
                                           None, "none", [None], "")
    except (RuntimeError, AttributeError):
        return False
    return True


def _amx() -> bool:
    return bool(torch.cpu._is_amx_tile_supported())


def int4_kernel_fast() -> bool:
    """Whether torch's int4 weight-only kernel runs its vectorized AVX-512 path here (it is the
    one measured; elsewhere `auto` keeps to float weights)."""
    return torch.backends.cpu.get_cpu_capability() in ("AVX512", "AMX")


@dataclass
class _Layer:
    attention_norm: torch.Tensor
    qkv: _Linear
    q_norm: torch.Tensor | None  # Qwen3 normalizes each head's q and k
    k_norm: torch.Tensor | None
    out: _Linear
    mlp_norm: torch.Tensor
    gated: _GatedMLP
    down: _Linear


def _cat_bias(*linears: Any) -> torch.Tensor | None:
    biases = [linear.bias for linear in linears]
    if all(bias is None for bias in biases):
        return None
    return torch.cat([b if b is not None else torch.zeros(lin.weight.shape[0])
                      for b, lin in zip(biases, linears, strict=True)])


# `weights`: what the products multiply by on a CPU (a GPU runs the model's own dtype).
WEIGHT_MODES = ("auto", "quantized", "bfloat16", "float16", "float32")


def float_format(weights: str) -> str:
    """The float format of a CPU's many-row products for a `weights` mode: bfloat16 where the
    CPU has bfloat16 instructions, else float16 (FBGEMM), else float32."""
    if weights in ("bfloat16", "float16", "float32"):
        return weights
    if bf16_kernel_available():
        return "bfloat16"
    return "float16" if _fp16_kernel_available() else "float32"


class LlamaWeights:
    """The weights `LlamaRunner` computes with, read once from a transformers model and shared
    by every runner of that model. `weights` (see the module docstring): "auto" keeps a GGUF
    file's quantized blocks (`gguf`) for steps of few rows where torch's int4 kernel is fast
    here, and the float format (`float_format`) for the rest; "quantized" keeps the blocks
    alone (every step through them; tensors whose format has no int4 form stay float);
    "bfloat16", "float16", "float32" keep that float format alone."""

    def __init__(self, model: Any, *, weights: str = "auto", gguf: GGUFWeights | None = None):
        if weights not in WEIGHT_MODES:
            raise ValueError(f"weights must be one of {', '.join(WEIGHT_MODES)}, not {weights!r}")
        config = model.config
        self.device: torch.device = model.device
        self.dtype: torch.dtype = model.dtype
        self.logits_width = int(model.get_output_embeddings().weight.shape[0])
        self.heads, self.kv_heads, self.head_dim = attention_heads(config)
        self.eps = config.rms_norm_eps
        self.context = int(config.max_position_embeddings)
        on_cpu = self.device.type == "cpu" and self.dtype == torch.float32
        if weights == "bfloat16" and on_cpu and not bf16_kernel_available():
            raise ValueError("bfloat16 weights need a CPU with bfloat16 instructions (AMX or "
                             "AVX512-BF16; this one has neither)")
        if weights == "quantized" and not (on_cpu and gguf is not None):
            raise ValueError("quantized weights need a GGUF model on the CPU")
        self.quantized = weights == "quantized" or (
            weights == "auto" and on_cpu and gguf is not None and int4_kernel_fast())
        self.weight_format = float_format(weights) if on_cpu else "float32"
        blocks = gguf if self.quantized else None
        # With bfloat16 products the rows are rounded to bfloat16 anyway: on a CPU with AMX
        # keys and values are kept so too, which halves what attention reads (the bound of a
        # CPU decode step). Without AMX the attention kernel is slower on bfloat16 than the
        # reads it saves (a 2-core AVX512-BF16 EPYC, SmolLM2, 32 one-token rows: 47.2 ms a
        # step against 33.2 with a float32 cache).
        self.cache_dtype = (torch.bfloat16 if self.weight_format == "bfloat16" and _amx()
                            else self.dtype)
        floats = None if weights == "quantized" else self.weight_format
        decoder = model.model
        with torch.no_grad():
            self.embed = decoder.embed_tokens.weight.detach()
            self.layers = [self._layer(layer, index, floats, blocks)
                           for index, layer in enumerate(decoder.layers)]
            self.norm = decoder.norm.weight.detach()
            head = model.get_output_embeddings()
            self.lm_head = self._linear(head.weight.detach(), getattr(head, "bias", None),
                                        floats, blocks.output() if blocks else None)
            positions = torch.arange(self.context, device=self.device)[None]
            probe = torch.zeros(1, dtype=self.dtype, device=self.device)
            cos, sin = decoder.rotary_emb(probe, positions)
        # RoPE as x * cos + roll(x, half) * sin_signed: rotate_half(x) is roll(x, half) with
        # its first half negated, so the sign goes into the table (one op less per layer).
        half = self.head_dim // 2
        self.cos = cos[0].to(self.dtype)  # (context, head_dim)
        self.sin_signed = torch.cat((-sin[0, :, :half], sin[0, :, half:]), dim=-1).to(self.dtype)

    def _float_form(self, floats: str | None, quantized: QuantizedWeight | None) -> str | None:
        """A product's float format: `floats`, or with none (quantized weights alone) the
        weights' own format where the tensor has no quantized form."""
        return floats or (None if quantized else self.weight_format)

    def _linear(self, weight: torch.Tensor, bias: torch.Tensor | None, floats: str | None,
                quantized: QuantizedWeight | None) -> _Linear:
        return _Linear(weight, bias, self._float_form(floats, quantized), quantized)

    def _layer(self, layer: Any, index: int, floats: str | None,
               blocks: GGUFWeights | None) -> _Layer:
        attention, mlp = layer.self_attn, layer.mlp
        qkv = [attention.q_proj, attention.k_proj, attention.v_proj]
        q_norm = getattr(attention, "q_norm", None)
        k_norm = getattr(attention, "k_norm", None)

        def quantized(product: str) -> QuantizedWeight | None:
            return blocks.layer(index, product) if blocks else None

        gate_up = quantized("gate_up")
        return _Layer(
            attention_norm=layer.input_layernorm.weight.detach(),
            qkv=self._linear(torch.cat([p.weight for p in qkv]), _cat_bias(*qkv), floats,
                             quantized("qkv")),
            q_norm=None if q_norm is None else q_norm.weight.detach(),
            k_norm=None if k_norm is None else k_norm.weight.detach(),
            out=self._linear(attention.o_proj.weight, attention.o_proj.bias, floats,
                             quantized("out")),
            mlp_norm=layer.post_attention_layernorm.weight.detach(),
            gated=_GatedMLP(mlp.gate_proj, mlp.up_proj, self._float_form(floats, gate_up),
                            gate_up),
            down=self._linear(mlp.down_proj.weight, mlp.down_proj.bias, floats,
                              quantized("down")),
        )


class _SlotCache:
    """Keys and values of the sequences of one length tier: per layer `(2, slots, kv_heads,
    time, head_dim)` in one tensor, a slot per sequence, grown by doubling up to the tier's
    `limit` tokens; a sequence that leaves gives its slot to the last one, so the live slots
    are always a prefix and attention reads runs of slots in place."""

    def __init__(self, weights: LlamaWeights, limit: int):
        self.weights, self.limit = weights, limit
        self.kv: torch.Tensor = torch.empty(0)
        self.slots_cap = self.time_cap = 0
        self.seqs: list[int] = []  # the sequence in each live slot
        self.lengths: list[int] = []
        self.slot: dict[int, int] = {}

    def add(self, seq: int, length: int) -> int:
        """A slot for `seq` with room for `length` tokens (their keys and values unset)."""
        slot = len(self.seqs)
        self.reserve(slot + 1, max(length, 1))
        self.seqs.append(seq)
        self.lengths.append(length)
        self.slot[seq] = slot
        return slot

    def remove(self, seq: int) -> None:
        slot = self.slot.pop(seq)
        last = len(self.seqs) - 1
        if slot != last:  # the last slot moves into the hole
            length = self.lengths[last]
            self.kv[:, :, slot, :, :length] = self.kv[:, :, last, :, :length]
            moved = self.seqs[last]
            self.seqs[slot], self.lengths[slot] = moved, length
            self.slot[moved] = slot
        self.seqs.pop()
        self.lengths.pop()

    def release(self) -> None:
        """Give the memory back (the tier is empty)."""
        self.kv = torch.empty(0)
        self.slots_cap = self.time_cap = 0

    def tokens(self, seq: int, length: int) -> torch.Tensor:
        """(layers, 2, kv_heads, length, head_dim): a view of `seq`'s first tokens."""
        return self.kv[:, :, self.slot[seq], :, :length]

    def reserve(self, slots: int, time: int) -> None:
        """Grow (doubling, within the tier's limit) to hold `slots` sequences of `time`
        tokens."""
        w = self.weights
        if slots <= self.slots_cap and time <= self.time_cap:
            return
        new_slots = max(slots, self.slots_cap, 1)
        if slots > self.slots_cap:
            new_slots = max(slots, 2 * self.slots_cap)
        new_time = self.time_cap
        if time > self.time_cap:
            new_time = min(self.limit, max(time, 2 * self.time_cap, 256))
        shape = (len(w.layers), 2, new_slots, w.kv_heads, new_time, w.head_dim)
        kv = torch.zeros(shape, dtype=w.cache_dtype, device=w.device)
        if self.slots_cap and self.time_cap:
            live, longest = len(self.seqs), max(self.lengths, default=0)
            kv[:, :, :live, :, :longest] = self.kv[:, :, :live, :, :longest]
        self.kv = kv
        self.slots_cap, self.time_cap = new_slots, new_time


def tier_limits(first: int, context: int) -> list[int]:
    """The longest sequence each tier of the cache holds: `first`, then 4 times the last, up
    to the context."""
    limits = [min(first, context)]
    while limits[-1] < context:
        limits.append(min(4 * limits[-1], context))
    return limits


class LlamaRunner:
    """A `SequenceRunner` (engine/runner.py) over `LlamaWeights`, with its own KV cache.

    The cache is a few `_SlotCache` tiers by length (`tier_limits`: up to `first_tier` tokens,
    then 4 times as many each): a tier's tensor is as long as its longest sequence for every
    slot, so one long sequence among short ones would otherwise size all of their slots (one
    7,000-token prompt beside 31 short requests: 11.25 GiB of SmolLM2 cache, 19 GB peak). A
    sequence moves up a tier when it outgrows its own (a copy of its keys and values, once per
    tier), and a tier above the first gives its memory back when its last sequence leaves. So
    a long sequence lengthens only the slots of its own tier, whose sequences are at least a
    quarter as long. Attention runs per tier; with every sequence in the first (the usual
    case) a step makes the same calls as with one cache."""

    def __init__(self, weights: LlamaWeights, first_tier: int = 1024,
                 one_row: OneRowStep | None = None):
        self.weights = weights
        # a lone sequence's one-token step as one compiled graph, once it is built
        self.one_row = one_row
        self.device = weights.device
        self.logits_width = weights.logits_width
        self.token_bytes = (len(weights.layers) * 2 * weights.kv_heads * weights.head_dim
                            * weights.cache_dtype.itemsize)
        self._tiers = [_SlotCache(weights, limit)
                       for limit in tier_limits(first_tier, weights.context)]
        self._tier: dict[int, _SlotCache] = {}  # each sequence's tier
        # The saved prefix a sequence shares (`share`: a saved cache and how many of its tokens):
        # its first tokens' keys and values, the same in every sequence that began with it, so
        # one-token steps read them once for all.
        self._prefix: dict[int, tuple[torch.Tensor, int]] = {}
        self._next = 0

    # ----------------------------------------------------------------- sequences
    def _tier_for(self, length: int) -> _SlotCache:
        if length > self.weights.context:
            raise ValueError(f"a sequence of {length} tokens exceeds the context "
                             f"({self.weights.context})")
        return next(tier for tier in self._tiers if length <= tier.limit)

    def _place(self, length: int) -> tuple[int, _SlotCache, int]:
        """A new sequence with room for `length` tokens: (its id, its tier, its slot)."""
        seq, self._next = self._next, self._next + 1
        tier = self._tier_for(length)
        self._tier[seq] = tier
        return seq, tier, tier.add(seq, length)

    @torch.inference_mode()
    def add(self) -> int:
        seq, _, _ = self._place(0)
        return seq

    @torch.inference_mode()
    def fork(self, seq: int) -> int:
        length = self.length(seq)
        new, tier, slot = self._place(length)
        tier.kv[:, :, slot, :, :length] = self._tier[seq].tokens(seq, length)
        if seq in self._prefix:
            self._prefix[new] = self._prefix[seq]
        return new

    @torch.inference_mode()
    def remove(self, seq: int) -> None:
        tier = self._tier.pop(seq, None)
        if tier is None:
            return
        self._prefix.pop(seq, None)
        self._leave(tier, seq)

    def length(self, seq: int) -> int:
        tier = self._tier[seq]
        return tier.lengths[tier.slot[seq]]

    @torch.inference_mode()
    def save(self, seq: int, length: int) -> torch.Tensor:
        """(layers, 2, kv_heads, length, head_dim): only the tokens, not the slot's room."""
        return self._tier[seq].tokens(seq, min(length, self.length(seq))).clone()

    @torch.inference_mode()
    def restore(self, saved: torch.Tensor, length: int | None = None) -> int:
        length = saved.shape[-2] if length is None else length
        seq, tier, slot = self._place(length)
        tier.kv[:, :, slot, :, :length] = saved[..., :length, :]
        return seq

    def share(self, seq: int, saved: torch.Tensor, length: int) -> None:
        self._prefix[seq] = (saved, length)

    @torch.inference_mode()
    def expect(self, seq: int, length: int) -> None:
        """A long prompt goes to its tier before its first chunk, rather than lengthening the
        tiers below it chunk by chunk on its way up."""
        self._grow(seq, length)

    def truncate(self, seq: int, length: int) -> None:
        """The cache past `length` is left as it is: no call reads a slot past its length."""
        tier = self._tier[seq]
        slot = tier.slot[seq]
        if not 0 <= length <= tier.lengths[slot]:
            raise ValueError(f"cannot truncate a sequence of {tier.lengths[slot]} tokens to "
                             f"{length}")
        tier.lengths[slot] = length

    def _grow(self, seq: int, length: int) -> None:
        """Room for `seq` to hold `length` tokens: in its tier, or by moving it up to the tier
        that holds that many (its keys and values copied)."""
        tier = self._tier[seq]
        if length <= tier.limit:
            return
        kept = self.length(seq)
        target = self._tier_for(length)
        slot = target.add(seq, kept)
        target.reserve(len(target.seqs), length)
        target.kv[:, :, slot, :, :kept] = tier.tokens(seq, kept)
        self._leave(tier, seq)
        self._tier[seq] = target

    def _leave(self, tier: _SlotCache, seq: int) -> None:
        """`seq` leaves `tier`, which gives its memory back if it was the last there (the
        first tier keeps its room)."""
        tier.remove(seq)
        if not tier.seqs and tier is not self._tiers[0]:
            tier.release()

    # ----------------------------------------------------------------- forward
    @torch.inference_mode()
    def forward(self, chunks: Sequence[Chunk], scored: Sequence[int] | None = None,
                ) -> torch.Tensor:
        w, device = self.weights, self.device
        sizes = [len(tokens) for _, tokens in chunks]
        if min(sizes, default=0) < 1:
            raise ValueError("every chunk needs at least one token")
        if scored is not None and not all(1 <= keep <= size
                                          for keep, size in zip(scored, sizes, strict=True)):
            raise ValueError("each chunk's scored tokens must be 1 to its length")
        starts = [self.length(seq) for seq, _ in chunks]
        for (seq, _), start, size in zip(chunks, starts, sizes, strict=True):
            self._grow(seq, start + size)
        if self.one_row is not None and sizes == [1]:
            logits = self._one_row(chunks[0], starts[0])
            if logits is not None:
                return logits
        first_rows = [0]
        for size in sizes:
            first_rows.append(first_rows[-1] + size)
        last_rows = [end - 1 for end in first_rows[1:]]
        tokens = torch.tensor([t for _, chunk in chunks for t in chunk], dtype=torch.long,
                              device=device)
        position = torch.tensor([p for s, n in zip(starts, sizes, strict=True)
                                 for p in range(s, s + n)], dtype=torch.long, device=device)
        cos, sin = w.cos[position][:, None], w.sin_signed[position][:, None]
        stepping: dict[int, list[int]] = {}  # per tier that steps (by id): its chunks
        for k, (seq, _) in enumerate(chunks):
            stepping.setdefault(id(self._tier[seq]), []).append(k)
        parts = [self._tier_part(members, chunks, starts, sizes, first_rows,
                                 whole=len(stepping) == 1)
                 for members in stepping.values()]

        x = F.embedding(tokens, w.embed)
        heads, kv_heads, dim, eps = w.heads, w.kv_heads, w.head_dim, w.eps
        scale = dim**-0.5
        count = x.shape[0]
        for index, layer in enumerate(w.layers):
            h = F.rms_norm(x, (x.shape[-1],), layer.attention_norm, eps)
            qkv = layer.qkv(h)
            q = qkv[:, : heads * dim].view(count, heads, dim)
            k = qkv[:, heads * dim : (heads + kv_heads) * dim].view(count, kv_heads, dim)
            if layer.q_norm is not None:
                q.copy_(F.rms_norm(q, (dim,), layer.q_norm, eps))
                k.copy_(F.rms_norm(k, (dim,), layer.k_norm, eps))
            # RoPE on q and k at once, in place (they are adjacent in qkv).
            qk = qkv[:, : (heads + kv_heads) * dim].view(count, heads + kv_heads, dim)
            turned = qk.roll(dim // 2, dims=-1)
            qk.mul_(cos).addcmul_(turned, sin)
            kv_rows = qkv[:, heads * dim :]
            queries = q.to(w.cache_dtype)
            attended = torch.empty_like(queries)
            for tier, token_rows, cache_rows, plan in parts:
                cache = tier.kv[index]
                written = kv_rows if token_rows is None else kv_rows.index_select(0, token_rows)
                cache.view(-1, dim).index_copy_(
                    0, cache_rows, written.reshape(-1, dim).to(cache.dtype))
                plan.attend(index, queries, cache, scale, attended)
            layer.out.add_to(x, attended.reshape(count, heads * dim))
            h = F.rms_norm(x, (x.shape[-1],), layer.mlp_norm, eps)
            layer.down.add_to(x, layer.gated(h))
        for (seq, _), start, size in zip(chunks, starts, sizes, strict=True):
            tier = self._tier[seq]
            tier.lengths[tier.slot[seq]] = start + size
        rows = last_rows if scored is None else [
            row for last, keep in zip(last_rows, scored, strict=True)
            for row in range(last - keep + 1, last + 1)]
        h = F.rms_norm(x[torch.tensor(rows, dtype=torch.long, device=device)], (x.shape[-1],),
                       w.norm, eps)
        return w.lm_head(h).float()

    def _one_row(self, chunk: Chunk, start: int) -> torch.Tensor | None:
        """A lone one-token chunk's logits through the compiled step, which returns its keys
        and values to write; None where the step does not take these shapes."""
        seq, (token,) = chunk
        # what the step reads: the slot's positions up to the next multiple of
        # `ONE_ROW_SPAN` past the token, not the tier's whole capacity (at 100 tokens in a
        # 256-token slot: 4.8 ms a step against 5.3); and a span of room beyond (up a tier if
        # need be), so that the part read is never the whole slot, which the step's graphs
        # do not take (but within a span of the model's context, where steps run eagerly)
        held = -(-(start + 1) // ONE_ROW_SPAN) * ONE_ROW_SPAN
        room = min(held + ONE_ROW_SPAN, self.weights.context)
        self._grow(seq, room)
        tier = self._tier[seq]
        tier.reserve(len(tier.seqs), room)
        slot = tier.slot[seq]
        saved, begin = self._prefix.get(seq, (None, 0))
        result = self.one_row(token, tier.kv[:, :, slot, :, :held],  # type: ignore[misc]
                              begin, start, saved)
        if result is None:
            return None
        logits, written = result
        tier.kv[:, :, slot, :, start] = written
        tier.lengths[slot] = start + 1
        return logits

    def _tier_part(self, members: list[int], chunks: Sequence[Chunk], starts: list[int],
                   sizes: list[int], first_rows: list[int], whole: bool,
                   ) -> tuple[_SlotCache, torch.Tensor | None, torch.Tensor, _AttentionPlan]:
        """What one tier's chunks (`members`, indices into `chunks`) need in every layer: the
        tier, its tokens' packed rows (None: every row, the step's only tier), where their keys
        and values go, and how they attend."""
        w, device = self.weights, self.device
        tier = self._tier[chunks[members[0]][0]]
        tier.reserve(len(tier.seqs), max(starts[k] + sizes[k] for k in members))
        slots = [tier.slot[chunks[k][0]] for k in members]
        slot_of_token = torch.tensor([slot for slot, k in zip(slots, members, strict=True)
                                      for _ in range(sizes[k])], dtype=torch.long, device=device)
        position = torch.tensor([p for k in members
                                 for p in range(starts[k], starts[k] + sizes[k])],
                                dtype=torch.long, device=device)
        token_rows = None if whole else torch.tensor(
            [r for k in members for r in range(first_rows[k], first_rows[k] + sizes[k])],
            dtype=torch.long, device=device)
        # where each token's keys and values go: rows (key or value, token's slot, kv head,
        # position) of a layer's cache viewed as (2 * slots * kv_heads * time, head_dim); one
        # index_copy_ a layer (advanced indexing with two index tensors took twice as long)
        part = torch.arange(2, device=device)[None, :, None]
        head = torch.arange(w.kv_heads, device=device)[None, None, :]
        cache_rows = (((part * tier.slots_cap + slot_of_token[:, None, None]) * w.kv_heads + head)
                      * tier.time_cap + position[:, None, None]).reshape(-1)
        cascade = device.type == "cpu"
        prefixes = [self._prefix.get(chunks[k][0]) if cascade and sizes[k] <= BATCHED_CHUNK
                    else None for k in members]
        plan = _AttentionPlan(slots, [starts[k] for k in members], [sizes[k] for k in members],
                              [first_rows[k] for k in members], prefixes, w.heads,
                              w.heads // w.kv_heads, w.cache_dtype, device)
        return tier, token_rows, cache_rows, plan


# The compiled one-row step reads a slot's cache in spans of this many positions.
ONE_ROW_SPAN = 64

# Chunks of at most this many tokens (one sampled token, or the few a grammar forces after
# it) attend in the one batched call; longer ones (prompt chunks) in a call of their own.
BATCHED_CHUNK = 16


@dataclass
class _Batch:
    """One attention call for chunks of at most `BATCHED_CHUNK` tokens, over their own slots
    in slot order (`_run_read`): each chunk's tokens (packed `rows`) are queries `offsets` of
    batch entry `entries`, padded to the longest chunk. Query j
    of an entry sees the cache up to its own position; padding queries see position 0 only (no
    NaN rows). Slots outside the call are not read: a step's few forced chunks beside rows that
    attend elsewhere (`_SharedPrefix`) would otherwise read every sequence's cache again."""

    rows: torch.Tensor
    entries: torch.Tensor
    offsets: torch.Tensor
    slots: slice | torch.Tensor
    count: int  # entries
    queries: int
    time: int
    mask: torch.Tensor | None

    @classmethod
    def of(cls, members: list[int], rows: list[int], slots: list[int], starts: list[int],
           sizes: list[int], dtype: torch.dtype, device: torch.device) -> _Batch:
        members = sorted(members, key=slots.__getitem__)  # a run of slots reads in place
        queries = max(sizes[i] for i in members)
        last_seen = torch.zeros(len(members), queries, dtype=torch.long)
        for k, i in enumerate(members):
            last_seen[k, : sizes[i]] = torch.arange(starts[i], starts[i] + sizes[i])
        time = int(last_seen.max()) + 1
        hidden = (torch.arange(time)[None, None, :] > last_seen[:, :, None])[:, None]
        # on a CPU, the kernel's own additive mask (SDPA converted a boolean one every call);
        # none where nothing is hidden (one-token rows as long as each other: one row at 100
        # positions, 25 us a layer against 42 with a mask of zeros)
        mask = (None if not bool(hidden.any()) else
                _additive(hidden, dtype) if device.type == "cpu" else ~hidden)

        def tensor(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.long, device=device)

        return cls(rows=_run_read([rows[i] + j for i in members for j in range(sizes[i])],
                                  device),
                   entries=tensor([k for k, i in enumerate(members) for _ in range(sizes[i])]),
                   offsets=tensor([j for i in members for j in range(sizes[i])]),
                   slots=_run_read([slots[i] for i in members], device),
                   count=len(members), queries=queries, time=time,
                   mask=None if mask is None else mask.to(device))

    def attend(self, q: torch.Tensor, cache: torch.Tensor, scale: float,
               out: torch.Tensor) -> None:
        if self.queries == 1:  # a token per entry, in entry order: nothing to pad
            query = q[self.rows][:, :, None]
        else:
            query = q.new_zeros((self.count, q.shape[1], self.queries, q.shape[2]))
            query[self.entries, :, self.offsets] = q[self.rows]
        keys, values = _take(cache, self.slots, 0, self.time)
        if query.device.type == "cpu":  # query heads h read kv head h // group in the kernel
            result = _flash_attention(query, keys, values, attn_mask=self.mask, scale=scale)[0]
        else:
            result = F.scaled_dot_product_attention(query, keys, values, attn_mask=self.mask,
                                                    scale=scale, enable_gqa=True)
        out[self.rows] = result[:, :, 0] if self.queries == 1 else result[
            self.entries, :, self.offsets]


def _run_read(places: list[int], device: torch.device) -> slice | torch.Tensor:
    """How a call reads `places` (cache slots, or the step's packed rows), its k-th item from
    the k-th: a slice where they are a run in order (read in place, written by a copy; the
    usual case, the live slots being a prefix and rows packed in slot order), else an index
    (gathered, scattered)."""
    first = places[0]
    if places == list(range(first, first + len(places))):
        return slice(first, first + len(places))
    return torch.tensor(places, dtype=torch.long, device=device)


def _additive(hidden: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """An attention mask to add to the scores: -inf where `hidden`, else 0."""
    return torch.zeros(hidden.shape, dtype=dtype).masked_fill_(hidden, float("-inf"))


def _take(cache: torch.Tensor, slots: slice | torch.Tensor, begin: int,
          end: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values of the slots' positions `begin:end` in a layer's cache (2, slots,
    kv_heads, time, head_dim): views of a run, else copies (`index_select` of each: half the
    time of advanced indexing on the time-sliced cache; one `index_select` of both along the
    slots made a 32-row step with 8 forced chunks take 115 ms against 82)."""
    if isinstance(slots, slice):
        return cache[0, slots, :, begin:end], cache[1, slots, :, begin:end]
    return (cache[0, :, :, begin:end].index_select(0, slots),
            cache[1, :, :, begin:end].index_select(0, slots))


class _AttentionPlan:
    """How the packed rows of one forward attend, each kind in as few calls as it can: the
    chunks of at most `BATCHED_CHUNK` tokens (a sampled token and those a grammar forces after
    it) of sequences that began with the same saved prefix together (`_SharedPrefix`); the
    other one-token rows (decoding) in one `_Batch`; the other forced chunks in another, padded
    to the longest of them (padding every row to it made one jump-forward cost each row up
    to 16 queries; a call per forced chunk made constrained rows cost several times plain
    ones); each longer chunk (a prompt chunk) in a call of its own. Built once per forward
    and cache tier, used by every layer. `rows`: each chunk's first row in the step's packed
    rows; `heads`: query heads; `group`: query heads per key/value head."""

    def __init__(self, slots: list[int], starts: list[int], sizes: list[int], rows: list[int],
                 prefixes: list[tuple[torch.Tensor, int] | None], heads: int, group: int,
                 dtype: torch.dtype, device: torch.device):
        # a shared prefix (`LlamaRunner.share`): a saved cache and how many of its tokens
        sharing: dict[tuple[int, int], list[int]] = {}
        # in slot order, so that their own parts are read in place where the slots are a run
        # (in chunk order, 32 tool-call rows that joined at different times were gathered,
        # copying every row's own part of the cache: 13 ms of an 80 ms step)
        for i in sorted(range(len(prefixes)), key=slots.__getitem__):
            if prefixes[i] is not None:
                saved, length = prefixes[i]
                sharing.setdefault((id(saved), length), []).append(i)
        self.shared = [_SharedPrefix(*prefixes[members[0]], [rows[i] for i in members],
                                     [slots[i] for i in members], [starts[i] for i in members],
                                     [sizes[i] for i in members], heads, group, dtype)
                       for members in sharing.values()]
        single = [i for i, size in enumerate(sizes) if size == 1 and prefixes[i] is None]
        forced = [i for i, size in enumerate(sizes)
                  if 1 < size <= BATCHED_CHUNK and prefixes[i] is None]
        self.batches = [_Batch.of(members, rows, slots, starts, sizes, dtype, device)
                        for members in (single, forced) if members]
        self.chunks = []
        for i, size in enumerate(sizes):
            if size > BATCHED_CHUNK:
                end = starts[i] + size
                query = torch.arange(starts[i], end)[:, None]
                mask = (torch.arange(end)[None, :] <= query).to(device)
                self.chunks.append((rows[i], rows[i] + size, slots[i], end, mask))

    def attend(self, layer: int, q: torch.Tensor, cache: torch.Tensor, scale: float,
               out: torch.Tensor) -> None:
        """Write the planned rows' attention into `out`; `cache`: the layer's keys and values
        (2, slots, kv_heads, time, head_dim)."""
        for shared in self.shared:
            shared.attend(layer, q, cache, scale, out)
        for batch in self.batches:
            batch.attend(q, cache, scale, out)
        for first, stop, slot, end, mask in self.chunks:
            keys, values = _take(cache, slice(slot, slot + 1), 0, end)
            result = F.scaled_dot_product_attention(
                q[first:stop].transpose(0, 1)[None], keys, values, attn_mask=mask, scale=scale,
                enable_gqa=True)
            out[first:stop] = result[0].transpose(0, 1)


class _SharedPrefix:
    """Cascade attention for the short chunks (a sampled token and the tokens a grammar forces
    after it, or a prompt's last few tokens after its restored prefix) of sequences that began
    with the same saved prefix (a chat server's system prompt and tool definitions,
    `engine/prefix_cache.py`): all their queries attend to the prefix in one call that reads it
    once, and to the chunks' own tokens after it (`_OwnPart`); the parts are merged by their
    log-sum-exp.
    The own part takes two calls: every chunk's first token, one query per slot, read in place;
    the tokens forced after it, in their few slots (gathered), padded to the longest. The
    tokens are taken in that order (the chunks' first tokens, then the forced ones), so the
    calls' results join by one concatenation. One call padding every chunk to the longest
    forced chunk was no faster with chunks of 2 and slower with longer ones (32 rows, a
    server's step of 7 forced chunks of 2-4 tokens: 61.5 ms against 60.9; one chunk of 4:
    60.9 against 55.7).
    Attention on a CPU is bound by reading the cache: read per row, a 256-token tool block made
    a tool-call row's step cost 3x a plain one's at 32 rows, and forced chunks that read it per
    row cost a tool-call step a sixth of its time. The prefix call takes the query heads as
    they are, the kernel reading each one's key/value head, through views (alone, at 32 tokens:
    106 us a layer against 129 with a group's heads as its key/value head's queries, which took
    three copies; in a step, within noise). CPU only (the attention kernel that returns the
    log-sum-exp is the CPU one)."""

    def __init__(self, saved: torch.Tensor, begin: int, rows: list[int], slots: list[int],
                 starts: list[int], sizes: list[int], heads: int, group: int,
                 dtype: torch.dtype):
        self.prefix = saved[..., :begin, :]  # (layers, 2, kv_heads, begin, head_dim)
        model = (heads, group, begin, dtype)  # what both own-part calls take alike
        forced = [k for k, size in enumerate(sizes) if size > 1]
        self.own = [_OwnPart(0, slots, starts, [1] * len(sizes), *model)]
        if forced:
            self.own.append(_OwnPart(len(rows), [slots[k] for k in forced],
                                     [starts[k] + 1 for k in forced],
                                     [sizes[k] - 1 for k in forced], *model))
        order = rows + [rows[k] + j for k in forced for j in range(1, sizes[k])]
        self.tokens = _run_read(order, torch.device("cpu"))

    def attend(self, layer: int, q: torch.Tensor, cache: torch.Tensor, scale: float,
               out: torch.Tensor) -> None:
        mine = q[self.tokens]  # query head h reads kv head h // group
        prefix_out, prefix_lse = _flash_attention(
            mine.transpose(0, 1)[None], self.prefix[layer, 0][None], self.prefix[layer, 1][None],
            scale=scale)
        prefix_out, prefix_lse = prefix_out[0].transpose(0, 1), prefix_lse[0].transpose(0, 1)
        parts = [part.attend(mine, cache, scale) for part in self.own]
        own_out, own_lse = parts[0] if len(parts) == 1 else (
            torch.cat([part[0] for part in parts]), torch.cat([part[1] for part in parts]))
        # the own part's share of the softmax mass: e^own / (e^prefix + e^own)
        own_share = torch.sigmoid(own_lse - prefix_lse)[..., None].to(own_out.dtype)
        out[self.tokens] = torch.lerp(prefix_out, own_out, own_share)


class _OwnPart:
    """Chunks after a shared prefix (`_SharedPrefix`) attending to their own tokens after it, in
    one call: entry k's `sizes[k]` queries, the next tokens of the shared order from `first`
    (entry by entry), at positions `starts[k]`..., are the queries of slot `slots[k]` (read in
    place where the slots are a run), seeing the keys from the prefix's end (`begin`) to their
    own. One query per entry (the usual step): its heads as they are, the kernel mapping them
    to key/value heads (at 32 rows, 267 us a layer against 344 with a group's heads as one
    head's queries). Several: padded to the longest, a group's heads and an entry's queries as
    its key/value head's queries (32 entries of 2 queries: 244 us against 529 with the heads
    as they are), laid out and taken back by one `index_select` each, with indices built here:
    this runs in every layer, where the gathers, scatters and copies it replaced cost more
    than the call (a server's step of 32 rows with 7 forced chunks: 60.9 ms against 62.2)."""

    def __init__(self, first: int, slots: list[int], starts: list[int], sizes: list[int],
                 heads: int, group: int, begin: int, dtype: torch.dtype):
        self.first, self.count = first, sum(sizes)
        self.begin = begin
        self.end = max(start + size for start, size in zip(starts, sizes, strict=True))
        self.slots = _run_read(slots, torch.device("cpu"))
        entries, queries = len(sizes), max(sizes)
        self.entries, self.queries = entries, queries
        self.layout = (entries, heads // group, queries * group)
        # query j of an entry at `start` is at start + j and sees its slot up to there (a
        # padding query sees as much as its entry's last)
        seen = torch.tensor(starts)[:, None] + torch.arange(queries)[None, :]
        hidden = torch.arange(begin, self.end)[None, None, :] > seen[:, :, None]
        self.mask = None  # where nothing is hidden, as in `_Batch`
        if bool(hidden.any()):
            mask = _additive(hidden, dtype)
            self.mask = (mask.repeat_interleave(group, dim=1) if queries > 1 else mask)[:, None]
        if queries == 1:
            return
        # the call's query rows, (entry, kv head, query, head of the group), as rows of the
        # flat (token, head) queries (a padding query repeats its entry's last token)
        bases = [first + sum(sizes[:k]) for k in range(entries)]
        places = torch.tensor([[base + min(j, size - 1) for j in range(queries)]
                               for base, size in zip(bases, sizes, strict=True)])
        head = torch.arange(heads).view(heads // group, 1, group)
        self.gather = (places.view(entries, 1, queries, 1) * heads + head).reshape(-1)
        # and back: each (token, head)'s row of the call's flat output
        entry = torch.tensor([k for k, size in enumerate(sizes) for _ in range(size)])
        query = torch.tensor([j for size in sizes for j in range(size)])
        kv, member = torch.arange(heads) // group, torch.arange(heads) % group
        self.back = (((entry[:, None] * (heads // group) + kv) * queries + query[:, None])
                     * group + member).reshape(-1)

    def attend(self, mine: torch.Tensor, cache: torch.Tensor,
               scale: float) -> tuple[torch.Tensor, torch.Tensor]:
        """`mine`: the shared prefix's queries (tokens, heads, dim); the output (tokens, heads,
        dim) and log-sum-exp (tokens, heads) of this part's tokens."""
        _, heads, dim = mine.shape
        keys, values = _take(cache, self.slots, self.begin, self.end)
        if self.queries == 1:
            out, lse = _flash_attention(mine[self.first : self.first + self.count, :, None],
                                        keys, values, attn_mask=self.mask, scale=scale)
            return out[:, :, 0], lse[:, :, 0]
        query = mine.reshape(-1, dim).index_select(0, self.gather).view(*self.layout, dim)
        out, lse = _flash_attention(query, keys, values, attn_mask=self.mask, scale=scale)
        return (out.reshape(-1, dim).index_select(0, self.back).view(-1, heads, dim),
                lse.reshape(-1).index_select(0, self.back).view(-1, heads))


# (output, log-sum-exp of each query's scores): what merging two parts of attention needs
_flash_attention = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
