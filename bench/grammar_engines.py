"""The four grammar engines of the grammar bench behind one interface, each in a named
configuration.

* **default**: what a user gets who calls the engine without options: pegmask
  `Grammar.from_json_schema(schema)` (at most 32 whitespace characters between JSON tokens),
  xgrammar `compile_json_schema(schema)` (any whitespace, `strict_mode=True`: no properties or
  items beyond the schema's), llguidance `grammar_from_json_schema(schema)` (flexible
  whitespace, `\\uXXXX` escapes only for control characters), outlines-core
  `build_regex_from_schema(schema)` (its default whitespace `[ ]?`).
* **equalized**: the peers constrain pegmask's language: xgrammar with `strict_mode=False`
  (JSON Schema's own semantics) and `max_whitespace_cnt=32`, llguidance with the same bounded
  whitespace and general `\\uXXXX` escapes. pegmask's and outlines-core's configurations are
  their defaults (outlines-core's `Index` cannot afford a whitespace bound: builds explode).

An engine's `key` names it and its configuration ("xgrammar/equalized"); `name` is the engine.
Regular expressions compile the same way in both configurations; a PEG grammar (pegmask's DSL)
compiles on pegmask only.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from pegmask.bench.grammar_inputs import Model
from pegmask.bench.rss import peak_rss
from pegmask.grammars.json_schema import DEFAULT_MAX_WHITESPACE
from pegmask.kernels.bitmask import bitmask_words

NAMES = ("pegmask", "xgrammar", "llguidance", "outlines")
CONFIGS = ("default", "equalized")
# Engines whose equalized configuration is their default: measured once, shown in both tables.
SAME_IN_BOTH = ("pegmask", "outlines")
# Whitespace between JSON tokens in the equalized configuration: pegmask's default bound.
MAX_WHITESPACE = DEFAULT_MAX_WHITESPACE
DEFAULT_OUTLINES_TIMEOUT = 5.0


def engine_key(name: str, config: str) -> str:
    """The key of `name` in `config` ("xgrammar/equalized"; a plain name when the engine's
    configuration is the same in both)."""
    return name if config == "default" or name in SAME_IN_BOTH else f"{name}/{config}"


def config_keys(config: str) -> tuple[str, ...]:
    """The engines of one configuration's table, pegmask first."""
    return tuple(engine_key(name, config) for name in NAMES)


class CompileError(Exception):
    """An engine could not compile a grammar."""


class SkippedError(CompileError):
    """A grammar left out on purpose (over this engine's time limit)."""


class Engine:
    """One engine bound to one model: setup once, then compile grammars and drive matchers.

    `fill` and `accept` return callables so that the timed loop calls the engine's cheapest
    public entry point directly; `allowed` reads the bit of a token in the filled row.
    """

    name = ""

    def __init__(self, model: Model, config: str = "default"):
        if config not in CONFIGS:
            raise ValueError(f"unknown configuration {config!r}: {', '.join(CONFIGS)}")
        self.model = model
        self.config = config
        self.key = engine_key(self.name, config)
        self.bitmask_np: np.ndarray = np.zeros((1, bitmask_words(model.size)), dtype=np.int32)

    def compile(self, kind: str, source: str) -> Any:
        """`source` (a JSON Schema's text, a regex, or a PEG grammar) compiled for the model;
        `CompileError` when the engine cannot."""
        compile_kind = getattr(self, f"compile_{kind}", None)
        if compile_kind is None:
            raise CompileError(f"{self.name} does not read {kind} grammars")
        return compile_kind(source)

    def matcher(self, compiled: Any) -> Any:
        return compiled

    def fill(self, matcher: Any) -> Callable[[], Any]:
        raise NotImplementedError

    def accept(self, matcher: Any) -> Callable[[int], Any]:
        raise NotImplementedError

    def reset(self, matcher: Any) -> None:
        matcher.reset()

    def close(self) -> None:
        """Release what the engine holds outside this process."""

    def allowed(self, token_id: int) -> bool:
        return bool(self.bitmask_np[0, token_id >> 5] >> (token_id & 31) & 1)


