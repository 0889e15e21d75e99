"""The token automaton on a real vocabulary (SmolLM2, 49,152 tokens): it accepts exactly the
streaming parser's language, token by token."""

from __future__ import annotations

import functools
import json
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from vocabularies import smollm2, smollm2_tokenizer

from pegmask.grammars import Grammar
from pegmask.grammars.compiler import CompiledGrammar, GrammarCompiler, compile_grammar
from pegmask.grammars.configurations import _bits, _byte_groups
from pegmask.grammars.matcher import fill_next_token_bitmasks
from pegmask.grammars.plain_text import _PLAIN_ALWAYS
from pegmask.grammars.token_trie import token_trie
from pegmask.kernels import allocate_token_bitmask

CHAT = r"""
root = @content:until(token("<|im_start|>"), "<tool_call>") call*
call = "<tool_call>" "\n" @call:obj "\n</tool_call>" "\n"?
obj = "{" ws (pair (ws "," ws pair)*)? ws "}"
pair = str ws ":" ws value
value = obj | "[" ws (value (ws "," ws value)*)? ws "]" | str | num | "true" | "false" | "null"
str = "\"" ([^"\\\x00-\x1f] | "\\" ["\\/bfnrt] | "\\u" [0-9a-fA-F]{4})* "\""
num = "-"? ("0" | [1-9] [0-9]*) ("." [0-9]+)? ([eE] [+\-]? [0-9]+)?
ws = [ \n]{0,2}
"""
TOOL = r"""
root = "{" ws "\"name\"" ws ":" ws "\"" @name:("get_weather" | "get_time") "\"" ws ","
       ws "\"arguments\"" ws ":" ws @args:args ws "}"
args = "{" ws "\"city\"" ws ":" ws str ws ("," ws "\"unit\"" ws ":" ws ("\"c\"" | "\"f\""))? ws "}"
str = "\"" ([^"\\\x00-\x1f] | "\\" ["\\/bfnrt])* "\""
ws = [ ]?
"""
GRAMMARS = {"chat": CHAT, "tool": TOOL}


def allowed_ids(matcher, bitmask) -> np.ndarray:
    matcher.fill_next_token_bitmask(bitmask, 0)
    bits = np.unpackbits(bitmask[0].numpy().view(np.uint8), bitorder="little")
    return np.flatnonzero(bits[: matcher.compiled.vocab.size])


def token_text(vocab, ids) -> bytes:
    return b"".join(
        vocab.token_bytes[t] if vocab.token_bytes[t] is not None else vocab.special_names[t].encode()
        for t in ids
    )


@pytest.fixture(scope="module")
def compiler():
    return GrammarCompiler(smollm2())


@pytest.mark.parametrize("name", sorted(GRAMMARS))
def test_random_sampling_under_the_mask_always_parses(name, compiler):
    """Property 1: whatever the mask lets through, the parser accepts."""
    vocab = smollm2()
    grammar = Grammar.from_peg(GRAMMARS[name])
    compiled = compiler.compile(grammar)
    bitmask = allocate_token_bitmask(1, vocab.size)
    closing = {t for t, data in enumerate(vocab.token_bytes) if data and data[-1:] in (b'"', b"}", b"]")}
    rng = random.Random(7)
    finished = 0
    for _ in range(40):
        matcher = compiled.matcher()
        out: list[int] = []
        for _ in range(80):
            allowed = allowed_ids(matcher, bitmask)
            assert len(allowed), "a live state must allow some token"
            # Lean towards tokens that close things so that samples finish within the budget.
            enders = [t for t in allowed if t in closing or t in vocab.eos_ids]
            pool = enders if enders and rng.random() < 0.5 else allowed
            token = int(rng.choice(pool))
            assert matcher.accept_token(token)
            if token not in vocab.eos_ids:
                out.append(token)
            if matcher.is_terminated():
                break
        parser = grammar.stream_parser()
        parser.feed_tokens(out, vocab)  # raises if the mask let through an invalid prefix
        if matcher.is_terminated():
            finished += 1
            parser.finish()
    assert finished >= 5


def valid_outputs(name: str) -> list[str]:
    rng = random.Random(3)
    out = []
    for i in range(12):
        city = rng.choice(["Paris", "San Francisco", "東京", "Zürich \"old\" town", "a\\b", ""])
        args = {"city": city} if i % 2 else {"city": city, "unit": rng.choice("cf")}
        call = {"name": rng.choice(["get_weather", "get_time"]), "arguments": args}
        if name == "tool":
            out.append(json.dumps(call, ensure_ascii=False))
        else:
            text = rng.choice(["", "Sure! ", "Let me check the weather.\n"])
            out.append(text + "<tool_call>\n" + json.dumps(call, ensure_ascii=False) + "\n</tool_call>")
    return out


@pytest.mark.parametrize("name", sorted(GRAMMARS))
def test_canonical_tokenization_of_valid_outputs_is_allowed(name, compiler):
    """Property 2: every string the parser accepts is allowed token by token, under the real
    tokenizer's own tokenization, and ends where the grammar may end."""
    vocab = smollm2()
    tokenizer = smollm2_tokenizer()
    grammar = Grammar.from_peg(GRAMMARS[name])
    compiled = compiler.compile(grammar)
    bitmask = allocate_token_bitmask(1, vocab.size)
    for text in valid_outputs(name):
        grammar.parse(text)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert token_text(vocab, ids) == text.encode()
        matcher = compiled.matcher()
        for token in ids:
            assert token in allowed_ids(matcher, bitmask)
            assert matcher.accept_token(token)
        assert matcher.is_accepting()
        assert vocab.eos_ids[0] in allowed_ids(matcher, bitmask)
        assert matcher.accept_token(vocab.eos_ids[0])
        assert matcher.is_terminated()


