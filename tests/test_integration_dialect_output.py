"""`ReasoningSplit`, which the vLLM reasoning parsers run: for outputs drawn from every
dialect's grammar, the leading reasoning plus what the dialect parses from the rest is what
it parses from the whole output, however the output is cut into pieces."""

from __future__ import annotations

import random

import pytest
from grammar_sampling import sample_symbols
from hypothesis import given, settings
from hypothesis import strategies as st
from vocabularies import smollm2_tokenizer

from pegmask.dialects import ChatRequest, dialect_names
from pegmask.grammars.program import SPECIAL_BASE
from pegmask.integrations.constraints import dialect_named
from pegmask.integrations.dialect_output import (
    ReasoningMarkerTail,
    ReasoningSplit,
    inside_reasoning,
    last_reasoning_marker,
    rest_dialect,
)

TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {
    "type": "object", "properties": {"q": {"type": "string"}, "n": {"type": "integer"}},
    "required": ["q"]}}}]
FIXED = {
    "hermes": ["<think>\nhmm\n</think>\n\nSure.\n<tool_call>\n"
               '{"name": "lookup", "arguments": {"q": "x"}}\n</tool_call><|im_end|>',
               "Plain answer<|im_end|>", "no open tag</think>\n\nAnswer."],
    "harmony": ["<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>analysis"
                "<|message|>b<|end|><|start|>assistant<|channel|>final<|message|>Hi<|return|>",
                "<|channel|>analysis<|message|>plan<|end|><|start|>assistant<|channel|>"
                'commentary to=functions.lookup <|constrain|>json<|message|>{"q": "x"}<|call|>'],
    "hermes-xml": ["<think>\nplan\n</think>\n\nOk.\n<tool_call>\n<function=lookup>\n"
                   "<parameter=q>\nx\n</parameter>\n<parameter=n>\n3\n</parameter>\n"
                   "</function>\n</tool_call><|im_end|>"],
    "dsml": ["Need it.</think>\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"lookup\">\n"
             "<｜DSML｜parameter name=\"q\" string=\"true\">x</｜DSML｜parameter>\n"
             "</｜DSML｜invoke>\n</｜DSML｜function_calls><｜end▁of▁sentence｜>",
             "</think>"],  # empty reasoning, nothing after: all framing
    "llmjp-harmony": ["<|channel|> analysis<|message|> I'm\nthinking<|end|><|start|> assistant"
                      "<|channel|> final<|message|> Hello!",
                      "<|channel|> analysis<|message|> plan<|end|><|start|> assistant to=functions."
                      "lookup<|channel|> commentary <|constrain|>  json<|message|> {\"q\": \"x\"}"],
    "minimax": ['<think>\nplan\n</think>\n\nOk.\n<minimax:tool_call>\n<invoke name="lookup">\n'
                '<parameter name="q">x</parameter>\n</invoke>\n</minimax:tool_call>'],
    "seed-oss": ["<seed:think>plan</seed:think>Ok.<seed:tool_call>\n<function=lookup>\n"
                 "<parameter=q>x</parameter>\n</function>\n</seed:tool_call>"],
    "minimax-m3": ["<mm:think>plan</mm:think>Ok.]<]minimax[>[<tool_call>\n]<]minimax[>[<invoke "
                   'name="lookup">\n]<]minimax[>[<q>x]<]minimax[>[</q>\n]<]minimax[>[</invoke>\n'
                   "]<]minimax[>[</tool_call>"],
    "cohere-xml": ['Plan.<|END_THINKING|><cofl:tool_calls><cofl:tool_call id="0" name="lookup">'
                   '<cofl:value name="q" type="raw">x</cofl:value></cofl:tool_call>'
                   "</cofl:tool_calls><|END_OF_TURN_TOKEN|>"],
    "mimo": ["<think>plan</think>Ok.<tool_call><function=lookup><parameter=q>x</parameter>"
             "</function></tool_call>"],
}


