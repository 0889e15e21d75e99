"""Every model family against its real chat template and vocabulary: detection, template
renderings read back (whole, chunked, token by token under the strict grammar), per-request
grammars (tool_choice, parallel calls, reasoning) and sampling under the token mask.

Family-specific cases (pitfalls, lenient forms) are in test_family_examples.py."""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence

import pytest
from families import (
    JSON_VALUES,
    SHAPE_CALLS,
    TEXT,
    TYPED_VALUES,
    Call,
    Family,
    compiler,
    deepseek,
    llama3,
    qwen_with,
    rendered_turn,
    request_for,
    summary,
    turns,
)
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st
from test_dialect_base import (
    BAD_CALLS,
    SHAPES,
    TOOL_CHOICES,
    TOOLS,
    assert_request_grammar,
    assert_sampling_obeys,
    assert_stream_matches,
    obeys,
)

from pegmask.bench.data import TEMPLATES_DIR
from pegmask.dialects import ChatRequest, Dialect, detect_dialect, get_dialect
from pegmask.dialects.cohere_xml import cofl_calls
from pegmask.dialects.history import ToolCall
from pegmask.dialects.minimax_m3 import m3_calls
from pegmask.grammars.errors import ParseError


def dumps(value: object) -> str:
    return json.dumps(value, ensure_ascii=False)


# --------------------------------------------------------------------------- the families
def llama3_calls(calls: Sequence[Call]) -> str:
    return "; ".join(f'{{"name": "{name}", "parameters": {dumps(args)}}}' for name, args in calls)


def mistral_calls(calls: Sequence[Call]) -> str:
    return "".join(f"[TOOL_CALLS]{name}[ARGS]{dumps(args)}" for name, args in calls)


def mistral_v3_calls(calls: Sequence[Call]) -> str:
    objects = ", ".join(dumps({"name": name, "arguments": args}) for name, args in calls)
    return f"[TOOL_CALLS][{objects}]"


def thinking_blocks(message: dict, reasoning: str) -> dict:
    """Ministral 3's template reads reasoning from a thinking block of the content."""
    blocks = [{"type": "thinking", "thinking": reasoning}]
    if message["content"]:
        blocks.append({"type": "text", "text": message["content"]})
    return {**message, "content": blocks}


def deepseek_calls(calls: Sequence[Call]) -> str:
    body = "".join(f"<｜tool▁call▁begin｜>{name}<｜tool▁sep｜>{dumps(args)}<｜tool▁call▁end｜>"
                   for name, args in calls)
    return f"<｜tool▁calls▁begin｜>{body}<｜tool▁calls▁end｜>"


def deepseek_r1_calls(calls: Sequence[Call]) -> str:
    body = "\n".join(f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n{dumps(args)}"
                     "\n```<｜tool▁call▁end｜>" for name, args in calls)
    return f"<｜tool▁calls▁begin｜>{body}<｜tool▁calls▁end｜>"


def kimi_calls(calls: Sequence[Call]) -> str:
    body = "".join(f"<|tool_call_begin|>functions.{name}:{i}<|tool_call_argument_begin|>"
                   f"{dumps(args)}<|tool_call_end|>" for i, (name, args) in enumerate(calls))
    return f"<|tool_calls_section_begin|>{body}<|tool_calls_section_end|>"


KIMI_VOCAB = functools.partial(qwen_with, (
    "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>", "<|tool_call_end|>", "<|im_end|>", "<think>", "</think>",
    "<|im_user|>", "<|im_assistant|>", "<|im_system|>", "<|im_middle|>"), ("<|im_end|>",))
def glm_calls(calls: Sequence[Call]) -> str:
    def value(v: object) -> str:
        return v if isinstance(v, str) else dumps(v)

    return "".join(f"<tool_call>{name}" + "".join(
        f"<arg_key>{k}</arg_key><arg_value>{value(v)}</arg_value>" for k, v in args.items())
        + "</tool_call>" for name, args in calls)


def minimax_calls(calls: Sequence[Call]) -> str:
    def value(v: object) -> str:
        return v if isinstance(v, str) else dumps(v)

    invokes = "".join(f'<invoke name="{name}">\n' + "".join(
        f'<parameter name="{k}">{value(v)}</parameter>\n' for k, v in args.items())
        + "</invoke>\n" for name, args in calls)
    return f"<minimax:tool_call>\n{invokes}</minimax:tool_call>"


MINIMAX_VOCAB = functools.partial(qwen_with, (
    "<minimax:tool_call>", "</minimax:tool_call>", "<think>", "</think>", "[e~[", "]~b]",
    "]~!b["), ("[e~[",))
def cohere_calls(calls: Sequence[Call]) -> str:
    objects = ",\n".join(
        f'    {{"tool_call_id": "{i}", "tool_name": "{name}", "parameters": {dumps(args)}}}'
        for i, (name, args) in enumerate(calls))
    return f"<|START_ACTION|>[\n{objects}\n]<|END_ACTION|>"


def nesting(value: object) -> int:
    """How many arrays and objects deep a JSON value goes."""
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) \
        else None
    return 0 if items is None else 1 + max(map(nesting, items), default=0)


# Command R+'s template indents arguments 4 spaces a level from 12: a value nested 5 deep is
# written with 33 whitespace characters in a run, past the strict grammar's bound (32).
COMMAND_R_VALUES = JSON_VALUES.filter(lambda value: nesting(value) <= 4)