@functools.cache
def tool_compiled():
    return compile_grammar(Grammar.from_peg(TOOL), smollm2())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_mask_agrees_with_parser_on_every_token(data):
    """After a random valid prefix, a token is allowed exactly when the parser accepts the
    prefix extended by its bytes as a valid prefix."""
    vocab = smollm2()
    compiled = tool_compiled()
    grammar = compiled.grammar
    text = data.draw(st.sampled_from(valid_outputs("tool"))).encode()
    cut = data.draw(st.integers(0, len(text)))
    matcher = compiled.matcher()
    assert matcher.accept_string(text[:cut])
    bitmask = allocate_token_bitmask(1, vocab.size)
    allowed = set(allowed_ids(matcher, bitmask).tolist())
    candidates = data.draw(st.lists(st.integers(0, vocab.size - 1), min_size=20, max_size=20))
    candidates += sorted(allowed)[:20]
    for token in candidates:
        data_bytes = vocab.token_bytes[token]
        if data_bytes is None:
            continue
        parser = grammar.stream_parser()
        try:
            parser.feed_bytes(text[:cut] + data_bytes)
            ok = parser.can_continue or parser.status == "complete"
        except ValueError:
            ok = False
        assert (token in allowed) == ok, (text[:cut], data_bytes)


def test_rollback_reset_and_jump_forward():
    vocab = smollm2()
    compiled = compile_grammar(Grammar.from_peg(TOOL), vocab)
    matcher = compiled.matcher()
    assert matcher.find_jump_forward_string() == b'{'
    assert matcher.accept_string(b'{ "name"')
    assert matcher.find_jump_forward_string() == b''  # a space or a colon may follow
    assert matcher.accept_string(b':"get_')
    forced = matcher.find_jump_forward_string()
    assert forced == b''  # weather or time
    tokenizer = smollm2_tokenizer()
    ids = tokenizer('weather", "arguments"', add_special_tokens=False)["input_ids"]
    assert matcher.accept_tokens(ids)
    state = matcher.state
    assert not matcher.accept_token(tokenizer("}", add_special_tokens=False)["input_ids"][0])
    assert matcher.state == state  # a rejected token changes nothing
    matcher.rollback(len(ids))
    assert matcher.accept_string(b'time"')
    matcher.reset()
    assert matcher.find_jump_forward_string() == b'{'


def test_stop_token_only_where_the_grammar_may_end():
    vocab = smollm2()
    compiled = compile_grammar(Grammar.from_peg('root = "ab" "c"?'), vocab)
    matcher = compiled.matcher()
    eos = vocab.eos_ids[0]
    assert not matcher.accept_token(eos)
    assert matcher.accept_string(b"ab")
    assert matcher.accept_token(eos)
    assert matcher.is_terminated()
    assert not matcher.accept_token(eos)


def test_a_stop_token_ends_the_matcher_until_rolled_back():
    vocab = smollm2()
    compiled = compile_grammar(Grammar.from_peg('root = "ab" "c"?'), vocab)
    matcher = compiled.matcher()
    bitmask = allocate_token_bitmask(1, vocab.size)
    eos = vocab.eos_ids[0]
    assert matcher.accept_string(b"ab")
    before = allowed_ids(matcher, bitmask)
    assert eos in before and matcher.accept_token(eos)
    assert len(allowed_ids(matcher, bitmask)) == 0  # nothing may follow the stop token
    assert not matcher.accept_string(b"c")
    matcher.rollback(1)
    assert np.array_equal(allowed_ids(matcher, bitmask), before)
    assert matcher.accept_string(b"c") and matcher.is_accepting()


def test_a_stop_token_the_grammar_reads_is_also_a_stop_where_the_grammar_may_end():
    """The stop token (SmolLM2's `<|im_end|>`) used as a grammar symbol: read where the grammar
    reads it, and still a stop wherever the grammar may end without reading it."""
    vocab = smollm2()
    eos = vocab.eos_ids[0]
    compiled = compile_grammar(
        Grammar.from_peg(f'root = "a" [ ]* | "b" token("{vocab.special_names[eos]}")'), vocab)
    bitmask = allocate_token_bitmask(1, vocab.size)
    matcher = compiled.matcher()
    assert eos not in allowed_ids(matcher, bitmask) and not matcher.accept_token(eos)
    assert matcher.accept_string(b"a ")
    assert eos in allowed_ids(matcher, bitmask)
    assert matcher.accept_token(eos) and matcher.stopped and matcher.is_terminated()
    matcher.reset()
    assert matcher.accept_string(b"b") and eos in allowed_ids(matcher, bitmask)
    assert matcher.accept_token(eos) and not matcher.stopped  # read: part of the output
    assert matcher.is_terminated() and matcher.is_accepting()


