"""The JSON Schema front-end: per-keyword behaviour, errors, options, property tests against
`jsonschema`, and the agreement sweep over data/jsonschema."""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pegmask.bench.data import JSONSCHEMA_DIR
from pegmask.bench.jsonschema_coverage import measure, schema_files
from pegmask.grammars import Grammar, GrammarError, SchemaError, UnsupportedSchemaError, json_schema
from pegmask.grammars.ir import Choice, GrammarIR, Literal, Ref, Seq, json_schema_node
from pegmask.grammars.json_schema import expand_json_schemas, schema_to_rules


def spellings(value: Any) -> list[str]:
    return [json.dumps(value, separators=(",", ":")), json.dumps(value),
            json.dumps(value, ensure_ascii=False)]


def check(schema: Any, valid: list[Any] = (), invalid: list[Any] = (), *, oracle: bool = True,
          **options: Any) -> Grammar:
    """Every spelling of `valid` values parses, no spelling of `invalid` ones does. With
    `oracle`, `jsonschema` must agree that the `valid` values are valid (so the expectations
    themselves are right; it checks only some formats, so it cannot vet `invalid`)."""
    grammar = Grammar.from_json_schema(schema, **options)
    validator = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    checker = validator(schema, format_checker=validator.FORMAT_CHECKER)
    for value in valid:
        if oracle:
            assert checker.is_valid(value), value
        for text in spellings(value):
            assert grammar.matches(text), f"rejected valid {text}"
    for value in invalid:
        for text in spellings(value):
            assert not grammar.matches(text), f"accepted invalid {text}"
    return grammar


def accepts(schema: Any, text: str, **options: Any) -> bool:
    return Grammar.from_json_schema(schema, **options).matches(text)


# ---------------------------------------------------------------------------- types
def test_types() -> None:
    check({"type": "null"}, [None], [0, False, "", [], {}])
    check({"type": "boolean"}, [True, False], [None, 0, "true"])
    check({"type": "integer"}, [0, -1, 12345678901234567890], [1.5, "1", None])
    check({"type": "number"}, [0, -1, 1.5, -2.25e-7, 1e300], ["1", None, True])
    check({"type": "string"}, ["", "a", 'q"uote', "back\\slash", "tab\t", "é", "😀", "\x00"],
          [1, None])
    check({"type": "array"}, [[], [1, "a", [None]]], [{}, "[]"])
    check({"type": "object"}, [{}, {"a": [1, {"b": None}]}], [[], "{}"])
    check({"type": ["string", "null"]}, ["x", None], [1, []])
    check({"type": "string", "nullable": True}, ["x", None], [1], oracle=False)  # OpenAPI
    check(True, [None, 1, "x", [], {}])
    check({}, [None, 1, "x", [], {"a": {}}])


def test_number_syntax() -> None:
    grammar = Grammar.from_json_schema({"type": "number"})
    for text in ["0", "-0", "1.0", "1e5", "1E+5", "-1.5e-3", "10"]:
        assert grammar.matches(text), text
    for text in ["01", "1.", ".5", "+1", "1e", "NaN", "Infinity", "0x10", "--1"]:
        assert not grammar.matches(text), text
    integer = Grammar.from_json_schema({"type": "integer"})
    assert integer.matches("-0") and not integer.matches("1.0") and not integer.matches("1e2")


def test_string_escapes() -> None:
    grammar = Grammar.from_json_schema({"type": "string"})
    for text in [r'"\""', r'"\\"', r'"\/"', r'"\b\f\n\r\t"', r'"\u00e9"', r'"\uD83D\uDE00"',
                 r'"\u001F"', '"é"']:
        assert grammar.matches(text), text
    for text in ['"\n"', '"\x01"', r'"\x41"', r'"\u12"', r'"\uD83D"', r'"\uDE00"', r'"\a"', '"',
                 '"a', "'a'"]:
        assert not grammar.matches(text), text


# ---------------------------------------------------------------------------- enum / const
def test_enum_and_const() -> None:
    check({"enum": ["a", 1, None, True, [1, "x"], {"k": "v"}, 'q"é']},
          ["a", 1, None, True, [1, "x"], {"k": "v"}, 'q"é', 1.0], ["b", 2, False, [1], {}])
    check({"const": {"a": [1, 2]}}, [{"a": [1, 2]}], [{"a": [1]}, {}])
    check({"type": "string", "enum": ["a", 1, "b"], "maxLength": 1}, ["a", "b"], [1])
    check({"const": 2.5}, [2.5], [2, 25])


# ---------------------------------------------------------------------------- objects
def test_properties_required_additional() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
              "required": ["a"]}
    check(schema, [{"a": 1}, {"a": 1, "b": "x"}, {"a": 1, "c": [1]}, {"a": 1, "b": "x", "zz": 1}],
          [{}, {"b": "x"}, {"a": "1"}, {"a": 1, "b": 2}, {"a": 1, "a ": 1, "b": 3}])
    # Extra keys can never be named keys with the wrong value.
    check({"properties": {"a": {"type": "integer"}}}, [{"x": 1}], [{"x": 1, "a": "s"}],
          property_order="any")
    closed = {**schema, "additionalProperties": False}
    check(closed, [{"a": 1, "b": "x"}], [{"a": 1, "c": 1}])
    typed = {**schema, "additionalProperties": {"type": "boolean"}}
    check(typed, [{"a": 1, "c": True}], [{"a": 1, "c": 1}])


def test_strict_forbids_unlisted_properties() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    check(schema, [{"a": 1}, {}], [{"b": 1}, {"a": 1, "b": 1}], strict=True, oracle=False)
    assert accepts(schema, '{"b":1}')
    assert accepts({"type": "object", "properties": {"a": {}}, "additionalProperties": True},
                   '{"b":1}', strict=True)
    assert accepts({}, '{"b":1}', strict=True)  # an unconstrained value stays unconstrained


def test_property_order() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
              "required": ["a", "b"]}
    assert accepts(schema, '{"a":1,"b":2}') and not accepts(schema, '{"b":2,"a":1}')
    check(schema, [{"b": 2, "a": 1}, {"a": 1, "b": 2}, {"c": 0, "b": 2, "d": 0, "a": 1}],
          [{"a": 1}, {"b": 2, "c": 0}], property_order="any")
    assert not accepts(schema, '{"a":1,"b":2,"a":1}', property_order="any")
    # Optional properties may be skipped in any position; extras go last in schema order.
    many = {"type": "object", "properties": {k: {"type": "integer"} for k in "abcdefghij"}}
    check(many, [{}, {"j": 1}, {"a": 1, "e": 2, "j": 3}, {"a": 1, "z": 2}], [{"a": "x"}])
    assert not accepts(many, '{"z":1,"a":1}')


