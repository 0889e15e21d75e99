"""The PEG DSL: syntax, captures, built-ins and precise errors."""

import re

import pytest

from pegmask.grammars import Grammar, GrammarError, GrammarTooLarge, ParseError

TOOLISH = r"""
# a small chat-like grammar
root = reasoning? @content:until(token("<tool_call>")) call*
reasoning = token("<think>") @reasoning:until("</think>") "</think>" "\n"*
call = trigger(token("<tool_call>")) "\n" @call:body "\n"
     token("</tool_call>") "\n"?
body = "{" @name:[a-z_]+ ":" @args:value "}"
value = [0-9]+ | "[" (value ("," value)*)? "]"
"""


def test_captures_and_recursion():
    g = Grammar.from_peg(TOOLISH)
    r = g.parse("<think>hmm</think>\n\nHi<tool_call>\n{get:[1,[2,3]]}\n</tool_call>")
    assert r.first("reasoning").text == "hmm"
    assert r.first("content").text == "Hi"
    call = r.first("call")
    assert call.text == "{get:[1,[2,3]]}"
    assert [c.tag for c in call.children] == ["name", "args"]
    assert call.first("name").text == "get"
    assert call.first("args").text == "[1,[2,3]]"


def test_special_tokens_are_not_text():
    g = Grammar.from_peg('root = token("<|end|>")')
    assert g.specials == ("<|end|>",)
    g.parse("<|end|>")  # text input: recognized by spelling
    with pytest.raises(ParseError):
        g.parse("<|end|")


def test_quantifiers_and_classes():
    g = Grammar.from_peg(r'root = [a-c]{2,3} "-" [^0-9]? "." . [\u00e9\-]+ x{2} x{1,}' + '\nx = "x"')
    assert g.matches("ab-..é-xxx")
    assert g.matches("abc-q.zé-é-xxx")
    assert not g.matches("a-..é-xxx")
    assert not g.matches("abcd-..é-xxx")
    assert not g.matches("ab-1..é-xxx")
    assert not g.matches("ab-..é-x")


def test_string_escapes_and_any_char():
    g = Grammar.from_peg(r"""root = "a\n\t\"" 'b\'' "\u00e9" . """)
    assert g.matches('a\n\t"b\'é😀')
    assert not g.matches('a\n\t"b\'é')


def test_until_excludes_stop_strings():
    g = Grammar.from_peg('root = @t:until("ab", "cd") "ab"')
    assert g.parse("xxcab").first("t").text == "xxc"
    assert g.parse("xxaab").first("t").text == "xxa"
    assert not g.matches("xxcdab")
    assert not g.matches("abab")


def test_json_builtin_with_named_schema_unknown_name():
    with pytest.raises(GrammarError, match="no schema named"):
        Grammar.from_peg("root = json(args)", schemas={})


def test_start_rule_defaults():
    assert Grammar.from_peg('a = "x"\nb = "y"').matches("x")
    assert Grammar.from_peg('a = "x"\nroot = "y"').matches("y")
    assert Grammar.from_peg('a = "x"\nb = "y"', start="b").matches("y")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('root = "a" !b', "lookahead"),
        ("root = x", "undefined rule 'x'"),
        ('a = a "x"\nroot = a', "left recursion: a -> a"),
        ('a = b? a "x"\nb = "y"\nroot = a', "left recursion"),
        ('a = b "x"\nb = c\nc = a | "z"\nroot = a', "left recursion"),
        ("root = [z-a]", "bad character range"),
        ("root = foo(", "unexpected end of rule"),
        ("root = token(x)", "token() takes one non-empty string"),
        ('x = "a"\nx = "b"', "defined twice"),
        ('root = "a"{3,1}', "max < min"),
        ('root = until("")', "non-empty"),
        ("", "no rules"),
        ('root = "\\q', "unexpected"),
    ],
)
def test_errors_are_precise(text, message):
    with pytest.raises(GrammarError, match=message.replace("(", r"\(").replace(")", r"\)")):
        assert Grammar.from_peg(text).program


def test_error_has_line_and_column():
    with pytest.raises(GrammarError) as info:
        Grammar.from_peg('a = "x"\nroot = a\n     | "y" %')
    assert info.value.line == 3
    assert info.value.column is not None


