"""pegmask against xgrammar, llguidance and outlines-core, side by side: every peer at its
defaults first (what users compare), then with the languages equalized.

The engines run in this process, on the same grammars, vocabularies and token sequences, and
take turns per case (in a rotating order) so that machine noise hits all alike. For each case a
valid instance (for a JSON Schema, serialized with `json.dumps`, default separators) is
tokenized with the model's real tokenizer, and each engine is measured on:

* **setup**: the one-time vocabulary setup (tokenizer info), apart from any grammar;
* **compile**: grammar -> compiled grammar for the vocabulary;
* **first mask**: matcher creation plus the first mask after a cold compile;
* **mask / accept per token** (warm): further passes over the same tokens after `reset()`
  (per token, the fastest of `WARM_PASSES`, to filter out preemption);
* **cold generation**: compile + every mask and accept of the first pass;
* **memory**: peak RSS growth during compile + cold pass (Linux `VmHWM`, reset through
  `/proc/self/clear_refs`; a lower bound, as memory the allocator holds is reused unseen);
* **first compile of a fresh process** (`fresh_compile`), measured in a new process per engine.

Every token of the valid sequence must be allowed by each engine's mask and then accepted; a
refusal is reported and that engine's pass stops there. Token statistics cover the prefix
every engine of a table accepted, so all engines are timed on the same tokens. Statistics
cover the cases every engine of a table compiled (and, in a second table, those all but
outlines-core compiled); each engine's failures are listed. outlines-core builds its `Index`
(a DFA walked over the whole vocabulary) in a helper process, where its time and memory are
measured, so that a build running past `--outlines-timeout` seconds can be stopped; that case
is then reported as skipped.

    pegmask bench grammars [--quick] [--vocab smollm2|deepseek|both|PATH] [--schemas N]
        [--schema FILE | --regex FILE | --grammar FILE] [--instance FILE] [--out FILE.md]
"""

from __future__ import annotations

import argparse
import functools
import gc
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pegmask.bench.fresh_compile import first_compiles
from pegmask.bench.grammar_engines import (
    CONFIGS,
    DEFAULT_OUTLINES_TIMEOUT,
    NAMES,
    Compiled,
    CompileError,
    Engine,
    SkippedError,
    config_keys,
    make_engine,
)
from pegmask.bench.grammar_inputs import (
    VOCABULARIES,
    WARMUP_INSTANCE,
    WARMUP_SCHEMA,
    Case,
    Model,
    load_cases,
    load_model,
    peg_file_case,
    regex_file_case,
    schema_file_case,
    tool_call_case,
)
from pegmask.bench.plots import against_peers, bars, distributions
from pegmask.bench.reporting import (
    RESULTS_DIR,
    command_line,
    machine,
    machine_info,
    publish,
    write_json,
)
from pegmask.bench.rss import peak_rss
from pegmask.kernels.bitmask import bitmask_words

BASELINE = "xgrammar"
DEFAULT_SCHEMAS = 50
WARM_PASSES = 3
FLOOR_CALLS = 20_000
DEFAULT_TOOL_REPEATS = 5  # one cold run is noisy on a shared machine (1.1-2.3x across runs)
QUICK = {"vocab": "smollm2", "schemas": 10, "tool_repeats": 2, "outlines_timeout": 2.0}
# Every engine and configuration measured: the union of the two tables' engines.
KEYS = tuple(dict.fromkeys(key for config in CONFIGS for key in config_keys(config)))


# ---------------------------------------------------------------------- measurement


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
    """One engine's cold run on one case."""

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
    """Every engine's results on one case, by engine key."""

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

    def refused(self, key: str) -> bool:
        """Whether engine `key` refused a token of the valid instance or the stop token."""
        c = self.runs[key].cold
        return c.accepted < self.tokens or c.eos_allowed is False


