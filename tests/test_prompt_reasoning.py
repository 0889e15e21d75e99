"""Whether an output starts inside reasoning, read from the rendered generation prompt (issue 36):
the real templates of data/templates rendered with transformers-style switches, for family
dialects and derived ones alike. The prompt's tail is what the model continues, so it decides,
however the template spells its switches (`enable_thinking`, `reasoning_effort`, `thinking`,
`reasoning`) and whichever it ignores."""

from __future__ import annotations

from typing import Any

import pytest
from test_dialect_base import TOOLS

from pegmask.bench.data import TEMPLATES_DIR
from pegmask.dialects import DERIVED, ChatRequest, Dialect, detect_dialect, get_dialect

KOLIBRI = "Aleph-Alpha-Kolibri-1.jinja"
KOLIBRI_OFF = ("Reasoning is disabled. Proceed straight to answering according to the user's "
               "instructions.")
HISTORY = [{"role": "system", "content": "You are helpful."},
           {"role": "user", "content": "Please help."}]
DEEPSEEK_KWARGS = {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"}


def _dialect(name: str, derived: bool) -> Dialect:
    template = (TEMPLATES_DIR / name).read_text(encoding="utf-8")
    return get_dialect(DERIVED if derived else detect_dialect(template), chat_template=template)


def _request(dialect: Dialect, kwargs: dict[str, Any]) -> ChatRequest:
    """The request as the engine builds it: the switches, and the prompt they rendered."""
    prompt = dialect.render(HISTORY, tools=TOOLS, **kwargs)
    return ChatRequest(tools=TOOLS, chat_template_kwargs=kwargs, generation_prompt=prompt)


# (template, derived dialect?, template switches, reasoning mode: True the output starts inside
# reasoning, False none, None the model decides)
CASES = [
    # Kolibri-1: `reasoning_effort` wins and only "none" turns thinking off, else a literal
    # `enable_thinking: false` does; on, its prompt opens nothing (the model writes <think>)
    (KOLIBRI, False, {}, None),
    (KOLIBRI, False, {"enable_thinking": True}, None),
    (KOLIBRI, False, {"enable_thinking": False}, False),
    (KOLIBRI, False, {"enable_thinking": "false"}, None),  # not a literal false
    (KOLIBRI, False, {"reasoning_effort": "low", "enable_thinking": False}, None),
    (KOLIBRI, False, {"reasoning_effort": "none", "enable_thinking": True}, False),
    (KOLIBRI, True, {}, None),
    (KOLIBRI, True, {"enable_thinking": False}, False),
    (KOLIBRI, True, {"reasoning_effort": "none"}, False),
    # Qwen3: an empty think block when off; it knows no `reasoning_effort`, which still asks
    # for no reasoning where the prompt says nothing
    ("Qwen-Qwen3-0.6B.jinja", False, {}, None),
    ("Qwen-Qwen3-0.6B.jinja", False, {"enable_thinking": False}, False),
    ("Qwen-Qwen3-0.6B.jinja", False, {"reasoning_effort": "none"}, False),
    ("Qwen-Qwen3-0.6B.jinja", False, {"reasoning_effort": "high"}, None),
    ("Qwen-Qwen3-0.6B.jinja", True, {"enable_thinking": False}, False),
    # Qwen3.5 opens <think> in its prompt, derived dialect and family alike
    ("Qwen3.5-4B.jinja", True, {}, True),
    ("Qwen3.5-4B.jinja", True, {"enable_thinking": False}, False),
    ("Qwen3.5-4B.jinja", False, {}, True),
    # R1 distill: the prompt always opens <think>; the template has no switch to turn it off
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", False, DEEPSEEK_KWARGS, True),
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", False,
     {**DEEPSEEK_KWARGS, "enable_thinking": False}, True),
    # DeepSeek V3.1 spells it `thinking`, and closes reasoning in the prompt when off
    ("deepseek-ai-DeepSeek-V3.1.jinja", False, DEEPSEEK_KWARGS, False),
    ("deepseek-ai-DeepSeek-V3.1.jinja", False, {**DEEPSEEK_KWARGS, "thinking": True}, True),
    # Command A spells it `reasoning` (or reasoning_effort "none") and ignores enable_thinking
    ("Cohere2MoE.jinja", False, {"enable_thinking": False}, True),
    ("Cohere2MoE.jinja", False, {"reasoning": False}, False),
    ("Cohere2MoE.jinja", False, {"reasoning_effort": "none"}, False),
]


@pytest.mark.parametrize(("name", "derived", "kwargs", "mode"), CASES)
def test_the_prompt_says_whether_the_output_starts_in_reasoning(
        name: str, derived: bool, kwargs: dict[str, Any], mode: bool | None) -> None:
    dialect = _dialect(name, derived)
    assert dialect.reasoning_mode(_request(dialect, kwargs)) is mode


def test_kolibri_thinking_off_prefills_an_empty_block_and_says_so() -> None:
    """Off, Kolibri-1's prompt holds its no-reasoning sentence and ends with an empty think
    block: the strict grammar then has no reasoning, and an answer parses as content."""
    dialect = _dialect(KOLIBRI, derived=False)
    off = _request(dialect, {"reasoning_effort": "none"})
    assert off.generation_prompt is not None
    assert KOLIBRI_OFF in off.generation_prompt
    assert off.generation_prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    grammar = dialect.grammar(off)
    assert grammar.matches("Hello.<|im_end|>")
    assert not grammar.matches("<think>\nHmm.\n</think>\n\nHello.<|im_end|>")
    on = _request(dialect, {"reasoning_effort": "high"})
    assert KOLIBRI_OFF not in (on.generation_prompt or "")
    message = dialect.parse("<think>\nHmm.\n</think>\n\nHello.<|im_end|>", on)
    assert (message["reasoning_content"], message["content"]) == ("Hmm.", "Hello.")


def test_without_a_prompt_the_switches_decide() -> None:
    """A request whose prompt is not known (a caller of the dialect API) reads the switches."""
    dialect = _dialect(KOLIBRI, derived=False)
    assert dialect.reasoning_mode(ChatRequest(chat_template_kwargs={"enable_thinking": False})) \
        is False
    assert dialect.reasoning_mode(ChatRequest()) is None


def test_the_engine_reads_the_prompt_it_rendered() -> None:
    """The engine hands the prompt it rendered to the dialect: DeepSeek R1's template opens
    <think> whatever `enable_thinking` says, so the output's grammar starts inside reasoning."""
    from pegmask.engine.engine import Engine

    template = (TEMPLATES_DIR / "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja").read_text()
    engine = Engine(chat_template=template, compile_workers=0, prewarm=False)
    try:
        request = engine.request([{"role": "user", "content": "Hi."}],
                                 chat_template_kwargs={"enable_thinking": False})
        staged = engine._stage(request)
        chat = staged.request.chat
        assert chat.generation_prompt is not None and chat.generation_prompt.endswith("<think>\n")
        assert engine.dialect is not None and engine.dialect.reasoning_mode(chat) is True
        assert staged.grammar is not None
        assert staged.grammar.matches("Hmm.\n</think>\n\nHello.")
    finally:
        engine.close()
