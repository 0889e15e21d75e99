"""The single stream's decode step (one sequence, one token) as one graph that torch.compile
turns into C++ (inductor's CPU code generation).

Why: a one-row step of a small model is mostly not arithmetic. Eager, each of a layer's ~15
small ops (norms, RoPE, conversions, residual adds, the gate's activation) is a dispatch of a
few microseconds and attention a kernel call per layer. Compiled, a layer's small ops become a
few fused loops and attention a few reductions, while the products stay the same kernel
calls (engine/quantized.py): the same sums in another order (with float32 weights, the eager
logits to float32 rounding; tests/test_compiled_step.py). bench/results/one_row_step.md
measures both paths. What is left of a step besides the products is the launch of ~270
kernels from the generated wrapper (~0.9 ms on SmolLM2, 2 cores).

Dynamo checks guards before each call: only those on the step's arguments and the global
state are kept (`_own_guards`). The graph takes every shape as fixed but the cache's time capacity and, after the first, a
cache slot's strides (how many slots its tier has). No step waits for a compilation (a minute
the first time, then seconds from inductor's on-disk cache): the graphs are built by `warm`,
and a call they do not hold (`fail_on_recompile`) runs eagerly instead.

Attention reads the part of the sequence's cache slot that the runner passes (up to a multiple
of 64 positions past the token, `LlamaRunner._one_row`), masked to the positions it holds
(masking keeps the shapes fixed between steps), plus a shared prefix (`LlamaRunner.share`)
where there is one, plus the step's own key and value, merged in one softmax.
"""

from __future__ import annotations

import logging
import threading
import types
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from pegmask.engine.llama_runner import LlamaWeights

logger = logging.getLogger(__name__)

# Held by a step while it runs a graph and by a build while it compiles one: dynamo's stance
# (compile, or fail rather than compile) is the process's, so a step runs eagerly while any
# build is under way rather than compile in its turn.
_DYNAMO = threading.Lock()


