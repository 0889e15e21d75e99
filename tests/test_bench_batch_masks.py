"""The bench of many cold rows stepping together (bench/batch_masks.py), on two rows: every
engine and fill mode walks every row's instance to its end, and the report holds their step
times."""

from __future__ import annotations

from pegmask.bench.batch_masks import ENGINES, MODES, measure, report, row_cases
from pegmask.bench.grammar_engines import make_engine
from pegmask.bench.grammar_inputs import load_model


def test_two_cold_rows_step_together_on_every_engine() -> None:
    model = load_model("smollm2")
    engines = {name: make_engine(name, "default", model) for name in ENGINES}
    results = measure(engines, model, 2, 1)
    longest = max(len(model.encode(c.text)) for c in row_cases(engines, 2))
    assert set(results) == {f"{name} ({mode})" for name, mode in MODES}
    for figures in results.values():
        assert figures["steps"] == longest  # run_steps raises if a row's token is refused
        assert 0 < figures["median_step_ms"] <= figures["p99_step_ms"] <= figures["max_step_ms"]
    text = report(results, 2, [])
    assert text.count("\n| pegmask (rows) |") == 1 and "llguidance (batch)" in text