def test_schema_order_follows_the_text() -> None:
    """Properties from $ref / allOf / oneOf come where the schema writes them."""
    base = {"definitions": {"base": {"properties": {"id": {"type": "integer"}}, "required": ["id"]}}}
    before = {**base, "type": "object", "allOf": [{"$ref": "#/definitions/base"}],
              "properties": {"name": {"type": "string"}}, "required": ["name"]}
    assert accepts(before, '{"id":1,"name":"x"}') and not accepts(before, '{"name":"x","id":1}')
    after = {**base, "type": "object", "properties": {"name": {"type": "string"}},
             "required": ["name"], "oneOf": [{"$ref": "#/definitions/base"}]}
    assert accepts(after, '{"name":"x","id":1}') and not accepts(after, '{"id":1,"name":"x"}')


def test_schema_order_of_all_of_refs() -> None:
    """`allOf` of `$ref`s keeps its order, not the order of the definition names."""
    defs = {"A": {"properties": {"a": {"type": "integer"}}, "required": ["a"]},
            "B": {"properties": {"b": {"type": "integer"}}, "required": ["b"]}}
    schema = {"$defs": defs, "type": "object",
              "allOf": [{"$ref": "#/$defs/B"}, {"$ref": "#/$defs/A"}]}
    assert accepts(schema, '{"b":1,"a":2}') and not accepts(schema, '{"a":2,"b":1}')
    check(schema, [{"a": 2, "b": 1}], [{"a": 2}], property_order="any")
    three = {"$defs": {**defs, "C": {"properties": {"c": {}}}}, "type": "object",
             "allOf": [{"$ref": "#/$defs/C"}, {"$ref": "#/$defs/B"}, {"$ref": "#/$defs/A"}]}
    assert accepts(three, '{"c":0,"b":1,"a":2}') and not accepts(three, '{"a":2,"b":1}')


def test_pattern_properties() -> None:
    schema = {"type": "object", "patternProperties": {"^x-": {"type": "string"}},
              "properties": {"x-named": {"type": "integer"}}}
    check(schema, [{"x-a": "s", "other": 1}, {}],  # "x-named" must be an integer and a string
          [{"x-a": 1}, {"x-named": "s"}, {"x-named": 1}])
    closed = {"type": "object", "patternProperties": {"^[a-z]+$": {"type": "integer"}},
              "additionalProperties": False}
    check(closed, [{"abc": 1}], [{"ABC": 1}, {"abc": "x"}])
    both = {"type": "object", "patternProperties": {"a": {"type": "integer"}, "b": {"minimum": 3}},
            "additionalProperties": {"type": "string"}}
    check(both, [{"a": 1, "ab": 3, "b": 4, "c": "s", "bb": "x"}], [{"ab": 2}, {"b": 2}, {"c": 1}])
    six = {"type": "object", "additionalProperties": False,
           "patternProperties": {f"^{c}": {"const": i} for i, c in enumerate("abcdef")}}
    check(six, [{"a1": 0, "f": 5}], [{"a": 1}, {"g": 0}])


def test_property_names_and_counts() -> None:
    check({"type": "object", "propertyNames": {"pattern": "^[a-z]+$", "maxLength": 3}},
          [{"ab": 1}, {}], [{"abcd": 1}, {"A": 1}])
    check({"type": "object", "minProperties": 1}, [{"a": 1}], [{}])
    check({"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 2,
           "maxProperties": 3}, [{"a": 1, "b": 2}, {"a": 1, "b": 2, "c": 3}],
          [{"a": 1}, {"a": 1, "b": 2, "c": 3, "d": 4}])
    counted = {"type": "object", "properties": {"a": {}, "b": {}, "c": {}}, "required": ["b"],
               "minProperties": 2, "maxProperties": 3}
    check(counted, [{"a": 1, "b": 2}, {"b": 1, "c": 2}, {"a": 1, "b": 2, "c": 3}, {"b": 1, "x": 2}],
          [{"b": 1}, {"a": 1, "b": 2, "c": 3, "d": 4}, {"a": 1}])
    # With extra members allowed, counting keeps schema order even under property_order="any".
    assert not accepts(counted, '{"c":1,"b":2}', property_order="any")
    closed = {**counted, "additionalProperties": False, "maxProperties": 2}
    check(closed, [{"a": 1, "b": 2}, {"c": 2, "b": 1}], [{"a": 1, "b": 2, "c": 3}], property_order="any")
    check({"type": "object", "maxProperties": 0}, [{}], [{"a": 1}])


def test_dependencies() -> None:
    check({"type": "object", "dependentRequired": {"a": ["b"]}},
          [{}, {"b": 1}, {"a": 1, "b": 2}], [{"a": 1}])
    check({"type": "object", "properties": {"a": {}, "b": {}},
           "dependentSchemas": {"a": {"properties": {"b": {"type": "string"}}, "required": ["b"]}}},
          [{"b": 1}, {"a": 1, "b": "s"}], [{"a": 1}, {"a": 1, "b": 2}])
    check({"dependencies": {"a": ["b"]}}, [{"b": 1}, 5], [{"a": 1}])


# A schema whose emission prunes rules that match nothing (the dependency's branches), which
# is where rule order once followed a set's order, i.e. string hashing.
PRUNED_SCHEMA = {
    "type": "object",
    "properties": {"email": {"type": "string"}, "first": {"type": "string"},
                   "tags": {"type": "array", "items": {"type": "string"}},
                   "topic": {"type": "string"}},
    "additionalProperties": False, "required": ["email", "first"],
    "dependencies": {"topic": ["tags"]},
}
PROGRAM_DIGEST = """
import hashlib, json, sys
from pegmask.grammars import Grammar
p = Grammar.from_json_schema(json.loads(sys.argv[1])).program
print(hashlib.sha256(repr((p.kind, p.arg, p.aux, p.targets, p.accept)).encode()).hexdigest())
"""


