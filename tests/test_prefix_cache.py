"""The prefix cache on the embedded model: which prefix a prompt reuses (whole blocks, never its
last token), that a reused prefix decodes as a fresh prefill (exactly, where it is cut into the
same chunks), that a prompt sharing only part of a kept prefix holds only that part, which
beginnings sequences share in attention, eviction, and the engine reporting cached prompt
tokens."""

from __future__ import annotations

import pytest
import torch

from pegmask.engine import Engine
from pegmask.engine.model import load_backend
from pegmask.engine.prefix_cache import SHARED_MIN, PrefixCache

BLOCK = 16


@pytest.fixture
def runner():
    return load_backend().runner()


def prompt(seed: int, length: int) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return [int(t) for t in torch.randint(100, 40_000, (length,), generator=generator)]


def prefill(cache: PrefixCache, runner, seq: int, tokens: list[int],
            start: int) -> torch.Tensor:
    """The rest of a prompt as the scheduler feeds it: in chunks cut at block boundaries, each
    block kept as soon as it is in; the last logits."""
    for first in range(start, len(tokens), BLOCK):
        logits = runner.forward([(seq, tokens[first:first + BLOCK])])
        cache.keep(seq, tokens[:first + BLOCK])
    return logits[0]


def serve(cache: PrefixCache, runner, tokens: list[int]) -> None:
    """One request's prompt: started from the cache, the rest prefilled and kept; then it
    leaves."""
    seq, start, _ = cache.start(tokens)
    prefill(cache, runner, seq, tokens, start)
    runner.remove(seq)


def test_a_repeated_prompt_reuses_its_whole_blocks_and_decodes_exactly_the_same(runner) -> None:
    cache = PrefixCache(runner, capacity=2, block=BLOCK)
    tokens = prompt(0, 40)
    seq, cached, _ = cache.start(tokens)
    assert cached == 0
    fresh = prefill(cache, runner, seq, tokens, 0)
    step = runner.forward([(seq, [5])])
    runner.remove(seq)  # the next request comes after this one
    again, cached, _ = cache.start(tokens)
    assert cached == 32 and runner.length(again) == 32  # 40 tokens: two whole blocks
    assert torch.equal(prefill(cache, runner, again, tokens, cached), fresh)
    assert torch.equal(runner.forward([(again, [5])]), step)


def test_a_prompt_kept_whole_starts_decoding_at_once_exactly_as_the_first_time(runner) -> None:
    """Kept with the logits after its last token, the same prompt again is restored whole
    (nothing to prefill) with those logits, and its next step is the first time's; a prompt
    that only begins like it still prefills its last token."""
    cache = PrefixCache(runner, capacity=2, block=BLOCK)
    tokens = prompt(16, 37)
    seq, _, final = cache.start(tokens)
    assert final is None
    logits = prefill(cache, runner, seq, tokens, 0)
    cache.keep(seq, tokens, final=logits)
    step = runner.forward([(seq, [5])])
    runner.remove(seq)
    again, cached, final = cache.start(tokens)
    assert cached == 37 and runner.length(again) == 37 and torch.equal(final, logits)
    assert torch.equal(runner.forward([(again, [5])]), step)
    longer = tokens + [7]
    assert cache.start(longer)[1:] == (32, None)
    assert len(cache) == 1  # the whole prompt replaced the blocks it extends


def test_the_last_token_is_always_prefilled_and_a_shared_beginning_is_reused(runner) -> None:
    cache = PrefixCache(runner, capacity=2, block=BLOCK)
    tokens = prompt(1, 32)
    serve(cache, runner, tokens)
    assert cache.start(tokens)[1] == 16  # 32 tokens: the second block holds the last one
    other = tokens[:20] + prompt(2, 30)
    assert cache.start(other)[1] == 16  # 20 shared tokens: one whole block
    assert cache.start(prompt(3, 40))[1] == 0


def test_a_prompt_sharing_part_of_a_kept_prefix_holds_only_that_part() -> None:
    """Its sequence is restored with the shared whole blocks only (not the kept prompt's rest)
    and decodes as a fresh prefill of it (float32: chunking changes the results by rounding)."""
    runner = load_backend().runner(weights="float32")
    cache = PrefixCache(runner, capacity=2, block=BLOCK)
    kept = prompt(10, 60)
    serve(cache, runner, kept)
    other = kept[:40] + prompt(11, 20)
    seq, cached, _ = cache.start(other)
    assert cached == 32 and runner.length(seq) == 32
    logits = prefill(cache, runner, seq, other, cached)
    fresh = runner.add()
    torch.testing.assert_close(logits[None], runner.forward([(fresh, other)]), rtol=1e-3,
                               atol=1e-3)


