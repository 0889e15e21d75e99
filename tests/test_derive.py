"""Dialects derived from chat templates alone (pegmask.dialects.derive), the family modules
switched off: which templates of data/templates derive (and why the others do not), and, for
those that do, random turns rendered by the template read back through the derived dialect,
whole, in chunks and token by token under its strict grammar."""

from __future__ import annotations

import json
from typing import Any

import pytest
from families import (
    JSON_VALUES,
    SHAPE_CALLS,
    SIMPLE_VALUES,
    TEXT,
    Family,
    compiler,
    qwen_with,
    summary,
    tool_of,
    turns,
)
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st
from test_dialect_base import SHAPES, TOOLS, assert_stream_matches, without_ids
from test_families import FAMILIES, TEMPLATE_DIALECTS, UNREADABLE, _cut_off, family_dialect

from pegmask.bench.data import TEMPLATES_DIR
from pegmask.dialects import (
    DERIVED,
    ChatRequest,
    DerivationError,
    derive_dialect,
    detect_dialect,
    dialect_options,
    get_dialect,
)
from pegmask.dialects.derive import DerivedDialect, first_piece
from pegmask.dialects.probe import derive_format
from pegmask.dialects.textdiff import common_prefix, header_overlap

# Template variables a template ends its turns with (the tokenizer's, as transformers passes).
TEMPLATE_KWARGS: dict[str, dict[str, str]] = {
    "Mistral-Small-3.2-24B-Instruct-2506.jinja": {"bos_token": "<s>", "eos_token": "</s>"},
    "mistralai-Ministral-3-14B-Reasoning-2512.jinja": {"bos_token": "<s>", "eos_token": "</s>"},
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": {"bos_token": "<s>", "eos_token": "</s>"},
    "unsloth-mistral-Devstral-Small-2507.jinja": {"bos_token": "<s>", "eos_token": "</s>"},
    "meetkai-functionary-medium-v3.1.jinja": {"bos_token": "<|begin_of_text|>"},
    "meetkai-functionary-medium-v3.2.jinja": {"bos_token": "<|begin_of_text|>"},
    "unsloth-Apriel-1.5.jinja": {"bos_token": "<s>", "eos_token": "</s>"},
    # Hy3 reasons only with an effort (its prompt closes reasoning by default)
    "tencent-Hy3.jinja": {"reasoning_effort": "high"},
}