class Pegmask(Engine):
    name = "pegmask"

    def __init__(self, model: Model, config: str = "default"):
        from pegmask.grammars.compiler import prepare_vocabulary
        from pegmask.grammars.vocab import Vocabulary
        from pegmask.kernels import allocate_token_bitmask

        super().__init__(model, config)
        self.vocab = Vocabulary.from_hf(model.tokenizer, model.size)
        prepare_vocabulary(self.vocab)
        self.bitmask = allocate_token_bitmask(1, model.size)
        self.bitmask_np = self.bitmask.numpy()

    def _compiled(self, build: Callable[[], Any]) -> Any:
        from pegmask.grammars import GrammarError
        from pegmask.grammars.compiler import compile_grammar

        try:
            return compile_grammar(build(), self.vocab)
        except GrammarError as exc:
            raise CompileError(str(exc)) from exc
        except Exception as exc:  # a front-end bug: reported with the grammar, not fatal
            raise CompileError(f"internal error {type(exc).__name__}: {exc}") from exc

    def compile_json_schema(self, schema: str) -> Any:
        from pegmask.grammars import Grammar

        return self._compiled(lambda: Grammar.from_json_schema(schema))

    def compile_regex(self, pattern: str) -> Any:
        from pegmask.grammars import Grammar

        return self._compiled(lambda: Grammar.from_regex(pattern))

    def compile_peg(self, text: str) -> Any:
        from pegmask.grammars import Grammar

        return self._compiled(lambda: Grammar.from_peg(text))

    def matcher(self, compiled: Any) -> Any:
        return compiled.matcher()

    def fill(self, matcher: Any) -> Callable[[], Any]:
        return functools.partial(matcher.fill_next_token_bitmask, self.bitmask, 0)

    def accept(self, matcher: Any) -> Callable[[int], Any]:
        return matcher.accept_token


class XGrammar(Engine):
    """`cache_enabled=False`: xgrammar's compiler without its compiled-grammar cache, which it
    enables by default (with it, the compile also builds what the cache keeps: a 20,000-string
    enum takes about 5x longer; bench/compile_scale.py shows both)."""

    name = "xgrammar"

    def __init__(self, model: Model, config: str = "default", *, cache_enabled: bool = True):
        import xgrammar as xgr

        super().__init__(model, config)
        info = xgr.TokenizerInfo.from_huggingface(
            model.tokenizer, vocab_size=model.size, stop_token_ids=[model.eos_id]
        )
        self.compiler = xgr.GrammarCompiler(info, cache_enabled=cache_enabled)
        self.matcher_class = xgr.GrammarMatcher
        self.bitmask = xgr.allocate_token_bitmask(1, model.size)
        self.bitmask_np = self.bitmask.numpy()

    def compile_json_schema(self, schema: str) -> Any:
        options: dict[str, Any] = {}
        if self.config == "equalized":  # JSON Schema semantics, pegmask's whitespace bound
            options = {"strict_mode": False, "max_whitespace_cnt": MAX_WHITESPACE}
        try:
            return self.compiler.compile_json_schema(schema, **options)
        except (RuntimeError, ValueError) as exc:
            raise CompileError(str(exc)) from exc

    def compile_regex(self, pattern: str) -> Any:
        try:
            return self.compiler.compile_regex(pattern)
        except (RuntimeError, ValueError) as exc:
            raise CompileError(str(exc)) from exc

    def matcher(self, compiled: Any) -> Any:
        return self.matcher_class(compiled)

    def fill(self, matcher: Any) -> Callable[[], Any]:
        return functools.partial(matcher.fill_next_token_bitmask, self.bitmask, 0)

    def accept(self, matcher: Any) -> Callable[[int], Any]:
        return matcher.accept_token


class LLGuidance(Engine):
    name = "llguidance"
    EQUALIZED = {"whitespace_pattern": f"[\\x20\\x0A\\x0D\\x09]{{0,{MAX_WHITESPACE}}}",
                 "json_allow_general_unicode_escapes": True}

    def __init__(self, model: Model, config: str = "default"):
        import llguidance
        import llguidance.hf

        super().__init__(model, config)
        self.tokenizer = llguidance.hf.from_tokenizer(
            model.tokenizer, n_vocab=model.size, eos_token=model.eos_id
        )
        self.matcher_class = llguidance.LLMatcher
        self.pointer = self.bitmask_np.ctypes.data

    def compile_json_schema(self, schema: str) -> Any:
        defaults = self.EQUALIZED if self.config == "equalized" else None
        return self._matcher(lambda: self.matcher_class.grammar_from_json_schema(
            schema, defaults=defaults))

    def compile_regex(self, pattern: str) -> Any:
        return self._matcher(lambda: self.matcher_class.grammar_from_regex(pattern))

    def _matcher(self, grammar: Callable[[], str]) -> Any:
        """The `LLMatcher` of a grammar: its construction is llguidance's compile."""
        try:
            matcher = self.matcher_class(self.tokenizer, grammar(), log_level=0)
        except ValueError as exc:
            raise CompileError(str(exc)) from exc
        if matcher.is_error():
            raise CompileError(matcher.get_error())
        return matcher

    def fill(self, matcher: Any) -> Callable[[], Any]:
        return functools.partial(matcher.unsafe_compute_mask_ptr, self.pointer,
                                 self.bitmask_np.nbytes)

    def accept(self, matcher: Any) -> Callable[[int], Any]:
        return matcher.consume_token


