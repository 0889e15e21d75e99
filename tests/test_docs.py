"""README.md and the user guide (docs/): their runnable code blocks run (the markers are
described in tests/runnable_docs.py), the result files they cite exist, and the README and the
architecture map stay short enough to read.

Python blocks run in one helper process for the whole module (tests/runnable_docs.py), each
markdown file in its own namespace: the embedded model loads once for every file. Servers run
as their blocks say, on free loopback ports; one whose command a later block repeats (port and
path aside) serves it too. A bash command that already succeeded in this run (the README and
the guide share the set-up command) is not run again."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from runnable_docs import (
    REPLY_PREFIX,
    ROOT,
    Block,
    bash_commands,
    runnable_blocks,
    to_port,
    with_port,
)

VENV_BIN = ROOT / ".venv" / "bin"
PYTHON = VENV_BIN / "python" if (VENV_BIN / "python").exists() else Path(sys.executable)
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK_TIMEOUT_S = 300  # one Python block, or one bash command
SERVER_START_TIMEOUT_S = 240
INSTALLER = "bash scripts/install.sh"
README_MAX_LINES = 250
ARCHITECTURE_MAX_LINES = 300


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env.pop("PYTHONPATH", None)  # the blocks see pegmask as installed, as a user does
    return env


class Runner:
    """The helper process that runs Python blocks (restarted after a crash or a timeout)."""

    def __init__(self, log_dir: Path):
        self.log_dir = log_dir
        self.process: subprocess.Popen[str] | None = None
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.starts = 0

    def _start(self) -> subprocess.Popen[str]:
        self.starts += 1
        self.stderr_path = self.log_dir / f"runner-{self.starts}.stderr"
        self.lines = queue.Queue()
        process = subprocess.Popen(
            [str(PYTHON), "-u", str(ROOT / "tests" / "runnable_docs.py")], cwd=ROOT, env=_env(),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self.stderr_path.open("w"), text=True, start_new_session=True)
        lines = self.lines

        def pump() -> None:
            assert process.stdout is not None
            for line in process.stdout:
                lines.put(line)
            lines.put(None)

        threading.Thread(target=pump, daemon=True).start()
        return process

    def request(self, message: dict, timeout: float = BLOCK_TIMEOUT_S) -> tuple[dict, str]:
        """(the runner's answer, what the block printed outside it)."""
        if self.process is None or self.process.poll() is not None:
            self.process = self._start()
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(message) + "\n")
        self.process.stdin.flush()
        printed: list[str] = []
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.stop()
                return {"ok": False, "error": f"timed out after {timeout} s"}, "".join(printed)
            if line is None:
                self.process.wait()
                code = self.process.returncode
                self.process = None
                return ({"ok": False, "error": f"the runner process died (exit {code}):\n"
                         f"{self.stderr_tail()}"}, "".join(printed))
            if line.startswith(REPLY_PREFIX):
                return json.loads(line[len(REPLY_PREFIX):]), "".join(printed)
            printed.append(line)

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stderr_tail(self, chars: int = 4000) -> str:
        return self.stderr_path.read_text(errors="replace")[-chars:]

    def stop(self) -> None:
        if self.process is not None:
            _stop_group(self.process)
            self.process = None


def server_key(command: str) -> str:
    """What tells two server commands apart: not the port, the host's default value, or where
    `pegmask` is found (`.venv/bin/` is first on PATH)."""
    command = with_port(command, 0).replace("--host 127.0.0.1", "")
    return " ".join(word.removeprefix(".venv/bin/") for word in command.split())


class Servers:
    """The server a file's `runnable: server` block starts; kept for a later block (of this or
    another file) whose command differs only in port, host default or path
    (`server_key`), stopped when another command needs a server, and at the end."""

    def __init__(self, log_dir: Path):
        self.log_dir = log_dir
        self.command: str | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.log_path = log_dir / "server.log"

    def start(self, command: str) -> int:
        if (self.command is not None and server_key(self.command) == server_key(command)
                and self.process is not None and self.process.poll() is None):
            return self.port
        self.stop()
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.command = command
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                ["bash", "-c", f"exec {with_port(command, self.port)}"], cwd=ROOT, env=_env(),
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"`{command}` exited with {self.process.returncode}:\n"
                                     f"{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health",
                                            timeout=5) as answer:
                    if answer.status == 200:
                        return self.port
            except OSError:
                pass
            time.sleep(0.5)
        self.stop()
        raise AssertionError(f"`{command}` did not answer /health within "
                             f"{SERVER_START_TIMEOUT_S} s:\n{self.log_tail()}")

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def stop(self) -> None:
        if self.process is not None:
            _stop_group(self.process)
        self.process, self.command = None, None