# Every template of data/templates: None where a dialect derives, else the DerivationError.
DERIVES: dict[str, str | None] = {
    'LiquidAI-LFM2.5-8B-A1B.jinja': None,
    'vllm-tool_chat_template_llama3.2_pythonic.jinja': None,
    'vllm-tool_chat_template_llama4_pythonic.jinja': None,
    'Aleph-Alpha-Kolibri-1.jinja': None,
    'Apertus-8B-Instruct.jinja':
        "the template cannot render an assistant turn: 'dict object' has no attribute 'description'",
    'ByteDance-Seed-OSS.jinja': None,
    'Cohere2MoE.jinja': None,
    'CohereForAI-c4ai-command-r-plus-tool_use.jinja':
        "the template cannot render an assistant turn: 'dict object' has no attribute 'additionalProperties'",
    'CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja': None,
    'DeepSeek-V3.2.jinja': None,
    'GLM-4.6.jinja': None,
    'GLM-4.7-Flash.jinja': None,
    'Kimi-K2-Instruct.jinja':
        "the template writes no tool calls (a call's name is not in its rendering)",
    # every part of its turn is a block `<|open|>NAME ...<|sep|>` ... `<|close|>NAME<|sep|>`:
    # reasoning (opened by the prompt), the content (written, empty, before calls too), the
    # calls, each argument (its block names the value's type: `type="object"`), and the turn
    # itself, whose closing block comes before <|end_of_msg|>
    'Kimi-K3.jinja':
        "reasoning is a named block ('<|open|>think<|sep|>' ... '<|close|>think<|sep|>'): a "
        "turn of named blocks (reasoning, content, calls, arguments) is not derived",
    'MiMo-VL.jinja': None,
    'MiniMax-M2.jinja': None,
    'Mistral-Small-3.2-24B-Instruct-2506.jinja': None,
    'NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja': None,
    'NVIDIA-Nemotron-Nano-v2.jinja': None,
    'NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja': None,
    'Qwen-QwQ-32B.jinja': None,
    'Qwen-Qwen2.5-7B-Instruct.jinja': None,
    'Qwen-Qwen3-0.6B.Indras-Mirror-variant.jinja': None,
    'Qwen-Qwen3-0.6B.jinja': None,
    'Qwen3-Coder.jinja': None,
    'Qwen3.5-4B.jinja': None,
    'deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja':
        "the template writes no tool calls (a call's name is not in its rendering)",
    'deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja': None,
    'deepseek-ai-DeepSeek-V3.1.jinja': None,
    'deepseek-ai-DeepSeek-V4.jinja': None,
    'glm_4_5.jinja': None,
    'google-gemma-4-31B-it.jinja': None,
    'ibm-granite-granite-3.3-2B-Instruct.jinja':
        "the template writes no tool calls (a call's name is not in its rendering)",
    'ibm-granite-granite-4.0.jinja': None,
    'ibm-granite-granite-4.1.jinja': None,
    'inclusionAI-Ling-3.0-tiny.jinja': None,
    'llm-jp-llm-jp-4.1-8b-thinking.jinja': "reasoning is not opened by a counterpart of '<|end|>'",
    'llm-jp-tokenizer-alpha_2.0-chat_template.jinja':
        "reasoning is not opened by a counterpart of '<|end|>'",
    'meetkai-functionary-medium-v3.1.jinja': None,
    'meetkai-functionary-medium-v3.2.jinja': None,
    'meta-llama-Llama-3.1-8B-Instruct.jinja': None,
    'meta-llama-Llama-3.2-3B-Instruct.jinja': None,
    'mistralai-Ministral-3-14B-Reasoning-2512.jinja': None,
    'mistralai-Mistral-Nemo-Instruct-2407.jinja': None,
    'moonshotai-Kimi-K2-Thinking.jinja':
        "the template writes no tool calls (a call's name is not in its rendering)",
    'moonshotai-Kimi-K2.jinja': None,
    'nvidia-Llama-3_3-Nemotron-Super-49B-v1_5.jinja': None,
    'openai-gpt-oss-120b.jinja': "reasoning is not opened by a counterpart of '<|end|>'",
    'poolside-Laguna-S-2.1.jinja': None,
    'poolside-Laguna-XS.2.jinja': None,
    'tencent-Hy3.jinja': None,
    'unsloth-Apriel-1.5.jinja': None,
    'unsloth-mistral-Devstral-Small-2507.jinja': None,
    'vllm-tool_chat_template_deepseekr1.jinja': None,
    'vllm-tool_chat_template_hermes.jinja': None,
    'vllm-tool_chat_template_phi4_mini.jinja': None,
}

TEMPLATES = sorted(TEMPLATE_DIALECTS)


def _template(name: str) -> str:
    return (TEMPLATES_DIR / name).read_text(encoding="utf-8")


def _outcome(name: str) -> str | None:
    try:
        derive_format(_template(name), **TEMPLATE_KWARGS.get(name, {}))
    except DerivationError as exc:
        return str(exc)
    return None


def test_which_templates_derive() -> None:
    """The table above, so that a template that stops deriving (or starts) shows."""
    assert {name: _outcome(name) for name in TEMPLATES} == DERIVES


# Every template that derives reads its renderings back (the last two gaps, R1's indentation
# and Nemotron Nano v2's content in a turn of its own, closed in issue 36).
DERIVED_TEMPLATES = [name for name in TEMPLATES if DERIVES.get(name) is None]


def _dialect(name: str) -> DerivedDialect:
    return derive_dialect(_template(name), **TEMPLATE_KWARGS.get(name, {}))


HISTORY = [{"role": "system", "content": "You are helpful."},
           {"role": "user", "content": "Please help."}]


