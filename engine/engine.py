"""`Engine`: a model, its vocabulary and chat dialect, and `generate` on top of the scheduler.

A request becomes a `RowSpec` before it reaches the scheduler: the prompt is rendered and
tokenized, the output grammar (the dialect's, specialized to the request, or a structured-output
grammar) is compiled against the vocabulary (compiled grammars are shared across requests), and
the output handler is chosen. Every error a request can cause surfaces there, in the caller's
thread, as an `InvalidRequestError`; decoding itself does not raise. Preparing runs off the
decode loop, and grammars compile in worker processes (engine/compile_service.py), so a new
grammar never stalls the requests that decode, nor those that prepare.

All decoding goes through one `Scheduler` (engine/scheduler.py): `generate`, `generate_batch`,
streams and the server submit to it from any thread, and it batches whatever runs at once.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import jinja2

from pegmask.dialects import (
    DERIVED,
    UNKNOWN,
    ChatRequest,
    Dialect,
    DialectStreamParser,
    detect_dialect,
    dialect_options,
    get_dialect,
)
from pegmask.dialects.native import replay_text
from pegmask.dialects.replay import ReplayMemory
from pegmask.dialects.templating import render_chat_template
from pegmask.engine.background import LARGE_REQUEST_SIZE, BackgroundLane, text_size
from pegmask.engine.compile_service import (
    DEFAULT_COMPILE_MEMORY_BYTES,
    DEFAULT_COMPILE_TIMEOUT_S,
    DEFAULT_COMPILE_WORKERS,
    CompileService,
)
from pegmask.engine.decode import ChatOutput, DecodeStats, Delta, Row, RowSpec, TextOutput
from pegmask.engine.metrics import Metrics
from pegmask.engine.model import ModelBackend, load_backend
from pegmask.engine.requests import (
    DEFAULT_MAX_TOKENS,
    GenerationRequest,
    InvalidRequestError,
    build_request,
    grammar_for_format,
)
from pegmask.engine.scheduler import Event, Limits, Scheduler, Submission
from pegmask.grammars import Grammar, GrammarLimits, GrammarTooLarge
from pegmask.grammars.compiler import CompiledGrammar
from pegmask.grammars.vocab import Vocabulary

logger = logging.getLogger("pegmask.engine")
# The key/value cache the running requests may hold at most, as vLLM's CPU backend long kept by
# default (VLLM_CPU_KVCACHE_SPACE=4): SmolLM2's float32 cache, 46 KiB a token, 91,000 tokens.
DEFAULT_KV_CACHE_BYTES = 4 * 2**30
_TOOLS_VARIABLE = re.compile(r"\btools\b")
# A request that touches what the first request of a process would otherwise pay for (the PEG
# and JSON Schema front-ends, the dialect's grammar, the vocabulary's tries, the first masks).
_PREWARM_TOOL = {"type": "function", "function": {
    "name": "prewarm", "description": "-",
    "parameters": {"type": "object", "properties": {
        "text": {"type": "string"}, "count": {"type": "integer"}, "ratio": {"type": "number"},
        "flag": {"type": "boolean"}, "items": {"type": "array", "items": {"type": "string"}},
        "kind": {"type": "string", "enum": ["a", "b"]},
    }, "required": ["text"]},
}}


class _Prompt(NamedTuple):
    """A request's prompt (`Engine._prompt`): its tokens and, for a chat, its text and whether
    the dialect's native renderer wrote it."""

    ids: list[int]
    text: str | None
    native: bool


class _Staged(NamedTuple):
    """A request ready for its grammar's compile (`Engine._stage`)."""

    request: GenerationRequest
    prompt_ids: list[int]
    prompt_text: str | None
    max_new: int
    grammar: Grammar | None
    param: str  # the request field the grammar's errors are about


@dataclass
class Choice:
    """One choice of a finished generation."""

    index: int
    text: str
    message: dict[str, Any]
    finish_reason: str
    token_ids: list[int]
    logprobs: list[Any] | None = None  # decode.TokenLogprob per output token, when asked
    stop_string: str | None = None  # the stop string that ended it, if one did


