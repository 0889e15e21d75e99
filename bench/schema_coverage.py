"""Which JSON Schemas each engine compiles, and how fast: JSONSchemaBench's datasets and the
draft 2020-12 conformance suite, for pegmask, xgrammar, llguidance and outlines-core.

Every engine runs at its defaults (bench/grammar_engines.py) on SmolLM2's vocabulary, in a
worker process of its own that is warmed up with one schema first. A schema's *attempt* is its
compile plus the first mask of a new matcher, timed in the worker; it counts as compiled when
that finishes within the limit (20 s), else as timed out, and the worker is replaced when it
does not answer in time. An engine's compile error is a refusal, grouped by reason (pegmask:
the `UnsupportedSchemaError` keyword; peers: the exception and its first words); any other
exception, or a worker that dies, is a crash.

On the conformance suite each compiled schema is also checked against its labelled instances,
token by token as constrained decoding runs: each instance written by `json.dumps` with
characters as themselves (`ensure_ascii=False`, as a model writes them; llguidance's defaults
refuse `\\u00e1` escapes), tokenized by SmolLM2's tokenizer, every token allowed by the mask
and accepted, then EOS allowed. An instance agrees when that verdict is its label; valid
instances rejected include the generation choices that differ from validation (pegmask: formats
asserted, properties in schema order; tests/test_json_schema_suite.py tells those apart).

    pegmask bench schema_coverage [--data DIR] [--per-dataset N] [--engine NAME] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import re
import resource
import sys
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pegmask.bench.grammar_engines import NAMES, Compiled, CompileError, SkippedError
from pegmask.bench.jsonschema_agreement import error_cause
from pegmask.bench.jsonschemabench import SAMPLE_DIR, dataset_files, read_schema
from pegmask.bench.reporting import (
    RESULTS_DIR,
    command_line,
    load_average,
    machine,
    machine_info,
    publish,
    write_json,
)

SUITE_DIR = Path(__file__).resolve().parents[1] / "tests" / "data" / "json_schema_suite"
RESULTS = RESULTS_DIR / "schema_coverage.md"
TIME_LIMIT_S = 20.0
ANSWER_SLACK_S = 10.0  # beyond the limit, for the answer (and outlines-core's helper restart)
START_TIMEOUT_S = 300.0  # a worker's setup: the tokenizer and the engine
MEMORY_GIB = 6.0
"""Address space a worker (setup included, about 1 GiB) and outlines-core's helper may take;
one compile runs at a time, so one process at a time grows."""
REASONS_SHOWN = 12


# --------------------------------------------------------------------------- results
@dataclass
class Attempt:
    """One schema on one engine: compiled (with `ms`, compile + first mask), refused (with
    `reason`), "timeout" or "crash"; `verdicts` (label, accepted) for the suite's instances,
    None for an instance the tokenizer does not spell exactly."""

    engine: str
    dataset: str
    name: str
    status: str
    reason: str = ""
    detail: str = ""  # a refusal's or crash's message, its first line
    ms: float = 0.0
    verdicts: list[tuple[bool, bool] | None] = field(default_factory=list)


@dataclass
class Coverage:
    """Attempts on JSONSchemaBench and on the suite, with what the run was."""

    engines: tuple[str, ...]
    bench: list[Attempt]
    suite: list[Attempt]
    meta: dict[str, Any]


# --------------------------------------------------------------------------- worker side
def _serve(connection: Any, name: str, vocab: str, limit_s: float, memory_gib: float) -> None:
    """Worker loop: (schema text, instance texts with labels) in, an `Attempt` out."""
    from pegmask.bench.grammar_engines import make_engine
    from pegmask.bench.grammar_inputs import WARMUP_SCHEMA, load_model

    with open("/proc/self/statm") as statm:  # set first: outlines-core's helper inherits it
        current = int(statm.read().split()[0]) * resource.getpagesize()
    limit = current + int(memory_gib * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    model = load_model(vocab)
    engine = make_engine(name, "default", model, outlines_timeout=limit_s)
    _compile_and_mask(engine, json.dumps(WARMUP_SCHEMA))
    spelled: list[bytes | None] = []  # token bytes, read when the first instance comes
    connection.send("ready")
    while (request := connection.recv()) is not None:
        text, instances = request
        attempt, compiled = _attempt(engine, text, limit_s)
        if attempt.status == "compiled" and instances:
            if not spelled:
                from pegmask.grammars.vocab import Vocabulary

                spelled = Vocabulary.from_hf(model.tokenizer, model.size).token_bytes
            attempt.verdicts = [_verdict(engine, model, spelled, compiled, instance, valid)
                                for instance, valid in instances]
        connection.send(attempt)
    engine.close()


def _compile_and_mask(engine: Any, text: str) -> tuple[Any, int]:
    """The compiled grammar, and the ns its compile and a new matcher's first mask took."""
    start = time.perf_counter_ns()
    compiled = engine.compile("json_schema", text)
    elapsed = time.perf_counter_ns() - start
    if isinstance(compiled, Compiled):  # built, and timed, in outlines-core's helper process
        compiled, elapsed = compiled.grammar, compiled.compile_ns
    start = time.perf_counter_ns()
    engine.fill(engine.matcher(compiled))()
    return compiled, elapsed + time.perf_counter_ns() - start


