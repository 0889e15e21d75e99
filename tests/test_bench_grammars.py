"""`pegmask bench grammars`: the peers' two configurations, a user's own grammar, the
fresh-process compile, and a smoke run of the command (reports, JSON, plots)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pegmask.bench.fresh_compile import first_compiles
from pegmask.bench.grammar_engines import config_keys, engine_key
from pegmask.bench.grammar_inputs import regex_file_case, schema_file_case
from pegmask.cli import main as cli

PNG = b"\x89PNG\r\n\x1a\n"


def test_configurations_name_their_engines() -> None:
    assert config_keys("default") == ("pegmask", "xgrammar", "llguidance", "outlines")
    # pegmask and outlines-core are at their defaults in both tables: measured once
    assert config_keys("equalized") == ("pegmask", "xgrammar/equalized",
                                        "llguidance/equalized", "outlines")
    assert engine_key("xgrammar", "default") == "xgrammar"


def test_user_schema_needs_an_instance(tmp_path: Path) -> None:
    schema = tmp_path / "point.json"
    schema.write_text('{"type": "object", "properties": {"x": {"type": "integer"}}}')
    with pytest.raises(ValueError, match="no valid test instance: give one with --instance"):
        schema_file_case(schema)
    instance = tmp_path / "p.json"
    instance.write_text('{"x": 3}')
    case = schema_file_case(schema, instance)
    assert case.text == '{"x": 3}' and case.kind == "json_schema"
    suite_style = tmp_path / "suite.json"
    suite_style.write_text(json.dumps({"schema": {"type": "integer"}, "tests": [
        {"data": "a", "valid": False}, {"data": 12, "valid": True}]}))
    assert schema_file_case(suite_style).text == "12"
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    with pytest.raises(ValueError, match="broken.json is not JSON"):
        schema_file_case(broken)


def test_instance_without_grammar_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli(["bench", "grammars", "--instance", "x.txt"])
    assert exit_info.value.code == 2
    assert "--instance goes with --schema, --regex or --grammar" in capsys.readouterr().err


def test_fresh_process_compile() -> None:
    """pegmask's first compile, timed in a new process, apart from its setup."""
    found = first_compiles("smollm2", ("pegmask",))["pegmask"]
    assert "error" not in found, found
    assert found["setup_ms"] > 0 and found["first_compile_ms"] > 0
    assert found["second_compile_ms"] > 0 and found["first_mask_ms"] > 0


def test_grammars_command_smoke(tmp_path: Path) -> None:
    """Two suite schemas and one tool-call run: the default table comes first, the equalized
    one second and says what changed; pegmask accepts every valid instance; JSON and the three
    plots are written."""
    out = tmp_path / "grammars.md"
    assert cli(["bench", "grammars", "--quick", "--schemas", "2", "--tool-repeats", "1",
                "--no-fresh", "--out", str(out)]) == 0
    report = out.read_text()
    defaults, equalized = (report.index("Every engine at its defaults"),
                           report.index("Languages equalized"))
    assert defaults < equalized
    assert "What changed from the defaults" in report[equalized:]
    data = json.loads(out.with_suffix(".json").read_text())
    (vocab,) = data["vocabularies"]
    assert vocab["vocabulary"] == "smollm2"
    for config in ("default", "equalized"):
        tool = vocab["tables"][config]["tool_call"]
        assert set(tool) == {"pegmask", "xgrammar", "llguidance", "outlines"}
        assert tool["pegmask"]["rejected_valid"] == 0
    assert all(not case["engines"]["pegmask"]["refused"] for case in vocab["cases"])
    for plot in ("masks", "cold", "coverage"):
        assert (tmp_path / f"grammars_smollm2_{plot}.png").read_bytes()[:8] == PNG


def test_grammars_on_a_users_regex(tmp_path: Path) -> None:
    """A regex file runs on all four engines; each accepts the instance."""
    regex, instance = tmp_path / "date.txt", tmp_path / "instance.txt"
    regex.write_text("[0-9]{4}-[0-9]{2}-[0-9]{2}( [a-z]+)*\n")
    instance.write_text("2024-05-17 the day")
    assert regex_file_case(regex, instance).schema == "[0-9]{4}-[0-9]{2}-[0-9]{2}( [a-z]+)*"
    out = tmp_path / "custom.md"
    assert cli(["bench", "grammars", "--vocab", "smollm2", "--regex", str(regex), "--instance",
                str(instance), "--no-plots", "--out", str(out)]) == 0
    (vocab,) = json.loads(out.with_suffix(".json").read_text())["vocabularies"]
    (case,) = vocab["cases"]
    assert case["kind"] == "regex"
    assert set(case["engines"]) == {"pegmask", "xgrammar", "llguidance", "outlines",
                                    "xgrammar/equalized", "llguidance/equalized"}
    assert not any(engine["refused"] for engine in case["engines"].values())
    assert "your regex grammar" in out.read_text()