def test_tokens_read_again_lead_where_they_led_the_first_time():
    """Accepted tokens are remembered per configuration; a replay (another matcher, or
    after a rollback) takes the same steps, and a refused token stays refused."""
    vocab = smollm2()
    compiled = compile_grammar(Grammar.from_peg(TOOL), vocab)
    ids = smollm2_tokenizer()(valid_outputs("tool")[0], add_special_tokens=False)["input_ids"]
    bitmask = allocate_token_bitmask(1, vocab.size)
    first, second = compiled.matcher(), compiled.matcher()
    states = []
    for token in ids:
        state = first.state
        forbidden = int(np.setdiff1d(np.arange(vocab.size), allowed_ids(first, bitmask))[0])
        assert not first.accept_token(forbidden) and not first.accept_token(forbidden)
        assert first.state == state
        assert first.accept_token(token)
        assert first.state == compiled.state_after_token(state, token)
        states.append(first.state)
    for token, state in zip(ids, states, strict=True):
        assert token in allowed_ids(second, bitmask)
        assert second.accept_token(token) and second.state == state
    first.rollback(len(ids))
    assert first.accept_tokens(ids) and first.state == states[-1]


def test_lazy_region_reports_no_mask_needed():
    vocab = smollm2()
    compiled = compile_grammar(Grammar.from_peg(CHAT), vocab)
    matcher = compiled.matcher()
    bitmask = allocate_token_bitmask(1, vocab.size)
    assert matcher.fill_next_token_bitmask(bitmask) is False  # free text: every text token
    assert matcher.accept_string(b"Hello <tool_call>\n")
    assert matcher.fill_next_token_bitmask(bitmask) is True  # inside the call: constrained
    assert matcher.accept_string(b'{"a": [1, 2.5e3, true]}\n</tool_call>\n')
    assert matcher.is_accepting()


def test_batch_filling_writes_one_row_per_matcher():
    vocab = smollm2()
    compiled = compile_grammar(Grammar.from_peg(TOOL), vocab)
    first, second = compiled.matcher(), compiled.matcher()
    second.accept_string(b'{"name":')
    bitmask = allocate_token_bitmask(2, vocab.size)
    assert fill_next_token_bitmasks([first, second], bitmask) == [True, True]
    single = allocate_token_bitmask(1, vocab.size)
    first.fill_next_token_bitmask(single)
    assert np.array_equal(bitmask[0].numpy(), single[0].numpy())
    second.fill_next_token_bitmask(single)
    assert np.array_equal(bitmask[1].numpy(), single[0].numpy())
    assert not np.array_equal(bitmask[0].numpy(), bitmask[1].numpy())
    first.fill_next_token_bitmask(bitmask, 1)  # the same matcher, another row of the bitmask
    assert np.array_equal(bitmask[1].numpy(), bitmask[0].numpy())
    second.fill_next_token_bitmask(bitmask, -1)  # rows count from the end too, as in numpy
    assert not np.array_equal(bitmask[1].numpy(), bitmask[0].numpy())
    first.fill_next_token_bitmask(bitmask, 1)
    second.fill_next_token_bitmask(bitmask, 0)
    assert np.array_equal(bitmask[0].numpy(), single[0].numpy())


def test_logits_wider_than_the_vocabulary():
    """Ids past the tokenizer's end (padding of the logits) are never allowed."""
    vocab = smollm2()
    compiled = compile_grammar(Grammar.from_peg(CHAT), vocab)
    matcher = compiled.matcher()
    bitmask = allocate_token_bitmask(1, vocab.size + 100)
    matcher.fill_next_token_bitmask(bitmask)
    bits = np.unpackbits(bitmask[0].numpy().view(np.uint8), bitorder="little")
    assert not bits[vocab.size :].any()


# ------------------------------------------------ masks by shortcut equal masks by definition


def mask_by_definition(compiled, state) -> np.ndarray:
    """The allowed-token vector by its definition: a token is allowed when the automaton can
    read all its bytes (or its special symbol); a stop token where the grammar may end."""
    vocab = compiled.vocab
    allowed = np.array([compiled.state_after_token(state, t) != 0 for t in range(vocab.size)])
    allowed[list(compiled.stop_ids)] = compiled.is_accepting(state)
    return allowed


def assert_mask_is_exact(compiled, state) -> None:
    packed, _ = compiled.mask(state)
    bits = np.unpackbits(packed.view(np.uint8), bitorder="little")[: compiled.vocab.size]
    expected = mask_by_definition(compiled, state)
    wrong = np.flatnonzero(bits.astype(bool) != expected)
    assert not len(wrong), [(compiled.vocab.token_bytes[t], bool(bits[t])) for t in wrong[:5]]


def state_after(compiled, text: str) -> int:
    """The configuration after the bytes of `text`, one byte at a time."""
    state = compiled.initial_state
    for byte in text.encode():
        state = compiled.next_state(state, byte)
    return state


def assert_masks_exact_along(compiled, text: str) -> None:
    """`assert_mask_is_exact` in every configuration that `text` passes, each mask computed
    afresh."""
    state, data = compiled.initial_state, text.encode()
    for end in range(len(data) + 1):
        if end:
            state = compiled.next_state(state, data[end - 1])
        assert state != 0, data[:end]
        compiled._masks.clear()
        assert_mask_is_exact(compiled, state)


WEATHER_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "fields": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["city", "days", "fields"],
}
WEATHER = {"city": "Zürich, 東京 & São Paulo", "days": 10, "fields": ["wind", "hum\u00efdity"]}