def test_programs_do_not_depend_on_string_hashing() -> None:
    """The same schema compiles to the same program in every process (hash seeds differ)."""
    digests = set()
    for seed in ("1", "2", "3", "4"):
        proc = subprocess.run([sys.executable, "-c", PROGRAM_DIGEST, json.dumps(PRUNED_SCHEMA)],
                              env=dict(os.environ, PYTHONHASHSEED=seed), capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        digests.add(proc.stdout.strip())
    assert len(digests) == 1


# ---------------------------------------------------------------------------- arrays
def test_items_and_counts() -> None:
    check({"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3},
          [[1], [1, 2, 3]], [[], [1, 2, 3, 4], ["a"]])
    check({"prefixItems": [{"type": "string"}, {"type": "integer"}], "items": False},
          [[], ["a"], ["a", 1]], [[1], ["a", 1, 2]])
    check({"$schema": "http://json-schema.org/draft-04/schema#",
           "items": [{"type": "string"}], "additionalItems": {"type": "integer"}},
          [["a", 1, 2], []], [["a", "b"], [1]])
    check({"type": "array", "maxItems": 300}, [list(range(300))], [list(range(301))])
    check({"type": "array", "minItems": 100}, [list(range(100))], [list(range(99))])


def test_contains() -> None:
    check({"type": "array", "items": {"type": "integer"}, "contains": {"minimum": 5}},
          [[5], [1, 2, 7, 1]], [[], [1, 2], [1, "x", 6]])


def test_unique_items_is_unsupported_unless_ignored() -> None:
    schema = {"type": "array", "uniqueItems": True}
    with pytest.raises(UnsupportedSchemaError) as info:
        Grammar.from_json_schema(schema)
    assert info.value.keyword == "uniqueItems" and info.value.pointer == ""
    assert accepts(schema, "[1,1]", ignore_keywords=("uniqueItems",))
    assert accepts({"type": "array", "uniqueItems": True, "maxItems": 1}, "[1]")


# ---------------------------------------------------------------------------- strings
def test_lengths_count_characters() -> None:
    schema = {"type": "string", "minLength": 2, "maxLength": 3}
    check(schema, ["ab", "abc", "é😀", '\n"', "\\\\\\"], ["a", "abcd", "😀", "é😀é😀"])
    check({"type": "string", "maxLength": 1000}, ["x" * 1000], ["x" * 1001])
    check({"type": "string", "minLength": 150, "maxLength": 200}, ["x" * 150, "y" * 200],
          ["x" * 149, "y" * 201])


def test_pattern_is_an_unanchored_search() -> None:
    check({"type": "string", "pattern": "a+b"}, ["aab", "xxabyy", "ab"], ["a", "b", "ba"])
    check({"type": "string", "pattern": "^[a-z]+$"}, ["abc"], ["", "aBc", "abc "])
    check({"type": "string", "pattern": "^\\d{3}-\\d{4}$"}, ["555-1234"], ["5555-1234"])
    check({"pattern": "^é+$"}, ["éé", 5], ["e"])  # \u00e9 escapes count too (via spellings)
    check({"type": "string", "pattern": "^[a-z]+$", "maxLength": 3}, ["abc"], ["abcd"])
    check({"type": "string", "pattern": "[0-9]", "minLength": 3, "maxLength": 4},
          ["a1b", "123"], ["12", "abc", "a1bcd"])
    check({"type": "string", "pattern": 'a"\\\\'}, ['xa"\\'], ['a"'])
    with pytest.raises(UnsupportedSchemaError) as info:
        Grammar.from_json_schema({"type": "string", "pattern": "(a)\\1"})
    assert info.value.keyword == "pattern" and info.value.pointer == "/pattern"


def test_long_length_bounds_with_patterns() -> None:
    """Length bounds a pattern's structure cannot absorb: a counter product when small, else
    rules in blocks of about sqrt(maxLength) characters."""
    schema = {"type": "string", "format": "email", "minLength": 8, "maxLength": 70}
    grammar = Grammar.from_json_schema(schema)
    for k in range(0, 75):
        text = "a" * k + "@b.co"
        assert grammar.matches(json.dumps(text)) == (8 <= len(text) <= 70), k
    assert not grammar.matches('"' + "a" * 30 + '"')
    names = Grammar.from_json_schema({"type": "object", "propertyNames": {"maxLength": 256}})
    assert names.matches(json.dumps({"k" * 256: 1})) and not names.matches(json.dumps({"k" * 257: 1}))


PATTERNS = ["^[a-c]+$", "a.c", "^(ab|c)*$", "[0-9]{2,}", "^a|c$", "^[^a]*b"]


@settings(max_examples=80, deadline=None)
@given(pattern=st.sampled_from(PATTERNS), low=st.integers(0, 4), span=st.integers(0, 6),
       text=st.text(alphabet="abc0129\n\"", max_size=12))
def test_pattern_with_lengths_agrees_with_re(pattern: str, low: int, span: int, text: str) -> None:
    schema = {"pattern": pattern, "minLength": low, "maxLength": low + span}
    grammar = _grammar_cache(json.dumps(schema))
    # ECMAScript `$` matches only at the very end; Python's also before a final newline.
    expected = re.search(pattern.replace("$", r"\Z"), text) is not None and low <= len(text) <= low + span
    assert grammar.matches("12") and grammar.matches("[]")  # only strings are constrained
    for spelling in spellings(text):
        assert grammar.matches(spelling) == expected, (schema, spelling)


@settings(max_examples=80, deadline=None)
@given(names=st.lists(st.text(alphabet="ab\u00e9", max_size=4), max_size=5),
       key=st.text(alphabet="ab\u00e9", max_size=5))
def test_additional_keys_exclude_named_ones(names: list[str], key: str) -> None:
    schema = {"type": "object", "properties": {n: {"type": "null"} for n in names},
              "additionalProperties": {"type": "integer"}}
    grammar = _grammar_cache(json.dumps(schema))
    for spelling in spellings({key: 1}):
        assert grammar.matches(spelling) == (key not in names), (names, spelling)


def test_object_variants_share_their_extra_member_rule() -> None:
    """A `oneOf` of objects with the same property names allows the same other keys in each
    variant: the trie of "any key but these names" is emitted once, not once per variant."""
    names = [f"property_number_{i}" for i in range(12)]

    def variants(count: int, **closed: Any) -> dict[str, Any]:
        return {"oneOf": [{"type": "object", "required": ["kind"], **closed,
                           "properties": {**{n: {"type": "string"} for n in names},
                                          "kind": {"const": f"k{i}"}}} for i in range(count)]}

    def extra_cost(count: int) -> int:  # instructions for the other keys
        return (len(Grammar.from_json_schema(variants(count)).program)
                - len(Grammar.from_json_schema(variants(count, additionalProperties=False)).program))

    assert extra_cost(8) < 2 * extra_cost(1)
    check(variants(3), [{"property_number_3": "x", "kind": "k2", "other": 1}],  # schema order
          [{"property_number_3": 5, "kind": "k1"}, {"kind": "k3", "other": 1}])


def test_formats() -> None:
    check({"format": "date-time"}, ["2024-01-31T23:59:60.5Z", "2024-02-29t00:00:00+05:30", 1],
          ["2024-01-01T12:00:00", "2024-01-01 12:00:00Z", "2024-13-01T00:00:00Z",
           "2024-04-31T00:00:00Z"])
    check({"format": "date"}, ["2024-12-31"], ["2024-1-1", "24-01-01", "2024-02-30"])
    check({"format": "time"}, ["10:20:30Z", "23:59:59.123+01:00"], ["10:20:30", "24:00:00Z"])
    check({"format": "email"}, ["a.b+c@example.com", "x@localhost"], ["no-at", "a@", "@b.c"])
    check({"format": "uuid"}, ["123e4567-e89b-12d3-a456-426614174000"], ["123e4567", "x" * 36])
    check({"format": "uri"}, ["https://example.com/a?b=c#d", "urn:isbn:123"],
          ["not a uri", "/relative", ""])
    check({"format": "ipv4"}, ["192.168.0.1", "0.0.0.0"], ["256.1.1.1", "1.2.3", "01.2.3.4"])
    check({"format": "ipv6"}, ["::1", "2001:db8::8a2e:370:7334", "::ffff:1.2.3.4"],
          ["1::2::3", "12345::", ":::"])
    check({"format": "hostname"}, ["example.com", "a-b.c"], ["-a.com", "a..b", "a_b"])
    check({"format": "no-such-format"}, ["anything", 5])  # unknown formats are annotations
    check({"type": "string", "format": "date", "maxLength": 10}, ["2024-01-01"], ["x"])


# ---------------------------------------------------------------------------- numbers
@pytest.mark.parametrize("bounds", [
    {"minimum": 0}, {"maximum": -1}, {"minimum": -15, "maximum": 123},
    {"exclusiveMinimum": 9, "exclusiveMaximum": 101}, {"minimum": 1.5, "maximum": 20.2},
    {"minimum": 0, "exclusiveMaximum": 1000}, {"minimum": -1000, "maximum": -990},
])
def test_integer_bounds_exhaustive(bounds: dict[str, Any]) -> None:
    schema = {"type": "integer", **bounds}
    grammar = Grammar.from_json_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    for n in range(-1100, 1100):
        assert grammar.matches(str(n)) == validator.is_valid(n), n


def test_draft4_exclusive_flags() -> None:
    check({"$schema": "http://json-schema.org/draft-04/schema#", "type": "integer",
           "minimum": 1, "exclusiveMinimum": True, "maximum": 5, "exclusiveMaximum": True},
          [2, 4], [1, 5])


def test_number_bounds() -> None:
    check({"type": "number", "minimum": 0}, [0, 0.0, 1e-5, 3.5, 1e300], [-1, -0.001, -1e-9])
    check({"type": "number", "exclusiveMinimum": 0}, [1e-9, 2], [0, 0.0, -1])
    check({"type": "number", "minimum": -90, "maximum": 90},
          [-90, -89.999, 0, 45.5, 90, 90.0, 90.000], [-90.0001, 90.0001, 100, -91])
    check({"type": "number", "minimum": 0.25, "exclusiveMaximum": 0.75},
          [0.25, 0.5, 0.7499], [0.2499, 0.75, 0.8, 1])
    check({"type": "number", "minimum": 1.5, "maximum": 1.5}, [1.5, 1.50], [1.4, 1.51])


def test_multiple_of() -> None:
    check({"type": "integer", "multipleOf": 3}, [0, 3, -9, 123456], [1, 4, -10])
    check({"type": "integer", "multipleOf": 5, "minimum": 10, "maximum": 30}, [10, 25, 30], [5, 35, 12])
    check({"type": "number", "multipleOf": 0.25}, [0.5, 1, 2.75, -0.25], [0.1, 1.3])
    check({"type": "number", "multipleOf": 0.01, "maximum": 1}, [0.01, 0.99, 1], [0.001, 1.01])
    with pytest.raises(UnsupportedSchemaError):
        Grammar.from_json_schema({"type": "number", "multipleOf": 0.0001234567})


# ---------------------------------------------------------------------------- combinators
def test_any_of_one_of_all_of() -> None:
    check({"anyOf": [{"type": "string"}, {"type": "integer", "minimum": 5}]}, ["a", 5], [4, None])
    check({"oneOf": [{"type": "string"}, {"type": "null"}]}, ["a", None], [1])
    check({"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}},
                     {"required": ["a"]}, {"properties": {"a": {"minimum": 3}}}]},
          [{"a": 3}], [{"a": 2}, {}, {"a": "x"}])
    check({"allOf": [{"type": "string", "pattern": "^a"}, {"pattern": "b$"}]}, ["ab", "axb"],
          ["a", "b", "ba"])
    check({"allOf": [{"type": "string", "maxLength": 3}, {"minLength": 2}]}, ["ab"], ["a", "abcd"])
    check({"allOf": [{"enum": [1, 2, 3]}, {"enum": [2, 3, 4]}]}, [2, 3], [1, 4])
    check({"allOf": [{"type": ["integer", "string"]}, {"type": ["string", "null"]}]}, ["x"], [1, None])


def test_one_of_is_exact() -> None:
    """Disjoint branches (by type, a required discriminator, ranges) are a union; overlapping
    ones are intersected with the others' complements (values valid under two are invalid)."""
    check({"oneOf": [{"type": "number", "maximum": 0}, {"type": "number", "exclusiveMinimum": 0}]},
          [0, -1.5, 0.5], ["0"])
    tagged = {"oneOf": [
        {"type": "object", "properties": {"kind": {"const": "a"}, "x": {"type": "integer"}},
         "required": ["kind"]},
        {"type": "object", "properties": {"kind": {"enum": ["b", "c"]}, "x": {"type": "string"}},
         "required": ["kind"]}]}
    check(tagged, [{"kind": "a", "x": 1}, {"kind": "c", "x": "s"}],
          [{"kind": "a", "x": "s"}, {"x": 1}, {"kind": "d"}])
    check({"type": "string", "oneOf": [{"maxLength": 3}, {"pattern": "^a"}]},
          ["bc", "abcd", ""], ["ab", "a"])
    closed = {"oneOf": [
        {"type": "object", "properties": {"a": {}, "c": {}}, "additionalProperties": False},
        {"type": "object", "properties": {"b": {}, "c": {}}, "additionalProperties": False}]}
    check(closed, [{"a": 1}, {"b": 1, "c": 2}], [{}, {"c": 1}, {"a": 1, "b": 2}])
    check({"type": "array", "oneOf": [{"items": {"type": "string"}}, {"items": {"type": "integer"}}]},
          [["a"], [1, 2]], [[], ["a", 1]])
    with pytest.raises(SchemaError, match="accepts no value"):  # every value matches both
        Grammar.from_json_schema({"oneOf": [True, {}]})


def test_one_of_that_cannot_be_exact_is_refused() -> None:
    schema = {"oneOf": [{"type": "integer"}, {"multipleOf": 2}]}  # 4 matches both: invalid
    with pytest.raises(UnsupportedSchemaError) as info:
        Grammar.from_json_schema(schema)
    assert info.value.keyword == "oneOf" and "one_of=" in str(info.value)
    assert Grammar.from_json_schema(schema, one_of="any").matches("4")  # the superset, on request
    with pytest.raises(GrammarError, match="one_of"):
        Grammar.from_json_schema(schema, one_of="first")


APPLICATOR_SCHEMAS = [
    {"oneOf": [{"type": "object", "properties": {"a": {"type": "string"}, "b": {}, "c": {}},
                "required": ["a"]},
               {"type": "object", "properties": {"a": {}, "b": {"type": "string"}, "c": {}},
                "required": ["b"]}]},
    {"oneOf": [{"properties": {"a": {}, "c": {"type": "integer"}}, "additionalProperties": False},
               {"properties": {"b": {}, "c": {"type": "string"}}, "additionalProperties": False}]},
    {"oneOf": [{"items": {"type": "integer"}}, {"items": {"type": "string"}}, {"type": "null"}]},
    {"oneOf": [{"type": "string", "maxLength": 1}, {"type": "string", "pattern": "a"},
               {"minimum": 1}]},
    {"oneOf": [{"required": ["a"]}, {"required": ["b"]}], "type": "object",
     "properties": {"a": {}, "b": {}, "c": {}}},
    {"allOf": [{"properties": {"a": {}}}, {"$ref": "#/$defs/b"}], "$defs": {"b": {
        "properties": {"b": {"type": "string"}}}}, "unevaluatedProperties": {"type": "integer"}},
    {"prefixItems": [{}], "allOf": [{"prefixItems": [{}, {"type": "string"}]}],
     "unevaluatedItems": False},
]
# Keys from "abc" (written sorted: declared keys in schema order, others after them).
SMALL_VALUES = st.recursive(
    st.none() | st.integers(-1, 2) | st.sampled_from(["", "a", "b", "ab", "ba"]),
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.sampled_from("abc"), inner, max_size=3),
    max_leaves=6)