def _render_turn(dialect: DerivedDialect, tools: list[dict], message: dict[str, Any],
                 kwargs: dict[str, Any]) -> tuple[str, str] | None:
    """The generation prompt and the model's output for `message`: the dialect's rendering
    (its template's, with past calls in the content where the dialect writes them so) after
    the prompt, cut after the end of turn; arguments as an object, else as JSON text (None:
    neither renders; as derive's probes, an object the template writes as a Python literal
    wants text). Where the prompt opens reasoning that the template does not write back, the
    output closes it first (as the model would)."""
    turn_format = dialect.format
    for as_text in (False, True):
        calls = [{**call, "function": {**call["function"],
                                       "arguments": json.dumps(call["function"]["arguments"])
                                       if as_text else call["function"]["arguments"]}}
                 for call in message["tool_calls"]]
        try:
            prompt = dialect.render(HISTORY, tools=tools, add_generation_prompt=True, **kwargs)
            full = dialect.render([*HISTORY, {**message, "tool_calls": calls}], tools=tools,
                                  add_generation_prompt=False, **kwargs)
        except Exception:  # noqa: BLE001, S112 - the template wants the other form
            continue
        if not as_text and any(call["function"]["arguments"]
                               and repr(call["function"]["arguments"]) in full
                               for call in calls):
            continue  # an object written as a Python literal: the template wants JSON text
        close, rest = turn_format.think_close, full[common_prefix(full, prompt):]
        if full.startswith(prompt):
            turn = full[len(prompt):]
        elif close and prompt.rstrip().endswith(turn_format.think_open or close) \
                and close not in rest:  # (V3.2 writes the reasoning back, R1 does not)
            turn = close + "\n\n" + rest
        else:  # the prompt's tail that the turn lacks is left out (Nemo's: its system message)
            turn = rest[header_overlap(rest, prompt[len(full) - len(rest):]):]
        ends = [turn.find(token) + len(token) for token in turn_format.eos if token in turn]
        return prompt, turn[:min(ends)] if ends else turn
    return None


# Argument values drawn by how the template writes them: the strict grammar asks for JSON, so
# values a template writes with `str()` (Python literals) are left out: all but strings and
# integers ("python"), booleans and null outside arrays and objects ("mixed").
VALUES = {"python": SIMPLE_VALUES,
          "mixed": JSON_VALUES.filter(lambda value: value is not None
                                      and not isinstance(value, bool))}
# Hermes 2 Pro's template (and vLLM's, written from it) recurses without end on a parameter of
# type "null" (a tool it cannot render), so their tools declare none.
_NOT_NULL = JSON_VALUES.filter(lambda value: value is not None)
TEMPLATE_VALUES = {"NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja": _NOT_NULL,
                   "vllm-tool_chat_template_hermes.jinja": _NOT_NULL}
# Derandomized: the same draws every run (CI must not turn red on a new draw; a session that
# widens derivation should run it with derandomize off to look for new failures).
ROUND_TRIPS = settings(max_examples=10, deadline=None, phases=[Phase.explicit, Phase.generate],
                       derandomize=True,
                       suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                              HealthCheck.filter_too_much])


@pytest.mark.parametrize("name", DERIVED_TEMPLATES)
@ROUND_TRIPS
@given(data=st.data())
def test_template_turns_read_back_through_the_derived_dialect(name: str,
                                                             data: st.DataObject) -> None:
    """A random turn (1 to 3 calls, one where the template writes one a turn, nested arguments with unicode and quotes, content, and
    reasoning where the template writes it) as the template renders it parses to its calls,
    content and reasoning, whole and in every chunking, and its tokens are accepted one by one
    by the strict grammar of the request."""
    assert_derived_round_trip(_template(name), TEMPLATE_KWARGS.get(name, {}),
                              TEMPLATE_VALUES.get(name), data)


