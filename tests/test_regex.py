"""The regex front-end against Python's `re` as the oracle.

`re` is run with `re.ASCII` on a rewritten pattern (`python_equivalent`) so that both sides read
the pattern the same way: ECMAScript `\\s` (which includes some non-ASCII spaces) and a `$` that
matches only at the very end. Hypothesis draws valid strings from the pattern, mutates them, and
draws random text over an alphabet of the pattern's own characters plus awkward ones.
"""

from __future__ import annotations

import functools
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pegmask.grammars import Grammar, GrammarError
from pegmask.grammars.ir import Choice, GrammarIR, Literal, Repeat
from pegmask.grammars.regex import (
    MAX_EXPANDED_SIZE,
    MAX_GROUP_DEPTH,
    MAX_PATTERN_LENGTH,
    RegexError,
    regex_to_node,
    regex_to_node_search,
)

ECMA_SPACE = r"\t\n\v\f\r \u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
EXTRA_CHARS = "0159azAZ_-.@/: \t\n\r\u00a0\u2028\ufeffé中Ж😀\x00"

PATTERNS = [
    r"\d{4}-\d{2}-\d{2}",
    r"^(19|20)\d\d-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])$",
    r"[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,6}",
    r"[\w.+-]+@[\w-]+(\.[\w-]+)+",
    r"\+?1?[ .-]?\(?\d{3}\)?[ .-]?\d{3}[ .-]?\d{4}",
    r"[a-zA-Z_][a-zA-Z0-9_]*",
    r"-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?",
    r"[+-]?(\d+\.?\d*|\.\d+)",
    r"\d+(,\d{3})*(\.\d{2})?",
    r"(true|false|null)",
    r"(?:cat|dog|bird)s?",
    r"|a|ab",
    r"[\u0400-\u04FF]+",
    r"[\u4e00-\u9fff]{1,4}",
    r"é+ü?[àâ]",
    r"😀|\U0001F600{2}|[\U0001F300-\U0001F5FF]",
    r"((a|b)c)*d",
    r"(a(b(c(d)?)?)?)?",
    r"(?P<year>\d{4})-(?P<month>\d\d)",
    r"\w+\s\w+",
    r"\S+",
    r"\D\W",
    r"[\d\s]+",
    r"[^a-z0-9]+",
    r"[^\n]*",
    r".{2,5}",
    r"(?s:.)+x",
    r"(?i)hello world",
    r"(?i:abc)def",
    r"(?i)[a-c]+[^x-z]",
    r"a*?b+?c??d{1,2}?",
    r"a{,3}b{2,}c{2}",
    r"x{0}y",
    r"\x41\u00e9\t\0\012",
    r"[\x00-\x1f]*",
    r"[\-\]\\^]+",
    r"\.\*\+\?\(\)\[\]\{\}\|\/",
    r"(\d{1,3}\.){3}\d{1,3}",
    r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
    r"#[0-9A-Fa-f]{6}",
    r"(https?|ftp)://[^\s/$.?#][^\s]*",
    r"[A-Z]{2}\d{2}[A-Z0-9]{4}\d{7}([A-Z0-9]?){0,16}",
    r"(?#note)a{}b{x}",
    r"^$",
    r"^a|b$",
]

SEARCH_PATTERNS = [
    r"\d+",
    r"^abc",
    r"xyz$",
    r"^a|b$",
    r"^(?:foo|bar)$",
    r"a.c",
    r"",
    r"^$",
    r"[aeiou]{2}",
    r"^\d{3}-\d{4}$",
    r"\s",
    r"^[A-Z][a-z]*$|^\d+$|-",
]


def python_equivalent(pattern: str) -> str:
    """`pattern` rewritten so Python's `re` (with `re.ASCII`) means what pegmask reads.

    Replaces `\\s`/`\\S` by the ECMAScript white-space class and `$` by `\\Z`. (`\\S` inside a
    class is not rewritten; the patterns here do not use it.)
    """
    out: list[str] = []
    i = 0
    in_class = False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            escape = pattern[i : i + 2]
            if escape == "\\s":
                escape = ECMA_SPACE if in_class else f"[{ECMA_SPACE}]"
            elif escape == "\\S" and not in_class:
                escape = f"[^{ECMA_SPACE}]"
            out.append(escape)
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
        elif c == "$":
            c = r"\Z"
        out.append(c)
        i += 1
    return "".join(out)


@functools.cache
def oracle(pattern: str) -> re.Pattern[str]:
    return re.compile(python_equivalent(pattern), re.ASCII)


@functools.cache
def grammar(pattern: str) -> Grammar:
    return Grammar.from_regex(pattern)


@functools.cache
def search_grammar(pattern: str) -> Grammar:
    return Grammar(GrammarIR({"root": regex_to_node_search(pattern)}))