@pytest.mark.parametrize("schema", APPLICATOR_SCHEMAS)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=SMALL_VALUES)
def test_applicators_agree_with_jsonschema(schema: dict[str, Any], value: Any) -> None:
    grammar = _grammar_cache(json.dumps(schema))
    text = json.dumps(value, sort_keys=True)
    assert grammar.matches(text) == EcmaValidator(schema).is_valid(value), value


def test_unevaluated_beside_static_applicators() -> None:
    schema = {"type": "object", "properties": {"a": {}}, "allOf": [{"properties": {"b": {}}}],
              "unevaluatedProperties": False}
    check(schema, [{"a": 1, "b": 2}, {"b": 2}], [{"a": 1, "c": 3}])
    check({"type": "array", "prefixItems": [{}], "$ref": "#/$defs/two",
           "$defs": {"two": {"prefixItems": [{}, {}]}}, "unevaluatedItems": {"type": "null"}},
          [[1, 2], [1, 2, None]], [[1, 2, 3]])
    check({"type": "array", "items": {"type": "integer"}, "unevaluatedItems": False}, [[1, 2]])
    for schema in ({"anyOf": [{"properties": {"a": {}}}], "unevaluatedProperties": False},
                   {"contains": {}, "unevaluatedItems": False}):
        with pytest.raises(UnsupportedSchemaError) as info:
            Grammar.from_json_schema(schema)
        assert info.value.keyword.startswith("unevaluated")


