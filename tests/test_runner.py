"""Sequence runners against transformers' own forward: `LlamaRunner` on tiny random models of
each architecture it computes (and on the embedded SmolLM2), sequences joining, leaving and
being copied between steps or saved and restored, prompt chunks next to one-token steps."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from greedy_bound import greedy_gaps
from tiny_models import ARCHITECTURES, COMMON, tiny_model
from transformers import Qwen3Config, Qwen3ForCausalLM

from pegmask.engine.llama_runner import (
    WEIGHT_MODES,
    LlamaRunner,
    LlamaWeights,
    _SharedPrefix,
    _SlotCache,
    bf16_kernel_available,
    int4_kernel_fast,
    supports,
    tier_limits,
)
from pegmask.engine.model import load_backend
from pegmask.engine.runner import TransformersRunner, attention_heads

# Weight formats the exact-path tests also run in, with their tolerance against transformers'
# float32: bfloat16 (weights, rows and the key/value cache rounded) where the CPU has bfloat16
# instructions.
FORMATS = {"float32": 1e-4, **({"bfloat16": 3e-2} if bf16_kernel_available() else {})}


def weights_in(model: torch.nn.Module, weight_format: str) -> LlamaWeights:
    if weight_format == "bfloat16":
        return LlamaWeights(model, weights="bfloat16")
    return LlamaWeights(model, weights="float32")


def drive(runner, reference) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The same script of joins, chunks, copies and leaves on both runners; each step's logits
    of both."""
    out = []
    a, ra = runner.add(), reference.add()
    out.append((runner.forward([(a, [1, 2, 3, 4, 5])]), reference.forward([(ra, [1, 2, 3, 4, 5])])))
    b, rb = runner.add(), reference.add()
    # b's prompt in two chunks, the first next to a's one-token step.
    out.append((runner.forward([(a, [6]), (b, [7, 8, 9])]),
                torch.cat([reference.forward([(ra, [6])]), reference.forward([(rb, [7, 8, 9])])])))
    out.append((runner.forward([(b, [10, 11]), (a, [12])]),
                torch.cat([reference.forward([(rb, [10, 11])]), reference.forward([(ra, [12])])])))
    c, rc = runner.fork(b), reference.fork(rb)
    out.append((runner.forward([(a, [13]), (b, [14]), (c, [15])]),
                torch.cat([reference.forward([(ra, [13])]), reference.forward([(rb, [14])]),
                           reference.forward([(rc, [15])])])))
    # one-token rows packed in the reverse of their slots' order
    out.append((runner.forward([(c, [22]), (b, [23]), (a, [24])]),
                torch.cat([reference.forward([(rc, [22])]), reference.forward([(rb, [23])]),
                           reference.forward([(ra, [24])])])))
    runner.remove(a)
    reference.remove(ra)
    d, rd = runner.add(), reference.add()
    out.append((runner.forward([(c, [16]), (d, [17, 18]), (b, [19, 20, 21])]),
                torch.cat([reference.forward([(rc, [16])]), reference.forward([(rd, [17, 18])]),
                           reference.forward([(rb, [19, 20, 21])])])))
    assert runner.length(b) == reference.length(rb) == 10
    assert runner.length(c) == 8 and runner.length(d) == 2
    return out


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_llama_runner_matches_transformers(name: str) -> None:
    model = tiny_model(name)
    assert supports(model)
    runner = LlamaRunner(LlamaWeights(model, weights="float32"))
    for ours, theirs in drive(runner, TransformersRunner(model, torch.device("cpu"))):
        assert ours.shape == theirs.shape
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("weight_format", sorted(FORMATS))
@pytest.mark.parametrize("sizes", [(1, 5, 16), (17, 1, 3), (2, 40, 16, 1), (1, 1, 3, 1, 2),
                                   (4, 2), (1, 1)])
