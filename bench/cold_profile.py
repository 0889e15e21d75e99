"""Where pegmask's cold generation time goes: phases, masks by kind, and repeated masks.

On the cases of `grammar_bench` (the tool-call schema and an even spread of data/jsonschema)
and a real vocabulary, each schema is compiled and its valid instance is masked and accepted
token by token once, from cold. Reported:

* **phases**: the front-end (`Grammar.from_json_schema`), `compile_grammar`, and the pass
  (every mask and accept);
* **masks by kind**, as `CompiledGrammar.cached_mask` computes them: inside a bounded run of
  JSON whitespace (`_run_split`), a literal's few bytes (`_narrow_walk`), text where every
  plain token is allowed (`_plain_text_stays_alive`), any other walk of the trie. Per kind:
  masks, time, configurations made. A mask that another one needs (a run's mask needs the
  mask after the run) counts in its own kind, and its time and configurations are not
  counted again in the other's;
* **repeated masks**: masks equal bit for bit to one computed before for the same compiled
  grammar, and their time. That is what a cache keyed on what a configuration can still read
  (rather than on the configuration) could save.

The kinds are told apart by wrapping private methods of `CompiledGrammar` during the run (a
diagnostic, like a profiler): times include the wrappers' overhead, a few percent, and come
from one run on a shared machine (compare kinds within a report, not across reports).

    python -m pegmask.bench.cold_profile [--vocab smollm2|deepseek|both] [--schemas 50]
        [--out bench/results/cold_profile.md]
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pegmask.bench.grammar_bench import DEFAULT_SCHEMAS
from pegmask.bench.grammar_inputs import (
    WARMUP_INSTANCE,
    WARMUP_SCHEMA,
    Case,
    Model,
    load_cases,
    load_model,
    tool_call_case,
)
from pegmask.bench.reporting import machine_info, publish
from pegmask.grammars.compiler import CompiledGrammar, compile_grammar, prepare_vocabulary
from pegmask.grammars.errors import GrammarError
from pegmask.grammars.grammar import Grammar
from pegmask.grammars.vocab import Vocabulary
from pegmask.kernels.bitmask import allocate_token_bitmask

KIND_NAMES = {
    "run": "whitespace run (`_run_mask`)",
    "literal": "few bytes (`_narrow_walk`)",
    "text": "plain text alive (`_plain_text_stays_alive`)",
    "walk": "other walks of the trie",
}
KINDS = tuple(KIND_NAMES)
# The methods of `CompiledGrammar` whose answer (other than None or False) decides a mask's
# kind, tried in this order by `cached_mask`; a mask none of them decides is a "walk".
DECISIONS = {"_run_split": "run", "_narrow_walk": "literal", "_plain_text_stays_alive": "text"}
WRAPPED = ("cached_mask", *DECISIONS)  # what `recording` replaces while it runs


@dataclass
class MaskRecord:
    """One computed (not cached) mask."""

    kind: str
    seconds: float  # its own, without the masks it needed
    configurations: int  # made while computing it, without those of the masks it needed
    repeated: bool  # equal to a mask computed before for the same compiled grammar


@dataclass
class _Frame:
    start: float
    configurations: int
    kind: str | None = None
    nested_seconds: float = 0.0
    nested_configurations: int = 0


@dataclass
class Recorder:
    """Collects `MaskRecord`s while installed (see `recording`)."""

    masks: list[MaskRecord] = field(default_factory=list)
    _frames: list[_Frame] = field(default_factory=list)
    _seen: dict[int, set[bytes]] = field(default_factory=dict)

    def classify(self, kind: str) -> None:
        """The mask being computed is of `kind`, unless already classified."""
        if self._frames and self._frames[-1].kind is None:
            self._frames[-1].kind = kind

    def computed(self, compiled: CompiledGrammar, config: int,
                 compute: Callable[[], Any]) -> Any:
        """`compute()` (the original `cached_mask`), recorded when it computes the mask."""
        if config in compiled._masks:
            return compute()
        frame = _Frame(time.perf_counter(), len(compiled._threads))
        self._frames.append(frame)
        try:
            entry = compute()
        finally:
            self._frames.pop()
        seconds = time.perf_counter() - frame.start
        made = len(compiled._threads) - frame.configurations
        if self._frames:
            parent = self._frames[-1]
            parent.nested_seconds += seconds
            parent.nested_configurations += made
        digest = hashlib.blake2b(entry[0].tobytes(), digest_size=16).digest()
        seen = self._seen.setdefault(id(compiled), set())
        self.masks.append(MaskRecord(frame.kind or "walk", seconds - frame.nested_seconds,
                                     made - frame.nested_configurations, digest in seen))
        seen.add(digest)
        return entry

    def forget(self, compiled: CompiledGrammar) -> None:
        """Drop the digests of a grammar no longer used (ids are reused)."""
        self._seen.pop(id(compiled), None)


@contextmanager
def recording(recorder: Recorder) -> Iterator[None]:
    """Wrap `CompiledGrammar`'s mask entry point and the decisions that tell the kinds apart,
    restoring them afterwards."""
    originals = {name: getattr(CompiledGrammar, name) for name in WRAPPED}

    def cached_mask(self: CompiledGrammar, config: int) -> Any:
        return recorder.computed(self, config, lambda: originals["cached_mask"](self, config))

    def deciding(name: str, kind: str) -> Callable[..., Any]:
        def wrapper(self: CompiledGrammar, *args: Any) -> Any:
            result = originals[name](self, *args)
            if result is not None and result is not False:
                recorder.classify(kind)
            return result
        return wrapper

    CompiledGrammar.cached_mask = cached_mask  # type: ignore[method-assign]
    for name, kind in DECISIONS.items():
        setattr(CompiledGrammar, name, deciding(name, kind))
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(CompiledGrammar, name, original)


@dataclass
class Phases:
    """One schema's cold generation, in seconds."""

    name: str
    front_end: float
    compile: float
    masks_and_accepts: float
    tokens: int

    @property
    def total(self) -> float:
        return self.front_end + self.compile + self.masks_and_accepts


