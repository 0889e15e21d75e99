"""Token-level agreement with the labels of data/jsonschema: pegmask against xgrammar.

Every labelled instance is serialized with `json.dumps` (default separators `", "` / `": "`),
tokenized with the real SmolLM2 tokenizer, and fed to each engine's matcher token by token: a
token must be allowed by the engine's bitmask before it is accepted, and at the end the mask
must allow EOS. The instance is *accepted* when all of that holds, *rejected* otherwise, and
the engine *agrees* when that verdict is the label (`valid`). This is what constrained decoding
actually does, so it also catches masks that are looser or tighter than the engine's own
matcher.

Each engine is measured over the schemas it compiles; a second table restricts both to the
schemas both compile (the fair comparison). Disagreements are grouped by cause: for a wrongly
accepted instance the keyword `jsonschema` reports as violated, for a wrongly rejected one
"property order" (when the engine accepts it with any property order) or the lexical place of
the byte where the engine refused (object key, string value, `}`, end of text...).

For pegmask it also checks the one-program invariant, per instance: the mask allows a token
exactly when `accept_token` takes it, and the token-level verdict equals `Grammar.parse`'s.
Any failure there is a bug, listed under "inconsistencies".

The sweep runs each (schema, engine) pair in a forked child with a time limit, since a schema
can make a compiler run away; in-process runs (`isolate=False`) are for small samples.

    python -m pegmask.bench.jsonschema_agreement [--sample N] [--jobs J] [--timeout S]
"""

from __future__ import annotations

import argparse
import functools
import json
import multiprocessing
import multiprocessing.connection
import os
import random
import re
import resource
import time
import traceback
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pegmask.bench.data import JSONSCHEMA_DIR
from pegmask.bench.reporting import RESULTS_DIR, publish
from pegmask.engine.model import default_model_path
from pegmask.grammars import Grammar, GrammarError, SchemaError, UnsupportedSchemaError
from pegmask.grammars.vocab import Vocabulary

RESULTS = RESULTS_DIR / "jsonschema_agreement.md"
ENGINES = ("pegmask", "xgrammar")
XGRAMMAR_OPTIONS: dict[str, Any] = {"any_whitespace": True, "strict_mode": False}
"""`any_whitespace` accepts json.dumps' spaces; `strict_mode=False` keeps JSON Schema's rule
that an absent `additionalProperties` allows extra properties (as pegmask's default does)."""
EXAMPLES_PER_CAUSE = 3


# --------------------------------------------------------------------------- results
@dataclass
class Verdict:
    """One instance as one engine saw it."""

    index: int
    valid: bool
    accepted: bool
    cause: str | None = None  # why the verdict is not the label; None when it agrees
    detail: str = ""
    inconsistency: str | None = None  # pegmask only: mask, matcher and parser disagree


@dataclass
class FileOutcome:
    """One (schema file, engine) pair: compiled or why not, and the verdicts."""

    file: str
    engine: str
    status: str  # "ok", "error" (the engine refused the schema), "timeout", "crash"
    error: str = ""
    verdicts: list[Verdict] = field(default_factory=list)
    compile_seconds: float = 0.0
    check_seconds: float = 0.0  # feeding the tokens only (not the cause analysis)
    tokens: int = 0


@dataclass
class EngineStats:
    """Counts for one engine over a set of files."""

    engine: str
    files: int = 0
    compiled: int = 0
    instances: int = 0
    agreeing: int = 0
    valid: int = 0
    valid_accepted: int = 0
    invalid: int = 0
    invalid_rejected: int = 0
    tokens: int = 0
    compile_seconds: float = 0.0
    check_seconds: float = 0.0
    failures: Counter = field(default_factory=Counter)
    causes: Counter = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)
    inconsistencies: list[str] = field(default_factory=list)

    @property
    def agreement(self) -> float:
        return self.agreeing / self.instances if self.instances else 1.0

    def add(self, outcome: FileOutcome) -> None:
        self.files += 1
        if outcome.status != "ok":
            self.failures[outcome.error if outcome.status == "error" else outcome.status] += 1
            return
        self.compiled += 1
        self.tokens += outcome.tokens
        self.compile_seconds += outcome.compile_seconds
        self.check_seconds += outcome.check_seconds
        for v in outcome.verdicts:
            self.instances += 1
            self.agreeing += v.cause is None
            if v.valid:
                self.valid += 1
                self.valid_accepted += v.accepted
            else:
                self.invalid += 1
                self.invalid_rejected += not v.accepted
            if v.cause is not None:
                self.causes[v.cause] += 1
                examples = self.examples.setdefault(v.cause, [])
                if len(examples) < EXAMPLES_PER_CAUSE:
                    examples.append(f"{outcome.file}#{v.index} {v.detail}".strip())
            if v.inconsistency is not None:
                self.inconsistencies.append(f"{outcome.file}#{v.index}: {v.inconsistency}")