def alphabet(pattern: str) -> list[str]:
    return sorted(set(pattern) | set(EXTRA_CHARS))


@st.composite
def mutated(draw: st.DrawFn, text: str, pool: list[str]) -> str:
    """`text` after one to three random character insertions, deletions or replacements."""
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(text)))
        char = draw(st.sampled_from(pool))
        op = draw(st.sampled_from("idr"))
        if op == "i":
            text = text[:i] + char + text[i:]
        elif op == "d":
            text = text[:i] + text[i + 1 :]
        else:
            text = text[:i] + char + text[i + 1 :]
    return text


FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("pattern", PATTERNS)
@FAST
@given(data=st.data())
def test_fullmatch_agrees_with_re(pattern: str, data: st.DataObject) -> None:
    valid = data.draw(st.from_regex(oracle(pattern), fullmatch=True), label="valid")
    assert grammar(pattern).matches(valid)
    pool = alphabet(pattern)
    other = data.draw(
        st.one_of(mutated(valid, pool), st.text(st.sampled_from(pool), max_size=12)),
        label="other",
    )
    assert grammar(pattern).matches(other) == (oracle(pattern).fullmatch(other) is not None)


@pytest.mark.parametrize("pattern", SEARCH_PATTERNS)
@FAST
@given(data=st.data())
def test_search_agrees_with_re(pattern: str, data: st.DataObject) -> None:
    pool = alphabet(pattern)
    noise = st.text(st.sampled_from(pool), max_size=6)
    inner = data.draw(st.from_regex(oracle(pattern), fullmatch=True), label="inner")
    text = data.draw(noise, label="before") + inner + data.draw(noise, label="after")
    text = data.draw(st.one_of(st.just(text), mutated(text, pool)), label="text")
    assert search_grammar(pattern).matches(text) == (oracle(pattern).search(text) is not None)


def test_search_wraps_only_unanchored_sides() -> None:
    assert regex_to_node_search("^ab$") == Literal(b"ab")
    assert search_grammar("^ab").matches("ab\nzz")
    assert not search_grammar("^ab").matches("\nab")
    assert search_grammar("ab").matches("\n\nab\n")


@pytest.mark.parametrize(
    ("pattern", "yes", "no"),
    [
        (r"\s", ["\u00a0", "\ufeff", "\u2028", "\v"], ["\x85", "\u200b", "x"]),
        (r"\d", ["7"], ["٣", "a"]),
        (r"\w", ["_", "Z"], ["é", "-"]),
        (r".", ["é", "\r", "😀"], ["\n"]),
        (r"(?s).", ["\n"], []),
        (r"(?i)é", ["é", "É"], ["e"]),
        (r"(?i)k", ["k", "K"], ["\u212a"]),
        (r"(?i)σ", ["σ", "ς", "Σ"], ["s"]),
        (r"(?i)[^a]", ["b", "é"], ["a", "A"]),
        (r"(?i:a)(?-i:b)", ["Ab"], ["AB"]),
        (r"\uD83D\uDE00", ["😀"], []),
        (r"\u{1F600}", ["😀"], []),
        (r"(?<name>x)y", ["xy"], []),
        (r"[\s\S]", ["\n", "é"], []),
        (r"\A^ab$\Z", ["ab"], ["ab\n"]),
        (r"a{}", ["a{}"], ["a"]),
        (r"(?:){999999999999}a", ["a"], [""]),
    ],
)
def test_meanings(pattern: str, yes: list[str], no: list[str]) -> None:
    for text in yes:
        assert grammar(pattern).matches(text), text
    for text in no:
        assert not grammar(pattern).matches(text), text


