"""Prompt-lookup drafts (engine/speculation.py) and their check in the decode loop: the drafts
follow the sequence's own earlier tokens, and decoding with them gives what decoding without
them gives, in fewer steps, on the embedded SmolLM2."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from pegmask import Engine  # noqa: E402
from pegmask.bench.serve_compare import CHAT_TOOLS  # noqa: E402
from pegmask.engine.scheduler import Limits  # noqa: E402
from pegmask.engine.speculation import PromptLookup, draft_length  # noqa: E402


def test_a_draft_is_what_followed_the_longest_latest_match() -> None:
    lookup = PromptLookup([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16])
    assert lookup.propose(rows=1) == ([], 0)  # its tail never occurred before
    # 9..14 again: a match of 6 (the three-token tail and three before it)
    lookup.follow([9, 10, 11, 12, 13, 14])
    assert lookup.propose(rows=1) == ([15, 16, 9, 10], 6)  # on into the output
    assert lookup.propose(rows=8) == ([], 6)  # beside many rows only long matches draft
    # grown a token at a time, the output indexes what it adds
    lookup.follow([9, 10, 11, 12, 13, 14, 15])
    assert lookup.propose(rows=1) == ([16, 9, 10, 11], 7)
    lookup = PromptLookup([5, 6, 7, 8])
    lookup.follow([5, 6, 7, 8])
    assert lookup.propose(rows=1) == ([5, 6], 4)
    lookup = PromptLookup([7, 1, 2, 3, 8, 4, 1, 2, 3, 9, 5, 1, 2, 3])
    lookup.follow([])
    # 1 2 3 occurred twice before, each a match of 3: too short to draft
    assert lookup.propose(rows=1) == ([], 3)


def test_long_matches_draft_more_beside_any_number_of_rows() -> None:
    tokens = list(range(100, 140))
    lookup = PromptLookup(tokens)
    lookup.follow(tokens[:20])
    draft, match = lookup.propose(rows=32)
    assert match == 12 and draft == tokens[20:28] and len(draft) == draft_length(12, 32) == 8
    assert [draft_length(m, 1) for m in (3, 4, 6, 12)] == [0, 2, 4, 8]
    assert [draft_length(m, 8) for m in (4, 6, 11, 12)] == [0, 0, 0, 8]


def test_draft_budget_is_checked() -> None:
    with pytest.raises(ValueError, match="draft_budget"):
        Limits(draft_budget=-1)


TOOL_CALLS = [
    [{"role": "user", "content": question}]
    for question in ("What's the weather in Paris and in Lima?", "Weather in Tokyo, please.",
                     "Find flights from Oslo to Rome next Friday.")
]


@pytest.fixture(scope="module")
def engines() -> Iterator[tuple[Engine, Engine]]:
    """Without and with drafts, in float32: a drafted position's logits come from a longer
    chunk of the forward than a step's, which under bfloat16 rounds differently and can flip
    a near-tie (as batching does: engine/llama_runner.py); in float32 they agree to 1e-4.
    Grammars compile in the test's process (no worker processes left behind) and the engines
    are closed after the module."""
    with (Engine(draft_budget=0, weights="float32", compile_workers=0) as plain,
          Engine(draft_budget=48, weights="float32", compile_workers=0) as drafting):
        yield plain, drafting


def _decode(engine: Engine, **options) -> tuple[list[list[int]], int]:
    """Each chat's output tokens, one request at a time, and the steps they took."""
    steps = engine.stats.steps
    outputs = [engine.generate(messages, tools=CHAT_TOOLS, tool_choice="required",
                               max_tokens=96, **options).token_ids for messages in TOOL_CALLS]
    return outputs, engine.stats.steps - steps


def test_drafts_change_the_steps_not_the_output(engines: tuple[Engine, Engine]) -> None:
    """Greedy tool calls (parallel calls repeat the first one's arguments): the same tokens
    with and without drafts, in fewer steps with them, the drafts mostly kept."""
    plain, drafting = engines
    drafted_before = drafting.stats.drafted_tokens
    kept_before = drafting.stats.draft_tokens_kept
    expected, steps = _decode(plain, temperature=0)
    outputs, fewer = _decode(drafting, temperature=0)
    assert outputs == expected
    drafted = drafting.stats.drafted_tokens - drafted_before
    kept = drafting.stats.draft_tokens_kept - kept_before
    assert drafted > 0 and kept > drafted / 2
    metrics = drafting.metrics.render().decode()
    assert f"pegmask_draft_tokens_total {float(drafting.stats.drafted_tokens)}" in metrics
    assert f"pegmask_draft_tokens_kept_total {float(drafting.stats.draft_tokens_kept)}" in metrics
    assert fewer <= steps - kept // 2


def test_drafts_keep_seeded_draws_and_logprobs(engines: tuple[Engine, Engine]) -> None:
    """A seeded row draws once per position whether its logits came from a draft or not, so
    sampled outputs agree too; log-probabilities come one per output token."""
    plain, drafting = engines
    options = {"temperature": 0.7, "seed": 11}
    expected, _ = _decode(plain, **options)
    outputs, _ = _decode(drafting, **options)
    assert outputs == expected
    result = drafting.generate(TOOL_CALLS[0], tools=CHAT_TOOLS, tool_choice="required",
                               max_tokens=96, temperature=0, logprobs=True, top_logprobs=2)
    assert [entry.token_id for entry in result.logprobs] == result.token_ids


def test_drafts_respect_stop_strings_and_the_budget(engines: tuple[Engine, Engine]) -> None:
    """A draft past a stop string or past max_tokens is cut like any output."""
    plain, drafting = engines
    chat = [{"role": "user", "content": "Repeat after me five times: red green blue, red green "
                                        "blue, red green blue."}]
    for options in ({"stop": ["blue, red"]}, {"max_tokens": 21}, {"n": 2, "seed": 3}):
        options = {"temperature": 0, "max_tokens": 64, **options}
        if "seed" in options:
            options["temperature"] = 0.8
        expected = plain.generate(chat, **options)
        result = drafting.generate(chat, **options)
        assert [c.token_ids for c in result.choices] == [c.token_ids for c in expected.choices]
        assert result.finish_reason == expected.finish_reason
        assert len(result.token_ids) <= options["max_tokens"]
