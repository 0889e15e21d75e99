"""`Engine`: a model, its vocabulary and chat dialect, and `generate` on top of the decode loop.

A request becomes a `RowSpec` before anything runs: the prompt is rendered and tokenized, the
output grammar (the dialect's, specialized to the request, or a structured-output grammar) is
compiled against the vocabulary, and the output handler is chosen. Every error a request can
cause surfaces there, as an `InvalidRequestError`; decoding itself does not raise.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pegmask.dialects import (
    UNKNOWN,
    ChatRequest,
    Dialect,
    DialectStreamParser,
    detect_dialect,
    dialect_options,
    get_dialect,
)
from pegmask.engine.decode import (
    ChatOutput,
    DecodeStats,
    Delta,
    Row,
    RowSpec,
    TextOutput,
    decode_rows,
    start_rows,
)
from pegmask.engine.model import ModelBackend, load_backend
from pegmask.engine.requests import GenerationRequest, InvalidRequestError, build_request
from pegmask.grammars import Grammar
from pegmask.grammars.automaton import CompiledGrammar, GrammarCompiler
from pegmask.grammars.vocab import Vocabulary

_TOOLS_VARIABLE = re.compile(r"\btools\b")


@dataclass
class GenerationResult:
    """One finished generation. `message` is the OpenAI assistant message (for a completion,
    its text as content); `usage` counts prompt and completion tokens."""

    text: str
    message: dict[str, Any]
    finish_reason: str
    usage: dict[str, int]
    token_ids: list[int]


class GenerationStream:
    """Iterator of OpenAI deltas for one request (`{"text": ...}` pieces for a completion;
    `{"role": "assistant"}` then content / reasoning / tool-call deltas for a chat). Once it is
    exhausted, `result` holds the same `GenerationResult` a non-streamed call returns.

    While it runs it holds the engine (one decode at a time): iterate it to the end, or
    `close()` it to give up."""

    def __init__(self, engine: Engine, row: Row, is_chat: bool):
        self._engine = engine
        self._row = row
        self._is_chat = is_chat
        self.result: GenerationResult | None = None
        self._deltas = self._run()

    def __iter__(self) -> Iterator[Delta]:
        return self._deltas

    def __next__(self) -> Delta:
        return next(self._deltas)

    def close(self) -> None:
        self._deltas.close()

    @property
    def finish_reason(self) -> str | None:
        return self.result.finish_reason if self.result is not None else None

    def _run(self) -> Iterator[Delta]:
        if self._is_chat:
            yield {"role": "assistant"}
        with self._engine._lock:
            for _, deltas in decode_rows(self._engine.backend, [self._row], self._engine.stats):
                yield from deltas
        self.result = self._engine._result(self._row)


class Engine:
    """Grammar-constrained generation with one model.

    `Engine()` runs the embedded SmolLM2-135M-Instruct on the CPU. `model` is a GGUF file or a
    local Hugging Face folder; `dialect="auto"` picks the chat dialect from the model's chat
    template; `chat_template` replaces the model's own.
    """

    def __init__(
        self,
        model: str | os.PathLike[str] | None = None,
        *,
        device: str | None = "cpu",
        dtype: str | None = None,
        dialect: str = "auto",
        chat_template: str | None = None,
    ):
        self.backend: ModelBackend = load_backend(model, device=device, dtype=dtype)
        self.vocab: Vocabulary = self.backend.vocab
        self.chat_template = chat_template or self.backend.chat_template
        name = detect_dialect(self.chat_template) if dialect == "auto" else dialect
        if name == UNKNOWN:
            raise ValueError("cannot tell the chat dialect from the chat template: pass dialect=")
        options = dialect_options(name, self.chat_template)
        self.dialect_name = name
        self.dialect: Dialect = get_dialect(name, chat_template=self.chat_template, **options)
        # The dialect's own prompt format, for tools the model's template does not render.
        self._native: Dialect | None = None
        if self.dialect.native_renderer and not renders_tools(self.chat_template):
            self._native = get_dialect(name, **options)
        self._compiler = GrammarCompiler(self.vocab)
        # Decoding runs one batch at a time (a Lock, not an RLock: a stream may resume on
        # another thread); preparing touches the dialect's and the compiler's caches.
        self._lock = threading.Lock()
        self._prepare_lock = threading.Lock()
        self.stats = DecodeStats()

    @property
    def model_name(self) -> str:
        return self.backend.name

    # ----------------------------------------------------------------- public API
    def generate(
        self,
        prompt_or_messages: str | Sequence[Mapping[str, Any]],
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        top_k: int | None = None,
        seed: int | None = None,
        stop: str | Sequence[str] | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        tool_choice: str | Mapping[str, Any] | None = None,
        parallel_tool_calls: bool | None = None,
        response_format: Mapping[str, Any] | None = None,
        grammar: Grammar | str | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        stream: bool = False,
    ) -> GenerationResult | GenerationStream:
        """Generate for a completion prompt (a string) or a chat (a list of messages).

        A completion's grammar (`grammar`, or `response_format`) constrains its whole output;
        a chat's goes through the dialect with the tools. Defaults: max_tokens 512,
        temperature 1, no top-p / top-k. With `stream=True`, a `GenerationStream` of deltas.
        Bad requests raise `InvalidRequestError` (a ValueError) before anything is decoded.
        """
        request = build_request(
            prompt_or_messages, max_tokens=max_tokens, temperature=temperature, top_p=top_p,
            top_k=top_k, seed=seed, stop=stop, tools=tools, tool_choice=tool_choice,
            parallel_tool_calls=parallel_tool_calls, response_format=response_format,
            grammar=grammar, chat_template_kwargs=chat_template_kwargs,
        )
        row = start_rows(self.backend, self.vocab, [self.prepare(request)])[0]
        if stream:
            return GenerationStream(self, row, request.is_chat)
        return self._decode([row])[0]

    def generate_batch(
        self, requests: Sequence[Mapping[str, Any]], *, return_errors: bool = False
    ) -> list[GenerationResult | InvalidRequestError]:
        """Several requests decoded as one batch. Each item holds `generate`'s keyword options
        plus the input under `prompt` or `messages`. A bad item raises before any decoding,
        or, with `return_errors`, takes its error's place in the results."""
        outcomes: list[Any] = []
        for i, item in enumerate(requests):
            try:
                outcomes.append(self.prepare(self._batch_request(i, item)))
            except InvalidRequestError as exc:
                if not return_errors:
                    raise
                outcomes.append(exc)
        specs = [o for o in outcomes if isinstance(o, RowSpec)]
        results = iter(self._decode(start_rows(self.backend, self.vocab, specs)))
        return [next(results) if isinstance(o, RowSpec) else o for o in outcomes]

    @staticmethod
    def _batch_request(index: int, item: Mapping[str, Any]) -> GenerationRequest:
        options = dict(item)
        if ("prompt" in options) == ("messages" in options):
            raise InvalidRequestError(
                f"requests[{index}] needs exactly one of prompt and messages", "messages")
        source = options.pop("prompt") if "prompt" in options else options.pop("messages")
        try:
            return build_request(source, **options)
        except TypeError as exc:  # an unknown option name
            raise InvalidRequestError(f"requests[{index}]: {exc}") from exc

    # ----------------------------------------------------------------- preparation
    def prepare(self, request: GenerationRequest) -> RowSpec:
        """Render, tokenize and compile: everything before the first forward."""
        with self._prepare_lock:
            return self._prepare(request)

    def _prepare(self, request: GenerationRequest) -> RowSpec:
        if request.is_chat:
            prompt_ids = self.backend.encode(self.render(request))
        else:
            prompt_ids = self.backend.encode(request.prompt, add_special_tokens=True)
        room = self.backend.context_length - len(prompt_ids)
        if room <= 0:
            raise InvalidRequestError(
                f"the prompt has {len(prompt_ids)} tokens; the model's context is "
                f"{self.backend.context_length}",
                "messages" if request.is_chat else "prompt",
            )
        max_new = min(request.sampling.max_tokens, room)
        matcher, stop_ids = None, frozenset(self.vocab.eos_ids)
        if request.is_chat and request.grammar is None:
            # The dialect grammar embeds the tool schemas and the answer's schema.
            param = "response_format" if request.chat.response_schema is not None else "tools"
            grammar = self._checked(lambda: self.dialect.grammar(request.chat), param)
            compiled = self.compiled(grammar, param)
            parser = DialectStreamParser(compiled.grammar, request.chat, self.vocab,
                                         trusted=True, seed=request.sampling.seed)
            output: Any = ChatOutput(parser)
        else:
            output = TextOutput(self.vocab, "content" if request.is_chat else "text")
            compiled = None
            if request.grammar is not None:
                compiled = self.compiled(request.grammar, "grammar")
        if compiled is not None:
            matcher = compiled.matcher()
            stop_ids = frozenset(compiled.stop_ids)
        return RowSpec(prompt_ids, request.sampling, max_new, output, matcher, stop_ids)

    def render(self, request: GenerationRequest) -> str:
        """The chat prompt: the model's template, or the dialect's native format when there are
        tools the template would drop."""
        chat: ChatRequest = request.chat
        kwargs = dict(request.template_kwargs)
        dialect = self.dialect
        if chat.tools and self._native is not None:
            dialect = self._native
        else:
            for key, value in self.backend.template_tokens().items():
                kwargs.setdefault(key, value)
        return self._checked(
            lambda: dialect.render(request.messages, tools=chat.tools or None,
                                   add_generation_prompt=True, **kwargs),
            "messages",
        )

    def compiled(self, grammar: Grammar, param: str = "grammar") -> CompiledGrammar:
        """`grammar` bound to this model's vocabulary (cached by the compiler; compile errors
        become `InvalidRequestError`s about `param`)."""
        return self._checked(lambda: self._compiler.compile(grammar), param)

    @staticmethod
    def _checked(build: Any, param: str) -> Any:
        try:
            return build()
        except InvalidRequestError:
            raise
        except (ValueError, TypeError, RecursionError) as exc:
            raise InvalidRequestError(str(exc), param) from exc

    # ----------------------------------------------------------------- decoding
    def _decode(self, rows: list[Row]) -> list[GenerationResult]:
        with self._lock:
            for _ in decode_rows(self.backend, rows, self.stats):
                pass
        return [self._result(row) for row in rows]

    def _result(self, row: Row) -> GenerationResult:
        output = row.spec.output
        # A chat's text is the raw output (e.g. its <tool_call> blocks); a completion's, plain.
        chat = isinstance(output, ChatOutput)
        text = row.text(spell_specials=chat)
        message = output.message if chat else {
            "role": "assistant", "content": text, "reasoning_content": None, "tool_calls": []}
        prompt_tokens = len(row.spec.prompt_ids)
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": len(row.generated),
                 "total_tokens": prompt_tokens + len(row.generated)}
        return GenerationResult(text, message, row.finish_reason or "length", usage,
                                list(row.generated))


# --------------------------------------------------------------------------- dialects
def renders_tools(template: str | None) -> bool:
    """Whether a chat template reads the `tools` variable at all."""
    return bool(template and _TOOLS_VARIABLE.search(template))
