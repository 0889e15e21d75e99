"""The `pythonic` dialect: tool calls as a Python list of calls by keyword,
`[get_weather(city="Paris", days=3), ...]`, values as Python literals (pythonic.peg).

Two framings, both read off the template (`template_options`): a bare list that is the whole
turn (Llama 3.2's and Llama 4's pythonic templates, vLLM's `pythonic` parser: an answer cannot
start with `[`, `calls_alone`), or a list between a start and an end token, after any content
(LFM2's `<|tool_call_start|>[...]<|tool_call_end|>`). Arguments stream as JSON one parameter at
a time (`python_literals.read_value` converts each value as it closes); the strict grammar types
each value by the tool's JSON Schema, written as a Python literal (`python_literals`).

Reasoning (`<think>...</think>`) is detected where the template writes `<think>`, else off.
Templates that write past calls in another form than the model's (Llama 3.2's writes strings
unquoted, Llama 4's quotes every value) get them written into the turn's content as the model
writes them (`template_inputs`); whether a template's own form reads back is checked on a
probe call (`faithful`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Any

from pegmask.dialects.base import TurnDialect, peg_literal
from pegmask.dialects.python_literals import call_list, python_params, read_calls, read_value
from pegmask.dialects.rendering import calls_in_content
from pegmask.dialects.textdiff import TOKEN, first_token

# The probe call as a pythonic template writes it (its value quoted or not).
_PROBE_CALL = re.compile(r"\[pegmask_probe\(pegmask_arg=")
# What ends a turn where the template does not say (Llama 3's, Llama 4's, ChatML's).
DEFAULT_EOS = ("<|eot_id|>", "<|eom_id|>", "<|eot|>", "<|im_end|>")
# Tokens that also end a turn where the template ends one with the key (Llama 3 ends a turn
# of calls with <|eom_id|> where its prompt says "Environment: ipython").
_ALSO_ENDS = {"<|eot_id|>": ("<|eom_id|>",)}
# A call whose values a faithful template writes back as they are.
_FAITHFUL_ARGS = {"s": "a b", "n": -2, "f": 0.5, "t": True, "z": None, "l": [1, "x"],
                  "d": {"k": [False, None]}}


class PythonicDialect(TurnDialect):
    name = "pythonic"
    priority = 185
    probe = (_PROBE_CALL,)
    peg_file = "pythonic.peg"
    value_readers = {"python": read_value}

    def __init__(self, *, call_tokens: Sequence[str] = (), eos: Sequence[str] = DEFAULT_EOS,
                 rewrite_calls: bool = False, **options: Any):
        """`call_tokens`: the start and end token around the list (none: a bare list, the
        whole turn); `eos`: what ends a turn; `rewrite_calls`: the template's own form of past
        calls is not the model's, so they are written into the content."""
        options.setdefault("reasoning", False)
        super().__init__(**options)
        if call_tokens and len(call_tokens) != 2:
            raise ValueError("pythonic: call_tokens are a start and an end token")
        self.call_tokens = tuple(call_tokens)
        self.eos = tuple(eos)
        self.rewrite_calls = rewrite_calls
        self.reasons = self.reasoning is not False
        self.calls_alone = not self.call_tokens
        self.answer_rule = "answer" if self.calls_alone else "text"

    @classmethod
    def template_options(cls, template: str) -> dict[str, Any]:
        """The framing tokens, the end of a turn and whether past calls read back, from the
        probe rendering; reasoning detected where the template writes `<think>`."""
        from pegmask.dialects.registry import generation_prompt, probe_renderings

        options: dict[str, Any] = {"reasoning": None if "<think>" in template else False}
        for text in probe_renderings(template):
            found = _PROBE_CALL.search(text)
            if found is None:
                continue
            # a token right before the list that the generation prompt does not end with
            opening = re.search("(" + TOKEN.pattern + r")\Z", text[:found.start()])
            after = text[text.find(")]", found.end()) + 2:]
            close = first_token(after)
            if opening is not None and close is not None \
                    and not generation_prompt(template).rstrip().endswith(opening.group()):
                options["call_tokens"] = (opening.group(), close)
                after = after.lstrip()[len(close):]
            end = first_token(after)
            if end is not None:
                options["eos"] = (end, *_ALSO_ENDS.get(end, ()))
            options["rewrite_calls"] = not faithful(template)
            break
        return options

    def substitutions(self, strict: bool) -> dict[str, str]:
        if self.call_tokens:
            start, end = (f"token({peg_literal(token)})" for token in self.call_tokens)
            framing = {"open": f'trigger({start}) ws "["', "close": f"ws {end}"}
        else:
            framing = {"open": 'trigger("[")', "close": '""'}
        eos = " | ".join(f"token({peg_literal(token)})" for token in self.eos)
        return {**framing, "eos": eos or '""'}

    def param_rules(self, sections: dict[str, str], index: int, schema: dict[str, Any],
                    grammar_of: Callable[[Any], Any]) -> tuple[str, str, dict[str, Any]]:
        """Keyword arguments in schema order, each a Python literal typed by its schema."""
        return python_params(index, schema, "python")

    def template_inputs(self, messages: Any, tools: list[dict[str, Any]] | None
                        ) -> tuple[Any, list[dict[str, Any]] | None]:
        if not self.rewrite_calls:
            return messages, tools
        start, end = self.call_tokens or ("", "")
        return calls_in_content(messages, lambda calls: start + call_list(
            [(call.name, _arguments(call.arguments)) for call in calls]) + end), tools


def _arguments(arguments: dict[str, Any] | str) -> dict[str, Any]:
    value = json.loads(arguments) if isinstance(arguments, str) else arguments
    if not isinstance(value, dict):
        raise ValueError("pythonic: a call's arguments are an object")
    return value


def faithful(template: str) -> bool:
    """Whether `template` writes a past call so that it reads back as it was (strings quoted,
    other values as Python literals)."""
    from pegmask.dialects.templating import render_chat_template

    call = {"id": "pgmprobe1", "type": "function",
            "function": {"name": "pegmask_probe", "arguments": _FAITHFUL_ARGS}}
    messages = [{"role": "user", "content": "Question?"},
                {"role": "assistant", "content": "", "tool_calls": [call]}]
    try:
        text = render_chat_template(template, messages, add_generation_prompt=False,
                                    bos_token="", eos_token="")
    except Exception:  # noqa: BLE001 - a template may fail in any way
        return False
    start = text.find("[pegmask_probe(")
    end = text.find(")]", start)
    if start < 0 or end < 0:
        return False
    try:
        return read_calls(text[start:end + 2]) == [("pegmask_probe", _FAITHFUL_ARGS)]
    except ValueError:
        return False
