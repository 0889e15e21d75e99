"""Shortest completions and the closing mask: output closes within its token budget.

The distance is checked against its definition (a breadth-first search over the automaton's
transitions) and on hand-made grammars; the budget policy the engine runs is checked by random
decoding on real vocabularies (SmolLM2's byte-level BPE with spelled tool-call tags, Qwen3's
tiktoken ranks with the tags as tokens, DeepSeek V4)."""

from __future__ import annotations

import functools
import json
import random
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from vocabularies import deepseek_v4, qwen3, smollm2

from pegmask.dialects import get_dialect
from pegmask.dialects.request import ChatRequest
from pegmask.grammars import Grammar
from pegmask.grammars.compiler import CompiledGrammar, GrammarCompiler
from pegmask.grammars.matcher import GrammarMatcher
from pegmask.kernels import allocate_token_bitmask

VOCABULARIES = {"smollm2": smollm2, "qwen3": qwen3, "deepseek_v4": deepseek_v4}
SCHEMAS = Path(__file__).parent.parent / "data" / "jsonschema"


@functools.cache
def compiler(name: str) -> GrammarCompiler:
    return GrammarCompiler(VOCABULARIES[name]())


def matcher_for(grammar: Grammar, vocab: str = "smollm2") -> GrammarMatcher:
    return compiler(vocab).compile(grammar).matcher()


def allowed_ids(matcher: GrammarMatcher, bitmask) -> np.ndarray:
    bits = np.unpackbits(bitmask[0].numpy().view(np.uint8), bitorder="little")
    return np.flatnonzero(bits[: matcher.compiled.vocab.size])


def completion_length(pieces: list[bytes | int]) -> int:
    return sum(len(piece) if isinstance(piece, bytes) else 1 for piece in pieces)


def assert_completes(matcher: GrammarMatcher) -> None:
    """The plan is accepted token by token, shortens by one each time, and ends the grammar;
    the witness has the distance's length."""
    distance = matcher.completion_distance()
    assert completion_length(matcher.shortest_completion()) == distance
    tokens = matcher.completion_tokens()
    assert len(tokens) == matcher.completion_token_count() <= distance
    for i, token in enumerate(tokens):
        assert matcher.accept_token(token)
        assert matcher.completion_tokens() == tokens[i + 1 :]
    assert matcher.is_accepting() and matcher.completion_distance() == 0
    matcher.rollback(len(tokens))


# --------------------------------------------------------------------------- distances by hand
def test_a_literal_is_completed_by_what_is_left_of_it():
    matcher = matcher_for(Grammar.from_peg('root = "hello world"'))
    assert matcher.completion_distance() == 11
    assert matcher.accept_string(b"hello")
    assert matcher.completion_distance() == 6
    assert matcher.shortest_completion() == [b" world"]
    assert_completes(matcher)


def test_nested_arrays_and_objects_close_with_their_required_members():
    schema = {"type": "object", "required": ["a"], "properties": {
        "a": {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["b"],
            "properties": {"b": {"type": "integer"}, "c": {"type": "string"}}}}}}
    matcher = matcher_for(Grammar.from_json_schema(schema))
    assert matcher.shortest_completion() == [b'{"a":[{"b":0}]}']
    assert matcher.accept_string(b'{"a": [{"b": 12, "c": "x')
    assert matcher.shortest_completion() == [b'"}]}']
    assert_completes(matcher)
    assert matcher.accept_string(b'"}, {')
    assert matcher.shortest_completion() == [b'"b":0}]}']


def test_a_string_with_a_minimum_length_is_filled_first():
    matcher = matcher_for(Grammar.from_json_schema({"type": "string", "minLength": 3}))
    assert matcher.completion_distance() == 5
    assert matcher.accept_string(b'"a')
    assert matcher.shortest_completion() == [b'aa"']
    assert matcher.accept_string(b"bcd")
    assert matcher.completion_distance() == 1
    assert_completes(matcher)


WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "required": ["city"],
    "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}}}}}
REQUIRED = ChatRequest(tools=[WEATHER], tool_choice="required",
                       chat_template_kwargs={"enable_thinking": False})
CALL = '{"name":"get_weather","arguments":{"city":""}}'


def test_a_tool_call_closes_with_its_tags_as_tokens():
    """Qwen3 has `<tool_call>` and `</tool_call>` as tokens: one symbol each."""
    vocab = qwen3()
    matcher = matcher_for(get_dialect("hermes").grammar(REQUIRED), "qwen3")
    opening, closing = vocab.special_ids["<tool_call>"], vocab.special_ids["</tool_call>"]
    assert matcher.shortest_completion() == [opening, CALL.encode(), closing]
    assert matcher.completion_distance() == len(CALL) + 2
    assert_completes(matcher)
    assert matcher.accept_token(opening) and matcher.accept_string(b'\n{"name": "get_weather", ')
    assert matcher.shortest_completion() == [b'"arguments":{"city":""}}', closing]
    assert_completes(matcher)