@functools.cache
def weather_compiled():
    return compile_grammar(Grammar.from_json_schema(WEATHER_SCHEMA), smollm2())


def weather_texts() -> list[bytes]:
    texts = [json.dumps(WEATHER, ensure_ascii=False, indent=indent) for indent in (None, 2, 4)]
    # Whitespace runs at, just under and past the bound (32) between JSON tokens.
    texts += ['{' + " " * n + '"city":"a",\n' + "\t" * (n - 1) + '"days": 3,"fields":[]}'
              for n in (31, 32, 33)]
    return [text.encode() for text in texts]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_json_masks_are_exact_inside_whitespace_and_strings(data):
    """Inside whitespace between JSON tokens (read a whole run at a time) and inside strings
    (plain-text tokens, including those ending inside a character, allowed without a walk),
    the mask is exactly the set of tokens the automaton can read."""
    compiled = weather_compiled()
    text = data.draw(st.sampled_from(weather_texts()))
    cut = data.draw(st.integers(0, len(text)))
    state = compiled.initial_state
    for byte in text[:cut]:
        state = compiled.next_state(state, byte)
    if state == 0:  # past the whitespace bound: the automaton rejected the prefix
        assert b" " * 33 in text[:cut] or b"\t" * 32 in text[:cut]
        return
    assert_mask_is_exact(compiled, state)


@pytest.mark.parametrize("run", [b" ", b"\t", b"\n "])
def test_json_masks_are_exact_at_the_whitespace_bound(run):
    """Masks after 0, 1, 2, 30, 31 and 32 whitespace characters between JSON tokens (the
    bound is 32): tokens with a leading run are allowed exactly while the run fits."""
    compiled = weather_compiled()
    for count in (0, 1, 2, 30, 31, 32):
        state = compiled.initial_state
        for byte in b"{" + (run * 32)[:count]:
            state = compiled.next_state(state, byte)
        assert state != 0
        assert_mask_is_exact(compiled, state)


def test_whitespace_runs_are_read_whole_for_the_mask():
    """The run shortcut applies inside JSON whitespace (else the test above would not test
    it), and not where what follows the run may itself read the run's bytes."""
    compiled = weather_compiled()
    state = compiled.initial_state
    for byte in b'{  ':
        state = compiled.next_state(state, byte)
    assert compiled._run_split(state) is not None
    loose = compile_grammar(Grammar.from_peg('root = [ ]{0,3} " "* "x"'), smollm2())
    state = loose.next_state(loose.initial_state, ord(" "))
    assert loose._run_split(state) is None
    assert_mask_is_exact(loose, state)


@pytest.mark.parametrize("text", ['{"n":  ', '{"n": 1, "a": true ', '{"a": true  '])
def test_whitespace_runs_beside_a_sign_or_from_several_calls_are_read_whole(text):
    """Whitespace before a number (whose optional sign is a bounded run too), and whitespace
    after a member that several continuations call (one thread per call site), is read
    whole as well: before, each of its lengths was a configuration of its own. The masks
    along the text stay exact."""
    compiled = compile_grammar(Grammar.from_json_schema({
        "type": "object",
        "properties": {"n": {"type": "integer"}, "a": {"type": "boolean"},
                       "b": {"type": "boolean"}},
    }), smollm2())
    state = compiled.initial_state
    for byte in text.encode():
        state = compiled.next_state(state, byte)
    assert compiled._run_split(state) is not None
    assert_masks_exact_along(compiled, text)


def test_keys_beside_the_names_are_decided_by_the_extra_member_once():
    """At a key of an object that allows other keys, the threads of its extra member (any key
    but the names) survive all plain text on their own: that frame decides that every plain
    token may follow, and its search is made once for all the object's keys, where each key
    had searched every prefix of every name and given up. The masks stay exact."""
    names = ["browser", "platform", "mobile", "location", "device"]
    compiled = compile_grammar(Grammar.from_json_schema({
        "type": "object", "properties": {name: {"type": "string"} for name in names},
    }), smollm2())
    text = '{"browser": "x", "mobile": "y", "loc'
    data, state, made = text.encode(), compiled.initial_state, []
    for end in range(1, len(data) + 1):
        state = compiled.next_state(state, data[end - 1])
        if data[:end].endswith((b'{"', b', "')):
            before = compiled.state_count
            assert compiled._plain_depth(state) == _PLAIN_ALWAYS
            made.append(compiled.state_count - before)
    # The first key searches every prefix of the extra member's names; the others only
    # step once per first letter of a name (to see that plain text loops on).
    assert len(made) == 3
    assert made[0] > sum(map(len, names)) and max(made[1:]) <= 2 * len(names), made
    assert_masks_exact_along(compiled, text)


