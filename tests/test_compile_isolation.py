"""Grammar compiles in worker processes (engine/compile_service.py), on the embedded model with
real workers: budgets become 400s naming the limit, a dead worker is replaced, a slow compile
holds up only its own request, and identical grammars asked for at once compile once."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator

import pytest
from server_harness import serve
from vocabularies import smollm2

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from pegmask import Engine  # noqa: E402
from pegmask.bench.isolation import form_format, form_schema  # noqa: E402
from pegmask.dialects import ChatRequest, get_dialect  # noqa: E402
from pegmask.engine.compile_service import CompileService, CompileWorkers  # noqa: E402
from pegmask.engine.requests import InvalidRequestError  # noqa: E402
from pegmask.grammars import Grammar, GrammarLimits, GrammarTooLarge  # noqa: E402
from pegmask.grammars.ir import GrammarIR, Literal, Ref, choice, json_schema_node, seq  # noqa: E402

CHAT = [{"role": "user", "content": "Fill in the form."}]
# `form_format`'s distinct nested objects: a compile that grows with the schema (about 3 s of
# one core for 1,000 of them, near the compiler's instruction limit), no cheaper by a shortcut.
SLOW = 1000


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    # Instruction budget raised: `chain` grammars stay legal, so that only time stops them.
    engine = Engine(compile_timeout_s=120, grammar_limits=GrammarLimits(max_instructions=10**9))
    yield engine
    engine.close()


def wait_for(condition, what: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_a_compile_past_the_time_budget_is_a_400_naming_it(
        engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    workers = engine.compile_service.workers
    assert workers is not None
    before = workers.pids
    monkeypatch.setattr(workers, "timeout_s", 0.2)
    with serve(engine) as server, server.http() as client:
        body = {"messages": CHAT, "response_format": form_format(SLOW), "max_tokens": 8}
        answer = client.post("/v1/chat/completions", json=body)
        assert answer.status_code == 400
        error = answer.json()["error"]
        assert error["param"] == "response_format"
        assert "compile_time" in error["message"] and "0.2 s" in error["message"]
        # The server goes on, with a fresh worker in place of the one killed.
        plain = client.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 2})
        assert plain.status_code == 200
        assert server.metric("pegmask_grammar_compiles_total", outcome="compile_time") == 1
    assert workers.pids and not set(workers.pids) & set(before)


def chain(rules: int) -> Grammar:
    """`r0 = "a0" r1 | "b0"`, ... `rules` deep: a legal grammar, from the Python API (its
    instruction limit raised), whose compile takes as long as one likes (about 2.5 s of one
    core for 20,000 rules)."""
    ir = {f"r{i}": choice(seq(Literal.of(f"a{i}"), Ref(f"r{i + 1}")), Literal.of(f"b{i}"))
          for i in range(rules)}
    ir[f"r{rules}"] = Literal.of("end")
    return Grammar(GrammarIR({"root": Ref("r0"), **ir}),
                   limits=GrammarLimits(max_instructions=10**9))


def test_a_slow_compile_holds_up_only_its_own_request_and_a_dead_worker_is_replaced(
        engine: Engine) -> None:
    workers = engine.compile_service.workers
    assert workers is not None
    outcome: dict[str, object] = {}
    endless = chain(60_000)  # seconds, and more at the worker's low priority: killed before

    def slow() -> None:
        try:
            engine.generate("Spell it:", grammar=endless, max_tokens=8)
        except InvalidRequestError as exc:
            outcome["error"] = exc
        outcome["done"] = time.monotonic()

    thread = threading.Thread(target=slow)
    thread.start()
    wait_for(lambda: workers.running == 1, "the slow compile")
    # A request with no grammar goes on meanwhile.
    plain = engine.generate("The capital of France is", max_tokens=4, temperature=0)
    finished = time.monotonic()
    assert plain.usage["completion_tokens"] > 0
    assert "done" not in outcome and workers.running == 1, "the slow compile ended first"

    (pid,) = workers.pids
    os.kill(pid, signal.SIGKILL)
    thread.join(120)
    assert outcome["done"] > finished
    error = outcome["error"]
    assert isinstance(error, InvalidRequestError) and error.param == "grammar"
    assert "compile_memory" in str(error)
    wait_for(lambda: workers.pids and workers.pids != [pid], "a fresh worker")
    small = engine.generate(CHAT, response_format=form_format(2, "small_"), max_tokens=80,
                            temperature=0)
    assert "small_section_0" in json.loads(small.message["content"])


def test_identical_grammars_asked_for_at_once_compile_once(engine: Engine) -> None:
    shared = form_format(300, "shared_")
    requests = [engine.request(CHAT, response_format=shared) for _ in range(3)]
    start = threading.Barrier(len(requests))
    specs: list = [None] * len(requests)

    def prepare(i: int) -> None:
        start.wait()
        specs[i] = engine.prepare(requests[i])

    before = engine.compile_service.compiles
    threads = [threading.Thread(target=prepare, args=(i,)) for i in range(len(requests))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert engine.compile_service.compiles == before + 1
    assert specs[0].compiled is specs[1].compiled is specs[2].compiled
    # Kept: the same format later is not compiled again.
    engine.prepare(engine.request(CHAT, response_format=form_format(300, "shared_")))
    assert engine.compile_service.compiles == before + 1


def test_a_compile_past_the_memory_budget_fails_naming_it() -> None:
    grammar = Grammar.from_node(json_schema_node(form_schema(SLOW)))
    workers = CompileWorkers(smollm2(), 1, timeout_s=None, memory_bytes=32 << 20)
    try:
        with pytest.raises(GrammarTooLarge) as caught:
            workers.run(grammar)
        assert caught.value.limit == "compile_memory" and caught.value.allowed == 32
        assert "compile_memory" in str(caught.value)
        program, (dist, via) = workers.run(get_dialect("hermes").grammar(ChatRequest()))
        assert len(dist) == len(via) == len(program.kind)
    finally:
        workers.close()


def test_in_process_compiles_need_no_workers() -> None:
    """`compile_workers=0`: the same cache, compiled in the caller's thread."""
    service = CompileService(smollm2(), workers=0)
    grammar = Grammar.from_node(json_schema_node(form_schema(3)))
    compiled = service.compile(grammar)
    assert service.compile(grammar) is compiled and service.compiles == 1
    assert service.workers is None
    service.close()


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux's idle scheduling class")
def test_workers_run_only_on_cycles_decoding_leaves() -> None:
    """SCHED_IDLE, not a niceness: a niced worker still preempts the decode loop's threads."""
    workers = CompileWorkers(smollm2(), 1, timeout_s=None, memory_bytes=None)
    try:
        workers.run(get_dialect("hermes").grammar(ChatRequest()))  # the worker is up
        (pid,) = workers.pids
        assert os.sched_getscheduler(pid) == os.SCHED_IDLE
        assert os.sched_getscheduler(0) != os.SCHED_IDLE
    finally:
        workers.close()


def test_workers_end_with_the_service() -> None:
    workers = CompileWorkers(smollm2(), 2, timeout_s=None, memory_bytes=None)
    pids = workers.pids
    assert len(pids) == 2
    workers.close()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    with pytest.raises(RuntimeError):
        workers.run(get_dialect("hermes").grammar(ChatRequest()))

