"""The `cohere-xml` dialect: Cohere Command's XML tool calls, a `<cofl:tool_calls>` block of
`<cofl:tool_call id="N" name="NAME">` calls whose arguments are `<cofl:value name="KEY"
type="raw|json|dict|list">` elements (cohere_xml.peg).

Its own dialect, not a version of `cohere` (Command R7B / A's `<|START_ACTION|>` JSON list):
the two share only the thinking and turn tokens; calls, values and their reading differ.
Every value says its type, so parsing needs no schema (`read_value`): `raw` a string as
written, `json` a number, boolean or null, `dict` an object of named members, `list` an array of
unnamed items. The strict grammar is written from each tool's schema (`CoflValues`); `allOf`,
`not`, `if` and `patternProperties` are refused with a clear error. ``reasoning`` defaults to
True (xgrammar's default: the prompt ends with `<|START_THINKING|>`).

Native renderer ``cohere-xml``: Command A's turns (Cohere2MoE's template in data/templates:
`<|START_OF_TURN_TOKEN|>` + role token, tools declared as a JSON list under "# Available
Tools", results as a `<|START_TOOL_RESULT|>` JSON list) with the calls in xgrammar's cohere
format; no template of an XML-calling Command model is public to pegmask. Detection: the probe
call written as `<cofl:tool_call ... name="pegmask_probe">`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from pegmask.dialects.base import TurnDialect, peg_literal, separated
from pegmask.dialects.history import History, Message, ToolCall
from pegmask.dialects.rendering import TurnFormat, dumps, render_turns, split_reasoning, thinking_on
from pegmask.dialects.replay import ReplayMemory
from pegmask.dialects.schema_values import SchemaValueRules
from pegmask.dialects.values import schema_type

CLOSE = "</cofl:value>"
THINK_OPEN, THINK_CLOSE = "<|START_THINKING|>", "<|END_THINKING|>"
EOS = "<|END_OF_TURN_TOKEN|>"
CHATBOT = "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"
_PROBE_CALL = re.compile(r'<cofl:tool_call id="\d+" name="pegmask_probe">')
_ENTITIES = (("&", "&amp;"), ("<", "&lt;"), (">", "&gt;"), ('"', "&quot;"))


def escape_name(name: str) -> str:
    """A member name as an attribute value (the four entities xgrammar's grammar allows)."""
    for char, entity in _ENTITIES:
        name = name.replace(char, entity)
    return name


def unescape_name(name: str) -> str:
    for char, entity in reversed(_ENTITIES):
        name = name.replace(entity, char)
    return name


# ------------------------------------------------------------------------------ strict grammar
class CoflValues(SchemaValueRules):
    """Cohere XML values, from the type attribute's value on: `raw">` text, `json">` scalars,
    `list">` and `dict">` of nested `<cofl:value>` elements."""

    family, syntax, any_value, raw_until = "cohere-xml", "Cohere XML", "cvalue", CLOSE

    def literal(self, value: Any) -> str:
        return peg_literal(cofl_body(value))

    def string_value(self, schema: dict[str, Any]) -> str:
        return f'"raw\\">" {self.string(schema)}'

    def scalar(self, schema: dict[str, Any], kind: str) -> str:
        return f'"json\\">" ws {self._json(schema)} ws'

    def array(self, schema: dict[str, Any]) -> str:
        item = self.rule(f'"<cofl:value type=\\"" {self.value(schema.get("items", True))} CLOSE')
        low, high = int(schema.get("minItems", 0)), schema.get("maxItems")
        return f'"list\\">" ws ({item} ws){{{low},{"" if high is None else int(high)}}}'

    def object(self, schema: dict[str, Any]) -> str:
        properties = schema.get("properties")
        if not isinstance(properties, dict) or not properties:
            free = "" if schema.get("additionalProperties") is False else " (cmember ws)*"
            return f'"dict\\">" ws{free}'
        required = set(schema.get("required") or ())
        needed, optional = [], []
        for key, sub in properties.items():
            name = self.rule(f'"<cofl:value name=\\"" {peg_literal(escape_name(key))} '
                             f'"\\" type=\\"" {self.value(sub)} CLOSE')
            (needed if key in required else optional).append(name)
        return f'"dict\\">" ws {separated(needed, optional, "ws")} ws'


# ------------------------------------------------------------------------------ values
def read_value(text: str, schema: Any = None) -> Any:
    """The JSON value of a typed value written from its type on (`raw">Tokyo`, `dict">...`);
    ValueError when it is none. `schema` is not needed: every value says its type."""
    value, end = _read(text, 0)
    if _skip(text, end) != len(text):
        raise ValueError(f"trailing text in a Cohere XML value: {text[end:]!r}")
    return value


def _skip(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


def _read(text: str, i: int) -> tuple[Any, int]:
    """The value whose type starts at `i`, and where its closing tag starts."""
    kind = next((k for k in ("raw", "json", "dict", "list") if text.startswith(k + '">', i)), None)
    if kind is None:
        raise ValueError(f"no Cohere XML type at {text[i:i + 20]!r}")
    i += len(kind) + 2
    if kind in ("raw", "json"):
        end = text.find(CLOSE, i)
        end = len(text) if end < 0 else end
        return (text[i:end] if kind == "raw" else json.loads(text[i:end])), end
    items: list[tuple[str | None, Any]] = []
    head = '<cofl:value name="' if kind == "dict" else '<cofl:value type="'
    j = _skip(text, i)
    while text.startswith(head, j):
        j += len(head)
        name = None
        if kind == "dict":
            at = text.find('" type="', j)
            if at < 0:
                raise ValueError(f"a member without a type at {text[j:]!r}")
            name, j = unescape_name(text[j:at]), at + len('" type="')
        value, j = _read(text, j)
        if not text.startswith(CLOSE, j):
            raise ValueError(f"{CLOSE!r} expected at {text[j:]!r}")
        items.append((name, value))
        j = _skip(text, j + len(CLOSE))
    if kind == "dict":
        return {name: value for name, value in items}, j
    return [value for _, value in items], j


def cofl_body(value: Any) -> str:
    """A JSON value from its type attribute's value on: `raw">text`, `json">7`, ..."""
    if isinstance(value, str):
        return f'raw">{value}'
    if isinstance(value, dict):
        return 'dict">' + "".join(cofl_value(v, k) for k, v in value.items())
    if isinstance(value, list):
        return 'list">' + "".join(cofl_value(v) for v in value)
    return f'json">{dumps(value)}'


def cofl_value(value: Any, name: str | None = None) -> str:
    """A whole `<cofl:value>` element (named when `name` is given)."""
    attribute = "" if name is None else f' name="{escape_name(name)}"'
    return f'<cofl:value{attribute} type="{cofl_body(value)}{CLOSE}'


def cofl_calls(calls: Sequence[ToolCall]) -> str:
    """A turn's calls as one `<cofl:tool_calls>` block (raw, non-object arguments as is)."""
    body = "".join(
        f'<cofl:tool_call id="{i}" name="{call.name}">'
        + (call.arguments if isinstance(call.arguments, str)
           else "".join(cofl_value(v, k) for k, v in call.arguments.items()))
        + "</cofl:tool_call>" for i, call in enumerate(calls))
    return f"<cofl:tool_calls>{body}</cofl:tool_calls>"


# ------------------------------------------------------------------------------ prompts
def _system(text: str | None, tools: list[dict[str, Any]]) -> str:
    head = text or "You are a helpful assistant."
    if tools:
        listed = ",\n".join(
            "    " + dumps({"name": t["function"]["name"],
                            "description": t["function"].get("description", ""),
                            "parameters": t["function"].get("parameters", {}),
                            "responses": None}) for t in tools)
        head += f"\n\n# Available Tools\n```json\n[\n{listed}\n]\n```"
    return f"<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>{head}{EOS}"


def _assistant(message: Message, show: bool) -> str:
    reasoning, content = split_reasoning(message)
    thought = f"{THINK_OPEN}{reasoning}{THINK_CLOSE}" if show and reasoning else ""
    return thought + content + (cofl_calls(message.tool_calls) if message.tool_calls else "")


def _results(messages: list[Message]) -> str:
    listed = ",\n".join(
        "    " + dumps({"tool_call_id": str(i), "results": {"0": m.content}, "is_error": None})
        for i, m in enumerate(messages))
    return (f"<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|><|START_TOOL_RESULT|>[\n{listed}\n]"
            f"<|END_TOOL_RESULT|>{EOS}")


FORMAT = TurnFormat(
    system=_system,
    turn=lambda role, text: f"<|START_OF_TURN_TOKEN|><|{role.upper()}_TOKEN|>{text}",
    header=CHATBOT,
    assistant=_assistant,
    results=_results,
    opening=lambda thinking: {True: THINK_OPEN, False: THINK_OPEN + THINK_CLOSE,
                              None: ""}[thinking],
    eos=EOS,
    end=EOS,
)


def render_cohere_xml(
    history: History | Iterable[Mapping[str, Any]],
    tools: Iterable[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    *,
    continue_final_message: bool = False,
    replay: ReplayMemory | None = None,
    enable_thinking: bool | None = None,
    reasoning_effort: str | None = None,
) -> str:
    """Command prompt with XML calls: the generation prompt opens `<|START_THINKING|>` unless
    thinking is off (then an empty block); every turn's reasoning is written back, as Command
    A's template does."""
    return render_turns(
        history, tools, FORMAT, add_generation_prompt=add_generation_prompt,
        continue_final_message=continue_final_message, replay=replay,
        thinking=thinking_on(True, enable_thinking, reasoning_effort),
        show_reasoning=lambda i, last_user, count: True)


class CohereXmlDialect(TurnDialect):
    name = "cohere-xml"
    priority = 120
    probe = (_PROBE_CALL,)
    peg_file = "cohere_xml.peg"
    reasoning_default = True
    raw_until = CLOSE
    word_stop = "<cofl:tool_calls>"
    renderer = render_cohere_xml
    turn_header = CHATBOT
    value_readers = {"cofl": read_value}

    def param_rules(self, sections: dict[str, str], index: int, schema: dict[str, Any],
                    grammar_of: Callable[[Any], Any]) -> tuple[str, str, dict[str, Any]]:
        """One `<cofl:value>` rule per declared property: strings captured raw, other values
        from their type on, read back after parsing."""
        properties = schema.get("properties")
        if not isinstance(properties, dict) or not properties:
            return "", "any_params", {}
        values = CoflValues(f"c_{index}", schema)
        required = set(schema.get("required") or ())
        text, needed, optional = "", [], []
        for j, (key, sub) in enumerate(properties.items()):
            plain = isinstance(sub, dict) and schema_type(sub) == "string" \
                and not any(k in sub for k in ("anyOf", "oneOf"))
            value = (f'"raw\\">" @string:{values.string(sub)}' if plain
                     else f"@cofl:({values.value(sub)})")
            text += (f'p_{index}_{j} = @param:("<cofl:value name=\\"" '
                     f'@key:{peg_literal(escape_name(key))} "\\" type=\\"" {value} CLOSE)\n')
            (needed if key in required else optional).append(f"p_{index}_{j}")
        text += "".join(rule + "\n" for rule in values.rules)
        return text, separated(needed, optional, "param_sep"), values.schemas
