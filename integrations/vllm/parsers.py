"""vLLM tool-call and reasoning parsers for every pegmask dialect, on pegmask's own parser.

vLLM runs a reasoning parser over the output first and hands the rest to the tool-call parser
(`vllm.parser.abstract_parser.DelegatingParser`). Here both read the dialect's grammar:

* `PegmaskReasoningParser`: the leading reasoning (`ReasoningSplit`); the rest starts where it
  parses as a turn of its own (Hermes' answer or `<tool_call>`, Harmony's next `<|channel|>`).
* `PegmaskToolParser`: content and tool calls of that rest, through `DialectStreamParser`
  (calls released once they close, malformed ones returned as content). Without a reasoning
  parser, reasoning markup is content, as vLLM does. Reasoning the dialect writes after the
  answer starts (Harmony's later analysis messages) is streamed as `reasoning`; a
  non-streamed reply has no place for it.

vLLM's structured-output gate asks `is_reasoning_end` of the prompt's ids, then of prompt +
output ids, and constrains (response_format, its own JSON modes) from where it says True: the
ids' tail decides, as in vLLM's own parsers (`inside_reasoning`: the last reasoning marker, else
the prompt's state under the model's chat template). A stream gets its prompt
(`adjust_initial_state_from_prompt`); a whole output's `extract_reasoning` does not, and reads
the request's switches.

Both stream on vLLM's engine-based path (`engine_based_streaming`): they keep their own state
and flush it in `finish_streaming`. With tools (and no other structured output) the tool parser
asks for the dialect's tool-call grammar under `vllm_xargs["pegmask"]`, which
`PegmaskLogitsProcessor` applies; `tool_choice` "required" and named tools are enforced by
that grammar, not by vLLM's JSON mode (`supports_required_and_named = False`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

from vllm.entrypoints.generate.base.protocol import (
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
    ExtractedToolCallInformation,
    FunctionCall,
    ToolCall,
)
from vllm.reasoning import ReasoningParser
from vllm.tool_parsers import ToolParser

from pegmask.dialects import (
    ChatRequest,
    Dialect,
    DialectStreamParser,
    RequestError,
    dialect_names,
    dialect_options,
)
from pegmask.grammars import ParseError
from pegmask.integrations.constraints import dialect_named
from pegmask.integrations.dialect_output import (
    ReasoningMarkerTail,
    ReasoningSplit,
    inside_reasoning,
)
from pegmask.integrations.vllm import parser_class_name

XARGS_KEY = "pegmask"


def to_delta_message(deltas: Iterable[dict[str, Any]]) -> DeltaMessage | None:
    """pegmask's OpenAI deltas as one vLLM `DeltaMessage` (None when there are none)."""
    content: list[str] = []
    reasoning: list[str] = []
    calls: list[DeltaToolCall] = []
    for delta in deltas:
        content.append(delta.get("content") or "")
        reasoning.append(delta.get("reasoning_content") or "")
        for piece in delta.get("tool_calls", []):
            function = piece["function"]
            calls.append(DeltaToolCall(
                index=piece["index"], id=piece.get("id"), type=piece.get("type"),
                function=DeltaFunctionCall(name=function.get("name"),
                                           arguments=function.get("arguments"))))
    if not (any(content) or any(reasoning) or calls):
        return None
    return DeltaMessage(content="".join(content) or None,
                        reasoning="".join(reasoning) or None, tool_calls=calls)


def tools_request(request: Any) -> ChatRequest:
    """What the tool-call parser needs of a vLLM request: the tools' schemas (XML dialects type
    parameter values by them). Not its reasoning switches: the tool-call parser reads the
    output after the reasoning, with reasoning off."""
    try:
        return ChatRequest(tools=_tools(request))
    except RequestError:
        return ChatRequest()