def measure_schema(engines: list[Engine], case: Case, model: Model, turn: int) -> SchemaRun:
    """Compile and run `case` on every engine, in an order rotated by `turn`."""
    tokens = model.encode(case.text)
    run = SchemaRun(case, tokens)
    order = engines[turn % len(engines):] + engines[: turn % len(engines)]
    clock = time.perf_counter_ns
    matchers: dict[str, Any] = {}
    for engine in order:
        memory: dict[str, float] = {}
        with peak_rss(memory):
            start = clock()
            try:
                compiled = engine.compile(case.kind, case.source)
            except CompileError as exc:
                run.failures[engine.key] = ("skipped: " if isinstance(exc, SkippedError) else "") + (
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
        matchers[engine.key] = matcher
        rss_mib = memory.get("helper", memory["rss_mib"])
        run.runs[engine.key] = Cold(compile_ns, matcher_ns, cold, rss_mib)
    for engine in order:
        if engine.key in matchers:
            cold = run.runs[engine.key]
            cold.warm = warm_pass(engine, matchers[engine.key], tokens, cold.cold.accepted)
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
    """Every engine and configuration (`KEYS`) bound to `model`, with each one's vocabulary
    setup time and memory."""
    engines: list[Engine] = []
    setups: dict[str, Setup] = {}
    for key in KEYS:
        name, _, config = key.partition("/")
        memory: dict[str, float] = {}
        with peak_rss(memory):
            start = time.perf_counter()
            engines.append(make_engine(name, config or "default", model, outlines_timeout))
            seconds = time.perf_counter() - start
        setups[key] = Setup(seconds, memory["rss_mib"])
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


@dataclass
class VocabRun:
    """Everything measured on one vocabulary."""

    model: Model
    setups: dict[str, Setup]
    tools: list[SchemaRun]  # the tool-call schema's cold repeats (none on a user's cases)
    runs: list[SchemaRun]
    floor: tuple[float, float]
    fresh: dict[str, dict[str, Any]]  # `first_compiles`, by engine name


def run_vocab(name: str, cases: list[Case], *, tool_repeats: int, outlines_timeout: float,
              fresh: bool) -> VocabRun:
    """Benchmark every engine on one vocabulary."""
    from tqdm import tqdm

    model = load_model(name)
    engines, setups = make_engines(model, outlines_timeout)
    warm_up(engines, model)
    gc.collect()
    gc.freeze()  # later collections (before each measurement) skip the setup's objects
    tools, runs = [], []
    work = [("tool", tool_call_case(turn)) for turn in range(tool_repeats)]
    work += [("case", case) for case in cases]
    with tqdm(total=len(work), desc=f"grammars [{model.name}]", unit="case", file=sys.stderr,
              dynamic_ncols=True) as progress:
        for turn, (kind, case) in enumerate(work):
            progress.set_postfix_str(case.name[:40])
            (tools if kind == "tool" else runs).append(measure_schema(engines, case, model, turn))
            progress.update()
    floor = python_fill_floor(model)
    for engine in engines:
        engine.close()
    gc.unfreeze()
    first = first_compiles(name) if fresh else {}
    return VocabRun(model, setups, tools, runs, floor, first)


# ---------------------------------------------------------------------- statistics


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


def present(runs: list[SchemaRun], engines: tuple[str, ...]) -> tuple[str, ...]:
    """The engines that compiled at least one of `runs` (a PEG grammar: pegmask alone)."""
    return tuple(key for key in engines if any(key in r.runs for r in runs))


def baseline_of(engines: tuple[str, ...]) -> str:
    """The engine a table's ratios are against: xgrammar's entry, else the first."""
    return next((key for key in engines if key.partition("/")[0] == BASELINE), engines[0])


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
            summary.rejected += r.refused(name)
        return summary

    def figures(self) -> dict[str, float]:
        """The table's figures, for the JSON report."""
        return {
            "cases": len(self.compile_ms), "compile_ms_median": _median(self.compile_ms),
            "first_mask_us_median": _median(self.first_mask_us),
            "mask_us_median": _median(self.mask_us), "mask_us_p99": _p99(self.mask_us),
            "mask_us_mean": _mean(self.mask_us), "accept_us_median": _median(self.accept_us),
            "cold_ms_median": _median(self.cold_ms), "cold_ms_total": sum(self.cold_ms),
            "rss_mib_median": _median(self.rss_mib), "rejected_valid": self.rejected,
        }


def display(key: str) -> str:
    """An engine key as a table shows it (the table's heading names the configuration)."""
    return key.partition("/")[0]


def engine_table(runs: list[SchemaRun], engines: tuple[str, ...], setups: dict[str, Setup],
                 repeated: bool = False) -> str:
    """One row per engine over `runs` (all compiled by `engines`), with ratios to the
    baseline; per-case columns show median / max (or total) when there are several cases,
    the median alone when `runs` are repeats of one schema."""
    spread = len(runs) > 1 and not repeated
    summaries = {name: Summary.of(name, runs, engines) for name in engines}
    base = summaries[baseline_of(engines)]
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
            display(name),
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


def table_sets(runs: list[SchemaRun], config: str) -> list[tuple[str, ...]]:
    """The engine sets of one configuration's case tables: all that compiled any case, then
    (when it differs) the same without outlines-core, which fails or times out on many."""
    engines = present(runs, config_keys(config))
    sets = [engines]
    without = tuple(key for key in engines if not key.startswith("outlines"))
    if without and without != engines:
        sets.append(without)
    return sets


def failures_section(runs: list[SchemaRun]) -> str:
    """Per-engine failure and skip counts, then each case an engine did not compile."""
    def count(key: str, skipped: bool) -> int:
        return sum(1 for r in runs if key in r.failures
                   and r.failures[key].startswith("skipped") == skipped)

    lines = [
        "Compile failures: " + ", ".join(f"{k} {count(k, False)}" for k in KEYS)
        + "; skipped (over the time limit): " + ", ".join(f"{k} {count(k, True)}" for k in KEYS)
        + ".",
        "",
    ]
    lines += [f"- `{r.case.name}` {key}: {reason}" for r in runs
              for key, reason in r.failures.items()]
    return "\n".join(lines)


def disagreements_section(runs: list[SchemaRun], model: Model) -> str:
    """Where an engine refused a token of a valid instance (shown in context), or the stop
    token at its end."""
    lines = []
    for r in runs:
        for key, c in r.runs.items():
            if c.cold.accepted < r.tokens:
                at = len(model.tokenizer.decode(r.token_ids[: c.cold.accepted]))
                before, after = r.case.text[max(0, at - 30): at], r.case.text[at: at + 20]
                lines.append(f"- `{r.case.name}` {key}: token {c.cold.accepted} of {r.tokens} "
                             f"refused: `{before}⟦{after}`")
            elif c.cold.eos_allowed is False:
                lines.append(f"- `{r.case.name}` {key}: stop token refused at the end")
    return "\n".join(dict.fromkeys(lines)) or "none"


def slowest_section(runs: list[SchemaRun], engines: tuple[str, ...], engine: str = "pegmask",
                    top: int = 8) -> str:
    """The cases where `engine` is slowest cold, split into phases, next to the baseline
    (over the tokens every one of `engines` accepted)."""
    baseline = baseline_of(engines)

    def cold_ns(r: SchemaRun, name: str) -> int:
        return r.runs[name].cold_generation_ns(r.common(engines), r.tokens)

    header = ["case", "tokens (timed)", "compile ms", "first mask ms", "cold masks ms",
              "cold accepts ms", "warm mask µs median", "cold total ms",
              f"{display(baseline)} cold total ms"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in sorted(runs, key=lambda r: -cold_ns(r, engine))[:top]:
        c, count = r.runs[engine], r.common(engines)
        masks, accepts = c.cold.steps(count, r.tokens)
        warm = c.warm.steps(count, r.tokens)[0] if c.warm else []
        lines.append("| " + " | ".join([
            f"`{r.case.name}`", f"{r.tokens} ({count})", f"{c.compile_ns / 1e6:.1f}",
            f"{c.first_mask_ns() / 1e6:.1f}", f"{sum(masks) / 1e6:.1f}",
            f"{sum(accepts) / 1e6:.2f}", f"{_median(warm) / 1e3:.1f}",
            f"{cold_ns(r, engine) / 1e6:.1f}", f"{cold_ns(r, baseline) / 1e6:.1f}",
        ]) + " |")
    return "\n".join(lines)


def fresh_section(result: VocabRun) -> str:
    """The first compile of a fresh process next to the warm compiles of this run."""
    header = ["engine", "setup ms", "first compile ms (fresh process)",
              "second compile ms (same process)", "compile ms in this run (warm, median)",
              "first mask ms (fresh process)"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name in NAMES:
        fresh = result.fresh.get(name, {"error": "not measured"})
        warm = [r.runs[name].compile_ns / 1e6 for r in result.tools if name in r.runs]
        if "error" in fresh:
            lines.append(f"| {name} | failed: {fresh['error']} | | | | |")
            continue
        lines.append(f"| {name} | {fresh['setup_ms']:.0f} | {fresh['first_compile_ms']:.1f} | "
                     f"{fresh['second_compile_ms']:.1f} | {_median(warm):.1f} | "
                     f"{fresh['first_mask_ms']:.2f} |")
    return "\n".join(lines)


# ---------------------------------------------------------------------- report


CONFIG_NOTES = {
    "default": """\
Each engine as a user calls it without options: pegmask `Grammar.from_json_schema(schema)` (at
most 32 whitespace characters between JSON tokens); xgrammar `compile_json_schema(schema)` (any
whitespace, unbounded; `strict_mode=True`, so properties and items the schema does not list are
refused); llguidance `grammar_from_json_schema(schema)` (flexible whitespace; `\\uXXXX` escapes
refused except for control characters, so a `json.dumps` instance with `\\u00b0` is refused);
outlines-core `build_regex_from_schema(schema)` (whitespace `[ ]?`). The languages differ, so
a refused valid instance says what a user of that default would have hit.""",
    "equalized": """\
What changed from the defaults, so that the first three engines constrain the same language:
xgrammar `compile_json_schema(schema, strict_mode=False, max_whitespace_cnt=32)` (JSON Schema's
own semantics for unlisted properties, pegmask's whitespace bound: the bound costs xgrammar
states, its compiles are much slower with it); llguidance `defaults={"whitespace_pattern":
"[\\x20\\x0A\\x0D\\x09]{0,32}", "json_allow_general_unicode_escapes": true}`. pegmask and
outlines-core keep their defaults (the same measurements as above): outlines-core's `Index`
cannot afford a whitespace bound.""",
}

SETTINGS = """\
Calls timed: pegmask `compile_grammar` + `fill_next_token_bitmask`; xgrammar
`GrammarCompiler` (default `max_threads=8`, so a compile may use every core; its cache, on by
default, is kept, and each tool-call repeat has its own schema text) + `fill_next_token_bitmask`;
llguidance `LLMatcher` (its construction is the compile) + `unsafe_compute_mask_ptr`;
outlines-core `Index` (built in a helper process, where its time and memory are measured; a
build over the time limit is stopped and the case skipped) + `Guide.write_mask_into`. Every
mask is a full int32 bitmask row of the logits width.

Columns: wall-clock times (`time.perf_counter_ns`) around each call; ratios in parentheses are
against xgrammar in the same configuration. *setup*: the one-time vocabulary setup and its RSS
growth (pegmask: `Vocabulary.from_hf` + `prepare_vocabulary`; xgrammar: `TokenizerInfo`;
llguidance: `LLTokenizer`; outlines-core: `Vocabulary` from pegmask's token bytes and starting
its helper process). *first mask*: matcher creation + the first mask after a cold compile.
*mask / accept µs*: per token of the warm passes (each token's fastest of 3 passes after
`reset()`, which filters out preemption; every timed token of every case plus the final
mask). *cold generation*: compile + matcher + every mask and accept of the first pass.
*rejected valid*: cases where the engine refused a token of the valid instance or the stop
token after it. *peak RSS*: growth of peak RSS during compile + cold pass (outlines-core:
during the `Index` build in the helper), a lower bound since memory the allocator already
holds is reused unseen. The fresh-process table times the tool-call schema's first compile in
a new process per engine (after its setup), then a second compile of the same language under
another schema text."""


def report_vocab(result: VocabRun, plots: list[Path], out_dir: Path) -> str:
    """The markdown section for one vocabulary."""
    model, runs = result.model, result.runs
    parts = [f"## {model.name} ({model.size:,} tokens; tokenizer loaded in "
             f"{model.load_seconds:.1f} s)"]
    for number, config in enumerate(CONFIGS, start=1):
        title = "every engine at its defaults" if config == "default" else "languages equalized"
        parts += ["", f"### {number}. {title.capitalize()}", "", CONFIG_NOTES[config]]
        engines = config_keys(config)
        if result.tools:
            tool = result.tools[0]
            parts += ["", f"#### Tool-call schema ({tool.tokens} tokens; medians of "
                      f"{len(result.tools)} cold runs)", ""]
            compiled = present(result.tools, engines)
            parts.append(engine_table(timed_runs(result.tools, compiled), compiled,
                                      result.setups, repeated=True))
        for subset in table_sets(runs, config):
            timed = timed_runs(runs, subset)
            parts += [
                "",
                f"#### {len(timed)} of {len(runs)} cases compiled by "
                f"{', '.join(map(display, subset))} ({sum(r.common(subset) for r in timed)} "
                "tokens timed)",
                "",
                engine_table(timed, subset, result.setups) if timed else "none",
            ]
    if result.fresh:
        parts += ["", "### 3. First compile in a fresh process", "", fresh_section(result)]
    floor = result.floor
    parts += [
        "",
        f"Floor of a fill written in Python, timed the same way: a method that returns at once "
        f"{floor[0]:.2f} µs; one that only copies a mask into the row "
        f"({4 * bitmask_words(model.size):,} bytes) {floor[1]:.2f} µs (median of "
        f"{FLOOR_CALLS:,} calls).",
        "",
        "### Failures, refusals, pegmask's slowest cases",
        "",
        failures_section(runs),
        "",
        "Refused tokens of valid instances (⟦ marks the refused token):",
        "",
        disagreements_section([*result.tools[:1], *runs], model),
    ]
    equalized = present(runs, tuple(k for k in config_keys("equalized")
                                    if not k.startswith("outlines")))
    timed = timed_runs(runs, equalized)
    if timed and "pegmask" in equalized:
        parts += ["", "pegmask's slowest cases (cold), by phase, equalized configuration:", "",
                  slowest_section(timed, equalized)]
    if plots:
        parts += ["", "Plots (every engine at its defaults):", ""]
        parts += [f"![{path.stem}]({path.relative_to(out_dir).as_posix()})" for path in plots]
    return "\n".join(parts)


def draw(result: VocabRun, stem: Path) -> list[Path]:
    """Mask-time distributions, cold generation per case against each peer, and coverage,
    for the default configuration."""
    runs, engines = result.runs, config_keys("default")
    paths = []
    compiled = present(runs, engines)
    timed = timed_runs(runs, compiled)
    label = result.model.name
    if timed:
        masks = {display(key): Summary.of(key, timed, compiled).mask_us for key in compiled}
        paths.append(distributions(
            masks, title=f"Warm mask time per token, defaults ({label}, {len(timed)} cases)",
            ylabel="µs per mask (log)", out=Path(f"{stem}_masks.png")))
    if "pegmask" in compiled and len(compiled) > 1:
        points = {}
        for peer in compiled[1:]:
            pair = ("pegmask", peer)
            points[display(peer)] = [
                (r.runs[peer].cold_generation_ns(r.common(pair), r.tokens) / 1e6,
                 r.runs["pegmask"].cold_generation_ns(r.common(pair), r.tokens) / 1e6)
                for r in timed_runs(runs, pair)]
        paths.append(against_peers(
            points, title=f"Cold generation per case, defaults ({label})",
            xlabel="peer: compile + every mask, ms (log)",
            ylabel="pegmask: compile + every mask, ms (log)", out=Path(f"{stem}_cold.png")))
    if runs:
        counts = coverage(runs, KEYS)
        paths.append(bars(
            list(KEYS), counts, title=f"Coverage of {len(runs)} cases ({label})",
            ylabel="cases", out=Path(f"{stem}_coverage.png"), stacked=True))
    return paths


def coverage(runs: list[SchemaRun], keys: tuple[str, ...]) -> dict[str, list[int]]:
    """Per engine, how many cases it compiled and accepted whole, compiled but refused,
    failed to compile, or skipped."""
    outcome = {"compiled, valid instance accepted": [], "compiled, valid instance refused": [],
               "compile failed": [], "skipped (time limit)": []}
    for key in keys:
        compiled = [r for r in runs if key in r.runs]
        failed = [r.failures[key] for r in runs if key in r.failures]
        skipped = sum(reason.startswith("skipped") for reason in failed)
        refused = sum(r.refused(key) for r in compiled)
        for label, value in zip(outcome, (len(compiled) - refused, refused,
                                          len(failed) - skipped, skipped), strict=True):
            outcome[label].append(value)
    return outcome


def figures(result: VocabRun) -> dict[str, Any]:
    """The JSON report of one vocabulary."""
    tables: dict[str, Any] = {}
    for config in CONFIGS:
        engines = config_keys(config)
        entry: dict[str, Any] = {}
        if result.tools:
            compiled = present(result.tools, engines)
            tools = timed_runs(result.tools, compiled)
            entry["tool_call"] = {display(k): Summary.of(k, tools, compiled).figures()
                                  for k in compiled}
        for subset in table_sets(result.runs, config):
            timed = timed_runs(result.runs, subset)
            entry["cases compiled by " + ", ".join(map(display, subset))] = {
                display(k): Summary.of(k, timed, subset).figures() for k in subset}
        tables[config] = entry
    return {
        "vocabulary": result.model.name, "tokens": result.model.size,
        "tables": tables, "fresh_process": result.fresh,
        "coverage": coverage(result.runs, KEYS) if result.runs else {},
        "failures": {r.case.name: r.failures for r in result.runs if r.failures},
        "cases": [{"name": r.case.name, "kind": r.case.kind, "tokens": r.tokens,
                   "engines": {k: {"compile_ms": c.compile_ns / 1e6,
                                   "cold_ms": c.cold_generation_ns(c.cold.accepted, r.tokens)
                                   / 1e6, "accepted_tokens": c.cold.accepted,
                                   "refused": r.refused(k)}
                               for k, c in r.runs.items()}}
                  for r in result.runs],
        "python_fill_floor_us": list(result.floor),
    }


def user_cases(args: argparse.Namespace) -> list[Case] | None:
    """The user's own grammar, or None to run the suite."""
    if args.schema:
        return [schema_file_case(args.schema, args.instance)]
    if args.regex:
        return [regex_file_case(args.regex, args.instance)]
    if args.grammar:
        return [peg_file_case(args.grammar, args.instance)]
    if args.instance:
        raise ValueError("--instance goes with --schema, --regex or --grammar")
    return None


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(prog="pegmask bench grammars",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"a few minutes: {QUICK['schemas']} schemas, "
                        f"{QUICK['tool_repeats']} tool-call repeats, SmolLM2's vocabulary")
    parser.add_argument("--vocab", default=None,
                        help=f"{', '.join(VOCABULARIES)}, both, or a GGUF file / Hugging Face "
                        "folder / tokenizer.json (default both)")
    parser.add_argument("--schemas", type=int, default=None,
                        help=f"data/jsonschema files to run, an even spread in name order "
                        f"(default {DEFAULT_SCHEMAS})")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--schema", type=Path,
                        help="your JSON Schema file (or a data/jsonschema-style file with tests)")
    source.add_argument("--regex", type=Path, help="your regular expression file")
    source.add_argument("--grammar", type=Path, help="your grammar in pegmask's PEG DSL (pegmask "
                        "only: no peer reads it)")
    parser.add_argument("--instance", type=Path,
                        help="a text (or JSON document) your grammar accepts: the tokens timed")
    parser.add_argument("--outlines-timeout", type=float, default=None,
                        help="seconds an outlines-core Index build may take before the case is "
                        f"skipped (default {DEFAULT_OUTLINES_TIMEOUT:g})")
    parser.add_argument("--tool-repeats", type=int, default=None,
                        help="cold runs of the tool-call schema (its table shows their medians; "
                        f"default {DEFAULT_TOOL_REPEATS})")
    parser.add_argument("--no-fresh", action="store_true",
                        help="skip the first compile in a fresh process")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    parser.add_argument("--out", type=Path,
                        help="markdown report (JSON and PNGs beside it; default "
                        "bench/results/grammar_bench[_quick|_custom].md)")
    args = parser.parse_args(argv)
    quick = QUICK if args.quick else {}

    def option(value: Any, key: str, default: Any) -> Any:
        """An option given, else its --quick value, else its default."""
        return value if value is not None else quick.get(key, default)

    vocab = option(args.vocab, "vocab", "both")
    schemas = option(args.schemas, "schemas", DEFAULT_SCHEMAS)
    repeats = option(args.tool_repeats, "tool_repeats", DEFAULT_TOOL_REPEATS)
    timeout = option(args.outlines_timeout, "outlines_timeout", DEFAULT_OUTLINES_TIMEOUT)
    if schemas < 1 or repeats < 1 or timeout <= 0:
        parser.error("--schemas and --tool-repeats must be at least 1, --outlines-timeout "
                     "above 0")
    try:
        cases = user_cases(args)
    except ValueError as exc:
        parser.error(str(exc))
    suite = cases is None
    out = args.out or RESULTS_DIR / ("grammar_bench" + ("_quick" if args.quick else "")
                                     + ("" if suite else "_custom") + ".md")
    names = VOCABULARIES if vocab == "both" else (vocab,)
    results, sections, data = [], [], []
    for name in names:
        result = run_vocab(name, load_cases(schemas) if suite else cases,
                           tool_repeats=repeats if suite else 0, outlines_timeout=timeout,
                           fresh=suite and not args.no_fresh)
        results.append(result)
        plots = [] if args.no_plots else draw(result, out.with_suffix("").with_name(
            f"{out.stem}_{result.model.name}"))
        sections.append(report_vocab(result, plots, out.parent))
        data.append(figures(result))
    command = command_line("grammars", argv)
    report = "\n\n".join([
        "# Grammar engines side by side: masks for JSON Schemas"
        + ("" if suite else f" and your {cases[0].kind} grammar"),
        machine_info(),
        f"Command: `{command}`",
        SETTINGS,
        *sections,
    ]) + "\n"
    publish(report, out)
    write_json({"command": command, "machine": machine(), "vocabularies": data},
               out.with_suffix(".json"))


if __name__ == "__main__":
    main()
