"""The sampling parameters users send, per row of the batched step.

Unit tests of the logits processors (kernels/logits.py) and min-p (kernels/sampling.py) on
tensors; then, through the real server and the official clients: `n` (plain and streamed),
`logprobs` / `top_logprobs` of the masked distribution (forced tokens included), the penalties'
effect, `logit_bias`, stop strings and `stop_token_ids`, `ignore_eos`, `min_tokens`, unknown
fields logged and descriptive ones accepted, and tool-call ids unique whatever the seed.
"""

from __future__ import annotations

import json
import logging
import math
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from server_harness import Server, recording, serve

from pegmask import Engine
from pegmask.dialects import accumulate
from pegmask.kernels.logits import apply_logit_bias, apply_penalties
from pegmask.kernels.sampling import sample_masked

NEG = float("-inf")


# --------------------------------------------------------------------------- kernels
def test_frequency_and_presence_penalties() -> None:
    logits = torch.tensor([1.0, 2.0, 3.0, 4.0, NEG])
    apply_penalties(logits, [1, 3, 3, 4], frequency=0.5, presence=0.25)
    # token 1 once, token 3 twice, token 4 (masked) stays -inf, the others untouched
    assert logits.tolist() == [1.0, 2.0 - 0.75, 3.0, 4.0 - 1.25, NEG]


def test_repetition_penalty_reads_prompt_and_output() -> None:
    logits = torch.tensor([2.0, -2.0, 2.0, -2.0, NEG])
    apply_penalties(logits, output_ids=[1, 4], prompt_ids=[0], repetition=2.0)
    # positive logits divided, negative multiplied; unseen tokens and -inf untouched
    assert logits.tolist() == [1.0, -4.0, 2.0, -2.0, NEG]


def test_no_penalty_is_a_no_op() -> None:
    logits = torch.randn(50)
    before = logits.clone()
    apply_penalties(logits, [1, 2, 2], [3])
    assert torch.equal(logits, before)


def test_logit_bias_adds_and_keeps_masked_tokens_out() -> None:
    logits = torch.tensor([0.0, 1.0, NEG])
    apply_logit_bias(logits, torch.tensor([0, 2, 0]), torch.tensor([1.5, 100.0, 1.0]))
    assert logits.tolist() == [2.5, 1.0, NEG]  # repeated ids add up; -inf stays -inf


def test_min_p_drops_tokens_below_its_share_of_the_best() -> None:
    probs = torch.tensor([0.5, 0.3, 0.12, 0.08, 0.0])
    logits = probs.log()
    generator = torch.Generator().manual_seed(0)
    draws = Counter(int(sample_masked(logits, 1.0, generator=generator, min_p=0.2))
                    for _ in range(2000))
    # floor = 0.2 * 0.5 = 0.1: tokens 3 (0.08) and 4 (masked) are never drawn
    assert set(draws) == {0, 1, 2}
    kept = probs[:3] / probs[:3].sum()
    for token in range(3):
        assert abs(draws[token] / 2000 - float(kept[token])) < 0.05
    assert {int(sample_masked(logits, 1.0, generator=generator, min_p=1.0))
            for _ in range(50)} == {0}
    with pytest.raises(ValueError, match="min_p"):
        sample_masked(logits, 1.0, min_p=1.5)


# --------------------------------------------------------------------------- the server
@pytest.fixture(scope="module")
def server():
    with Engine() as engine, serve(engine) as running:
        yield running


CAPITAL = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = "The capital of France is Paris."  # the embedded model's answer at temperature 0


def _token(server: Server, text: str) -> int:
    (token,) = server.engine.backend.encode(text)
    return token


def test_n_choices_plain_and_streamed(server: Server) -> None:
    client = server.openai()
    request = {"model": server.engine.model_name, "messages": CAPITAL, "n": 3, "seed": 5,
               "max_tokens": 8}
    plain = client.chat.completions.create(**request)
    assert [choice.index for choice in plain.choices] == [0, 1, 2]
    texts = [choice.message.content for choice in plain.choices]
    assert len(set(texts)) > 1  # seeds seed + index: different draws
    assert plain.usage.completion_tokens > 8  # counts every choice

    deltas: dict[int, list] = {0: [], 1: [], 2: []}
    finish = {}
    for chunk in client.chat.completions.create(**request, stream=True):
        for choice in chunk.choices:
            deltas[choice.index].append(choice.delta.model_dump(exclude_none=True))
            if choice.finish_reason:
                finish[choice.index] = choice.finish_reason
    for choice in plain.choices:
        assert accumulate(deltas[choice.index])["content"] == choice.message.content
        assert finish[choice.index] == choice.finish_reason

    completions = client.completions.create(model=server.engine.model_name, prompt="Hello",
                                            n=2, seed=5, max_tokens=4)
    assert [choice.index for choice in completions.choices] == [0, 1]


