"""The GPU check's report (bench/gpu_report.py) renders the results of the H200 run kept in
bench/results/: every kernel case, decode run and serve phase becomes a table row."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from pegmask.bench.gpu_report import report

RESULTS = Path(__file__).resolve().parent.parent / "bench" / "results"


def test_the_report_has_a_row_per_measurement(tmp_path: Path) -> None:
    for name in ("env", "kernels", "decode", "serve"):
        shutil.copy(RESULTS / f"gpu_{name}.json", tmp_path / f"{name}.json")
    text = report(tmp_path)
    kernels = json.loads((tmp_path / "kernels.json").read_text())["cases"]
    rows = [line for line in text.splitlines() if line.startswith("| ") and line.endswith("| yes |")]
    assert len(rows) == len(kernels) == 24  # every case equal to the CPU reference
    assert "NVIDIA H200" in text
    serve = json.loads((tmp_path / "serve.json").read_text())
    assert serve["status"] == "ok"
    for tokens_per_s in ("528.5", "408.3"):  # 32 clients, unconstrained and constrained
        assert f"| {tokens_per_s} |" in text


def test_missing_results_leave_their_sections_out(tmp_path: Path) -> None:
    shutil.copy(RESULTS / "gpu_env.json", tmp_path / "env.json")
    text = report(tmp_path)
    assert "NVIDIA H200" in text and "Token bitmask kernel" not in text