def test_unknown_dialects_are_refused() -> None:
    with pytest.raises(UnsupportedSchemaError) as info:
        Grammar.from_json_schema({"$schema": "http://x.test/meta.json", "type": "integer"})
    assert info.value.keyword == "$schema"
    check({"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "integer"}, [1])


def test_not() -> None:
    check({"not": {"type": "string"}}, [1, None, {}], ["a"])
    check({"type": "string", "not": {"enum": ["a", "b"]}}, ["c", "ab", ""], ["a", "b"])
    check({"type": "integer", "not": {"enum": [1, 3.0]}}, [0, 2, 4, -1], [1, 3])
    check({"not": {"const": 2.5}}, [2.4, 2.51, "x", None], [2.5])
    check({"type": "string", "not": {"pattern": "^x"}}, ["ax", ""], ["x", "xyz"])
    check({"type": "object", "not": {"required": ["a"]}}, [{}, {"b": 1}], [{"a": 1}])
    check({"not": {"minimum": 3}}, [2, -0.5], [3, 4, "x"])
    check({"not": {"maxLength": 2}}, ["abc"], ["ab", 5])
    check({"not": {"anyOf": [{"type": "string"}, {"type": "null"}]}}, [1], ["a", None])
    check({"not": {"items": {"type": "string"}}}, [[1], ["a", None]], [[], ["a", "b"], 5, "x"])
    check({"type": "array", "items": {"type": "string"}, "not": {"items": {"maxLength": 1}}},
          [["ab"], ["a", "bc"]], [[], ["a"]])
    with pytest.raises(SchemaError):
        Grammar.from_json_schema({"not": {}})
    with pytest.raises(UnsupportedSchemaError) as info:
        Grammar.from_json_schema({"not": {"uniqueItems": True}})
    assert info.value.keyword == "not"


def test_if_then_else() -> None:
    check({"if": {"type": "string"}, "then": {"maxLength": 2}, "else": {"type": "integer"}},
          ["ab", 5], ["abc", 1.5, None])
    check({"type": "object", "if": {"required": ["a"]}, "then": {"required": ["b"]}},
          [{}, {"a": 1, "b": 2}, {"c": 1}], [{"a": 1}])
    with pytest.raises(UnsupportedSchemaError) as info:  # the condition cannot be negated
        Grammar.from_json_schema({"properties": {"a": {"if": {"multipleOf": 3}, "then": {}}}})
    assert info.value.keyword == "if" and info.value.pointer == "/properties/a"


# ---------------------------------------------------------------------------- references
def test_refs_and_recursion() -> None:
    tree = {"$defs": {"node": {"type": "object", "properties": {
        "value": {"type": "integer"}, "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
        "required": ["value"], "additionalProperties": False}}, "$ref": "#/$defs/node"}
    check(tree, [{"value": 1, "children": [{"value": 2, "children": [{"value": 3}]}]}],
          [{"value": 1, "children": [{"value": "x"}]}, {"children": []}])
    check({"definitions": {"a/b": {"type": "integer"}, "c~d": {"type": "string"},
                           "e f": {"type": "null"}},
           "type": "array", "prefixItems": [{"$ref": "#/definitions/a~1b"},
                                            {"$ref": "#/definitions/c~0d"},
                                            {"$ref": "#/definitions/e%20f"}]},
          [[1, "x", None]], [["x"]])
    check({"type": "object", "properties": {"next": {"$ref": "#"}, "v": {"type": "integer"}}},
          [{"next": {"next": {}, "v": 2}, "v": 1}], [{"next": {"v": "x"}}])
    check({"$defs": {"x": {"$anchor": "here", "type": "integer"}}, "$ref": "#here"}, [1], ["a"])


def test_refs_resolve_against_their_base_uri() -> None:
    """`$id` at any level sets the base of what it contains: relative and absolute-path ids,
    `$defs` addressed by their own id, fragments within the resource the base names."""
    schema = {"$id": "http://x.test/root.json", "$defs": {
        "a": {"$id": "sub/a.json", "$defs": {"n": {"type": "integer"}}, "$ref": "#/$defs/n"},
        "b": {"$id": "/abs/b.json", "type": "string"}},
        "properties": {"a": {"$ref": "sub/a.json"}, "b": {"$ref": "http://x.test/abs/b.json"}}}
    check(schema, [{"a": 1, "b": "s"}], [{"a": "s"}, {"b": 1}])
    urn = "urn:uuid:deadbeef-1234-ffff-ffff-4321feebdaed"
    check({"$id": urn, "$defs": {"bar": {"type": "string"}},
           "properties": {"foo": {"$ref": f"{urn}#/$defs/bar"}}}, [{"foo": "x"}], [{"foo": 1}])


def test_anchors_belong_to_their_resource() -> None:
    schema = {"$id": "http://x.test/root", "$ref": "child2#x", "$defs": {
        "A": {"$id": "child1", "$anchor": "x", "type": "integer"},
        "B": {"$id": "child2", "$anchor": "x", "type": "string"}}}
    check(schema, ["a"], [1])


def test_dynamic_refs_follow_the_dynamic_scope() -> None:
    """The list's `$dynamicRef` lands on the outermost `$dynamicAnchor` of the scope that
    reached it: the root's (strings) when entered from the root."""
    schema = {"$id": "http://x.test/root", "$ref": "list", "$defs": {
        "foo": {"$dynamicAnchor": "items", "type": "string"},
        "list": {"$id": "list", "type": "array", "items": {"$dynamicRef": "#items"},
                 "$defs": {"items": {"$dynamicAnchor": "items"}}}}}
    check(schema, [["a"], []], [[1]])
    alone = {**schema["$defs"]["list"], "$id": "http://x.test/list"}  # its own anchor: any
    check(alone, [["a", 1]], ["a"])


def test_remote_refs_are_refused() -> None:
    for ref in ("http://x.test/other.json", "other.json#/$defs/a"):
        with pytest.raises(UnsupportedSchemaError, match="remote reference") as info:
            Grammar.from_json_schema({"$ref": ref})
        assert info.value.keyword == "$ref"


def test_ref_siblings_follow_the_draft() -> None:
    defs = {"definitions": {"n": {"type": "integer"}}}
    new = {**defs, "properties": {"a": {"$ref": "#/definitions/n", "minimum": 5}}}
    check(new, [{"a": 5}], [{"a": 4}])
    old = {**new, "$schema": "http://json-schema.org/draft-07/schema#"}
    assert accepts(old, '{"a":4}')  # drafts 4-7 ignore the siblings of $ref


def test_annotations_are_ignored() -> None:
    check({"title": "t", "description": "d", "default": 1, "examples": [1], "$comment": "c",
           "readOnly": True, "deprecated": False, "x-vendor": {"type": "string"},
           "$schema": "https://json-schema.org/draft/2020-12/schema", "$id": "https://x/y",
           "type": "integer"}, [1], ["a"])


# ---------------------------------------------------------------------------- errors
@pytest.mark.parametrize("schema, pointer", [
    ({"type": "strnig"}, ""),
    ({"properties": {"a": {"minLength": -1}}}, "/properties/a"),
    ({"properties": {"a": {"maxLength": "3"}}}, "/properties/a"),
    ({"items": {"$ref": "#/definitions/missing"}}, "/items"),
    ({"anyOf": {"type": "string"}}, ""),
    ({"minimum": 5, "maximum": 3}, ""),
    ({"minItems": 3, "maxItems": 2}, ""),
    ({"required": "a"}, ""),
    ({"properties": {"a": 5}}, "/properties/a"),
    ({"multipleOf": 0}, ""),
])
def test_bad_schemas_raise_schema_error_with_pointer(schema: Any, pointer: str) -> None:
    with pytest.raises(SchemaError) as info:
        Grammar.from_json_schema(schema)
    assert info.value.pointer == pointer
    assert not isinstance(info.value, UnsupportedSchemaError)


def test_unsatisfiable_and_circular_schemas() -> None:
    with pytest.raises(SchemaError):
        Grammar.from_json_schema(False)
    with pytest.raises(SchemaError):
        Grammar.from_json_schema({"allOf": [{"type": "string"}, {"type": "integer"}]})
    with pytest.raises(SchemaError):
        Grammar.from_json_schema({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
                                  "$ref": "#/$defs/a"})
    with pytest.raises(SchemaError):  # a schema that is one of its own alternatives
        Grammar.from_json_schema({"anyOf": [{"$ref": "#"}, {"type": "string"}]})
    with pytest.raises(UnsupportedSchemaError) as info:
        Grammar.from_json_schema({"$ref": "https://example.com/other.json"})
    assert info.value.keyword == "$ref"


def test_size_is_bounded() -> None:
    # Long counts stay small (shared blocks), hostile sizes fail cleanly.
    grammar = Grammar.from_json_schema({"type": "string", "maxLength": 100_000})
    assert len(grammar.program) < 5_000
    wide = {"anyOf": [{"type": "object", "properties": {f"k{i}": {"enum": list(range(50))}}}
                      for i in range(40)]}
    nested: dict[str, Any] = {"type": "integer"}
    for _ in range(12):
        nested = {"anyOf": [nested, nested]}
    for schema in (wide, {"allOf": [wide, wide, wide]}, nested):
        try:
            Grammar.from_json_schema(schema)
        except GrammarError:
            pass


# ---------------------------------------------------------------------------- options
def test_whitespace_options() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "array"}}}
    pretty = json.dumps({"a": [1, 2]}, indent=2)
    assert accepts(schema, pretty) and accepts(schema, '{ "a" : [ 1 , 2 ] }')
    assert not accepts(schema, pretty, whitespace="compact")
    assert accepts(schema, '{"a":[1,2]}', whitespace="compact")
    assert not accepts(schema, '{"a":' + " " * 33 + "[]}")  # default max_whitespace is 32
    assert accepts(schema, '{"a":' + " " * 33 + "[]}", max_whitespace=40)
    assert not accepts(schema, '{"a": []}', max_whitespace=0)
    assert not accepts(schema, ' {"a":[]}')  # the value itself has no surrounding whitespace
    with pytest.raises(GrammarError):
        Grammar.from_json_schema(schema, whitespace="loose")
    with pytest.raises(GrammarError):
        Grammar.from_json_schema(schema, property_order="sorted")