@dataclass
class AgreementReport:
    """Per-engine stats over each engine's compiled schemas, and over those all compile."""

    outcomes: list[FileOutcome]
    per_engine: dict[str, EngineStats]
    common: dict[str, EngineStats]
    seconds: float = 0.0


def summarize(outcomes: Sequence[FileOutcome], engines: Sequence[str]) -> AgreementReport:
    per_engine = {e: EngineStats(e) for e in engines}
    common = {e: EngineStats(e) for e in engines}
    by_file: dict[str, dict[str, FileOutcome]] = {}
    for outcome in outcomes:
        per_engine[outcome.engine].add(outcome)
        by_file.setdefault(outcome.file, {})[outcome.engine] = outcome
    for results in by_file.values():
        if len(results) == len(engines) and all(r.status == "ok" for r in results.values()):
            for engine, outcome in results.items():
                common[engine].add(outcome)
    return AgreementReport(list(outcomes), per_engine, common)


# --------------------------------------------------------------------------- inputs
def schema_files(data_dir: Path = JSONSCHEMA_DIR) -> list[Path]:
    return sorted(data_dir.glob("*.json"))


def sample_files(count: int, seed: int = 0, max_schema_chars: int = 2500,
                 data_dir: Path = JSONSCHEMA_DIR) -> list[Path]:
    """A fixed pseudo-random sample of files with instances and a schema of at most
    `max_schema_chars` characters (small schemas keep the sample fast for tests)."""
    small = []
    for path in schema_files(data_dir):
        data = json.loads(path.read_text())
        if data.get("tests") and len(json.dumps(data["schema"])) <= max_schema_chars:
            small.append(path)
    return sorted(random.Random(seed).sample(small, min(count, len(small))))


@functools.cache
def smollm2() -> tuple[Vocabulary, Any]:
    """pegmask's SmolLM2 vocabulary and the real tokenizer (transformers reads the GGUF)."""
    from transformers import AutoTokenizer

    path = default_model_path()
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    return Vocabulary.from_gguf(path), tokenizer


@dataclass
class Case:
    """A schema file with its instances serialized and tokenized (done once, in the parent)."""

    file: str
    schema: Any
    texts: list[str]
    valid: list[bool]
    data: list[Any]
    tokens: list[list[int] | None]  # None: the tokenizer does not spell the text exactly


def load_case(path: Path, vocab: Vocabulary, tokenizer: Any) -> Case:
    data = json.loads(path.read_text())
    tests = data.get("tests", [])
    texts = [json.dumps(t["data"]) for t in tests]
    tokens: list[list[int] | None] = []
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        spelled = b"".join(vocab.token_bytes[t] or b"\0<special>" for t in ids)
        tokens.append(ids if spelled == text.encode() else None)
    return Case(path.name, data["schema"], texts, [bool(t["valid"]) for t in tests],
                [t["data"] for t in tests], tokens)


# --------------------------------------------------------------------------- causes
def violated_keyword(schema: Any, instance: Any) -> str | None:
    """The keyword `jsonschema` (format checking on) reports as violated, None if valid."""
    import jsonschema
    from jsonschema import validators

    try:
        cls = validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        error = jsonschema.exceptions.best_match(
            cls(schema, format_checker=cls.FORMAT_CHECKER).iter_errors(instance))
    except Exception as exc:  # noqa: BLE001 - a schema jsonschema cannot handle
        return f"jsonschema fails ({type(exc).__name__})"
    if error is None:
        return None
    if error.validator == "format":
        return f"format {error.validator_value}"
    return str(error.validator)