@pytest.mark.parametrize(("text", "message", "line", "column"), [
    ('root = "a" &b', "lookahead", 1, 12),
    ('a = "x"\n\n# note\nroot = a\n\n     | "y" )  # blank lines count', "unexpected ')'", 6, 12),
    ("root = foo(  # the rule ends after the (\n", "unexpected end of rule", 1, 12),
    ('root = "a"\n  [a-z]{5,2}', "max < min", 2, 9),
    ('root = "ok"\n  "\\ud800"', "lone surrogate", 2, 3),
    ('root = "ok" "\\U0x000041"', "bad \\U escape", 1, 13),
    ('root = "x"\n  | trigger()', "trigger() takes one expression", 2, 5),
    ("root = (((", "unexpected end of rule", 1, 11),
])
def test_errors_point_at_the_offending_token(text, message, line, column):
    with pytest.raises(GrammarError, match=re.escape(message)) as info:
        Grammar.from_peg(text)
    assert (info.value.line, info.value.column) == (line, column)


def test_parse_error_position():
    g = Grammar.from_peg('root = "abc" [0-9]+')
    with pytest.raises(ParseError) as info:
        g.parse("abx1")
    assert info.value.position == 2
    with pytest.raises(ParseError) as info:
        g.parse("abc")
    assert info.value.position == 3


def test_huge_repetition_is_compact_or_an_error_not_a_hang():
    assert len(Grammar.from_peg('root = ("ab" | "cd"){100000}').program) < 1_000
    with pytest.raises(GrammarTooLarge, match="max_instructions"):  # copies that may be empty
        assert Grammar.from_peg('root = ("ab" | ""){100000}').program


def test_ambiguity_prefers_first_alternative_for_captures():
    g = Grammar.from_peg('root = @a:"x"* @b:"x"*')
    r = g.parse("xxx")
    assert r.first("a").text == "xxx"
    assert r.first("b").text == ""
    g2 = Grammar.from_peg('root = @a:("x" | "xx") @b:("xx" | "x")')
    r2 = g2.parse("xxx")
    assert (r2.first("a").text, r2.first("b").text) == ("x", "xx")


def test_a_chain_of_rules_takes_no_call_frames():
    """`r0 = r1`, ..., each call a tail call: a chain far past max_depth (256) still matches
    (it matched nothing past 255 rules when every call took a frame)."""
    chain = "\n".join([f"r{i} = r{i + 1}" for i in range(10_000)] + ['r10000 = "a"'])
    g = Grammar.from_peg(chain)
    assert g.program.call_depth == 1
    assert g.matches("a") and not g.matches("b")


def test_right_recursion_is_as_long_as_the_input():
    g = Grammar.from_peg('root = "[" items "]"\nitems = @item:"x" ("," items)?')
    text = "[" + ",".join(["x"] * 2_000) + "]"
    assert len(g.parse(text).find_all("item")) == 2_000


def test_calls_nested_past_max_depth_without_recursion_are_refused():
    """A grammar that needs more frames than max_depth with no recursion to blame is an error
    naming the limit, not a language cut short in silence."""
    def nested(levels: int) -> Grammar:
        return Grammar.from_peg("\n".join([f'r{i} = "(" r{i + 1} ")"' for i in range(levels)]
                                          + [f'r{levels} = "a"']))

    assert nested(255).program.call_depth == 256
    assert nested(255).matches("(" * 255 + "a" + ")" * 255)
    with pytest.raises(GrammarTooLarge, match="max_depth=256") as info:
        nested(256).matches("(" * 256 + "a" + ")" * 256)
    assert (info.value.limit, info.value.allowed, info.value.value) == ("max_depth", 256, 257)


def test_recursion_counts_its_frames_once():
    g = Grammar.from_peg('root = a b\na = "x" c "y"\nb = c c\nc = "z" d\nd = "w"')
    assert g.program.call_depth == 3  # the entry, root -> a, a -> c; tail calls take none
    assert g.matches("xzwyzwzw")
    # One cycle (root -> a -> c -> d -> root): max_depth bounds its recursion, not call_depth.
    recursive = Grammar.from_peg(
        'root = a b\na = "x" c "y"\nb = c c\nc = "z" d\nd = "w" | "(" root ")"')
    assert recursive.program.call_depth == 1
    assert recursive.matches("xz(xzwyzwzw)yzwzw")


@pytest.mark.parametrize("opening, closing", [("(", ")"), ("@a:", ""), ("trigger(", ")")])
def test_expressions_nest_at_most_100_deep(opening, closing):
    def nested(levels: int) -> str:
        return "root = " + opening * levels + '"a"' + closing * levels

    assert Grammar.from_peg(nested(100)).ir.rules["root"] is not None
    for levels in (101, 100_000):
        with pytest.raises(GrammarError, match=r"nested too deeply \(limit 100\)") as info:
            Grammar.from_peg(nested(levels))
        assert info.value.line == 1
