"""Regular grammars: pegmask's masks equal outlines-core's, state by state, on SmolLM2.

outlines-core builds a token-level DFA (`Index`) for a regex, so for a regular grammar it is an
independent oracle for the whole mask, not only for sampled tokens. Both engines are walked in
lockstep (random allowed tokens, and the real tokenizer's tokenization of strings hypothesis
draws from the regex) and at every step the sets of allowed ordinary tokens, and whether EOS
is allowed, must be equal.

Two behaviours of outlines-core 0.2.x's `Index` are not the regex's language, so the oracle is
the Index of `(?:P)\\n` (a newline sentinel, which no pattern here can match, standing for EOS):

* it drops a token when the text before the token's *last byte* is a full match and the text
  with it is not (regex-automata reports matches one byte late and the Index keeps such a
  transition only if it ends in a match): after "1" for a JSON number, "." is refused;
* its DFA is leftmost-first, so after a full match of an earlier alternative the later ones
  die: `(red|reduce)` refuses "uce" after "red".

With the sentinel no state before the end is a match, so neither applies; EOS in `P` is the
"\\n" token in `(?:P)\\n` (no pattern here matches a newline; one that did would make the
comparison fail, not pass). `test_outlines_plain_index_differences` pins both behaviours.

The patterns avoid where the dialects differ (pegmask speaks ECMAScript, outlines-core Rust's
`regex`): no `\\d \\w \\s` (Unicode classes in Rust, ASCII in ECMAScript), no `\\b`, no case
folding. `.` is "any character but \\n" in both.
"""

from __future__ import annotations

import functools
import random
import re

import numpy as np
import outlines_core
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from vocabularies import smollm2, smollm2_tokenizer

from pegmask.grammars import Grammar
from pegmask.grammars.compiler import CompiledGrammar, compile_grammar
from pegmask.grammars.matcher import GrammarMatcher

PATTERNS = {
    "date": r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])",
    "time": r"([01][0-9]|2[0-3]):[0-5][0-9](:[0-5][0-9])?",
    "datetime": r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?"
                r"(Z|[+-][0-9]{2}:[0-9]{2})",
    "email": r"[a-z0-9._%+-]{1,20}@[a-z0-9-]{1,15}(\.[a-z]{2,6}){1,2}",
    "integer": r"-?(0|[1-9][0-9]*)",
    "json_number": r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?",
    "money": r"\$[0-9]{1,3}(,[0-9]{3})*\.[0-9]{2}",
    "colors": r"(red|green|blue|yellow|purple)",
    "tool_names": r"(get_weather|get_time|get_timezone|set_alarm)",
    "answers": r"(yes|no|maybe|not sure)",
    "us_phone": r"\([0-9]{3}\) [0-9]{3}-[0-9]{4}",
    "intl_phone": r"\+[1-9][0-9]{0,2}( [0-9]{2,4}){2,4}",
    "identifier": r"[A-Za-z_][A-Za-z0-9_]{0,15}",
    "snake_case": r"[a-z]+(_[a-z]+){0,3}",
    "unicode_words": r"(café|naïve|résumé|東京|Zürich|München)",
    "greek": r"[α-ω]{1,10}",
    "cjk": r"[一-龥]{1,6}",
    "emoji": r"(😀|🎉|👍){1,3}",
    "ipv4": r"((25[0-5]|2[0-4][0-9]|1?[0-9]?[0-9])\.){3}(25[0-5]|2[0-4][0-9]|1?[0-9]?[0-9])",
    "uuid": r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
    "hex_color": r"#([0-9a-fA-F]{3}|[0-9a-fA-F]{6})",
    "semver": r"(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[a-z0-9]+(\.[a-z0-9]+)*)?",
    "quoted": r'"[^"\\\n]{0,20}"',
    "sentence": r"[A-Z][a-z]+( [a-z]+){0,5}\.",
    "any_line": r".{0,12}",
    "url": r"https?://[a-z0-9.-]+\.[a-z]{2,4}(/[a-zA-Z0-9_-]+)*/?",
    "json_flag": r'\{"ok": (true|false)\}',
    "zip_code": r"[0-9]{5}(-[0-9]{4})?",
}
SENTINEL = b"\n"
WALKS = 6
MAX_STEPS = 24