@pytest.mark.parametrize("peg", [
    'root = [ \\n]{0,4} "x"',
    'root = "a" [ ]{2,5} "b" [ ]{0,2}',
    'root = ([ ]{0,2} "a")+',
    'root = [ab]{0,40} "."',
    'root = ("<" [ ]{0,3} ">" | [ ]{0,6} "b")*',
])
def test_masks_are_exact_in_grammars_with_bounded_runs(peg):
    """Random walks under the mask through grammars with bounded runs of one byte class."""
    vocab = smollm2()
    compiled = compile_grammar(Grammar.from_peg(peg), vocab)
    rng = random.Random(peg)
    for _ in range(3):
        state = compiled.initial_state
        for _ in range(6):
            assert_mask_is_exact(compiled, state)
            packed, _ = compiled.mask(state)
            bits = np.unpackbits(packed.view(np.uint8), bitorder="little")[: vocab.size]
            ordinary = [t for t in np.flatnonzero(bits).tolist() if vocab.token_bytes[t]]
            if not ordinary:
                break
            state = compiled.state_after_token(state, rng.choice(ordinary))


CUT_CASES = {
    "object keys beside any key": (
        Grammar.from_json_schema({
            "type": "object",
            "properties": {"name": {"type": "string"}, "size": {"type": "integer"}},
            "additionalProperties": {"type": "array", "items": {"type": "string"}},
        }),
        '{"name": "Zoë", "size": 3, "sizes": ["a b", "東京"], "naming": []}',
    ),
    "object keys that start with a letter": (
        Grammar.from_json_schema({
            "type": "object",
            "properties": {"Name": {"type": "string"}},
            "patternProperties": {"^[a-z]": {"type": "array", "items": {"type": "string"}}},
            "additionalProperties": False,
        }),
        '{"Name": "Zoë", "sizes": ["a b", "東京"], "naming": []}',
    ),
    "a letter, then text": (Grammar.from_peg(r'root = [a-z] [^"\\\x00-\x1f]* "\"" "!"'),
                            'hello wörld"!'),
    "keywords or text": (
        Grammar.from_peg(r'root = ("select" | "sum" | [a-z]+ [^"\\\x00-\x1f]*) "\"" [0-9]'),
        'sumo wrestler"3',
    ),
    "text before a spelled special": (  # not in SmolLM2's vocabulary: read from its bytes
        Grammar.from_peg(r'root = ("select" | [a-z] [^"\\\x00-\x1f]*) token("<|fake_special|>") [a-z]+'),
        'hello <|fak wörld<|fake_special|>x',
    ),
}


@pytest.mark.parametrize("name", sorted(CUT_CASES))
def test_masks_are_exact_where_a_walk_meets_a_plain_text_loop(name, monkeypatch):
    """A walk of the trie that reaches, below the root, a configuration that no plain text
    kills allows that node's plain tokens at once and walks only the others: the mask is
    still exactly the set of tokens the automaton can read, at every byte of a valid text."""
    grammar, text = CUT_CASES[name]
    compiled = compile_grammar(grammar, smollm2())
    cut_nodes = []
    allow_below_cuts = CompiledGrammar._allow_below_cuts

    def spy(self, allowed, trie, cuts):
        cut_nodes.extend(node for nodes, _ in cuts for node in nodes.tolist())
        return allow_below_cuts(self, allowed, trie, cuts)

    monkeypatch.setattr(CompiledGrammar, "_allow_below_cuts", spy)
    assert_masks_exact_along(compiled, text)
    assert cut_nodes  # the shortcut was taken
    assert compiled.trie.boundary[cut_nodes].all()


LOOP_CASES = {
    "strings with escapes": (Grammar.from_json_schema({"type": "array", "items": {"type": "string"}}),
                             '["a\\"b\\\\n\\u00e9 東京 x", "\\t"]'),
    "text before a spelled special": CUT_CASES["text before a spelled special"],
}


@pytest.mark.parametrize("name", sorted(LOOP_CASES))
def test_masks_are_exact_where_plain_text_loops_back(name, monkeypatch):
    """Where every plain character leads a configuration back to itself (inside a string), its
    mask walks only what the other tokens hold after their plain prefix: still exactly the
    set of tokens the automaton can read, at every byte of a valid text."""
    grammar, text = LOOP_CASES[name]
    compiled = compile_grammar(grammar, smollm2())
    looping = []
    loops_on_plain_text = CompiledGrammar._loops_on_plain_text

    def spy(self, config):
        loops = loops_on_plain_text(self, config)
        looping.extend([config] if loops else [])
        return loops

    monkeypatch.setattr(CompiledGrammar, "_loops_on_plain_text", spy)
    assert_masks_exact_along(compiled, text)
    assert looping  # the shortcut was taken


# Plain text never dies in these configurations, though it does not always lead back to the
# same one: they get the shortcut after a search of the configurations it reaches.
SAFE_CASES = {
    "a file name pattern": ({"type": "string", "pattern": "^.+\\.(csv|tsv)$"}, '"data.v1.tsv.csv"'),
    "keys counting hex digits": (
        {"type": "object", "patternProperties": {"[0-9a-f]{6}": {"type": "integer"}},
         "additionalProperties": {"type": "boolean"}},
        '{"id-ab12cd": 1, "face": true, "x東京": false}',
    ),
    "keys beside a pattern's keys": (  # a short search: text leads on to the any-key loop
        {"type": "object", "patternProperties": {"^[_a-zA-Z][a-zA-Z0-9_-]*$": {"type": "integer"}},
         "additionalProperties": True},
        '{"id_1": 2, "a b": "x", "é": [1]}',
    ),
}
# Plain text dies in these: on one letter, at a length bound the search reaches, or at one
# past its limit.
UNSAFE_CASES = {
    "a string without the letter a": ({"type": "string", "pattern": "^[^a]*$"}, '"hello, wörld"'),
    "a short string": ({"type": "string", "maxLength": 12}, '"hello, wörld"'),
    "a long string": ({"type": "string", "maxLength": 90}, '"hello, wörld"'),
}


