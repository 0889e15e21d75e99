"""`pegmask bench serve` end to end, tiny: a pegmask server in a subprocess, streaming clients
through two APIs, constrained and not; the report's figures are consistent."""

from __future__ import annotations

import json
from pathlib import Path

from pegmask.cli import main as cli


def test_serve_bench_smoke(tmp_path: Path) -> None:
    out = tmp_path / "serve.md"
    assert cli(["bench", "serve", "--clients", "1,2", "--requests", "2", "--max-tokens", "32",
                "--apis", "chat,messages", "--no-probe", "--out", str(out)]) == 0
    data = json.loads(out.with_suffix(".json").read_text())
    phases = {(p["clients"], p["mode"]): p for p in data["phases"]}
    assert set(phases) == {(c, m) for c in (1, 2) for m in ("constrained", "unconstrained")}
    for phase in phases.values():
        assert phase["errors"] == 0 and phase["requests"] == 2
        assert phase["tokens"] > 0 and phase["tokens_per_s"] > 0
        assert phase["ttft_p50_s"] is not None
    for clients in (1, 2):
        constrained = phases[(clients, "constrained")]
        # Every constrained answer holds a call whose arguments are a JSON object.
        assert constrained["with_calls"] == constrained["calls_valid"] == 2
    assert "| clients | mode |" in out.read_text()
    assert out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
