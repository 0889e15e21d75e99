"""Choices compiled as a trie of their symbols (`pegmask.grammars.alternation`): the same
language and the same captures as one branch per alternative; enums of thousands of strings
accept exactly their values, in the parser and token by token in the automaton; the program
and the first configuration grow with the trie, not with the alternatives."""

from __future__ import annotations

import dataclasses
import functools
import json
import random

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from test_automaton import assert_masks_exact_along
from vocabularies import smollm2, smollm2_tokenizer

from pegmask.dialects.registry import get_dialect
from pegmask.dialects.request import ChatRequest
from pegmask.grammars import Grammar, ParseError
from pegmask.grammars.compiler import compile_grammar
from pegmask.grammars.ir import (
    Capture,
    CharClass,
    Choice,
    Literal,
    Node,
    Repeat,
    choice,
    seq,
)

# ------------------------------------------------------------- the trie against plain branches


def flat(node: Node) -> Grammar:
    """The grammar of `node` compiled with one branch per alternative (no trie)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("pegmask.grammars.program.alternation_trie", lambda alts: None)
        return Grammar.from_node(node).compile()


def outcome(grammar: Grammar, text: str) -> object:
    """What parsing `text` reports: the events as fed byte by byte (a capture's text as one
    piece between its other events: where a text event is cut depends on when derivations
    agree, which the trie may decide a byte sooner) and the capture tree, or the error's
    position."""
    parser = grammar.stream_parser()
    try:
        events = [e for byte in text.encode() for e in parser.feed_bytes(bytes((byte,)))]
        events += parser.finish()
    except ParseError as exc:
        return ("error", exc.position)
    joined: list = []
    for event in events:
        last = joined[-1] if joined else None
        if (event.kind == "text" and last is not None and last.kind == "text"
                and last.path == event.path):
            joined[-1] = dataclasses.replace(last, text=last.text + event.text)
        else:
            joined.append(event)
    return joined, parser.result().root


AB = CharClass(((ord("a"), ord("b")),))  # one object in several alternatives: shared
AMBIGUOUS = Choice((Literal(b"a"), Literal(b"ab")))  # matches a prefix two ways: never shared
WORDS = st.text("ab", max_size=3)


@st.composite
def alternatives(draw: st.DrawFn) -> Node:
    """Alternatives that share prefixes, repeat, carry captures and shareable or unshareable
    nodes."""
    kind = draw(st.sampled_from(["literal", "literal", "capture", "inner", "class", "ambiguous",
                                 "repeat"]))
    word = Literal(draw(WORDS).encode())
    if kind == "capture":
        return Capture("c", word)
    if kind == "inner":
        return seq(word, Capture("d", Literal(draw(WORDS).encode())))
    if kind == "class":
        return seq(word, AB, Capture("e", Literal(draw(WORDS).encode())))
    if kind == "ambiguous":
        return seq(word, AMBIGUOUS, Capture("e", Literal(draw(WORDS).encode())))
    if kind == "repeat":
        return seq(word, Repeat(Literal(b"b"), 0, None))
    return word


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(alts=st.lists(alternatives(), min_size=2, max_size=8),
       texts=st.lists(st.text("ab", max_size=7), min_size=1, max_size=12))
# "aba" is "ab" then "a" in the first alternative, "a" then "ba" in the second: sharing the
# node that reads "a" or "ab" would rank the second first
@example(alts=[seq(AMBIGUOUS, Capture("e", Literal(b"a"))),
               seq(AMBIGUOUS, Capture("e", Literal(b"ba")))], texts=["aba", "abab"])
@example(alts=[Literal(b"ab"), Capture("c", Literal(b"a")), Literal(b"ab"), Literal(b"aab")],
         texts=["ab", "aab", "abb", "a"])
def test_trie_keeps_the_language_and_the_captures(alts, texts):
    """Around and after the choice, captures whose extent depends on which alternative wins:
    the trie reports what one branch per alternative reports, for every input."""
    node = seq(Capture("x", Choice(tuple(alts))), Capture("y", Repeat(AB, 0, None)))
    trie, plain = Grammar.from_node(node).compile(), flat(node)
    for text in texts:
        assert outcome(trie, text) == outcome(plain, text), text


def test_trie_shares_leading_bytes_where_order_cannot_matter():
    """`ab | a | ac`: "a" ends between two alternatives that go on with b and c, so the c
    branch may not join the b branch (it would rank "ac" above "a"); bytes after bytes do."""
    grammar = Grammar.from_node(seq(Choice((Literal(b"ab"), Literal(b"a"), Literal(b"ac"))),
                                    Repeat(CharClass(((ord("c"), ord("c")),)), 0, None)))
    assert grammar.matches("ac") and grammar.matches("acc") and grammar.matches("ab")
    shared = Grammar.from_node(choice(*(Literal(w.encode()) for w in ("ab", "ac", "ad"))))
    # one "a", then a choice of three bytes: 1 + 1 + 3 instructions (and the rule's frame)
    assert len(shared.program) == len(Grammar.from_node(Literal(b"ab")).program) + 3


# ------------------------------------------------------------------------------ large enums
TEXT = st.text(st.sampled_from(["a", "b", "é", "/", '"', "\\", "\n", "😀", " ", "\x7f"]),
               max_size=4)


def spellings(value: str) -> list[str]:
    """JSON texts of `value`: raw UTF-8, and with non-ASCII characters as \\u escapes."""
    return [json.dumps(value, ensure_ascii=False), json.dumps(value)]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values=st.lists(TEXT, min_size=1, max_size=30), others=st.lists(TEXT, max_size=20))
def test_enum_accepts_exactly_its_values(values, others):
    """Shared prefixes, a value that is a prefix of another, repeats, characters that need
    escaping or have several spellings: exactly the enum's values parse."""
    grammar = Grammar.from_json_schema({"enum": values})
    for value in values + others + [v + "a" for v in values] + [v[:-1] for v in values if v]:
        for text in spellings(value):
            assert grammar.matches(text) == (value in values), (values, text)