def assert_derived_round_trip(template: str, template_kwargs: dict[str, Any], values: Any,
                              data: st.DataObject) -> None:
    """A random turn rendered by `template` reads back through the dialect derived from it
    (whole, in chunks, token by token under its strict grammar); `values`: the argument values
    to draw (default: by how the template writes them, VALUES)."""
    dialect = derive_dialect(template, **template_kwargs)
    turn_format = dialect.format
    reasons = turn_format.think_close is not None
    family = Family(DERIVED, "", lambda: (None, None), "", lambda calls: "",
                    reasoning=reasons, parallel=turn_format.parallel,
                    # a bare JSON call or call list is the whole turn (Phi-4 mini's template
                    # writes the content or the calls, Llama 4's pythonic one); content the
                    # template writes after the calls is not where a model writes it (Gemma
                    # 4's), nor is a turn of its own before the calls' (Nemotron Nano v2's)
                    content_with_calls=not (dialect.calls_alone
                                            or turn_format.content_after_calls
                                            or turn_format.content_own_turn),
                    values=values if values is not None else VALUES.get(turn_format.values))
    tools, message, calls, content, reasoning = data.draw(turns(family))
    kwargs = {**template_kwargs, "enable_thinking": reasons}
    rendered = _render_turn(dialect, tools, message, kwargs)
    assert rendered is not None
    prompt, output = rendered
    # what the template drops (content beside calls, reasoning) the output does not hold
    close = turn_format.think_close
    written = output.split(close)[0] if close and close in output else ""  # the reasoning
    without = _render_turn(dialect, tools, {**message, "content": ""}, kwargs)
    dropped = without is not None and without[1] == output  # (not: the content is in the output)
    expected = (calls, "" if dropped else content,
                reasoning if reasoning and reasoning in written else "")
    request = ChatRequest(tools=tools, chat_template_kwargs=kwargs, generation_prompt=prompt)
    assert summary(dialect.parse(output, request)) == expected, output
    cuts = data.draw(st.lists(st.integers(0, len(output)), max_size=8))
    assert_stream_matches(dialect, output, cuts, request)

    grammar = dialect.grammar(request)
    vocab, encode = qwen_with(grammar.specials, turn_format.eos)
    matcher = compiler(vocab).compile(grammar).matcher()
    for position, token in enumerate(encode(output)):
        assert matcher.accept_token(token), (output, vocab.token_bytes[token], position)
    assert matcher.is_terminated() or matcher.is_accepting(), output
    assert summary(dialect.parse(encode(output), request, vocab, trusted=True)) == expected


# The families' examples (test_dialect_base's SHAPES as each family writes them, after its
# reasoning block where it has one) that a derived dialect reads otherwise than the family
# module, and why: (family, example) -> reason.
_THINK_BLOCKS = ("the template writes reasoning from thinking blocks of the content, not from "
                 "reasoning_content, and splits nothing on [/THINK]: no reasoning is derived")
AGREEMENT_GAPS: dict[tuple[str, str], str] = {
    **{("ministral-3-reasoning", f"reasoning, {label}"): _THINK_BLOCKS for label in SHAPES},
    ("functionary-v3.1", "text"): "the template ends a turn with <|eom_id|> after calls only "
                                  "(else <|eot_id|>); the example ends a text with it",
    **{("gemma-4", label): "the template ends a turn with <|tool_response> after calls only "
       "(else <turn|>); the example ends a text with it" for label in ("text", "reasoning, text")},
    **{("apriel-1.5", f"reasoning, {label}"): "the template writes a `thought` field only with "
       "`add_thoughts`, after the content: no reasoning is derived" for label in SHAPES},
    **{("llama3", label): "the template writes one call a turn (it raises on two): the derived "
       "dialect reads one, where models write several separated by `;`"
       for label in ("two calls", "mixed calls")},
    **{("phi4-mini", label): "the template writes past calls as bare JSON objects, the model "
       "writes them in a `functools[...]` list (the family module puts those into the content)"
       for label in SHAPES if label != "text"},
}
AGREEING = {name: family for name, family in FAMILIES.items()
            if DERIVES.get(family.template, "") is None}


def _examples(family: Family) -> list[tuple[str, str, bool]]:
    """(label, output, whether it reasons) of each of the family's examples."""
    out = []
    for thought in (True, False) if family.thought else (False,):
        for label, parts in SHAPES.items():
            output = (family.thought if thought else "") + family.render(parts, SHAPE_CALLS)
            out.append((f"reasoning, {label}" if thought else label, output + family.end,
                        thought))
    return out