@pytest.mark.parametrize(
    ("pattern", "message", "position"),
    [
        (r"(a)\1", "backreference '\\1'", 3),
        (r"(?P<n>a)(?P=n)", "backreference '(?P='", 8),
        (r"(?<n>a)\k<n>", "named backreference", 7),
        (r"(a)?(?(1)b|c)", "conditional group", 4),
        (r"(?>a+)b", "atomic group", 0),
        (r"a*+", "possessive quantifier '*+'", 1),
        (r"a{2}+", "possessive quantifier '{2}+'", 1),
        (r"\bword", "word boundary '\\b'", 0),
        (r"a\B", "word boundary '\\B'", 1),
        (r"[\A]", "not allowed in a character class", 1),
        (r"(a(?=b))", "lookahead '(?=' is only supported outside groups", 2),
        (r"a(?=b)", "pattern matches no string", 0),
        (r"a(?=b)(?<=a)b", "lookbehind after a lookahead is not supported", 6),
        (r"(?=a)*a", "a lookahead cannot be repeated", 5),
        (r"(?=^a)a", "anchor inside a lookahead", 0),
        (r"a(?=b)^b", "anchor '^' after a lookaround", 1),
        (r"(^a)*", "anchor inside a repetition '(^a)*'", 0),
        (r"^*a", "nothing to repeat after anchor '^'", 1),
        (r"a^b", "pattern matches no string (an anchor", 0),
        (r"a\Zb", "pattern matches no string (an anchor", 0),
        (r"\p{Script=Greek}", "Unicode property '\\p{Script=Greek}' is not supported", 0),
        (r"\p{Foo}", "Unicode property '\\p{Foo}' is not supported", 0),
        (r"\pL", "expected '{name}'", 0),
        (r"[[:alpha:]]", "POSIX character class", 1),
        (r"(?m)^a$", "unsupported inline flag 'm'", 0),
        (r"a(?i)b", "only supported at the start of the pattern", 1),
        (r"a(?-i)b", "use a scoped group '(?-i:...)'", 1),
        (r"(?'n'a)", "unknown group syntax", 0),
        (r"(?P<1>a)", "bad group name", 0),
        (r"[]a]", "ambiguous", 0),
        (r"[^]", "ambiguous", 0),
        (r"[^\s\S]", "matches no character", 0),
        (r"[z-a]", "bad character range 'z-a'", 1),
        (r"[a-\d]", "bad character range", 1),
        (r"*a", "nothing to repeat", 0),
        (r"a|{2}", "nothing to repeat", 2),
        (r"a**", "multiple repeat", 2),
        (r"a{3,2}", "minimum greater than maximum", 1),
        (r"(a", "unterminated group", 0),
        (r"a)", "unbalanced ')'", 1),
        (r"[ab", "unterminated character class", 0),
        (r"(?#abc", "unterminated comment", 0),
        ("ab\\", "lone backslash", 2),
        (r"\xZZ", "expected 2 hex digits", 0),
        (r"\u12", "expected 4 hex digits", 0),
        (r"\u{110000}", "beyond U+10FFFF", 0),
        (r"\q", "unsupported escape '\\q'", 0),
        (r"\ud800", "lone surrogate", 0),
    ],
)
def test_unsupported_constructs_are_named(pattern: str, message: str, position: int) -> None:
    with pytest.raises(GrammarError) as caught:
        Grammar.from_regex(pattern)
    assert isinstance(caught.value, RegexError)
    assert message in str(caught.value)
    assert caught.value.position == position
    assert f"at position {position}" in str(caught.value)


@pytest.mark.parametrize(
    ("pattern", "message"),
    [
        ("(a|){100000}", "repetition too large: '(a|){100000}'"),
        ("(a|){99999999999999999999999}", "repetition too large"),
        ("((a|b?){100}){101}", "repetition too large: '((a|b?){100}){101}'"),
        ("((ab|){10}){10}(c|){9801}", "regex too large"),
        ("(a|){6000}(b|){6000}", "regex too large"),
        ("((a|){6000}|(b|){6000})", "regex too large"),
        ("(a|){6000}|(b|){6000}", "regex too large"),
        ("x" * (MAX_EXPANDED_SIZE + 1), "regex too large"),
        ("x" * (MAX_PATTERN_LENGTH + 1), "pattern too long"),
        ("(" * (MAX_GROUP_DEPTH + 1) + ")" * (MAX_GROUP_DEPTH + 1), "nested too deeply"),
    ],
)
def test_size_bounds(pattern: str, message: str) -> None:
    with pytest.raises(GrammarError, match=re.escape(message)):
        regex_to_node(pattern)


def test_size_bound_is_inclusive_and_configurable() -> None:
    assert grammar("(a{100}){100}").matches("a" * MAX_EXPANDED_SIZE)
    regex_to_node(f"(a|){{{MAX_EXPANDED_SIZE}}}")
    regex_to_node("(a|b?){5}", max_size=10)
    with pytest.raises(GrammarError, match="repetition too large"):
        regex_to_node("(a|b?){6}", max_size=10)


@pytest.mark.parametrize("pattern", ["a{1000000000}", "(ab|c){1000000000}",
                                     "((a{1000}){1000}){1000}", "a{99999999999999999999999}",
                                     "x{10,1000000000}y+"])
def test_counts_of_items_that_cannot_be_empty_are_not_expanded(pattern: str) -> None:
    """They compile to O(log n) rules (pegmask.grammars.counted), so no count is too large."""
    assert len(grammar(pattern).program) < 3_000


@pytest.mark.parametrize("outer", ["{0,2}", "{1,3}", "{2}", "{2,}", "*", "+", "?"])
@pytest.mark.parametrize("inner", ["{0,2}", "{1,2}", "{2,3}", "{3}", "{2,}", "*", "+", "?"])
def test_nested_repeats_keep_their_counts(inner: str, outer: str) -> None:
    """Folding `(x{a,b}){n,m}` into one repeat must not fill gaps such as `(a{3}){1,2}`."""
    pattern = f"(?:a{inner}){outer}"
    for count in range(12):
        text = "a" * count
        assert grammar(pattern).matches(text) == (re.fullmatch(pattern, text) is not None)