def test_short_and_long_chunks_in_one_step(sizes: tuple[int, ...], weight_format: str) -> None:
    """Chunks up to BATCHED_CHUNK tokens attend in one padded call, longer ones alone: one
    step mixing them (forced tokens beside a prompt chunk) gives transformers' logits."""
    model = tiny_model("llama")
    runner = LlamaRunner(weights_in(model, weight_format))
    reference = TransformersRunner(model, torch.device("cpu"))
    seqs = [(runner.add(), reference.add()) for _ in sizes]
    for k, (seq, ref) in enumerate(seqs):  # histories of different lengths
        history = [3 + k + i for i in range(4 + 3 * k)]
        runner.forward([(seq, history)])
        reference.forward([(ref, history)])
    chunks = [[7 + i + j for i in range(size)] for j, size in enumerate(sizes)]
    ours = runner.forward([(seq, chunk) for (seq, _), chunk in zip(seqs, chunks, strict=True)])
    theirs = torch.cat([reference.forward([(ref, chunk)])
                        for (_, ref), chunk in zip(seqs, chunks, strict=True)])
    tolerance = FORMATS[weight_format]
    torch.testing.assert_close(ours, theirs, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("first_tier", [2, 4, 8])
def test_sequences_in_length_tiers_match_transformers(first_tier: int) -> None:
    """With small tiers every sequence of `drive` outgrows one or two of them mid-script
    (moved up with its keys and values, next to sequences staying below): the same logits."""
    model = tiny_model("qwen3")
    runner = LlamaRunner(LlamaWeights(model, weights="float32"), first_tier=first_tier)
    assert [tier.limit for tier in runner._tiers] == tier_limits(first_tier, 128)
    for ours, theirs in drive(runner, TransformersRunner(model, torch.device("cpu"))):
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)
    assert tier_limits(1024, 8192) == [1024, 4096, 8192]
    assert tier_limits(1024, 512) == [512]


def test_one_long_sequence_does_not_size_the_short_ones_slots() -> None:
    """31 short sequences and one of 100 tokens: the short ones' tier stays as long as they
    need, the long one has a tier of its own, whose memory goes when it leaves; a saved
    prefix restores, and a fork copies, into the tier of its length. Logits stay exact."""
    model = tiny_model("llama")
    runner = LlamaRunner(LlamaWeights(model, weights="float32"), first_tier=16)
    reference = TransformersRunner(model, torch.device("cpu"))
    short = [runner.add() for _ in range(31)]
    runner.forward([(seq, [1 + k % 5, 2, 3]) for k, seq in enumerate(short)])
    long, rlong = runner.add(), reference.add()
    history = [1 + i % 11 for i in range(100)]
    for begin in range(0, 100, 30):  # the prompt in chunks, beside the short rows' steps
        chunk = history[begin : begin + 30]
        ours = runner.forward([(short[0], [4]), (long, chunk), (short[5], [4])])
        torch.testing.assert_close(ours[1:2], reference.forward([(rlong, chunk)]), rtol=1e-4,
                                   atol=1e-4)
    first, _, top = runner._tiers
    assert first.time_cap == 16 and len(first.seqs) == 31
    assert top.seqs == [long] and top.time_cap >= 100 and top.slots_cap == 1
    copy, rcopy = runner.fork(long), reference.fork(rlong)
    saved = runner.save(long, 60)
    restored, rrestored = runner.restore(saved), reference.restore(reference.save(rlong, 60))
    assert runner._tier[copy] is top and runner._tier[restored] is runner._tiers[1]
    ours = runner.forward([(copy, [7]), (short[1], [5]), (restored, [8])])
    torch.testing.assert_close(ours[0:1], reference.forward([(rcopy, [7])]), rtol=1e-4,
                               atol=1e-4)
    torch.testing.assert_close(ours[2:3], reference.forward([(rrestored, [8])]), rtol=1e-4,
                               atol=1e-4)
    for seq in (long, copy, restored):
        runner.remove(seq)
    assert top.kv.numel() == 0 and runner._tiers[1].kv.numel() == 0
    assert first.time_cap == 16


