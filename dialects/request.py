"""`ChatRequest`: the per-request options that specialize a dialect's output grammar.

It holds what an OpenAI chat request says about the *shape* of the answer: the tools, how
tool calls are forced (`tool_choice`), whether several calls may come at once
(`parallel_tool_calls`), whether the model reasons first (from `chat_template_kwargs`) and
whether the answer must be JSON (`response_format`). Dialects read only the derived views
(`tool_schemas`, `allowed_tools`, `min_calls`, `max_calls`, `response_schema`,
`response_grammar`, `reasoning_enabled`), so every dialect interprets a request the same way.

Public API (stable; other dialects and the engine build on it)::

    req = ChatRequest(tools=[...], tool_choice="auto", parallel_tool_calls=True,
                      chat_template_kwargs={"enable_thinking": False},
                      response_format={"type": "json_schema", "json_schema": {"schema": {...}}})
    req = ChatRequest.from_openai(body)      # an OpenAI request body (extra keys ignored)
    req.tool_schemas       -> {name: parameters schema} of every declared tool, in order
    req.arguments_grammar(name, schema) -> the grammar node of a tool's (part) schema
                              ("strict": true tools: objects closed; the others: objects
                              that declare properties closed, unless strict_tool_arguments
                              is False)
    req.allowed_tools      -> the names a call may use (tool_choice applied; [] for "none")
    req.min_calls          -> 1 for "required" / a named tool, else 0
    req.max_calls          -> 0 if no call can start, 1 without parallel calls or for a
                              named tool, None = unbounded
    req.response_schema    -> the JSON Schema the answer must follow, or None
    req.response_grammar   -> the same as a grammar node for json(...) (strict mode applied)
    req.reasoning_enabled(default) -> bool | None   (None: detect from the output)
    req.generation_prompt  -> the rendered prompt, where known (its tail decides reasoning)

Invalid requests raise `RequestError` (a ValueError) at construction.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pegmask.grammars.ir import JsonSchema, json_schema_node

ToolChoice = str | dict[str, Any]


class RequestError(ValueError):
    """The request is inconsistent (unknown named tool, `required` without tools, a malformed
    tool or response_format); servers map it to HTTP 400 naming `param`, the field at fault."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


@dataclass
class ChatRequest:
    """The answer-shaping part of an OpenAI chat request (see the module docstring)."""

    tools: list[dict[str, Any]] = field(default_factory=list)
    tool_choice: ToolChoice = "auto"
    parallel_tool_calls: bool = True
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    response_format: dict[str, Any] | None = None
    #: objects in tool parameter schemas that declare their properties and say nothing of
    #: `additionalProperties` take no others (xgrammar's strict mode, as vLLM applies it to
    #: tool calls); False: plain JSON Schema, where such objects take any other property
    strict_tool_arguments: bool = True
    #: the rendered prompt the output continues (None: not known). Where it is known, its tail
    #: says whether the output starts inside reasoning (`Dialect.prompt_reasoning`), whatever
    #: switches the template read to write it
    generation_prompt: str | None = None

    def __post_init__(self) -> None:
        # Only None means absent: a falsy value of the wrong type (0, "") is a bad request.
        if self.tools is None:
            self.tools = []
        if not isinstance(self.tools, (list, tuple)):
            raise RequestError("tools must be a list", "tools")
        self.tools = list(self.tools)
        if self.chat_template_kwargs is None:
            self.chat_template_kwargs = {}
        if not isinstance(self.chat_template_kwargs, dict):
            raise RequestError("chat_template_kwargs must be an object", "chat_template_kwargs")
        self.chat_template_kwargs = dict(self.chat_template_kwargs)
        for name in ("parallel_tool_calls", "strict_tool_arguments"):
            if not isinstance(getattr(self, name), bool):
                raise RequestError(f"{name} must be a boolean", name)
        self._schemas, self._strict_tools = _tool_schemas(self.tools)
        self._named = _named_tool(self.tool_choice)
        if self._named is not None and self._named not in self._schemas:
            raise RequestError(f"tool_choice names {self._named!r}, which is not among the tools",
                               "tool_choice")
        if self.tool_choice == "required" and not self._schemas:
            raise RequestError('tool_choice "required" needs at least one tool', "tool_choice")
        self._response_schema, self._response_strict = _response_schema(self.response_format)

    @classmethod
    def from_openai(cls, body: dict[str, Any]) -> ChatRequest:
        """Build from an OpenAI chat-completions request body; a top-level `reasoning_effort`
        is moved into `chat_template_kwargs` unless that already sets one."""
        kwargs = body.get("chat_template_kwargs")
        if kwargs is not None and not isinstance(kwargs, dict):
            raise RequestError("chat_template_kwargs must be an object", "chat_template_kwargs")
        kwargs = dict(kwargs or {})
        if body.get("reasoning_effort") is not None:
            kwargs.setdefault("reasoning_effort", body["reasoning_effort"])
        parallel = body.get("parallel_tool_calls")
        choice = body.get("tool_choice")
        return cls(
            tools=body.get("tools"),
            tool_choice="auto" if choice is None else choice,
            parallel_tool_calls=True if parallel is None else parallel,
            chat_template_kwargs=kwargs,
            response_format=body.get("response_format"),
        )

    # ----------------------------------------------------------------- derived views
    @property
    def tool_schemas(self) -> dict[str, dict[str, Any]]:
        """Every declared tool's name and parameters schema, in declaration order."""
        return self._schemas

    def arguments_grammar(self, name: str, schema: Any) -> JsonSchema:
        """`schema` (tool `name`'s parameters, or a part of them) as a grammar node for
        `json(...)`: a tool declared with `"strict": true` takes no properties beyond the
        declared ones (OpenAI's strict function calling); the others neither, in objects that
        declare their properties, unless `strict_tool_arguments` is False (an object that
        says `additionalProperties` keeps what it says)."""
        if name in self._strict_tools:
            return json_schema_node(schema, strict=True)
        return json_schema_node(schema, strict="declared" if self.strict_tool_arguments else False)

    @property
    def strict_tools(self) -> frozenset[str]:
        """Names of the tools declared with `"strict": true`."""
        return self._strict_tools

    @property
    def named_tool(self) -> str | None:
        """The tool forced by a named tool_choice, else None."""
        return self._named

    @property
    def allowed_tools(self) -> list[str]:
        """Names a call may use under tool_choice (empty when no call can start)."""
        if self.tool_choice == "none":
            return []
        if self._named is not None:
            return [self._named]
        return list(self._schemas)

    @property
    def min_calls(self) -> int:
        return 1 if self.tool_choice == "required" or self._named is not None else 0

    @property
    def max_calls(self) -> int | None:
        """A named tool is called once (OpenAI's and vLLM's behaviour), whatever
        `parallel_tool_calls` says."""
        if not self.allowed_tools:
            return 0
        return None if self.parallel_tool_calls and self._named is None else 1

    @property
    def response_schema(self) -> dict[str, Any] | bool | None:
        """The JSON Schema the answer text must follow (`json_object` means any object)."""
        return self._response_schema

    @property
    def response_grammar(self) -> JsonSchema | None:
        """The answer's schema as a grammar node for `json(...)`: with `"strict": true`, objects
        take no properties beyond the declared ones (OpenAI's strict mode)."""
        if self._response_schema is None:
            return None
        return json_schema_node(self._response_schema, strict=self._response_strict)

    def reasoning_enabled(self, default: bool | None = True) -> bool | None:
        """Whether the model reasons before answering.

        `reasoning_effort` in chat_template_kwargs wins, and only "none" disables; otherwise a
        literal `enable_thinking: false` (or `thinking: false`) disables; else `default` (which
        may be None: "detect it from the output").
        """
        kwargs = self.chat_template_kwargs
        effort = kwargs.get("reasoning_effort")
        if effort is not None:
            return str(effort).lower() != "none"
        for key in ("enable_thinking", "thinking"):
            if kwargs.get(key) is False:
                return False
        return default


