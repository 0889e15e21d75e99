"""Bitmask kernels: layout, packing, the torch path, the triton kernel (interpreted on CPU) and
the masked sampler, checked against xgrammar's own CPU implementation."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import pathlib
import subprocess
import sys
import textwrap
import warnings
from dataclasses import dataclass

import numpy as np
import pytest
import torch
import xgrammar

from pegmask.kernels import (
    allocate_token_bitmask,
    apply_token_bitmask_inplace,
    pack_bool_mask,
    reset_token_bitmask,
    sample_masked,
    unpack_bitmask,
)
from pegmask.kernels.bitmask import (
    apply_token_bitmask_torch,
    effective_vocab_size,
    pack_token_ids,
)

VOCAB_SIZES = [1, 31, 32, 33, 100, 4097, 49152, 151936]


def random_bitmask(rows: int, words: int, gen: torch.Generator) -> torch.Tensor:
    return torch.randint(-(2**31), 2**31, (rows, words), dtype=torch.int32, generator=gen)


def few_blocked(rows: int, words: int, blocked: int, gen: torch.Generator) -> torch.Tensor:
    """Every bit set but `blocked` random ones per row: free text's mask (the CPU path masks
    such rows by index)."""
    allowed = np.ones((rows, words * 32), dtype=bool)
    for row in range(rows):
        allowed[row, torch.randint(0, words * 32, (blocked,), generator=gen).numpy()] = False
    return torch.from_numpy(pack_bool_mask(allowed))


def few_allowed(rows: int, words: int, allowed: int, gen: torch.Generator) -> torch.Tensor:
    """No bit set but `allowed` random ones per row: a tool call's JSON between its strings
    (the CPU path keeps those logits and fills the rest)."""
    mask = np.zeros((rows, words * 32), dtype=bool)
    for row in range(rows):
        mask[row, torch.randint(0, words * 32, (allowed,), generator=gen).numpy()] = True
    return torch.from_numpy(pack_bool_mask(mask))


@dataclass
class Case:
    """One apply_token_bitmask_inplace call; `name` says what it exercises."""

    name: str
    logits: torch.Tensor
    bitmask: torch.Tensor
    indices: list[int] | None = None
    vocab_size: int | None = None
    row_padding: int = 0  # apply to a view whose rows are this far apart beyond their width


PAD_VALUE = 123.0


def working_copy(logits: torch.Tensor, row_padding: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(tensor to mask in place, the buffer it lives in): with row padding, a strided view."""
    if not row_padding:
        out = logits.clone()
        return out, out
    shape = (logits.shape[0], logits.shape[1] + row_padding)
    buffer = torch.full(shape, PAD_VALUE, dtype=logits.dtype)
    view = buffer[:, : logits.shape[1]]
    view.copy_(logits)
    return view, buffer


