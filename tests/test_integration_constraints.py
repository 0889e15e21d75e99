"""The constraint format the integrations share, `OutputFollower`, and closing within a budget
(`fill_within_budget`), on SmolLM2's vocabulary."""

from __future__ import annotations

import json
import random

import pytest
import torch
from vocabularies import smollm2, smollm2_tokenizer

from pegmask.engine.requests import InvalidRequestError
from pegmask.integrations.constraints import (
    FIT_WINDOW,
    Constraints,
    OutputFollower,
    TokenRejected,
    fill_within_budget,
    grammar_for_spec,
)
from pegmask.kernels import allocate_token_bitmask, unpack_bitmask


@pytest.fixture(scope="module")
def constraints() -> Constraints:
    return Constraints(smollm2())


def token(text: str) -> int:
    return smollm2().token_bytes.index(text.encode())


def test_equal_specs_share_one_compiled_grammar(constraints: Constraints) -> None:
    spec = {"json_schema": {"type": "object"}, "strict": True}
    assert constraints.compiled(spec) is constraints.compiled('{"json_schema": {"type": '
                                                              '"object"}, "strict": true}')
    dialect = {"dialect": "hermes", "tools": [{"type": "function", "function": {"name": "f"}}]}
    assert grammar_for_spec(dialect) is grammar_for_spec(dict(dialect))


def test_follower_reads_rolls_back_and_stops(constraints: Constraints) -> None:
    a, b, eos = token("a"), token("b"), smollm2().eos_ids[0]
    follower = OutputFollower(constraints.matcher({"regex": "[ab]{1,4}"}))
    follower.follow([a, b, a])
    follower.follow([a, a])  # another row's history (beam search): back to [a], then a
    assert follower.read == [a, a]
    follower.follow([a, b], start=1)  # tokens from index 1 on
    assert follower.read == [a, a, b]
    follower.follow([a, a, b, eos, eos, eos])  # padding after the stop token is not read
    assert follower.stopped and follower.read == [a, a, b, eos]
    with pytest.raises(TokenRejected, match="outside the grammar"):
        OutputFollower(constraints.matcher({"regex": "[ab]+"})).follow([token("c")])
    with pytest.raises(ValueError, match="past the"):
        follower.follow([a], start=9)


@pytest.mark.parametrize(("spec", "param"), [
    ({}, "pegmask"), ([1], "pegmask"), ("nope", "pegmask"),
    ({"regex": "a", "choice": ["a"]}, "pegmask"), ({"regex": "a", "strict": True}, "strict"),
    ({"json_object": "yes"}, "json_object"), ({"json_schema": "{"}, "json_schema"),
    ({"json_schema": {}, "strict": 1}, "strict"), ({"choice": []}, "response_format"),
    ({"dialect": "hermes", "reasoning": "no"}, "reasoning"),
    ({"dialect": "hermes", "tools": {}}, "tools"),
    ({"dialect": "hermes", "tool_choice": {"type": "function", "function": {"name": "x"}}},
     "tool_choice"),
])
def test_bad_specs_name_the_field(spec: object, param: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        grammar_for_spec(spec)
    assert info.value.param == param


ITEM = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 12},
    "nested": {"type": "object", "properties": {"required_key_that_is_long": {
        "type": "string"}}, "required": ["required_key_that_is_long"]},
    "n": {"type": "integer"}}, "required": ["name"], "additionalProperties": False}
LIST = {"type": "array", "items": ITEM, "minItems": 1}


@pytest.mark.parametrize("budget", [9, 16, 30])
def test_random_outputs_under_the_budget_mask_always_end_complete(
        constraints: Constraints, budget: int) -> None:
    """Uniformly random picks among the allowed tokens (no model to steer them), the mask
    filled with `fill_within_budget`: every output is complete when the budget runs out,
    optional members with long required parts (a token there raises the completion by
    many) included."""
    vocab = constraints.vocab
    bitmask = allocate_token_bitmask(1, vocab.size)
    chooser = random.Random(budget)
    for _ in range(12):
        matcher = constraints.matcher({"json_schema": LIST})
        out: list[int] = []
        while len(out) < budget and not matcher.stopped:
            fill_within_budget(matcher, bitmask, 0, budget - len(out))
            allowed = unpack_bitmask(bitmask.numpy(), vocab.size)[0].nonzero()[0].tolist()
            token = chooser.choice(allowed)
            assert matcher.accept_token(token)
            if not matcher.stopped:
                out.append(token)
        text = b"".join(vocab.token_bytes[t] for t in out).decode()
        assert isinstance(json.loads(text), list), text


def test_overlong_tokens_are_those_whose_plan_is_past_the_limit(
        constraints: Constraints) -> None:
    """`overlong_tokens` against accepting each allowed token and counting its plan."""
    matcher = constraints.matcher({"json_schema": ITEM})
    for piece in (b'{"name": "a"', b", "):
        assert matcher.accept_string(piece)
    bitmask = allocate_token_bitmask(1, constraints.vocab.size)
    matcher.fill_next_token_bitmask(bitmask, 0)
    allowed = unpack_bitmask(bitmask.numpy(), constraints.vocab.size)[0].nonzero()[0].tolist()
    plans = {}
    for token in allowed:
        assert matcher.accept_token(token)
        plans[token] = matcher.completion_token_count()
        matcher.rollback(1)
    for limit in (2, 5, 9):
        over = set(matcher.overlong_tokens(limit).tolist())
        assert over == {t for t, plan in plans.items() if plan is None or plan > limit}, limit


def test_far_from_the_end_the_mask_is_the_plain_one(constraints: Constraints) -> None:
    matcher = constraints.matcher({"json_schema": LIST})
    plain = allocate_token_bitmask(1, constraints.vocab.size)
    budgeted = allocate_token_bitmask(1, constraints.vocab.size)
    matcher.fill_next_token_bitmask(plain, 0)
    assert fill_within_budget(matcher, budgeted, 0, 10 * FIT_WINDOW)
    assert torch.equal(plain, budgeted)
    assert fill_within_budget(matcher, budgeted, 0, None) and torch.equal(plain, budgeted)


REQUIRED_CALL = {"dialect": "hermes", "reasoning": False, "tool_choice": "required",
                 "tools": [{"type": "function", "function": {"name": "f"}}]}


@pytest.mark.parametrize(("tail", "reasons"), [
    ("<think>\n", True),  # the template opened the block itself: the output starts inside it
    ("<think>\n\n</think>\n\n", False),  # it closed an empty one
    ("", False),  # none: the spec's reasoning option
])
def test_a_dialect_spec_reads_its_reasoning_start_from_the_prompt(
        constraints: Constraints, tail: str, reasons: bool) -> None:
    tokenizer = smollm2_tokenizer()
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False,
                                           add_generation_prompt=True) + tail
    ids = tokenizer.encode(prompt, add_special_tokens=False)
    assert constraints.vocab.text_of(ids) == prompt
    matcher = constraints.matcher(REQUIRED_CALL, ids)
    # tool_choice "required": without reasoning the turn opens with the call's tag
    assert matcher.accept_token(token("Sure")) is reasons
    plain = constraints.matcher({"json_object": True}, ids)  # other kinds ignore the prompt
    assert plain.compiled is constraints.compiled({"json_object": True})
