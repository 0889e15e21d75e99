"""`pegmask bench tools`: the BFCL adapter (data, BFCL types to JSON Schema, floats in arrays,
the AST checker behind its stand-in config, scoring) and a smoke run of the command on the
embedded model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from pegmask.bench import bfcl
from pegmask.bench.tools_bench import MODES, modes_for, score
from pegmask.cli import main as cli
from pegmask.grammars import Grammar

DEFAULT_CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple", "irrelevance")


def _call(name: str, arguments: dict) -> dict:
    return {"id": "call_0", "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)}}


def _first_values(params: dict) -> dict:
    """Each argument's first possible value ("" = omitted; a dict's own values likewise)."""
    chosen = {}
    for key, values in params.items():
        if values and values[0] != "":
            first = values[0]
            chosen[key] = _first_values(first) if isinstance(first, dict) else first
    return chosen


def _first_answer(question: bfcl.Question) -> list[dict]:
    """A call per expected function, with the first possible values."""
    return [{name: _first_values(params)} for answer in question.answers
            for name, params in answer.items()]


@pytest.mark.parametrize("category", DEFAULT_CATEGORIES)
def test_categories_load_with_answers_aligned(category: str) -> None:
    questions = bfcl.load_category(category)
    assert len(questions) >= 200
    assert len({q.id for q in questions}) == len(questions)
    for q in questions:
        assert q.category == category and q.messages and q.functions
        assert (q.answers is None) == bfcl.is_irrelevance(category)


def test_unknown_category_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown BFCL category 'simple'"):
        bfcl.load_category("simple")


JSON_TYPES = {"object", "array", "string", "number", "integer", "boolean"}


def _subschemas(schema: dict) -> list[dict]:
    found = [schema]
    for child in [*schema.get("properties", {}).values(), schema.get("items")]:
        if isinstance(child, dict):
            found += _subschemas(child)
    return found


def test_tools_are_json_schema() -> None:
    """Every function of the default categories becomes a schema with JSON Schema types only
    and BFCL's own keys dropped; every tenth question's pass the metaschema and compile."""
    for category in DEFAULT_CATEGORIES:
        for i, question in enumerate(bfcl.load_category(category)):
            for tool in bfcl.tools(question):
                function = tool["function"]
                schema = function["parameters"]
                assert function["description"].endswith(bfcl.PYTHON_HINT)
                for sub in _subschemas(schema):
                    assert sub["type"] in JSON_TYPES and "optional" not in sub
                if i % 10 == 0:
                    jsonschema.Draft202012Validator.check_schema(schema)
                    Grammar.from_json_schema(schema)


def test_json_schema_maps_nested_types() -> None:
    spec = {"type": "dict", "properties": {
        "point": {"type": "tuple", "items": {"type": "float"}, "description": "x"},
        "meta": {"type": "dict", "properties": {"n": {"type": "any"}}, "optional": True}},
        "required": ["point"]}
    assert bfcl.json_schema(spec) == {
        "type": "object", "required": ["point"], "properties": {
            "point": {"type": "array", "description": "x", "items": {"type": "number"}},
            "meta": {"type": "object", "properties": {"n": {"type": "string"}}}}}


def test_floats_in_arrays_are_read_as_floats() -> None:
    function = {"name": "f", "parameters": {"type": "dict", "properties": {
        "values": {"type": "array", "items": {"type": "float"}},
        "count": {"type": "integer"}, "scale": {"type": "float"},
        "nested": {"type": "dict", "properties": {"ws": {"type": "array",
                                                          "items": {"type": "float"}}}}}}}
    value = bfcl.read_arguments('{"values": [1, 2.5], "count": 3, "scale": 2, '
                                '"nested": {"ws": [4]}}', function)
    assert value == {"values": [1.0, 2.5], "count": 3, "scale": 2, "nested": {"ws": [4.0]}}
    assert type(value["values"][0]) is float and type(value["nested"]["ws"][0]) is float
    assert type(value["count"]) is int and type(value["scale"]) is int  # the checker converts
    with pytest.raises(ValueError):
        bfcl.read_arguments('{"values": [1,', function)


def test_checker_runs_without_hosted_sdks_and_keeps_dotted_names() -> None:
    question = next(q for q in bfcl.load_category("simple_python")
                    if q.functions[0]["name"] == "math.factorial")
    assert bfcl.check(question, [{"math.factorial": {"number": 5}}])
    assert not bfcl.check(question, [{"math.factorial": {"number": 6}}])
    assert not bfcl.check(question, [{"math_factorial": {"number": 5}}])
    assert not bfcl.check(question, [])
    # In a fresh interpreter: this one has imported openai and anthropic for other tests.
    program = (
        "import sys\n"
        "from pegmask.bench import bfcl\n"
        "question = bfcl.load_category('simple_python')[0]\n"
        "bfcl.check(question, [])\n"
        "print([m for m in ('cohere', 'anthropic', 'google.genai', 'mistralai', 'openai')"
        " if m in sys.modules])\n"
    )
    proc = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "[]"


@pytest.mark.parametrize("category", ["simple_python", "multiple", "parallel",
                                      "parallel_multiple"])
def test_reference_answers_pass_the_checker(category: str) -> None:
    """The first possible answer of each sampled question, sent as tool-call JSON, scores
    correct; with one argument value changed it does not."""
    for question in bfcl.sample(bfcl.load_category(category), 20, seed=1):
        calls = _first_answer(question)
        message = {"tool_calls": [_call(name, args) for c in calls for name, args in c.items()]}
        read, made, valid, correct = score(question, message, bfcl.is_parallel(category))
        assert correct, (question.id, read)
        assert made == len(calls)


def test_irrelevance_is_correct_only_without_a_call() -> None:
    question = bfcl.load_category("irrelevance")[0]
    name = question.functions[0]["name"]
    assert score(question, {"tool_calls": []}, False)[3]
    assert not score(question, {"tool_calls": [_call(name, {})]}, False)[3]


def test_score_counts_invalid_calls_and_keeps_one_when_not_parallel() -> None:
    question = bfcl.load_category("simple_python")[0]  # calculate_triangle_area(base, height)
    good = _call("calculate_triangle_area", {"base": 10, "height": 5})
    wrong_type = _call("calculate_triangle_area", {"base": "ten", "height": 5})
    unknown = _call("no_such_tool", {})
    assert score(question, {"tool_calls": [good, good]}, False)[1:] == (1, 1, True)
    assert score(question, {"tool_calls": [good, good]}, True)[1:] == (2, 2, False)
    assert score(question, {"tool_calls": [wrong_type]}, False)[1:] == (1, 0, False)
    assert score(question, {"tool_calls": [unknown]}, False)[1:] == (1, 0, False)


def test_sample_is_seeded_and_in_file_order() -> None:
    questions = bfcl.load_category("parallel")
    picked = bfcl.sample(questions, 5, seed=3)
    assert picked == bfcl.sample(questions, 5, seed=3) != bfcl.sample(questions, 5, seed=4)
    indexes = [questions.index(q) for q in picked]
    assert indexes == sorted(indexes)
    assert bfcl.sample(questions, None, 0) == questions


def test_required_mode_only_where_every_question_expects_a_call() -> None:
    assert modes_for("simple_python", MODES) == list(MODES)
    assert modes_for("irrelevance", MODES) == ["auto", "unconstrained"]


def test_bad_options_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli(["bench", "tools", "--categories", "simple_python,nope"])
    assert exit_info.value.code == 2
    assert "unknown categories or modes: nope" in capsys.readouterr().err


def test_tools_command_smoke(tmp_path: Path) -> None:
    """One question per mode on the embedded model: the report, JSON and plot are written;
    constrained `required` output parses into calls that validate; the unconstrained prompt is
    the constrained one."""
    out = tmp_path / "bfcl.md"
    assert cli(["bench", "tools", "--categories", "simple_python,irrelevance", "--sample", "1",
                "--max-tokens", "64", "--out", str(out)]) == 0
    data = json.loads(out.with_suffix(".json").read_text())
    runs = {(r["category"], r["mode"]): r for r in data["runs"]}
    assert set(runs) == {("simple_python", "required"), ("simple_python", "auto"),
                         ("simple_python", "unconstrained"), ("irrelevance", "auto"),
                         ("irrelevance", "unconstrained")}
    assert all(r["questions"] == 1 and r["errors"] == 0 for r in runs.values())
    required = runs["simple_python", "required"]
    (outcome,) = required["outcomes"]  # one call (parallel_tool_calls is off), closed in time
    assert outcome["finish_reason"] == "tool_calls"
    assert outcome["made"] == outcome["valid"] == 1
    for category in ("simple_python", "irrelevance"):
        auto, free = runs[category, "auto"], runs[category, "unconstrained"]
        assert auto["outcomes"][0]["prompt_tokens"] == free["outcomes"][0]["prompt_tokens"]
    report = out.read_text()
    assert "## AST accuracy by category" in report and "| simple_python |" in report
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