class PegmaskToolParser(ToolParser):
    """Tool calls and content of a dialect's output (see the module docstring)."""

    dialect_name: ClassVar[str] = ""
    supports_required_and_named = False
    engine_based_streaming = True

    def __init__(self, tokenizer: Any, tools: list[Any] | None = None):
        super().__init__(tokenizer, tools)
        self._stream: DialectStreamParser | None = None

    @property
    def dialect(self) -> Dialect:
        """The dialect with reasoning off: what it reads follows the leading reasoning."""
        return dialect_named(self.dialect_name, False)

    def adjust_request(self, request: Any) -> Any:
        """Keep special tokens in the text (the dialects' tags) and, for a request with tools
        and no other structured output, ask for the dialect's tool-call grammar."""
        if not request.tools or request.tool_choice == "none":
            return request
        if hasattr(request, "skip_special_tokens"):
            request.skip_special_tokens = False
        xargs = dict(request.vllm_xargs or {})
        if XARGS_KEY not in xargs and not _has_structured_output(request):
            xargs[XARGS_KEY] = json.dumps(self.tool_spec(request), ensure_ascii=False)
            request.vllm_xargs = xargs
        return request

    def tool_spec(self, request: Any) -> dict[str, Any]:
        """The `dialect` constraint for a request's tools and tool_choice (reasoning off for a
        Hermes-family model whose chat template never mentions `<think>`, as the engine)."""
        spec: dict[str, Any] = {"dialect": self.dialect_name, "tools": _tools(request),
                                "tool_choice": _plain(request.tool_choice or "auto")}
        template = getattr(self.model_tokenizer, "chat_template", None)
        spec.update(dialect_options(self.dialect_name, template))
        if request.parallel_tool_calls is not None:
            spec["parallel_tool_calls"] = bool(request.parallel_tool_calls)
        kwargs = getattr(request, "chat_template_kwargs", None)
        if kwargs:
            spec["chat_template_kwargs"] = _plain(kwargs)
        return spec

    def extract_tool_calls(self, model_output: str, request: Any) -> ExtractedToolCallInformation:
        parser = self.dialect.stream_parser(tools_request(request))
        parser.feed(model_output)
        parser.finish()
        message = parser.message
        calls = [ToolCall(id=call["id"], function=FunctionCall(
            name=call["function"]["name"], arguments=call["function"]["arguments"]))
            for call in message["tool_calls"]]
        return ExtractedToolCallInformation(tools_called=bool(calls), tool_calls=calls,
                                            content=message["content"])

    def extract_tool_calls_streaming(
        self, previous_text: str, current_text: str, delta_text: str,
        previous_token_ids: Sequence[int], current_token_ids: Sequence[int],
        delta_token_ids: Sequence[int], request: Any,
    ) -> DeltaMessage | None:
        if self._stream is None:
            self._stream = self.dialect.stream_parser(tools_request(request))
        return to_delta_message(self._stream.feed(delta_text))

    def finish_streaming(self) -> DeltaMessage | None:
        """End of a streamed output: what the parser still held (a trailing partial tag)."""
        return None if self._stream is None else to_delta_message(self._stream.finish())