def test_a_tier_grows_by_doubling_within_its_limit() -> None:
    """More slots do not lengthen them; a longer sequence doubles the length (from 256), never
    past the tier's limit; what the live slots hold is kept."""
    cache = _SlotCache(LlamaWeights(tiny_model("llama"), weights="float32"), limit=600)
    for seq in range(5):
        cache.add(seq, 3)
    assert (cache.slots_cap, cache.time_cap) == (8, 256)
    cache.kv[:, :, 4, :, :3] = 1.5
    cache.reserve(5, 300)
    assert (cache.slots_cap, cache.time_cap) == (8, 512)
    cache.reserve(5, 513)
    assert cache.time_cap == 600 and bool((cache.kv[:, :, 4, :, :3] == 1.5).all())


def test_float16_weights_stay_close_to_float32() -> None:
    model = tiny_model("llama")
    exact = drive(LlamaRunner(LlamaWeights(model, weights="float32")),
                  TransformersRunner(model, torch.device("cpu")))
    rounded = drive(LlamaRunner(LlamaWeights(model, weights="float16")),
                    TransformersRunner(model, torch.device("cpu")))
    for (ours, _), (half, _) in zip(exact, rounded, strict=True):
        torch.testing.assert_close(half, ours, rtol=0.0, atol=2e-2)


def test_bfloat16_weights_stay_close_to_float32_where_the_cpu_has_them() -> None:
    model = tiny_model("llama")
    with pytest.raises(ValueError, match="weights must be one of"):
        LlamaWeights(model, weights="float8")
    if not bf16_kernel_available():  # asking for them is a clear error, not a slow fallback
        with pytest.raises(ValueError, match="bfloat16 instructions"):
            LlamaWeights(model, weights="bfloat16")
        return
    weights = LlamaWeights(model, weights="bfloat16")
    assert weights.weight_format == "bfloat16"
    exact = drive(LlamaRunner(LlamaWeights(model, weights="float32")),
                  TransformersRunner(model, torch.device("cpu")))
    rounded = drive(LlamaRunner(weights), TransformersRunner(model, torch.device("cpu")))
    for (ours, _), (half, _) in zip(exact, rounded, strict=True):
        # 0.004 on this model (logits up to 0.7; float16 weights: 0.0005)
        torch.testing.assert_close(half, ours, rtol=0.0, atol=2e-2)


def test_unsupported_architectures_fall_back_to_transformers() -> None:
    model = tiny_model("mistral")
    model.config.sliding_window = 16  # shorter than the context: attention differs
    assert not supports(model)


def test_smollm2_runner_agrees_with_transformers() -> None:
    backend = load_backend(None)
    prompt = backend.encode("<|im_start|>user\nName three colours.<|im_end|>\n"
                            "<|im_start|>assistant\n")
    runner = backend.runner(weights="float32")
    reference = TransformersRunner(backend.model, backend.device)
    seq, ref = runner.add(), reference.add()
    ours, theirs = runner.forward([(seq, prompt)]), reference.forward([(ref, prompt)])
    torch.testing.assert_close(ours, theirs, rtol=1e-3, atol=1e-3)
    token = int(theirs.argmax())
    torch.testing.assert_close(runner.forward([(seq, [token])]),
                               reference.forward([(ref, [token])]), rtol=1e-3, atol=1e-3)
    # The default CPU runner (quantized blocks, bfloat16 or float16) picks the same token.
    fast = backend.runner()
    fast_seq = fast.add()
    assert int(fast.forward([(fast_seq, prompt)]).argmax()) == token


ROUNDED_MODES = ["auto", "quantized", *(["bfloat16"] if bf16_kernel_available() else [])]