def text_of(program, symbols: list[int]) -> str | None:
    data = b"".join(program.specials[s - SPECIAL_BASE].encode() if s >= SPECIAL_BASE
                    else bytes([s]) for s in symbols)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def outputs(dialect: str) -> list[str]:
    """Outputs of the dialect's strict grammars (reasoning, content, calls) plus fixed ones."""
    found = list(FIXED.get(dialect, []))
    rng = random.Random(dialect)
    for choice in ("auto", "required"):
        grammar = dialect_named(dialect).grammar(ChatRequest(tools=TOOLS, tool_choice=choice))
        kept = 0
        for _ in range(300):
            symbols = sample_symbols(grammar.program, rng, max_len=160, stop_probability=0.05)
            text = None if symbols is None else text_of(grammar.program, symbols)
            kept += bool(text)
            found += [text] if text else []
            if kept == 12:
                break
    return found


_OUTPUTS = {name: outputs(name) for name in dialect_names()}


def split(dialect: str, text: str, cuts: list[int]) -> tuple[str, bool, str]:
    splitter = ReasoningSplit(dialect_named(dialect))
    bounds = [0, *sorted(set(cuts)), len(text)]
    reasoning = "".join(splitter.feed(text[a:b]) for a, b in zip(bounds[:-1], bounds[1:], strict=True))
    return reasoning + splitter.finish(), splitter.ended, splitter.rest


@pytest.mark.parametrize("dialect", dialect_names())
def test_samples_cover_reasoning_and_calls(dialect: str) -> None:
    messages = [dialect_named(dialect).parse(text) for text in _OUTPUTS[dialect]]
    assert len(messages) >= 10
    if dialect_named(dialect).reasoning_mode(None) is not False:  # the family reasons by default
        assert any(m["reasoning_content"] for m in messages), dialect
    assert any(m["tool_calls"] for m in messages), dialect


@pytest.mark.parametrize("dialect", dialect_names())
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_reasoning_and_rest_parse_as_the_whole(dialect: str, data: st.DataObject) -> None:
    text = data.draw(st.sampled_from(_OUTPUTS[dialect]))
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=8))
    reasoning, ended, rest = split(dialect, text, cuts)
    assert (reasoning, ended, rest) == split(dialect, text, [])  # chunking does not matter
    d = dialect_named(dialect)
    whole = d.parse(text)
    if not ended:  # cut off inside the reasoning
        assert rest == "" and whole["content"] is None and not whole["tool_calls"]
        assert reasoning == (whole["reasoning_content"] or "")
        return
    assert text.endswith(rest)
    after = rest_dialect(d).parse(rest)
    later = after["reasoning_content"]  # reasoning written after the answer began
    assert "\n".join(filter(None, [reasoning, later])) == (whole["reasoning_content"] or "")
    assert after["content"] == whole["content"]
    assert ([c["function"] for c in after["tool_calls"]]
            == [c["function"] for c in whole["tool_calls"]])


def test_split_points_are_where_the_rest_starts_a_turn() -> None:
    reasoning, ended, rest = split("hermes", FIXED["hermes"][0], [])
    assert (reasoning, ended) == ("hmm", True)
    assert rest.startswith("Sure.\n<tool_call>")
    reasoning, ended, rest = split("harmony", FIXED["harmony"][0], [])
    assert (reasoning, ended, rest) == ("a\nb", True, "<|channel|>final<|message|>Hi<|return|>")
    assert split("hermes", "<think>cut off", [3]) == ("cut off", True, "")
    assert split("hermes", "Just text", []) == ("", True, "Just text")


def smollm2_prompt() -> str:
    """SmolLM2's real rendered prompt for one question (its template writes no `<think>`)."""
    return smollm2_tokenizer().apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True)