def cold_pass(case: Case, model: Model, vocab: Vocabulary, recorder: Recorder) -> Phases | None:
    """Compile `case` and mask and accept its instance's tokens once; None if it does not
    compile."""
    bitmask = allocate_token_bitmask(1, vocab.size)
    tokens = model.encode(case.text)
    start = time.perf_counter()
    try:
        grammar = Grammar.from_json_schema(case.schema)
    except GrammarError:
        return None
    built = time.perf_counter()
    compiled = compile_grammar(grammar, vocab)
    matcher = compiled.matcher()
    compiled_at = time.perf_counter()
    for token in tokens:
        matcher.fill_next_token_bitmask(bitmask)
        if not matcher.accept_token(token):
            break
    matcher.fill_next_token_bitmask(bitmask)
    done = time.perf_counter()
    recorder.forget(compiled)
    return Phases(case.name, built - start, compiled_at - built, done - compiled_at, len(tokens))


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f}"


def phases_table(runs: list[Phases]) -> str:
    rows = ["| phase | median ms | total ms | share of total |", "|---|---|---|---|"]
    whole = sum(r.total for r in runs)
    for label, value in (("front-end (`Grammar.from_json_schema`)", lambda r: r.front_end),
                         ("`compile_grammar` + matcher", lambda r: r.compile),
                         ("masks and accepts", lambda r: r.masks_and_accepts),
                         ("cold generation", lambda r: r.total)):
        values = [value(r) for r in runs]
        rows.append(f"| {label} | {statistics.median(values) * 1e3:.2f} | {_ms(sum(values))} "
                    f"| {sum(values) / whole:.0%} |")
    return "\n".join(rows)


def kinds_table(recorder: Recorder) -> str:
    rows = ["| mask kind | masks | ms | µs per mask | configurations made | repeated masks | "
            "their ms |", "|---|---|---|---|---|---|---|"]
    for kind in (*KINDS, None):
        chosen = [m for m in recorder.masks if kind is None or m.kind == kind]
        if not chosen:
            continue
        seconds = sum(m.seconds for m in chosen)
        repeated = [m for m in chosen if m.repeated]
        label = KIND_NAMES[kind] if kind else "**all computed masks**"
        rows.append(f"| {label} | {len(chosen)} | {_ms(seconds)} | "
                    f"{seconds / len(chosen) * 1e6:.0f} | {sum(m.configurations for m in chosen)} | "
                    f"{len(repeated)} | {_ms(sum(m.seconds for m in repeated))} |")
    return "\n".join(rows)


def slowest_table(runs: list[Phases], count: int = 8) -> str:
    rows = ["| schema | tokens | front-end ms | compile ms | masks and accepts ms |",
            "|---|---|---|---|---|"]
    for r in sorted(runs, key=lambda r: -r.total)[:count]:
        rows.append(f"| `{r.name}` | {r.tokens} | {_ms(r.front_end)} | {_ms(r.compile)} | "
                    f"{_ms(r.masks_and_accepts)} |")
    return "\n".join(rows)


def profile(name: str, schemas: int) -> str:
    """The markdown section for one vocabulary."""
    model = load_model(name)
    vocab = Vocabulary.from_hf(model.tokenizer, model.size)
    prepare_vocabulary(vocab)
    warm_up = Case("warm-up", WARMUP_SCHEMA, WARMUP_INSTANCE)
    cold_pass(warm_up, model, vocab, Recorder())  # tries and run tries of the vocabulary
    cases = [tool_call_case(0), *load_cases(schemas)]
    recorder = Recorder()
    gc.collect()
    gc.freeze()
    with recording(recorder):
        runs = [run for case in cases if (run := cold_pass(case, model, vocab, recorder))]
    gc.unfreeze()
    computed = len(recorder.masks)
    repeated = [m for m in recorder.masks if m.repeated]
    mask_seconds = sum(m.seconds for m in recorder.masks)
    return "\n\n".join([
        f"## {name} ({vocab.size:,} tokens): the tool-call schema and {len(runs) - 1} of "
        f"{schemas} data/jsonschema schemas",
        phases_table(runs),
        f"{computed} masks computed; {len(repeated)} of them ({len(repeated) / computed:.0%}) took "
        f"{_ms(sum(m.seconds for m in repeated))} ms of the {_ms(mask_seconds)} ms of computed "
        "masks: each equals a mask computed before for the same grammar, from another "
        "configuration.",
        kinds_table(recorder),
        "Slowest schemas:",
        slowest_table(runs),
    ])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", choices=("smollm2", "deepseek", "both"), default="both")
    parser.add_argument("--schemas", type=int, default=DEFAULT_SCHEMAS,
                        help="data/jsonschema files to run (an even spread in name order)")
    parser.add_argument("--out", type=Path, help="also write the report to this markdown file")
    args = parser.parse_args(argv)
    names = ("smollm2", "deepseek") if args.vocab == "both" else (args.vocab,)
    report = "\n\n".join([
        "# Where pegmask's cold generation time goes",
        machine_info(),
        f"Command: `python -m pegmask.bench.cold_profile --vocab {args.vocab} "
        f"--schemas {args.schemas}`",
        *[profile(name, args.schemas) for name in names],
    ]) + "\n"
    publish(report, args.out)


if __name__ == "__main__":
    main()