def _attempt(engine: Any, text: str, limit_s: float) -> tuple[Attempt, Any]:
    """The attempt, and the compiled grammar (None unless compiled in time)."""
    attempt = Attempt(engine.name, "", "", "compiled")
    try:
        compiled, elapsed = _compile_and_mask(engine, text)
    except SkippedError:
        attempt.status, attempt.reason = "timeout", "Index build stopped at the limit"
        return attempt, None
    except CompileError as exc:
        attempt.status, attempt.reason = refusal(exc)
        attempt.detail = _first_line(exc)
        return attempt, None
    except MemoryError:
        attempt.status, attempt.reason = "crash", "out of memory"
        return attempt, None
    except Exception as exc:  # noqa: BLE001 - any other error is the engine's crash
        attempt.status, attempt.reason = "crash", error_cause(exc)
        attempt.detail = _first_line(exc)
        return attempt, None
    attempt.ms = elapsed / 1e6
    if attempt.ms > 1000 * limit_s:
        attempt.status, attempt.reason = "timeout", "finished over the limit"
        return attempt, None
    return attempt, compiled


def _first_line(exc: BaseException, limit: int = 160) -> str:
    return (str(exc).strip().splitlines() or [""])[0][:limit]


def refusal(exc: CompileError) -> tuple[str, str]:
    """("refused", reason) for an engine's compile error; ("crash", ...) for what
    grammar_engines reports as a pegmask front-end bug."""
    from pegmask.grammars import UnsupportedSchemaError

    cause = exc.__cause__
    if str(exc).startswith("internal error"):
        return "crash", " ".join(str(exc).split()[:4])
    if isinstance(cause, UnsupportedSchemaError):
        return "refused", f"unsupported {cause.keyword}"
    # Without the JSON that some messages quote (outlines-core's "structure {...}").
    return "refused", re.split(r" [\[{]", error_cause(cause if cause is not None else exc))[0]


def _verdict(engine: Any, model: Any, spelled: list[bytes | None], compiled: Any,
             instance: str, valid: bool) -> tuple[bool, bool] | None:
    """(label, accepted token by token), None when the tokens do not spell `instance`."""
    tokens = model.encode(instance)
    if b"".join(spelled[t] or b"\0" for t in tokens) != instance.encode():
        return None
    matcher = engine.matcher(compiled)
    engine.reset(matcher)  # llguidance's compiled grammar is its one matcher
    fill, accept = engine.fill(matcher), engine.accept(matcher)
    for token in tokens:
        fill()
        if not engine.allowed(token) or accept(token) is False:
            return valid, False
    fill()
    return valid, engine.allowed(model.eos_id)


