"""The compiled one-row step (engine/compiled_step.py): on tiny float32 models of two
architectures, the eager step's logits token by token, with and without a shared prefix, in
caches of one slot and of several, and eager steps where the graph is not built; on the
embedded SmolLM2's quantized blocks, greedy picks within the rounded paths' bound of
float32's, a clear error for weights it cannot run, an engine decoding constrained output
through it; the switch on the command line."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch
from greedy_bound import greedy_gaps
from tiny_models import tiny_model

from pegmask import Engine
from pegmask.engine.compiled_step import OneRowStep
from pegmask.engine.llama_runner import LlamaRunner, LlamaWeights, int4_kernel_fast
from pegmask.engine.model import load_backend

# the default weights where they are the file's blocks for one-row steps (CPUs where torch's
# int4 kernel is fast), else the blocks for every step: the step traces either
WEIGHTS = "auto" if int4_kernel_fast() else "quantized"

@pytest.fixture(scope="module")
def backend():
    """The embedded model, its compiled step built once for the module (a first build on a
    fresh machine takes about a minute; later ones read inductor's cache)."""
    backend = load_backend(None)
    backend.one_row_step(WEIGHTS).warm()
    return backend


# 2-layer models whose graphs build in seconds. Their float32 products make the compiled
# step's logits the eager ones to float32 rounding; the quantized blocks take bfloat16 rows,
# which a 1e-7 difference (the same sums in another order) can round either way, moving
# SmolLM2's logits by ~0.02 on average: such a check could not tell a wrong position (0.24)
# from rounding.
COMPILED_ARCHITECTURES = ["llama-bias", "qwen3"]


@pytest.fixture(scope="module", params=COMPILED_ARCHITECTURES)
def tiny(request) -> tuple[LlamaWeights, OneRowStep]:
    weights = LlamaWeights(tiny_model(request.param, positions=600), weights="float32")
    assert OneRowStep.unsupported(weights) is None
    step = OneRowStep(weights)
    step.warm()
    return weights, step


def drive(compiled: LlamaRunner, eager: LlamaRunner, seq: int, ref: int, steps: int,
          step: OneRowStep) -> None:
    """`steps` one-token steps of both, each through the graph, logits equal to float32's
    rounding."""
    runs = step.runs
    for k in range(steps):
        token = 1 + (7 * k) % 90
        torch.testing.assert_close(compiled.forward([(seq, [token])]),
                                   eager.forward([(ref, [token])]), rtol=1e-4, atol=1e-4)
    assert step.runs == runs + steps


@pytest.mark.parametrize("others", [0, 3])
def test_compiled_steps_give_the_eager_steps_logits(tiny, others: int) -> None:
    """A lone sequence (a one-slot cache), and one beside three others (a slot of a four-slot
    cache: other strides); across a cache's growth (256 positions, then 512)."""
    weights, step = tiny
    compiled, eager = LlamaRunner(weights, one_row=step), LlamaRunner(weights)
    for _ in range(others):
        compiled.forward([(compiled.add(), [1, 2, 3])])
        eager.forward([(eager.add(), [1, 2, 3])])
    seq, ref = compiled.add(), eager.add()
    prompt = [5 + k % 80 for k in range(250)]
    torch.testing.assert_close(compiled.forward([(seq, prompt)]), eager.forward([(ref, prompt)]))
    drive(compiled, eager, seq, ref, 12, step)


def test_compiled_steps_across_cache_tiers(tiny) -> None:
    """A sequence that outgrows its tier (of 128 tokens) moves up a span before its end, so
    that every step still reads a part of its slot, and runs compiled."""
    weights, step = tiny
    compiled = LlamaRunner(weights, first_tier=128, one_row=step)
    eager = LlamaRunner(weights, first_tier=128)
    seq, ref = compiled.add(), eager.add()
    prompt = [5 + k % 80 for k in range(100)]
    compiled.forward([(seq, prompt)])
    eager.forward([(ref, prompt)])
    drive(compiled, eager, seq, ref, 40, step)
    assert compiled._tier[seq].limit > 128


def test_compiled_steps_after_a_shared_prefix(tiny) -> None:
    """A sequence restored from a saved prefix it shares (a chat server's system prompt and
    tools, engine/prefix_cache.py): attention over the prefix and its own tokens after it."""
    weights, step = tiny
    compiled, eager = LlamaRunner(weights, one_row=step), LlamaRunner(weights)
    prompt = [5 + k % 80 for k in range(40)]
    seqs = []
    for runner in (compiled, eager):
        source = runner.add()
        runner.forward([(source, prompt)])
        saved = runner.save(source, 32)
        seq = runner.restore(saved, 32)
        runner.share(seq, saved, 32)
        runner.forward([(seq, prompt[32:])])
        seqs.append(seq)
    drive(compiled, eager, *seqs, 12, step)


def test_an_unbuilt_step_leaves_steps_eager(tiny) -> None:
    """Before its graph is built a step declines, and the runner's eager path gives exactly
    the eager logits."""
    weights, _ = tiny
    unbuilt = OneRowStep(weights)
    runner, eager = LlamaRunner(weights, one_row=unbuilt), LlamaRunner(weights)
    seq, ref = runner.add(), eager.add()
    runner.forward([(seq, [1, 2, 3])])
    eager.forward([(ref, [1, 2, 3])])
    assert torch.equal(runner.forward([(seq, [42])]), eager.forward([(ref, [42])]))
    assert unbuilt.declined == 1 and unbuilt.runs == 0


def test_compiled_greedy_picks_leave_float32s_only_at_near_ties(backend) -> None:
    """The bound tests/test_runner.py holds the rounded weight paths to, for the compiled
    step over the quantized blocks; every one-token step through the graph."""
    step = backend.one_row_step(WEIGHTS)
    runs = step.runs
    steps, gaps = greedy_gaps(backend, backend.runner(weights=WEIGHTS, compiled_step=True))
    assert step.runs == runs + steps
    assert len(gaps) <= 0.05 * steps, gaps
    assert all(gap <= 0.25 for gap in gaps), gaps


def test_weights_it_cannot_trace_are_a_clear_error(backend) -> None:
    with pytest.raises(ValueError, match="neither quantized blocks nor float32"):
        backend.runner(weights="float16", compiled_step=True)
    with pytest.raises(ValueError, match="neither quantized blocks nor float32"):
        Engine(weights="float16", compiled_step=True, prewarm=False, compile_workers=0)


def test_an_engine_decodes_constrained_output_through_it(backend) -> None:
    """Masks apply to the compiled step's logits as to the eager ones: a required tool call
    and a JSON-schema answer stay valid."""
    engine = Engine(weights=WEIGHTS, compiled_step=True, prewarm=False, compile_workers=0)
    step = backend.one_row_step(WEIGHTS)
    runs = step.runs
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                               "days": {"type": "integer", "minimum": 1}},
              "required": ["city", "days"], "additionalProperties": False}
    tools = [{"type": "function", "function": {"name": "forecast", "parameters": schema}}]
    called = engine.generate([{"role": "user", "content": "Weather in Paris for 3 days?"}],
                             tools=tools, tool_choice="required", max_tokens=60, seed=1)
    call = called.message["tool_calls"][0]["function"]
    assert call["name"] == "forecast"
    jsonschema.validate(json.loads(call["arguments"]), schema)
    answer = engine.generate([{"role": "user", "content": "A trip, as JSON."}], max_tokens=60,
                             seed=2, response_format={"type": "json_schema", "json_schema": {
                                 "name": "trip", "schema": schema}})
    jsonschema.validate(json.loads(answer.message["content"]), schema)
    assert step.runs > runs + 10


def test_the_command_line_switch() -> None:
    """On by default where a process lives long (serve, chat), off for one-shot commands."""
    from pegmask.cli import _parser

    commands = _parser()._subparsers._group_actions[0].choices
    for command, default in (("serve", "auto"), ("chat", "auto"), ("generate", "off"),
                             ("demo", "off"), ("run-batch", "off")):
        switch = next(a for a in commands[command]._actions if a.dest == "compiled_step")
        assert tuple(switch.choices) == ("auto", "on", "off") and switch.default == default


def test_the_step_bench_reports_both_paths(backend, tmp_path) -> None:
    from pegmask.bench import one_row_step

    out = tmp_path / "step.md"
    assert one_row_step.main(["--contexts", "40", "--steps", "5", "--weights", WEIGHTS,
                              "--out", str(out)]) == 0
    row = next(line for line in out.read_text().splitlines() if line.startswith("| 40 |"))
    eager, compiled = (float(cell.split("/")[0]) for cell in row.split("|")[2:4])
    assert eager > 0 and compiled > 0
    assert json.loads(out.with_suffix(".json").read_text())["rows"][0]["compiled"]["steps"] == 5