def command_r_calls(calls: Sequence[Call]) -> str:
    objects = ",\n".join(
        f'    {{\n        "tool_name": "{name}",\n        "parameters": {dumps(args)}\n    }}'
        for name, args in calls)
    return f"Action:\n```json\n[\n{objects}\n]```"


def nemotron_calls(calls: Sequence[Call]) -> str:
    objects = ", ".join(dumps({"name": name, "arguments": args}) for name, args in calls)
    return f"<TOOLCALL>[{objects}]</TOOLCALL>"


def seed_calls(calls: Sequence[Call]) -> str:
    def value(v: object) -> str:
        return v if isinstance(v, str) else dumps(v)

    return "\n".join(f"<seed:tool_call>\n<function={name}>\n" + "".join(
        f"<parameter={k}>{value(v)}</parameter>\n" for k, v in args.items())
        + "</function>\n</seed:tool_call>" for name, args in calls)


SEED_VOCAB = functools.partial(qwen_with, (
    "<seed:bos>", "<seed:eos>", "<seed:think>", "</seed:think>", "<seed:tool_call>",
    "</seed:tool_call>", "<seed:cot_budget_reflect>", "</seed:cot_budget_reflect>"),
    ("<seed:eos>",))
def hunyuan_calls(calls: Sequence[Call]) -> str:
    def value(v: object) -> str:
        return v if isinstance(v, str) else dumps(v)

    body = "".join(f"<tool_call:opensource>{name}<tool_sep:opensource>\n" + "".join(
        f"<arg_key:opensource>{k}</arg_key:opensource>\n"
        f"<arg_value:opensource>{value(v)}</arg_value:opensource>\n" for k, v in args.items())
        + "</tool_call:opensource>\n" for name, args in calls)
    return f"<tool_calls:opensource>\n{body}</tool_calls:opensource>"


HUNYUAN_VOCAB = functools.partial(qwen_with, tuple(
    f"<{tag}:opensource>" for tag in (
        "think", "/think", "tool_calls", "/tool_calls", "tool_call", "/tool_call", "tool_sep",
        "arg_key", "/arg_key", "arg_value", "/arg_value", "tool_responses", "/tool_responses",
        "tool_response", "/tool_response"))
    + tuple(f"<｜hy_{tag}:opensource｜>" for tag in (
        "eos", "begin_of_sentence", "User", "Assistant", "pad")), ("<｜hy_eos:opensource｜>",))
def mimo_calls(calls: Sequence[Call]) -> str:
    def value(v: object) -> str:
        return v if isinstance(v, str) else dumps(v)

    return "".join(f"<tool_call><function={name}>" + "".join(
        f"<parameter={k}>{value(v)}</parameter>" for k, v in args.items())
        + "</function></tool_call>" for name, args in calls)


def kimi_k3_calls(calls: Sequence[Call]) -> str:
    kinds = {str: "string", bool: "boolean", int: "number", float: "number", type(None): "null",
             dict: "object", list: "array"}

    def argument(key: str, value: object) -> str:
        text = value if isinstance(value, str) else dumps(value)
        return (f'<|open|>argument key="{key}" type="{kinds[type(value)]}"<|sep|>{text}'
                "<|close|>argument<|sep|>")

    body = "".join(f'<|open|>call tool="{name}" index="{i + 1}"<|sep|>'
                   + "".join(argument(k, v) for k, v in args.items()) + "<|close|>call<|sep|>"
                   for i, (name, args) in enumerate(calls))
    return f"<|open|>tools<|sep|>{body}<|close|>tools<|sep|>"


def kimi_k3_body(text: str, calls: str) -> str:
    return f"{text}<|close|>response<|sep|>{calls}<|close|>message<|sep|>"


def gemma_calls(calls: Sequence[Call]) -> str:
    def value(v: object) -> str:
        if isinstance(v, str):
            return f'<|"|>{v}<|"|>'
        if isinstance(v, dict):
            return "{" + ",".join(f"{k}:{value(x)}" for k, x in sorted(v.items())) + "}"
        if isinstance(v, list):
            return "[" + ",".join(value(x) for x in v) + "]"
        return dumps(v)

    return "".join(f"<|tool_call>call:{name}{value(args)}<tool_call|>" for name, args in calls)


GEMMA_VOCAB = functools.partial(qwen_with, (
    "<|tool_call>", "<tool_call|>", '<|"|>', "<|channel>", "<channel|>", "<|turn>", "<turn|>",
    "<|tool_response>", "<tool_response|>", "<eos>", "<bos>"), ("<turn|>", "<|tool_response>"))
COHERE_VOCAB = functools.partial(qwen_with, (
    "<|START_THINKING|>", "<|END_THINKING|>", "<|START_ACTION|>", "<|END_ACTION|>",
    "<|END_OF_TURN_TOKEN|>", "<|START_OF_TURN_TOKEN|>", "<|CHATBOT_TOKEN|>", "<|USER_TOKEN|>",
    "<|SYSTEM_TOKEN|>", "<|START_TOOL_RESULT|>", "<|END_TOOL_RESULT|>", "<|START_TEXT|>",
    "<|END_TEXT|>"), ("<|END_OF_TURN_TOKEN|>",))
GLM_VOCAB = functools.partial(qwen_with, (
    "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>",
    "<think>", "</think>", "<|assistant|>", "<|user|>", "<|observation|>", "<|system|>",
    "<|endoftext|>", "[gMASK]", "<sop>"), ("<|user|>", "<|observation|>"))