def enum_values(count: int, seed: int) -> list[str]:
    """Words over few letters (many shared prefixes, some a prefix of another), and some with
    characters that JSON escapes or spells in several ways."""
    rng = random.Random(seed)
    words = {"".join(rng.choices("abcde", k=rng.randint(1, 9))) for _ in range(count)}
    extra = ["a/b", "a\\b", 'a"b', "é", "éa", "tab\there", "😀", "a😀b", "naïve", "日本語"]
    return sorted(words | set(extra), key=lambda _: rng.random())


@functools.cache
def large_enum() -> tuple[list[str], Grammar]:
    values = enum_values(3000, seed=5)
    return values, Grammar.from_json_schema({"enum": values})


def test_large_enum_token_by_token_on_smollm2():
    """Values are allowed token by token under the real tokenizer and end where the grammar
    may; strings next to the values (a prefix, one more letter, another letter) are refused;
    masks along a few values are exact."""
    values, grammar = large_enum()
    members = set(values)
    compiled = compile_grammar(grammar, smollm2())
    tokenizer = smollm2_tokenizer()
    rng = random.Random(9)
    sample = rng.sample(values, 60) + [v for v in values if not v.isascii() or '"' in v]
    near = {v[:-1] for v in sample if v} | {v + "c" for v in sample} | {"z" + v for v in sample}
    for value in sample + sorted(near - members):
        matcher = compiled.matcher()
        ok = all(matcher.accept_token(token) for token in
                 tokenizer(json.dumps(value, ensure_ascii=False),
                           add_special_tokens=False)["input_ids"])
        assert (ok and matcher.is_accepting()) == (value in members), value
        assert grammar.matches(json.dumps(value)) == (value in members), value
    for value in ("éa", "abc", "a/b"):
        if value in members:
            assert_masks_exact_along(compiled, json.dumps(value, ensure_ascii=False))