def test_rule_names_use_the_prefix() -> None:
    schema = {"$defs": {"n": {"type": "array", "items": {"$ref": "#/$defs/n"}}},
              "type": "object", "properties": {"t": {"$ref": "#/$defs/n"}, "s": {"maxLength": 99}}}
    root, rules = schema_to_rules(schema, prefix="p7")
    assert rules and all(name.startswith("p7_") for name in rules)


def test_embedded_in_peg() -> None:
    grammar = Grammar.from_peg('root = "<" json(s) ">"', schemas={"s": {"type": "integer"}})
    assert grammar.matches("<12>") and not grammar.matches('<"x">')


def test_expansion_copies_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """`expand_json_schemas` takes the front-end's rules as they are and rewrites a subtree
    that several rules share once (compile time)."""
    made = []

    def spy(*args: Any, **kwargs: Any) -> Any:
        made.append(schema_to_rules(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(json_schema, "schema_to_rules", spy)
    shared = Seq((Literal(b"<"), json_schema_node({"type": "object", "properties": {"a": {}}})))
    ir = expand_json_schemas(GrammarIR({"root": Choice((shared, Ref("x"))),
                                        "x": Seq((shared, Literal(b"!")))}))
    (root, rules), = made
    assert all(ir.rules[name] is body for name, body in rules.items())
    assert ir.rules["root"].alts[0] is ir.rules["x"].items[0]
    assert ir.rules["x"].items[0].items[1] is root


# ---------------------------------------------------------------------------- property tests
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6)
    # Integral floats are integers to jsonschema but spelled "1.0"; exponent spellings are
    # only accepted where the sign decides the bounds (both documented).
    | st.floats(-1e6, 1e6).filter(lambda f: not f.is_integer() and "e" not in repr(f))
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=12)