def test_a_tool_call_closes_with_its_tags_spelled_where_the_vocabulary_lacks_them():
    """SmolLM2 writes the tags as text; bytes held back inside a tag count exactly."""
    matcher = matcher_for(get_dialect("hermes").grammar(REQUIRED))
    text = f"<tool_call>{CALL}</tool_call>"
    assert matcher.shortest_completion() == [text.encode()]
    assert matcher.completion_distance() == len(text)
    assert matcher.accept_string(b"<tool")  # held back: it may still be the tag
    assert matcher.completion_distance() == len(text) - 5
    assert_completes(matcher)
    assert matcher.accept_string(text[5:-5].encode())
    assert matcher.shortest_completion() == [b"call>"]
    assert_completes(matcher)


def test_free_text_of_a_lazy_grammar_may_end_and_a_call_counts_its_close():
    """tool_choice auto: free text until `<tool_call>` (distance 0); inside the call, the
    distance counts what closes the call."""
    vocab = qwen3()
    grammar = get_dialect("hermes").grammar(ChatRequest(
        tools=[WEATHER], chat_template_kwargs={"enable_thinking": False}))
    matcher = matcher_for(grammar, "qwen3")
    assert matcher.accept_string(b"Let me check.")
    assert matcher.completion_distance() == 0 and matcher.shortest_completion() == []
    assert matcher.accept_token(vocab.special_ids["<tool_call>"])
    assert matcher.shortest_completion() == [CALL.encode(), vocab.special_ids["</tool_call>"]]
    assert_completes(matcher)


def test_text_that_would_spell_a_special_is_not_a_completion():
    """The program's shortest path writes the tag as text, which the lexer reads as the tag
    (SmolLM2 lacks it): the exact search finds the longer completion."""
    grammar = Grammar.from_peg('root = "<tool_call>x" | token("<tool_call>") "yy"')
    matcher = matcher_for(grammar)
    assert matcher.completion_distance() == 13
    assert matcher.shortest_completion() == [b"<tool_call>yy"]
    assert_completes(matcher)


def test_the_depth_limit_is_respected():
    """Past `max_depth` the shortest path is not in the language: the next one is found. (The
    frames are recursion's: a grammar that needs more frames without recursion is refused.)"""
    grammar = Grammar.from_peg('root = "(" (deep | "zzzz")\ndeep = deeper "q"\n'
                               'deeper = "y" | "<" deep')
    assert compiler("smollm2").compile(grammar).matcher().completion_distance() == 3
    matcher = CompiledGrammar(grammar, smollm2(), max_depth=1).matcher()
    assert not matcher.accept_string(b"(yq")
    assert matcher.completion_distance() == 5
    assert matcher.shortest_completion() == [b"(zzzz"]
    assert_completes(matcher)


def test_a_grammar_without_sentences_has_no_completion():
    matcher = matcher_for(Grammar.from_peg('root = "a" loop\nloop = "b" loop'))
    assert matcher.completion_distance() is None and matcher.completion_token_count() is None
    bitmask = allocate_token_bitmask(1, smollm2().size)
    matcher.fill_closing_bitmask(bitmask, 0, 10)
    assert not allowed_ids(matcher, bitmask).size


# --------------------------------------------------------------------------- the closing mask
def test_the_closing_mask_lowers_the_distance_within_the_budget():
    vocab = smollm2()
    grammar = Grammar.from_json_schema({"type": "object", "required": ["a", "b"], "properties": {
        "a": {"type": "string"}, "b": {"type": "array", "items": {"type": "integer"}}}})
    matcher = matcher_for(grammar)
    bitmask = allocate_token_bitmask(1, vocab.size)
    assert matcher.accept_string(b'{"a": "some text')
    here, count = matcher.completion_distance(), matcher.completion_token_count()
    first = matcher.completion_tokens()[0]
    for remaining in (count, count + 1, count + 4):
        matcher.fill_closing_bitmask(bitmask, 0, remaining)
        allowed = allowed_ids(matcher, bitmask)
        assert first in allowed
        for token in allowed.tolist():
            assert matcher.accept_token(token)
            assert matcher.completion_distance() < here
            assert matcher.completion_token_count() <= remaining - 1
            matcher.rollback(1)
    matcher.fill_closing_bitmask(bitmask, 0, count + 4)
    wide = set(allowed_ids(matcher, bitmask).tolist())
    matcher.fill_next_token_bitmask(bitmask, 0)
    everything = set(allowed_ids(matcher, bitmask).tolist())
    assert wide < everything
    # exactly the allowed tokens that lower the distance and fit (the definition)
    expected = set()
    for token in everything:
        matcher.accept_token(token)
        if (matcher.completion_distance() < here
                and matcher.completion_token_count() <= count + 3):
            expected.add(token)
        matcher.rollback(1)
    assert wide == expected
    assert matcher.accept_tokens(matcher.completion_tokens())
    matcher.fill_closing_bitmask(bitmask, 0, 1)
    assert set(allowed_ids(matcher, bitmask).tolist()) == set(vocab.eos_ids)


