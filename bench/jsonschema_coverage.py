"""JSON Schema coverage and agreement on the real-world schemas of data/jsonschema.

For every file (a schema and labelled instances) the schema is compiled with
`Grammar.from_json_schema`; a schema that does not compile must fail with `SchemaError`
(counted by keyword). Each instance of a compiled schema is serialized twice with `json.dumps`
(compact separators and the default `", "` / `": "`), and *agrees* when both spellings get the
label's verdict: accepted when `valid`, rejected otherwise. Disagreements are grouped by cause:
for a wrongly accepted instance the keyword `jsonschema` reports as violated; for a wrongly
rejected one "property order" when the instance is accepted with `property_order="any"`,
"object key" when the refused byte is inside a key (in practice: keys out of schema order in
objects too large for "any"), else the parse error.

    python -m pegmask.bench.jsonschema_coverage [--limit N] [--sample N] [--option key=value]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pegmask.bench.data import JSONSCHEMA_DIR
from pegmask.grammars import Grammar, GrammarError, SchemaError, UnsupportedSchemaError


@dataclass
class CoverageReport:
    """Counts from one sweep; `disagreements` and `errors` map a cause to a count."""

    schemas: int = 0
    compiled: int = 0
    instances: int = 0
    agreeing: int = 0
    errors: Counter = field(default_factory=Counter)
    disagreements: Counter = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def coverage(self) -> float:
        return self.compiled / self.schemas if self.schemas else 0.0

    @property
    def agreement(self) -> float:
        return self.agreeing / self.instances if self.instances else 1.0

    def summary(self) -> str:
        lines = [
            f"schemas compiled: {self.compiled} / {self.schemas} ({100 * self.coverage:.1f}%)",
            f"instances agreeing: {self.agreeing} / {self.instances} ({100 * self.agreement:.2f}%)",
            f"time: {self.seconds:.1f} s",
            "compile errors by keyword:",
            *(f"  {n:5d}  {cause}" for cause, n in self.errors.most_common()),
            "disagreements by cause:",
            *(f"  {n:5d}  {cause}   e.g. {self.examples.get(cause, '')}"
              for cause, n in self.disagreements.most_common()),
        ]
        return "\n".join(lines)


def schema_files(data_dir: Path = JSONSCHEMA_DIR, sample: int | None = None, seed: int = 0) -> list[Path]:
    """The data files in name order, or a fixed pseudo-random sample of them."""
    files = sorted(data_dir.glob("*.json"))
    if sample is not None and sample < len(files):
        files = sorted(random.Random(seed).sample(files, sample))
    return files


def measure(files: Iterable[Path] | None = None, **options: Any) -> CoverageReport:
    """Compile every schema with `options` and check every labelled instance."""
    report = CoverageReport()
    start = time.perf_counter()
    for path in schema_files() if files is None else files:
        data = json.loads(path.read_text())
        report.schemas += 1
        try:
            grammar = Grammar.from_json_schema(data["schema"], **options)
        except UnsupportedSchemaError as exc:
            report.errors[f"unsupported {exc.keyword}"] += 1
            report.examples.setdefault(f"unsupported {exc.keyword}", f"{path.name}: {exc}")
            continue
        except SchemaError as exc:
            cause = f"invalid schema: {_first_words(str(exc))}"
            report.errors[cause] += 1
            report.examples.setdefault(cause, f"{path.name}: {exc}")
            continue
        except GrammarError as exc:  # not a clear schema error: reported on its own line
            report.errors[f"grammar error: {_first_words(str(exc))}"] += 1
            continue
        report.compiled += 1
        relaxed = _Relaxed(data["schema"], options)
        for test in data.get("tests", []):
            report.instances += 1
            cause = _disagreement(grammar, relaxed, test)
            if cause is None:
                report.agreeing += 1
            else:
                report.disagreements[cause] += 1
                report.examples.setdefault(cause, path.name)
    report.seconds = time.perf_counter() - start
    return report


class _Relaxed:
    """The schema's grammar with `property_order="any"`, compiled on first use."""

    def __init__(self, schema: Any, options: dict[str, Any]):
        self.schema = schema
        self.options = options
        self._grammar: Grammar | None | bool = False

    def grammar(self) -> Grammar | None:
        if self._grammar is False:
            try:
                self._grammar = Grammar.from_json_schema(
                    self.schema, **{**self.options, "property_order": "any"})
            except GrammarError:
                self._grammar = None
        return self._grammar  # type: ignore[return-value]


def _disagreement(grammar: Grammar, relaxed: _Relaxed, test: dict[str, Any]) -> str | None:
    """None when the grammar agrees with the label, else the cause of the disagreement."""
    spellings = [json.dumps(test["data"], separators=(",", ":")), json.dumps(test["data"])]
    verdicts = [grammar.matches(text) for text in spellings]
    if all(v == test["valid"] for v in verdicts):
        return None
    if not test["valid"]:
        return f"accepted invalid: {_violated_keyword(relaxed.schema, test['data'])}"
    if relaxed.options.get("property_order", "schema") != "any":
        other = relaxed.grammar()
        if other is not None and all(other.matches(text) for text in spellings):
            return "rejected valid: property order"
    if not any(verdicts):
        try:
            grammar.parse(spellings[0])
        except Exception as exc:  # noqa: BLE001 - only the position is used
            before = spellings[0][: getattr(exc, "position", 0)]
            if re.search(r'[{,]"[^"]*$', before):
                return "rejected valid: object key (order or unknown name)"
            return f"rejected valid: {_first_words(str(exc), 3)}"
    return "rejected valid: whitespace"


def _violated_keyword(schema: Any, instance: Any) -> str:
    """The keyword `jsonschema` (with format checking) reports as violated."""
    try:
        import jsonschema
        from jsonschema import validators
    except ImportError:
        return "unknown"
    cls = validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    error = jsonschema.exceptions.best_match(
        cls(schema, format_checker=cls.FORMAT_CHECKER).iter_errors(instance))
    if error is None:
        return "label disagrees with jsonschema"
    if error.validator == "format":
        return f"format {error.validator_value}"
    return str(error.validator)


def _first_words(text: str, count: int = 6) -> str:
    return " ".join(re.sub(r"'[^']*'|\"[^\"]*\"|\d+", "_", text).split()[:count])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, help="only the first N files")
    parser.add_argument("--sample", type=int, help="a fixed pseudo-random sample of N files")
    parser.add_argument("--option", action="append", default=[],
                        help="schema option key=value (JSON value), e.g. property_order=\"any\"")
    args = parser.parse_args(argv)
    options = {}
    for item in args.option:
        key, _, value = item.partition("=")
        options[key] = json.loads(value)
    files = schema_files(sample=args.sample)[: args.limit]
    print(measure(files, **options).summary())


if __name__ == "__main__":
    main()
