"""`pegmask bench e2e` (decode throughput, constrained vs not) and the `pegmask bench` command's
names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pegmask.cli import main as cli


def test_e2e_command_smoke(tmp_path: Path) -> None:
    """One prompt, few tokens: five modes measured; the cold constrained run and the warm one
    decode the same tokens (same seeds: a compiled-grammar cache must not change the output)."""
    out = tmp_path / "e2e.md"
    assert cli(["bench", "e2e", "--prompts", "1", "--max-tokens", "24", "--out", str(out)]) == 0
    data = json.loads(out.with_suffix(".json").read_text())
    modes = data["modes"]
    assert list(modes) == ["constrained, cold (compile + first masks)",
                           "unconstrained, one at a time", "constrained, one at a time",
                           "unconstrained, batch of 1", "constrained, batch of 1"]
    assert all(mode["tokens"] > 0 and mode["outputs"] == 1 for mode in modes.values())
    cold, warm = modes["constrained, cold (compile + first masks)"], modes[
        "constrained, one at a time"]
    assert (cold["tokens"], cold["valid"]) == (warm["tokens"], warm["valid"])
    assert "| mode | prefill s |" in out.read_text()
    assert out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"


def test_bench_names(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["bench", "nonesuch"]) == 2
    listed = capsys.readouterr().err
    assert all(name in listed for name in ("grammars", "tools", "e2e", "serve"))