@pytest.mark.parametrize("name", AGREEING)
def test_derived_dialects_agree_with_the_family_modules(name: str) -> None:
    """Every template with a family module that derives: its derived dialect reads each of the
    family's examples to the family module's message (AGREEMENT_GAPS says where not, and why),
    under the request the engine would make (its prompt rendered with thinking as the example
    has it)."""
    family = FAMILIES[name]
    module, derived = family_dialect(family), _dialect(family.template)
    disagree = set()
    for label, output, thought in _examples(family):
        kwargs = {**family.template_kwargs, "enable_thinking": thought, "thinking": thought}
        prompt = module.render(HISTORY, **kwargs)  # (Functionary's cannot render TOOLS)
        request = ChatRequest(tools=TOOLS, chat_template_kwargs=kwargs, generation_prompt=prompt)
        if without_ids(derived.parse(output, request)) != without_ids(module.parse(output, request)):
            disagree.add(label)
    assert disagree == {label for family_name, label in AGREEMENT_GAPS if family_name == name}


def test_the_agreement_gaps_are_families_that_derive() -> None:
    assert {name for name, _ in AGREEMENT_GAPS} <= set(AGREEING)


@pytest.mark.parametrize("name", DERIVED_TEMPLATES)
@UNREADABLE
@given(data=st.data())
def test_an_unreadable_call_block_is_content_byte_for_byte(name: str,
                                                          data: st.DataObject) -> None:
    """test_families' property on the derived dialects that round-trip: text, then a call block
    (as the template writes it) with junk written into it. Unless the junk landed where the
    lenient grammar reads anything or left a call open at the end, no call is read and
    everything after the text is content, byte for byte."""
    dialect = _dialect(name)
    turn_format = dialect.format
    name_, arguments = SHAPE_CALLS["weather2"]
    tools = [tool_of(name_, arguments)]
    call = {"id": "call00001", "type": "function",
            "function": {"name": name_, "arguments": arguments}}
    rendered = _render_turn(dialect, tools, {"role": "assistant", "content": "",
                                             "tool_calls": [call]},
                            {**TEMPLATE_KWARGS.get(name, {}), "enable_thinking": False})
    assert rendered is not None
    turn = rendered[1]
    block = turn[turn.index(first_piece(turn_format.open or turn_format.head)):]
    for token in turn_format.eos:  # the block ends where the turn does
        block = block.removesuffix(token)
    output = f"{TEXT}\n{block}"
    start = len(TEXT) + 1
    cut = data.draw(st.integers(start + 1, len(output) - 1), label="cut")
    junk = data.draw(st.sampled_from(["\x00", "}}]]", "<</>>"]), label="junk")
    output = output[:cut] + junk + output[cut:]
    request = ChatRequest(tools=tools, chat_template_kwargs={"enable_thinking": False})
    message = dialect.parse(output, request)
    assume(not message["tool_calls"] and not _cut_off(dialect, request, output))
    assert message["content"] == output, output


# A format no family writes: calls as `{"tool": ..., "args": ...}` objects in a `<|calls|>` list.
UNKNOWN_FAMILY = """\
{%- for m in messages %}<|{{ m.role }}|>{{ m.content or '' }}
{%- if m.tool_calls %}<|calls|>{% for c in m.tool_calls %}{% if not loop.first %}, {% endif %}
{"tool": {{ c.function.name | tojson }}, "args": {{ c.function.arguments | tojson }}}
{%- endfor %}<|/calls|>{% endif %}<|end|>
{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"""


def test_a_template_no_family_claims_gets_its_derived_dialect() -> None:
    """`detect_dialect` falls back to "derived" (not "unknown"), and `get_dialect` builds it, as
    the engine does for a model's template."""
    assert detect_dialect(UNKNOWN_FAMILY) == DERIVED
    assert detect_dialect("{{ messages }}") == "unknown"
    dialect = get_dialect(detect_dialect(UNKNOWN_FAMILY), chat_template=UNKNOWN_FAMILY)
    assert dialect.format.members == (("tool", "name"), ("args", "arguments")) and dialect.format.sep == ", "
    output = 'Sure.<|calls|>{"tool": "f", "args": {"q": "été \\"x\\""}}, {"tool": "g", "args": {}}' \
        "<|/calls|><|end|>"
    assert summary(dialect.parse(output)) == ([("f", {"q": 'été "x"'}), ("g", {})], "Sure.", "")
    request = ChatRequest(tools=TOOLS, tool_choice="required", parallel_tool_calls=False)
    grammar = dialect.grammar(request)
    assert grammar.matches('<|calls|>{"tool": "get_time", "args": {"zone": "JST"}}<|/calls|>')
    assert not grammar.matches('<|calls|>{"tool": "get_news", "args": {}}<|/calls|>')