def property_orders(schema: Any) -> list[list[str]]:
    """Every `properties` key list in the schema, in document order."""
    orders: list[list[str]] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            props = node.get("properties")
            if isinstance(props, dict) and props:
                orders.append(list(props))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return orders


def schema_ordered(instance: Any, orders: list[list[str]]) -> Any:
    """`instance` with each object's keys in the order the schema declares them, unknown keys
    last: a valid instance refused only for its key order is accepted like this. The order is
    that of the `properties` list sharing most keys with the object, then of the others sharing
    some (document order), a guess that is right unless subschemas reuse property names."""
    if isinstance(instance, list):
        return [schema_ordered(item, orders) for item in instance]
    if not isinstance(instance, dict):
        return instance
    rank: dict[str, int] = {}
    overlapping = [o for o in orders if set(o) & set(instance)]
    for order in sorted(overlapping, key=lambda o: -len(set(o) & set(instance))):
        for key in order:
            rank.setdefault(key, len(rank))
    keys = sorted(instance, key=lambda k: (k not in rank, rank.get(k, 0)))
    return {key: schema_ordered(instance[key], orders) for key in keys}


_STRUCTURE = {
    "{": "'{' (object start)", "}": "'}' (object end)", "[": "'[' (array start)",
    "]": "']' (array end)", ":": "':'", " ": "whitespace",
}


def json_context(text: str, pos: int) -> tuple[str, str]:
    """(JSON pointer, lexical kind) of byte `pos` of the ASCII JSON text `text`: what the
    engine was reading when it refused there."""
    if pos >= len(text):
        return "", "end of text (EOS refused)"
    spans: list[tuple[int, int, str, str, str]] = []  # start, end, pointer, kind, container
    decoder = json.JSONDecoder()

    def skip(i: int) -> int:
        while i < len(text) and text[i] in " \t\n\r":
            i += 1
        return i

    def value(i: int, ptr: str, container: str) -> int:
        c = text[i]
        if c in "{[":
            closer, kind = ("}", "object") if c == "{" else ("]", "array")
            start, i, index = i, skip(i + 1), 0
            while text[i] != closer:
                if kind == "object":
                    key, end = json.decoder.scanstring(text, i + 1)
                    child = f"{ptr}/{key.replace('~', '~0').replace('/', '~1')}"
                    spans.append((i, end, child, "object key", kind))
                    i = skip(skip(end) + 1)
                else:
                    child = f"{ptr}/{index}"
                i = skip(value(i, child, kind))
                index += 1
                if text[i] == ",":
                    i = skip(i + 1)
            spans.append((start, i + 1, ptr, kind, container))
            return i + 1
        _, end = decoder.raw_decode(text, i)
        kind = "string value" if c == '"' else "number" if c in "-0123456789" else "true/false/null"
        spans.append((i, end, ptr, kind, container))
        return end

    try:
        value(skip(0), "", "")
    except (ValueError, IndexError):
        return "", "unparsable text"
    start, end, ptr, kind, _ = min((s for s in spans if s[0] <= pos < s[1]),
                                   key=lambda s: s[1] - s[0], default=(0, 0, "", "", ""))
    if kind in ("object", "array"):
        char = text[pos]
        if char == ",":
            return ptr, "',' (next property)" if kind == "object" else "',' (next item)"
        return ptr, _STRUCTURE.get(char, repr(char))
    return ptr, kind


def reject_cause(text: str, pos: int, declared: set[str]) -> tuple[str, str]:
    """(cause, detail) of a valid instance refused at byte `pos`; a refused key that the
    schema declares (in some `properties`) is told apart from an undeclared one."""
    ptr, kind = json_context(text, pos)
    if kind == "object key":
        key = ptr.rsplit("/", 1)[-1].replace("~1", "/").replace("~0", "~")
        kind += " (declared in the schema)" if key in declared else " (not declared)"
    snippet = text[max(0, pos - 30): pos] + "⟂" + text[pos: pos + 20]
    return f"rejected valid: {kind}", f"at {ptr or '/'}: {snippet!r}"