@pytest.mark.parametrize("name", sorted(SAFE_CASES) + sorted(UNSAFE_CASES))
def test_plain_text_shortcut_is_exact_where_text_changes_the_configuration(name):
    """A configuration gets the plain-text shortcut when no plain text leads it to DEAD, also
    where plain characters move it between configurations (a pattern's states, a key's count
    of hex digits); one where text dies walks. The masks are exact at every byte either way."""
    schema, text = SAFE_CASES.get(name) or UNSAFE_CASES[name]
    compiled = compile_grammar(Grammar.from_json_schema(schema), smollm2())
    state, safe_moving = compiled.initial_state, []
    data = text.encode()
    for end in range(len(data) + 1):
        if end:
            state = compiled.next_state(state, data[end - 1])
        compiled._masks.clear()
        assert_mask_is_exact(compiled, state)
        if compiled._plain_text_stays_alive(state) and compiled.next_state(state, ord("e")) != state:
            safe_moving.append(data[:end])
    if name in SAFE_CASES:
        assert safe_moving
    else:
        inside = [compiled.next_state(compiled.initial_state, ord('"'))]
        for byte in b"hello":
            inside.append(compiled.next_state(inside[-1], byte))
        assert not safe_moving and not any(compiled._plain_text_stays_alive(c) for c in inside)


def node_bytes(trie) -> dict[int, bytes]:
    """Each node's bytes, spelled out from the root."""
    spelled = {0: b""}
    starts, ends, bytes_of = trie.lists
    for node in range(trie.node_count):
        for child in range(starts[node], ends[node]):
            spelled[child] = spelled[node] + bytes((bytes_of[child],))
    return spelled


def test_walks_allow_whole_subtrees_within_a_string_bound(monkeypatch):
    """Inside a string of bounded length plain text dies only at the bound: a walk allows every
    plain token below a node whose longest token fits in the characters left there
    (`_plain_depth` against `TokenTrie.height`), and the masks stay exact at every byte, up
    to the bound."""
    compiled = compile_grammar(Grammar.from_json_schema({"type": "string", "maxLength": 40}),
                               smollm2())
    cut = []
    allow_below_cuts = CompiledGrammar._allow_below_cuts

    def spy(self, allowed, trie, cuts):
        cut.extend((node, state) for nodes, states in cuts
                   for node, state in zip(nodes.tolist(), states.tolist(), strict=True))
        return allow_below_cuts(self, allowed, trie, cuts)

    monkeypatch.setattr(CompiledGrammar, "_allow_below_cuts", spy)
    assert_masks_exact_along(compiled, '"' + "hello wörld, " * 3 + 'a"')
    depths = [int(compiled._plain_depths[state]) for _, state in cut]
    assert cut and all(0 < depth <= 40 for depth in depths)
    assert all(compiled.trie.height[node] <= depth for (node, _), depth in zip(cut, depths, strict=True))


def test_trie_ranges_and_twin_nodes_match_token_bytes():
    """The token trie's per-node ranges of tokens in byte order, its character-boundary flags
    and its map to the trie of non-plain tokens agree with the tokens' bytes."""
    vocab = smollm2()
    trie = token_trie(vocab)
    spelled = node_bytes(trie)
    rest_node = {data: node for node, data in node_bytes(trie.rest).items()}
    rng = random.Random(0)
    plain = set(trie.plain_tokens.tolist())
    for node in [0, *rng.sample(range(1, trie.node_count), 400)]:
        prefix = spelled[node]
        below = trie.entry_token[trie.first_entry[node] : trie.end_entry[node]].tolist()
        assert sorted(below) == [t for t, data in enumerate(vocab.token_bytes)
                                 if data and data.startswith(prefix) and trie.token_node[t] >= 0]
        entries = trie.plain_entry[trie.first_entry[node] : trie.end_entry[node]].tolist()
        assert entries == [t in plain for t in below]
        assert trie.rest_node[node] == rest_node.get(prefix, -1)
        assert trie.height[node] == max(len(vocab.token_bytes[t]) for t in below) - len(prefix)
        try:
            prefix.decode("utf-8")
            complete = True
        except UnicodeDecodeError:
            complete = False
        assert bool(trie.boundary[node]) == complete


def test_tokens_after_their_plain_prefix_are_spelled_by_their_node():
    """`TokenTrie.after_plain` holds each non-plain token's bytes after its longest prefix of
    whole plain characters (never empty), with bytes that may start a spelled special not
    plain."""
    vocab = smollm2()
    for not_plain in (frozenset(), frozenset(b"<")):
        trie = token_trie(vocab, not_plain)
        spelled = node_bytes(trie.after_plain)
        plain = set(trie.plain_tokens.tolist())
        rest = [t for t, data in enumerate(vocab.token_bytes) if data and t not in plain]
        assert rest and trie.after_plain.token_count == len(rest)
        for token_id in rest:
            data = vocab.token_bytes[token_id]
            prefix = max(k for k in range(len(data) + 1) if is_whole_plain_text(data[:k], not_plain))
            assert data[prefix:] and spelled[trie.after_plain.token_node[token_id]] == data[prefix:]