@dataclass
class GenerationResult:
    """One finished generation. `message` is the OpenAI assistant message (for a completion,
    its text as content); `usage` counts prompt and completion tokens (all choices). `text`,
    `message`, `finish_reason`, `token_ids` and `logprobs` are the first choice's; `choices`
    holds every one (`n > 1`)."""

    text: str
    message: dict[str, Any]
    finish_reason: str
    usage: dict[str, int]
    token_ids: list[int]
    choices: list[Choice] = field(default_factory=list)
    logprobs: list[Any] | None = None


class GenerationStream:
    """Iterator of OpenAI deltas for one request (`{"text": ...}` pieces for a completion;
    `{"role": "assistant"}` then content / reasoning / tool-call deltas for a chat). With
    `n > 1` the choices' deltas interleave: read `events()` to tell them apart. Once it is
    exhausted, `result` holds the same `GenerationResult` a non-streamed call returns.

    `close()` (or dropping the iterator) cancels the request; the decode loop frees its rows
    before its next step."""

    def __init__(self, engine: Engine, submission: Submission, is_chat: bool):
        self._engine = engine
        self.submission = submission
        self.is_chat = is_chat
        self.result: GenerationResult | None = None
        self._deltas = self._run()

    def __iter__(self) -> Iterator[Delta]:
        return self._deltas

    def __next__(self) -> Delta:
        return next(self._deltas)

    def close(self) -> None:
        self.submission.cancel()
        self._deltas.close()

    @property
    def finish_reason(self) -> str | None:
        return self.result.finish_reason if self.result is not None else None

    def events(self) -> Iterator[Event]:
        """The scheduler's events (choice index, deltas, log-probs, finish reason)."""
        try:
            yield from self.submission.events()
            self.result = self._engine._result(self.submission)
        finally:
            if not self.submission.done.is_set():
                self.submission.cancel()

    async def aevents(self) -> AsyncIterator[Event]:
        """`events()` for asyncio."""
        try:
            async for event in self.submission.aevents():
                yield event
            self.result = self._engine._result(self.submission)
        finally:
            if not self.submission.done.is_set():
                self.submission.cancel()

    def _run(self) -> Iterator[Delta]:
        if self.is_chat:
            yield {"role": "assistant"}
        for event in self.events():
            yield from event.deltas