# --------------------------------------------------------------------------- engines
def _bit(mask_row: np.ndarray, token: int) -> bool:
    return bool((int(mask_row[token >> 5]) >> (token & 31)) & 1)


class PegmaskEngine:
    """pegmask's matcher, checked against its own parser on every instance."""

    name = "pegmask"

    def __init__(self, vocab: Vocabulary, **options: Any):
        self.vocab = vocab
        self.options = options
        self.eos = vocab.eos_ids[0]

    def compile(self, schema: Any) -> Any:
        from pegmask.grammars.compiler import compile_grammar

        return compile_grammar(Grammar.from_json_schema(schema, **self.options), self.vocab)

    def run(self, compiled: Any, tokens: list[int], text: str) -> tuple[bool, int, str | None]:
        """(accepted, byte where refused, inconsistency) for one tokenized instance."""
        matcher = compiled.matcher()
        bitmask = np.zeros((1, (self.vocab.size + 31) // 32), dtype=np.int32)
        offset = 0
        problem: str | None = None
        accepted, refused_at = True, len(text)
        for step, token in enumerate(tokens):
            matcher.fill_next_token_bitmask(bitmask, 0)
            allowed = _bit(bitmask[0], token)
            took = matcher.accept_token(token)
            if allowed != took:
                problem = (f"token {step} ({self.vocab.token_text(token)!r}): mask says "
                           f"{allowed}, accept_token says {took}")
                if took:
                    matcher.rollback(1)
            if not allowed or not took:
                accepted = False
                data = self.vocab.token_bytes[token] or b""
                refused_at = offset + next(
                    (i for i in range(len(data)) if not matcher.accept_string(data[i:i + 1])),
                    len(data))
                break
            offset += len(self.vocab.token_bytes[token] or b"")
        if accepted:
            matcher.fill_next_token_bitmask(bitmask, 0)
            accepted = _bit(bitmask[0], self.eos)
            if accepted != matcher.is_accepting():
                problem = problem or f"EOS allowed is {accepted}, is_accepting() is {not accepted}"
        return accepted, refused_at, problem

    def parser_disagrees(self, compiled: Any, text: str, accepted: bool) -> str | None:
        """The parser's verdict on the same text, when it is not the token-level one."""
        parsed = compiled.grammar.matches(text)
        return None if parsed == accepted else (
            f"token-level verdict {accepted}, Grammar.parse verdict {parsed}")

    def accepts_text(self, compiled: Any, text: str) -> bool:
        return compiled.grammar.matches(text)

    def accepts_any_order(self, schema: Any, text: str) -> bool:
        try:
            grammar = Grammar.from_json_schema(schema, **{**self.options, "property_order": "any"})
        except GrammarError:
            return False
        return grammar.matches(text)


class XGrammarEngine:
    """xgrammar's GrammarMatcher with its own bitmask, the same protocol."""

    name = "xgrammar"

    def __init__(self, info: Any, **options: Any):
        self.info = info
        self.options = {**XGRAMMAR_OPTIONS, **options}
        self.eos = info.stop_token_ids[0]
        self.decoded = [bytes(b) for b in info.decoded_vocab]  # the property rebuilds it
        self._compiler = None

    @property
    def compiler(self) -> Any:
        import xgrammar as xgr

        if self._compiler is None:  # created lazily: after a fork, in the child
            self._compiler = xgr.GrammarCompiler(self.info, max_threads=os.cpu_count() or 1,
                                                 cache_enabled=False)
        return self._compiler

    def compile(self, schema: Any, **extra: Any) -> Any:
        return self.compiler.compile_json_schema(json.dumps(schema), **{**self.options, **extra})

    def run(self, compiled: Any, tokens: list[int], text: str) -> tuple[bool, int, str | None]:
        import xgrammar as xgr

        matcher = xgr.GrammarMatcher(compiled)
        bitmask = xgr.allocate_token_bitmask(1, self.info.vocab_size)
        row = bitmask[0].numpy()
        offset = 0
        decoded = self.decoded
        for token in tokens:
            matcher.fill_next_token_bitmask(bitmask)
            if not _bit(row, token):
                data = decoded[token]
                at = next((i for i in range(len(data))
                           if not matcher.accept_string(data[i:i + 1])), len(data))
                return False, offset + at, None
            if not matcher.accept_token(token):
                return False, offset, "mask allowed a token accept_token refused"
            offset += len(decoded[token])
        matcher.fill_next_token_bitmask(bitmask)
        return _bit(row, self.eos), len(text), None

    def accepts_text(self, compiled: Any, text: str) -> bool:
        import xgrammar as xgr

        matcher = xgr.GrammarMatcher(compiled)
        if not matcher.accept_string(text):
            return False
        bitmask = xgr.allocate_token_bitmask(1, self.info.vocab_size)
        matcher.fill_next_token_bitmask(bitmask)
        return _bit(bitmask[0].numpy(), self.eos)

    def accepts_any_order(self, schema: Any, text: str) -> bool:
        try:
            compiled = self.compile(schema, any_order=True)
        except Exception:  # noqa: BLE001 - xgrammar raises RuntimeError for everything
            return False
        return self.accepts_text(compiled, text)


def check_file(engine: PegmaskEngine | XGrammarEngine, case: Case) -> FileOutcome:
    """Compile `case.schema` with `engine` and judge every instance."""
    outcome = FileOutcome(case.file, engine.name, "ok")
    start = time.perf_counter()
    try:
        compiled = engine.compile(case.schema)
    except (UnsupportedSchemaError, SchemaError, GrammarError) as exc:
        outcome.status, outcome.error = "error", error_cause(exc)
        return outcome
    except Exception as exc:  # noqa: BLE001 - xgrammar's errors, or a pegmask bug
        outcome.status = "error" if engine.name == "xgrammar" else "crash"
        outcome.error = error_cause(exc)
        if outcome.status == "crash":
            outcome.error += " " + traceback.format_exc(limit=-2).replace("\n", " | ")
        return outcome
    outcome.compile_seconds = time.perf_counter() - start
    for index, (text, valid, tokens) in enumerate(zip(case.texts, case.valid, case.tokens,
                                                      strict=True)):
        if tokens is None:
            continue  # the tokenizer cannot spell it (never seen on this data)
        outcome.tokens += len(tokens)
        start = time.perf_counter()
        accepted, refused_at, problem = engine.run(compiled, tokens, text)
        outcome.check_seconds += time.perf_counter() - start
        if isinstance(engine, PegmaskEngine):
            problem = problem or engine.parser_disagrees(compiled, text, accepted)
        verdict = Verdict(index, valid, accepted, inconsistency=problem)
        if accepted and not valid:
            keyword = violated_keyword(case.schema, case.data[index])
            verdict.cause = f"accepted invalid: {keyword or 'valid per jsonschema'}"
        elif valid and not accepted:
            if violated_keyword(case.schema, case.data[index]) is not None:
                verdict.cause = "rejected valid: invalid per jsonschema"
            elif (engine.accepts_text(compiled, json.dumps(
                    schema_ordered(case.data[index], property_orders(case.schema))))
                  or engine.accepts_any_order(case.schema, text)):
                verdict.cause = "rejected valid: property order"
            else:
                declared = {k for order in property_orders(case.schema) for k in order}
                verdict.cause, verdict.detail = reject_cause(text, refused_at, declared)
        outcome.verdicts.append(verdict)
    return outcome


def error_cause(exc: BaseException) -> str:
    """A compile error's reason, short enough to group by (also `schema_coverage`'s)."""
    if isinstance(exc, UnsupportedSchemaError):
        return f"unsupported {exc.keyword}"
    message = str(exc).splitlines()[0] if str(exc) else ""
    # xgrammar: "[time] /project/cpp/file.cc:123: Check failed: (cond) is false: what"
    message = re.sub(r"^\[[^\]]*\]\s*\S+:\d+:\s*", "", message)
    message = re.sub(r"^Check failed: \(.*?\) is false:\s*", "", message)
    words = re.sub(r"'[^']*'|\"[^\"]*\"|\d+", "_", message)
    return f"{type(exc).__name__}: {' '.join(words.split()[:7])}"


# --------------------------------------------------------------------------- driver
def make_engines(names: Iterable[str], vocab: Vocabulary, tokenizer: Any,
                 **pegmask_options: Any) -> list[Any]:
    engines: list[Any] = []
    for name in names:
        if name == "pegmask":
            from pegmask.grammars.compiler import prepare_vocabulary

            prepare_vocabulary(vocab)  # built once, before any fork
            # Import the front-ends' lazily imported modules before any fork, so that every
            # child runs the code the parent started with.
            Grammar.from_json_schema({"type": "object", "properties": {"a": {"pattern": "x"}}})
            Grammar.from_regex("a+")
            engines.append(PegmaskEngine(vocab, **pegmask_options))
        elif name == "xgrammar":
            import xgrammar as xgr

            info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab.size)
            engines.append(XGrammarEngine(info))
        else:
            raise ValueError(f"unknown engine {name!r}")
    return engines


def measure(files: Iterable[Path] | None = None, engines: Sequence[str] = ENGINES, *,
            isolate: bool = True, jobs: int | None = None, timeout: float = 120.0,
            memory_gib: float = 6.0, progress: bool = False, vocab: Vocabulary | None = None,
            tokenizer: Any = None, **pegmask_options: Any) -> AgreementReport:
    """Run every engine on every file (default: all of data/jsonschema).

    With `isolate`, each (file, engine) runs in a forked child killed after `timeout` seconds
    or `memory_gib` GiB of extra address space (reported as "timeout" / "crash"). `vocab` and
    `tokenizer` default to SmolLM2's (pass both to share already loaded ones).
    """
    start = time.perf_counter()
    if vocab is None or tokenizer is None:
        vocab, tokenizer = smollm2()
    runners = make_engines(engines, vocab, tokenizer, **pegmask_options)
    cases = (load_case(p, vocab, tokenizer) for p in (schema_files() if files is None else files))
    tasks = ((runner, case) for case in cases for runner in runners)
    if isolate:
        outcomes_iter = _run_forked(tasks, jobs or os.cpu_count() or 1, timeout, memory_gib)
    else:
        outcomes_iter = (check_file(runner, case) for runner, case in tasks)
    outcomes = []
    for outcome in outcomes_iter:
        outcomes.append(outcome)
        if progress:
            print(f"  {outcome.engine:8s} {outcome.status:7s} {outcome.file} "
                  f"{outcome.compile_seconds + outcome.check_seconds:.1f}s {outcome.error[:60]}",
                  flush=True)
    report = summarize(outcomes, engines)
    report.seconds = time.perf_counter() - start
    return report


def _child(runner: Any, case: Case, conn: Any, memory_gib: float) -> None:
    with open("/proc/self/statm") as statm:
        current = int(statm.read().split()[0]) * resource.getpagesize()
    limit = current + int(memory_gib * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    try:
        outcome = check_file(runner, case)
    except MemoryError:
        outcome = FileOutcome(case.file, runner.name, "crash", "out of memory")
    except BaseException as exc:  # noqa: BLE001 - reported, never raised in a child
        outcome = FileOutcome(case.file, runner.name, "crash", error_cause(exc))
    conn.send(outcome)
    conn.close()


def _run_forked(tasks: Iterator[tuple[Any, Case]], jobs: int, timeout: float,
                memory_gib: float) -> Iterator[FileOutcome]:
    """Run tasks in forked children, at most `jobs` at a time, each within `timeout`."""
    ctx = multiprocessing.get_context("fork")
    running: dict[Any, tuple[Any, str, str, float]] = {}
    exhausted = False
    while running or not exhausted:
        while not exhausted and len(running) < jobs:
            task = next(tasks, None)
            if task is None:
                exhausted = True
                break
            runner, case = task
            recv, send = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_child, args=(runner, case, send, memory_gib), daemon=True)
            proc.start()
            send.close()
            running[recv] = (proc, case.file, runner.name, time.monotonic())
        for conn in multiprocessing.connection.wait(list(running), timeout=0.2):
            proc, file, engine, _ = running.pop(conn)
            try:
                outcome = conn.recv()
            except EOFError:
                outcome = FileOutcome(file, engine, "crash", f"child died ({proc.exitcode})")
            conn.close()
            proc.join()
            yield outcome
        now = time.monotonic()
        for conn, (proc, file, engine, began) in list(running.items()):
            if now - began > timeout:
                proc.kill()
                proc.join()
                conn.close()
                del running[conn]
                yield FileOutcome(file, engine, "timeout", f"timeout ({timeout:.0f} s)")


# --------------------------------------------------------------------------- report
def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.2f}%" if whole else "-"


