"""The `minimax-m3` dialect: MiniMax M3 calls, namespace-prefixed XML all the way down
(`]<]minimax[>[<tool_call>` / `<invoke name=...>`, one element per argument, an object's
members and an array's `<item>`s as nested elements; minimax_m3.peg).

Strings are raw text (a constrained string's schema applies to that text), other scalars JSON.
The strict grammar is written from each tool's schema here (`M3Values`); `allOf`, `not`, `if`
and `patternProperties` have no form here and are refused with a clear error. Parsed values
are typed by the schema (`read_value`: the text `7` is a number for an integer, a string for a
string), and guessed where it says nothing (JSON, else a Python literal, else a string; an
element list of `item`s is an array). ``reasoning``: `<mm:think>` opened by the prompt (True),
none (False), or the model's choice, a whole block or a lone `</mm:think>` (None, M3's adaptive
mode and the default).

Native renderer ``minimax-m3``: no M3 template is public to pegmask, so the turns are
MiniMax-M2's template's (`]~!b[]~b]system`, `]~b]ai`, `]~b]tool` with `<response>` results,
`[e~[` ends a turn) and the calls and reasoning xgrammar's minimax_m3 format. Detection: the
probe call written as `]<]minimax[>[<invoke name="pegmask_probe">`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from pegmask.dialects.base import TurnDialect, peg_literal, separated
from pegmask.dialects.history import History, Message, ToolCall
from pegmask.dialects.rendering import (
    TurnFormat,
    dumps,
    render_turns,
    split_reasoning,
    thinking_on,
)
from pegmask.dialects.replay import ReplayMemory
from pegmask.dialects.schema_values import SchemaValueRules
from pegmask.dialects.values import INVALID, python_literal, schema_type

NS = "]<]minimax[>["
THINK_OPEN, THINK_CLOSE = "<mm:think>", "</mm:think>"
EOS = "[e~["
ASSISTANT = "]~b]ai\n"


# ------------------------------------------------------------------------------ strict grammar
def element(key: str, value: str) -> str:
    """PEG of one `]<]minimax[>[<key>value]<]minimax[>[</key>` element."""
    tag = peg_literal(key)
    return f'NS "<" {tag} ">" {value} NS "</" {tag} ">"'


class M3Values(SchemaValueRules):
    """MiniMax M3 values: raw text, or nested namespace-prefixed elements (`<item>` for array
    items, the key for object members)."""

    family, syntax, any_value, raw_until = "minimax-m3", "MiniMax M3 XML", "mvalue", NS

    def literal(self, value: Any) -> str:
        return literal(value)

    def array(self, schema: dict[str, Any]) -> str:
        item = self.rule("ws " + element("item", self.value(schema.get("items", True))))
        low, high = int(schema.get("minItems", 0)), schema.get("maxItems")
        return f"({item}){{{low},{'' if high is None else int(high)}}} ws"

    def object(self, schema: dict[str, Any]) -> str:
        properties = schema.get("properties")
        if not isinstance(properties, dict) or not properties:
            return "ws" if schema.get("additionalProperties") is False else "(ws melement)* ws"
        return f"ws {self.members(properties, schema.get('required'))} ws"

    def members(self, properties: dict[str, Any], required: Any) -> str:
        """The declared properties in order (required ones, then each optional one at most
        once), separated by whitespace."""
        needed, optional = [], []
        for key, sub in properties.items():
            name = self.rule(element(key, self.value(sub)))
            (needed if key in set(required or ()) else optional).append(name)
        return separated(needed, optional, "ws")


def literal(value: Any) -> str:
    """A JSON value as the PEG of its M3 spelling."""
    if isinstance(value, str):
        return peg_literal(value)
    if isinstance(value, list):
        return "(" + " ".join(f"ws {element('item', literal(v))}" for v in value) + " ws)"
    if isinstance(value, dict):
        return "(" + " ".join(f"ws {element(k, literal(v))}" for k, v in value.items()) + " ws)"
    return peg_literal(json.dumps(value))


# ------------------------------------------------------------------------------ reading values
Node = str | list[tuple[str, "Node"]]


def read_value(text: str, schema: Any = None) -> Any:
    """The JSON value of an M3 value (raw text or elements) typed by `schema` (guessed where it
    says nothing); ValueError when the elements do not nest."""
    node, end = _parse(text, 0)
    if end != len(text):
        raise ValueError(f"trailing text in a MiniMax M3 value: {text[end:]!r}")
    return _typed(node, schema)


def _skip(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


def _opens(text: str, i: int) -> bool:
    return text.startswith(NS + "<", i) and not text.startswith(NS + "</", i)


def _parse(text: str, i: int) -> tuple[Node, int]:
    """The value at `i`: elements (whitespace around them dropped), else raw text up to the
    next namespace."""
    j = _skip(text, i)
    if not _opens(text, j):
        end = text.find(NS, i)
        end = len(text) if end < 0 else end
        return text[i:end], end
    elements: list[tuple[str, Node]] = []
    while _opens(text, j):
        start = j + len(NS) + 1
        close_at = text.find(">", start)
        if close_at < 0:
            raise ValueError(f"an unclosed MiniMax M3 tag at {text[j:]!r}")
        key = text[start:close_at]
        node, j = _parse(text, close_at + 1)
        close = f"{NS}</{key}>"
        if not text.startswith(close, j):
            raise ValueError(f"{close!r} expected at {text[j:]!r}")
        elements.append((key, node))
        j = _skip(text, j + len(close))
    return elements, j


def _typed(node: Node, schema: Any) -> Any:
    kind = schema_type(schema)
    if isinstance(node, str):
        if kind == "string":
            return node
        if kind in ("object", "array") and not node.strip():
            return {} if kind == "object" else []
        return _scalar(node)
    if kind == "array" or (kind is None and all(key == "item" for key, _ in node)
                           and not (isinstance(schema, dict) and "properties" in schema)):
        items = schema.get("items") if isinstance(schema, dict) else None
        return [_typed(child, items) for _, child in node]
    properties = schema.get("properties") if isinstance(schema, dict) else None
    properties = properties if isinstance(properties, dict) else {}
    return {key: _typed(child, properties.get(key)) for key, child in node}


def _scalar(text: str) -> Any:
    """Untyped raw text: JSON, else a Python literal, else the text itself."""
    try:
        return json.loads(text)
    except ValueError:
        value = python_literal(text.strip())
        return text if value is INVALID else value


# ------------------------------------------------------------------------------ writing values
def m3_text(value: Any) -> str:
    """A JSON value written the M3 way: a string raw, other scalars JSON, objects and arrays
    as elements on lines of their own."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        return "".join(f"\n{NS}<{k}>{m3_text(v)}{NS}</{k}>" for k, v in value.items()) \
            + ("\n" if value else "")
    if isinstance(value, list):
        return "".join(f"\n{NS}<item>{m3_text(v)}{NS}</item>" for v in value) \
            + ("\n" if value else "")
    return dumps(value)