@functools.cache
def outlines_vocabulary() -> outlines_core.Vocabulary:
    """pegmask's SmolLM2 vocabulary in outlines-core's form: ordinary tokens only."""
    vocab = smollm2()
    by_bytes: dict[bytes, list[int]] = {}
    for token_id in vocab.normal_token_ids().tolist():
        by_bytes.setdefault(vocab.token_bytes[token_id], []).append(token_id)
    return outlines_core.Vocabulary(vocab.eos_ids[0], by_bytes)


@functools.cache
def pegmask_compiled(pattern: str) -> CompiledGrammar:
    return compile_grammar(Grammar.from_regex(pattern), smollm2())


@functools.cache
def outlines_index(pattern: str) -> outlines_core.Index:
    return outlines_core.Index(pattern, outlines_vocabulary())


@functools.cache
def sentinel_tokens() -> tuple[int, frozenset[int]]:
    """(the id of the token that is exactly the sentinel, ids of all tokens containing it)."""
    vocab = smollm2()
    containing = frozenset(t for t, data in enumerate(vocab.token_bytes)
                           if data is not None and SENTINEL in data)
    (exact,) = [t for t in containing if vocab.token_bytes[t] == SENTINEL]
    return exact, containing


def allowed_ids(matcher: GrammarMatcher, bitmask: np.ndarray) -> set[int]:
    matcher.fill_next_token_bitmask(bitmask, 0)
    bits = np.unpackbits(bitmask[0].view(np.uint8), bitorder="little")[: matcher.compiled.vocab.size]
    return set(np.flatnonzero(bits).tolist())