@pytest.mark.parametrize("weights", ROUNDED_MODES)
def test_rounded_weights_change_greedy_picks_only_at_near_ties(weights: str) -> None:
    """The documented bound of the rounded weight paths against float32 on SmolLM2 (the GGUF
    file's blocks dequantized, engine/llama_runner.py): teacher-forced on float32's greedy
    tokens, the picks agree on nearly all steps (bfloat16 measured: 98% of 144), and where
    they differ float32's own best two were near-tied (measured: within 0.13). "quantized"
    runs the file's Q4_1 / Q8_0 blocks through the int4 kernel for prompts and steps alike;
    "auto" mixes a float format for the prompt with the blocks for one-token steps."""
    backend = load_backend(None)
    rounded = backend.runner(weights=weights)
    if weights != "bfloat16":
        assert rounded.weights.quantized == (weights == "quantized" or int4_kernel_fast())
    steps, gaps = greedy_gaps(backend, rounded)
    assert len(gaps) <= 0.05 * steps, gaps
    assert all(gap <= 0.25 for gap in gaps), gaps


def test_the_default_weights_follow_the_cpu() -> None:
    backend = load_backend(None)
    default = backend.runner()
    assert default.weights.weight_format == ("bfloat16" if bf16_kernel_available()
                                             else "float16")
    assert default.weights.quantized == int4_kernel_fast()
    if not bf16_kernel_available():  # asking for them is a clear error, not a slow fallback
        with pytest.raises(ValueError, match="bfloat16 instructions"):
            backend.runner(weights="bfloat16")


def test_the_command_line_offers_every_weight_mode() -> None:
    """pegmask/cli.py spells the modes out (it starts without importing torch)."""
    from pegmask.cli import _parser

    serve = _parser()._subparsers._group_actions[0].choices["serve"]
    weights = next(a for a in serve._actions if a.dest == "weights")
    assert tuple(weights.choices) == WEIGHT_MODES


def test_quantized_weights_need_a_gguf_file() -> None:
    with pytest.raises(ValueError, match="GGUF"):
        LlamaWeights(tiny_model("llama"), weights="quantized")
    # auto without a file: float weights only
    assert not LlamaWeights(tiny_model("llama")).quantized


def test_runner_rejects_empty_chunks_and_overlong_sequences() -> None:
    runner = LlamaRunner(LlamaWeights(tiny_model("llama"), weights="float32"))
    seq = runner.add()
    with pytest.raises(ValueError, match="at least one token"):
        runner.forward([(seq, [])])
    with pytest.raises(ValueError, match="exceeds the context"):
        runner.forward([(seq, [1] * 129)])


@pytest.mark.parametrize("first_tier", [1024, 4])
@pytest.mark.parametrize("name", ["llama", "qwen3"])
def test_a_saved_prefix_restores_as_a_sequence_of_its_tokens(name: str, first_tier: int) -> None:
    """Restored whole or in part (a prompt that shares only the beginning of a kept prefix),
    and shared in part (read once for the sequences that began with it, `share`): the
    sequence holds just those tokens and continues as a fresh one would (in one cache tier, or
    in two and moving up)."""
    model = tiny_model(name)
    runner = LlamaRunner(LlamaWeights(model, weights="float32"), first_tier=first_tier)
    reference = TransformersRunner(model, torch.device("cpu"))
    a, ra = runner.add(), reference.add()
    runner.forward([(a, [1, 2, 3, 4, 5, 6])])
    reference.forward([(ra, [1, 2, 3, 4, 5, 6])])
    saved, rsaved = runner.save(a, 5), reference.save(ra, 5)
    runner.remove(a)
    b, rb = runner.restore(saved), reference.restore(rsaved)
    c, rc = runner.restore(saved, 3), reference.restore(rsaved, 3)
    assert runner.length(b) == reference.length(rb) == 5 and reference.length(ra) == 6
    assert runner.length(c) == reference.length(rc) == 3
    runner.share(b, saved, 3)
    runner.share(c, saved, 3)
    for seq, rseq, history in ((b, rb, [1, 2, 3, 4, 5]), (c, rc, [1, 2, 3])):
        fresh = reference.add()
        expected = reference.forward([(fresh, [*history, 9, 10])])
        torch.testing.assert_close(reference.forward([(rseq, [9, 10])]), expected)
        torch.testing.assert_close(runner.forward([(seq, [9, 10])]), expected, rtol=1e-4,
                                   atol=1e-4)