class PegmaskReasoningParser(ReasoningParser):
    """The leading reasoning of a dialect's output (see the module docstring)."""

    dialect_name: ClassVar[str] = ""
    engine_based_streaming = True

    def __init__(self, tokenizer: Any, *args: Any, **kwargs: Any):
        super().__init__(tokenizer, *args, **kwargs)
        self.request = ChatRequest(chat_template_kwargs=dict(
            kwargs.get("chat_template_kwargs") or {}))
        self.dialect = dialect_named(self.dialect_name)
        # The dialect as the model's chat template has it (Hermes without `<think>` in its
        # template does not reason): what a prompt that names no reasoning marker means.
        template = getattr(self.model_tokenizer, "chat_template", None)
        self.template_dialect = dialect_named(
            self.dialect_name, dialect_options(self.dialect_name, template).get("reasoning"))
        self._split = ReasoningSplit(self.dialect, self.request)
        self._handed = 0  # characters of the rest already handed to the tool phase
        self._markers = ReasoningMarkerTail(self.template_dialect, self._decode)

    def adjust_request(self, request: Any) -> Any:
        if hasattr(request, "skip_special_tokens"):
            request.skip_special_tokens = False  # the reasoning tags are special tokens
        return request

    def adjust_initial_state_from_prompt(self, prompt_token_ids: Sequence[int]) -> None:
        """A stream's rendered prompt (vLLM hands it where `is_reasoning_end` found the prompt
        still inside reasoning): its tail says how the output starts (`generation_prompt`).
        `extract_reasoning` of a whole output gets no prompt: it reads the request's switches."""
        prompt = self._decode(prompt_token_ids)
        self.request = dataclasses.replace(self.request, generation_prompt=prompt)
        self._split = ReasoningSplit(self.dialect, self.request)

    def extract_reasoning(self, model_output: str, request: Any) -> tuple[str | None, str | None]:
        split = ReasoningSplit(self.dialect, self.request)
        reasoning = split.feed(model_output) + split.finish()
        if not split.ended:
            return reasoning or None, None
        return reasoning or None, split.rest or None

    def extract_reasoning_streaming(
        self, previous_text: str, current_text: str, delta_text: str,
        previous_token_ids: Sequence[int], current_token_ids: Sequence[int],
        delta_token_ids: Sequence[int],
    ) -> DeltaMessage | None:
        reasoning = self._split.feed(delta_text)
        return DeltaMessage(reasoning=reasoning) if reasoning else None

    def has_engine_confirmed_reasoning_end(self) -> bool:
        return self._split.ended

    def finish_streaming(self) -> DeltaMessage | None:
        """Called when the reasoning ends (the rest so far goes on to the tool-call phase), and
        at the end of an output whose reasoning never ended (what was held back)."""
        if not self._split.ended:
            reasoning = self._split.finish()
            if not self._split.ended:
                return DeltaMessage(reasoning=reasoning) if reasoning else None
            message = self.dialect.parse(self._split.rest, self.request)
            return DeltaMessage(reasoning=reasoning or None, content=message["content"])
        rest = self._split.rest[self._handed:]
        self._handed += len(rest)
        return DeltaMessage(content=rest) if rest else None

    def is_reasoning_end(self, input_ids: Sequence[int]) -> bool:
        """Whether ids have left the leading reasoning. vLLM's structured-output gate hands the
        prompt's ids, then prompt + output ids, and constrains from where this turns True. As
        vLLM's own parsers, the ids' tail decides (`inside_reasoning`: the last reasoning
        marker, else the prompt's state under the model's template: ended where it does not
        reason or closed an empty block). Where that leaves it to the output (a detected mode,
        or a dialect without textual markers), the ids are read as an output: a prompt has
        not ended, an output without reasoning has at once. vLLM asks again with one step's
        more ids each time: a marker is looked for in the new ids only (`ReasoningMarkerTail`)."""
        last = self._markers.last(input_ids)
        if last is not None:
            return not last
        text = self._decode(input_ids)
        inside = inside_reasoning(self.template_dialect, text, self.request)
        if inside is not None:
            return not inside
        split = self._split_text(text)
        if not split.ended:
            return False
        try:
            split.grammar.stream_parser().feed(text)
        except ParseError:
            return False
        return True

    def extract_content_ids(self, input_ids: list[int]) -> list[int]:
        """The ids of an output from the first token that holds the rest on."""
        split, text = self._split_ids(input_ids)
        if not split.ended:
            return []
        start = len(text) - len(split.rest)
        low, high = 0, len(input_ids)  # the first k whose prefix reaches past the split
        while low < high:
            middle = (low + high) // 2
            if len(self._decode(input_ids[:middle + 1])) > start:
                high = middle
            else:
                low = middle + 1
        return list(input_ids[low:])

    def _split_ids(self, input_ids: Sequence[int]) -> tuple[ReasoningSplit, str]:
        text = self._decode(input_ids)
        return self._split_text(text), text

    def _decode(self, ids: Sequence[int]) -> str:
        """Ids as text with special tokens spelled (the reasoning markers often are some)."""
        return self.model_tokenizer.decode(list(ids), skip_special_tokens=False)

    def _split_text(self, text: str) -> ReasoningSplit:
        split = ReasoningSplit(self.dialect, self.request)
        split.feed(text)
        return split


def _tools(request: Any) -> list[dict[str, Any]]:
    """The request's function tools as OpenAI dicts."""
    return [_plain(tool) for tool in request.tools or []
            if _plain(tool).get("type", "function") == "function"]


def _plain(value: Any) -> Any:
    """A pydantic value as plain JSON data."""
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json", exclude_none=True)
    return value


def _has_structured_output(request: Any) -> bool:
    """Whether vLLM already constrains the request (response_format or structured outputs)."""
    response_format = getattr(request, "response_format", None)
    kind = getattr(response_format, "type", None)
    if kind not in (None, "text"):
        return True
    return getattr(request, "structured_outputs", None) is not None


def _parser_classes() -> dict[str, type]:
    """One tool and one reasoning parser class per dialect, named for lazy registration."""
    classes: dict[str, type] = {}
    for dialect in dialect_names():
        for kind, base in (("Tool", PegmaskToolParser), ("Reasoning", PegmaskReasoningParser)):
            name = parser_class_name(dialect, kind)
            classes[name] = type(name, (base,), {"dialect_name": dialect, "__module__": __name__,
                                                 "__doc__": f"{base.__doc__} Dialect {dialect}."})
    return classes


globals().update(_parser_classes())
