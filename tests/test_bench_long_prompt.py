"""`pegmask bench long_prompt` end to end, tiny: a pegmask server in a subprocess per
configuration, streaming clients and one long prompt among them; the report's figures are
consistent, and gaps are split by the long request's window."""

from __future__ import annotations

import json
from pathlib import Path

from pegmask.bench.long_prompt import Run
from pegmask.bench.serve_bench import Sample
from pegmask.cli import main as cli


def test_gaps_are_split_by_the_long_requests_window() -> None:
    sample = Sample("chat", 0.0, piece_times=[1.0, 2.0, 5.0, 6.0, 9.0])
    failed = Sample("chat", 0.0, piece_times=[3.0, 4.0], error="HTTP 500")
    run = Run("x", [], [sample, failed], long_start=4.0, long_end=8.0, long_status=200,
              long_prompt_tokens=10, peak_rss_bytes=1)
    assert run.gaps(True) == [3.0, 1.0]  # the gaps ending at 5 and 6
    assert run.gaps(False) == [1.0, 3.0]  # ending at 2 and 9; the failed request's not counted
    summary = run.summary()
    assert summary["errors"] == 1 and summary["tokens_per_s_during"] == 0.5


def test_long_prompt_bench_smoke(tmp_path: Path) -> None:
    out = tmp_path / "long_prompt.md"
    assert cli(["bench", "long_prompt", "--clients", "2", "--prompt-tokens", "400",
                "--max-tokens", "16", "--lead", "1", "--out", str(out)]) == 0
    data = json.loads(out.with_suffix(".json").read_text())
    runs = {run["config"]: run for run in data["runs"]}
    assert set(runs) == {"default", "no-decode-first"}
    assert runs["no-decode-first"]["flags"] == "--no-decode-first"
    for run in runs.values():
        assert run["long_status"] == 200 and run["long_prompt_tokens"] > 400
        assert run["errors"] == 0 and run["requests"] >= 2
        assert run["itl_outside_p50_s"] is not None and run["peak_rss_bytes"] > 10**8
    text = out.read_text()
    assert "| default | `-` |" in text and "| no-decode-first | `--no-decode-first` |" in text
    assert out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
