"""Only the decode loop's thread runs torch's parallel CPU ops.

Why: torch's CPU ops run on an OpenMP team owned by the calling thread, and once a process holds
more OpenMP threads than CPUs, libgomp stops every team's workers from spinning between ops, so
each op waits for its workers to wake. One parallel op in any other thread leaves a team behind
for as long as that thread lives (the main thread, a server's pool threads: the process's life):
measured on 2 cores, the products of a step of 8 rows took 37 ms instead of 21, in every
thread, until that thread ended. So the model is loaded in a thread that ends with the loading
(`engine/model.py`), and preparing a request, waiting for it and streaming it run no torch op
in the caller's thread.

Ops are recorded with a `TorchDispatchMode`, which sees only the thread that entered it: the
decode loop's own ops are not recorded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from pegmask import Engine  # noqa: E402
from pegmask.bench.serve_compare import CHAT_TOOLS  # noqa: E402

# ATen's at::internal::GRAIN_SIZE: an elementwise op on fewer elements runs in the calling
# thread without starting an OpenMP team.
GRAIN_SIZE = 32768


class OpRecorder(TorchDispatchMode):
    """The ops this thread runs while entered: (name, most elements of an input or output)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, int]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        tensors = [t for t in tree_leaves((args, kwargs, out)) if isinstance(t, torch.Tensor)]
        self.ops.append((str(func), max((t.numel() for t in tensors), default=0)))
        return out


MESSAGES = [{"role": "user", "content": "What is the weather in Oslo?"}]
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
REQUESTS: dict[str, dict[str, Any]] = {
    "plain": {},
    "tools, required": {"tools": CHAT_TOOLS, "tool_choice": "required"},
    "tools, auto, seeded": {"tools": CHAT_TOOLS, "seed": 7},
    "json schema": {"response_format": {"type": "json_schema",
                                        "json_schema": {"name": "city", "schema": SCHEMA}}},
    "logit bias, penalties": {"logit_bias": {42: 3.0}, "frequency_penalty": 0.5,
                              "repetition_penalty": 1.2},
    "logprobs, two choices": {"logprobs": True, "top_logprobs": 3, "n": 2},
    "ignore_eos, min_tokens": {"ignore_eos": True, "min_tokens": 4},
}


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    with Engine() as engine:
        yield engine


def test_the_recorder_sees_the_callers_ops() -> None:
    """(A recorder that saw nothing would pass the tests below.)"""
    with OpRecorder() as recorder:
        torch.ones(GRAIN_SIZE).sum()
    assert [name for name, _ in recorder.ops] == ["aten.ones.default", "aten.sum.default"]
    assert recorder.ops[0][1] == GRAIN_SIZE


@pytest.mark.parametrize("options", REQUESTS.values(), ids=REQUESTS.keys())
def test_serving_a_request_runs_no_torch_op_in_the_callers_thread(
        engine: Engine, options: dict[str, Any]) -> None:
    """`generate`, whole and streamed: preparing (render, tokenize, compile in a worker), waiting
    and reading the result or the deltas, as a server's request thread does."""
    with OpRecorder() as recorder:
        result = engine.generate(MESSAGES, max_tokens=48, temperature=0.7, **options)
        streamed = list(engine.generate(MESSAGES, max_tokens=48, temperature=0.7, stream=True,
                                        **options))
    assert result.usage["completion_tokens"] > 0 and streamed
    assert recorder.ops == []


def test_building_an_engine_runs_no_parallel_op_in_the_callers_thread() -> None:
    """In a fresh interpreter (the model not yet loaded): loading and preparing the weights,
    the runner and the prewarm leave the caller's thread with only ops below the grain size
    (a bitmask row, an empty cache)."""
    code = ("import json, sys\n"
            f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
            "from test_threads import OpRecorder\n"
            "from pegmask import Engine\n"
            "with OpRecorder() as recorder:\n"
            "    engine = Engine(prewarm=True)\n"
            "engine.close()\n"
            "print(json.dumps(recorder.ops))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    ops = json.loads(done.stdout.strip().splitlines()[-1])
    large = [(name, size) for name, size in ops if size >= GRAIN_SIZE]
    assert not large, f"parallel-sized ops in the caller's thread: {large}"