DEEPSEEK_EOS = "<｜end▁of▁sentence｜>"
DEEPSEEK_KWARGS = {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": DEEPSEEK_EOS}
MISTRAL_VOCAB = functools.partial(qwen_with, ("[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "[THINK]",
                                              "[/THINK]", "</s>", "[INST]", "[/INST]"), ("</s>",))
MISTRAL_KWARGS = {"bos_token": "<s>", "eos_token": "</s>"}

def json_list(calls: Sequence[Call]) -> str:
    """Calls as the JSON-list families write them (json_calls.peg)."""
    return "[" + ", ".join(f'{{"name": "{name}", "arguments": {dumps(args)}}}'
                           for name, args in calls) + "]"


def apriel_calls(calls: Sequence[Call]) -> str:
    return f"<tool_calls>{json_list(calls)}</tool_calls>"


def phi4_mini_calls(calls: Sequence[Call]) -> str:
    return f"functools{json_list(calls)}"


def phi4_mini_bare_calls(calls: Sequence[Call]) -> str:
    """Phi-4-mini's calls as vLLM's template writes a past call turn: bare, comma separated."""
    return ",".join(f'{{"name": "{name}", "arguments": {dumps(args)}}}' for name, args in calls)


PHI4_MINI_VOCAB = functools.partial(qwen_with, (
    "<|end|>", "<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>"),
    ("<|end|>",))


def granite_calls(calls: Sequence[Call]) -> str:
    return f"<|tool_call|>{json_list(calls)}"


def apertus_calls(calls: Sequence[Call]) -> str:
    objects = ", ".join(f'{{"{name}": {dumps(args)}}}' for name, args in calls)
    return f"<|tools_prefix|>[{objects}]<|tools_suffix|>"


def apertus_blocks(message: dict, reasoning: str) -> dict:
    """Apertus' template reads reasoning from a `thoughts` block of the content."""
    blocks = [{"type": "thoughts", "text": reasoning},
              {"type": "response", "text": message["content"]}]
    return {**message, "content": {"blocks": blocks}}


def functionary_calls(calls: Sequence[Call]) -> str:
    return ">>>".join(f"{name}\n{dumps(args)}" for name, args in calls)


def functionary_body(text: str, calls: str) -> str:
    """Functionary v3.2's turn after the prompt's `>>>`: `all` and the text, then the calls."""
    if not text:
        return calls
    return f"all\n{text}" + (f">>>{calls}" if calls else "")


def functionary_v31_calls(calls: Sequence[Call]) -> str:
    return "".join(f"<function={name}>{dumps(args)}</function>" for name, args in calls)


def pythonic_calls(calls: Sequence[Call]) -> str:
    """A pythonic call list as the models write it (`repr` spells JSON values as Python)."""
    return "[" + ", ".join(f"{name}(" + ", ".join(f"{k}={v!r}" for k, v in args.items()) + ")"
                           for name, args in calls) + "]"


def lfm2_calls(calls: Sequence[Call]) -> str:
    """LFM2.5's template's form: strings in single quotes as they are, mappings as JSON."""
    def value(v: object) -> str:
        return f"'{v}'" if isinstance(v, str) else dumps(v) if isinstance(v, dict) else repr(v)

    body = ", ".join(f"{name}(" + ", ".join(f"{k}={value(v)}" for k, v in args.items()) + ")"
                     for name, args in calls)
    return f"<|tool_call_start|>[{body}]<|tool_call_end|>"


LFM2_VOCAB = functools.partial(qwen_with, (
    "<|tool_call_start|>", "<|tool_call_end|>", "<|im_start|>", "<|im_end|>", "<think>",
    "</think>"), ("<|im_end|>",))
LLAMA4_VOCAB = functools.partial(qwen_with, ("<|header_start|>", "<|header_end|>", "<|eot|>"),
                                 ("<|eot|>",))
# LFM2.5's template writes a string argument between single quotes, unescaped
LFM2_VALUES = JSON_VALUES.filter(lambda value: not (isinstance(value, str) and "'" in value))
LFM2_OPTIONS = {"call_tokens": ("<|tool_call_start|>", "<|tool_call_end|>"),
                "eos": ("<|im_end|>",)}
APRIEL_VOCAB = functools.partial(qwen_with, (
    "<thinking>", "</thinking>", "<tool_calls>", "</tool_calls>", "<|end|>", "<|system|>",
    "<|user|>", "<|assistant|>", "<|tool_result|>"), ("<|end|>",))

FAMILIES: dict[str, Family] = {
    "llama3": Family(
        "llama3", "meta-llama-Llama-3.2-3B-Instruct.jinja", llama3, "<|eot_id|>", llama3_calls,
        ends=("", "<|eot_id|>", "<|eom_id|>"), parallel=False, content_with_calls=False,
        template_kwargs={"date_string": "26 Jul 2024"}),
    "mistral-nemo": Family(
        "mistral", "mistralai-Mistral-Nemo-Instruct-2407.jinja", MISTRAL_VOCAB, "</s>",
        mistral_v3_calls, ends=("", "</s>"), options={"version": "v3"},
        template_kwargs=MISTRAL_KWARGS, content_with_calls=False, system=False),
    "mistral-small-3.2": Family(
        "mistral", "Mistral-Small-3.2-24B-Instruct-2506.jinja", MISTRAL_VOCAB, "</s>",
        mistral_calls, ends=("", "</s>"), template_kwargs=MISTRAL_KWARGS,
        content_with_calls=False),
    "ministral-3-reasoning": Family(
        "mistral", "mistralai-Ministral-3-14B-Reasoning-2512.jinja", MISTRAL_VOCAB, "</s>",
        mistral_calls, thought="[THINK]Hmm.[/THINK]", ends=("", "</s>"),
        template_kwargs=MISTRAL_KWARGS, reasoning=True, with_reasoning=thinking_blocks),
    "deepseek-v3.1": Family(
        "deepseek-v3.1", "deepseek-ai-DeepSeek-V3.1.jinja", deepseek, DEEPSEEK_EOS,
        deepseek_calls, thought="Hmm.</think>", ends=("", DEEPSEEK_EOS),
        template_kwargs=DEEPSEEK_KWARGS, string_arguments=True),
    "deepseek-r1": Family(
        "deepseek-r1", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", deepseek, DEEPSEEK_EOS,
        deepseek_r1_calls, thought="Hmm.\n</think>\n\n", ends=("", DEEPSEEK_EOS),
        template_kwargs=DEEPSEEK_KWARGS, string_arguments=True, content_with_calls=False,
        turn_start="<｜Assistant｜>"),
    "kimi-k2-thinking": Family(
        "kimi", "moonshotai-Kimi-K2-Thinking.jinja", KIMI_VOCAB, "<|im_end|>", kimi_calls,
        thought="Hmm.</think>", ends=("", "<|im_end|>"), reasoning=True,
        call_id=lambda i, name: f"functions.{name}:{i}"),
    "glm-4.5": Family(
        "glm", "glm_4_5.jinja", GLM_VOCAB, "", glm_calls, thought="Hmm.</think>",
        ends=("", "<|user|>", "<|observation|>"), reasoning=True),
    "glm-4.6": Family(
        "glm", "GLM-4.6.jinja", GLM_VOCAB, "", glm_calls, thought="Hmm.</think>",
        ends=("", "<|user|>", "<|observation|>"), reasoning=True),
    "glm-4.7": Family(
        "glm", "GLM-4.7-Flash.jinja", GLM_VOCAB, "", glm_calls, thought="Hmm.</think>",
        ends=("", "<|user|>", "<|observation|>"), reasoning=True),
    "minimax-m2": Family(
        "minimax", "MiniMax-M2.jinja", MINIMAX_VOCAB, "[e~[", minimax_calls,
        thought="Hmm.\n</think>\n\n", ends=("", "[e~["), reasoning=True),
    "cohere-command-a": Family(
        "cohere", "Cohere2MoE.jinja", COHERE_VOCAB, "<|END_OF_TURN_TOKEN|>", cohere_calls,
        thought="Hmm.<|END_THINKING|>", ends=("", "<|END_OF_TURN_TOKEN|>"), reasoning=True,
        content_with_calls=False),
    # the template writes no end-of-turn token after the calls, and a closing system turn after
    # every history; it cannot type every tool schema, so the dialect renders (fills them in)
    "command-r-plus": Family(
        "command-r", "CohereForAI-c4ai-command-r-plus-tool_use.jinja", COHERE_VOCAB, "]```\n",
        command_r_calls, ends=("", "<|END_OF_TURN_TOKEN|>"),
        turn_start="<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>", dialect_renders=True,
        values=COMMAND_R_VALUES),
    "nemotron-super-v1.5": Family(
        "nemotron", "nvidia-Llama-3_3-Nemotron-Super-49B-v1_5.jinja", llama3, "<|eot_id|>",
        nemotron_calls, thought="<think>\nHmm.\n</think>\n\n", ends=("", "<|eot_id|>")),
    # the template writes str(value): Python literals, read back by the example tests
    "seed-oss": Family(
        "seed-oss", "ByteDance-Seed-OSS.jinja", SEED_VOCAB, "<seed:eos>", seed_calls,
        thought="<seed:think>Hmm.</seed:think>\n", ends=("", "<seed:eos>"), reasoning=True,
        json_values=False),
    "hunyuan-hy3": Family(
        "hunyuan", "tencent-Hy3.jinja", HUNYUAN_VOCAB, "<｜hy_eos:opensource｜>", hunyuan_calls,
        thought="Hmm.</think:opensource>", ends=("", "<｜hy_eos:opensource｜>"), reasoning=True,
        template_kwargs={"reasoning_effort": "high"}),
    "kimi-k3": Family(
        "kimi-k3", "Kimi-K3.jinja", functools.partial(qwen_with, (
            "<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"), ("<|end_of_msg|>",)),
        "<|end_of_msg|>", kimi_k3_calls,
        thought="Hmm.<|close|>think<|sep|><|open|>response<|sep|>",
        ends=("", "<|end_of_msg|>"), reasoning=True, body=kimi_k3_body),
    "gemma-4": Family(
        "gemma", "google-gemma-4-31B-it.jinja", GEMMA_VOCAB, "<|tool_response>", gemma_calls,
        thought="<|channel>thought\nHmm.\n<channel|>", ends=("", "<turn|>", "<|tool_response>"),
        reasoning=True, content_with_calls=False, template_kwargs={"enable_thinking": True}),
    "apriel-1.5": Family(
        "apriel", "unsloth-Apriel-1.5.jinja", APRIEL_VOCAB, "<|end|>", apriel_calls,
        thought="<thinking>Hmm.</thinking>", ends=("", "<|end|>"), string_arguments=True,
        template_kwargs={"bos_token": "<s>", "eos_token": "</s>"}),
    # vLLM's template writes past calls without functools[...]; so the dialect renders them
    "phi4-mini": Family(
        "phi4-mini", "vllm-tool_chat_template_phi4_mini.jinja", PHI4_MINI_VOCAB, "<|end|>",
        phi4_mini_calls, ends=("", "<|end|>"), dialect_renders=True),
    # ... and as the template writes them (the bare form, a turn of calls alone)
    "phi4-mini-bare": Family(
        "phi4-mini", "vllm-tool_chat_template_phi4_mini.jinja", PHI4_MINI_VOCAB, "<|end|>",
        phi4_mini_bare_calls, ends=("", "<|end|>"), content_with_calls=False,
        string_arguments=True),
    # Granite 3.3's template drops past calls; so the dialect renders them
    "granite-3.3": Family(
        "granite", "ibm-granite-granite-3.3-2B-Instruct.jinja", functools.partial(
            qwen_with, ("<|tool_call|>", "<|end_of_text|>", "<|start_of_role|>",
                        "<|end_of_role|>"), ("<|end_of_text|>",)),
        "<|end_of_text|>", granite_calls, ends=("", "<|end_of_text|>"), dialect_renders=True),
    # its template reads tools without OpenAI's `function` wrapper; so the dialect renders them
    "apertus": Family(
        "apertus", "Apertus-8B-Instruct.jinja", functools.partial(qwen_with, (
            "<|inner_prefix|>", "<|inner_suffix|>", "<|tools_prefix|>", "<|tools_suffix|>",
            "<|assistant_start|>", "<|assistant_end|>", "<|user_start|>", "<|user_end|>",
            "<|system_start|>", "<|system_end|>", "<|developer_start|>", "<|developer_end|>"),
            ("<|assistant_end|>",)),
        "", apertus_calls, thought="<|inner_prefix|>Hmm.<|inner_suffix|>",
        ends=("", "<|assistant_end|>"), reasoning=True, with_reasoning=apertus_blocks,
        string_arguments=True, body=lambda text, calls: text + calls, dialect_renders=True),
    "lfm2.5": Family(
        "pythonic", "LiquidAI-LFM2.5-8B-A1B.jinja", LFM2_VOCAB, "<|im_end|>", lfm2_calls,
        thought="<think>Hmm.</think>", ends=("", "<|im_end|>"), options=LFM2_OPTIONS,
        reasoning=True, with_reasoning=lambda message, text: {**message, "thinking": text},
        body=lambda text, calls: text + calls, values=LFM2_VALUES),
    # vLLM's pythonic templates write past calls in another form than the model's (strings
    # unquoted, every value quoted); so the dialect renders them
    "llama3.2-pythonic": Family(
        "pythonic", "vllm-tool_chat_template_llama3.2_pythonic.jinja", llama3, "<|eot_id|>",
        pythonic_calls, ends=("", "<|eot_id|>", "<|eom_id|>"), options={"eos": ("<|eot_id|>", "<|eom_id|>")},
        content_with_calls=False, dialect_renders=True,
        template_kwargs={"date_string": "26 Jul 2024"}),
    "llama4-pythonic": Family(
        "pythonic", "vllm-tool_chat_template_llama4_pythonic.jinja", LLAMA4_VOCAB, "<|eot|>",
        pythonic_calls, ends=("", "<|eot|>"), options={"eos": ("<|eot|>",)},
        content_with_calls=False, dialect_renders=True),
    "functionary-v3.2": Family(
        "functionary-v3.2", "meetkai-functionary-medium-v3.2.jinja", llama3, "<|eot_id|>",
        functionary_calls, ends=("", "<|eot_id|>"), string_arguments=True,
        body=functionary_body, template_kwargs={"bos_token": "<|begin_of_text|>"}),
    "functionary-v3.1": Family(
        "functionary-v3.1", "meetkai-functionary-medium-v3.1.jinja", llama3, "<|eom_id|>",
        functionary_v31_calls, ends=("", "<|eot_id|>", "<|eom_id|>"), string_arguments=True,
        body=lambda text, calls: text + calls,
        template_kwargs={"bos_token": "<|begin_of_text|>"}),
}
# Families whose templates data/templates lacks: per-request grammars and sampling only (their
# formats come from xgrammar's structural tags; test_family_examples.py parses them).
FORMATS_ONLY: dict[str, Family] = {
    "mimo-v2.6": Family(
        "mimo", "", functools.partial(qwen_with, ("<tool_call>", "</tool_call>", "<think>",
                                                  "</think>", "<|im_end|>"), ("<|im_end|>",)),
        "<|im_end|>", mimo_calls, thought="<think>Hmm.</think>", ends=("", "<|im_end|>")),
}


def tool_calls(calls: Sequence[Call]) -> list[ToolCall]:
    return [ToolCall(f"call{i}", name, arguments) for i, (name, arguments) in enumerate(calls)]


def exaone_calls(calls: Sequence[Call]) -> str:
    return "\n".join(f'<tool_call>{{"name": "{name}", "arguments": {dumps(args)}}}</tool_call>'
                     for name, args in calls)


# Families whose templates data/ lacks, rendered by their native renderers (formats from
# xgrammar's structural tags; test_xgrammar_formats.py checks xgrammar accepts the renderings).
NATIVE: dict[str, Family] = {
    "exaone-4.0": Family(
        "exaone", "", functools.partial(qwen_with, (
            "<think>", "</think>", "<tool_call>", "</tool_call>", "[|endofturn|]", "[|system|]",
            "[|user|]", "[|assistant|]", "[|tool|]"), ("[|endofturn|]",)),
        "[|endofturn|]", exaone_calls, thought="Hmm.\n</think>\n\n",
        ends=("", "[|endofturn|]"), reasoning=True, native=True,
        template_kwargs={"enable_thinking": True, "skip_think": False}),
    "minimax-m3": Family(
        "minimax-m3", "", functools.partial(qwen_with, (
            "<mm:think>", "</mm:think>", "[e~[", "]~b]", "]~!b["), ("[e~[",)),
        "[e~[", lambda calls: m3_calls(tool_calls(calls)), thought="Hmm.</mm:think>",
        ends=("", "[e~["), reasoning=True, native=True, values=TYPED_VALUES,
        typed_schemas=True, template_kwargs={"enable_thinking": True}),
    "cohere-command-xml": Family(
        "cohere-xml", "", COHERE_VOCAB, "<|END_OF_TURN_TOKEN|>",
        lambda calls: cofl_calls(tool_calls(calls)), thought="Hmm.<|END_THINKING|>",
        ends=("", "<|END_OF_TURN_TOKEN|>"), reasoning=True, native=True),
}
ALL_FAMILIES = {**FAMILIES, **FORMATS_ONLY, **NATIVE}


def _one_per_grammar(families: dict[str, Family]) -> dict[str, Family]:
    """One family per dialect and options (GLM 4.5 / 4.6 / 4.7 share one grammar): the one
    that reasons when some do, for the request-grammar and sampling tests."""
    chosen: dict[str, tuple[str, Family]] = {}
    for name, family in families.items():
        key = f"{family.dialect} {sorted(family.options.items())}"
        if key not in chosen or (family.thought and not chosen[key][1].thought):
            chosen[key] = (name, family)
    return dict(chosen.values())


GRAMMARS = _one_per_grammar(ALL_FAMILIES)
# What detect_dialect says of every template in data/templates: a family's own, or "unknown"
# (never a guess: GLM-4.6, Seed-OSS and Apriel once passed for Hermes).
TEMPLATE_DIALECTS = {
    "Apertus-8B-Instruct.jinja": "apertus",
    "ByteDance-Seed-OSS.jinja": "seed-oss",
    "Cohere2MoE.jinja": "cohere",
    "CohereForAI-c4ai-command-r-plus-tool_use.jinja": "command-r",
    "DeepSeek-V3.2.jinja": "dsml",
    "GLM-4.6.jinja": "glm",
    "GLM-4.7-Flash.jinja": "glm",
    "Kimi-K2-Instruct.jinja": "kimi",
    "Kimi-K3.jinja": "kimi-k3",
    "MiMo-VL.jinja": "hermes",
    "MiniMax-M2.jinja": "minimax",
    "Mistral-Small-3.2-24B-Instruct-2506.jinja": "mistral",
    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja": "hermes-xml",
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja": "hermes",
    "Qwen-Qwen2.5-7B-Instruct.jinja": "hermes",
    "Qwen-Qwen3-0.6B.Indras-Mirror-variant.jinja": "hermes",
    "Qwen-Qwen3-0.6B.jinja": "hermes",
    "Qwen3-Coder.jinja": "hermes-xml",
    "Qwen3.5-4B.jinja": "hermes-xml",
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja": "deepseek-r1",
    "deepseek-ai-DeepSeek-V3.1.jinja": "deepseek-v3.1",
    "glm_4_5.jinja": "glm",
    "google-gemma-4-31B-it.jinja": "gemma",
    "ibm-granite-granite-3.3-2B-Instruct.jinja": "granite",
    "ibm-granite-granite-4.0.jinja": "hermes",
    "llm-jp-llm-jp-4.1-8b-thinking.jinja": "llmjp-harmony",
    "llm-jp-tokenizer-alpha_2.0-chat_template.jinja": "llmjp-harmony",
    "meetkai-functionary-medium-v3.1.jinja": "functionary-v3.1",
    "meetkai-functionary-medium-v3.2.jinja": "functionary-v3.2",
    "meta-llama-Llama-3.2-3B-Instruct.jinja": "llama3",
    "mistralai-Ministral-3-14B-Reasoning-2512.jinja": "mistral",
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": "mistral",
    "moonshotai-Kimi-K2-Thinking.jinja": "kimi",
    "nvidia-Llama-3_3-Nemotron-Super-49B-v1_5.jinja": "nemotron",
    "openai-gpt-oss-120b.jinja": "harmony",
    "tencent-Hy3.jinja": "hunyuan",
    "unsloth-Apriel-1.5.jinja": "apriel",
    "vllm-tool_chat_template_deepseekr1.jinja": "deepseek-r1",
    "vllm-tool_chat_template_hermes.jinja": "hermes",
    "vllm-tool_chat_template_phi4_mini.jinja": "phi4-mini",
    "vllm-tool_chat_template_llama3.2_pythonic.jinja": "pythonic",
    "vllm-tool_chat_template_llama4_pythonic.jinja": "pythonic",
    "LiquidAI-LFM2.5-8B-A1B.jinja": "pythonic",
    # Other releases and families, added for the chat-template issue (data/templates/README.md):
    # the ones a family already owns are claimed by it without new family code.
    "Aleph-Alpha-Kolibri-1.jinja": "hermes",
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja": "cohere",
    "NVIDIA-Nemotron-Nano-v2.jinja": "nemotron",
    "Qwen-QwQ-32B.jinja": "hermes",
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja": "unknown",
    "deepseek-ai-DeepSeek-V4.jinja": "dsml",
    "ibm-granite-granite-4.1.jinja": "hermes",
    "inclusionAI-Ling-3.0-tiny.jinja": "glm",
    "meta-llama-Llama-3.1-8B-Instruct.jinja": "llama3",
    "moonshotai-Kimi-K2.jinja": "kimi",
    "poolside-Laguna-S-2.1.jinja": "glm",
    "poolside-Laguna-XS.2.jinja": "glm",
    "unsloth-mistral-Devstral-Small-2507.jinja": "mistral",
}
ROUND_TRIPS = settings(max_examples=12, deadline=None, phases=[Phase.explicit, Phase.generate],
                       suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def family_dialect(family: Family):
    if family.native:
        return get_dialect(family.dialect, **family.options)
    template = family.template_text
    return get_dialect(detect_dialect(template), chat_template=template, **family.options)


def test_every_template_is_detected_as_its_family_or_unknown() -> None:
    files = sorted(path.name for path in TEMPLATES_DIR.glob("*.jinja"))
    assert files == sorted(TEMPLATE_DIALECTS)  # a new template is classified here
    detected = {name: detect_dialect((TEMPLATES_DIR / name).read_text()) for name in files}
    assert detected == TEMPLATE_DIALECTS
    assert {family.template: family.dialect for family in FAMILIES.values()}.items() \
        <= TEMPLATE_DIALECTS.items()
    assert detect_dialect("{{ messages }}") == detect_dialect("") == "unknown"


def test_template_options_come_with_the_dialect() -> None:
    """`get_dialect(detect_dialect(t), chat_template=t)` is all a caller needs."""
    def dialect(name: str):
        template = (TEMPLATES_DIR / name).read_text()
        return get_dialect(detect_dialect(template), chat_template=template)

    assert dialect("mistralai-Mistral-Nemo-Instruct-2407.jinja").version == "v3"
    assert dialect("Mistral-Small-3.2-24B-Instruct-2506.jinja").reasoning is False
    assert dialect("mistralai-Ministral-3-14B-Reasoning-2512.jinja").reasoning is None
    assert dialect("GLM-4.7-Flash.jinja").reasoning is True  # its prompt opens <think>
    assert dialect("GLM-4.6.jinja").reasoning is None  # the model writes <think>
    assert dialect("MiniMax-M2.jinja").reasoning is True
    assert dialect("Qwen-Qwen2.5-7B-Instruct.jinja").reasoning is False  # no <think>
    assert dialect("DeepSeek-V3.2.jinja").version == "v3.2"


READ_BACK = {**FAMILIES, **NATIVE}


@pytest.mark.parametrize("name", READ_BACK)
@ROUND_TRIPS
@given(data=st.data())
def test_template_turns_read_back(name: str, data: st.DataObject) -> None:
    """The template's (or native renderer's) rendering of a random turn parses to its calls,
    content and reasoning, whole and in chunks, and is accepted token by token by the request's
    strict grammar."""
    assert_template_turn_reads_back(READ_BACK[name], data)


def assert_template_turn_reads_back(family: Family, data: st.DataObject) -> None:
    """A random turn as `family`'s template (or native renderer) writes it reads back through
    the dialect detected for the template: whole, in chunks, and token by token under the
    request's strict grammar."""
    tools, message, calls, content, reasoning = data.draw(turns(family))
    output = rendered_turn(family, tools, message)
    request = request_for(tools, family)
    dialect = family_dialect(family)
    expected = (calls, content, reasoning)
    assert summary(dialect.parse(output, request)) == expected, output
    cuts = data.draw(st.lists(st.integers(0, len(output)), max_size=8))
    assert_stream_matches(dialect, output, cuts, request)

    vocab, encode = family.vocab()
    ids = encode(output)
    matcher = compiler(vocab).compile(dialect.grammar(request)).matcher()
    for position, token in enumerate(ids):
        assert matcher.accept_token(token), (output, vocab.token_bytes[token], position)
    assert matcher.is_terminated() or matcher.is_accepting(), output
    assert summary(dialect.parse(ids, request, vocab, trusted=True)) == expected


@pytest.mark.parametrize(("name", "reasoning"), [
    (name, reasoning) for name, family in GRAMMARS.items()
    for reasoning in ((True, False) if family.thought else (False,))])
@pytest.mark.parametrize("parallel", [True, False])
@pytest.mark.parametrize("choice", range(len(TOOL_CHOICES)))
def test_request_grammar_accepts_exactly_what_the_request_allows(name: str, reasoning: bool,
                                                                   parallel: bool,
                                                                   choice: int) -> None:
    family = GRAMMARS[name]
    request = ChatRequest(tools=TOOLS, tool_choice=TOOL_CHOICES[choice],
                          parallel_tool_calls=parallel,
                          chat_template_kwargs={"enable_thinking": reasoning})
    options = {**family.options, "reasoning": True} if family.thought else family.options
    dialect = get_dialect(family.dialect, **options)  # the request's flag decides
    assert_request_grammar(dialect, request, reasoning,
                           lambda parts: family.render(parts, SHAPE_CALLS), family.thought,
                           family.ends)


@pytest.mark.parametrize("name", GRAMMARS)
@pytest.mark.parametrize(("choice", "parallel"), [(0, True), (1, False), (3, True)])
def test_sampling_under_the_mask_yields_valid_calls(name: str, choice: int,
                                                    parallel: bool) -> None:
    family = GRAMMARS[name]
    vocab, _ = family.vocab()
    request = ChatRequest(tools=TOOLS, tool_choice=TOOL_CHOICES[choice],
                          parallel_tool_calls=parallel,
                          chat_template_kwargs={"enable_thinking": False})
    assert_sampling_obeys(get_dialect(family.dialect, **family.options), request, vocab,
                          budget=200)


def _cut_off(dialect: Dialect, request: ChatRequest, output: str) -> bool:
    """Whether the lenient grammar reads every byte of `output` but is left inside a call."""
    parser = dialect.parse_grammar(request).stream_parser()
    try:
        parser.feed(output)
    except ParseError:
        return False
    try:
        parser.finish()
    except ParseError:
        return True
    return False


UNREADABLE = settings(max_examples=25, deadline=None,
                     suppress_health_check=[HealthCheck.filter_too_much])


@pytest.mark.parametrize("name", GRAMMARS)
@UNREADABLE
@given(data=st.data())
def test_an_unreadable_call_block_is_content_byte_for_byte(name: str,
                                                          data: st.DataObject) -> None:
    """Text, then a call block with junk written into it. Unless the junk landed where the
    lenient grammar reads anything (a string value) or left a call open at the end (a cut-off
    call, dropped), no call is read and everything after the text is content, byte for byte:
    the block's opening tag and the framing before it included, whether the grammar fails on
    the block or reads it as text."""
    family = GRAMMARS[name]
    output = family.render(["text", "weather2"], SHAPE_CALLS)
    block = family.calls([SHAPE_CALLS["weather2"]])
    start = output.index(block)
    cut = start + data.draw(st.integers(1, len(block) - 1), label="cut")
    junk = data.draw(st.sampled_from(["\x00", "}}]]", "<</>>"]), label="junk")
    output = output[:cut] + junk + output[cut:]
    request = ChatRequest(tools=TOOLS, chat_template_kwargs={"enable_thinking": False})
    dialect = get_dialect(family.dialect, **family.options)
    message = dialect.parse(output, request)
    assume(not message["tool_calls"] and not _cut_off(dialect, request, output))
    text_end = output.index(TEXT) + len(TEXT)
    assert message["content"] == TEXT + output[text_end:], output


@pytest.mark.parametrize("parallel", [True, False])
@pytest.mark.parametrize("choice", range(len(TOOL_CHOICES)))
def test_phi4_mini_bare_calls_obey_the_request(choice: int, parallel: bool) -> None:
    """The bare form (GRAMMARS holds the functools one): as a whole turn, the strict grammar
    accepts exactly the calls the request allows, and rejects calls that break their schema;
    after text it is text."""
    family = FAMILIES["phi4-mini-bare"]
    request = ChatRequest(tools=TOOLS, tool_choice=TOOL_CHOICES[choice],
                          parallel_tool_calls=parallel)
    dialect = get_dialect(family.dialect)
    grammar = dialect.grammar(request)
    for label, parts in SHAPES.items():
        want = obeys(request, parts, False, False, calls_alone=True)
        for end in family.ends:
            output = family.render(parts, SHAPE_CALLS) + end
            assert grammar.matches(output) == want, (label, output)
            if want:
                assert dialect.parse(output, request, trusted=True, seed=1) == \
                    dialect.parse(output, request, seed=1)
    for bad in BAD_CALLS:
        assert not grammar.matches(family.render([bad], SHAPE_CALLS)), bad


@UNREADABLE
@given(data=st.data())
def test_an_unreadable_bare_phi4_mini_call_list_is_content_byte_for_byte(
        data: st.DataObject) -> None:
    """Junk written into a bare call list (two calls, as the template writes them): unless it
    landed in a string value or left a call open, no call is read and the whole turn is
    content, byte for byte."""
    output = phi4_mini_bare_calls([SHAPE_CALLS["weather2"], SHAPE_CALLS["time"]])
    cut = data.draw(st.integers(1, len(output) - 1), label="cut")
    junk = data.draw(st.sampled_from(["\x00", "}}]]", "<</>>"]), label="junk")
    output = output[:cut] + junk + output[cut:]
    request = ChatRequest(tools=TOOLS)
    dialect = get_dialect("phi4-mini")
    message = dialect.parse(output, request)
    assume(not message["tool_calls"] and not _cut_off(dialect, request, output))
    assert message["content"] == output, output


def test_qwen_stand_in_has_the_family_specials() -> None:
    vocab, encode = qwen_with(("<a>", "</a>"), ("</a>",))
    assert encode("x<a>y</a>")[1] == vocab.special_ids["<a>"] == 151643
    assert vocab.special_ids["</a>"] in vocab.eos_ids
    assert deepseek()[0].special_ids["<｜tool▁calls▁begin｜>"] > 0