def test_prompts_that_differ_after_a_long_common_beginning_share_one_copy_of_it(
        runner, monkeypatch) -> None:
    """Attention reads a kept beginning once for every sequence that starts with it: the whole
    beginning the kept prompts agree on, to the token (the same tools, another question), one
    copy for all of them, also for a prompt kept before the others came; a lone prompt shares
    what it holds; a beginning shorter than SHARED_MIN is not shared."""
    shared: list[tuple[int, object, int]] = []
    monkeypatch.setattr(runner, "share", lambda seq, saved, length: shared.append(
        (seq, saved, length)))
    cache = PrefixCache(runner, capacity=4, block=BLOCK)
    tools = prompt(12, SHARED_MIN + 21)
    first, second, third = (tools + prompt(seed, 30 + seed) for seed in (13, 14, 15))
    serve(cache, runner, first)
    # kept block by block, alone: each time all it holds
    assert [length for _, _, length in shared] == list(
        range(SHARED_MIN, len(first) // BLOCK * BLOCK + 1, BLOCK))
    shared.clear()
    serve(cache, runner, second)
    again, _, _ = cache.start(first)
    serve(cache, runner, third)
    last = {seq: (id(saved), length) for seq, saved, length in shared}  # once prefilled
    assert len(last) == 3 and len(set(last.values())) == 1 and len(cache) == 3
    assert last[again][1] == len(tools)
    shared.clear()
    serve(cache, runner, prompt(16, SHARED_MIN - 1))
    assert shared == []


def test_a_longer_prefix_replaces_the_one_it_extends_and_the_oldest_is_evicted(runner) -> None:
    cache = PrefixCache(runner, capacity=2, block=BLOCK)
    base = prompt(4, 40)
    longer = base + prompt(5, 30)
    for tokens in (base, longer):
        serve(cache, runner, tokens)
    assert len(cache) == 1 and cache.start(base)[1] == 32 and cache.start(longer)[1] == 64
    for seed in (6, 7):  # two new prefixes: the least recently used one goes
        serve(cache, runner, prompt(seed, 20))
    assert len(cache) == 2 and cache.start(longer)[1] == 0 and cache.start(prompt(7, 20))[1] == 16


def test_a_cache_of_no_entries_keeps_nothing(runner) -> None:
    cache = PrefixCache(runner, capacity=0, block=BLOCK)
    tokens = prompt(8, 40)
    serve(cache, runner, tokens)
    assert len(cache) == 0 and cache.start(tokens)[1] == 0


SYSTEM = ("You answer questions about the weather of cities in Japan. " * 12).strip()
MESSAGES = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Tokyo?"}]


def test_the_engine_skips_a_kept_prefix_and_says_so_in_usage() -> None:
    with (Engine(prefill_chunk=64, prewarm=False) as engine,
          Engine(prefill_chunk=64, prefix_cache=0, prewarm=False) as without):
        first = engine.generate(MESSAGES, max_tokens=6, temperature=0)
        prompt_tokens = first.usage["prompt_tokens"]
        assert prompt_tokens > 128
        assert first.usage["prompt_tokens_details"] == {"cached_tokens": 0}
        second = engine.generate(MESSAGES, max_tokens=6, temperature=0)
        cached = second.usage["prompt_tokens_details"]["cached_tokens"]
        assert cached == prompt_tokens  # kept whole: nothing to prefill
        assert engine.stats.cached_prompt_tokens == cached
        assert second.token_ids == first.token_ids
        other = engine.generate([MESSAGES[0], {"role": "user", "content": "Kyoto?"}], max_tokens=6,
                                temperature=0)
        cached = other.usage["prompt_tokens_details"]["cached_tokens"]
        assert 128 <= cached < other.usage["prompt_tokens"] and cached % 16 == 0  # whole blocks
        plain = without.generate(MESSAGES, max_tokens=6, temperature=0)
        plain_again = without.generate(MESSAGES, max_tokens=6, temperature=0)
        assert plain_again.usage["prompt_tokens_details"] == {"cached_tokens": 0}
        assert plain.token_ids == plain_again.token_ids == first.token_ids


def test_kept_prefixes_stay_within_their_token_bound(runner, monkeypatch) -> None:
    """With room for 100 tokens: two prompts' 48 kept tokens fit, a third evicts the least
    recently used though the capacity allows four; of a longer prompt only the blocks that fit
    are kept (its later, longer prefixes are not even saved)."""
    cache = PrefixCache(runner, capacity=4, block=BLOCK, max_tokens=100)
    first, second, third, longer = (prompt(seed, size) for seed, size in
                                    ((1, 50), (2, 50), (3, 50), (4, 130)))
    serve(cache, runner, first)
    serve(cache, runner, second)
    assert len(cache) == 2 and cache.held_tokens() == 96
    serve(cache, runner, third)
    assert len(cache) == 2 and cache.held_tokens() == 96
    for tokens, kept in ((first, 0), (third, 48)):
        seq, cached, _ = cache.start(tokens)
        assert cached == kept
        runner.remove(seq)
    saved = []
    save = runner.save
    monkeypatch.setattr(runner, "save",
                        lambda seq, length: (saved.append(length), save(seq, length))[1])
    serve(cache, runner, longer)
    assert max(saved) == 96 and cache.held_tokens() == 96 and len(cache) == 1
    seq, cached, _ = cache.start(longer)
    assert cached == 96
    runner.remove(seq)