def is_whole_plain_text(data: bytes, not_plain: frozenset[int]) -> bool:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return all(ch >= " " and ch not in '"\\' for ch in text) and not any(b in not_plain for b in data)


def test_fill_writes_the_same_row_into_every_kind_of_bitmask():
    """The byte-copy fast path (C-contiguous int32) and the numpy path write the same bits."""
    vocab = smollm2()
    matcher = compile_grammar(Grammar.from_peg(TOOL), vocab).matcher()
    matcher.accept_string(b'{"name": "get_')
    rows = []
    for bitmask in (allocate_token_bitmask(3, vocab.size),
                    allocate_token_bitmask(3, vocab.size).numpy(),
                    allocate_token_bitmask(6, vocab.size)[::2]):  # strided rows
        matcher.fill_next_token_bitmask(bitmask, 2)
        view = bitmask.numpy() if hasattr(bitmask, "numpy") else bitmask
        rows.append(view[2].copy())
        assert (view[:2] == -1).all()  # other rows untouched (allocated all-allowed)
    assert all(np.array_equal(rows[0], row) for row in rows[1:])
    with pytest.raises(IndexError):
        matcher.fill_next_token_bitmask(allocate_token_bitmask(1, vocab.size), 1)


def test_plain_text_tokens_may_end_inside_a_character():
    """Byte-level vocabularies split characters between tokens: a plain-text token cut inside
    its last character still counts as plain text, but no other invalid UTF-8 does."""
    from pegmask.grammars.token_trie import is_plain_text

    assert is_plain_text("São".encode()) and is_plain_text("Sã".encode()[:-1])
    assert is_plain_text("東".encode()[:2]) and is_plain_text(b"ab\xf0")
    assert not is_plain_text(b"\x80ab")  # starts inside a character
    assert not is_plain_text(b"ab\xe0\x80")  # an overlong encoding, never completed
    assert not is_plain_text(b"ab\xed\xa0")  # a surrogate, never completed
    assert not is_plain_text(b'a"') and not is_plain_text(b"a\n")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.integers(0, (1 << 256) - 1),
                          st.sets(st.integers(0, 255), max_size=6).map(_bits)), max_size=12))
def test_byte_groups_partition_bytes_by_the_sets_that_hold_them(accepted):
    """Each byte some set holds is in exactly one group, whose members are exactly the sets
    that hold it; groups come in the order of their first byte."""
    groups = _byte_groups(tuple(accepted))
    seen = [byte for _, group in groups for byte in group]
    assert sorted(seen) == [b for b in range(256) if any(bits >> b & 1 for bits in accepted)]
    for members, group in groups:
        for byte in group:
            assert members == tuple(i for i, bits in enumerate(accepted) if bits >> byte & 1)
    assert [group[0] for _, group in groups] == sorted(group[0] for _, group in groups)


def test_plain_characters_followed_on_threads_agree_with_transitions():
    """Where plain non-ASCII characters lead is found on thread sets (no configuration per
    state inside a character); those configurations (DEAD included) are the ones read off
    the transitions."""
    from pegmask.grammars.token_trie import PLAIN_MULTIBYTE

    def reached_by_transitions(compiled, config):
        reached = set()
        for sequence in PLAIN_MULTIBYTE:
            states = {config}
            for lo, hi in sequence:
                states = {nxt for s in states for nxt in compiled._row(s)[lo : hi + 1]}
            reached |= states
        return reached

    vocab = smollm2()
    free_text = compile_grammar(Grammar.from_peg(CHAT), vocab)
    file_name = compile_grammar(Grammar.from_json_schema(SAFE_CASES["a file name pattern"][0]), vocab)
    # A character that returns from its rule's frame after its last byte.
    one_char = compile_grammar(Grammar.from_peg('root = "a" ch ch* "b"\nch = [^"\\\x00-\x1f]'), vocab)
    cases = ((weather_compiled(), weather_texts()),
             (free_text, [b'Gr\xc3\xbc\xc3\x9fe <tool_call>\n{"a": "\xe6\x9d\xb1"}']),
             (file_name, [b'"a.cs.tsv"']),
             (one_char, [b'a\xc3\xbc\xe6\x9d\xb1xb']))
    for compiled, texts in cases:
        decided = moving = 0
        for text in texts:
            state = compiled.initial_state
            for byte in text:
                state = compiled.next_state(state, byte)
                if state == 0:
                    break
                reached = compiled._threads_after_multibyte(state)
                if reached is None:
                    continue
                expected = reached_by_transitions(compiled, state)
                assert reached == expected if 0 not in expected else 0 in reached
                decided += 1
                moving += reached != {state}
        assert decided and moving
    for compiled in (weather_compiled(), one_char):
        assert any(ends is not None for ends in compiled._multibyte_pcs.values())


def test_characters_of_a_string_are_followed_once_for_its_call_sites():
    """Inside a string, where the bytes of a plain non-ASCII character lead is found once
    per instruction, on no stack (they wait for one another, with no call or return between
    them); only the end of each character is closed on the call site's stack: the second
    string property's value reuses what the first found."""
    compiled = compile_grammar(Grammar.from_json_schema({
        "type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "string"}},
        "required": ["a", "b"], "additionalProperties": False,
    }), smollm2())

    first, second = state_after(compiled, '{"a": "x'), state_after(compiled, '{"a": "x", "b": "y')
    assert first != second
    assert compiled._threads_after_multibyte(first) == {first}
    known = dict(compiled._multibyte_pcs)
    assert known and None not in known.values()
    assert compiled._threads_after_multibyte(second) == {second}
    assert compiled._multibyte_pcs == known
    assert_masks_exact_along(compiled, '{"a": "\u00fcx", "b": "\u6771y"}')