# --------------------------------------------------------------------------- parent side
class EngineWorker:
    """An engine's worker process; one that runs past its time or dies is replaced."""

    def __init__(self, name: str, vocab: str = "smollm2", limit_s: float = TIME_LIMIT_S,
                 memory_gib: float = MEMORY_GIB, slack_s: float = ANSWER_SLACK_S):
        self.name, self.vocab, self.limit_s, self.memory_gib = name, vocab, limit_s, memory_gib
        self.slack_s = slack_s
        self.context = multiprocessing.get_context("spawn")
        self.starts = 0
        self._spawn()

    def _spawn(self) -> None:
        # Not a daemon: outlines-core's engine starts a helper process of its own.
        self.connection, child = self.context.Pipe()
        self.process = self.context.Process(
            target=_serve, args=(child, self.name, self.vocab, self.limit_s, self.memory_gib))
        self.process.start()
        child.close()
        self.ready = False
        self.starts += 1

    def wait_ready(self) -> None:
        if self.ready:
            return
        if not self.connection.poll(START_TIMEOUT_S):
            self.process.kill()
            raise RuntimeError(f"the {self.name} worker did not start in {START_TIMEOUT_S:g} s")
        try:
            self.connection.recv()
        except EOFError:
            raise RuntimeError(f"the {self.name} worker failed to start (exit code "
                               f"{self.process.exitcode}; its error is printed above)") from None
        self.ready = True

    def attempt(self, dataset: str, name: str, text: str,
                instances: Sequence[tuple[str, bool]] = ()) -> Attempt:
        self.wait_ready()
        self.connection.send((text, list(instances)))
        if self.connection.poll(self.limit_s + self.slack_s):
            try:
                attempt = self.connection.recv()
            except EOFError:
                self.process.join()
                attempt = Attempt(self.name, "", "", "crash",
                                  f"worker died (exit code {self.process.exitcode})")
                self._spawn()
                self.wait_ready()  # here, not beside the other engines' next attempts
        else:
            attempt = Attempt(self.name, "", "", "timeout", "no answer: worker replaced")
            self._restart()
            self.wait_ready()
        attempt.dataset, attempt.name = dataset, name
        return attempt

    def _restart(self) -> None:
        self.process.kill()
        self.process.join()
        self._spawn()

    def close(self) -> None:
        if not self.ready:  # still setting up: nothing to finish
            self.process.kill()
        if self.process.is_alive():
            try:
                self.connection.send(None)
            except OSError:
                pass
            self.process.join(30)
            if self.process.is_alive():
                self.process.kill()
                self.process.join()


def suite_groups(suite_dir: Path = SUITE_DIR) -> list[tuple[str, dict[str, Any]]]:
    """("file stem #index", group) for every schema group of the conformance suite (the
    attempts' dataset is the file stem: the keyword the group tests)."""
    return [(f"{path.stem} #{index}", group) for path in sorted(suite_dir.glob("*.json"))
            for index, group in enumerate(json.loads(path.read_text(encoding="utf-8")))]


def measure(engines: Sequence[str], bench: dict[str, list[Path]],
            suite: Sequence[tuple[str, dict[str, Any]]], *, limit_s: float = TIME_LIMIT_S,
            memory_gib: float = MEMORY_GIB, vocab: str = "smollm2",
            progress: bool = False) -> Coverage:
    """Every schema of `bench` (dataset -> files) and `suite` on every engine, schema by
    schema (the engines in turn, so that a change of load falls on all of them alike)."""
    meta = {"load_start": load_average(), "limit_s": limit_s, "memory_gib": memory_gib,
            "vocab": vocab}
    start = time.perf_counter()
    workers = [EngineWorker(name, vocab, limit_s, memory_gib)  # they set up side by side
               for name in engines]
    bench_attempts: list[Attempt] = []
    suite_attempts: list[Attempt] = []
    try:
        jobs = [(bench_attempts, dataset, path.stem, read_schema(path), ())
                for dataset, files in bench.items() for path in files]
        jobs += [(suite_attempts, key.split(" #")[0], key, json.dumps(group["schema"]),
                  [(json.dumps(test["data"], ensure_ascii=False), bool(test["valid"]))
                   for test in group["tests"]])
                 for key, group in suite]
        for number, (target, dataset, name, text, instances) in enumerate(jobs, start=1):
            target += [w.attempt(dataset, name, text, instances) for w in workers]
            if progress and number % 100 == 0:
                print(f"  {number} of {len(jobs)} schemas", file=sys.stderr, flush=True)
    finally:
        for worker in workers:
            worker.close()
    meta["seconds"] = time.perf_counter() - start
    meta["worker_restarts"] = {w.name: w.starts - 1 for w in workers}
    meta["load_end"] = load_average()
    return Coverage(tuple(engines), bench_attempts, suite_attempts, meta)


# --------------------------------------------------------------------------- report
def percentiles(attempts: Iterable[Attempt]) -> tuple[float, float, float] | None:
    """p50, p90, p99 of compile + first mask (ms) over the compiled attempts."""
    times = [a.ms for a in attempts if a.status == "compiled"]
    if not times:
        return None
    p50, p90, p99 = np.percentile(times, [50, 90, 99])
    return float(p50), float(p90), float(p99)