def test_a_stop_token_the_grammar_reads_does_not_close() -> None:
    """SmolLM2's EOS is <|im_end|>; where the grammar may end but would read <|im_end|> as its
    own symbol, that token goes on rather than stops, so the closing row leaves it out."""
    compiled = compiler("smollm2").compile(Grammar.from_peg('root = (token("<|im_end|>") "a")*'))
    matcher = compiled.matcher()
    bitmask = allocate_token_bitmask(1, compiled.vocab.size)
    assert matcher.completion_token_count() == 0
    matcher.fill_closing_bitmask(bitmask, 0, 1)
    assert allowed_ids(matcher, bitmask).size == 0
    eos = compiled.vocab.eos_ids[0]
    assert matcher.accept_token(eos) and not matcher.stopped  # read as the grammar's symbol


# --------------------------------------------------------------------------- random grammars
ATOMS = ['"a"', '"bc"', '"{"', '"}"', '"\\""', '"<"', '"</"', "[a-c]", "[0-9]", '[^"\\\\]',
         'token("<tool_call>")', 'token("</tool_call>")', 'token("<|im_end|>")',
         'until("</tool_call>")']


@st.composite
def peg_grammars(draw: st.DrawFn) -> str:
    """Small PEG grammars of literals, classes, specials (tokens or spelled, by vocabulary),
    repetitions and recursive rules (each reference inside brackets: no left recursion)."""
    def expr(depth: int) -> str:
        form = draw(st.integers(0, 7)) if depth < 3 else 0
        if form == 0:
            return draw(st.sampled_from(ATOMS))
        if form in (1, 2):
            parts = [expr(depth + 1) for _ in range(draw(st.integers(2, 3)))]
            return "(" + (" " if form == 1 else " | ").join(parts) + ")"
        if form in (3, 4, 5, 6):
            return "(" + expr(depth + 1) + ")" + ("?", "*", "+", "{1,3}")[form - 3]
        return '"[" ' + draw(st.sampled_from(["r1", "r2"])) + ' "]"'
    return "\n".join(f"{name} = {expr(0 if name == 'root' else 1)}"
                     for name in ("root", "r1", "r2"))


def shortest_by_search(compiled: CompiledGrammar, config: int, limit: int) -> int | None:
    """The distance by its definition: breadth-first over every byte and special token."""
    frontier, seen = [config], {config}
    for depth in range(limit + 1):
        if any(compiled.is_accepting(c) for c in frontier):
            return depth
        following = []
        for current in frontier:
            for symbol in [*range(256), *compiled.special_symbol.values()]:
                after = compiled.next_state(current, symbol)
                if after and after not in seen:
                    seen.add(after)
                    following.append(after)
        frontier = following
    return None


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(peg=peg_grammars(), vocab=st.sampled_from(["smollm2", "qwen3"]),
       seed=st.integers(0, 2**16))
def test_the_distance_is_the_shortest_completion_by_definition(peg, vocab, seed):
    grammar = Grammar.from_peg(peg)
    compiled = compiler(vocab).compile(grammar)
    matcher = compiled.matcher()
    rng = random.Random(seed)
    bitmask = allocate_token_bitmask(1, compiled.vocab.size)
    for _ in range(4):
        distance = matcher.completion_distance()
        expected = shortest_by_search(compiled, matcher.state, 12)
        if expected is not None or (distance is not None and distance <= 12):
            assert distance == expected
        if distance is None:
            return
        assert_completes(matcher)
        matcher.fill_next_token_bitmask(bitmask, 0)
        allowed = [t for t in allowed_ids(matcher, bitmask).tolist()
                   if t not in compiled.stop_ids]
        if not allowed:
            return
        assert matcher.accept_token(rng.choice(allowed))