PROPERTY_SCHEMAS = [
    {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0}, "b": {"type": "string"}},
     "required": ["a"]},
    {"type": "array", "items": {"type": ["string", "null"]}, "maxItems": 3},
    {"anyOf": [{"type": "number", "maximum": 10}, {"type": "string", "maxLength": 3}]},
    {"type": "object", "additionalProperties": {"type": "boolean"}, "propertyNames": {"maxLength": 2}},
    {"not": {"type": ["object", "array"]}},
    {"type": "string", "pattern": "^[a-c]*$"},
    {"type": "object", "patternProperties": {"^a": {"type": "integer"}}, "additionalProperties": False},
    {"enum": [None, 1, "x", [1, "x"], {"a": 1}]},
]


def _ecma_pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Any:
    """`pattern` with ECMAScript's `$` (the very end; Python's also matches before a final
    newline, so `re.search("^a$", "a\\n")` succeeds where JSON Schema's regex fails)."""
    if isinstance(instance, str) and not re.search(re.sub(r"(?<!\\)\$", r"\\Z", pattern), instance):
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


# The oracle: jsonschema, with JSON Schema's (ECMAScript) regex semantics for `pattern`.
EcmaValidator = jsonschema.validators.extend(jsonschema.Draft202012Validator,
                                             {"pattern": _ecma_pattern})


def test_the_oracle_reads_patterns_as_ecmascript() -> None:
    schema = {"type": "string", "pattern": "^[a-c]*$"}
    assert jsonschema.Draft202012Validator(schema).is_valid("ab\n")  # Python's `$`
    assert not EcmaValidator(schema).is_valid("ab\n") and EcmaValidator(schema).is_valid("ab")
    assert not Grammar.from_json_schema(schema).matches('"ab\\n"')


@pytest.mark.parametrize("schema", PROPERTY_SCHEMAS)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=JSON_VALUES)
def test_grammar_agrees_with_jsonschema(schema: dict[str, Any], value: Any) -> None:
    grammar = _grammar_cache(json.dumps(schema))
    expected = EcmaValidator(schema).is_valid(value)
    for text in spellings(value):
        assert grammar.matches(text) == expected, text


_GRAMMARS: dict[str, Grammar] = {}


def _grammar_cache(schema_json: str) -> Grammar:
    if schema_json not in _GRAMMARS:
        _GRAMMARS[schema_json] = Grammar.from_json_schema(json.loads(schema_json),
                                                          property_order="any")
    return _GRAMMARS[schema_json]


@settings(max_examples=60, deadline=None)
@given(value=JSON_VALUES)
def test_any_value_schema_accepts_every_json_value(value: Any) -> None:
    grammar = _grammar_cache("true")
    for text in spellings(value) + [json.dumps(value, indent=1)]:
        assert grammar.matches(text), text


# ---------------------------------------------------------------------------- the data sweep
def test_nested_all_of_refs_in_the_data() -> None:
    """Github_hard---o67450 merges definitions by nested `allOf`s of `$ref`s (17 properties,
    so schema order): its valid instances follow the `allOf` order, not the definition names'."""
    data = json.loads((JSONSCHEMA_DIR / "Github_hard---o67450.json").read_text())
    grammar = Grammar.from_json_schema(data["schema"])
    for test in data["tests"]:
        for text in spellings(test["data"]):
            assert grammar.matches(text) == test["valid"], text[:80]


