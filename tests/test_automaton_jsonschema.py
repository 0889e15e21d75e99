"""JSON Schema exactness, token by token on SmolLM2, against the labels of data/jsonschema and
against xgrammar on the same instances (issue 3's bar).

Each instance is written with `json.dumps`, tokenized with the real tokenizer and fed to the
matcher with every token checked against the mask and EOS required at the end, exactly as
constrained decoding would: `valid: true` must be accepted, `valid: false` refused. The
measuring code is `pegmask.bench.jsonschema_agreement`; here a fixed sample of small schemas
keeps the check fast, and the full sweep is marked slow.

The matcher's verdict must also equal `Grammar.parse`'s on every instance: both run one
compiled program, so any difference is a bug, never a tolerance.
"""

from __future__ import annotations

import pytest
from vocabularies import smollm2, smollm2_tokenizer

from pegmask.bench.jsonschema_agreement import (
    AgreementReport,
    json_context,
    measure,
    sample_files,
    schema_files,
)

SAMPLE_SIZE = 64
TARGET_AGREEMENT = 0.97
"""The issue's aim; its bar is "at least xgrammar's", on the schemas both compile."""


@pytest.fixture(scope="module")
def sample() -> AgreementReport:
    return measure(sample_files(SAMPLE_SIZE), isolate=False, vocab=smollm2(),
                   tokenizer=smollm2_tokenizer())


def check_report(report: AgreementReport) -> None:
    pegmask, xgrammar = report.common["pegmask"], report.common["xgrammar"]
    causes = dict(report.per_engine["pegmask"].causes)
    assert pegmask.instances, "no schema compiled by both engines"
    assert pegmask.agreement >= xgrammar.agreement, (
        f"pegmask {pegmask.agreement:.2%} < xgrammar {xgrammar.agreement:.2%} on the schemas "
        f"both compile; pegmask's disagreements: {causes}")
    own = report.per_engine["pegmask"]
    assert own.agreement >= TARGET_AGREEMENT, (
        f"pegmask agrees on {own.agreement:.2%} of its instances: {causes}, e.g. {own.examples}")


def check_consistency(report: AgreementReport) -> None:
    own = report.per_engine["pegmask"]
    assert own.instances
    assert not own.inconsistencies, "\n".join(own.inconsistencies[:20])
    crashes = [o for o in report.outcomes if o.engine == "pegmask" and o.status == "crash"]
    assert not crashes, [f"{o.file}: {o.error}" for o in crashes[:10]]


def test_sample_agreement_at_least_xgrammars(sample: AgreementReport) -> None:
    """Labels, token by token: pegmask agrees at least as often as xgrammar."""
    check_report(sample)


def test_sample_matcher_verdict_is_the_parsers(sample: AgreementReport) -> None:
    """Mask, accept_token and Grammar.parse give one verdict on every instance, and no schema
    makes the compiler fail with anything but a schema error."""
    check_consistency(sample)


def test_sample_is_fixed_and_covers_the_sources() -> None:
    """The sample is deterministic and mixes the data's sources (not one family)."""
    files = sample_files(SAMPLE_SIZE)
    assert files == sample_files(SAMPLE_SIZE) and len(files) == SAMPLE_SIZE
    sources = {f.name.split("---")[0].split("_")[0] for f in files}
    assert len(sources) >= 5, sources


def test_disagreement_context_names_the_place() -> None:
    """The cause grouping reads the right lexical place off json.dumps text."""
    text = '{"a": [1, "x"], "b": {"c": null}}'
    assert json_context(text, text.index('"a"')) == ("/a", "object key")
    assert json_context(text, text.index("1")) == ("/a/0", "number")
    assert json_context(text, text.index('"x"') + 1) == ("/a/1", "string value")
    assert json_context(text, text.index("]")) == ("/a", "']' (array end)")
    assert json_context(text, text.index(", \"b\"")) == ("", "',' (next property)")
    assert json_context(text, text.index("null")) == ("/b/c", "true/false/null")
    assert json_context(text, text.index("}")) == ("/b", "'}' (object end)")
    assert json_context(text, len(text)) == ("", "end of text (EOS refused)")


@pytest.mark.slow
def test_full_sweep() -> None:
    """Every file of data/jsonschema, each (schema, engine) in a forked child with a time limit
    (python -m pegmask.bench.jsonschema_agreement writes the same numbers as a report)."""
    report = measure(schema_files(), isolate=True, timeout=300, vocab=smollm2(),
                     tokenizer=smollm2_tokenizer())
    check_consistency(report)
    check_report(report)
