"""JSON Schema `pattern` and `patternProperties` as ECMA-262 means them (issue 61): anchors
inside groups and alternatives, lookarounds, Unicode property classes, large counts and length
bounds, and key patterns beside many property names. `jsonschema` (Python's `re.search`) is
the oracle; texts avoid a newline, where Python's `$` and ECMAScript's differ."""

from __future__ import annotations

import json
import unicodedata
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pegmask.bench.data import JSONSCHEMA_DIR
from pegmask.bench.jsonschema_agreement import property_orders, schema_ordered
from pegmask.grammars import Grammar, UnsupportedSchemaError

FAST = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])

SCHEMA_PATTERNS = [
    r"(^[0-9]+\.[0-9]+$)",
    r"^$|(^[a-z]+-[0-9])",
    r"^([^,]|$)",
    r"(^|,)ab(,|$)",
    r"^(?!foo)[a-z]+$",
    r"^(?=.*[A-Z])(?=.*\d).{4,8}$",
    r"foo(?!bar)",
    r"(?<![a-z])\d+",
    r"\d{1,1000}",
    r"^a{2,1000}$",
]


def validator(schema: dict[str, Any]) -> jsonschema.protocols.Validator:
    return jsonschema.Draft202012Validator(schema)


@pytest.mark.parametrize("pattern", SCHEMA_PATTERNS)
@FAST
@given(text=st.text(alphabet="abfoAZ019.,-r", max_size=10))
def test_patterns_agree_with_jsonschema(pattern: str, text: str) -> None:
    schema = {"type": "string", "pattern": pattern}
    grammar = compiled(json.dumps(schema))
    assert grammar.matches(json.dumps(text)) == validator(schema).is_valid(text)


_GRAMMARS: dict[str, Grammar] = {}


def compiled(schema_text: str, **options: Any) -> Grammar:
    key = schema_text + repr(sorted(options.items()))
    if key not in _GRAMMARS:
        _GRAMMARS[key] = Grammar.from_json_schema(json.loads(schema_text), **options)
    return _GRAMMARS[key]


@FAST
@given(char=st.characters(exclude_categories=("Cs",)))
def test_unicode_property_classes_in_schemas(char: str) -> None:
    grammar = compiled(json.dumps({"type": "string", "pattern": r"^\p{Letter}\P{L}$"}))
    other = "x" if not unicodedata.category(char).startswith("L") else "1"
    assert grammar.matches(json.dumps("a" + char)) == (not unicodedata.category(char).startswith("L"))
    assert grammar.matches(json.dumps(char + other)) == (
        unicodedata.category(char).startswith("L") and other == "1")


def test_a_pattern_that_never_matches_empties_its_string_only() -> None:
    """ECMAScript reads `/^x$/` as a slash, a start anchor...: no string matches, so the
    optional property is left out, while the rest of the schema still compiles."""
    schema = {"type": "object", "properties": {"a": {"type": "string", "pattern": "/^x$/"},
                                                "b": {"type": "integer"}}}
    grammar = Grammar.from_json_schema(schema)
    assert grammar.matches('{"b": 1}') and not grammar.matches('{"a": "/x/"}')


def test_length_bounds_beside_alternatives_of_fixed_lengths() -> None:
    """`(jpg|jpeg|png)[...]*` with a large maxLength: spread into one sequence per
    alternative, each absorbs the bound (it was "length bound too large")."""
    schema = {"type": "string", "maxLength": 32767,
              "pattern": r"^data:image/(jpg|jpeg|png|svg\+xml);base64,[0-9a-zA-Z+/=]*$"}
    grammar = Grammar.from_json_schema(schema)
    head = "data:image/jpeg;base64,"
    assert grammar.matches(json.dumps(head + "A" * (32767 - len(head))))
    assert not grammar.matches(json.dumps(head + "A" * (32768 - len(head))))
    assert not grammar.matches(json.dumps("data:image/gif;base64,AA"))


def test_large_counts_beside_an_unanchored_side_are_cut() -> None:
    """A search for `\\d{1,1000}` is a search for one digit: no 1,000-state automaton when it
    meets a `not` pattern."""
    schema = {"type": "string", "pattern": r"\d{1,1000}", "not": {"pattern": "^0"}}
    grammar = Grammar.from_json_schema(schema)
    assert grammar.matches('"a1"') and not grammar.matches('"01"') and not grammar.matches('"ab"')