# --------------------------------------------------------------------------- the budget policy
def decode_within(compiled: CompiledGrammar, budget: int, margin: int,
                  rng: random.Random) -> list[int]:
    """Random allowed tokens under the engine's policy: the plain mask while more than
    `margin` tokens are left beyond the plan, the closing mask after that, the plan itself
    when the budget is the plan. A plain-mask token after which the plan no longer fits, or
    after which nothing completes the grammar, is taken back for the plan's first token (the
    output ends there if the plan is empty)."""
    matcher = compiled.matcher()
    bitmask = allocate_token_bitmask(1, compiled.vocab.size)
    out: list[int] = []
    remaining = budget
    while remaining and not matcher.is_terminated():
        count = matcher.completion_token_count()
        assert count is not None and count <= remaining
        if count == remaining:
            tokens = matcher.completion_tokens()
            assert matcher.accept_tokens(tokens)
            out += tokens
            break
        closing = 0 < count and remaining <= count + margin  # at 0 the output may end here
        if closing:
            matcher.fill_closing_bitmask(bitmask, 0, remaining)
        else:
            matcher.fill_next_token_bitmask(bitmask, 0)
        allowed = allowed_ids(matcher, bitmask)
        assert allowed.size, "the mask is never empty while the grammar can be completed"
        token = int(rng.choice(allowed))
        assert matcher.accept_token(token)
        if matcher.stopped:
            break
        after = matcher.completion_token_count()
        if not closing and (after is None or after > remaining - 1):
            matcher.rollback(1)
            plan = matcher.completion_tokens()
            if not plan:
                break
            token = plan[0]
            assert matcher.accept_token(token)
        out.append(token)
        remaining -= 1
    assert matcher.is_accepting() or matcher.stopped
    return out


def assert_budget_policy_closes(grammar: Grammar, vocab: str, data: st.DataObject) -> None:
    compiled = compiler(vocab).compile(grammar)
    minimal = compiled.matcher().completion_token_count()
    assume(minimal is not None and minimal <= 60)
    budget = minimal + data.draw(st.integers(0, 24), label="extra budget")
    margin = data.draw(st.integers(0, 4), label="margin")
    rng = random.Random(data.draw(st.integers(0, 2**16), label="seed"))
    out = decode_within(compiled, budget, margin, rng)
    assert len(out) <= budget
    parser = grammar.stream_parser()
    parser.feed_tokens(out, compiled.vocab)
    parser.finish()  # raises unless the output is a complete sentence


POLICY = settings(max_examples=25, deadline=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


@pytest.mark.parametrize("vocab", sorted(VOCABULARIES))
@POLICY
@given(peg=peg_grammars(), data=st.data())
def test_random_grammars_close_within_any_budget(vocab, peg, data):
    assert_budget_policy_closes(Grammar.from_peg(peg), vocab, data)


SCHEMA_FILES = ["Github_easy---o68322.json", "Glaiveai2K---generate_invoice_2a7eeb4e.json",
                "Github_easy---o90335.json", "Kubernetes---kb_798_Normalized.json",
                "Snowplow---sp_322_Normalized.json", "Kubernetes---kb_1145_Normalized.json",
                "Github_easy---o27713.json", "Kubernetes---kb_912_Normalized.json",
                "Github_medium---o71820.json", "Kubernetes---kb_329_Normalized.json"]


@functools.cache
def schema_grammar(name: str) -> Grammar:
    return Grammar.from_json_schema(json.loads((SCHEMAS / name).read_text())["schema"])


@pytest.mark.parametrize("vocab", sorted(VOCABULARIES))
@POLICY
@given(name=st.sampled_from(SCHEMA_FILES), data=st.data())
def test_json_schemas_close_within_any_budget(vocab, name, data):
    assert_budget_policy_closes(schema_grammar(name), vocab, data)


@pytest.mark.parametrize("vocab", sorted(VOCABULARIES))
@POLICY
@given(data=st.data())
def test_tool_calls_close_within_any_budget(vocab, data):
    tools = [WEATHER, {"type": "function", "function": {"name": "remind", "parameters": {
        "type": "object", "required": ["when", "what"], "properties": {
            "when": {"type": "string", "format": "date-time"},
            "what": {"type": "array", "minItems": 1, "items": {"type": "string"}}}}}}]
    choice = data.draw(st.sampled_from(["auto", "required"]), label="tool_choice")
    grammar = get_dialect("hermes").grammar(ChatRequest(
        tools=tools, tool_choice=choice, chat_template_kwargs={"enable_thinking": False}))
    assert_budget_policy_closes(grammar, vocab, data)
