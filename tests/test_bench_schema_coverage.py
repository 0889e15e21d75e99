"""The schema-coverage bench (bench/schema_coverage.py) on a few schemas of the vendored
JSONSchemaBench sample and of the conformance suite: real engines (pegmask, llguidance) in
their worker processes on SmolLM2's tokenizer, the report and its JSON written."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pegmask.bench import schema_coverage
from pegmask.bench.jsonschemabench import DATASETS, SAMPLE_DIR, SAMPLE_SIZE, dataset_files

PER_DATASET = 2
SUITE_GROUPS = 6  # additionalProperties.json's first groups: both engines agree on them all


def test_vendored_sample_has_every_dataset_with_provenance() -> None:
    files = dataset_files(SAMPLE_DIR)
    assert tuple(files) == DATASETS
    assert all(len(paths) == SAMPLE_SIZE for paths in files.values())
    assert all(isinstance(json.loads(p.read_text()), dict) for ps in files.values() for p in ps)
    readme = (SAMPLE_DIR / "README.md").read_text()
    assert "github.com/guidance-ai/jsonschemabench" in readme and "MIT" in readme
    assert re.search(r"Commit: [0-9a-f]{40}", readme)


def test_dataset_files_refuses_a_folder_without_datasets(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no dataset folders"):
        dataset_files(tmp_path)


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict]:
    """One run: two schemas per dataset of the sample, plus a dataset of two schemas of ours
    (one that pegmask refuses), and the first suite groups, on pegmask and llguidance."""
    data = tmp_path_factory.mktemp("data")
    for dataset, paths in dataset_files(SAMPLE_DIR, PER_DATASET).items():
        (data / dataset).mkdir()
        for path in paths:
            (data / dataset / path.name).write_bytes(path.read_bytes())
    ours = data / "Ours"
    ours.mkdir()
    (ours / "backreference.json").write_text(json.dumps(
        {"type": "string", "pattern": "^(a)\\1$"}))
    (ours / "object.json").write_text(json.dumps(
        {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}))
    out = tmp_path_factory.mktemp("out") / "coverage.md"
    schema_coverage.main(["--data", str(data), "--suite-groups", str(SUITE_GROUPS),
                          "--engine", "pegmask", "--engine", "llguidance", "--out", str(out),
                          "--quiet"])
    return out.read_text(), json.loads(out.with_suffix(".json").read_text())


def test_every_schema_gets_an_outcome_per_engine(report: tuple[str, dict]) -> None:
    _, data = report
    attempts = data["jsonschemabench"]
    schemas = PER_DATASET * len(DATASETS) + 2
    assert len(attempts) == 2 * schemas
    assert {a["engine"] for a in attempts} == {"pegmask", "llguidance"}
    assert {a["status"] for a in attempts} <= {"compiled", "refused", "timeout", "crash"}
    assert all(a["ms"] > 0 for a in attempts if a["status"] == "compiled")
    assert not [a for a in attempts if a["status"] == "crash"]
    by_name = {(a["engine"], a["name"]): a for a in attempts}
    refused = by_name[("pegmask", "backreference")]
    assert (refused["status"], refused["reason"]) == ("refused", "unsupported pattern")
    assert "backreference" in refused["detail"]
    assert by_name[("pegmask", "object")]["status"] == "compiled"
    assert by_name[("llguidance", "object")]["status"] == "compiled"
    assert data["meta"]["limit_s"] == schema_coverage.TIME_LIMIT_S
    assert data["machine"]["load_average"] is not None


def test_suite_instances_are_judged_token_by_token(report: tuple[str, dict]) -> None:
    _, data = report
    suite = data["suite"]
    assert len(suite) == 2 * SUITE_GROUPS
    for engine in ("pegmask", "llguidance"):  # each instance on a matcher of its own
        attempts = [a for a in suite if a["engine"] == engine]
        assert all(a["status"] == "compiled" for a in attempts)
        verdicts = [v for a in attempts for v in a["verdicts"]]
        assert verdicts and None not in verdicts
        assert any(label for label, _ in verdicts) and not all(label for label, _ in verdicts)
        assert all(label == accepted for label, accepted in verdicts), engine


def test_report_tables_match_the_attempts(report: tuple[str, dict]) -> None:
    text, data = report
    for dataset in (*DATASETS, "Ours"):
        assert f"| {dataset} (" in text
    for engine in ("pegmask", "llguidance"):
        attempts = [a for a in data["jsonschemabench"] if a["engine"] == engine]
        compiled = sum(a["status"] == "compiled" for a in attempts)
        assert re.search(rf"\| \*\*all\*\* \({len(attempts)}\) \| {engine} \| {compiled} \(",
                         text)
    failed = {a["name"] for a in data["jsonschemabench"] if a["status"] != "compiled"}
    common = len({a["name"] for a in data["jsonschemabench"]} - failed)
    assert f"| **compiled by all** ({common}) | llguidance | {common} (100.0%) |" in text
    assert "| pegmask | 1 | refused: unsupported pattern | Ours 1 | backreference: " in text
    row = re.search(r"^\| pegmask \| (\d+) \(100\.0%\) \| (\d+) \| (\d+) \(100\.0%\) \| 0 \| 0 \|",
                    text, re.MULTILINE)
    assert row and int(row[1]) == SUITE_GROUPS and int(row[2]) == int(row[3]) > 0
    assert "load average at the start" in text and "Command: `pegmask bench schema_coverage" in text


def test_a_schema_over_the_limit_times_out_and_a_silent_worker_is_replaced() -> None:
    worker = schema_coverage.EngineWorker("llguidance", limit_s=1e-6)
    try:
        text = json.dumps({"type": "array", "items": {"type": "integer"}})
        late = worker.attempt("Ours", "array", text)  # answered, but over the limit
        assert (late.status, late.reason, late.dataset, late.name, worker.starts) == (
            "timeout", "finished over the limit", "Ours", "array", 1)
        worker.slack_s = -1.0  # no time at all to answer: the worker is killed
        silent = worker.attempt("Ours", "array", text)
        assert (silent.status, silent.reason, worker.starts) == (
            "timeout", "no answer: worker replaced", 2)
        assert worker.ready and worker.process.is_alive()  # the new worker answers
    finally:
        worker.close()
    assert not worker.process.is_alive()