class Outlines(Engine):
    """outlines-core; its `Index` is built in a helper process (see `OutlinesWorker`)."""

    name = "outlines"

    def __init__(self, model: Model, config: str = "default",
                 timeout: float = DEFAULT_OUTLINES_TIMEOUT, warm_up: bool = True):
        from outlines_core import Guide, Vocabulary
        from outlines_core.json_schema import build_regex_from_schema

        from pegmask.grammars.vocab import Vocabulary as PegVocabulary

        super().__init__(model, config)
        tokens: dict[bytes, list[int]] = {}
        for token_id, data in enumerate(PegVocabulary.from_hf(model.tokenizer).token_bytes):
            if data is not None and token_id != model.eos_id:
                tokens.setdefault(data, []).append(token_id)
        self.worker = OutlinesWorker(Vocabulary(model.eos_id, tokens), timeout, warm_up)
        self.guide_class = Guide
        self.build_regex = build_regex_from_schema
        self.pointer = self.bitmask_np.ctypes.data

    def compile_json_schema(self, schema: str) -> Any:
        start = time.perf_counter_ns()
        try:
            regex = self.build_regex(schema)
        except (ValueError, TypeError) as exc:
            raise CompileError(str(exc)) from exc
        return self._index(regex, time.perf_counter_ns() - start)

    def compile_regex(self, pattern: str) -> Any:
        return self._index(pattern, 0)

    def _index(self, regex: str, regex_ns: int) -> Compiled:
        index, index_ns, rss_mib = self.worker.build(regex)
        return Compiled(index, regex_ns + index_ns, rss_mib)

    def matcher(self, compiled: Any) -> Any:
        return self.guide_class(compiled)

    def fill(self, matcher: Any) -> Callable[[], Any]:
        return functools.partial(matcher.write_mask_into, self.pointer, self.bitmask_np.shape[1], 4)

    def accept(self, matcher: Any) -> Callable[[int], Any]:
        def advance(token_id: int) -> bool:
            try:
                matcher.advance(token_id, False)
            except ValueError:
                return False
            return True

        return advance

    def close(self) -> None:
        self.worker.close()


@dataclass
class Compiled:
    """A compiled grammar whose compile time and memory were measured in a helper process."""

    grammar: Any
    compile_ns: int
    rss_mib: float


class OutlinesWorker:
    """A helper process that builds outlines-core `Index`es, so that one which runs past
    `timeout` seconds can be stopped (the process is then replaced). The index comes back
    pickled, with its build time and the helper's peak RSS growth. `warm_up`: build a trivial
    index first, so that the first one timed is not the helper's first."""

    def __init__(self, vocabulary: Any, timeout: float, warm_up: bool = True):
        import multiprocessing

        self.context = multiprocessing.get_context("spawn")
        self.vocabulary = vocabulary
        self.timeout = timeout
        self.warm_up = warm_up
        self._start()

    def _start(self) -> None:
        self.connection, child = self.context.Pipe()
        self.process = self.context.Process(
            target=_outlines_worker, args=(child, self.vocabulary, self.warm_up), daemon=True
        )
        self.process.start()
        child.close()

    def build(self, regex: str) -> tuple[Any, int, float]:
        self.connection.send(regex)
        if not self.connection.poll(self.timeout):
            self._restart()
            raise SkippedError(f"Index build over {self.timeout:g} s")
        try:
            result = self.connection.recv()
        except EOFError:  # the helper died (out of memory, most likely)
            self._restart()
            raise CompileError("the Index build's process died") from None
        if isinstance(result, str):
            raise CompileError(result)
        return result

    def _restart(self) -> None:
        self.process.kill()
        self.process.join()
        self._start()

    def close(self) -> None:
        self.connection.send(None)
        self.process.join()


def _outlines_worker(connection: Any, vocabulary: Any, warm_up: bool) -> None:
    """Helper-process loop: regex in, (index, build ns, peak RSS MiB) or an error text out."""
    from outlines_core import Index

    if warm_up:
        Index("a", vocabulary)
    while (regex := connection.recv()) is not None:
        memory: dict[str, float] = {}
        try:
            with peak_rss(memory):
                start = time.perf_counter_ns()
                index = Index(regex, vocabulary)
                elapsed = time.perf_counter_ns() - start
        except (ValueError, TypeError) as exc:
            connection.send(str(exc))
            continue
        connection.send((index, elapsed, memory["rss_mib"]))


ENGINE_CLASSES: dict[str, type[Engine]] = {
    "pegmask": Pegmask, "xgrammar": XGrammar, "llguidance": LLGuidance, "outlines": Outlines,
}


def make_engine(name: str, config: str, model: Model,
                outlines_timeout: float = DEFAULT_OUTLINES_TIMEOUT, warm_up: bool = True) -> Engine:
    """Engine `name` in `config`, set up for `model` (`warm_up`: see `OutlinesWorker`)."""
    if name == "outlines":
        return Outlines(model, config, outlines_timeout, warm_up)
    return ENGINE_CLASSES[name](model, config)