def test_logprobs_are_of_the_masked_distribution(server: Server) -> None:
    """Under a regex, every alternative in top_logprobs is a token the grammar allowed there;
    the tokens the grammar forced come with log-probability 0."""
    pattern = "[ab]-constant-suffix-[cd]"
    response = server.openai().chat.completions.create(
        model=server.engine.model_name, messages=[{"role": "user", "content": "Pick."}],
        response_format={"type": "regex", "regex": pattern}, logprobs=True, top_logprobs=5,
        seed=3, max_tokens=30)
    choice = response.choices[0]
    entries = choice.logprobs.content
    assert "".join(entry.token for entry in entries) == choice.message.content
    first, *middle, last = entries
    assert {alt.token for alt in first.top_logprobs} <= {"a", "b"}
    assert {alt.token for alt in last.top_logprobs} <= {"c", "d"}
    for entry in (first, last):
        assert entry.logprob in [alt.logprob for alt in entry.top_logprobs]
        assert math.isclose(sum(math.exp(alt.logprob) for alt in entry.top_logprobs), 1.0,
                            rel_tol=1e-4)  # the mask leaves exactly these two
    assert "".join(entry.token for entry in middle) == "-constant-suffix-"
    for entry in middle:  # forced by the grammar, not sampled
        assert entry.logprob == 0.0
        assert [(alt.token, alt.logprob) for alt in entry.top_logprobs] == [(entry.token, 0.0)]


def test_top_logprobs_under_a_choice_name_allowed_tokens_only(server: Server) -> None:
    choices = ["Lisbon", "Lima", "Cairo"]
    response = server.openai().chat.completions.create(
        model=server.engine.model_name, messages=CAPITAL, logprobs=True, top_logprobs=5,
        response_format={"type": "choice", "choice": choices}, seed=1, max_tokens=8)
    content = response.choices[0].message.content
    assert content in choices
    prefix = ""
    for entry in response.choices[0].logprobs.content:
        for alt in entry.top_logprobs:
            assert alt.logprob <= 0.0
            assert any(choice.startswith(prefix + alt.token) for choice in choices), (
                prefix, alt.token)
        prefix += entry.token
    assert prefix == content


def test_completion_logprobs(server: Server) -> None:
    response = server.openai().completions.create(
        model=server.engine.model_name, prompt="The capital of France is", max_tokens=4,
        temperature=0, logprobs=2)
    choice = response.choices[0]
    logprobs = choice.logprobs
    assert "".join(logprobs.tokens) == choice.text
    assert len(logprobs.token_logprobs) == len(logprobs.tokens) == 4
    for token, logprob, top in zip(logprobs.tokens, logprobs.token_logprobs,
                                   logprobs.top_logprobs, strict=True):
        assert len(top) == 2 and max(top.values()) == logprob  # greedy: the best one
        assert token in top
    assert logprobs.text_offset == sorted(logprobs.text_offset)


def test_penalties_change_a_repetitive_output(server: Server) -> None:
    """A counting prompt repeats itself greedily; a frequency or repetition penalty breaks the
    loop (fewer repeats of the most repeated token)."""
    model = server.engine.model_name
    prompt = "1, 2, 3, 1, 2, 3, 1, 2, 3,"
    settings = [{}, {"frequency_penalty": 2.0}, {"repetition_penalty": 1.5}]

    def run(extra: dict) -> list[int]:
        with recording(server.engine) as recorder:
            server.openai().completions.create(model=model, prompt=prompt, max_tokens=12,
                                               temperature=0, extra_body=extra)
        return recorder.submissions[0].rows[0].generated

    baseline, frequency, repetition = [run(extra) for extra in settings]
    most = max(Counter(baseline).values())
    assert most >= 4
    for penalized in (frequency, repetition):
        assert penalized != baseline
        assert max(Counter(penalized).values()) < most


def test_logit_bias(server: Server) -> None:
    client = server.openai()
    model = server.engine.model_name
    banana = _token(server, " banana")
    paris = _token(server, " Paris")
    request = {"model": model, "prompt": "The capital of France is", "max_tokens": 3}
    boosted = client.completions.create(**request, seed=0, logit_bias={str(banana): 100})
    assert boosted.choices[0].text == " banana" * 3
    greedy = client.completions.create(**request, temperature=0)
    assert greedy.choices[0].text.startswith(" Paris")
    banned = client.completions.create(**request, temperature=0, logit_bias={str(paris): -100})
    assert not banned.choices[0].text.startswith(" Paris")


