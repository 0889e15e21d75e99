"""Strict tool arguments by default: objects in tool parameter schemas that declare their
properties and say nothing of `additionalProperties` take no others (xgrammar's strict mode,
which vLLM applies to tool calls); `ChatRequest(strict_tool_arguments=False)` restores JSON
Schema's open objects; `response_format` is closed only with `"strict": true`."""

from __future__ import annotations

import json

import pytest

from pegmask.dialects import get_dialect
from pegmask.dialects.request import ChatRequest, RequestError
from pegmask.grammars import Grammar, GrammarError

DECLARED = {"type": "object", "properties": {"a": {"type": "integer"}}}


@pytest.mark.parametrize(("schema", "accepted", "rejected"), [
    (DECLARED, ['{"a": 1}', "{}"], ['{"b": 1}', '{"a": 1, "b": 2}']),
    ({"type": "object", "properties": {}}, ["{}"], ['{"b": 1}']),
    ({"type": "object", "patternProperties": {"^x": {"type": "integer"}}},
     ['{"x1": 1}'], ['{"y": 1}']),
    ({"type": "object"}, ['{"b": 1}', "{}"], []),  # declares nothing: any object
    ({**DECLARED, "additionalProperties": True}, ['{"a": 1, "b": "x"}'], []),
    ({**DECLARED, "additionalProperties": {"type": "string"}}, ['{"a": 1, "b": "x"}'],
     ['{"b": 1}']),
    ({"type": "array", "items": DECLARED}, ['[{"a": 1}]'], ['[{"a": 1, "c": 0}]']),
])
def test_declared_objects_are_closed(schema, accepted, rejected):
    grammar = Grammar.from_json_schema(schema, strict="declared")
    plain = Grammar.from_json_schema(schema)
    for text in accepted:
        assert grammar.matches(text) and plain.matches(text), text
    for text in rejected:
        assert not grammar.matches(text), text
        if "additionalProperties" not in schema and "patternProperties" not in schema:
            assert plain.matches(text), text


def test_an_unknown_strict_mode_is_an_error():
    with pytest.raises(GrammarError, match="strict"):
        Grammar.from_json_schema(DECLARED, strict="closed")
    with pytest.raises(RequestError, match="strict_tool_arguments") as error:
        ChatRequest(strict_tool_arguments="yes")
    assert error.value.param == "strict_tool_arguments"


def tool(parameters: dict) -> dict:
    return {"type": "function", "function": {"name": "f", "parameters": parameters}}


CALLS = {
    "hermes": lambda args: f'<tool_call>\n{{"name": "f", "arguments": {json.dumps(args)}}}'
                           "\n</tool_call>",
    "harmony": lambda args: ("<|channel|>commentary to=functions.f <|constrain|>json"
                             f"<|message|>{json.dumps(args)}<|call|>"),
}


@pytest.mark.parametrize("dialect_name", sorted(CALLS))
@pytest.mark.parametrize(("extra", "open_when_strict", "open_when_plain"), [
    ({}, False, True),
    ({"additionalProperties": True}, True, True),
    ({"additionalProperties": False}, False, False),
])
def test_tool_arguments_are_strict_by_default(dialect_name, extra, open_when_strict,
                                              open_when_plain):
    parameters = {"type": "object", "required": ["city"], "properties": {
        "city": {"type": "string"}, "when": {"type": "object", "properties": {
            "day": {"type": "integer"}}}}, **extra}
    dialect = get_dialect(dialect_name)
    call = CALLS[dialect_name]
    for strict_arguments in (True, False):  # the same dialect: its grammar cache tells them apart
        grammar = dialect.grammar(ChatRequest(
            tools=[tool(parameters)], tool_choice="required",
            chat_template_kwargs={"reasoning_effort": "none", "enable_thinking": False},
            strict_tool_arguments=strict_arguments))
        assert grammar.matches(call({"city": "Paris", "when": {"day": 1}}))
        assert grammar.matches(call({"city": "Paris", "type": "x"})) == (
            open_when_strict if strict_arguments else open_when_plain)
        # a nested object that declares its properties is closed the same way
        assert grammar.matches(call({"city": "Paris", "when": {"day": 1, "hour": 2}})) == (
            not strict_arguments)


def test_response_format_stays_open_unless_strict():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    for strict in (False, True):
        request = ChatRequest(response_format={"type": "json_schema", "json_schema": {
            "name": "answer", "schema": schema, "strict": strict}},
            chat_template_kwargs={"enable_thinking": False})
        grammar = get_dialect("hermes").grammar(request)
        assert grammar.matches('{"a": 1, "b": 2}') is not strict