def test_large_enum_waits_on_one_thread_and_grows_with_its_trie():
    """After the opening quote, the configuration is one thread (a choice of bytes), not one
    per value; the program holds about one instruction per trie edge, fewer than the values'
    bytes, and four times the values take about four times the instructions, not more."""
    values, grammar = large_enum()
    compiled = compile_grammar(grammar, smollm2())
    inside = compiled.next_state(compiled.initial_state, ord('"'))
    assert len(compiled._threads[inside]) == 1
    plain = [v for v in values if v.isascii() and v.isalpha()]
    edges = len({v[:end] for v in plain for end in range(1, len(v) + 1)})
    ascii_only = Grammar.from_json_schema({"enum": plain})
    assert len(ascii_only.program) <= 2 * edges + len(plain) + 16
    assert len(ascii_only.program) < sum(len(v) + 2 for v in plain)
    small, big = (Grammar.from_json_schema({"enum": enum_values(count, seed=1)})
                  for count in (2000, 8000))
    assert len(big.program) <= 4 * len(small.program)


def test_many_consts_in_any_of_and_intersected_enums():
    """An `anyOf` of thousands of `const`s is as many values (constants do not count towards
    the combinators' alternatives), and two enums intersect to the values they share."""
    values = enum_values(1500, seed=2)
    grammar = Grammar.from_json_schema({"anyOf": [{"const": v} for v in values]})
    assert all(grammar.matches(json.dumps(v)) for v in values[:200])
    assert not grammar.matches(json.dumps("zzz"))
    both = Grammar.from_json_schema({"allOf": [{"enum": values}, {"enum": values[::2] + [7]}]})
    assert all(both.matches(json.dumps(v)) == (i % 2 == 0) for i, v in enumerate(values[:200]))
    assert not both.matches("7")


# ------------------------------------------------------------------------- dialect tool names
def named_tools(count: int) -> list[dict]:
    """Tools whose names share long prefixes, one the prefix of another."""
    names = ["get", "get_weather", *(f"get_weather_{i}" for i in range(count - 2))]
    return [{"type": "function", "function": {"name": name, "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"]}}} for name in names]


@pytest.mark.parametrize("dialect", ["hermes", "hermes-xml"])
def test_tool_names_make_one_trie(dialect):
    """Calls of many tools whose names share prefixes: the configuration inside a name holds
    a few threads, not one per tool, and every call parses with its own name."""
    tools = named_tools(120)
    grammar = get_dialect(dialect, reasoning=False).grammar(
        ChatRequest(tools=tools, tool_choice="required"))
    compiled = compile_grammar(grammar, smollm2())
    for name in ("get", "get_weather", "get_weather_7", "get_weather_77"):
        message = get_dialect(dialect, reasoning=False).parse(
            call_text(dialect, name), ChatRequest(tools=tools, tool_choice="required"),
            trusted=True)
        (call,) = message["tool_calls"]
        assert call["function"]["name"] == name
        assert json.loads(call["function"]["arguments"]) == {"city": "Oslo"}
    text = call_text(dialect, "get_weather_7")
    state = compiled.initial_state
    for end, byte in enumerate(text.encode()):
        state = compiled.next_state(state, byte)
        assert state, text[: end + 1]
        if text[: end + 1].endswith("get_weather_"):
            assert len(compiled._threads[state]) <= 4


def call_text(dialect: str, name: str) -> str:
    if dialect == "hermes":
        return f'<tool_call>\n{{"name": "{name}", "arguments": {{"city": "Oslo"}}}}\n</tool_call>'
    return (f"<tool_call>\n<function={name}>\n<parameter=city>\nOslo\n</parameter>\n"
            "</function>\n</tool_call>")


def test_tool_choice_instructions_grow_linearly():
    """Four times the tools, about four times the program: the tools' schemas share their
    whitespace, string and number rules, and the names their prefixes."""
    sizes = [len(get_dialect("hermes").grammar(
        ChatRequest(tools=named_tools(count), tool_choice="required")).program)
        for count in (50, 200)]
    assert sizes[1] <= 4 * sizes[0]
    assert sizes[1] - sizes[0] <= 150 * 150  # per tool, its arguments' object and its name