@pytest.mark.parametrize("weight_format", sorted(FORMATS))
@pytest.mark.parametrize("name", ["llama", "qwen3"])
def test_short_chunks_after_a_shared_prefix_match_transformers(name: str, weight_format: str,
                                                              monkeypatch) -> None:
    """Sequences that began with one saved prefix (the one it was saved from, two restored,
    one forked) decode a sampled token, or one with the tokens a grammar forces after it,
    beside a sequence without it: the prefix is read once for all of them (cascade attention),
    and every row's logits stay transformers'."""
    # per forward: (chunks, tokens) reading the prefix once, and the chunks whose tokens after
    # the first attend to their own part in a second call
    shared: list[tuple[int, int, int]] = []
    in_place: list[bool] = []  # per forward: whether the own parts' first call read slots in place
    attend = _SharedPrefix.attend
    monkeypatch.setattr(_SharedPrefix, "attend", lambda self, layer, *args: (
        (shared.append((self.own[0].entries, sum(part.count for part in self.own),
                        self.own[1].entries if len(self.own) > 1 else 0)),
         in_place.append(isinstance(self.own[0].slots, slice))) if layer == 0 else None,
        attend(self, layer, *args)))
    model = tiny_model(name)
    runner = LlamaRunner(weights_in(model, weight_format))
    reference = TransformersRunner(model, torch.device("cpu"))
    tolerance = FORMATS[weight_format]
    prompt = [1 + i % 7 for i in range(9)]
    first, plain = runner.add(), runner.add()
    runner.forward([(first, prompt), (plain, [2, 4, 6])])
    saved = runner.save(first, 8)
    restored = [runner.restore(saved), runner.restore(saved)]
    for seq in (first, *restored):
        runner.share(seq, saved, 8)
    runner.forward([(restored[0], [prompt[8], 3]), (restored[1], [prompt[8]])])
    seqs = [first, plain, *restored, runner.fork(restored[1])]
    histories = [prompt, [2, 4, 6], [*prompt, 3], prompt, prompt]
    # per step, each sequence's chunk size (0: it does not step; then the sharing rows are
    # packed in a run, read in place)
    sizes = [(1, 1, 1, 1, 1), (3, 1, 1, 4, 2), (1, 2, 5, 1, 1), (1, 0, 1, 1, 1), (2, 0, 1, 1, 3)]
    for step, step_sizes in enumerate(sizes):
        stepping = [k for k, size in enumerate(step_sizes) if size]
        chunks = [[5 + (step + k + j) % 4 for j in range(step_sizes[k])] for k in stepping]
        ours = runner.forward([(seqs[k], chunk) for k, chunk in zip(stepping, chunks,
                                                                    strict=True)])
        for row, (k, chunk) in enumerate(zip(stepping, chunks, strict=True)):
            histories[k] = [*histories[k], *chunk]
            fresh = reference.add()
            expected = reference.forward([(fresh, histories[k])])
            reference.remove(fresh)
            torch.testing.assert_close(ours[row : row + 1], expected, rtol=tolerance,
                                       atol=tolerance)
    # the plain sequence leaves (the fork takes its slot), and the rest's chunks come packed in
    # the reverse of their slots' order: read in slot order, in place
    runner.remove(plain)
    order = [3, 2, 4, 0]
    ours = runner.forward([(seqs[k], [6]) for k in order])
    for row, k in enumerate(order):
        histories[k] = [*histories[k], 6]
        fresh = reference.add()
        torch.testing.assert_close(ours[row : row + 1], reference.forward([(fresh,
                                                                            histories[k])]),
                                   rtol=tolerance, atol=tolerance)
        reference.remove(fresh)
    # the restored sequences' prompt ends, then every step's chunks but the plain sequence's
    assert shared == [(2, 3, 1), (4, 4, 0), (4, 10, 3), (4, 8, 1), (4, 4, 0), (4, 7, 2),
                      (4, 4, 0)]
    assert in_place[-1]


