"""`pegmask bench compile`: a smoke run of the command (report, JSON, plot)."""

from __future__ import annotations

import json
from pathlib import Path

from pegmask.bench.compile_scale import bfcl_tools, call_schema, enum_words
from pegmask.cli import main as cli

PNG = b"\x89PNG\r\n\x1a\n"


def test_inputs_are_distinct_and_name_their_run() -> None:
    words = enum_words(500)
    assert len(set(words)) == 500 and words == enum_words(500)
    tools = bfcl_tools(12)
    names = [tool["function"]["name"] for tool in tools]
    assert len(set(names)) == 12
    schema = call_schema(tools, 3)
    assert "run 3" in schema["description"] and len(schema["anyOf"]) == 12


def test_compile_command_smoke(tmp_path: Path) -> None:
    out = tmp_path / "scale.md"
    assert cli(["bench", "compile", "--enums", "200", "--tools", "3", "--runs", "1",
                "--out", str(out)]) == 0
    report = out.read_text()
    assert "| 200 |" in report and "| 3 |" in report and "xgrammar, cache off" in report
    data = json.loads(out.with_suffix(".json").read_text())
    for kind, size in (("enums", "200"), ("tools", "3")):
        engines = data["results"][kind][size]
        assert set(engines) == {"pegmask", "xgrammar", "llguidance", "xgrammar, cache off"}
        assert all("error" not in figures for figures in engines.values()), engines
        assert engines["pegmask"]["to_first_mask_ms"] >= engines["pegmask"]["first_mask_ms"] > 0
    assert out.with_suffix(".png").read_bytes()[:8] == PNG