def _stop_group(process: subprocess.Popen) -> None:
    """Stop a process started in its own session, and what it started (compile workers)."""
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        except ProcessLookupError:
            pass


@pytest.fixture(scope="module")
def log_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="pegmask-docs-") as folder:
        yield Path(folder)


@pytest.fixture(scope="module")
def runner(log_dir: Path) -> Iterator[Runner]:
    runner = Runner(log_dir)
    yield runner
    runner.stop()


@pytest.fixture(scope="module")
def servers(log_dir: Path) -> Iterator[Servers]:
    servers = Servers(log_dir)
    yield servers
    servers.stop()


def ci_commands() -> list[str]:
    return [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]


_SUCCEEDED: set[str] = set()  # bash commands that ran without error in this session


def run_bash(block: Block, command: str) -> None:
    """Run one command line; one that already succeeded here (the README and the guide give
    the same set-up command) is not run again."""
    if command in _SUCCEEDED:
        return
    try:
        done = subprocess.run(["bash", "-c", command], cwd=ROOT, env=_env(), text=True,
                              capture_output=True, timeout=BLOCK_TIMEOUT_S,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{block.where}: `{command}` ran past {BLOCK_TIMEOUT_S} s")
    if done.returncode != 0:
        pytest.fail(f"{block.where}: `{command}` exited with {done.returncode}\n"
                    f"--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}")
    _SUCCEEDED.add(command)


def run_bash_block(block: Block, port: int | None = None) -> None:
    for command in bash_commands(block.code):
        if port is not None:
            command = to_port(command, port)
        if command.startswith(INSTALLER):
            rest = command[len(INSTALLER):].strip()
            if not rest:
                continue
            assert rest.startswith("&&"), f"{block.where}: `{command}`: expected `{INSTALLER} && ...`"
            command = rest[2:].strip()
            if re.search(r"\bpytest\b", command):
                assert command in ci_commands(), (
                    f"{block.where}: `{command}` is not the test command of .ci/run")
                continue
        run_bash(block, command)


@pytest.mark.parametrize("path", DOC_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_runnable_blocks(path: Path, runner: Runner, servers: Servers) -> None:
    """Every marked block of the file runs without error (see tests/runnable_docs.py)."""
    namespace = str(path.relative_to(ROOT))
    port: int | None = None
    ran_python = False
    try:
        for block in runnable_blocks(path):
            if block.kind == "server":
                commands = bash_commands(block.code)
                assert len(commands) == 1, (
                    f"{block.where}: a server block holds one command, not {len(commands)}")
                port = servers.start(commands[0])
                continue
            if block.kind == "client":
                assert port is not None, f"{block.where}: a client block before any server block"
            if block.language == "bash":
                run_bash_block(block, port if block.kind == "client" else None)
                continue
            code = to_port(block.code, port) if block.kind == "client" else block.code
            ran_python = True
            answer, printed = runner.request({"namespace": namespace, "where": block.where,
                                              "line": block.line, "code": code})
            if not answer["ok"]:
                pytest.fail(f"{block.where}: the block failed\n{answer['error']}\n"
                            f"--- printed\n{(printed + answer.get('output', ''))[-3000:]}"
                            f"\n--- server log\n{servers.log_tail() if port else ''}")
    finally:
        if ran_python and runner.alive:  # close what the file's blocks left open
            runner.request({"end": namespace}, timeout=60)


RESULT_PATH = re.compile(r"bench/results/[A-Za-z0-9_.*/-]*[A-Za-z0-9_*/]|bench/results\b")


def test_cited_result_files_exist() -> None:
    """Every `bench/results/...` path that README.md and docs/*.md mention exists."""
    missing = []
    for path in DOC_FILES:
        for cited in sorted(set(RESULT_PATH.findall(path.read_text(encoding="utf-8")))):
            if not list(ROOT.glob(cited)):
                missing.append(f"{path.relative_to(ROOT)}: {cited}")
    assert not missing, "cited result files that do not exist:\n" + "\n".join(missing)


def test_readme_is_short() -> None:
    lines = len((ROOT / "README.md").read_text(encoding="utf-8").splitlines())
    assert lines < README_MAX_LINES, (
        f"README.md has {lines} lines; under {README_MAX_LINES}: the rest belongs in docs/")


def test_architecture_is_short() -> None:
    lines = len((ROOT / "docs" / "architecture.md").read_text(encoding="utf-8").splitlines())
    assert lines < ARCHITECTURE_MAX_LINES, (
        f"docs/architecture.md has {lines} lines; under {ARCHITECTURE_MAX_LINES}")
