"""Special tokens a vocabulary lacks (SmolLM2 has no `<tool_call>`) are written as their
spelling and stay atomic: wherever the spelling appears it is the special token, never text, for
the streaming parser and the token automaton alike."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_stream_parser import merged
from vocabularies import smollm2, smollm2_tokenizer

from pegmask.grammars import Grammar, ParseError
from pegmask.grammars.compiler import GrammarCompiler
from pegmask.grammars.spelling import SpellingLexer
from pegmask.kernels import allocate_token_bitmask

# The same language twice: with special tokens that SmolLM2 must spell, and with their
# spellings as literals and free text that never contains them.
CALL = r'"\n" @call:("{" [a-z ]* "}") "\n" '
SPELLED = Grammar.from_peg(
    rf'root = @content:until()? (token("<tool_call>") {CALL} token("</tool_call>") "\n"?)*')
LITERAL = Grammar.from_peg(
    rf'root = @content:until("<tool_call>", "</tool_call>")? ("<tool_call>" {CALL} "</tool_call>" "\n"?)*')

VALID = [
    "",
    "Hello",
    "a < b and c > d",
    "no call: <tool_ca, <tool, </tool_cal> <<",
    "<tool_call>\n{get weather}\n</tool_call>",
    "Sure <tool_call>\n{a}\n</tool_call>\n<tool_call>\n{}\n</tool_call>",
    "text ending in a partial spelling <tool_call<tool_call>\n{x}\n</tool_call>",
    "<<tool_call>\n{x}\n</tool_call>",
]
INVALID = ["<tool_call>", "a <tool_call> b", "</tool_call>", "<tool_call>\n{x}\n</tool_call> more"]


@pytest.fixture(scope="module")
def compiler() -> GrammarCompiler:
    return GrammarCompiler(smollm2())


def allowed(matcher, bitmask) -> np.ndarray:
    matcher.fill_next_token_bitmask(bitmask, 0)
    bits = np.unpackbits(bitmask[0].numpy().view(np.uint8), bitorder="little")
    return bits[: matcher.compiled.vocab.size].astype(bool)


def encode(text: str) -> list[int]:
    return smollm2_tokenizer()(text, add_special_tokens=False)["input_ids"]


# ---------------------------------------------------------------------------- the lexer
def test_lexer_holds_back_what_may_become_a_special() -> None:
    lexer = SpellingLexer({b"<tool_call>": 256, b"</tool_call>": 257})
    plain = SpellingLexer.flush
    assert lexer.split(b"ab<tool") == (plain(b"ab"), b"<tool")
    assert lexer.split(b"<tool_call>x") == (((256, b"<tool_call>"),) + plain(b"x"), b"")
    assert lexer.split(b"<<tool_call>") == (plain(b"<") + ((256, b"<tool_call>"),), b"")
    assert lexer.split(b"<tool_x") == (plain(b"<tool_x"), b"")
    assert lexer.split(b"x</") == (plain(b"x"), b"</")
    assert lexer.first_bytes == {ord("<")}
    assert not SpellingLexer({}) and SpellingLexer({}).split(b"<a") == (plain(b"<a"), b"")


def test_the_vocabulary_decides_what_is_spelled(compiler: GrammarCompiler) -> None:
    vocab = smollm2()
    assert "<tool_call>" not in vocab.special_ids and "<|im_end|>" in vocab.special_ids
    grammar = Grammar.from_peg('root = token("<tool_call>") "x" token("<|im_end|>")')
    assert set(compiler.compile(grammar).lexer.spellings) == {b"<tool_call>"}


# ---------------------------------------------------------------------------- the parser
def test_parser_reads_spellings_in_tokens_as_specials() -> None:
    vocab = smollm2()
    for text in VALID:
        parser = SPELLED.stream_parser()
        parser.feed_tokens(encode(text), vocab)
        parser.finish()
        assert parser.result().root == LITERAL.parse(text).root, text
        assert parser.result().root == SPELLED.parse(text).root, text  # text input agrees
    for text in INVALID:
        assert not LITERAL.matches(text) and not SPELLED.matches(text)
        parser = SPELLED.stream_parser()
        with pytest.raises(ParseError):
            parser.feed_tokens(encode(text), vocab)
            parser.finish()


@settings(max_examples=60, deadline=None)
@given(text=st.sampled_from(VALID), cuts=st.lists(st.integers(0, 80), max_size=6))
def test_token_chunking_does_not_change_the_parse(text: str, cuts: list[int]) -> None:
    vocab = smollm2()
    ids = encode(text)
    parser = SPELLED.stream_parser()
    events = []
    start = 0
    for cut in sorted({min(c, len(ids)) for c in cuts}) + [len(ids)]:
        events += parser.feed_tokens(ids[start:cut], vocab)
        start = cut
    events += parser.finish()
    whole = SPELLED.stream_parser()
    assert merged(events) == merged(whole.feed_tokens(ids, vocab) + whole.finish())


# ---------------------------------------------------------------------------- the automaton
def test_canonical_tokenizations_are_allowed_and_masks_equal_the_literal_grammar(
        compiler: GrammarCompiler) -> None:
    vocab = smollm2()
    spelled, literal = compiler.compile(SPELLED), compiler.compile(LITERAL)
    assert spelled.lexer and not literal.lexer
    bitmask = allocate_token_bitmask(1, vocab.size)
    for text in VALID:
        a, b = spelled.matcher(), literal.matcher()
        for token in encode(text):
            mask = allowed(a, bitmask)
            assert np.array_equal(mask, allowed(b, bitmask)), (text, token)
            assert mask[token] and a.accept_token(token) and b.accept_token(token)
        assert a.is_accepting() and a.accept_token(vocab.eos_ids[0]) and a.is_terminated()
    for text in INVALID:
        matcher = spelled.matcher()
        assert not (matcher.accept_tokens(encode(text)) and matcher.is_accepting()), text


def test_random_paths_see_the_masks_of_the_literal_grammar(compiler: GrammarCompiler) -> None:
    """Sampling under the mask, leaning towards the spellings: masks equal the literal
    grammar's at every step, and whatever the mask lets through parses."""
    vocab = smollm2()
    spelled, literal = compiler.compile(SPELLED), compiler.compile(LITERAL)
    bitmask = allocate_token_bitmask(1, vocab.size)
    hints = sorted({t for text in VALID for t in encode(text)} | {vocab.eos_ids[0]})
    rng = random.Random(11)
    finished = 0
    for _ in range(30):
        a, b = spelled.matcher(), literal.matcher()
        out: list[int] = []
        for _ in range(40):
            mask = allowed(a, bitmask)
            assert np.array_equal(mask, allowed(b, bitmask)), out
            choices = [t for t in hints if mask[t]] if rng.random() < 0.8 else []
            token = rng.choice(choices) if choices else int(rng.choice(np.flatnonzero(mask)))
            assert a.accept_token(token) and b.accept_token(token)
            if a.is_terminated():
                finished += 1
                break
            out.append(token)
        parser = SPELLED.stream_parser()
        parser.feed_tokens(out, vocab)
        if a.is_terminated():
            parser.finish()
    assert finished >= 3


def test_jump_forward_writes_the_spelling(compiler: GrammarCompiler) -> None:
    """Where only a call can follow, the forced bytes spell the special token, from wherever
    the spelling was cut."""
    grammar = Grammar.from_peg(rf'root = "ok " token("<tool_call>") {CALL} token("</tool_call>")')
    compiled = compiler.compile(grammar)
    forced = b"ok <tool_call>\n{"
    for cut in range(len(forced)):
        matcher = compiled.matcher()
        assert matcher.accept_string(forced[:cut])
        assert matcher.find_jump_forward_string() == forced[cut:]