def _tool_schemas(tools: list[dict[str, Any]]) -> tuple[dict[str, dict[str, Any]], frozenset[str]]:
    """(name -> parameters schema, names of strict tools); accepts OpenAI tool dicts and bare
    function dicts."""
    schemas: dict[str, dict[str, Any]] = {}
    strict: set[str] = set()
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise RequestError(f"tools[{i}] is not an object", "tools")
        if tool.get("type", "function") != "function":
            raise RequestError(f"tools[{i}]: only function tools are supported", "tools")
        function = tool.get("function", tool)
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str) or not name:
            raise RequestError(f"tools[{i}] has no function name", "tools")
        if name in schemas:
            raise RequestError(f"tool {name!r} is declared twice", "tools")
        parameters = function.get("parameters")
        if parameters is None:
            parameters = {"type": "object", "properties": {}}
        if not isinstance(parameters, dict):
            raise RequestError(f"tool {name!r}: parameters must be a JSON Schema object", "tools")
        schemas[name] = parameters
        if function.get("strict") is not None and not isinstance(function["strict"], bool):
            raise RequestError(f"tool {name!r}: strict must be a boolean", "tools")
        if function.get("strict"):
            strict.add(name)
    return schemas, frozenset(strict)


def _named_tool(tool_choice: ToolChoice) -> str | None:
    if isinstance(tool_choice, str):
        if tool_choice not in ("auto", "required", "none"):
            raise RequestError(f"tool_choice must be auto, required, none or a function, "
                               f"not {tool_choice!r}", "tool_choice")
        return None
    if isinstance(tool_choice, dict):
        function = tool_choice.get("function")
        name = function.get("name") if isinstance(function, dict) else tool_choice.get("name")
        if tool_choice.get("type", "function") == "function" and isinstance(name, str):
            return name
    raise RequestError(f"malformed tool_choice: {tool_choice!r}", "tool_choice")


def _response_schema(
        response_format: dict[str, Any] | None) -> tuple[dict[str, Any] | bool | None, bool]:
    """The answer's schema (None: free text) and whether it is strict."""
    if response_format is None:
        return None, False
    if not isinstance(response_format, dict):
        raise RequestError("response_format must be an object", "response_format")
    kind = response_format.get("type")
    if kind == "text":
        return None, False
    if kind == "json_object":
        return {"type": "object"}, False
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict):
            raise RequestError('response_format "json_schema" needs a json_schema object',
                               "response_format")
        schema = spec.get("schema", {})
        if not isinstance(schema, (dict, bool)):
            raise RequestError("response_format json_schema.schema must be a JSON Schema",
                               "response_format")
        strict = spec.get("strict", False)
        if not isinstance(strict, bool):
            raise RequestError("response_format json_schema.strict must be a boolean",
                               "response_format")
        return schema, strict
    raise RequestError(f"unsupported response_format type {kind!r}", "response_format")
