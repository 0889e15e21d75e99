"""The `command-r` dialect: Cohere Command R / R+ actions, `Action:` and a fenced JSON list of
`{"tool_name", "parameters"}` objects after the turn's content (command_r.peg).

No reasoning. The list may be indented as the template writes it (whitespace up to 32
characters a run under the strict grammar). Prompts come from the model's tool_use template,
which renders tools as Python signatures and past calls (with arguments as objects). Its
signature macro fails on tools it cannot type (a parameter without a description, an object
without `additionalProperties`, a `null` type), so the template gets each tool with the fields
it reads filled in (`template_inputs`); what it cannot type it writes as `Any`. It writes a past
call's arguments with `tojson`, so it gets them as objects (Chat Completions sends JSON text).
"""

from __future__ import annotations

import re
from typing import Any

from pegmask.dialects.cohere import CohereDialect
from pegmask.dialects.history import normalize_history

# The probe call as Command R+'s template writes it.
_PROBE_CALL = re.compile(
    r'Action:\s*```json\s*\[\s*\{\s*"tool_name": "pegmask_probe",\s*"parameters": ')
# The JSON types the template's `json_to_python_type` names (it recurses forever on others).
_NAMED_TYPES = ("string", "number", "integer", "boolean", "array", "object")


def python_typed(schema: Any) -> dict[str, Any]:
    """A parameter schema as the template's signature macro can type it: objects with
    `additionalProperties`, a `type` of named types only (None, which it writes as `Any`,
    for the rest), a description."""
    schema = dict(schema) if isinstance(schema, dict) else {}
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = [t for t in kind if t in _NAMED_TYPES and t != "object"] or None
    elif kind not in _NAMED_TYPES:
        kind = None
    if kind == "object":
        schema["additionalProperties"] = python_typed(schema.get("additionalProperties"))
    return {**schema, "type": kind, "description": schema.get("description") or ""}


def template_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI tool with every field the template reads."""
    function = tool.get("function", tool)
    parameters = function.get("parameters") or {}
    properties = parameters.get("properties") or {}
    parameters = {**parameters, "required": parameters.get("required") or [],
                  "properties": {key: python_typed(sub) for key, sub in properties.items()}}
    return {**tool, "function": {**function, "description": function.get("description") or "",
                                 "parameters": parameters}}


class CommandRDialect(CohereDialect):
    name = "command-r"
    priority = 110
    probe = (_PROBE_CALL,)
    peg_file = "command_r.peg"
    reasons = False

    def template_inputs(self, messages: Any, tools: list[dict[str, Any]] | None
                        ) -> tuple[Any, list[dict[str, Any]] | None]:
        return (normalize_history(messages).to_template_messages(),
                tools and [template_tool(tool) for tool in tools])

    @classmethod
    def template_options(cls, template: str) -> dict[str, Any]:
        """None: the template has no reasoning switch."""
        return {}
