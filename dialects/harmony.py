"""The `harmony` dialect: gpt-oss messages (harmony.peg).

Mapping to OpenAI fields: the analysis channel is reasoning_content; final, and commentary
without a recipient (a preamble, as vLLM shows it), are content; a message to
``functions.NAME`` on any channel is a tool call with JSON arguments; messages to the built-in
tools (browser, python, container) are dropped. Several messages of one field are joined by
`MESSAGE_SEPARATOR` (vLLM joins analysis messages the same way).

Per request the strict grammar changes: `tool_choice` none / auto / required / a named tool and
`parallel_tool_calls` pick the turn (an answer, calls, or either; one call or several in
consecutive messages), the allowed tools' schemas constrain the arguments, `response_format`
constrains the final message's text, and reasoning off forbids analysis messages.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pegmask.dialects.base import Dialect, alternatives, fill, load_peg, peg_literal, peg_sections
from pegmask.dialects.request import ChatRequest

MESSAGE_SEPARATOR = "\n"

# tool_choice / parallel_tool_calls -> strict turn rule of harmony.peg
_TURNS = {
    # (a call may start, one is needed, several may come)
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
    #: the `.peg` file whose text replaces harmony.peg's spacing section (None: keep it)
    spacing_file: ClassVar[str | None] = None

    def grammar_source(self, request: ChatRequest, strict: bool) -> tuple[str, dict[str, Any]]:
        sections = peg_sections(load_peg("harmony.peg"))
        spacing = load_peg(self.spacing_file) if self.spacing_file else sections["spacing"]
        schemas: dict[str, Any] = {}
        if strict:
            tools = request.allowed_tools
            calls = [
                fill(sections["per tool"], i=i, name=peg_literal(name), arguments=f"json(s_{i})")
                for i, name in enumerate(tools)
            ]
            schemas.update({f"s_{i}": request.tool_schemas[name] for i, name in enumerate(tools)})
            response = request.response_schema
            if response is not None:
                schemas["response"] = response
            calls_rule = alternatives([f"call_{i}" for i in range(len(tools))]) if tools else None
            root = _TURNS[(bool(tools), request.min_calls > 0, request.max_calls is None)]
            thought = "analysis | preamble" if self.reasoning_mode(request) else "preamble"
            final_body = "json(response)" if response is not None else "text"
        else:
            calls, calls_rule = [], None
            root, thought, final_body = "any_turn", "analysis | preamble", "text"
        if calls_rule is None:  # no call can start: `call` is still defined, never reached
            calls = [fill(sections["per tool"], i="any", name="tool_name", arguments="json()")]
            calls_rule = "call_any"
        text = fill(sections[""], root=root, thought=thought, final_body=final_body,
                    calls=calls_rule)
        return text + "".join(calls) + spacing, schemas