def test_sample_agreement_and_coverage() -> None:
    report = measure(schema_files(sample=300, seed=1))
    assert report.coverage >= 0.90, report.summary()
    assert report.agreement >= 0.97, report.summary()
    assert not any(cause.startswith("grammar error") for cause in report.errors), report.summary()


@pytest.mark.slow
def test_full_agreement_and_coverage() -> None:
    report = measure()
    assert report.coverage >= 0.90, report.summary()
    assert report.agreement >= 0.97, report.summary()


# ---------------------------------------------------------------------------- raw strings
@pytest.mark.parametrize(("schema", "valid", "invalid"), [
    ({"type": "string", "maxLength": 5}, ["", "a\\nb", 'é"<x>'], ["abcdef", "a\n</p>"]),
    ({"type": "string", "pattern": "^[A-Z]{3}$"}, ["JFK"], ["jfk", "JFKX", ""]),
    ({"type": "string", "format": "date"}, ["2024-01-02"], ["2024-1-2"]),
    ({"enum": ["a", "b c"]}, ["a", "b c"], ["c", '"a"']),
    ({"$defs": {"s": {"type": "string", "minLength": 2}}, "$ref": "#/$defs/s"}, ["ab"], ["a"]),
    ({"type": "string"}, ['any " \\ text', "x" * 300], ["x\n</p>y"]),
])
def test_raw_strings_are_the_unescaped_text(schema: Any, valid: list[str], invalid: list[str]) -> None:
    """`raw_until`: a string parameter as XML-style tool calls write it (no quotes, no escapes),
    never containing the text that ends it."""
    grammar = Grammar.from_json_schema(schema, raw_until="\n</p>")
    assert all(grammar.matches(text) for text in valid)
    assert not any(grammar.matches(text) for text in invalid)


def test_raw_strings_need_a_string_schema() -> None:
    for schema in ({"type": "integer"}, {"type": ["string", "null"]}):
        with pytest.raises(UnsupportedSchemaError):
            Grammar.from_json_schema(schema, raw_until="\n</p>")
    with pytest.raises(GrammarError):
        Grammar.from_json_schema({"type": "string"}, raw_until="")


# ---------------------------------------------------------------------------- not integer
NOT_INTEGER_SCHEMAS = [
    {"not": {"type": "integer"}},
    {"type": "number", "not": {"type": "integer"}, "minimum": -1.5, "exclusiveMaximum": 3},
    {"type": "number", "not": {"type": "integer"}, "multipleOf": 0.25, "maximum": 2},
    {"oneOf": [{"type": "integer"}, {"type": "number"}]},
    {"oneOf": [{"type": "integer", "maximum": 5}, {"type": "number", "minimum": 0}]},
    {"type": ["number", "string"], "not": {"type": ["integer", "string"]}},
    {"oneOf": [{"type": "integer"}, {"minimum": 2}]},  # 3 matches both: invalid
]
NUMBER_TEXTS = st.builds(
    lambda sign, whole, frac, exp: f"{sign}{whole}{frac}{exp}",
    st.sampled_from(["", "-"]), st.sampled_from(["0", "1", "2", "3", "5", "6", "17"]),
    st.sampled_from(["", ".0", ".00", ".5", ".25", ".250", ".05", ".75", ".001"]),
    st.sampled_from(["", "", "", "e1", "E-1", "e+2"]))


@functools.lru_cache
def _not_integer_grammar(index: int) -> Grammar:
    return Grammar.from_json_schema(NOT_INTEGER_SCHEMAS[index])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(index=st.integers(0, len(NOT_INTEGER_SCHEMAS) - 1), text=NUMBER_TEXTS)
def test_not_integer_is_the_non_integral_decimals(index: int, text: str) -> None:
    """The "not integer" numbers are those with a non-zero fraction digit (JSON Schema counts
    `1.0` as an integer): every accepted spelling is valid, and every valid plain decimal
    (no exponent) that is non-integral, or an integer written without a fraction, is accepted."""
    schema = NOT_INTEGER_SCHEMAS[index]
    grammar = _not_integer_grammar(index)
    valid = jsonschema.Draft202012Validator(schema).is_valid(json.loads(text))
    if grammar.matches(text):
        assert valid, text
    elif valid:
        assert "e" in text.lower() or re.fullmatch(r"-?\d+\.0*", text), text


def test_not_integer_examples() -> None:
    check({"not": {"type": "integer"}}, [1.5, -0.5, "x", None, [1]], [1, 0, -3])
    assert accepts({"not": {"type": "integer"}}, "3.250")
    assert not any(accepts({"not": {"type": "integer"}}, t) for t in ("1.0", "2.00", "1e3", "-0.0"))
    check({"type": "number", "not": {"type": "integer"}, "exclusiveMinimum": 1, "maximum": 2.5},
          [1.01, 2.5], [1, 2, 0.5, 2.75])
    with pytest.raises(SchemaError, match="accepts no value"):
        Grammar.from_json_schema({"type": "number", "multipleOf": 2, "not": {"type": "integer"}})


@pytest.mark.parametrize(("schema", "accepted", "rejected"), [
    # oneOf's complement of maxLength 100 beside maxLength 50: lengths 51..100 only
    ({"oneOf": [{"type": "string", "maxLength": 100}, {"type": "string", "maxLength": 50}]},
     ["a" * 51, "a" * 100], ["a" * 50, "", "a" * 101]),
    ({"oneOf": [{"type": "array", "maxItems": 3}, {"type": "array", "maxItems": 1}]},
     [[1, 2], [1, 2, 3]], [[], [1], [1, 2, 3, 4]]),
])
def test_complements_whose_counts_cross_leave_their_branch_out(
        schema: dict, accepted: list, rejected: list) -> None:
    """A complement's minimum beside a smaller maximum holds no value: that branch drops out
    (it was compiled as a repetition {101,100}, a GrammarError on a valid schema)."""
    grammar = Grammar.from_json_schema(schema)
    for value in accepted:
        assert grammar.matches(json.dumps(value)), value
    for value in rejected:
        assert not grammar.matches(json.dumps(value)), value


def test_crossed_counts_alone_accept_no_value() -> None:
    with pytest.raises(SchemaError, match="accepts no value"):
        Grammar.from_json_schema({"type": "string", "maxLength": 100, "not": {"maxLength": 100}})
