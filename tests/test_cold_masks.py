"""A new state's first mask takes shortcuts (a held-back spelling's row read off the threads
after it, the plain tokens after a whitespace run allowed below a node at once): the masks and
transitions they give are the ones a byte-by-byte reading gives, on SmolLM2's real vocabulary."""

from __future__ import annotations

import functools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from test_dialect_base import TOOLS
from vocabularies import smollm2

from pegmask.dialects import ChatRequest, get_dialect
from pegmask.grammars import Grammar
from pegmask.grammars.compiler import CompiledGrammar, compile_grammar
from pegmask.grammars.configurations import DEAD


@functools.cache
def hermes(tool_choice: str) -> Grammar:
    """The hermes turn with tools: free text and reasoning after optional whitespace, calls
    opened by `<tool_call>`, which SmolLM2 spells."""
    return get_dialect("hermes").grammar(ChatRequest(tools=TOOLS, tool_choice=tool_choice))


# Spellings that hold one another (`<a>` inside `<<a>>`, `<a` a prefix of both) and free text.
NESTED = Grammar.from_peg(
    'root = @text:until()? ((token("<<a>>") | token("<a>") | token("<b>")) "x"?)*')
PIECES = ["<", "<<", "a", ">", ">>", "<a>", "<<a>>", "<b", "b>", "x", " ", "\n", "é", "<tool_call",
          "<think", "</tool_call>\n", '{"name": "', "Hello"]


def fresh(grammar: Grammar) -> CompiledGrammar:
    """A new binding: no row or mask of an earlier example is reused."""
    return compile_grammar(grammar, smollm2())


def brute_force_mask(compiled: CompiledGrammar, state: int) -> np.ndarray:
    """Every token whose bytes (or symbol) `state` reads, and the stop tokens where it may end."""
    size = compiled.vocab.size
    allowed = np.array([compiled.state_after_token(state, t) != DEAD for t in range(size)])
    if compiled.is_accepting(state):
        allowed[[t for t in compiled.stop_ids if t < size]] = True
    return allowed


def mask_of(compiled: CompiledGrammar, state: int) -> np.ndarray:
    packed, _ = compiled.mask(state)
    bits = np.unpackbits(packed.view(np.uint8), bitorder="little")
    return bits[: compiled.vocab.size].astype(bool)


@settings(max_examples=40, deadline=None)
@given(grammar=st.sampled_from([NESTED, hermes("auto"), hermes("required")]),
       pieces=st.lists(st.sampled_from(PIECES), max_size=6))
def test_held_rows_are_the_bytes_lexed_one_by_one(grammar: Grammar, pieces: list[str]) -> None:
    """Where bytes are held back (a prefix of a spelling), each byte's transition is what lexing
    the held bytes and it gives, though the row is read off the threads for unspelled bytes."""
    compiled = fresh(grammar)
    matcher = compiled.matcher()
    for piece in pieces:
        if not matcher.accept_string(piece):
            break
        state = matcher.state
        held = compiled._held[state]
        if held:
            row = list(compiled._row(state))
            base = compiled._base[state]
            assert row == [compiled._after_lexemes(base, *compiled._split(held + bytes((b,))))
                           for b in range(256)], (pieces, held)


@settings(max_examples=6, deadline=None)
@given(tool_choice=st.sampled_from(["auto", "required"]),
       prefix=st.sampled_from(["", "\n", " \n ", "\n\n\n"]))
def test_masks_after_whitespace_before_free_text_are_what_every_token_reads(
        tool_choice: str, prefix: str) -> None:
    """At the turn's start (a run of whitespace, then text, reasoning or a call), the tokens
    that leave the run are walked with cuts where plain text survives: token by token, the mask
    is the set of tokens the configuration reads."""
    compiled = fresh(hermes(tool_choice))
    matcher = compiled.matcher()
    assert matcher.accept_string(prefix)
    state = matcher.state
    assert compiled._run_split(state) is not None  # the run's shortcut decides this mask
    expected = brute_force_mask(compiled, state)
    assert expected.sum() > 40_000  # free text: most of the vocabulary
    assert np.array_equal(mask_of(compiled, state), expected)
