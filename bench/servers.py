"""The servers benches start and drive, in one place: a free loopback port, `pegmask serve` in a
subprocess, waiting for a server to answer, and stopping it with what it started."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx


def free_port() -> int:
    """A loopback port no one listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def server_command(model: str | None, port: int, extra: list[str]) -> list[str]:
    """`pegmask serve` on loopback, in this interpreter (so the checkout measured is this one)."""
    command = [sys.executable, "-m", "pegmask.cli", "serve", "--host", "127.0.0.1",
               "--port", str(port), "--log-level", "warning", *extra]
    return command + ["--model", model] if model else command


def start_server(model: str | None, port: int, extra: list[str]) -> subprocess.Popen[bytes]:
    """`server_command` started, its output dropped but for stderr (`wait_ready` shows it)."""
    return subprocess.Popen(server_command(model, port, extra), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)


def wait_ready(url: str, process: subprocess.Popen[bytes] | None, timeout: float) -> str:
    """Wait for the server's /v1/models; returns the first model name. RuntimeError when
    `process` exits first or nothing answers within `timeout` seconds."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError("the server exited: "
                               + (process.stderr.read() if process.stderr else b"").decode()[-2000:])
        try:
            models = httpx.get(f"{url}/v1/models", timeout=2).json()
            return models["data"][0]["id"]
        except (httpx.HTTPError, KeyError, ValueError):
            time.sleep(1)
    raise RuntimeError(f"no server answered at {url} within {timeout} s")


def stop(process: subprocess.Popen[Any], timeout_s: float = 60.0, *, group: bool = False) -> None:
    """End a server: SIGTERM (uvicorn's and vLLM's graceful stop), SIGKILL after `timeout_s`.
    `group`: its whole process group (one started with `start_new_session`), resumed first (it
    may be paused) and signalled even where its first process has exited (what it started may
    outlive it)."""
    if group:
        for number in (signal.SIGCONT, signal.SIGTERM):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, number)
    elif process.poll() is None:
        process.terminate()
    else:
        return
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        if group:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        else:
            process.kill()
        process.wait()


@contextlib.contextmanager
def served(extra: list[str], timeout: float = 900,
           ) -> Iterator[tuple[str, str, subprocess.Popen[bytes]]]:
    """`pegmask serve` (the embedded model, `extra` flags) in a subprocess on a free loopback
    port: (its URL, its model's name, the process) once it answers; stopped on exit."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = start_server(None, port, extra)
    try:
        yield url, wait_ready(url, process, timeout), process
    finally:
        stop(process)