def _table(stats: dict[str, EngineStats]) -> list[str]:
    lines = ["| engine | schemas compiled | instances | agreement | valid accepted | "
             "invalid rejected | compile s | check s | µs/token |",
             "|---|---|---|---|---|---|---|---|---|"]
    for s in stats.values():
        per_token = 1e6 * s.check_seconds / s.tokens if s.tokens else 0.0
        lines.append(
            f"| {s.engine} | {s.compiled} / {s.files} | {s.instances} | "
            f"**{_pct(s.agreeing, s.instances)}** ({s.agreeing}) | "
            f"{_pct(s.valid_accepted, s.valid)} ({s.valid_accepted}/{s.valid}) | "
            f"{_pct(s.invalid_rejected, s.invalid)} ({s.invalid_rejected}/{s.invalid}) | "
            f"{s.compile_seconds:.1f} | {s.check_seconds:.1f} | {per_token:.0f} |")
    return lines


def markdown(report: AgreementReport) -> str:
    """The report as markdown: tables, causes, compile failures, inconsistencies."""
    from importlib.metadata import version

    engines = list(report.per_engine)
    lines = [
        "# JSON Schema agreement, token by token (SmolLM2 vocabulary)",
        "",
        "Generated by `python -m pegmask.bench.jsonschema_agreement`. Each labelled instance of "
        "data/jsonschema is written with `json.dumps` (default separators), tokenized with the "
        "real SmolLM2 tokenizer and fed token by token, each token checked against the engine's "
        "bitmask, EOS required at the end. Agreement = the verdict equals the label. "
        f"xgrammar {version('xgrammar')} with `{XGRAMMAR_OPTIONS}`; pegmask with its default "
        "options (flexible whitespace, schema property order). Agreement and speed are from the "
        f"same run ({report.seconds:.0f} s wall); times are per engine, summed over schemas.",
        "",
        "## Each engine over the schemas it compiles",
        "",
        *_table(report.per_engine),
        "",
        "## Over the schemas every engine compiles",
        "",
        *_table(report.common),
        "",
    ]
    for engine in engines:
        for title, stats in (("own schemas", report.per_engine[engine]),):
            lines += [f"## {engine}: disagreements by cause ({title})", "",
                      "| count | cause | examples |", "|---|---|---|"]
            for cause, count in stats.causes.most_common():
                examples = "<br>".join(e.replace("|", "\\|") for e in stats.examples[cause])
                lines.append(f"| {count} | {cause} | {examples} |")
            lines += ["", f"## {engine}: schemas not compiled", "", "| count | cause |",
                      "|---|---|"]
            lines += [f"| {n} | {c.replace('|', '/')} |" for c, n in stats.failures.most_common()]
            lines.append("")
    pegmask = report.per_engine.get("pegmask")
    if pegmask is not None:
        lines += ["## pegmask: mask / matcher / parser consistency", "",
                  f"{len(pegmask.inconsistencies)} inconsistencies over {pegmask.instances} "
                  "instances (must be 0: the matcher and the parser run one program).", ""]
        lines += [f"- {item}" for item in pegmask.inconsistencies[:50]]
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sample", type=int, help="the fixed sample of N small schemas only")
    parser.add_argument("--limit", type=int, help="only the first N files")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per schema")
    parser.add_argument("--engine", action="append", choices=ENGINES, help="default: all")
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    files = sample_files(args.sample) if args.sample else schema_files()
    report = measure(files[: args.limit], args.engine or ENGINES, jobs=args.jobs,
                     timeout=args.timeout, progress=not args.quiet)
    publish(markdown(report), args.output)


if __name__ == "__main__":
    main()
