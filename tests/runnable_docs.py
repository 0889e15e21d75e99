"""The runnable code blocks of README.md and the guide in docs/ (run by tests/test_docs.py), and
the process their Python runs in (`python tests/runnable_docs.py`).

A block is runnable when the line directly before its opening fence is one of these markers
(indented like the fence where the block is indented):

``<!-- runnable -->`` before a ```` ```python ```` block
    The block is executed. All runnable Python blocks of one markdown file run in order in one
    namespace, like a doctest session, in a separate process (the repository's `.venv` Python,
    so a crash cannot take pytest down): a block may use what an earlier block of the same file
    defined (one `Engine()` made by the first block serves the later ones). Tracebacks name the
    markdown file and its line. Engines left in the namespace are closed after the file.
``<!-- runnable -->`` before a ```` ```bash ```` block
    Each command is run by bash in the repository root, with `.venv/bin` first on PATH, under a
    timeout; a non-zero exit fails. A command is a line; one ending in `\\`, or leaving a quote
    open (a JSON body over several lines), continues on the next; blank lines and `#` comments
    are skipped. `bash scripts/install.sh && COMMAND` is what CI itself runs (`.ci/run`): the
    installer is not run again, only COMMAND; and a COMMAND that runs pytest is not run at all
    (the suite would run itself) but must be the test command of `.ci/run`.
``<!-- runnable: server -->`` before a ```` ```bash ```` block of one command
    The command starts a server (`pegmask serve --port 8000`): it is started in the background
    on a free loopback port (its `--port` value rewritten, or `--port` added), and its /health
    is awaited before the blocks after it run.
``<!-- runnable: client -->`` before a ```` ```python ```` (or ```` ```bash ````) block
    Run as above, against the server of the nearest server block before it in the same file:
    `8000` in `127.0.0.1:8000` or `localhost:8000` is rewritten to that server's port. Python
    client blocks share the file's namespace with its other runnable Python blocks.

Unmarked blocks are not run (commands that need other installs, long benchmarks). A comment
that starts like a marker but is none of them, or a marker not directly before a python / bash
fence, is an error.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MARKERS = {"<!-- runnable -->": "run", "<!-- runnable: server -->": "server",
           "<!-- runnable: client -->": "client"}
LANGUAGES = {"python": "python", "py": "python", "bash": "bash", "sh": "bash"}
_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`]*)$")
_URL_PORT = re.compile(r"(?<=127\.0\.0\.1:)8000\b|(?<=localhost:)8000\b")
_PORT_OPTION = re.compile(r"--port(?:=|\s+)\d+")
# A line of the runner's protocol on its stdout (whatever else a block or a library prints).
REPLY_PREFIX = "\x00pegmask-docs-reply\x00"


class MarkerError(ValueError):
    """A marker that is not one of MARKERS, or not directly before a fence it can apply to."""


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # 1-based line of the block's first code line
    kind: str  # "run", "server" or "client"
    language: str  # "python" or "bash"
    code: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def runnable_blocks(path: Path) -> list[Block]:
    """The marked blocks of a markdown file, in order."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        stripped = lines[i].strip()
        if stripped.startswith("<!--") and "runnable" in stripped:
            if stripped not in MARKERS:
                raise MarkerError(f"{path.name}:{i + 1}: unknown marker {stripped!r}; "
                                  f"one of {sorted(MARKERS)}")
            fence = _FENCE.match(lines[i + 1]) if i + 1 < len(lines) else None
            if fence is None:
                raise MarkerError(f"{path.name}:{i + 1}: {stripped} is not directly before a "
                                  "fenced code block")
            language = LANGUAGES.get(fence["info"].strip().split(" ")[0].lower())
            kind = MARKERS[stripped]
            if language is None or (kind == "server" and language != "bash"):
                raise MarkerError(f"{path.name}:{i + 1}: {stripped} before a "
                                  f"{fence['info'].strip() or 'plain'} block")
            indent, marks = fence["indent"], fence["fence"]
            body: list[str] = []
            j = i + 2
            while j < len(lines) and lines[j].strip() != marks:
                body.append(lines[j][len(indent):] if lines[j].startswith(indent) else
                            lines[j].lstrip())
                j += 1
            if j == len(lines):
                raise MarkerError(f"{path.name}:{i + 2}: the code block never closes")
            blocks.append(Block(path, i + 3, kind, language, "\n".join(body) + "\n"))
            i = j
        i += 1
    return blocks


def bash_commands(code: str) -> list[str]:
    """The commands of a bash block, one a line: a line ending in `\\` continues on the next,
    and so does one that leaves a quote open (a JSON body over several lines); blank lines and
    `#` comments are dropped."""
    commands: list[str] = []
    pending = ""
    for line in code.splitlines():
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        command = pending + line
        if not pending and (not command.strip() or command.strip().startswith("#")):
            continue
        try:
            shlex.split(command, comments=True)
        except ValueError:  # a quote still open
            pending = command + "\n"
            continue
        pending = ""
        commands.append(command.strip())
    if pending.strip():
        commands.append(pending.strip())
    return commands


def with_port(command: str, port: int) -> str:
    """A server command listening on `port` instead of the one it names."""
    if _PORT_OPTION.search(command):
        return _PORT_OPTION.sub(f"--port {port}", command, count=1)
    return f"{command} --port {port}"


def to_port(code: str, port: int) -> str:
    """Client code with its `127.0.0.1:8000` / `localhost:8000` URLs moved to `port`."""
    return _URL_PORT.sub(str(port), code)


# --------------------------------------------------------------------------- the runner process
def _close_engines(namespace: dict) -> None:
    """Close what a file's blocks started (engines: their decode loop and compile workers)."""
    for value in list(namespace.values()):
        if type(value).__name__ == "Engine" and callable(getattr(value, "close", None)):
            with contextlib.suppress(Exception):
                value.close()


def serve() -> None:
    """Read requests (JSON lines) from stdin and answer each on stdout after REPLY_PREFIX:
    `{"namespace", "where", "line", "code"}` runs `code` in that namespace (its line numbers
    those of the markdown file); `{"end": namespace}` closes and drops a namespace. Models and
    compiled grammars stay cached in this process across files: one model load for them all."""
    namespaces: dict[str, dict] = {}
    reply = sys.stdout
    for request_line in sys.stdin:
        request = json.loads(request_line)
        if "end" in request:
            _close_engines(namespaces.pop(request["end"], {}))
            answer: dict = {"ok": True}
        else:
            namespace = namespaces.setdefault(request["namespace"],
                                              {"__name__": "__main__"})
            output = io.StringIO()
            code = "\n" * (request["line"] - 1) + request["code"]
            try:
                with contextlib.redirect_stdout(output):
                    exec(compile(code, request["where"].rsplit(":", 1)[0], "exec"), namespace)
                answer = {"ok": True, "output": output.getvalue()}
            except BaseException:  # noqa: BLE001 - reported to the test, which fails
                answer = {"ok": False, "output": output.getvalue(),
                          "error": traceback.format_exc()}
        reply.write(REPLY_PREFIX + json.dumps(answer) + "\n")
        reply.flush()


if __name__ == "__main__":
    serve()
