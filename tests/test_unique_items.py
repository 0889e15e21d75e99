"""`uniqueItems` enforced in the grammar where items come from a finite set of values (issue
61): arrays are fed token by token on SmolLM2's vocabulary (every token checked against the
mask, EOS required at the end) and must get `jsonschema`'s verdict; a duplicate is refused
before its item is complete. Elsewhere a precise `UnsupportedSchemaError`."""

from __future__ import annotations

import functools
import json
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from vocabularies import smollm2, smollm2_tokenizer

from pegmask.bench.jsonschema_agreement import PegmaskEngine
from pegmask.grammars import Grammar, UnsupportedSchemaError
from pegmask.grammars.json_schema.emit import MAX_UNIQUE_STATES

SCHEMAS = [
    {"type": "array", "uniqueItems": True, "items": {"enum": ["red", "green", "blue", 1, 1.0, None]}},
    {"type": "array", "uniqueItems": True, "items": {"type": "boolean"}, "minItems": 1},
    {"type": "array", "uniqueItems": True, "maxItems": 3,
     "items": {"anyOf": [{"const": [1, 2]}, {"const": {"a": 1}}, {"type": "null"}, {"enum": ["x", 7]}]}},
    {"type": "array", "uniqueItems": True, "prefixItems": [{"enum": [1, 2]}],
     "items": {"enum": [1, 2, 3]}, "contains": {"const": 3}},
]
VALUES = ["red", "green", "blue", 1, 1.0, 2, 3, 7, "x", None, True, False, [1, 2], {"a": 1}]


@functools.cache
def engine() -> PegmaskEngine:
    return PegmaskEngine(smollm2())


@functools.cache
def compiled(index: int) -> Any:
    return engine().compile(SCHEMAS[index])


def duplicate_end(array: list[Any]) -> int | None:
    """Offset in `json.dumps(array)` just after the first item equal to an earlier one."""
    seen: list[Any] = []
    for i, item in enumerate(array):
        if any(jsonschema.Draft202012Validator({"const": item}).is_valid(s) for s in seen):
            return len(json.dumps(array[: i + 1])) - 1
        seen.append(item)
    return None


@pytest.mark.parametrize("index", range(len(SCHEMAS)))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(array=st.lists(st.sampled_from(VALUES), max_size=5))
def test_token_by_token_agrees_with_jsonschema(index: int, array: list[Any]) -> None:
    schema = SCHEMAS[index]
    text = json.dumps(array)
    tokens = smollm2_tokenizer().encode(text, add_special_tokens=False)
    accepted, refused_at, problem = engine().run(compiled(index), tokens, text)
    assert problem is None
    assert accepted == jsonschema.Draft202012Validator(schema).is_valid(array), text
    end = duplicate_end(array)
    if end is not None:  # never lets a duplicate complete
        assert not accepted and refused_at <= end, (text, refused_at, end)


@settings(max_examples=40, deadline=None)
@given(array=st.lists(st.sampled_from(["a", "b", "c", "d"]), max_size=5))
def test_byte_by_byte_compact_and_spaced(array: list[str]) -> None:
    schema = {"type": "array", "uniqueItems": True, "items": {"enum": ["a", "b", "c", "d"]},
              "maxItems": 4}
    grammar = Grammar.from_json_schema(schema)
    valid = jsonschema.Draft202012Validator(schema).is_valid(array)
    for text in (json.dumps(array), json.dumps(array, separators=(",", ":")),
                 json.dumps(array, indent=1)):
        assert grammar.matches(text) == valid, text


def test_refusals_are_precise() -> None:
    for schema, reason in [
        ({"type": "array", "uniqueItems": True, "items": {"type": "string"}}, "finite set"),
        ({"type": "array", "uniqueItems": True}, "finite set"),
        ({"type": "array", "uniqueItems": True, "items": {"enum": list(range(12))}},
         f"more than {MAX_UNIQUE_STATES} grammar states"),
    ]:
        with pytest.raises(UnsupportedSchemaError) as caught:
            Grammar.from_json_schema({"properties": {"tags": schema}})
        assert caught.value.keyword == "uniqueItems" and caught.value.pointer == "/properties/tags"
        assert reason in str(caught.value)
    # Twelve values, at most three of them: few enough sets.
    grammar = Grammar.from_json_schema({"type": "array", "uniqueItems": True, "maxItems": 3,
                                        "items": {"enum": list(range(12))}})
    assert grammar.matches("[11, 0, 5]") and not grammar.matches("[11, 0, 11]")


def test_unique_items_beside_other_keywords() -> None:
    """`allOf` adds uniqueness to an array schema; a const that repeats items is filtered."""
    schema = {"allOf": [{"type": "array", "items": {"enum": ["a", "b"]}}, {"uniqueItems": True}]}
    grammar = Grammar.from_json_schema(schema)
    assert grammar.matches('["a", "b"]') and not grammar.matches('["b", "b"]')
    constant = Grammar.from_json_schema({"uniqueItems": True, "enum": [[1, 1], [1, 2], "x"]})
    assert constant.matches("[1, 2]") and constant.matches('"x"') and not constant.matches("[1, 1]")