@pytest.mark.parametrize(("tail", "inside"), [
    ("<think>\n", True),  # the template opened the block itself
    ("<think>\n\n</think>\n\n", False),  # it closed an empty one
    ("<think>\nhmm", True),  # output inside the opened block
    ("<think>\nhmm\n</think>\n\nAnswer", False),  # output past its close
    ("<think>\na\n</think>\n\nb<think>\nc", True),  # the last marker decides
])
def test_the_last_reasoning_marker_decides(tail: str, inside: bool) -> None:
    for reasoning in (None, False, True):
        dialect = dialect_named("hermes", reasoning)
        assert inside_reasoning(dialect, smollm2_prompt() + tail) is inside


def test_without_a_marker_the_prompt_state_decides() -> None:
    prompt = smollm2_prompt()
    assert inside_reasoning(dialect_named("hermes", False), prompt) is False
    assert inside_reasoning(dialect_named("hermes", True), prompt) is True
    assert inside_reasoning(dialect_named("hermes"), prompt) is None  # left to the output
    off = ChatRequest(chat_template_kwargs={"enable_thinking": False})
    assert inside_reasoning(dialect_named("hermes", True), prompt, off) is False
    # a dialect that does not reason has no reasoning to be inside, whatever the text says
    assert not any(inside_reasoning(dialect_named(name), prompt + "<think>\n") is not False
                   for name in dialect_names() if not dialect_named(name).reasons)


PIECES = ["<think>", "</think>", "<seed:think>", "</seed:think>", "<|START_THINKING|>",
          "<|END_THINKING|>", "[THINK]", "[/THINK]", "\n", " hmm", "think", "</", ">", "é",
          "｜", "思考", "<|im_end|>"]


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(["hermes", "seed-oss", "cohere", "mistral"]),
       pieces=st.lists(st.sampled_from(PIECES), max_size=40),
       steps=st.lists(st.integers(1, 6), min_size=1, max_size=40))
def test_the_marker_tail_of_growing_ids_is_that_of_their_whole_text(
        name: str, pieces: list[str], steps: list[int]) -> None:
    """Fed a prompt's ids and then a few more at a time (as vLLM's structured-output gate
    asks), the tail reads only the new ids and the few a marker can start in, and answers what
    the whole text's last marker says, markers cut across tokens and multi-byte text included."""
    tokenizer = smollm2_tokenizer()
    dialect = dialect_named(name, True)
    decoded: list[int] = []

    def decode(ids: list[int]) -> str:
        decoded.append(len(ids))
        return tokenizer.decode(ids, skip_special_tokens=False)

    tail = ReasoningMarkerTail(dialect, decode)
    ids = tokenizer.encode(smollm2_prompt() + "".join(pieces), add_special_tokens=False)
    overlap = 4 * max(map(len, dialect.reasoning_delimiters()))
    end, sizes = len(tokenizer.encode(smollm2_prompt(), add_special_tokens=False)), []
    while True:
        whole = tokenizer.decode(ids[:end], skip_special_tokens=False)
        assert tail.last(ids[:end]) is last_reasoning_marker(dialect, whole)
        if end == len(ids):
            break
        sizes.append(steps[len(sizes) % len(steps)])
        end = min(len(ids), end + sizes[-1])
    assert all(read <= overlap + size for read, size in zip(decoded[1:], sizes, strict=True))


def test_the_marker_tail_reads_other_ids_whole() -> None:
    """Ids that do not extend the last call's (a shorter prefix, another sequence) are read
    whole, and a dialect that spells no markers decodes nothing."""
    tokenizer = smollm2_tokenizer()
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=False)  # noqa: E731
    tail = ReasoningMarkerTail(dialect_named("hermes", True), decode)
    opened = tokenizer.encode(smollm2_prompt() + "<think>\nhmm", add_special_tokens=False)
    closed = tokenizer.encode(smollm2_prompt() + "<think>\nhmm\n</think>\n\nOk",
                              add_special_tokens=False)
    assert tail.last(closed) is False
    assert tail.last(opened) is True  # not an extension of `closed`
    assert tail.last(closed[:3]) is None
    assert ReasoningMarkerTail(dialect_named("harmony"), None).last(closed) is None
