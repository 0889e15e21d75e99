"""The `harmony` dialect: gpt-oss messages (harmony.peg, reference/dialects.md section 1).

Mapping to OpenAI fields: the analysis channel is reasoning_content; final, and commentary
without a recipient (a preamble, as vLLM shows it), are content; a message to
``functions.NAME`` (commentary or analysis channel) is a tool call with JSON arguments; messages
to the built-in tools (browser, python, container) are parsed and dropped, as llama.cpp does.
The texts of several messages of one field are concatenated.

Per request the strict grammar changes: tool_choice none / auto / required / a named tool and
parallel_tool_calls pick the turn (an answer, calls, or either; one call, or several as
consecutive messages), the allowed tools' schemas constrain the arguments, response_format
constrains the final message's text (and then excludes preambles, which would be content too),
and reasoning off (``reasoning_effort: "none"``) forbids analysis messages. Content types are
`json` only, where parsing accepts any word (`code` for the built-in tools).
"""

from __future__ import annotations

from typing import Any, ClassVar

from pegmask.dialects.base import Dialect, alternatives, fill, load_peg, peg_literal, peg_sections
from pegmask.dialects.request import ChatRequest

# (a call may start, one is required, several may come) -> strict turn rule of harmony.peg
_TURNS = {
    (False, False, False): "turn_free",
    (True, False, False): "turn_auto",
    (True, True, False): "turn_required",
    (True, False, True): "turn_parallel_auto",
    (True, True, True): "turn_parallel_required",
}


class HarmonyDialect(Dialect):
    name = "harmony"
    native_renderer = "harmony"
    reasoning_default = True
    #: a `.peg` file that replaces harmony.peg's spacing section (None: keep gpt-oss spacing);
    #: its `$spaces` is the bound on a run of spaces, none when parsing leniently
    spacing_file: ClassVar[str | None] = None
    STRICT_SPACES: ClassVar[int] = 4

    def grammar_source(self, request: ChatRequest, strict: bool) -> tuple[str, dict[str, Any]]:
        sections = peg_sections(load_peg("harmony.peg"))
        spacing = (fill(load_peg(self.spacing_file), spaces=self.STRICT_SPACES if strict else "")
                   if self.spacing_file else sections["spacing"])
        tools = request.allowed_tools if strict else []
        schemas: dict[str, Any] = {f"s_{i}": request.arguments_grammar(n, request.tool_schemas[n])
                                   for i, n in enumerate(tools)}
        if tools:
            instances = [(str(i), peg_literal(name), f"json(s_{i})") for i, name in enumerate(tools)]
        else:  # lenient: any name, any JSON; strict without tools: defined but unreachable
            instances = [("any", "tool_name", "json()")]
        calls = "".join(fill(sections["per tool"], i=i, name=name, arguments=arguments)
                        for i, name, arguments in instances)
        values = {"root": "any_turn", "prelude": "thoughts", "thought": "analysis | preamble",
                  "final_body": "text", "content_type": "word",
                  "calls": alternatives([f"call_{i}" for i, _, _ in instances])}
        if strict:
            values["root"] = _TURNS[(bool(tools), request.min_calls > 0, request.max_calls is None)]
            values["content_type"] = '"json"'
            # a preamble is content: under a response_format only the final message may be
            thoughts = ["analysis"] if self.reasoning_mode(request) else []
            if request.response_schema is None:
                thoughts.append("preamble")
            else:
                schemas["response"] = request.response_grammar
                values["final_body"] = "json(response)"
            values["prelude"] = "thoughts" if thoughts else '""'
            values["thought"] = " | ".join(thoughts) if thoughts else "analysis"  # then unused
        return fill(sections[""], **values) + calls + spacing, schemas
