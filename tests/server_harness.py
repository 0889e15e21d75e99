"""Helpers for the server tests: the real server (uvicorn) on a free loopback port, the official
OpenAI and Anthropic clients pointed at it, and a recorder of what reaches the scheduler."""

from __future__ import annotations

import contextlib
import os
import re
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import anthropic
import httpx
import openai
import uvicorn

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from pegmask import Engine  # noqa: E402
from pegmask.engine.decode import RowSpec  # noqa: E402
from pegmask.engine.scheduler import Submission  # noqa: E402
from pegmask.server import ServerConfig, create_app  # noqa: E402

KEY = "sk-test"  # what the clients send when a server asks for no key (ignored there)


@dataclass
class Server:
    """A running server: its engine, base URL and clients."""

    engine: Engine
    url: str
    api_key: str = KEY

    def openai(self, api_key: str | None = None, **options) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=api_key or self.api_key,
                             max_retries=0, timeout=120, **options)

    def anthropic(self, api_key: str | None = None, **options) -> anthropic.Anthropic:
        return anthropic.Anthropic(base_url=self.url, api_key=api_key or self.api_key,
                                   max_retries=0, timeout=120, **options)

    def http(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=120,
                            headers={"Authorization": f"Bearer {self.api_key}"})

    def health(self) -> dict:
        return httpx.get(f"{self.url}/health", timeout=30).json()

    def metric(self, name: str, **labels: str) -> float:
        """One sample of /metrics (0 when absent)."""
        text = httpx.get(f"{self.url}/metrics", timeout=30).text
        return metric_value(text, name, **labels)


def metric_value(text: str, name: str, **labels: str) -> float:
    """A sample's value in Prometheus text (0 when absent); `labels` must all match."""
    for line in text.splitlines():
        match = re.match(r"([a-zA-Z_:][\w:]*)(\{[^}]*\})?\s+(\S+)$", line)
        if match is None or match.group(1) != name:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2) or ""))
        if all(found.get(key) == value for key, value in labels.items()):
            return float(match.group(3))
    return 0.0


@contextlib.contextmanager
def serve(engine: Engine, config: ServerConfig | None = None) -> Iterator[Server]:
    """Run `create_app(engine, config)` under uvicorn in a thread, on a free loopback port."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(engine, config), log_level="warning",
                                           lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the server did not start")
        time.sleep(0.02)
    try:
        api_key = config.api_key if config is not None and config.api_key else KEY
        yield Server(engine, f"http://127.0.0.1:{port}", api_key)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


@dataclass
class Recorder:
    """The requests that reached `engine.scheduler.submit` while recording."""

    engine: Engine
    submissions: list[Submission] = field(default_factory=list)

    @property
    def specs(self) -> list[RowSpec]:
        return [s.spec for s in self.submissions]

    def prompt(self, index: int) -> str:
        """The text of a recorded request's prompt tokens (special tokens spelled)."""
        return token_text(self.engine, self.specs[index].prompt_ids)

    def output(self, index: int) -> str:
        """The raw text a recorded request generated (special tokens spelled, the stop token
        that ended it left out), once it is done."""
        submission = self.submissions[index]
        submission.done.wait(120)
        return submission.rows[0].text(spell_specials=True)


def token_text(engine: Engine, token_ids: list[int]) -> str:
    vocab = engine.vocab
    return b"".join(vocab.token_bytes[t] or vocab.special_names.get(t, "").encode()
                    for t in token_ids).decode("utf-8", errors="replace")


@contextlib.contextmanager
def recording(engine: Engine) -> Iterator[Recorder]:
    """Record the submissions of `engine` (a wrapper around `engine.scheduler.submit`)."""
    scheduler = engine.scheduler
    recorder = Recorder(engine)
    original = scheduler.submit
    lock = threading.Lock()

    def submit(spec: RowSpec) -> Submission:
        submission = original(spec)
        with lock:
            recorder.submissions.append(submission)
        return submission

    scheduler.submit = submit  # type: ignore[method-assign]
    try:
        yield recorder
    finally:
        del scheduler.submit  # the class's method again