def test_nested_optional_repeats_fold_into_one() -> None:
    """One flat repeat: the parser then tracks one thread, not one per possible copy."""
    assert regex_to_node("((a?){100}){100}") == Repeat(Literal(b"a"), 0, MAX_EXPANDED_SIZE)
    assert regex_to_node("(a+)*") == Repeat(Literal(b"a"), 0, None)
    assert grammar("((a?){100}){100}").matches("a" * 5000)


def test_long_patterns_are_excerpted_in_errors() -> None:
    pattern = "a" * 500 + "(?>x)" + "b" * 500
    with pytest.raises(RegexError) as caught:
        regex_to_node(pattern)
    assert caught.value.position == 500
    assert len(str(caught.value)) < 200


# Anchors inside groups and alternatives, and lookarounds (issue 61): `re` stays the oracle.
ANCHORED_PATTERNS = [
    r"(^[0-9]+\.[0-9]+$)",
    r"^$|(^a+b)",
    r"^([^,]|$)",
    r"(^|,)ab(,|$)",
    r"(a|^)b",
    r"x(^|y)",
    r"(^a)?b",
    r"a($)?b?",
    r"(?:^|-)z$",
    r"((^a|b)|c$)",
]
LOOKAROUND_PATTERNS = [
    r"^(?!foo)[a-z]+$",
    r"(?=.*[A-Z])(?=.*\d)[A-Za-z\d]{3,}",
    r"foo(?!bar)",
    r"(?<!a)b",
    r"(?<=a)b+$",
    r"^(?!.*--)[a-z-]+$",
    r"^(?=a)(?!ab)\w+",
    r"a(?<=[ab])c(?=d|$)",
    r"(?<=^a)b|c(?=$)",
    r"(?!)|x",
]
LOOKAROUND_SETTINGS = settings(max_examples=60, deadline=None,
                               suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("pattern", ANCHORED_PATTERNS + LOOKAROUND_PATTERNS)
@LOOKAROUND_SETTINGS
@given(data=st.data())
def test_anchors_anywhere_and_lookarounds_agree_with_re(pattern: str, data: st.DataObject) -> None:
    """Search and full-match languages on short texts over the pattern's own characters (so
    the lookarounds' conditions hold about as often as not)."""
    pool = sorted(set(pattern) - set("\\^$()?!=<[]{}|*+.") | set("aAb1-,\n"))
    text = data.draw(st.text(st.sampled_from(pool), max_size=10), label="text")
    assert search_grammar(pattern).matches(text) == (oracle(pattern).search(text) is not None)
    full = oracle(pattern).fullmatch(text) is not None
    try:
        assert grammar(pattern).matches(text) == full
    except RegexError as caught:  # a full match is impossible (e.g. `(?<!a)b` at the start)
        assert "matches no string" in str(caught) and not full


def test_anchors_that_cannot_hold_leave_their_branch_out() -> None:
    assert search_grammar(r"a^b|c").matches("xcx")
    assert not search_grammar(r"a^b|c").matches("a^b")
    assert regex_to_node_search(r"(^ab$)") == Literal(b"ab")
    assert regex_to_node_search(r"a^b|c$d") == Choice(())  # a search that never succeeds


@pytest.mark.parametrize(
    ("name", "prefixes"),
    [("L", ("L",)), ("Letter", ("L",)), ("Lu", ("Lu",)), ("gc=Nd", ("Nd",)),
     ("General_Category=Punctuation", ("P",)), ("LC", ("Lu", "Ll", "Lt")), ("Zs", ("Zs",)),
     ("Other_Symbol", ("So",))],
)
@FAST
@given(char=st.characters(exclude_categories=("Cs",)))
def test_unicode_property_classes_follow_unicodedata(name: str, prefixes: tuple[str, ...],
                                                     char: str) -> None:
    import unicodedata

    inside = unicodedata.category(char).startswith(prefixes)
    assert grammar(rf"\p{{{name}}}").matches(char) == inside
    assert grammar(rf"\P{{{name}}}").matches(char) == (not inside)
    assert grammar(rf"[^\p{{{name}}}x]").matches(char) == (not inside and char != "x")


def test_unicode_properties_any_ascii_assigned() -> None:
    assert grammar(r"\p{Any}+").matches("a\n😀")
    assert grammar(r"\p{ASCII}+").matches("a~\x00") and not grammar(r"\p{ASCII}").matches("é")
    assert grammar(r"\p{Assigned}").matches("é") and not grammar(r"\p{Assigned}").matches("\u0378")