def test_stop_strings_and_stop_token_ids(server: Server) -> None:
    model = server.engine.model_name
    client = server.openai()
    request = {"model": model, "messages": CAPITAL, "temperature": 0, "max_tokens": 16}
    assert client.chat.completions.create(**request).choices[0].message.content == GREEDY

    # The text before the stop string (the chat parser leaves out the trailing space).
    stopped = client.chat.completions.create(**request, stop=["Paris", "Rome"])
    content = stopped.choices[0].message.content
    assert content.rstrip() == "The capital of France is"
    assert stopped.choices[0].finish_reason == "stop"
    streamed = "".join(chunk.choices[0].delta.content or ""
                       for chunk in client.chat.completions.create(**request, stop="Paris",
                                                                   stream=True))
    assert streamed == content
    completion = client.completions.create(model=model, prompt="The capital of France is",
                                           temperature=0, max_tokens=8, stop="Paris")
    assert completion.choices[0].text == " "  # the part of " Paris" before the stop string

    by_id = client.chat.completions.create(
        **request, extra_body={"stop_token_ids": [_token(server, " Paris")]})
    assert by_id.choices[0].message.content == "The capital of France is"
    assert by_id.choices[0].finish_reason == "stop"

    message = server.anthropic().messages.create(
        model=model, messages=CAPITAL, max_tokens=16, stop_sequences=["Paris"],
        extra_body={"temperature": 0})
    assert message.stop_reason == "stop_sequence" and message.stop_sequence == "Paris"
    assert message.content[0].text == content


def test_ignore_eos_and_min_tokens(server: Server) -> None:
    """A completion of the chat template's assistant turn ends with the end-of-turn token (the
    model's EOS) unless told to go on."""
    client = server.openai()
    prompt = ("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
              "<|im_start|>assistant\n")
    request = {"model": server.engine.model_name, "prompt": prompt, "temperature": 0,
               "max_tokens": 14}
    with ThreadPoolExecutor(3) as pool:
        plain, ignoring, at_least = pool.map(
            lambda extra: client.completions.create(**request, extra_body=extra),
            [{}, {"ignore_eos": True}, {"min_tokens": 12}])
    assert plain.choices[0].text == GREEDY and plain.choices[0].finish_reason == "stop"
    assert plain.usage.completion_tokens < 12
    assert ignoring.choices[0].finish_reason == "length"
    assert ignoring.usage.completion_tokens == 14
    assert ignoring.choices[0].text.startswith(GREEDY)
    assert at_least.usage.completion_tokens >= 12


def test_unknown_fields_are_logged_descriptive_ones_accepted(server: Server, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="pegmask.server")
    model = server.engine.model_name
    descriptive = {"user": "u-1", "metadata": {"team": "a"}, "store": True}
    server.openai().chat.completions.create(
        model=model, messages=CAPITAL, max_tokens=2, extra_body={"frobnicate": 1},
        **descriptive)
    server.openai().responses.create(model=model, input="hi", max_output_tokens=2,
                                     extra_body={"wobble": True}, metadata={"team": "a"})
    server.anthropic().messages.create(model=model, messages=CAPITAL, max_tokens=2,
                                       metadata={"user_id": "u-1"}, extra_body={"jiggle": 0})
    unknown = set()
    for record in caplog.records:
        _, found, names = record.getMessage().partition("unknown fields ")
        if found:
            unknown |= set(names.split(", "))
    assert unknown == {"frobnicate", "wobble", "jiggle"}


def test_tool_call_ids_are_unique_whatever_the_seed(server: Server) -> None:
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
        "required": ["city"], "additionalProperties": False}}}
    request = {"model": server.engine.model_name, "tools": [tool], "tool_choice": "required",
               "parallel_tool_calls": False, "seed": 1, "max_tokens": 60,
               "messages": [{"role": "user", "content": "Weather in Oslo?"}]}
    client = server.openai()
    first, second = (client.chat.completions.create(**request) for _ in range(2))
    (a,), (b,) = first.choices[0].message.tool_calls, second.choices[0].message.tool_calls
    assert (a.function.name, json.loads(a.function.arguments)) == (
        b.function.name, json.loads(b.function.arguments))  # the same draw
    assert a.id != b.id
    several = client.chat.completions.create(**request, n=2)
    ids = [call.id for choice in several.choices for call in choice.message.tool_calls]
    assert len(ids) == len(set(ids)) == 2 and not {a.id, b.id} & set(ids)