# The same format, its turns ended by the tokenizer's eos_token (as Mistral's templates do).
EOS_FAMILY = UNKNOWN_FAMILY.replace("<|end|>", "{{ eos_token }}")


def test_a_turn_ended_by_eos_token_derives_with_the_tokenizers_tokens() -> None:
    """Rendered without the tokenizer's tokens, such a template writes no end of turn (the
    next turn's header is all that ends one); with them (what the engine passes:
    `template_tokens`), its turns end with the eos token."""
    tokens = {"bos_token": "<s>", "eos_token": "</s>"}
    assert derive_format(EOS_FAMILY).eos == ("<|user|>",)  # only the next turn's header
    assert detect_dialect(EOS_FAMILY, tokens) == DERIVED
    dialect = get_dialect(DERIVED, chat_template=EOS_FAMILY,
                          **dialect_options(DERIVED, EOS_FAMILY, tokens))
    assert dialect.format.eos == ("</s>",)
    assert summary(dialect.parse('<|calls|>{"tool": "f", "args": {}}<|/calls|></s>')) == (
        [("f", {})], "", "")


# Pythonic call lists in framings the repository's templates do not use: between two tokens
# of their own, and a list followed by a token it does not open with.
PYTHONIC_FAMILY = """\
{%- for m in messages %}<|{{ m.role }}|>{{ m.content or '' }}
{%- if m.tool_calls %}OPEN[{% for c in m.tool_calls %}{% if not loop.first %}, {% endif %}
{{- c.function.name }}({% for k, v in c.function.arguments.items() %}{% if not loop.first %}, {% endif %}
{{- k }}={{ v | tojson }}{% endfor %}){% endfor %}]CLOSE{% endif %}<|end|>
{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"""


def test_a_pythonic_call_list_derives_with_or_without_framing_tokens() -> None:
    """A list of calls by keyword derives to the pythonic grammar pieces, framed as the template
    frames it: by a start and an end token, or by nothing (a bare list is the whole turn); a
    list framed on one side only is named, not guessed."""
    request = ChatRequest(tools=TOOLS, tool_choice="required", parallel_tool_calls=False)
    framed = PYTHONIC_FAMILY.replace("OPEN", "<|py|>").replace("CLOSE", "<|/py|>")
    dialect = derive_dialect(framed)
    assert (dialect.format.arguments, dialect.format.values) == ("python", "literals")
    output = "Sure.<|py|>[f(q='été \\'x\\'', n=[1, None]), g()]<|/py|><|end|>"
    assert summary(dialect.parse(output)) == (
        [("f", {"q": "été 'x'", "n": [1, None]}), ("g", {})], "Sure.", "")
    assert dialect.grammar(request).matches('<|py|>[get_time(zone="JST")]<|/py|><|end|>')
    assert not dialect.grammar(request).matches('<|py|>[get_news()]<|/py|><|end|>')
    bare = derive_dialect(PYTHONIC_FAMILY.replace("OPEN", "").replace("CLOSE", ""))
    assert bare.calls_alone and bare.format.open == "["
    assert summary(bare.parse("[g(a=True)]<|end|>")) == ([("g", {"a": True})], "", "")
    assert summary(bare.parse("See [g(a=True)]<|end|>"))[0] == []  # an answer, not a call
    with pytest.raises(DerivationError, match="other than a start and an end token"):
        derive_dialect(PYTHONIC_FAMILY.replace("OPEN", "").replace("CLOSE", "<|/py|>"))


def test_what_cannot_be_derived_is_named() -> None:
    with pytest.raises(DerivationError, match="no tool calls"):
        derive_dialect("{% for m in messages %}{{ m.content }}{% endfor %}")
    with pytest.raises(ValueError, match="chat_template="):
        get_dialect(DERIVED)