def make_cases() -> list[Case]:
    gen = torch.Generator().manual_seed(1234)

    def logits(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(dtype)

    cases = [
        Case("exact 32 multiple", logits(2, 64), random_bitmask(2, 2, gen)),
        Case("vocab 100", logits(3, 100), random_bitmask(3, 4, gen)),
        Case("big vocab", logits(2, 151936), random_bitmask(2, 4748, gen)),
        Case("odd vocab 4097", logits(1, 4097), random_bitmask(1, 129, gen)),
        Case("logits wider than mask", logits(2, 200), random_bitmask(2, 4, gen)),
        Case("logits narrower than mask", logits(2, 90), random_bitmask(2, 8, gen)),
        Case("explicit vocab_size", logits(2, 160), random_bitmask(2, 5, gen), vocab_size=150),
        Case("indices", logits(4, 300), random_bitmask(4, 10, gen), indices=[3, 1]),
        Case("indices, larger mask batch", logits(2, 70), random_bitmask(5, 3, gen), indices=[1]),
        Case("empty indices", logits(2, 64), random_bitmask(2, 2, gen), indices=[]),
        Case("bfloat16", logits(2, 1000, dtype=torch.bfloat16), random_bitmask(2, 32, gen)),
        Case("float16", logits(3, 333, dtype=torch.float16), random_bitmask(3, 11, gen)),
        Case("1-D", logits(77), random_bitmask(1, 3, gen)[0]),
        Case("all allowed", logits(1, 50), torch.full((1, 2), -1, dtype=torch.int32)),
        Case("none allowed", logits(1, 50), torch.zeros((1, 2), dtype=torch.int32)),
    ]
    cases.append(Case("strided rows", logits(3, 96), random_bitmask(3, 3, gen), row_padding=40))
    mixed = few_blocked(4, 1536, 60, gen)
    mixed[[1, 2]] = random_bitmask(2, 1536, gen)
    cases += [
        Case("few blocked", logits(3, 49152), few_blocked(3, 1536, 60, gen)),
        Case("few and many blocked rows", logits(4, 49152), mixed, indices=[2, 0, 1]),
        Case("few blocked, bfloat16", logits(2, 4096, dtype=torch.bfloat16),
             few_blocked(2, 128, 3, gen)),
        Case("few blocked past vocab_size", logits(2, 4096), few_blocked(2, 128, 6, gen),
             vocab_size=4000),
    ]
    kinds = torch.cat([few_allowed(2, 1536, 40, gen), few_blocked(1, 1536, 60, gen),
                       random_bitmask(1, 1536, gen)])
    cases += [
        Case("few allowed", logits(3, 49152), few_allowed(3, 1536, 40, gen)),
        Case("few allowed, few blocked and many blocked rows", logits(5, 49152), kinds,
             indices=[3, 0, 2, 1]),
        Case("few allowed, bfloat16", logits(2, 4096, dtype=torch.bfloat16),
             few_allowed(2, 128, 4, gen)),
        Case("few allowed past vocab_size", logits(2, 4096), few_allowed(2, 128, 6, gen),
             vocab_size=4000),
        Case("few allowed, strided rows", logits(2, 4096), few_allowed(2, 128, 5, gen),
             row_padding=64),
    ]
    return cases


CASES = make_cases()


def apply_ours(case: Case) -> torch.Tensor:
    out, buffer = working_copy(case.logits, case.row_padding)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        apply_token_bitmask_inplace(out, case.bitmask, case.indices, case.vocab_size)
    if case.row_padding:
        assert bool((buffer[:, case.logits.shape[1] :] == PAD_VALUE).all())
    return out.contiguous()


def apply_xgrammar(case: Case) -> torch.Tensor:
    out = case.logits.clone()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        xgrammar.apply_token_bitmask_inplace(
            out, case.bitmask, vocab_size=case.vocab_size, indices=case.indices, backend="cpu"
        )
    return out


def expected(case: Case) -> torch.Tensor:
    """Straight from the layout definition, one token at a time."""
    out = case.logits.clone()
    logits_2d = out.unsqueeze(0) if out.dim() == 1 else out
    bitmask_2d = case.bitmask.unsqueeze(0) if case.bitmask.dim() == 1 else case.bitmask
    width = case.vocab_size or min(logits_2d.shape[1], bitmask_2d.shape[1] * 32)
    words = bitmask_2d.tolist()
    rows = range(logits_2d.shape[0]) if case.indices is None else case.indices
    for row in rows:
        blocked = [t for t in range(width) if not (words[row][t // 32] >> (t % 32)) & 1]
        logits_2d[row, blocked] = float("-inf")
    return out


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-identical, -inf included (NaN never appears here)."""
    return a.dtype == b.dtype and a.shape == b.shape and bool(torch.equal(a, b))


# ---------------------------------------------------------------- allocation and layout


@pytest.mark.parametrize("vocab_size", VOCAB_SIZES)
def test_allocate_matches_xgrammar(vocab_size: int) -> None:
    ours = allocate_token_bitmask(3, vocab_size)
    theirs = xgrammar.allocate_token_bitmask(3, vocab_size)
    assert ours.dtype == theirs.dtype == torch.int32
    assert ours.shape == theirs.shape == (3, (vocab_size + 31) // 32)
    assert torch.equal(ours, theirs)  # all bits set


def test_reset_sets_every_bit() -> None:
    bitmask = torch.zeros((2, 5), dtype=torch.int32)
    reset_token_bitmask(bitmask)
    assert torch.equal(bitmask, allocate_token_bitmask(2, 160))
    assert unpack_bitmask(bitmask.numpy(), 160).all()


@pytest.mark.parametrize("vocab_size", VOCAB_SIZES)
def test_pack_unpack_round_trip(vocab_size: int) -> None:
    rng = np.random.default_rng(vocab_size)
    allowed = rng.random((2, vocab_size)) < 0.3
    packed = pack_bool_mask(allowed)
    assert packed.dtype == np.int32 and packed.shape == (2, (vocab_size + 31) // 32)
    assert np.array_equal(unpack_bitmask(packed, vocab_size), allowed)
    # Bits past the vocabulary are clear: no phantom token is ever allowed.
    assert not unpack_bitmask(packed, packed.shape[-1] * 32)[:, vocab_size:].any()


@pytest.mark.parametrize("vocab_size", VOCAB_SIZES)
def test_packing_token_ids_sets_the_bits_of_the_same_vector(vocab_size: int) -> None:
    """`pack_token_ids` (the bits of a few ids) equals `pack_bool_mask` of their vector, the
    sign bit of a word and the last id included; an id outside the vocabulary is an error."""
    rng = np.random.default_rng(vocab_size)
    for count in (0, 1, min(40, vocab_size), vocab_size // 3):
        ids = rng.choice(vocab_size, size=count, replace=False)
        ids = np.union1d(ids, [min(31, vocab_size - 1), vocab_size - 1]) if count else ids
        allowed = np.zeros(vocab_size, dtype=bool)
        allowed[ids] = True
        packed = pack_token_ids(ids, vocab_size)
        assert packed.dtype == np.int32 and np.array_equal(packed, pack_bool_mask(allowed))
    for bad in (-1, vocab_size, vocab_size + 40):
        for others in (0, vocab_size // 3):  # either way of packing
            with pytest.raises(ValueError):
                pack_token_ids(np.append(np.arange(others), bad), vocab_size)


def test_pack_layout_is_lsb_first() -> None:
    allowed = np.zeros(70, dtype=bool)
    allowed[[0, 5, 31, 32, 69]] = True
    packed = pack_bool_mask(allowed)
    expected_words = [(1 << 0) | (1 << 5) | -(1 << 31), 1 << 0, 1 << 5]
    assert packed.tolist() == expected_words


def test_pack_pads_to_vocab_size_and_rejects_longer_vectors() -> None:
    allowed = np.ones(40, dtype=bool)
    packed = pack_bool_mask(allowed, 100)
    assert packed.shape == (4,)
    assert unpack_bitmask(packed, 100).tolist() == [True] * 40 + [False] * 60
    with pytest.raises(ValueError):
        pack_bool_mask(allowed, 39)
    with pytest.raises(ValueError):
        unpack_bitmask(packed, 129)


def test_packed_mask_means_the_same_to_xgrammar() -> None:
    rng = np.random.default_rng(7)
    allowed = rng.random((2, 1000)) < 0.5
    logits = torch.zeros(2, 1000)
    xgrammar.apply_token_bitmask_inplace(logits, torch.from_numpy(pack_bool_mask(allowed)))
    assert np.array_equal(torch.isinf(logits).numpy(), ~allowed)


# ---------------------------------------------------------------- apply: torch path


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_torch_path_matches_definition_and_xgrammar(case: Case) -> None:
    ours = apply_ours(case)
    assert same(ours, expected(case))
    assert same(ours, apply_xgrammar(case))


def test_torch_path_touches_only_selected_rows() -> None:
    case = next(c for c in CASES if c.name == "indices")
    ours = apply_ours(case)
    for row in (0, 2):
        assert torch.equal(ours[row], case.logits[row])
    assert torch.isinf(ours[3]).any() and torch.isinf(ours[1]).any()


def test_narrow_mask_warns_and_leaves_the_tail() -> None:
    logits = torch.zeros(1, 100)
    with pytest.warns(UserWarning, match="stay unmasked"):
        apply_token_bitmask_inplace(logits, torch.zeros((1, 2), dtype=torch.int32))
    assert torch.isinf(logits[0, :64]).all() and not torch.isinf(logits[0, 64:]).any()


@pytest.mark.parametrize(
    ("bitmask", "kwargs"),
    [
        (torch.zeros((1, 4), dtype=torch.int64), {}),  # wrong dtype
        (torch.zeros((1, 4), dtype=torch.int32), {"vocab_size": 129}),  # beyond the mask
        (torch.zeros((1, 4), dtype=torch.int32), {"indices": [1]}),  # row out of range
        (torch.zeros((1, 1, 4), dtype=torch.int32), {}),  # 3-D
    ],
)
def test_bad_arguments_are_rejected(bitmask: torch.Tensor, kwargs: dict) -> None:
    with pytest.raises(ValueError):
        apply_token_bitmask_inplace(torch.zeros(1, 128), bitmask, **kwargs)


def test_fewer_bitmask_rows_than_logits_rows_is_rejected() -> None:
    with pytest.raises(ValueError):
        apply_token_bitmask_inplace(torch.zeros(2, 64), torch.zeros((1, 2), dtype=torch.int32))


# ---------------------------------------------------------------- apply: triton kernel

TRITON_SCRIPT = textwrap.dedent(
    """
    import sys
    import torch
    from pegmask.kernels.bitmask import effective_vocab_size
    from pegmask.kernels.triton_apply import apply_token_bitmask_triton

    results = []
    for logits, bitmask, indices, vocab_size, row_padding in torch.load(sys.argv[1]):
        if row_padding:
            buffer = torch.full((logits.shape[0], logits.shape[1] + row_padding), 123.0)
            out = buffer[:, : logits.shape[1]]
            out.copy_(logits)
        else:
            out = logits.clone()
        out_2d = out.unsqueeze(0) if out.dim() == 1 else out
        bitmask_2d = bitmask.unsqueeze(0) if bitmask.dim() == 1 else bitmask
        size = effective_vocab_size(out_2d, bitmask_2d, vocab_size)
        apply_token_bitmask_triton(out_2d, bitmask_2d, size, indices)
        results.append((out.contiguous(), buffer[:, logits.shape[1] :] if row_padding else None))
    torch.save(results, sys.argv[2])
    """
)


@pytest.fixture(scope="module")
def triton_results(
    tmp_path_factory: pytest.TempPathFactory,
) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """The triton kernel's output for every case, run by triton's interpreter on CPU tensors.

    TRITON_INTERPRET must be set before triton compiles the kernel, i.e. before the module is
    imported, hence a fresh interpreter.
    """
    assert importlib.util.find_spec("triton") is not None, "triton is a dependency of pegmask"
    folder = tmp_path_factory.mktemp("triton")
    cases_file, results_file = folder / "cases.pt", folder / "results.pt"
    torch.save(
        [(c.logits, c.bitmask, c.indices, c.vocab_size, c.row_padding) for c in CASES], cases_file
    )
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONWARNINGS="ignore")
    proc = subprocess.run(
        [sys.executable, "-c", TRITON_SCRIPT, str(cases_file), str(results_file)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return torch.load(results_file)


@pytest.mark.parametrize("index", range(len(CASES)), ids=[c.name for c in CASES])
def test_triton_kernel_matches_torch_path_and_xgrammar(
    triton_results: list[tuple[torch.Tensor, torch.Tensor | None]], index: int
) -> None:
    case = CASES[index]
    result, padding = triton_results[index]
    assert same(result, apply_ours(case))
    assert same(result, apply_xgrammar(case))
    if padding is not None:
        assert bool((padding == PAD_VALUE).all())


def test_torch_path_on_any_device_code_matches_cpu_code() -> None:
    """The shift-based unpacking (used on devices other than CPU and CUDA) agrees with the
    numpy one used on CPU."""
    from pegmask.kernels import bitmask as module

    gen = torch.Generator().manual_seed(5)
    words = random_bitmask(3, 40, gen)
    assert torch.equal(
        module._blocked_torch(words, 1270), torch.from_numpy(module._blocked_numpy(words, 1270))
    )
    logits = torch.randn(3, 1270, generator=gen)
    a, b = logits.clone(), logits.clone()
    apply_token_bitmask_torch(a, words, effective_vocab_size(a, words, None), [2, 0])
    b[[2, 0]] = b[[2, 0]].masked_fill(module._blocked_torch(words[[2, 0]], 1270), float("-inf"))
    assert torch.equal(a, b)


# ---------------------------------------------------------------- sampling


def masked_logits(seed: int, rows: int = 4, width: int = 500) -> tuple[torch.Tensor, np.ndarray]:
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, width, generator=gen) * 3
    allowed = np.random.default_rng(seed).random((rows, width)) < 0.05
    allowed[:, 0] = True  # at least one allowed per row
    apply_token_bitmask_inplace(logits, torch.from_numpy(pack_bool_mask(allowed)))
    return logits, allowed


def test_greedy_picks_best_allowed_token() -> None:
    logits, allowed = masked_logits(1)
    best = torch.from_numpy(np.where(allowed, logits.numpy(), -np.inf).argmax(-1))
    assert torch.equal(sample_masked(logits, temperature=0.0), best)
    assert torch.equal(sample_masked(logits, temperature=1.0, top_k=1), best)
    assert torch.equal(sample_masked(logits, temperature=1.0, top_p=1e-6), best)


def test_sampling_never_picks_a_masked_token() -> None:
    logits, allowed = masked_logits(2)
    gen = torch.Generator().manual_seed(0)
    for params in [{}, {"temperature": 5.0}, {"top_k": 3}, {"top_p": 0.5}]:
        for _ in range(20):
            picks = sample_masked(logits, generator=gen, **params)
            assert allowed[np.arange(len(picks)), picks.numpy()].all()


def test_sampling_follows_softmax_and_filters() -> None:
    logits = torch.tensor([2.0, 1.0, 0.0, float("-inf"), -1.0])
    gen = torch.Generator().manual_seed(3)
    draws = torch.stack([sample_masked(logits, generator=gen) for _ in range(4000)])
    freq = torch.bincount(draws, minlength=5).float() / len(draws)
    assert torch.allclose(freq, logits.softmax(-1), atol=0.03)
    top2 = torch.stack([sample_masked(logits, top_k=2, generator=gen) for _ in range(500)])
    assert set(top2.tolist()) == {0, 1}
    # p(0) = 0.64: top_p 0.7 needs tokens 0 and 1 (0.88), not 2.
    nucleus = torch.stack([sample_masked(logits, top_p=0.7, generator=gen) for _ in range(500)])
    assert set(nucleus.tolist()) == {0, 1}


def test_the_two_level_draw_follows_the_weights_across_blocks() -> None:
    """Allowed tokens in a few blocks of DRAW_BLOCK, whole blocks masked between them and the
    last one partial (151,936 tokens: Qwen's vocabulary): only allowed tokens come out, each as
    often as its probability says, also when the draw lands at a block's edge."""
    width = 151_936
    allowed = [0, 1023, 1024, 70_000, width - 1]
    logits = torch.full((3, width), float("-inf"))
    logits[:, allowed] = torch.tensor([0.0, 1.0, 0.5, 2.0, 1.5])
    gen = torch.Generator().manual_seed(5)
    draws = torch.cat([sample_masked(logits, generator=gen) for _ in range(1500)])
    assert set(draws.tolist()) <= set(allowed)
    freq = torch.bincount(draws, minlength=width)[allowed].float() / len(draws)
    assert torch.allclose(freq, logits[0, allowed].softmax(-1), atol=0.03)


def test_sampling_is_reproducible_with_a_generator() -> None:
    logits, _ = masked_logits(4)
    first = sample_masked(logits, 0.8, 0.9, 20, torch.Generator().manual_seed(9))
    second = sample_masked(logits, 0.8, 0.9, 20, torch.Generator().manual_seed(9))
    assert torch.equal(first, second)


def test_sampling_rejects_rows_with_nothing_allowed() -> None:
    logits = torch.zeros(2, 10)
    logits[1] = float("-inf")
    for temperature in (0.0, 1.0):
        with pytest.raises(ValueError, match="no allowed token"):
            sample_masked(logits, temperature)


REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_the_kernels_folder_never_shadows_the_kernels_package() -> None:
    """Run in a checkout (`python -c`: the repository root first on sys.path), `import kernels`
    is the PyPI package transformers imports, or an empty module where it is not installed, and
    transformers' models import either way."""
    program = (
        "import kernels, pegmask.kernels\n"
        "from transformers import LlamaConfig\n"
        "print(kernels.__file__, hasattr(kernels, 'allocate_token_bitmask'))\n"
        "print(pegmask.kernels.__file__)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", program], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    top_level, has_our_api, ours = proc.stdout.split()
    assert pathlib.Path(ours).resolve() == REPO_ROOT / "kernels" / "__init__.py"
    assert has_our_api == "False"
    try:
        importlib.metadata.version("kernels")
    except importlib.metadata.PackageNotFoundError:
        return
    assert pathlib.Path(top_level).resolve().parent != REPO_ROOT / "kernels"