@pytest.mark.parametrize("weight_format", sorted(FORMATS))
def test_scored_chunks_and_truncate_match_token_by_token(weight_format: str) -> None:
    """A chunk scored at its last k tokens (a row's draft) gives the logits after each of them,
    as feeding them one at a time does; truncating drops the last tokens as if they had never
    been fed (a shared prefix's rows included). Both runners alike."""
    model = tiny_model("llama")
    tolerance = FORMATS[weight_format]
    for runner in (LlamaRunner(weights_in(model, weight_format)),
                   TransformersRunner(model, torch.device("cpu"))):
        reference = TransformersRunner(model, torch.device("cpu"))
        a, b, ra = runner.add(), runner.add(), reference.add()
        runner.forward([(a, [1, 2, 3, 4, 5, 6]), (b, [9, 8, 7])])
        reference.forward([(ra, [1, 2, 3, 4, 5, 6])])
        logits = runner.forward([(b, [6]), (a, [10, 11, 12, 13])], scored=[1, 3])
        assert logits.shape == (4, model.config.vocab_size)
        one_by_one = torch.cat([reference.forward([(ra, [t])]) for t in (10, 11, 12, 13)])
        torch.testing.assert_close(logits[1:], one_by_one[1:], rtol=tolerance, atol=tolerance)
        runner.truncate(a, 8)  # 12 and 13 were not kept
        reference.truncate(ra, 8)
        assert runner.length(a) == reference.length(ra) == 8
        fresh = reference.add()
        reference.forward([(fresh, [1, 2, 3, 4, 5, 6, 10, 11])])
        torch.testing.assert_close(runner.forward([(a, [20])]), reference.forward([(fresh, [20])]),
                                   rtol=tolerance, atol=tolerance)
    runner = LlamaRunner(weights_in(model, weight_format))
    seq = runner.add()
    with pytest.raises(ValueError, match="1 to its length"):
        runner.forward([(seq, [1, 2])], scored=[3])
    runner.forward([(seq, [1, 2])])
    with pytest.raises(ValueError, match="cannot truncate"):
        runner.truncate(seq, 3)



def test_both_runners_count_a_tokens_keys_and_values_alike():
    """The KV budget divides by `token_bytes`: both runners read the heads and head size alike,
    an explicit head_dim (16, not hidden_size / heads = 8) included."""
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(**COMMON, max_position_embeddings=128,
                                         head_dim=16)).eval()
    expected = 2 * 2 * 2 * 16 * 4  # layers, keys and values, kv heads, head_dim, float32
    assert TransformersRunner(model, torch.device("cpu")).token_bytes == expected
    assert LlamaRunner(weights_in(model, "float32")).token_bytes == expected


def test_attention_heads_fall_back_as_transformers_does():
    bare = SimpleNamespace(num_attention_heads=4, hidden_size=32)
    assert attention_heads(bare) == (4, 4, 8)
    unset = SimpleNamespace(num_attention_heads=4, hidden_size=32, num_key_value_heads=None,
                            head_dim=None)
    assert attention_heads(unset) == (4, 4, 8)
    assert attention_heads(SimpleNamespace(num_attention_heads=4, hidden_size=32,
                                           num_key_value_heads=2, head_dim=16)) == (4, 2, 16)
