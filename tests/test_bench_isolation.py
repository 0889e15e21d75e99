"""`pegmask bench isolation`'s heavy requests and report (its runs need a server: the published
bench/results/isolation.md is one)."""

from __future__ import annotations

import json

from pegmask.bench.isolation import (
    Phase,
    compile_heavy,
    large_body_heavy,
    report,
)
from pegmask.bench.serve_bench import Sample


def _phase(name: str, gap: float, beside: list[tuple[float, int]] = (),
           unexpected: list[str] = (), expected_status: int = 200) -> Phase:
    samples = [Sample("chat", 0.0, [0.1 + gap * k for k in range(20)]) for _ in range(4)]
    return Phase(name, samples, 10.0, list(beside), list(unexpected), expected_status)


def test_heavy_requests_are_what_they_say():
    large = large_body_heavy(1000)
    body = large.body("m", 3)
    assert large.expected_status == 400 and len(body["messages"]) == 1001
    assert len(json.dumps(large_body_heavy(40_000).body("m", 0))) > 1_500_000
    first, second = (compile_heavy(4).body("m", n) for n in (0, 1))
    assert first["response_format"] != second["response_format"]  # a new grammar each time
    assert compile_heavy(4).expected_status == 200


def test_report_gives_each_isolated_phase_its_verdict():
    phases = [_phase("alone", 0.02),
              _phase("beside compiles", 0.021, [(3.0, 200), (3.2, 200)]),
              _phase("beside large bodies", 0.05, [(60.0, 400), (1.0, 413)],
                     ["HTTP 413: too large"], 400)]
    meta = {"load_start": 0.1, "command": "pegmask bench isolation", "requests": 4,
            "max_tokens": 20, "objects": 100, "compile_s": 2.0, "compile_timeout_s": 10,
            "large_messages": 40_000, "large_body_bytes": 1_650_000}
    text = report(phases, meta)
    assert "| beside large bodies | 4 | 0 | 2 (1) |" in text
    assert "Beside compiles in workers, the worst of the four figures is 1.05x" in text
    assert "within the 1.5x target" in text
    assert "Beside large bodies on the background lane, the worst of the four figures is " \
           "2.50x the alone phase's: NOT within" in text
    assert "Heavy requests answered otherwise: beside large bodies: HTTP 413" in text