def m3_calls(calls: Sequence[ToolCall]) -> str:
    """A turn's calls as one `<tool_call>` block (raw, non-object arguments written as is)."""
    invokes = "".join(
        f'{NS}<invoke name="{call.name}">'
        + (call.arguments if isinstance(call.arguments, str) else m3_text(call.arguments))
        + f"{NS}</invoke>\n" for call in calls)
    return f"{NS}<tool_call>\n{invokes}{NS}</tool_call>"


# ------------------------------------------------------------------------------ prompts
_TOOLS_HEAD = (
    "\n\n# Tools\nYou may call one or more tools to assist with the user query.\nHere are the "
    "tools available in JSONSchema format:\n\n<tools>\n"
)
_TOOLS_TAIL = (
    "</tools>\n\nWhen making tool calls, use XML format to invoke tools and pass parameters; "
    "an object's members and an array's items are nested elements:\n"
    f"\n{NS}<tool_call>\n{NS}<invoke name=\"tool-name-1\">\n{NS}<param-key-1>param-value-1"
    f"{NS}</param-key-1>\n{NS}<param-key-2>\n{NS}<item>item-value-1{NS}</item>\n{NS}"
    f"</param-key-2>\n{NS}</invoke>\n{NS}</tool_call>"
)


def _system(text: str | None, tools: list[dict[str, Any]]) -> str:
    head = text or "You are a helpful assistant."
    if tools:
        declared = "".join(f"<tool>{dumps(tool['function'])}</tool>\n" for tool in tools)
        head += _TOOLS_HEAD + declared + _TOOLS_TAIL
    return f"]~!b[]~b]system\n{head}{EOS}\n"