def test_the_engine_derives_with_the_models_special_tokens() -> None:
    """The engine hands the tokenizer's special tokens to detection and derivation: a template
    that ends a turn with `eos_token` derives its end of turn from the model's."""
    from pegmask.engine.engine import Engine

    engine = Engine(chat_template=EOS_FAMILY, compile_workers=0, prewarm=False)
    try:
        assert engine.dialect_name == DERIVED and isinstance(engine.dialect, DerivedDialect)
        assert engine.dialect.format.eos == (engine.backend.template_tokens()["eos_token"],)
    finally:
        engine.close()


def test_the_engine_calls_tools_through_a_derived_dialect() -> None:
    """The embedded model behind a template no family writes: the engine detects the derived
    dialect, constrains a required call to it, and reads the call back; the turn with its tool
    result renders for the next request (its replay keeps the generated text)."""
    from pegmask.engine.engine import Engine

    engine = Engine(chat_template=UNKNOWN_FAMILY, compile_workers=0, prewarm=False)
    try:
        assert engine.dialect_name == DERIVED
        tools = TOOLS
        messages = [{"role": "user", "content": "What time is it in Tokyo?"}]
        result = engine.generate(messages, tools=tools, tool_choice="required", max_tokens=64,
                                 temperature=0.0)
        message = result.choices[0].message
        (call,) = message["tool_calls"][:1]
        assert call["function"]["name"] in {tool["function"]["name"] for tool in TOOLS}
        assert isinstance(json.loads(call["function"]["arguments"]), dict)
        follow_up = [*messages, message, {"role": "tool", "tool_call_id": call["id"],
                                          "content": "12:00"}]
        answer = engine.generate(follow_up, tools=tools, tool_choice="none", max_tokens=8)
        assert answer.choices[0].message["tool_calls"] in (None, [])
    finally:
        engine.close()


def test_a_template_that_writes_one_call_a_turn_derives_one_call_a_turn() -> None:
    """Llama 3.1's template raises on two calls: its derived format says so, and its grammar
    allows one call (a bare JSON object, the whole turn) whatever parallel_tool_calls says;
    tool_choice still picks the tool, and an answer cannot start like a call."""
    dialect = _dialect("meta-llama-Llama-3.1-8B-Instruct.jinja")
    assert not dialect.format.parallel and dialect.format.bare
    one = '{"name": "get_time", "parameters": {"zone": "JST"}}<|eot_id|>'
    two = '{"name": "get_time", "parameters": {"zone": "JST"}}' + one
    grammar = dialect.grammar(ChatRequest(tools=TOOLS, parallel_tool_calls=True))
    assert grammar.matches(one) and not grammar.matches(two)
    assert not grammar.matches('{"a": 1} is JSON.')  # an answer starting like a call
    assert summary(dialect.parse("Sure. " + one)) == ([], "Sure. " + one[:-10], "")
    named = ChatRequest(tools=TOOLS, tool_choice={"type": "function",
                                                  "function": {"name": "get_weather"}})
    assert not dialect.grammar(named).matches(one)
    assert summary(dialect.parse(one)) == ([("get_time", {"zone": "JST"})], "", "")


def test_a_templates_own_indentation_is_framing_whitespace() -> None:
    """vLLM's R1 template starts a turn with 20 spaces of its Jinja indentation: the derived
    format measures it, and the strict grammar takes that much framing whitespace (the
    families' bound of 4 would refuse the template's own turns), and no more."""
    dialect = _dialect("vllm-tool_chat_template_deepseekr1.jinja")
    assert dialect.format.layout == 20
    strict = dialect.grammar(ChatRequest(tools=TOOLS))
    call = ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n"
            '```json\n{"zone": "JST"}\n```<｜tool▁call▁end｜>        <｜tool▁calls▁end｜>'
            "<｜end▁of▁sentence｜>")
    assert strict.matches(" " * 20 + call)
    assert not strict.matches(" " * 21 + call)
    assert _dialect("Qwen-Qwen3-0.6B.jinja").format.layout == 4
