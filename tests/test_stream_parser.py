"""The streaming parser: chunk invariance, certainty of events, status reporting."""

import functools
import random

import pytest
from grammar_sampling import sample_symbols
from hypothesis import given, settings
from hypothesis import strategies as st

from pegmask.grammars import Grammar, ParseError
from pegmask.grammars.program import SPECIAL_BASE

GRAMMARS = {
    "chat": r"""
root = reasoning? @content:until(token("<tool_call>"), "<call>") call*
reasoning = token("<think>") @reasoning:until("</think>") "</think>" "\n"?
call = (token("<tool_call>") | "<call>") @call:obj "</call>"?
obj = "{" (@key:str ":" @value:val ("," @key:str ":" @value:val)*)? "}"
val = str | [0-9]+ | obj | "[" (val ("," val)*)? "]"
str = "\"" ([a-z ] | "\\\"")* "\""
""",
    "nested": r"""
root = @outer:(item (" " item)*)
item = @word:[a-c]+ | "(" @inner:root ")"
""",
    "ambiguous": r"""
root = @a:"x"* @b:("x" | "y")* @c:until("yy") "yy"
""",
}


def merged(events):
    """Events with adjacent text pieces of the same capture joined (chunking-independent)."""
    out = []
    for e in events:
        if out and e.kind == "text" and out[-1][0] == "text" and out[-1][1] == e.tag:
            out[-1] = ("text", e.tag, out[-1][2] + e.text, e.path)
        else:
            out.append((e.kind, e.tag, e.text, e.path))
    return [e for e in out if not (e[0] == "text" and e[2] == "")]


def run(grammar, symbols, cuts):
    parser = grammar.stream_parser()
    events = []
    bounds = [0, *sorted(cuts), len(symbols)]
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        events += parser.feed_symbols(symbols[lo:hi])
    events += parser.finish()
    return merged(events), parser.result()


def tree(node):
    return (node.tag, node.text, node.start, node.end, [tree(c) for c in node.children])


@functools.cache
def samples(name, count, seed=0):
    grammar = Grammar.from_peg(GRAMMARS[name])
    rng = random.Random(seed)
    found = []
    while len(found) < count:
        symbols = sample_symbols(grammar.program, rng, max_len=60)
        if symbols is not None:
            found.append(symbols)
    return grammar, found


@pytest.mark.parametrize("name", sorted(GRAMMARS))
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_result_is_independent_of_chunking(name, data):
    grammar, sentences = samples(name, 20, seed=len(name))
    symbols = data.draw(st.sampled_from(sentences))
    cuts = data.draw(st.lists(st.integers(0, len(symbols)), max_size=10))
    whole_events, whole = run(grammar, symbols, [])
    events, result = run(grammar, symbols, cuts)
    assert events == whole_events
    assert tree(result.root) == tree(whole.root)
    # The capture events rebuild exactly the capture tree of the result.
    assert [e for e in events if e[0] == "open"] == [
        e for e in whole_events if e[0] == "open"
    ]


def test_events_are_emitted_before_the_end():
    g = Grammar.from_peg(GRAMMARS["chat"])
    p = g.stream_parser()
    events = p.feed("hello wor")
    assert [e.kind for e in events] == ["open", "text"]
    assert events[1].text == "hello wor"
    # A partial stop string is held back until it is decided.
    assert [e.text for e in p.feed("ld <ca")] == ["ld "]
    assert [e.text for e in p.feed("t")] == ["<cat"]
    events = p.feed("<call>{")
    assert ("close", "content") in [(e.kind, e.tag) for e in events]


def test_status_and_errors():
    g = Grammar.from_peg('root = "ab" "c"?')
    p = g.stream_parser()
    p.feed("a")
    assert p.status == "prefix"
    p.feed("b")
    assert p.status == "complete"
    with pytest.raises(ParseError) as info:
        p.feed("x")
    assert info.value.position == 2
    assert p.status == "invalid"
    with pytest.raises(ParseError):
        p.feed("c")  # stays failed


def test_status_is_complete_when_held_back_bytes_would_end_the_input():
    """Bytes that may start a special token's spelling are held back; the input is complete
    when it would be with them read as text (what `finish` does), and not otherwise."""
    for peg, text, complete in [('root = [a-z東]* token("東京")?', "a東", True),
                                ('root = "x" ("<t" | token("<tool_call>") "y")', "x<t", True),
                                ('root = "x" ("<tz" | token("<tool_call>") "y")', "x<t", False)]:
        p = Grammar.from_peg(peg).stream_parser()
        p.feed(text)
        assert p.status == ("complete" if complete else "prefix"), (peg, text)
        if complete:
            p.finish()
        else:
            with pytest.raises(ParseError):
                p.finish()


def test_incomplete_input_fails_at_finish():
    g = Grammar.from_peg('root = "ab"')
    p = g.stream_parser()
    p.feed("a")
    with pytest.raises(ParseError, match="end of input") as info:
        p.finish()
    assert info.value.position == 1


def test_special_token_spelling_split_across_chunks():
    g = Grammar.from_peg('root = @c:until(token("<|end|>")) token("<|end|>")')
    p = g.stream_parser()
    text = ""
    for piece in ["ab<|", "en", "d|", ">"]:
        text += "".join(e.text for e in p.feed(piece) if e.kind == "text")
    p.finish()
    assert text == "ab"
    assert p.result().first("c").text == "ab"


def test_symbols_specials_cannot_be_faked_by_bytes():
    g = Grammar.from_peg('root = @c:until(token("<|end|>")) token("<|end|>")')
    end = g.program.special_symbol("<|end|>")
    assert end == SPECIAL_BASE
    p = g.stream_parser()
    p.feed_symbols(list(b"x<|end|>y") + [end])  # the bytes are text, only the symbol ends it
    p.finish()
    assert p.result().first("c").text == "x<|end|>y"


def test_multibyte_text_is_never_split_inside_a_character():
    g = Grammar.from_peg("root = @c:until(\"!\") \"!\"")
    p = g.stream_parser()
    data = "é😀".encode()
    pieces = []
    for b in data:
        pieces += [e.text for e in p.feed_bytes(bytes([b])) if e.kind == "text"]
    p.feed_bytes(b"!")
    p.finish()
    assert "".join(pieces) == "é😀"
    assert all(pieces)


def test_linear_cost_on_long_output():
    """Feeding byte by byte must not re-scan earlier input (steps stay bounded per byte)."""
    g = Grammar.from_peg(GRAMMARS["chat"])
    text = "<think>" + "lorem ipsum " * 800 + "</think>\n" + "dolor sit " * 800
    p = g.stream_parser()
    for ch in text:
        p.feed(ch)
    p.finish()
    assert len(p.result().first("content").text) == len("dolor sit ") * 800