def test_the_items_of_an_array_run_on_one_copy_of_the_item():
    """`item (separator item)*` is compiled with one copy of the item: inside the second
    item of an array the configurations are those of the first."""
    compiled = compile_grammar(Grammar.from_json_schema({"type": "array", "items": {"type": "string"}}),
                               smollm2())

    assert (state_after(compiled, '["ab') == state_after(compiled, '["ab", "cd')
            == state_after(compiled, '["ab", "cd",\n"e'))
    assert state_after(compiled, '["ab"') == state_after(compiled, '["ab", "cd"')
    assert Grammar.from_json_schema({"type": "array", "items": {"type": "string"}}).parse(
        '["a", "b"]') is not None


def test_mask_cache_keeps_the_recently_used_masks_within_its_bound():
    vocab = smollm2()
    words = (vocab.size + 31) // 32
    bounded = compile_grammar(Grammar.from_peg(TOOL), vocab, mask_cache_bytes=3 * words * 4)
    unbounded = compile_grammar(Grammar.from_peg(TOOL), vocab)
    text = b'{"name": "get_weather", "arguments": {"city": "Paris"}}'
    matchers = (bounded.matcher(), unbounded.matcher())
    bitmasks = (allocate_token_bitmask(1, vocab.size), allocate_token_bitmask(1, vocab.size))
    first = bounded.mask(matchers[0].state)[0]
    for byte in text:
        for matcher, bitmask in zip(matchers, bitmasks, strict=True):
            matcher.fill_next_token_bitmask(bitmask)
            assert matcher.accept_string(bytes((byte,)))
        assert np.array_equal(bitmasks[0].numpy(), bitmasks[1].numpy())  # exact after eviction
        assert bounded.cached_mask_bytes <= 3 * words * 4
        assert bounded.mask(bounded.initial_state)[0] is first  # used at every step: kept
    assert unbounded.cached_mask_bytes > 3 * words * 4
    for config in range(1, bounded.state_count):  # the first mask is the least recent now
        if config != bounded.initial_state:
            bounded.mask(config)
    assert bounded.mask(bounded.initial_state)[0] is not first
    assert np.array_equal(bounded.mask(bounded.initial_state)[0], first)
    with pytest.raises(ValueError, match="mask_cache_bytes"):
        compile_grammar(Grammar.from_peg(TOOL), vocab, mask_cache_bytes=-1)


def test_compiler_keeps_recent_grammars_within_its_limits():
    vocab = smollm2()
    grammars = [Grammar.from_peg(f'root = "{word}" [0-9]*') for word in ("one", "two", "three")]
    compiler = GrammarCompiler(vocab, max_entries=2, cache_limit_bytes=None)
    first = compiler.compile(grammars[0])
    second = compiler.compile(grammars[1])
    assert compiler.compile(grammars[0]) is first  # used again: now the most recent
    compiler.compile(grammars[2])
    assert len(compiler) == 2
    assert compiler.compile(grammars[0]) is first
    assert compiler.compile(grammars[1]) is not second  # the least recent was dropped

    compiled = compiler.compile(grammars[2])
    matcher = compiled.matcher()
    matcher.fill_next_token_bitmask(allocate_token_bitmask(1, vocab.size))
    before = compiled.memory_bytes
    assert before >= compiled.cached_mask_bytes == (vocab.size + 31) // 32 * 4
    assert matcher.accept_string(b"three123")
    matcher.fill_next_token_bitmask(allocate_token_bitmask(1, vocab.size))
    assert compiled.memory_bytes > before  # new configurations and their mask

    fresh = [compile_grammar(grammar, vocab).memory_bytes for grammar in grammars]
    used = compile_grammar(grammars[0], vocab)
    used.matcher().fill_next_token_bitmask(allocate_token_bitmask(1, vocab.size))
    limit = used.memory_bytes + fresh[1] + fresh[2] - 1  # room for two of the three
    small = GrammarCompiler(vocab, cache_limit_bytes=limit)
    kept = small.compile(grammars[0])
    kept.matcher().fill_next_token_bitmask(allocate_token_bitmask(1, vocab.size))
    assert kept.memory_bytes == used.memory_bytes
    small.compile(grammars[1])
    assert len(small) == 2 and small.cache_size_bytes <= limit
    small.compile(grammars[2])
    assert len(small) == 2 and small.cache_size_bytes <= limit
    assert small.compile(grammars[0]) is not kept  # the least recent went over the limit
    tiny = GrammarCompiler(vocab, cache_limit_bytes=0)
    assert tiny.compile(grammars[2]) is tiny.compile(grammars[2])  # the newest always stays
    tiny.compile(grammars[0])
    assert len(tiny) == 1
    small.clear_cache()
    assert len(small) == 0 and small.cache_size_bytes == 0
    for bad in ({"max_entries": 0}, {"cache_limit_bytes": -1}):
        with pytest.raises(ValueError):
            GrammarCompiler(vocab, **bad)
