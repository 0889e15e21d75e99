"""`draw_rows`: a step's first draws, made for rows alike at once, are the draws each row makes
on its own (`Row.sample` without a draw): the same token for the same seed, banned tokens and
bias applied in the same order, the grammar winning where it allows only a banned token."""

from __future__ import annotations

import numpy as np
import torch
from vocabularies import smollm2

from pegmask.engine.decode import Row, RowSpec, TextOutput, draw_rows
from pegmask.engine.requests import SamplingParams
from pegmask.kernels import apply_token_bitmask_inplace, pack_bool_mask

VOCAB = smollm2()
WIDTH = VOCAB.size
EOS = frozenset(VOCAB.eos_ids)


def row(index: int, **sampling) -> Row:
    """A row without a grammar: its mask stands for one (no budget check to close it)."""
    sampling = SamplingParams(close_on_length=False, **sampling)
    spec = RowSpec(prompt_ids=[1, 2, 3], sampling=sampling, max_new_tokens=16,
                   make_output=lambda: TextOutput(VOCAB), eos_ids=EOS, stop_ids=EOS)
    return Row(spec, index, VOCAB, torch.device("cpu"))


def step_inputs(seed: int, masked: list[bool]) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits that favour an end token, and a bitmask (few tokens allowed, an end token among
    them) applied to the masked rows."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(len(masked), WIDTH, generator=generator) * 2
    logits[:, sorted(EOS)] = 8.0
    allowed = np.random.default_rng(seed).random((len(masked), WIDTH)) < 0.01
    allowed[:, sorted(EOS)] = True
    bitmask = torch.from_numpy(pack_bool_mask(allowed, WIDTH))
    apply_token_bitmask_inplace(logits, bitmask, indices=[i for i, m in enumerate(masked) if m])
    return logits, bitmask


SAMPLINGS = [
    {"temperature": 0.7, "seed": 1, "ignore_eos": True},
    {"temperature": 0.7, "seed": 2, "ignore_eos": True},
    {"temperature": 0.7, "seed": 3},
    {"temperature": 1.3, "top_p": 0.9, "top_k": 50, "seed": 4, "min_tokens": 4},
    {"temperature": 0.0, "ignore_eos": True},
    {"temperature": 0.7, "seed": 5, "logit_bias": ((100, 30.0),)},
    {"temperature": 1.0, "seed": 6, "min_p": 0.2, "repetition_penalty": 1.3},
]


def test_rows_drawn_together_draw_what_each_row_draws_alone() -> None:
    masked = [i % 2 == 0 for i in range(len(SAMPLINGS))]
    for seed in range(5):
        logits, bitmask = step_inputs(seed, masked)
        together = [row(i, **sampling) for i, sampling in enumerate(SAMPLINGS)]
        batch = logits.clone()
        drawn = draw_rows(together, batch, bitmask, masked)
        alone = [row(i, **sampling) for i, sampling in enumerate(SAMPLINGS)]
        for i, single in enumerate(alone):
            own = logits[i].clone()
            token, _ = single.sample(own, bitmask[i], masked[i])
            assert drawn[i] == token, (seed, i)
            torch.testing.assert_close(batch[i], own)  # the same processed logits
        for i, sampling in enumerate(SAMPLINGS):
            if sampling.get("ignore_eos") or sampling.get("min_tokens"):
                assert drawn[i] not in EOS
        assert drawn[5] == 100  # the bias of 30 wins


def test_the_grammar_wins_where_it_allows_only_a_banned_token() -> None:
    logits, _ = step_inputs(0, [False, False, False])
    only_eos = np.zeros((3, WIDTH), dtype=bool)
    only_eos[0, min(EOS)] = True  # row 0: the end token alone
    only_eos[1, [min(EOS), 200]] = True  # row 1: the end token or 200
    bitmask = torch.from_numpy(pack_bool_mask(only_eos, WIDTH))  # row 2: nothing
    apply_token_bitmask_inplace(logits, bitmask)
    rows = [row(i, temperature=0.7, seed=i, ignore_eos=True) for i in range(3)]
    assert draw_rows(rows, logits, bitmask, [True, True, True]) == [min(EOS), 200, None]
    # the row with nothing allowed ends on its own
    assert rows[2].sample(logits[2], bitmask[2], True) is None


def test_rows_with_a_plan_or_a_failure_draw_on_their_own() -> None:
    logits, bitmask = step_inputs(1, [False, False, False])
    rows = [row(i, temperature=0.7, seed=i) for i in range(3)]
    rows[0].plan = [5, 6]
    rows[1].failure = RuntimeError("its mask failed")
    drawn = draw_rows(rows, logits, bitmask, [False, False, False])
    assert drawn[:2] == [None, None] and drawn[2] is not None


def test_a_row_left_with_no_token_fails_alone() -> None:
    """A mask whose allowed ids all lie past the logits (a vocabulary wider than the model's
    head) leaves the row nothing: it fails, as drawn alone, and the other rows draw."""
    narrow = WIDTH - 32
    logits = torch.randn(2, narrow)
    allowed = np.ones((2, WIDTH), dtype=bool)
    allowed[0, :narrow] = False
    bitmask = torch.from_numpy(pack_bool_mask(allowed, WIDTH))
    apply_token_bitmask_inplace(logits, bitmask[:, : (narrow + 31) // 32])
    rows = [row(i, temperature=0.7, seed=i) for i in range(2)]
    drawn = draw_rows(rows, logits, bitmask, [True, True])
    assert drawn[0] is None and isinstance(rows[0].failure, ValueError)
    assert drawn[1] is not None and rows[1].failure is None
