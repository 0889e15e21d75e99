"""bench/vllm_check.py's load table without vLLM: how an answer is judged valid (JSON under its
schema, tool calls in pegmask's and in vLLM's call-array form) and the table's layout, ratio
and publishability from made-up phases."""

from __future__ import annotations

import argparse
import asyncio
import json
from types import SimpleNamespace
from typing import Any

import pytest

from pegmask.bench.vllm_check import (
    SCHEMAS,
    TIME,
    WEATHER,
    answer_valid,
    array_calls,
    calls_valid,
    load_report,
    load_schema,
    load_warm_up,
    numbers,
)

TOOLS = [WEATHER, TIME]


def test_calls_valid_needs_a_declared_tool_with_valid_arguments() -> None:
    weather = {"name": "get_weather", "arguments": '{"city": "Tokyo", "unit": "celsius"}'}
    assert calls_valid([weather], TOOLS)
    assert calls_valid([weather, {"name": "get_time", "arguments": '{"city": "Oslo"}'}], TOOLS)
    assert not calls_valid([], TOOLS)
    assert not calls_valid([{"name": "get_news", "arguments": '{"city": "Tokyo"}'}], TOOLS)
    assert not calls_valid([{"name": "get_weather", "arguments": '{"city": "Tokyo"}'}], TOOLS)
    assert not calls_valid([{"name": "get_time", "arguments": '{"city": "Os'}], TOOLS)


def test_array_calls_read_vllms_required_form() -> None:
    content = json.dumps([{"name": "get_time", "parameters": {"city": "Oslo"}}])
    assert array_calls(content) == [{"name": "get_time", "arguments": '{"city": "Oslo"}'}]
    assert calls_valid(array_calls(content), TOOLS)
    assert array_calls('[{"name": "get_time", "parameters": {"city"') == []  # cut
    assert array_calls('{"name": "get_time"}') == []
    assert array_calls(None) == []


def test_answer_valid_per_kind_and_side() -> None:
    schema = load_schema(0)
    required = schema.get("required", [])
    assert required  # the first schema asks for fields: an empty object is invalid
    assert not answer_valid("json", "pegmask", 0, SimpleNamespace(content="{}", tool_calls=None))
    assert not answer_valid("json", "xgrammar", 0, SimpleNamespace(content='{"a', tool_calls=None))
    call = SimpleNamespace(function=SimpleNamespace(name="get_time", arguments='{"city": "Rome"}'))
    ours = SimpleNamespace(content=None, tool_calls=[call])
    assert answer_valid("tools", "pegmask", 0, ours)
    assert not answer_valid("tools", "xgrammar", 0, ours)  # xgrammar's calls are in the content
    theirs = SimpleNamespace(content='[{"name": "get_time", "parameters": {"city": "Rome"}}]',
                             tool_calls=None)
    assert answer_valid("tools", "xgrammar", 0, theirs)


def phase(tokens_per_s: float, valid: int, length: int, cut: int) -> dict[str, Any]:
    return {"requests": 8, "valid": valid, "length": length, "cut": cut, "tokens": 100,
            "seconds": 1.0, "tokens_per_s": tokens_per_s, "shortest": 20, "load_1min": 0.4}


@pytest.mark.parametrize("start_load", [0.3, 1.7])
def test_load_report_rows_ratio_and_verdict(start_load: float) -> None:
    rows = [{"concurrency": 8, "kind": "json", "max_tokens": 32, "fewest": 24,
             "pegmask": phase(95.0, 8, 3, 0), "xgrammar": phase(100.0, 5, 3, 3)}]
    load = {"start_load": start_load, "publishable": start_load <= 1.0, "ready_s": 60.0,
            "minimum_requests": 8, "rows": rows}
    lines = load_report(load)
    table = [line for line in lines if line.startswith("| 8 |")]
    assert table == ["| 8 | json | 32 | 24 | 95.0 | 100.0 | 0.95x | 8/8 | 5/8 | 3 / 0 | 3 / 3 | "
                     "20 / 20 | 0.4 / 0.4 |"]
    header = next(line for line in lines if line.startswith("| N |"))
    assert header.count("|") == table[0].count("|")
    assert ("Not publishable" in "\n".join(lines)) == (start_load > 1.0)


def test_numbers() -> None:
    assert numbers("1,8,32") == [1, 8, 32]
    with pytest.raises(argparse.ArgumentTypeError):
        numbers("0,8")


def test_the_warm_up_compiles_every_grammar_on_both_sides() -> None:
    """Before the timed phases, each side gets one request per JSON schema and one tool call,
    at the given budget: no phase pays a grammar's first compile."""
    sent: list[dict[str, Any]] = []

    async def create(**options: Any) -> None:
        sent.append(options)

    client = SimpleNamespace(chat=SimpleNamespace(completions=SimpleNamespace(create=create)))
    array_schema = {"type": "array"}
    count = asyncio.run(load_warm_up(client, array_schema, 16))
    assert count == len(sent) == 2 * (len(SCHEMAS) + 1)
    assert {option["max_tokens"] for option in sent} == {16}
    xargs = [json.loads(option["extra_body"]["vllm_xargs"]["pegmask"])["json_schema"]
             for option in sent if "extra_body" in option]
    formats = [option["response_format"]["json_schema"]["schema"] for option in sent
               if "response_format" in option]
    schemas = [load_schema(i) for i in range(len(SCHEMAS))]
    assert xargs == schemas  # pegmask's side, each schema once
    assert formats == [*schemas, array_schema]  # xgrammar's, and its call array
    tools = [option for option in sent if option.get("tool_choice") == "required"]
    assert len(tools) == 2