# The 98 block names of WordPress's theme.json (a JsonSchemaStore schema in data/jsonschema).
NAMES = list(json.loads((JSONSCHEMA_DIR / "JsonSchemaStore---theme.json").read_text())["schema"]
             ["definitions"]["stylesBlocksPropertiesComplete"]["properties"])
KEYS_SCHEMA = {"type": "object", "additionalProperties": False,
               "properties": {name: {"type": "string"} for name in NAMES},
               "patternProperties": {"^[a-z][a-z0-9-]*/[a-z][a-z0-9-]*$": {"type": ["integer", "string"]}}}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(named=st.lists(st.sampled_from(NAMES), max_size=3, unique=True),
       extra=st.lists(st.one_of(st.sampled_from(NAMES).map(lambda n: n[:-1]),
                                st.sampled_from(NAMES).map(lambda n: n + "x"),
                                st.text(alphabet="core/a1-X", max_size=8)), max_size=3),
       values=st.lists(st.one_of(st.integers(0, 9), st.sampled_from(["s", "t"])), min_size=6, max_size=6))
def test_key_patterns_beside_a_hundred_names(named: list[str], extra: list[str],
                                             values: list[Any]) -> None:
    """A key pattern next to theme.json's 98 names ("regular language too large" before; now
    the names' trie walked along the pattern's automaton, `regular.without_words`): keys that match the pattern but are no name take its schema; named keys keep
    theirs; other keys are refused."""
    grammar = compiled(json.dumps(KEYS_SCHEMA))
    value = {name: values[i] for i, name in enumerate(sorted(named, key=NAMES.index))}
    for i, key in enumerate(extra):
        value.setdefault(key, values[3 + i])
    assert grammar.matches(json.dumps(value)) == validator(KEYS_SCHEMA).is_valid(value), value


OVERLAPPING_KEYS = {"type": "object", "properties": {"environment": {}, "names": {}},
                    "patternProperties": {"env|matrix|name": {"type": "integer"},
                                          "x[0-9]+y": {"minimum": 3}},
                    "additionalProperties": {"type": "string"}}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(key=st.one_of(st.text(alphabet="envmatrixname0y19", max_size=12),
                     st.text(alphabet="envmatrixname0y19", min_size=2000, max_size=3000)),
       value=st.sampled_from([1, 5, "a"]))
def test_key_regions_spelled_as_rules_take_keys_of_any_length(key: str, value: Any) -> None:
    """hatch.json's shape: an unanchored key pattern beside a name that contains it. The
    keys outside both have no compact regular expression; they are spelled as one rule per
    automaton state, tail calls, so a 3,000-character key stacks nothing."""
    grammar = compiled(json.dumps(OVERLAPPING_KEYS))
    obj = {"environment": 1, key: value} if key != "environment" else {key: value}
    assert grammar.matches(json.dumps(obj)) == validator(OVERLAPPING_KEYS).is_valid(obj)


PATTERN_SCHEMAS = ["Github_easy---o55159.json", "Github_medium---o55162.json",
                   "Github_medium---o9907.json", "JsonSchemaStore---chrome-extension-locales-messages.json",
                   "Github_easy---o21833.json"]


@pytest.mark.parametrize("name", PATTERN_SCHEMAS)
def test_real_schemas_refused_for_their_patterns_now_compile(name: str) -> None:
    """Each was refused for a pattern before issue 61 (an anchor in a group, a lookahead,
    a length bound); each of its labelled instances gets the label's verdict (keys in schema
    order, the documented generation choice)."""
    data = json.loads((JSONSCHEMA_DIR / name).read_text())
    grammar = Grammar.from_json_schema(data["schema"])
    orders = property_orders(data["schema"])
    for test in data.get("tests", []):
        text = json.dumps(schema_ordered(test["data"], orders))
        assert grammar.matches(text) == test["valid"], test


def test_key_patterns_still_refused_precisely() -> None:
    schema = {"type": "object", "patternProperties": {r"(a)\1": {}}}
    with pytest.raises(UnsupportedSchemaError) as caught:
        Grammar.from_json_schema(schema)
    assert caught.value.keyword == "pattern" and "backreference" in str(caught.value)
