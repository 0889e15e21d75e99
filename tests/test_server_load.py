"""Many requests at once: the scheduler decodes them in shared steps, each reply complete and
unmixed; a client that goes away frees its row; `Engine.generate`, its streams and
`generate_batch` from several threads at once all complete."""

from __future__ import annotations

import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from server_harness import Server, metric_value, recording, serve

from pegmask import Engine

CLIENTS = 8


@pytest.fixture(scope="module")
def engine():
    with Engine() as engine:
        yield engine


@pytest.fixture(scope="module")
def server(engine: Engine):
    with serve(engine) as running:
        yield running


def _batch_sizes(server: Server) -> tuple[float, float, float]:
    """(steps, steps with one row, steps with at most 4 rows) so far."""
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    return (metric_value(text, "pegmask_batch_size_count"),
            metric_value(text, "pegmask_batch_size_bucket", le="1.0"),
            metric_value(text, "pegmask_batch_size_bucket", le="4.0"))


def test_eight_streams_decode_in_shared_steps(server: Server) -> None:
    """Eight streaming clients at once, each under its own constraint (a regex that starts with
    the client's number): every reply matches its own pattern in full, and /metrics shows steps
    that sampled several rows."""
    model = server.engine.model_name
    patterns = [f"client {i}: ([a-z]{{2,8}} ){{3}}[a-z]{{2,8}}\\." for i in range(CLIENTS)]
    barrier = threading.Barrier(CLIENTS)

    def client(i: int) -> tuple[str, str | None, set[str]]:
        barrier.wait()
        stream = server.openai().chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Say four short words."}],
            response_format={"type": "regex", "regex": patterns[i]}, max_tokens=64, seed=i,
            stream=True)
        text, finish, ids = "", None, set()
        for chunk in stream:
            ids.add(chunk.id)
            choice = chunk.choices[0]
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
        return text, finish, ids

    before = _batch_sizes(server)
    with ThreadPoolExecutor(CLIENTS) as pool:
        replies = list(pool.map(client, range(CLIENTS)))
    after = _batch_sizes(server)

    for i, (text, finish, ids) in enumerate(replies):
        assert re.fullmatch(patterns[i], text), (i, text)
        assert finish == "stop" and len(ids) == 1
    assert len({ids.pop() for _, _, ids in replies}) == CLIENTS
    steps, single, small = (a - b for a, b in zip(after, before, strict=True))
    assert steps - single > 0  # steps that sampled more than one row
    print(f"{steps:.0f} steps, {steps - single:.0f} with >1 row, {steps - small:.0f} with >4")


def test_a_client_that_disconnects_frees_its_row(server: Server) -> None:
    """A stream closed after a few chunks: its row leaves the batch (the scheduler counts no
    running row) within a couple of seconds, and its request ends cancelled."""
    body = {"model": server.engine.model_name, "max_tokens": 2000, "stream": True,
            "ignore_eos": True, "prompt": "Once upon a time"}
    with recording(server.engine) as recorder, server.http() as http:
        with http.stream("POST", "/v1/completions", json=body) as response:
            assert response.status_code == 200
            # Held, not left to a `for` loop's break: closing the iterator closes the connection.
            lines = response.iter_lines()
            received = [next(lines) for _ in range(6)]
            assert all(line.startswith("data: ") for line in received[::2])
            assert server.health()["running"] == 1
        closed = time.monotonic()
        while server.health()["running"] and time.monotonic() - closed < 5:
            time.sleep(0.05)
        freed_after = time.monotonic() - closed
    assert server.health()["running"] == 0, "the row still decodes"
    (submission,) = recorder.submissions
    assert submission.done.wait(5) and submission.cancelled
    assert len(submission.rows[0].generated) < 500
    print(f"row freed {freed_after:.2f} s after the client left")


def test_a_plain_request_whose_client_leaves_is_cancelled(server: Server) -> None:
    """Not streamed: the server notices the client left while it waits, and cancels."""
    body = {"model": server.engine.model_name, "max_tokens": 2000, "ignore_eos": True,
            "prompt": "Once upon a time"}
    with recording(server.engine) as recorder:
        with pytest.raises(httpx.TimeoutException):
            httpx.post(f"{server.url}/v1/completions", json=body, timeout=1.5)
        (submission,) = recorder.submissions
        assert submission.done.wait(10), "the request still decodes"
    assert submission.cancelled
    assert server.health()["running"] == 0


def test_engine_from_several_threads(engine: Engine) -> None:
    """generate, streams and generate_batch at once from their own threads: each result is
    whole and its own (a per-thread choice constraint), streams reassemble to their results."""
    words = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot"]

    def plain(i: int) -> str:
        result = engine.generate([{"role": "user", "content": "Pick."}], max_tokens=8, seed=i,
                                 response_format={"type": "choice", "choice": [words[i]]})
        return result.message["content"]

    def streamed(i: int) -> str:
        stream = engine.generate(f"Word {i}:", stream=True, max_tokens=8, seed=i,
                                 response_format={"type": "regex", "regex": f"{words[i]}!"})
        text = "".join(delta.get("text", "") for delta in stream)
        assert stream.result is not None and stream.result.text == text
        return text

    def batch(i: int) -> list[str]:
        results = engine.generate_batch([
            {"prompt": "Say", "max_tokens": 8, "seed": i,
             "response_format": {"type": "choice", "choice": [f"{words[i]}-{j}"]}}
            for j in range(2)])
        return [result.text for result in results]

    jobs = [(plain, 0), (plain, 1), (streamed, 2), (streamed, 3), (batch, 4), (batch, 5)]
    with ThreadPoolExecutor(len(jobs)) as pool:
        futures = [pool.submit(job, i) for job, i in jobs]
        out = [future.result(timeout=300) for future in futures]
    assert out == ["alpha", "bravo", "charlie!", "delta!",
                   ["echo-0", "echo-1"], ["foxtrot-0", "foxtrot-1"]]
    assert engine.scheduler.running == 0 and engine.scheduler.queued == 0
