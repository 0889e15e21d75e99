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
  (rather than on the configuration) could save;
* **exact shared keys**: what such a cache, shared by every grammar of the vocabulary, would
  save and cost with a key that decides the mask (`future_key`: what the configuration's
  threads read, breadth first, as deep as some token of the trie goes): the masks that get a
  key, the time the keys take (computed after each mask, so the closures they follow are
  warm: a lower bound), and the masks whose key came before, in any grammar of the run (each
  checked to be that mask, bit for bit).

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
from pegmask.grammars.program import SPECIAL, SPECIAL_BASE
from pegmask.grammars.token_trie import TokenTrie, run_trie
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
    keyed: bool = False  # `future_key` gave it a key ...
    key_seconds: float = 0.0  # ... in this time (or gave up in it)
    shared: bool = False  # ... met before, for any grammar of the run


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
    _keys: dict[tuple, bytes] = field(default_factory=dict)  # `future_key` -> mask digest
    key_seconds: float = 0.0  # spent on keys (left out of the pass's phases)

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
        keyed_at = time.perf_counter()
        key = future_key(compiled, config)
        key_seconds = time.perf_counter() - keyed_at
        self.key_seconds += key_seconds
        for outer in self._frames:  # (not counted in the masks that needed this one either)
            outer.start += key_seconds
        shared = key is not None and key in self._keys
        if shared and self._keys[key] != digest:
            raise AssertionError(f"two masks under one key: {key}")
        if key is not None:
            self._keys[key] = digest
        self.masks.append(MaskRecord(frame.kind or "walk", seconds - frame.nested_seconds,
                                     made - frame.nested_configurations, digest in seen,
                                     key is not None, key_seconds, shared))
        seen.add(digest)
        return entry

    def forget(self, compiled: CompiledGrammar) -> None:
        """Drop the digests of a grammar no longer used (ids are reused)."""
        self._seen.pop(id(compiled), None)


FUTURE_THREADS = 160  # a key numbers at most this many threads ...
FUTURE_FRONTIER = 48  # ... and looks at most at this many trie nodes of one level


def future_key(compiled: CompiledGrammar, config: int, trie: TokenTrie | None = None
               ) -> tuple | None:
    """What decides `config`'s mask, independent of its grammar: the accept tables its threads
    read and where each leads (the threads numbered as first met, breadth first), level by
    level while some token of `trie` (the vocabulary's) goes deeper along bytes they read (the
    frontier: a superset of the nodes a walk reaches). Two configurations with one key read
    the same tokens (for grammars bound with the same stop tokens). Inside a whitespace run
    whose mask `_run_split` made, the keys of the two configurations it was made of (the run's
    exit's over the trie of what follows a run). None past `FUTURE_THREADS` or
    `FUTURE_FRONTIER` (plain text: most of the trie), and where the grammar spells special
    tokens (a held-back spelling is no thread)."""
    if compiled._lexed:
        return None
    split = compiled._run_splits.get(config) if trie is None else None
    if split is not None:
        rest, after, table, remaining = split
        parts = (future_key(compiled, rest),
                 future_key(compiled, after, run_trie(compiled.vocab, table).rests))
        return None if None in parts else ("run", *parts, table, remaining)
    program, reach = compiled.program, compiled.runtime.reach
    trie = compiled.trie if trie is None else trie
    kind, arg, aux, accept, leaves = (program.kind, program.arg, program.aux, program.accept,
                                      program.leaves)
    specials, accept_bits = program.specials, compiled._accept_bits
    child_start, child_end, trie_byte = trie.lists
    layer = list(compiled._threads[config])
    number = {thread: index for index, thread in enumerate(layer)}
    entries: list[tuple] = [(compiled._accepting[config], len(layer))]
    moves: dict[tuple[int, int], list[tuple[tuple[int, int], ...]]] = {}
    frontier: list[int] = []
    while layer:
        reads = 0
        for pc, _ in layer:
            reads |= accept_bits[pc]
        if not frontier:  # the root's children
            if reads.bit_count() > FUTURE_FRONTIER:
                return None
            frontier = [node for byte in range(256) if reads >> byte & 1
                        and (node := trie.first_child[byte]) >= 0]
        else:
            frontier = [child for node in frontier
                        for child in range(child_start[node], child_end[node])
                        if reads >> trie_byte[child] & 1]
            if len(frontier) > FUTURE_FRONTIER:
                return None
        following: dict[tuple[int, int], None] = {}
        for thread in layer:
            after = moves.get(thread)
            if after is None:
                pc, stack = thread
                entry: list = [number[thread], specials[aux[pc] - SPECIAL_BASE]
                               if kind[pc] == SPECIAL else None]
                after = moves[thread] = []
                for leaf in leaves[pc]:
                    reached, matched = reach(((arg[leaf], stack),))
                    after.append(reached)
                    entry.append((accept[leaf], matched, *[
                        number.setdefault(target, len(number)) for target in reached]))
                entries.append(tuple(entry))
                if len(number) > FUTURE_THREADS:
                    return None
            for reached in after:
                following.update(dict.fromkeys(reached))
        if not any(child_end[node] > child_start[node] for node in frontier):
            break  # no token goes deeper: the next threads need only be there
        layer = list(following)
    return tuple(entries)


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
    keys_before = recorder.key_seconds
    for token in tokens:
        matcher.fill_next_token_bitmask(bitmask)
        if not matcher.accept_token(token):
            break
    matcher.fill_next_token_bitmask(bitmask)
    done = time.perf_counter() - (recorder.key_seconds - keys_before)
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


def shared_keys_table(recorder: Recorder) -> str:
    """What an exact cache shared across grammars (`future_key`) would save and cost."""
    rows = ["| mask kind | masks | with a key | their ms | keys' ms (all masks) | "
            "key met before | their ms | saved − keys' ms |", "|---|---|---|---|---|---|---|---|"]
    for kind in (*KINDS, None):
        chosen = [m for m in recorder.masks if kind is None or m.kind == kind]
        if not chosen:
            continue
        keyed = [m for m in chosen if m.keyed]
        shared = [m for m in keyed if m.shared]
        keys = sum(m.key_seconds for m in chosen)
        saved = sum(m.seconds for m in shared)
        label = KIND_NAMES[kind] if kind else "**all computed masks**"
        rows.append(f"| {label} | {len(chosen)} | {len(keyed)} | "
                    f"{_ms(sum(m.seconds for m in keyed))} | {_ms(keys)} | {len(shared)} | "
                    f"{_ms(saved)} | {_ms(saved - keys)} |")
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
        "Exact shared keys (`future_key`): a mask whose key came before, for any grammar of the "
        "run, is what a cache shared across grammars would answer; every key is paid for.",
        shared_keys_table(recorder),
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
