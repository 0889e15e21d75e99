"""Constrained output that stays well-formed at the budget's edge, on the embedded SmolLM2:
tool calls and JSON answers cut by max_tokens still parse and validate (close_on_length, on by
default), the opt-out cuts them, a budget below the shortest output is a 400 naming
max_tokens, and tool arguments are strict by default."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import jsonschema
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from pegmask import Engine, ParseError  # noqa: E402
from pegmask.dialects import accumulate  # noqa: E402
from pegmask.engine.requests import InvalidRequestError  # noqa: E402

EVENT = {"type": "object", "properties": {
    "title": {"type": "string"}, "description": {"type": "string"},
    "attendees": {"type": "array", "items": {"type": "string"}},
}, "required": ["title", "description", "attendees"]}
TOOLS = [{"type": "function", "function": {"name": "create_event", "parameters": EVENT}}]
ASK = [{"role": "user", "content": "Create an event for the LIFES stock market platform "
                                   "launch, with a long description of the platform."}]
CITY = {"type": "object", "properties": {
    "name": {"type": "string"}, "facts": {"type": "array", "items": {"type": "string"}},
    "location": {"type": "object", "properties": {"country": {"type": "string"},
                                                  "region": {"type": "string"}},
                 "required": ["country", "region"], "additionalProperties": False},
}, "required": ["name", "facts", "location"], "additionalProperties": False}
CITY_FORMAT = {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY}}
DESCRIBE = [{"role": "user", "content": "Describe Paris in detail as JSON."}]


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    with Engine() as engine:
        yield engine


def shortest(engine: Engine, **options) -> int:
    """The fewest tokens a request's grammar needs (its 400 names the figure)."""
    with pytest.raises(InvalidRequestError) as caught:
        engine.generate(ASK, max_tokens=1, **options)
    assert caught.value.param == "max_tokens"
    return int(str(caught.value).split(" takes ")[1].split()[0])


def accepts(grammar, text: str) -> bool:
    try:
        grammar.parse(text)
    except ParseError:
        return False
    return True


def arguments_of(result) -> list[dict]:
    calls = result.message["tool_calls"]
    assert calls, result.text
    return [json.loads(call["function"]["arguments"]) for call in calls]


def test_tool_calls_close_within_tight_budgets(engine: Engine) -> None:
    minimum = shortest(engine, tools=TOOLS, tool_choice="required")
    assert 20 < minimum < 60
    for budget in (minimum, minimum + 6, minimum + 20):
        for seed in range(2):
            result = engine.generate(ASK, tools=TOOLS, tool_choice="required",
                                     max_tokens=budget, temperature=1.0, seed=seed)
            assert result.usage["completion_tokens"] <= budget
            assert result.finish_reason in ("length", "tool_calls")
            for arguments in arguments_of(result):
                jsonschema.validate(arguments, EVENT)


def test_the_opt_out_cuts_the_call(engine: Engine) -> None:
    budget = shortest(engine, tools=TOOLS, tool_choice="required") + 6
    closed = engine.generate(ASK, tools=TOOLS, tool_choice="required", max_tokens=budget,
                             temperature=0.0)
    jsonschema.validate(arguments_of(closed)[0], EVENT)
    cut = engine.generate(ASK, tools=TOOLS, tool_choice="required", max_tokens=budget,
                          temperature=0.0, close_on_length=False)
    assert cut.finish_reason == "length"
    assert cut.usage["completion_tokens"] == budget
    arguments = cut.message["tool_calls"][0]["function"]["arguments"]
    with pytest.raises(ValueError):
        json.loads(arguments)


def test_json_answers_close_and_validate(engine: Engine) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        engine.generate(DESCRIBE, response_format=CITY_FORMAT, max_tokens=3)
    assert caught.value.param == "max_tokens"
    for budget in (30, 45):
        result = engine.generate(DESCRIBE, response_format=CITY_FORMAT, max_tokens=budget,
                                 temperature=1.0, seed=budget)
        assert result.usage["completion_tokens"] <= budget
        jsonschema.validate(json.loads(result.message["content"]), CITY)


def test_streams_and_choices_close_alike(engine: Engine) -> None:
    budget = shortest(engine, tools=TOOLS, tool_choice="required") + 4
    options = {"tools": TOOLS, "tool_choice": "required", "max_tokens": budget,
               "temperature": 1.0, "seed": 5}
    whole = engine.generate(ASK, **options)
    streamed = engine.generate(ASK, stream=True, **options)
    message = accumulate(list(streamed))
    assert [c["function"] for c in message["tool_calls"]] == \
        [c["function"] for c in whole.message["tool_calls"]]
    several = engine.generate(ASK, n=3, **options)
    assert len(several.choices) == 3
    for choice in several.choices:
        for call in choice.message["tool_calls"]:
            jsonschema.validate(json.loads(call["function"]["arguments"]), EVENT)


def test_optional_grammars_are_not_refused(engine: Engine) -> None:
    # tool_choice auto may answer in text: a small budget is no error.
    result = engine.generate(ASK, tools=TOOLS, tool_choice="auto", max_tokens=4, seed=0)
    assert result.usage["completion_tokens"] <= 4
    # Without closing, a small budget is allowed too (the answer is cut).
    cut = engine.generate(ASK, tools=TOOLS, tool_choice="required", max_tokens=4,
                          close_on_length=False)
    assert cut.finish_reason == "length"


def test_tool_arguments_are_strict_by_default(engine: Engine) -> None:
    assert engine.request(ASK, tools=TOOLS).chat.strict_tool_arguments is True
    grammar = engine.dialect.grammar(engine.request(ASK, tools=TOOLS,
                                                    tool_choice="required").chat)
    extra = ('<tool_call>\n{"name": "create_event", "arguments": {"title": "a", '
             '"description": "b", "attendees": [], "mood": "x"}}\n</tool_call>')
    plain = extra.replace(', "mood": "x"', "")
    assert accepts(grammar, plain) and not accepts(grammar, extra)
    loose = Engine(strict_tool_arguments=False, prewarm=False)
    request = loose.request(ASK, tools=TOOLS, tool_choice="required")
    assert request.chat.strict_tool_arguments is False
    assert accepts(loose.dialect.grammar(request.chat), extra)
    loose.close()