def _assistant(message: Message, show: bool) -> str:
    reasoning, content = split_reasoning(message)
    thought = f"{THINK_OPEN}{reasoning}{THINK_CLOSE}" if show and reasoning else ""
    calls = m3_calls(message.tool_calls) if message.tool_calls else ""
    return thought + content + calls


def _results(messages: list[Message]) -> str:
    return "]~b]tool" + "".join(f"\n<response>{m.content}</response>" for m in messages) \
        + f"{EOS}\n"


FORMAT = TurnFormat(
    system=_system,
    turn=lambda role, text: f"]~b]{role}\n{text}",
    header=ASSISTANT,
    assistant=_assistant,
    results=_results,
    opening=lambda thinking: {True: THINK_OPEN, False: THINK_OPEN + THINK_CLOSE,
                              None: ""}[thinking],
    eos=EOS,
    end=EOS + "\n",
)


def render_minimax_m3(
    history: History | Iterable[Mapping[str, Any]],
    tools: Iterable[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    *,
    continue_final_message: bool = False,
    replay: ReplayMemory | None = None,
    enable_thinking: bool | None = None,
    reasoning_effort: str | None = None,
) -> str:
    """MiniMax M3 prompt. The generation prompt opens `<mm:think>` (thinking on), closes an
    empty block (off), or leaves the choice to the model (adaptive: neither given); reasoning
    after the last user message is written back, as M2's template does."""
    return render_turns(
        history, tools, FORMAT, add_generation_prompt=add_generation_prompt,
        continue_final_message=continue_final_message, replay=replay,
        thinking=thinking_on(None, enable_thinking, reasoning_effort),
        show_reasoning=lambda i, last_user, count: i > last_user)


class MiniMaxM3Dialect(TurnDialect):
    name = "minimax-m3"
    priority = 90
    probe = (f'{NS}<invoke name="pegmask_probe">',)
    peg_file = "minimax_m3.peg"
    raw_until = NS
    word_stop = NS
    renderer = render_minimax_m3
    turn_header = ASSISTANT
    value_readers = {"m3": read_value}

    def reasoning_mode(self, request: Any) -> bool | None:
        """On for a literal ``enable_thinking: true`` too (the native prompt opens `<mm:think>`),
        where the prompt is not known to say so itself."""
        if request is not None and request.generation_prompt is None \
                and "reasoning_effort" not in request.chat_template_kwargs \
                and request.chat_template_kwargs.get("enable_thinking") is True:
            return True
        return super().reasoning_mode(request)

    def param_rules(self, sections: dict[str, str], index: int, schema: dict[str, Any],
                    grammar_of: Callable[[Any], Any]) -> tuple[str, str, dict[str, Any]]:
        """One element rule per declared property: strings captured raw, other values as M3
        XML read back after parsing."""
        properties = schema.get("properties")
        if not isinstance(properties, dict) or not properties:
            return "", "any_params", {}
        values = M3Values(f"m_{index}", schema)
        required = set(schema.get("required") or ())
        text, needed, optional = "", [], []
        for j, (key, sub) in enumerate(properties.items()):
            plain = isinstance(sub, dict) and schema_type(sub) == "string" \
                and not any(k in sub for k in ("anyOf", "oneOf"))
            value = f"@string:{values.string(sub)}" if plain else f"@m3:({values.value(sub)})"
            tag = peg_literal(key)
            text += f'p_{index}_{j} = @param:(NS "<" @key:{tag} ">" {value} NS "</" {tag} ">")\n'
            (needed if key in required else optional).append(f"p_{index}_{j}")
        text += "".join(rule + "\n" for rule in values.rules)
        return text, separated(needed, optional, "param_sep"), values.schemas