class Engine:
    """Grammar-constrained generation with one model.

    `Engine()` runs the embedded SmolLM2-135M-Instruct on the CPU. `model` is a GGUF file or a
    local Hugging Face folder; `dialect="auto"` picks the chat dialect from the model's chat
    template; `chat_template` replaces the model's own. `max_running` rows (choices) decode at
    once and `max_queued` requests wait for room (more: `QueueFullError`); `prefill_chunk` bounds
    the prompt tokens of one step, and with `decode_first` (None: on a CPU) a step beside
    decoding rows takes at most as many prompt tokens as there are such rows (at least 16), so
    that a long prompt does not stall them (engine/scheduler.py); `prefix_cache` prompt
    prefixes are kept so that requests sharing one (the same tools) skip its prefill
    (engine/prefix_cache.py; 0: none);
    `draft_budget`: a step's rows get prompt-lookup drafts of their next tokens, checked in
    the same forward, while the step holds fewer tokens than this (engine/speculation.py; the
    output's distribution does not change; 0: none); `request_timeout_s` bounds a request's
    time. `weights` (the products' weights on the CPU, llama-family models): "auto" runs a
    GGUF file's quantized blocks for one-to-few-row steps and bfloat16 (CPUs with bfloat16
    instructions) or float16 weights for the rest; "quantized", "bfloat16", "float16",
    "float32" force one (engine/llama_runner.py). `compiled_step`: a lone sequence's
    one-token steps run as one graph compiled by torch.compile (engine/compiled_step.py;
    CPUs with a C++ compiler, quantized or float32 one-row products), built here (the first
    time on a machine about a minute, then seconds from inductor's cache): None (auto) where
    it can run, unless the environment sets `PEGMASK_COMPILED_STEP=0`; True, or an error
    where it cannot run; False never.
    `max_model_len` bounds a request's prompt and output tokens together (default: the
    model's context); `kv_cache_bytes` the key/value cache of the running requests, each
    counted with its whole prompt and output budget for every choice: a request waits while
    it does not fit, and one that could never fit is a bad request (None: no bound).
    `strict_tool_arguments` closes tool parameter objects that do not say
    `additionalProperties` (False: plain JSON Schema). `prewarm` pays the process's one-time
    grammar costs now rather than in the first request. `grammar_limits` are the size budgets
    every request's grammar is compiled and closed under (a grammar past one is a bad request
    naming it: `GrammarTooLarge`).

    Grammars compile in `compile_workers` worker processes (0: in the caller's thread, without
    time and memory budgets), each compile within `compile_timeout_s` seconds of the worker's
    CPU time and `compile_memory_bytes` of memory (None: unbounded); past either, the request
    fails with an `InvalidRequestError` naming the limit (`GrammarTooLarge`: `compile_time`,
    `compile_memory`).
    """

    def __init__(
        self,
        model: str | os.PathLike[str] | None = None,
        *,
        device: str | None = "cpu",
        dtype: str | None = None,
        dialect: str = "auto",
        chat_template: str | None = None,
        max_running: int = 32,
        max_queued: int = 256,
        prefill_chunk: int = 256,
        decode_first: bool | None = None,
        prefix_cache: int = 4,
        draft_budget: int = 48,
        request_timeout_s: float | None = None,
        weights: str = "auto",
        compiled_step: bool | None = None,
        strict_tool_arguments: bool = True,
        max_model_len: int | None = None,
        kv_cache_bytes: int | None = DEFAULT_KV_CACHE_BYTES,
        prewarm: bool = True,
        grammar_limits: GrammarLimits | None = None,
        compile_workers: int = DEFAULT_COMPILE_WORKERS,
        compile_timeout_s: float | None = DEFAULT_COMPILE_TIMEOUT_S,
        compile_memory_bytes: int | None = DEFAULT_COMPILE_MEMORY_BYTES,
    ):
        self.backend: ModelBackend = load_backend(model, device=device, dtype=dtype)
        context = self.backend.context_length
        if max_model_len is not None and not 0 < max_model_len <= context:
            raise ValueError(f"max_model_len must be between 1 and the model's context "
                             f"({context}), not {max_model_len}")
        self.max_model_len = max_model_len or context
        self.vocab: Vocabulary = self.backend.vocab
        self.metrics = Metrics()
        # Started first: the workers' start-up overlaps the rest of the engine's.
        self.compile_service = CompileService(self.vocab, workers=compile_workers,
                                              timeout_s=compile_timeout_s,
                                              memory_bytes=compile_memory_bytes,
                                              limits=grammar_limits or GrammarLimits(),
                                              on_compile=self.metrics.grammar_compiled)
        self.chat_template = chat_template or self.backend.chat_template
        # the tokenizer's special tokens: a derived dialect renders its template with them, and
        # the vocabulary's pick the family where the template writes no call
        tokens = self.backend.template_tokens()
        name = (detect_dialect(self.chat_template, tokens, self.vocab.special_ids)
                if dialect == "auto" else dialect)
        self.dialect_name = name
        # An unknown chat format: chats are plain text (no tool calls), not a wrong guess.
        self.dialect: Dialect | None = None
        self._native: Dialect | None = None
        if name == UNKNOWN:
            logger.warning("the chat template of %s writes no tool-call format pegmask knows: "
                           "chats are plain text and tools are refused; pass dialect= to pick "
                           "one", self.backend.name)
        else:
            options = dialect_options(name, self.chat_template, tokens)
            self.dialect = get_dialect(name, chat_template=self.chat_template, **options)
            # The dialect's own prompt format, for tools the model's template does not render.
            if self.dialect.native_renderer and not renders_tools(self.chat_template):
                self._native = get_dialect(name, **options)
        self.strict_tool_arguments = strict_tool_arguments
        # Tokenizing and building a request's grammar touch the tokenizer and the dialect's
        # caches: one request at a time (milliseconds; small requests render under it too).
        # Compiling is not under it.
        self._prepare_lock = threading.Lock()
        # A large request's prompt is made on the background lane, with a tokenizer of its own.
        self.background = BackgroundLane()
        self._background_encode: Callable[..., list[int]] | None = None
        self.runner = self.backend.runner(weights=weights,
                                          compiled_step=self._one_row_step(weights, compiled_step))
        kv_cache_tokens = None
        if kv_cache_bytes is not None:
            kv_cache_tokens = kv_cache_bytes // self.runner.token_bytes
            if kv_cache_tokens < 1:
                raise ValueError(f"kv_cache_bytes={kv_cache_bytes} holds no token of this "
                                 f"model ({self.runner.token_bytes} bytes a token)")
        self.limits = Limits(max_running=max_running, max_queued=max_queued,
                             prefill_chunk=prefill_chunk, request_timeout_s=request_timeout_s,
                             decode_first=(self.runner.device.type == "cpu"
                                           if decode_first is None else decode_first),
                             prefix_cache=prefix_cache, draft_budget=draft_budget,
                             kv_cache_tokens=kv_cache_tokens)
        self.stats = DecodeStats()
        # The raw text of turns with tool calls, replayed when clients send the calls back.
        self.replay = ReplayMemory()
        self.scheduler = Scheduler(self.runner, self.vocab, self.limits, self.stats,
                                   self.metrics, on_finish=self._remember)
        self.metrics.watch(self.scheduler)
        if prewarm:
            self.prewarm()

    def _one_row_step(self, weights: str, wanted: bool | None) -> bool:
        """Whether the runner takes the compiled one-row step (`compiled_step` in the class
        docstring), built by the time this returns True."""
        if wanted is None and os.environ.get("PEGMASK_COMPILED_STEP") == "0":
            wanted = False
        if wanted is False:
            return False
        try:
            self.backend.one_row_step(weights).warm()
        except Exception as error:  # auto: the eager step, and why
            if wanted:
                raise
            logger.warning("no compiled one-row step (%s): steps run eagerly", error)
            return False
        return True

    @property
    def model_name(self) -> str:
        return self.backend.name

    def close(self) -> None:
        """Stop the decode loop and the compile workers; requests still running end with an
        error."""
        self.scheduler.close()
        self.compile_service.close()
        self.background.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def prewarm(self) -> None:
        """Compile a tool-call grammar and walk its first masks: what the first request of a
        process would otherwise wait for (about 0.5 s of one-time caches). Without a dialect,
        the same schema as a response format. Nothing is decoded, so no output budget is
        checked (a small `max_model_len` leaves little room after the tool's prompt)."""
        chat = [{"role": "user", "content": "hi"}]
        if self.dialect is None:
            schema = _PREWARM_TOOL["function"]["parameters"]
            request = build_request(chat, close_on_length=False, response_format={
                "type": "json_schema", "json_schema": {"name": "prewarm", "schema": schema}})
        else:
            request = build_request(chat, tools=[_PREWARM_TOOL], tool_choice="required",
                                    close_on_length=False)
        spec = self.prepare(request)
        if spec.compiled is None:
            return
        from pegmask.kernels import allocate_token_bitmask

        matcher = spec.compiled.matcher()
        bitmask = allocate_token_bitmask(1, self.vocab.size)
        matcher.fill_next_token_bitmask(bitmask, 0)
        opening = matcher.find_jump_forward_string()
        if opening:
            matcher.accept_string(opening.decode("utf-8", errors="ignore"))
            matcher.fill_next_token_bitmask(bitmask, 0)

    # ----------------------------------------------------------------- public API
    def generate(
        self, prompt_or_messages: str | Sequence[Mapping[str, Any]], *, stream: bool = False,
        **options: Any,
    ) -> GenerationResult | GenerationStream:
        """Generate for a completion prompt (a string) or a chat (a list of messages).

        Options: max_tokens (unset: what fits after the prompt, at most 512; more than fits
        is an error), temperature (1), top_p, top_k, min_p, seed, stop, stop_token_ids,
        frequency_penalty, presence_penalty, repetition_penalty, logit_bias, logprobs,
        top_logprobs, ignore_eos, min_tokens, n, close_on_length, tools, tool_choice,
        parallel_tool_calls, response_format, grammar, chat_template_kwargs (see
        `pegmask.engine.requests.build_request`). A completion's grammar (`grammar`, or
        `response_format`) constrains its whole output; a chat's goes through the dialect with
        the tools. With `stream=True`, a `GenerationStream` of deltas. Bad requests raise
        `InvalidRequestError` (a ValueError) before anything is decoded.
        """
        request = self.request(prompt_or_messages, **options)
        submission = self.submit(request)
        if stream:
            return GenerationStream(self, submission, request.is_chat)
        return self.wait(submission)

    def generate_batch(
        self, requests: Sequence[Mapping[str, Any]], *, return_errors: bool = False
    ) -> list[GenerationResult | InvalidRequestError]:
        """Several requests decoded together. Each item holds `generate`'s keyword options
        plus the input under `prompt` or `messages`. A bad item raises before any decoding,
        or, with `return_errors`, takes its error's place in the results."""
        outcomes: list[Any] = []
        for i, item in enumerate(requests):
            try:
                outcomes.append(self._fits(self.prepare(self._batch_request(i, item))))
            except InvalidRequestError as exc:
                if not return_errors:
                    raise
                outcomes.append(exc)
        submissions = [self.scheduler.submit(o) if isinstance(o, RowSpec) else o
                       for o in outcomes]
        return [self.wait(s) if isinstance(s, Submission) else s for s in submissions]

    def request(self, prompt_or_messages: str | Sequence[Mapping[str, Any]],
                **options: Any) -> GenerationRequest:
        """Validate `generate`'s arguments (InvalidRequestError naming the bad one)."""
        options.setdefault("strict_tool_arguments", self.strict_tool_arguments)
        try:
            return build_request(prompt_or_messages, **options)
        except TypeError as exc:  # an unknown option name
            raise InvalidRequestError(str(exc)) from exc

    def submit(self, request: GenerationRequest) -> Submission:
        """Prepare `request` here (render, tokenize, compile: this thread waits for its
        grammar's compile in a worker) and queue it in the scheduler; raises
        InvalidRequestError, or QueueFullError when the queue is full."""
        return self.scheduler.submit(self._fits(self.prepare(request)))

    def _fits(self, spec: RowSpec) -> RowSpec:
        """`spec`, if what its choices can hold fits in the key/value cache budget at all
        (else it would wait forever); checked when a request is queued, not in `prepare`,
        which `prewarm` calls with a prompt and budget it never decodes."""
        budget = self.limits.kv_cache_tokens
        if budget is not None and spec.kv_tokens > budget:
            raise InvalidRequestError(
                f"max_tokens is too large: {spec.max_new_tokens}. {spec.sampling.n} choice(s) "
                f"of {len(spec.prompt_ids)} prompt and {spec.max_new_tokens} output tokens can "
                f"hold {spec.kv_tokens} tokens of key/value cache; this server holds at most "
                f"{budget} (kv_cache_bytes).", "max_tokens")
        return spec

    def wait(self, submission: Submission) -> GenerationResult:
        """Block until `submission` ends; its result, or its error raised."""
        submission.result()
        return self._result(submission)

    def _batch_request(self, index: int, item: Mapping[str, Any]) -> GenerationRequest:
        options = dict(item)
        if ("prompt" in options) == ("messages" in options):
            raise InvalidRequestError(
                f"requests[{index}] needs exactly one of prompt and messages", "messages")
        source = options.pop("prompt") if "prompt" in options else options.pop("messages")
        try:
            return self.request(source, **options)
        except InvalidRequestError as exc:
            if exc.param is None:  # an unknown option name
                raise InvalidRequestError(f"requests[{index}]: {exc}") from exc
            raise

    # ----------------------------------------------------------------- preparation
    def prepare(self, request: GenerationRequest) -> RowSpec:
        """Render, tokenize and compile: everything before the first forward. Requests take
        turns to render and tokenize (a large one does both on the background lane, beside
        them); their grammars compile side by side (or wait for the same grammar's compile
        under way), so a slow compile holds up only its own request."""
        prompt = self._large_prompt(request)
        with self._prepare_lock:
            staged = self._stage(request, prompt)
        request, grammar = staged.request, staged.grammar
        compiled = self.compiled(grammar, staged.param) if grammar is not None else None
        dialect = self.dialect
        if request.is_chat and request.grammar is None and dialect is not None:
            chat, vocab = request.chat, self.vocab
            assert compiled is not None

            def make_output() -> ChatOutput | TextOutput:
                return ChatOutput(DialectStreamParser(compiled.grammar, chat, vocab,
                                                      trusted=True))
        else:
            field_name = "content" if request.is_chat else "text"

            def make_output() -> ChatOutput | TextOutput:
                return TextOutput(self.vocab, field_name)
        stop_ids = frozenset(self.vocab.eos_ids)
        if compiled is not None:
            stop_ids = frozenset(compiled.stop_ids)
            if request.sampling.close_on_length:
                self._checked(lambda: self._check_budget(compiled, staged.max_new), staged.param)
        return RowSpec(staged.prompt_ids, request.sampling, staged.max_new, make_output,
                       compiled, stop_ids, frozenset(self.vocab.eos_ids), self.backend.encode,
                       staged.prompt_text)

    def _prompt(self, request: GenerationRequest, encode: Callable[..., list[int]]) -> _Prompt:
        """The request's prompt, rendered (a chat) and tokenized by `encode`."""
        if request.is_chat:
            text, native = self._render(request)
            return _Prompt(encode(text), text, native)
        return _Prompt(encode(request.prompt, add_special_tokens=True), None, False)

    def _large_prompt(self, request: GenerationRequest) -> _Prompt | None:
        """A large request's prompt, made on the background lane (engine/background.py) with its
        own tokenizer, outside `_prepare_lock` (rendering needs no lock); None for the others,
        whose prompts are made in turn under the lock."""
        source = (request.messages, request.chat.tools) if request.is_chat else request.prompt
        if text_size(source) <= LARGE_REQUEST_SIZE:
            return None
        return self.background.run(self._background_prompt, request)

    def _background_prompt(self, request: GenerationRequest) -> _Prompt:
        if self._background_encode is None:  # the lane's thread is its only user
            with self._prepare_lock:  # copied while no other thread uses the tokenizer
                self._background_encode = self.backend.encoder()
        return self._prompt(request, self._background_encode)

    def _stage(self, request: GenerationRequest, prompt: _Prompt | None = None) -> _Staged:
        """Everything before the compile: the prompt (None: made here, with the engine's
        tokenizer), the request's checks, and the grammar to compile with the request field its
        errors are about."""
        if prompt is None:
            prompt = self._prompt(request, self.backend.encode)
        prompt_ids, prompt_text = prompt.ids, None
        if request.is_chat:
            prompt_text = prompt.text
            # the prompt's tail says whether the output starts inside reasoning
            request = dataclasses.replace(request, chat=dataclasses.replace(
                request.chat, generation_prompt=prompt_text))
            if not prompt.native:
                prompt_text = None
        sampling = request.sampling
        max_new = self._max_new(sampling.max_tokens, len(prompt_ids),
                                "messages" if request.is_chat else "prompt")
        self._check_token_ids(sampling)
        if sampling.n > self.limits.max_running:
            raise InvalidRequestError(
                f"n={sampling.n} exceeds this server's {self.limits.max_running} running "
                "sequences", "n")
        if request.is_chat and self.dialect is None:
            request = self._plain_chat(request)
        dialect = self.dialect
        if request.is_chat and request.grammar is None and dialect is not None:
            # The dialect grammar embeds the tool schemas and the answer's schema.
            chat = request.chat
            param = "response_format" if chat.response_schema is not None else "tools"
            grammar = self._checked(lambda: dialect.grammar(chat), param)
            return _Staged(request, prompt_ids, prompt_text, max_new, grammar, param)
        return _Staged(request, prompt_ids, prompt_text, max_new, request.grammar,
                       request.grammar_param)

    def _max_new(self, max_tokens: int | None, prompt_tokens: int, prompt_param: str) -> int:
        """The output budget: `max_tokens`, which must fit in the context left after the
        prompt (vLLM's check and wording); unset, what fits, at most DEFAULT_MAX_TOKENS."""
        context = self.max_model_len
        room = context - prompt_tokens
        if room <= 0:
            raise InvalidRequestError(
                f"This model's maximum context length is {context} tokens. However, your "
                f"request has {prompt_tokens} input tokens. Please reduce the length of the "
                f"input {prompt_param}.", prompt_param)
        if max_tokens is None:
            return min(DEFAULT_MAX_TOKENS, room)
        if max_tokens > room:
            raise InvalidRequestError(
                f"max_tokens is too large: {max_tokens}. This model's maximum context length "
                f"is {context} tokens and your request has {prompt_tokens} input tokens "
                f"({max_tokens} > {context} - {prompt_tokens}).", "max_tokens")
        return max_tokens

    @staticmethod
    def _plain_chat(request: GenerationRequest) -> GenerationRequest:
        """A chat for a model whose dialect is unknown: its answer is plain content, under the
        response format's grammar if it has one; tools cannot be served."""
        chat = request.chat
        if chat.tools and chat.tool_choice != "none":
            raise InvalidRequestError(
                "this model's chat template writes no tool-call format pegmask knows, so tools "
                "cannot be constrained or parsed; start the engine with dialect=", "tools")
        if request.grammar is None and chat.response_format is not None:
            request = dataclasses.replace(
                request, grammar=grammar_for_format(chat.response_format, compile=False),
                grammar_param="response_format")
        return request

    @staticmethod
    def _check_budget(compiled: CompiledGrammar, max_new: int) -> None:
        """A grammar that must be entered (its shortest output is not empty: tool_choice
        required or named, a response format) and cannot be completed within the budget is a
        bad request, not an answer cut short. Where the shortest output is too long to count
        (`GrammarTooLarge`: past `GrammarLimits.max_completion_length`), a lower bound on its
        tokens that walks nothing may still show that it cannot fit."""
        matcher = compiled.matcher()
        try:
            needed = matcher.completion_token_count()
        except GrammarTooLarge:
            floor = matcher.completion_token_floor()
            if floor is None or floor <= max_new:
                raise
            needed, at_least = floor, "at least "
        else:
            at_least = ""
        if needed is None:
            raise InvalidRequestError("no output can complete this request's grammar",
                                      "response_format")
        if needed > max_new:
            raise InvalidRequestError(
                f"the shortest output this request allows takes {at_least}{needed} tokens, "
                f"more than max_tokens ({max_new}); raise max_tokens or set "
                "close_on_length=false", "max_tokens")

    def prompt_tokens(self, request: GenerationRequest) -> int:
        """How many tokens the request's prompt takes (rendered as for decoding)."""
        prompt = self._large_prompt(request)
        if prompt is None:
            with self._prepare_lock:
                prompt = self._prompt(request, self.backend.encode)
        return len(prompt.ids)

    def _check_token_ids(self, sampling: Any) -> None:
        width = self.backend.logits_width
        for name, ids in (("logit_bias", [t for t, _ in sampling.logit_bias]),
                          ("stop_token_ids", sampling.stop_token_ids)):
            bad = [t for t in ids if t >= width]
            if bad:
                raise InvalidRequestError(
                    f"{name}: token id {bad[0]} is outside the vocabulary ({width} tokens)", name)

    def render(self, request: GenerationRequest) -> str:
        """The chat prompt: the model's template, or the dialect's native format when there are
        tools the template would drop."""
        return self._render(request)[0]

    def _render(self, request: GenerationRequest) -> tuple[str, bool]:
        """(prompt, whether the dialect's native renderer wrote it). Natively rendered turns
        this engine generated are replayed byte for byte from `self.replay`."""
        chat: ChatRequest = request.chat
        kwargs = dict(request.template_kwargs)
        dialect = self.dialect
        if dialect is None:
            if not self.chat_template:
                raise InvalidRequestError("the model has no chat template: send a completion "
                                          "prompt, or start the engine with chat_template=",
                                          "messages")
            for key, value in self.backend.template_tokens().items():
                kwargs.setdefault(key, value)
            text = self._checked(lambda: render_chat_template(
                self.chat_template, request.messages, tools=chat.tools or None,
                add_generation_prompt=True, **kwargs), "messages")
            return text, False
        native = bool(chat.tools) and self._native is not None
        if native:
            dialect = self._native
            kwargs["replay"] = self.replay
        else:
            for key, value in self.backend.template_tokens().items():
                kwargs.setdefault(key, value)
        text = self._checked(
            lambda: dialect.render(request.messages, tools=chat.tools or None,
                                   add_generation_prompt=True, **kwargs),
            "messages",
        )
        return text, native

    def _remember(self, submission: Submission) -> None:
        """Keep the raw text of each generated turn that made tool calls (scheduler hook)."""
        prompt = submission.spec.prompt_text
        if prompt is None:
            return
        for row in submission.rows:
            output = row.output
            if isinstance(output, ChatOutput) and output.message["tool_calls"]:
                generated = row.text(spell_specials=True)
                # A derived dialect has no native renderer: its turns start at the output.
                turn = (generated if self.dialect_name == DERIVED
                        else replay_text(self.dialect_name, prompt, generated))
                self.replay.remember(output.message["tool_calls"], turn)

    def compiled(self, grammar: Grammar, param: str = "grammar") -> CompiledGrammar:
        """`grammar` bound to this model's vocabulary (compiled in a worker and kept across
        requests: `CompileService`); compile errors, budgets included, become
        `InvalidRequestError`s about `param`."""
        return self._checked(lambda: self.compile_service.compile(grammar), param)

    @staticmethod
    def _checked(build: Any, param: str) -> Any:
        try:
            return build()
        except InvalidRequestError:
            raise
        except (ValueError, TypeError, RecursionError, jinja2.TemplateError) as exc:
            raise InvalidRequestError(str(exc), param) from exc

    # ----------------------------------------------------------------- results
    def _result(self, submission: Submission) -> GenerationResult:
        choices = [self._choice(row) for row in submission.rows]
        prompt_tokens = len(submission.spec.prompt_ids)
        completion = sum(len(row.generated) for row in submission.rows)
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
                 "total_tokens": prompt_tokens + completion,
                 "prompt_tokens_details": {"cached_tokens": submission.cached_tokens}}
        first = choices[0]
        return GenerationResult(first.text, first.message, first.finish_reason, usage,
                                first.token_ids, choices, first.logprobs)

    @staticmethod
    def _choice(row: Row) -> Choice:
        output = row.output
        # A chat's text is the raw output (e.g. its <tool_call> blocks); a completion's, plain.
        chat = isinstance(output, ChatOutput)
        text = row.text(spell_specials=chat)
        message = output.message if chat else {
            "role": "assistant", "content": text, "reasoning_content": None, "tool_calls": []}
        logprobs = row.logprobs if row.spec.sampling.logprobs else None
        stop_string = row.stops.matched if row.stops is not None else None
        return Choice(row.index, text, message, row.finish_reason or "length",
                      list(row.generated), logprobs, stop_string)


# --------------------------------------------------------------------------- dialects
def renders_tools(template: str | None) -> bool:
    """Whether a chat template reads the `tools` variable at all."""
    return bool(template and _TOOLS_VARIABLE.search(template))
