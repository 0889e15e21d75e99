"""Budgets, not crashes: every pathological count gives a compact grammar or `GrammarTooLarge`
before anything proportional to it is built, and compact repetitions keep the parser, the
token automaton and the closing figures exactly agreeing (SmolLM2's vocabulary)."""

from __future__ import annotations

import functools
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from vocabularies import smollm2

from pegmask.engine.engine import Engine
from pegmask.engine.requests import InvalidRequestError
from pegmask.grammars import Grammar, GrammarLimits, GrammarTooLarge, counted
from pegmask.grammars.compiler import CompiledGrammar, GrammarCompiler
from pegmask.grammars.program import instruction_count
from pegmask.server.errors import as_api_error

BILLION = 10**9


@functools.cache
def compiler() -> GrammarCompiler:
    return GrammarCompiler(smollm2())


def too_long(grammar: Grammar) -> GrammarTooLarge:
    """The error the closing figures give from the grammar's start."""
    with pytest.raises(GrammarTooLarge) as caught:
        compiler().compile(grammar).matcher().completion_distance()
    assert caught.value.limit == "max_completion_length"
    return caught.value


# --------------------------------------------------------------------------- pathological counts
def test_a_billion_characters_is_a_small_grammar_whose_closing_is_refused():
    grammar = Grammar.from_json_schema({"type": "string", "minLength": BILLION})
    assert len(grammar.program) < 1_000
    error = too_long(grammar)
    assert error.value == BILLION + 2  # the program's figure, counted without a walk
    assert error.allowed == GrammarLimits().max_completion_length
    assert "--grammar-max-completion-length" in str(error)
    matcher = compiler().compile(grammar).matcher()
    longest = max(len(data) for data in smollm2().token_bytes if data)
    assert matcher.completion_token_floor() == -(-(BILLION + 2) // longest)
    assert matcher.accept_string('"abc')  # and it runs
    assert not compiler().compile(grammar).matcher().accept_string('""')


def test_a_billion_at_most_closes_at_once():
    grammar = Grammar.from_json_schema({"type": "string", "maxLength": BILLION})
    assert len(grammar.program) < 2_000
    matcher = compiler().compile(grammar).matcher()
    assert matcher.completion_distance() == 2
    assert matcher.accept_string('"' + "x" * 300)
    assert matcher.completion_distance() == 1
    assert grammar.matches('"' + "é" * 300 + '"')


def test_nested_min_items_multiply_without_a_walk():
    def nested(count: int, levels: int) -> dict:
        schema: dict = {"type": "array", "minItems": count, "items": {"type": "integer"}}
        for _ in range(levels - 1):
            schema = {"type": "array", "minItems": count, "items": schema}
        return schema

    def shortest(count: int, levels: int) -> int:
        length = 1  # "0"
        for _ in range(levels):
            length = 2 + count * length + (count - 1)  # brackets, items, commas
        return length

    grammar = Grammar.from_json_schema(nested(1_000, 3), whitespace="compact")
    assert len(grammar.program) < 3_000
    assert too_long(grammar).value == shortest(1_000, 3)
    # Counted in rules (300 items are past what is unrolled) and walked exactly.
    schema = {"type": "array", "minItems": 3, "items": nested(300, 1)}
    grammar = Grammar.from_json_schema(schema, whitespace="compact")
    matcher = compiler().compile(grammar).matcher()
    assert matcher.completion_distance() == 2 + 3 * shortest(300, 1) + 2
    witness = b"".join(matcher.shortest_completion())
    assert json.loads(witness) == [[0] * 300] * 3
    assert grammar.matches(witness)
    assert not grammar.matches(json.dumps([[0] * 300, [0] * 299, [0] * 300]))


@pytest.mark.parametrize(("make", "shortest"), [
    (lambda: Grammar.from_regex("a{1000000000}"), BILLION),
    (lambda: Grammar.from_regex("(ab|c){1000000000}d"), BILLION + 1),
    (lambda: Grammar.from_regex("a{99999999999}b"), 99_999_999_999 + 1),
    (lambda: Grammar.from_peg('root = "x"{1000000000}'), BILLION),
    (lambda: Grammar.from_peg('root = ("x"{1000}){1000000}'), 1000 * 10**6),
    (lambda: Grammar.from_json_schema({"type": "array", "minItems": BILLION,
                                       "items": {"type": "string", "minLength": BILLION}}),
     2 + BILLION * (BILLION + 2) + BILLION - 1),
    (lambda: Grammar.from_json_schema({"type": "object", "minProperties": BILLION}), None),
])
def test_huge_counts_compile_compactly(make, shortest):
    grammar = make()
    assert len(grammar.program) < 5_000
    if shortest is not None:
        assert too_long(grammar).value == min(shortest, 1 << 60)


def test_counts_past_any_output_saturate():
    """Past 16^15 items (more than any output holds) every count compiles alike: a maximum
    bounds nothing, and the rules stay within 16 frames of the depth limit."""
    wide = Grammar.from_json_schema({"type": "string", "maxLength": 10**400})
    assert len(wide.program) < 1_000 and wide.matches('"' + "x" * 100 + '"')
    huge = Grammar.from_peg('root = "x"{' + "9" * 5_000 + "}")
    assert len(huge.program) < 1_000
    assert too_long(huge).value == 1 << 60  # the figures' ceiling: at least that many


def test_optional_counts_are_compact_and_free_to_end():
    grammar = Grammar.from_peg('root = "<" "x"{0,1000000} ">"')
    assert len(grammar.program) < 1_000
    assert grammar.matches("<" + "x" * 1234 + ">") and grammar.matches("<>")
    matcher = compiler().compile(grammar).matcher()
    assert matcher.accept_string("<" + "x" * 700)
    assert matcher.completion_distance() == 1


def test_copies_that_may_be_empty_are_refused_before_they_are_built():
    """Every copy of an item that may match nothing is a thread before any input, so such
    counts are unrolled, and refused on their size before an instruction is emitted."""
    with pytest.raises(GrammarTooLarge) as caught:
        _ = Grammar.from_peg('root = ("ab" | ""){1000000000}').program
    error = caught.value
    assert (error.limit, error.allowed) == ("max_instructions", 400_000)
    assert error.value > BILLION
    assert "--grammar-max-instructions" in str(error)
    with pytest.raises(GrammarTooLarge, match="max_instructions"):
        Grammar.from_regex("(a|){4000}(b|){4000}", limits=GrammarLimits(max_instructions=10_000))


# --------------------------------------------------------------------------- limits as arguments
def test_limits_are_the_compilers_whatever_the_grammar_was_built_with():
    grammar = Grammar.from_json_schema({"type": "object", "properties": {"a": {"type": "string"}}})
    small = GrammarCompiler(smollm2(), limits=GrammarLimits(max_instructions=50))
    with pytest.raises(GrammarTooLarge, match="max_instructions=50"):
        small.compile(grammar)
    roomy = GrammarLimits(max_instructions=10**6)
    assert grammar.with_limits(roomy).program is grammar.program  # (it fits: shared)
    assert GrammarCompiler(smollm2(), limits=roomy).compile(grammar).grammar.limits == roomy
    with pytest.raises(ValueError, match="positive"):
        GrammarLimits(max_completion_length=0)


def test_the_closing_budget_is_an_argument():
    grammar = Grammar.from_json_schema({"type": "string", "minLength": 1_000})
    tight = GrammarCompiler(smollm2(), limits=GrammarLimits(max_completion_length=500))
    with pytest.raises(GrammarTooLarge, match="1002 > max_completion_length=500"):
        tight.compile(grammar).matcher().completion_token_count()
    assert compiler().compile(grammar).matcher().completion_distance() == 1_002


def test_the_engine_answers_a_bad_request_naming_the_limit():
    """`Engine._check_budget` at prepare time (a grammar that must be entered, close_on_length
    on): too many tokens is the max_tokens 400 without a walk; too long to count is a 400 about
    the grammar that names the budget."""
    def check(schema: dict, max_tokens: int) -> InvalidRequestError:
        compiled = compiler().compile(Grammar.from_json_schema(schema))
        with pytest.raises(InvalidRequestError) as caught:
            Engine._checked(lambda: Engine._check_budget(compiled, max_tokens), "response_format")
        assert as_api_error(caught.value).status == 400
        return caught.value

    cut = check({"type": "string", "minLength": BILLION}, 4096)
    assert cut.param == "max_tokens" and "takes at least" in str(cut)
    far = check({"type": "string", "minLength": 200_000}, 10**6)
    assert far.param == "response_format" and "max_completion_length" in str(far)
    near = check({"type": "string", "minLength": 2_000}, 10)
    assert near.param == "max_tokens" and "takes at least" not in str(near)


# --------------------------------------------------------------------------- compact == unrolled
@pytest.mark.parametrize("grammar", [
    Grammar.from_peg(r'''
root = @t:until("</t>", "\n\n") "</t>" (item ("," item)*)? body{2,5}
item = "[" [a-zé\u4e00]{0,3} "]" | token("<|x|>")
body = @b:("a" | "bc") | json()
'''),
    Grammar.from_json_schema({"type": "object", "properties": {
        "a": {"type": "string", "maxLength": 300}, "b": {"type": "array", "maxItems": 100},
        "c": {"type": "integer", "minimum": -5, "maximum": 123456}}}),
    Grammar.from_regex(r"(\d{3}-){2,400}[A-F]{1,5000}"),
], ids=["peg", "json_schema", "regex"])
def test_the_size_estimate_never_falls_short(grammar):
    """`instruction_count` is what the limit is checked on, before anything is emitted."""
    from pegmask.grammars.counted import compact_repetitions
    from pegmask.grammars.json_schema import expand_json_schemas

    ir, _ = compact_repetitions(expand_json_schemas(grammar.ir))
    assert 2 + instruction_count(ir.rules.values()) >= len(grammar.program)


ITEMS = {"ab|c": ('("ab" | "c")', ["ab", "c"]), "[0-9]": ("[0-9]", ["7", "0"]),
         "capture": ('(@w:"é" "x")', ["éx"])}


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(low=st.integers(0, 40), extra=st.none() | st.integers(0, 40),
       base=st.sampled_from([2, 3, 16]), item=st.sampled_from(sorted(ITEMS)), data=st.data())
def test_counted_rules_accept_exactly_the_counts(low, extra, base, item, data, monkeypatch_all):
    """With every repetition counted in rules (in small bases, so that small counts use many
    digits), `<item{low,high}>` takes exactly low..high items, in the parser and in the
    automaton alike, and the closing figures count the items still needed."""
    monkeypatch_all(BASE=base, UNROLL_INSTRUCTIONS=0)
    source, spellings = ITEMS[item]
    high = None if extra is None else low + extra
    bounds = f"{{{low},}}" if high is None else f"{{{low},{high}}}"
    grammar = Grammar.from_peg(f'root = "<" {source}{bounds} ">"')
    compiled = CompiledGrammar(grammar, smollm2())
    shortest_item = min(len(s.encode()) for s in spellings)
    for count in sorted({0, low, max(low - 1, 0), low + 1, *(
            [high, high + 1] if high is not None else [low + 45]),
            data.draw(st.integers(0, low + 45))}):
        pieces = [data.draw(st.sampled_from(spellings)) for _ in range(count)]
        text = "<" + "".join(pieces) + ">"
        expected = low <= count and (high is None or count <= high)
        assert grammar.matches(text) == expected, text
        matcher = compiled.matcher()
        assert (matcher.accept_string(text) and matcher.is_accepting()) == expected, text
        prefix = compiled.matcher()
        if prefix.accept_string(text[:-1]):
            assert prefix.completion_distance() == 1 + shortest_item * max(low - count, 0)
    assert compiled.matcher().completion_distance() == 2 + shortest_item * low


@pytest.fixture
def monkeypatch_all(monkeypatch):
    """Set constants of `pegmask.grammars.counted` for one test (hypothesis reruns the test
    body in one fixture scope, and the constants are read at each compile)."""
    def apply(**constants: int) -> None:
        for name, value in constants.items():
            monkeypatch.setattr(counted, name, value)
    return apply