class Lockstep:
    """A pegmask matcher and outlines-core's `(?:P)\\n` Index advanced together."""

    def __init__(self, name: str):
        self.name = name
        pattern = PATTERNS[name]
        self.matcher = pegmask_compiled(pattern).matcher()
        self.vocab = self.matcher.compiled.vocab
        self.eos = self.vocab.eos_ids[0]
        self.index = outlines_index(f"(?:{pattern}){SENTINEL.decode()}")
        self.state = self.index.get_initial_state()
        self.bitmask = np.zeros((1, (self.vocab.size + 31) // 32), dtype=np.int32)
        self.prefix = b""

    def compare(self) -> tuple[list[int], bool]:
        """Assert both engines allow the same tokens here; return (ordinary tokens, EOS)."""
        ours = allowed_ids(self.matcher, self.bitmask)
        our_eos = self.eos in ours
        ours.discard(self.eos)
        sentinel, containing = sentinel_tokens()
        theirs = set(self.index.get_allowed_tokens(self.state))
        their_eos = sentinel in theirs
        theirs -= containing | {self.eos}
        if ours != theirs or our_eos != their_eos:
            only = {"pegmask": sorted(ours - theirs), "outlines": sorted(theirs - ours)}
            shown = {k: [self.vocab.token_text(t) for t in v[:8]] for k, v in only.items()}
            pytest.fail(
                f"{self.name}: masks differ after {self.prefix!r}: EOS pegmask={our_eos} "
                f"outlines={their_eos}; only pegmask allows {len(only['pegmask'])} "
                f"{shown['pegmask']}, only outlines allows {len(only['outlines'])} "
                f"{shown['outlines']}")
        return sorted(ours), our_eos

    def advance(self, token: int) -> None:
        assert self.matcher.accept_token(token)
        self.state = self.index.get_next_state(self.state, token)
        assert self.state is not None
        self.prefix += self.vocab.token_bytes[token]

    def finish(self) -> None:
        assert self.matcher.accept_token(self.eos)
        assert self.matcher.is_terminated()
        end = self.index.get_next_state(self.state, sentinel_tokens()[0])
        assert end is not None and self.index.is_final_state(end)


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_random_walks_see_the_same_masks(name: str) -> None:
    """Random allowed tokens from the start state: also reaches states that the tokenizer's
    own tokenization never visits (odd splits, partial UTF-8 characters)."""
    rng = random.Random(name)
    for _ in range(WALKS):
        walk = Lockstep(name)
        for _ in range(MAX_STEPS):
            tokens, eos = walk.compare()
            if eos and (not tokens or rng.random() < 0.25):
                walk.finish()
                break
            assert tokens, "a live, non-final state must allow some token"
            walk.advance(rng.choice(tokens))


@pytest.mark.parametrize("name", sorted(PATTERNS))
@settings(max_examples=6, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_canonical_tokenizations_see_the_same_masks(name: str, data: st.DataObject) -> None:
    """Strings of the language, tokenized by the real tokenizer, as a model would write them:
    every token is allowed by both, the masks agree at every step, and EOS ends it."""
    text = data.draw(st.from_regex(PATTERNS[name], fullmatch=True))
    tokenizer = smollm2_tokenizer()
    ids = tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    walk = Lockstep(name)
    if b"".join(walk.vocab.token_bytes[t] or b"\0" for t in ids) != text.encode():
        return  # not spelled exactly by ordinary tokens (the tokenizer normalized it)
    for token in ids:
        tokens, _ = walk.compare()
        assert token in tokens, f"{name}: token {walk.vocab.token_text(token)!r} refused"
        walk.advance(token)
    _, eos = walk.compare()
    assert eos
    walk.finish()


# (pattern, text so far, next token, a completion): the token is in the language's prefixes
# (Python's `re` agrees), pegmask allows it, outlines-core's plain Index does not.
PLAIN_INDEX_DIFFERENCES = [
    # A full match before the token's last byte, none after it.
    (r"-?(0|[1-9][0-9]*)(\.[0-9]+)?", b"1", b".", b"5"),
    (r"([01][0-9]|2[0-3]):[0-5][0-9](:[0-5][0-9])?", b"11:38", b":", b"00"),
    (r"#([0-9a-f]{3}|[0-9a-f]{6})", b"#", b"face", b"d0"),
    (r"(no|not sure)", b"no", b"t", b" sure"),
    (r".{0,12}", b"", b"\xc3", b"\xa9"),  # the first byte of "é", a byte-level token
    # Leftmost-first: a full match of an earlier alternative kills the later ones.
    (r"(red|reduce)", b"red", b"uce", b""),
]


@pytest.mark.parametrize(("pattern", "before", "token", "after"), PLAIN_INDEX_DIFFERENCES)
def test_outlines_plain_index_differences(pattern: str, before: bytes, token: bytes,
                                          after: bytes) -> None:
    """Why the oracle is `(?:P)\\n`: on these, pegmask follows the language and the plain
    Index does not. If the last assertion starts failing, outlines-core changed and the
    sentinel can go."""
    vocab = smollm2()
    ids = {data: t for t, data in enumerate(vocab.token_bytes) if data is not None}
    assert re.fullmatch(pattern, (before + token + after).decode())
    matcher = pegmask_compiled(pattern).matcher()
    assert matcher.accept_string(before)
    assert ids[token] in allowed_ids(matcher, np.zeros((1, (vocab.size + 31) // 32), np.int32))
    assert matcher.accept_token(ids[token])
    assert matcher.accept_string(after)
    assert matcher.is_accepting()

    index = outlines_index(pattern)
    state = index.get_initial_state()
    for byte in before:
        state = index.get_next_state(state, ids[bytes([byte])])
        assert state is not None
    assert ids[token] not in index.get_allowed_tokens(state)