class OneRowStep:
    """`(logits, keys and values)` of one sequence's next token: its embedding through every
    layer of `weights`, attending to the first `begin` positions of a shared prefix (none:
    `begin` 0), to its cache slot's positions `begin:position` after it, and to the token
    itself. The caller
    writes the returned keys and values (layers, 2, kv_heads, head_dim) into the cache."""

    def __init__(self, weights: LlamaWeights):
        self.weights = weights
        self._graph = torch.compile(_own_code(self._step), dynamic=False, fullgraph=True,
                                    options={"guard_filter_fn": _own_guards})
        with torch.inference_mode():  # as the runner's caches are made
            self._no_prefix = torch.zeros(len(weights.layers), 2, weights.kv_heads, 2,
                                          weights.head_dim, dtype=weights.cache_dtype)
        self.ready = False
        self._warming = threading.Lock()
        # steps the graph ran, and steps it left to the eager path (not built yet, shapes it
        # does not hold, another step's graph building)
        self.runs = self.declined = 0

    @staticmethod
    def unsupported(weights: LlamaWeights) -> str | None:
        """Why `OneRowStep` cannot run these weights, or None: a CPU model whose one-row
        products all trace (quantized blocks, or float32 weights) and a C++ compiler."""
        if weights.device.type != "cpu":
            return "the compiled step is for CPUs (a GPU's step is bound by its kernels)"
        products = [weights.lm_head] + [p for layer in weights.layers
                                        for p in (layer.qkv, layer.out, layer.down)]
        gates = [layer.gated.gate_up for layer in weights.layers]
        if any(p is None or not (p.uses_quantized(1) or p.format == "float32")
               for p in products + gates):
            return "some one-row products are neither quantized blocks nor float32 weights"
        from torch._inductor import cpp_builder

        try:
            cpp_builder.get_cpp_compiler()
        except (RuntimeError, OSError) as error:
            return f"inductor finds no C++ compiler ({error})"
        return None

    def warm(self) -> None:
        """Build the graphs (C++ compiled once per machine and torch version, then read from
        inductor's on-disk cache; the shapes: `_build`), once, whoever calls first.

        The build runs on a thread of its own that then ends: its compiled code's OpenMP
        threads go with it. Built on a thread that stays (a server's main thread), they
        slowed every later step on the scheduler's thread twofold, eager ones too (2 cores,
        SmolLM2: 16.9 ms a compiled step against 4.9)."""
        failure: list[BaseException] = []

        def build() -> None:
            try:
                self._build()
            except BaseException as error:  # re-raised on the caller's thread
                failure.append(error)

        thread = threading.Thread(target=build, name="pegmask-compiled-step")
        thread.start()
        thread.join()
        if failure:
            raise failure[0]

    @torch.inference_mode()
    def _build(self) -> None:
        with self._warming:
            if self.ready:
                return
            w = self.weights
            # the first positions of a slot of caches of 1, 2 and 3 slots: the first graph
            # takes the strides of one slot, the second (after the third shape) any. A slot
            # read whole would need two graphs more (dynamo specialises on its contiguity):
            # the runner keeps a span of room past what it reads (`LlamaRunner._one_row`).
            for slots in (1, 2, 3):
                cache = torch.zeros(len(w.layers), 2, slots, w.kv_heads, 256, w.head_dim,
                                    dtype=w.cache_dtype)
                with _DYNAMO:
                    self._run(0, cache[:, :, 0, :, :64], 0, 1, None, compiling=True)
            self.ready = True

    @torch.inference_mode()
    def __call__(self, token: int, own: torch.Tensor, begin: int, position: int,
                 prefix: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The step, or None where the graphs do not hold these shapes (run it eagerly).
        `own`: the first positions of the sequence's cache slot, (layers, 2, kv_heads, time,
        head_dim), a part of the slot (not all of it: see `_build`)."""
        if (not self.ready or own.shape[3] < 2 or (prefix is not None and prefix.shape[3] < 2)
                or not _DYNAMO.acquire(blocking=False)):  # a build elsewhere holds dynamo
            self.declined += 1
            return None
        try:
            result = self._run(token, own, begin, position, prefix)
        except RuntimeError as error:  # dynamo's "recompile in fail_on_recompile stance"
            if "fail_on_recompile" not in str(error).lower():
                raise
            self.declined += 1
            return None
        finally:
            _DYNAMO.release()
        self.runs += 1
        return result

    def _run(self, token: int, own: torch.Tensor, begin: int, position: int,
             prefix: torch.Tensor | None, compiling: bool = False,
             ) -> tuple[torch.Tensor, torch.Tensor]:
        torch._dynamo.mark_dynamic(own, 3)
        if prefix is None:
            prefix = self._no_prefix
        torch._dynamo.mark_dynamic(prefix, 3)
        numbers = torch.tensor([token, position, begin], dtype=torch.long)
        with torch.compiler.set_stance("default" if compiling else "fail_on_recompile"):
            return self._graph(numbers, own, prefix)

    def _step(self, numbers: torch.Tensor, own: torch.Tensor, prefix: torch.Tensor,
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """What dynamo traces: `numbers` holds the token, its position and `begin` (tensors,
        so that no value is a guard)."""
        w = self.weights
        token, position, begin = numbers[0:1], numbers[1:2], numbers[2]
        heads, kv_heads, dim, eps = w.heads, w.kv_heads, w.head_dim, w.eps
        group, scale = heads // kv_heads, dim**-0.5
        x = F.embedding(token, w.embed)
        cos, sin = w.cos[position], w.sin_signed[position]  # (1, head_dim)
        # which cached positions a query sees: the prefix's first `begin`, then its slot's
        # begin:position
        own_time = torch.arange(own.shape[3])
        own_hidden = (own_time < begin) | (own_time >= position)
        prefix_hidden = torch.arange(prefix.shape[3]) >= begin
        written = []
        for index, layer in enumerate(w.layers):
            h = F.rms_norm(x, (x.shape[-1],), layer.attention_norm, eps)
            qkv = layer.qkv(h)[0]
            q = qkv[: heads * dim].view(heads, dim)
            k = qkv[heads * dim : (heads + kv_heads) * dim].view(kv_heads, dim)
            v = qkv[(heads + kv_heads) * dim :].view(kv_heads, dim)
            if layer.q_norm is not None:
                q = F.rms_norm(q, (dim,), layer.q_norm, eps)
                k = F.rms_norm(k, (dim,), layer.k_norm, eps)
            q = q * cos + q.roll(dim // 2, dims=-1) * sin
            k = k * cos + k.roll(dim // 2, dims=-1) * sin
            written.append(torch.stack([k, v]))
            attended = _attend(q.view(kv_heads, group, dim) * scale, k, v,
                               own[index].float(), own_hidden,
                               prefix[index].float(), prefix_hidden)
            x = x + layer.out(attended.reshape(1, heads * dim))
            h = F.rms_norm(x, (x.shape[-1],), layer.mlp_norm, eps)
            x = x + layer.down(layer.gated(h))
        h = F.rms_norm(x, (x.shape[-1],), w.norm, eps)
        return w.lm_head(h).float(), torch.stack(written).to(w.cache_dtype)


def _own_guards(entries: list) -> list[bool]:
    """Which of dynamo's guards a step checks: those on its arguments and on the global state
    (grad mode, the shapes' relations). Not those on what `self` holds (the weights: hundreds
    of tensors and attributes) nor on the modules and functions the step calls, which do not
    change while a step lives: checked, they cost 1.4 ms a step; the graph is this step's
    alone (`_own_code`)."""
    return [entry.name in _ARGUMENTS for entry in entries]


# the names of `OneRowStep._step`'s arguments in dynamo's guards ("": the global state's)
_ARGUMENTS = ("", "numbers", "own", "prefix")


def _own_code(method: Any) -> Any:
    """`method` (bound) over a copy of its function's code: dynamo keeps its graphs per code
    object, and with the guards on `self`'s contents dropped a graph shared between steps
    would run one step's code over another's weights."""
    function = method.__func__
    copy = types.FunctionType(function.__code__.replace(), function.__globals__,
                              function.__name__, function.__defaults__, function.__closure__)
    return types.MethodType(copy, method.__self__)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, own: torch.Tensor,
            own_hidden: torch.Tensor, prefix: torch.Tensor, prefix_hidden: torch.Tensor,
            ) -> torch.Tensor:
    """One query's attention, (kv_heads, group, dim) scaled queries, over three parts in one
    softmax: the cached keys and values (2, kv_heads, time, dim) of the slot and the prefix,
    each with the positions it hides, and the token's own key and value (kv_heads, dim)."""
    hide = float("-inf")
    q = q[:, :, None, :]  # (kv_heads, group, 1, dim)
    # products as multiplications and sums, not matrix products: the compiled code then reads
    # the cache in its own loops (a matrix product per part and layer was 120 calls a step)
    own_scores = (q * own[0][:, None]).sum(-1).masked_fill(own_hidden, hide)
    prefix_scores = (q * prefix[0][:, None]).sum(-1).masked_fill(prefix_hidden, hide)
    self_score = (q[:, :, 0] * k[:, None]).sum(-1)[..., None]
    top = torch.maximum(torch.maximum(own_scores.amax(-1, keepdim=True),
                                      prefix_scores.amax(-1, keepdim=True)), self_score)
    own_weights = (own_scores - top).exp()
    prefix_weights = (prefix_scores - top).exp()
    self_weight = (self_score - top).exp()
    total = own_weights.sum(-1, keepdim=True) + prefix_weights.sum(-1, keepdim=True) + self_weight
    mixed = ((own_weights[..., None] * own[1][:, None]).sum(-2)
             + (prefix_weights[..., None] * prefix[1][:, None]).sum(-2)
             + self_weight * v[:, None])
    return mixed / total