def _share(part: int, whole: int) -> str:
    return f"{part} ({100 * part / whole:.1f}%)" if whole else "-"


def _coverage_row(label: str, engine: str, attempts: list[Attempt]) -> str:
    counts = Counter(a.status for a in attempts)
    times = percentiles(attempts)
    spread = " | ".join(f"{t:.1f}" for t in times) if times else "- | - | -"
    return (f"| {label} | {engine} | {_share(counts['compiled'], len(attempts))} | "
            f"{counts['refused']} | {counts['timeout']} | {counts['crash']} | {spread} |")


def coverage_table(coverage: Coverage) -> str:
    """Per dataset and engine: compiled, refused, timed out, crashed, time percentiles; then
    the times over the schemas every engine compiled (the like-for-like comparison)."""
    lines = ["| dataset (schemas) | engine | compiled | refused | timed out | crashed | "
             "p50 ms | p90 ms | p99 ms |", "|---|---|---|---|---|---|---|---|---|"]
    datasets = list(dict.fromkeys(a.dataset for a in coverage.bench))
    for dataset in [*datasets, None]:
        rows = [a for a in coverage.bench if dataset is None or a.dataset == dataset]
        count = len(rows) // len(coverage.engines)
        label = f"**all** ({count})" if dataset is None else f"{dataset} ({count})"
        lines += [_coverage_row(label, engine, [a for a in rows if a.engine == engine])
                  for engine in coverage.engines]
    failed = {(a.dataset, a.name) for a in coverage.bench if a.status != "compiled"}
    common = [a for a in coverage.bench if (a.dataset, a.name) not in failed]
    label = f"**compiled by all** ({len(common) // len(coverage.engines)})"
    lines += [_coverage_row(label, engine, [a for a in common if a.engine == engine])
              for engine in coverage.engines]
    return "\n".join(lines)


def reasons_table(attempts: list[Attempt], engines: Sequence[str]) -> str:
    """Refusals, time-outs and crashes by reason, per engine, with the datasets they fall in."""
    lines = ["| engine | count | outcome: reason | datasets | example |", "|---|---|---|---|---|"]
    for engine in engines:
        failed = [a for a in attempts if a.engine == engine and a.status != "compiled"]
        by_reason: dict[str, Counter] = {}
        examples: dict[str, Attempt] = {}
        for a in failed:
            key = f"{a.status}: {a.reason}" if a.reason else a.status
            by_reason.setdefault(key, Counter())[a.dataset] += 1
            examples.setdefault(key, a)
        ranked = sorted(by_reason.items(), key=lambda item: -item[1].total())
        for key, datasets in ranked[:REASONS_SHOWN]:
            where = ", ".join(f"{d} {n}" for d, n in datasets.most_common(4))
            example = f"{examples[key].name}: {examples[key].detail}".rstrip(": ")
            lines.append(f"| {engine} | {datasets.total()} | {_cell(key)} | {where} | "
                         f"{_cell(example)} |")
        rest = sum(c.total() for _, c in ranked[REASONS_SHOWN:])
        if rest:
            lines.append(f"| {engine} | {rest} | {len(ranked) - REASONS_SHOWN} other reasons | "
                         "| |")
        if not failed:
            lines.append(f"| {engine} | 0 | - | | |")
    return "\n".join(lines)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def suite_table(coverage: Coverage) -> str:
    """Per engine: schemas compiled; over them, instances agreeing with their labels, invalid
    ones accepted, valid ones rejected."""
    lines = ["| engine | schemas compiled | instances | agreeing | invalid accepted | "
             "valid rejected | timed out | crashed |", "|---|---|---|---|---|---|---|---|"]
    for engine in coverage.engines:
        attempts = [a for a in coverage.suite if a.engine == engine]
        counts = Counter(a.status for a in attempts)
        verdicts = [v for a in attempts for v in a.verdicts if v is not None]
        agreeing = sum(label == accepted for label, accepted in verdicts)
        lines.append(
            f"| {engine} | {_share(counts['compiled'], len(attempts))} | {len(verdicts)} | "
            f"{_share(agreeing, len(verdicts))} | "
            f"{sum(not label and accepted for label, accepted in verdicts)} | "
            f"{sum(label and not accepted for label, accepted in verdicts)} | "
            f"{counts['timeout']} | {counts['crash']} |")
    return "\n".join(lines)


