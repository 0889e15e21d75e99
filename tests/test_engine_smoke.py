"""The main job in CI: the embedded model answers with constrained tool calls and JSON.

The full engine batteries (tests/test_engine.py, tests/test_engine_tools.py,
tests/test_server.py) are marked slow; this file keeps the essential paths in every CI run.
"""

from __future__ import annotations

import json
import os

import jsonschema
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from pegmask import Engine  # noqa: E402

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine()


@pytest.mark.parametrize("seed", [0, 1])
def test_required_tool_call_is_valid(engine: Engine, seed: int) -> None:
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    result = engine.generate(messages, tools=[WEATHER], tool_choice="required",
                             temperature=1.0, seed=seed, max_tokens=96)
    calls = result.message["tool_calls"]
    if result.finish_reason != "length":
        assert result.finish_reason == "tool_calls"
        assert calls
    for call in calls:
        assert call["function"]["name"] == "get_weather"
        jsonschema.validate(json.loads(call["function"]["arguments"]),
                            WEATHER["function"]["parameters"])
