"""The constraint format the integrations share, and `OutputFollower`, on SmolLM2's vocabulary."""

from __future__ import annotations

import pytest
from vocabularies import smollm2

from pegmask.engine.requests import InvalidRequestError
from pegmask.integrations.constraints import (
    Constraints,
    OutputFollower,
    TokenRejected,
    grammar_for_spec,
)


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