def sections(coverage: Coverage) -> str:
    """The report's tables under their headings (what `pegmask bench grammars` can embed)."""
    parts = []
    if coverage.bench:
        schemas = len(coverage.bench) // len(coverage.engines)
        parts += [f"## JSONSchemaBench: {schemas} schemas", "",
                  "Compiled within the limit, refused, timed out, crashed; compile + first mask "
                  "percentiles over the compiled schemas.", "", coverage_table(coverage), "",
                  "### Schemas not compiled, by reason", "",
                  reasons_table(coverage.bench, coverage.engines), ""]
    if coverage.suite:
        groups = len(coverage.suite) // len(coverage.engines)
        unspelled = sum(v is None for a in coverage.suite for v in a.verdicts)
        parts += [f"## Draft 2020-12 conformance suite: {groups} schemas", "",
                  "Instances of the schemas each engine compiled, token by token; "
                  f"{unspelled} instance verdicts left out because the tokenizer does not spell "
                  "the text exactly.", "", suite_table(coverage), "",
                  "### Schemas not compiled, by reason", "",
                  reasons_table(coverage.suite, coverage.engines), ""]
    return "\n".join(parts)


def figures(coverage: Coverage) -> dict[str, Any]:
    """The run as JSON data: its settings and every attempt."""
    return {"engines": list(coverage.engines), "meta": coverage.meta,
            "jsonschemabench": [asdict(a) for a in coverage.bench],
            "suite": [asdict(a) for a in coverage.suite]}


def markdown(coverage: Coverage, command: str) -> str:
    meta = coverage.meta
    data = meta.get("data", "")
    return "\n\n".join([
        "# JSON Schema coverage: JSONSchemaBench and the draft 2020-12 suite",
        machine_info() + f"\n- load average at the start: {meta['load_start']:.1f}",
        f"Command: `{command}`",
        f"Engines at their defaults (bench/grammar_engines.py), {meta['vocab']} vocabulary, each "
        f"in a worker process warmed up with one schema. Limit {meta['limit_s']:g} s per "
        "schema for compile + first mask (over it: timed out); a worker that dies, out of "
        f"its {meta['memory_gib']:g} GiB of address space included, is a crash. "
        "JSONSchemaBench data: "
        f"{data}. Wall time {meta['seconds']:.0f} s; workers replaced "
        f"{meta['worker_restarts']}.",
        sections(coverage),
    ]) + "\n"


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(prog="pegmask bench schema_coverage",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=SAMPLE_DIR,
                        help="JSONSchemaBench's data/ folder (default: the vendored sample, "
                        "data/jsonschemabench; see its README for the full set)")
    parser.add_argument("--per-dataset", type=int, help="only the first N schemas of each")
    parser.add_argument("--suite-groups", type=int,
                        help="only the first N schemas of the conformance suite")
    parser.add_argument("--no-bench", action="store_true", help="the conformance suite only")
    parser.add_argument("--no-suite", action="store_true", help="JSONSchemaBench only")
    parser.add_argument("--engine", action="append", choices=NAMES,
                        help="an engine to run (repeat it; default all)")
    parser.add_argument("--limit", type=float, default=TIME_LIMIT_S,
                        help=f"seconds per schema (default {TIME_LIMIT_S:g})")
    parser.add_argument("--memory-gib", type=float, default=MEMORY_GIB,
                        help=f"address space per worker process (default {MEMORY_GIB:g} GiB)")
    parser.add_argument("--vocab", default="smollm2")
    parser.add_argument("--out", type=Path, default=RESULTS,
                        help="markdown report, JSON beside it (default "
                        "bench/results/schema_coverage.md)")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    try:
        bench = {} if args.no_bench else dataset_files(args.data, args.per_dataset)
    except ValueError as exc:
        parser.error(str(exc))
    suite = [] if args.no_suite else suite_groups()[: args.suite_groups]
    engines = tuple(args.engine or NAMES)
    coverage = measure(engines, bench, suite, limit_s=args.limit, memory_gib=args.memory_gib,
                       vocab=args.vocab, progress=not args.quiet)
    coverage.meta["data"] = (f"{args.data} ({sum(map(len, bench.values()))} schemas in "
                             f"{len(bench)} datasets)" if bench else "not run")
    command = command_line("schema_coverage", argv)
    publish(markdown(coverage, command), args.out)
    write_json({"command": command, "machine": machine(), **figures(coverage)},
               args.out.with_suffix(".json"))


if __name__ == "__main__":
    main()
