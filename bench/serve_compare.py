"""pegmask against other OpenAI-compatible servers (vLLM, ...) in one invocation, under one
protocol, with a check that refuses to publish figures taken beside other work.

Why: a comparison assembled from separate runs (other days, another client, a machine shared
with other jobs) put pegmask at 2.7x vLLM's tokens/s where an independent client saw 0.84x
(issue 35). Here every server is driven by the same client in the same run, phases alternate
between servers, and the cores are watched for the whole run.

Protocol, per phase (one server, C clients, one mode): Chat Completions streamed with
`stream_options.include_usage`, `max_tokens` 128 with `ignore_eos`, temperature 0.7, no seed.
Each client sends one warm-up request (all clients together, not measured), then 2 measured
requests back to back; tokens/s is the output tokens the server reports over the measured wall
time; time to first token: the first streamed piece of text or of a call (its name or
arguments). Modes: plain text (`unconstrained`), and a tool call (`constrained`: the serve
bench's two tools, `tool_choice="required"`), where a request counts as valid when it holds at
least one call and every call names one of the tools with arguments that validate (jsonschema)
against that tool's schema. Prefill phases (`--prefill 560,2000`): one client sends fresh
prompts of about that many tokens (the same texts to every server, none seen before, so no
kept prefix skips them) with one output token, not streamed; their tokens/s are prompt tokens
(as the server counted them) over the measured wall time.

Servers: `pegmask serve` (started here), `--peer NAME=URL[,pid=PID]` (already running; its CPU
time is read from PID's process tree, without which its phases cannot be checked), and
`--peer-command NAME=COMMAND` (a shell command, `{port}` filled in, started here, waited for at
/v1/models and stopped at the end). Servers started here run one at a time: the others are
paused (SIGSTOP to their process tree, so they take no CPU and keep their warm state) and the
phases alternate, for each (clients, mode): pegmask, then each peer in order. `--blocks` starts
each server, runs all its phases and stops it before the next one starts (one server in memory
at a time; no alternation).

Load check: before the first server starts, the 1-minute load average must be at most 0.5.
Over each phase, the CPU time the machine spent outside the server under test (its process
tree) and this bench's process (/proc/stat's user + nice + system + steal, minus both) must
stay under 0.1 of a core. At each phase's start the load average is recorded beside an estimate
of what the bench's own processes add to it (their runnable threads, sampled every second and
averaged like the kernel's 1-minute figure); more than 1.0 above that estimate also fails (the
kernel samples every 5 s, so a tighter bound would fail idle machines by chance). Before the
first server starts and before each phase the bench waits, up to 5 minutes each
(`--settle-timeout`), for the load average to come within its bound: a job that has just ended
and the servers' own start-ups linger in it for minutes. A run that
fails says NOT PUBLISHABLE at the top of its report and exits 1, unless `--allow-load`.

Machine speed: the bench's own process reads working sets of 64, 256 and 1024 MiB before the
first server starts and after the last one has stopped and the machine is quiet again
(`reporting.memory_read_speed`, `wait_quiet`), and the
report states both, with a warning where the 256 MiB set (a small model's weights) read more
than 15% faster or slower by the end. On a VM the last-level cache is the host's, and the share
of it a run gets moves with other tenants: the same code's one-row step took 22.9 ms at one
hour and 30-34 at others of the same day, and two runs 25 minutes apart differed by 10% at 32
clients.

The first peer is the headline's (run it at its defaults); later peers form a second table, with
what their command changes against the first's.

    pegmask bench serve --compare [--peer NAME=URL[,pid=PID]]... [--peer-command NAME=CMD]...
        [--clients 1,8,32] [--modes unconstrained,constrained] [--max-tokens 128]
        [--prefill 560,2000] [--requests 2] [--blocks] [--settle-timeout 300] [--allow-load]
        [--out bench/results/serve.md]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from pegmask.bench import plots, reporting
from pegmask.bench.reporting import RESULTS_DIR, SETTLE_TIMEOUT_S, settle
from pegmask.bench.serve_bench import (
    MODES,
    QUESTIONS,
    TOOLS,
    Sample,
    milliseconds,
    quantile,
    request_body,
    stream_once,
)
from pegmask.bench.servers import free_port, server_command, stop, wait_ready
from pegmask.bench.vllm_check import calls_valid

MODE_NAMES = {"unconstrained": "plain text", "constrained": 'tool call, `tool_choice="required"`'}
CHAT_TOOLS = [{"type": "function", "function": tool} for tool in TOOLS]
START_LOAD_LIMIT = 0.5  # 1-minute load average before anything starts
PHASE_LOAD_MARGIN = 1.0  # above the bench's own estimate, at a phase's start
OTHER_CORES_LIMIT = 0.1  # cores used outside the server and the bench, averaged over a phase
READ_DRIFT_SET_MIB = 256  # the working set of a small model's weights (SmolLM2: 270 MB)
READ_DRIFT_LIMIT = 0.15  # its read speed's change from the run's start to its end, reported
TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


# --------------------------------------------------------------------------- /proc
def _stat(path: str) -> list[str] | None:
    """The fields of a /proc .../stat file after the command name (state first), None if the
    process or thread is gone."""
    try:
        with open(path) as handle:
            return handle.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def process_tree(root: int) -> list[int]:
    """`root` and its descendants, alive now."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := _stat(f"/proc/{entry}/stat")) is not None:
            children.setdefault(int(fields[1]), []).append(int(entry))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo += children.get(pid, [])
    return tree


def tree_cpu(root: int) -> float:
    """CPU seconds of a process tree: every member's own time and that of the children it
    reaped, so a process ending mid-phase keeps its share."""
    ticks = 0
    for pid in process_tree(root):
        if (fields := _stat(f"/proc/{pid}/stat")) is not None:
            ticks += sum(int(value) for value in fields[11:15])  # utime stime cutime cstime
    return ticks / TICK


def machine_cpu() -> float:
    """CPU seconds the machine spent on processes (user, nice, system) or lost to the
    hypervisor (steal), over all cores since boot."""
    with open("/proc/stat") as handle:
        values = [int(v) for v in handle.readline().split()[1:]]
    user, nice, system, steal = values[0], values[1], values[2], values[7]
    return (user + nice + system + steal) / TICK


def bench_cpu() -> float:
    """This process's CPU seconds (all its threads; not its children, the servers)."""
    times = os.times()
    return times.user + times.system


def wait_quiet(timeout_s: float) -> None:
    """Until a second goes by in which processes other than this one used less than
    OTHER_CORES_LIMIT of a core, or `timeout_s`. Why: stopped servers take seconds to exit and
    hand back gigabytes (vLLM's engine processes outlive its front end), and a memory probe
    taken meanwhile read 64 MiB at 3 GiB/s against 41 before the run."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        machine, own = machine_cpu(), bench_cpu()
        time.sleep(1.0)
        if machine_cpu() - machine - (bench_cpu() - own) < OTHER_CORES_LIMIT:
            return


def runnable_threads(pids: list[int]) -> int:
    """Threads of these processes that the kernel counts in the load average (state R or D)."""
    count = 0
    for pid in pids:
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for task in tasks:
            fields = _stat(f"/proc/{pid}/task/{task}/stat")
            count += fields is not None and fields[0] in ("R", "D")
    return count


class OwnLoad(threading.Thread):
    """What the bench's own processes add to the 1-minute load average: every second, their
    runnable threads, folded in with the kernel's decay (e^(-1/60) a second). The sampling
    thread leaves itself out of the count."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.estimate = 0.0
        self.roots: list[int] = []  # servers started here, and a peer's pid while under test
        self._done = threading.Event()

    def run(self) -> None:
        decay = math.exp(-1 / 60)
        while not self._done.wait(1.0):
            pids = [os.getpid()] + [p for root in list(self.roots) for p in process_tree(root)]
            count = max(0, runnable_threads(pids) - 1)
            self.estimate = self.estimate * decay + count * (1 - decay)

    def stop(self) -> None:
        self._done.set()


# --------------------------------------------------------------------------- servers
@dataclass
class Server:
    """One server of the comparison: started here (`command`, a list for pegmask, a shell
    string for a peer) or already running at `url` (`pid`: its process, to read its CPU)."""

    name: str
    command: list[str] | str | None = None
    url: str = ""
    pid: int | None = None
    model: str = ""
    label: str = ""  # how the report names what ran, when not the command itself
    process: subprocess.Popen[bytes] | None = None
    log: Path | None = None

    @property
    def started_here(self) -> bool:
        return self.command is not None

    def describe(self) -> str:
        if self.label or isinstance(self.command, str):
            return self.label or str(self.command)
        return self.url + (f" (pid {self.pid})" if self.pid else " (pid unknown)")

    def start(self, logs: Path, timeout: float) -> None:
        """Start it in a session of its own (so its whole tree can be paused and stopped) and
        wait for its /v1/models; a peer already running is only waited for."""
        if self.started_here:
            port = free_port()
            self.url = f"http://127.0.0.1:{port}"
            command = (self.command.replace("{port}", str(port))
                       if isinstance(self.command, str) else self.command + [])
            if isinstance(self.command, list):
                command[command.index("--port") + 1] = str(port)
            self.log = logs / f"{self.name}.log"
            self.process = subprocess.Popen(
                command, shell=isinstance(command, str), stdout=self.log.open("wb"),
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
            self.pid = self.process.pid
        try:
            self.model = wait_ready(self.url, self.process, timeout)
        except RuntimeError as exc:
            tail = self.log.read_text(errors="replace")[-3000:] if self.log else ""
            self.stop()
            raise RuntimeError(f"{self.name}: {exc}\n{tail}") from exc

    def signal(self, number: int) -> None:
        """Send a signal to every process of the tree (only a server started here)."""
        if self.process is not None and self.process.poll() is None:
            for pid in process_tree(self.process.pid):
                try:
                    os.kill(pid, number)
                except ProcessLookupError:
                    pass

    def stop(self) -> None:
        """Resume and terminate its whole session (what outlived its first process as well);
        killed after a minute."""
        if self.process is not None:
            stop(self.process, group=True)

    def cpu(self) -> float | None:
        return tree_cpu(self.pid) if self.pid else None


def parse_peers(urls: list[str], commands: list[str]) -> list[Server]:
    """`NAME=URL[,pid=PID]` and `NAME=COMMAND` options as servers, in the order given (urls
    first)."""
    peers = []
    for option in urls:
        name, _, rest = option.partition("=")
        url, _, pid = rest.partition(",pid=")
        peers.append(Server(name, url=url.rstrip("/"), pid=int(pid) if pid else None))
    for option in commands:
        name, _, command = option.partition("=")
        peers.append(Server(name, command=command))
    for peer in peers:
        if not peer.name or not (peer.url or peer.command) or peer.name == "pegmask":
            raise ValueError(f"a peer is NAME=URL or NAME=COMMAND, NAME not pegmask: {peer}")
    return peers


# --------------------------------------------------------------------------- phases
@dataclass
class Phase:
    """One server's phase: what its clients measured and what the machine did meanwhile."""

    server: str
    clients: int
    mode: str
    samples: list[Sample]
    wall_s: float
    load_average: float
    own_load: float
    elapsed_s: float = 0.0  # the whole phase, warm-up included: the span of the CPU figures
    server_cpu_s: float | None = None
    bench_cpu_s: float = 0.0
    other_cpu_s: float | None = None

    @property
    def other_cores(self) -> float | None:
        if self.other_cpu_s is None or not self.elapsed_s:
            return None
        return self.other_cpu_s / self.elapsed_s

    def summary(self) -> dict[str, Any]:
        done = [s for s in self.samples if s.error is None]
        tokens = sum(s.tokens for s in done)
        return {
            "server": self.server, "clients": self.clients, "mode": self.mode,
            "requests": len(self.samples), "errors": len(self.samples) - len(done),
            "error_examples": sorted({s.error for s in self.samples if s.error})[:3],
            "tokens": tokens, "wall_s": self.wall_s,
            "tokens_per_s": tokens / self.wall_s if self.wall_s else 0.0,
            "ttft_p50_s": quantile([s.ttft for s in done if s.ttft is not None], 0.5),
            "valid": sum(1 for s in done if request_valid(s)),
            "load_average": self.load_average, "own_load": self.own_load,
            "elapsed_s": self.elapsed_s, "server_cpu_s": self.server_cpu_s,
            "bench_cpu_s": self.bench_cpu_s, "other_cpu_s": self.other_cpu_s,
            "other_cores": self.other_cores,
        }


def request_valid(sample: Sample) -> bool:
    """At least one call, and every call names a tool and has arguments valid for it."""
    return calls_valid([{"name": name, "arguments": arguments} for name, arguments
                        in zip(sample.names, sample.arguments, strict=True)], CHAT_TOOLS)


PREFILL = "prefill-"  # a prefill phase's mode: PREFILL + the prompt's size in tokens
PREFILL_WORDS = ("river", "mountain", "paper", "window", "orange", "violet", "silver", "table",
                 "engine", "garden", "lantern", "harbor")


def prefill_text(size: int, number: int) -> str:
    """A prompt of about `size` tokens that no server has seen before in this run (a kept
    prefix would skip its prefill), the same for every server: words with numbers, drawn
    from a generator seeded by the size and the request's number."""
    draw = random.Random(size * 1000 + number)
    return " ".join(f"{draw.choice(PREFILL_WORDS)}{draw.randint(0, 99)}"
                    for _ in range(size * 10 // 29))


async def prefill_once(client: httpx.AsyncClient, model: str, size: int,
                       number: int) -> Sample:
    """One prompt, one output token, not streamed: the sample's tokens are its prompt's."""
    body = {"model": model, "messages": [{"role": "user", "content": prefill_text(size, number)}],
            "max_tokens": 1, "temperature": 0}
    sample = Sample("chat", time.perf_counter())
    try:
        response = await client.post("/v1/chat/completions", json=body)
        response.raise_for_status()
        sample.tokens = int(response.json()["usage"]["prompt_tokens"])
    except (httpx.HTTPError, KeyError, ValueError) as exc:
        sample.error = f"{type(exc).__name__}: {exc}"[:200]
    sample.ended = time.perf_counter()
    sample.piece_times.append(sample.ended)
    return sample


async def drive(url: str, model: str, mode: str, clients: int, requests: int,
                max_tokens: int, temperature: float) -> tuple[list[Sample], float]:
    """The protocol: every client one warm-up request (together), then `requests` each, back
    to back; (the measured samples, their wall time). A prefill phase's requests are fresh
    prompts with one output token, so its tokens/s are prompt tokens/s."""
    sampling = {"temperature": temperature, "ignore_eos": True}
    limits = httpx.Limits(max_connections=clients + 4)
    async with httpx.AsyncClient(base_url=url, timeout=None, limits=limits) as client:

        async def send(index: int, number: int) -> Sample:
            if mode.startswith(PREFILL):
                return await prefill_once(client, model, int(mode[len(PREFILL):]),
                                          index * (requests + 1) + number)
            question = QUESTIONS[(index + number) % len(QUESTIONS)]
            path, body = request_body("chat", question, mode, max_tokens, model, None, sampling)
            return await stream_once(client, "chat", path, body)

        async def measured(index: int) -> list[Sample]:
            return [await send(index, number) for number in range(1, requests + 1)]

        await asyncio.gather(*(send(index, 0) for index in range(clients)))
        start = time.perf_counter()
        per_client = await asyncio.gather(*(measured(index) for index in range(clients)))
        wall = time.perf_counter() - start
    return [sample for samples in per_client for sample in samples], wall


def run_phase(server: Server, clients: int, mode: str, args: argparse.Namespace,
              own: OwnLoad) -> Phase:
    """One phase, with the machine's CPU split into the server's, the bench's and the rest."""
    load_average = settle(lambda: own.estimate + PHASE_LOAD_MARGIN, args.settle_timeout)
    own_load = own.estimate
    before = (time.perf_counter(), machine_cpu(), server.cpu(), bench_cpu())
    samples, wall = asyncio.run(drive(server.url, server.model, mode, clients, args.requests,
                                      args.max_tokens, args.temperature))
    after = (time.perf_counter(), machine_cpu(), server.cpu(), bench_cpu())
    phase = Phase(server.name, clients, mode, samples, wall, load_average, own_load,
                  elapsed_s=after[0] - before[0], bench_cpu_s=after[3] - before[3])
    if before[2] is not None and after[2] is not None:
        phase.server_cpu_s = after[2] - before[2]
        phase.other_cpu_s = max(0.0, after[1] - before[1] - phase.server_cpu_s
                                - phase.bench_cpu_s)
    return phase


def run_all(servers: list[Server], plan: list[tuple[int, str]], args: argparse.Namespace,
            own: OwnLoad, logs: Path) -> list[Phase]:
    """Every phase of every server: alternating (the others paused) or in blocks."""
    from tqdm import tqdm

    phases: list[Phase] = []
    with tqdm(total=len(servers) * len(plan), desc="phases", file=sys.stderr) as progress:

        def one(server: Server, clients: int, mode: str) -> None:
            if server.pid and not server.started_here:
                own.roots.append(server.pid)
            phases.append(run_phase(server, clients, mode, args, own))
            if server.pid and not server.started_here:
                own.roots.remove(server.pid)
            progress.set_postfix_str(f"{server.name} {clients} {mode}")
            progress.update(1)

        if args.blocks:
            for server in servers:
                start(server, logs, args.ready_timeout, own)
                for clients, mode in plan:
                    one(server, clients, mode)
                server.stop()
            return phases
        for server in servers:
            start(server, logs, args.ready_timeout, own)
            server.signal(signal.SIGSTOP)
        for clients, mode in plan:
            for server in servers:
                server.signal(signal.SIGCONT)
                one(server, clients, mode)
                server.signal(signal.SIGSTOP)
    return phases


def start(server: Server, logs: Path, timeout: float, own: OwnLoad) -> None:
    print(f"starting {server.name}: {server.describe()}", file=sys.stderr)
    server.start(logs, timeout)
    if server.process is not None:
        own.roots.append(server.process.pid)


# --------------------------------------------------------------------------- the verdict
def verdict(start_load: float, phases: list[Phase]) -> list[str]:
    """Why the figures cannot be published (nothing when they can)."""
    reasons = []
    if start_load > START_LOAD_LIMIT:
        reasons.append(f"the 1-minute load average was {start_load:.2f} before any server "
                       f"started (limit {START_LOAD_LIMIT})")
    for phase in phases:
        where = f"{phase.server}, {phase.clients} clients, {phase.mode}"
        if phase.other_cores is None:
            reasons.append(f"{where}: the server's CPU time is unknown (give its pid)")
        elif phase.other_cores > OTHER_CORES_LIMIT:
            reasons.append(f"{where}: other processes used {phase.other_cores:.2f} of a core "
                           f"(limit {OTHER_CORES_LIMIT})")
        if phase.load_average > phase.own_load + PHASE_LOAD_MARGIN:
            reasons.append(f"{where}: load average {phase.load_average:.2f} at the start, "
                           f"the bench's own about {phase.own_load:.2f}")
    return reasons


# --------------------------------------------------------------------------- report
def _figures(rows: list[dict[str, Any]], server: str, mode: str,
             clients: list[int]) -> tuple[list[float], int, int]:
    """(tokens/s per client count, valid requests, requests) of one server and mode."""
    cells = [next(r for r in rows if (r["server"], r["mode"], r["clients"]) == (server, mode, c))
             for c in clients]
    return ([r["tokens_per_s"] for r in cells], sum(r["valid"] for r in cells),
            sum(r["requests"] for r in cells))


def _cell(rows: list[dict[str, Any]], server: str, mode: str, clients: list[int]) -> str:
    speeds, good, total = _figures(rows, server, mode, clients)
    text = " / ".join(f"{s:.0f}" for s in speeds)
    if mode == "constrained":
        text += (f" (every call valid, {good}/{total})" if good == total else
                 f" (no valid call, 0/{total})" if good == 0 else f" (valid {good}/{total})")
    return text


def _table(rows: list[dict[str, Any]], names: list[str], modes: list[str],
           clients: list[int]) -> list[str]:
    counts = " / ".join(map(str, clients))
    lines = [f"| tokens/s at {counts} clients | " + " | ".join(MODE_NAMES[m] for m in modes)
             + " |", "|---|" + "---|" * len(modes)]
    lines += [f"| {name} | " + " | ".join(_cell(rows, name, m, clients) for m in modes) + " |"
              for name in names]
    return lines


def _program(command: str) -> str:
    """A shell command's program: its first word that is not an environment assignment."""
    return next((word for word in shlex.split(command) if "=" not in word), "")


def _same_engine(peer: Server, first: Server) -> bool:
    """Whether `peer` runs `first`'s program (a reconfigured copy of it, not another engine)."""
    if not isinstance(peer.command, str) or not isinstance(first.command, str):
        return False
    return _program(peer.command) == _program(first.command)


def _changes(peer: Server, first: Server) -> str:
    """What a peer's command adds to the first peer's (the one at its defaults)."""
    if not isinstance(peer.command, str) or not isinstance(first.command, str):
        return peer.describe()
    base = set(shlex.split(first.command))
    added = [token for token in shlex.split(peer.command) if token not in base]
    return shlex.join(added) if added else "nothing"


def report(phases: list[Phase], servers: list[Server], reasons: list[str],
           meta: dict[str, Any], clients: list[int], modes: list[str]) -> str:
    rows = [p.summary() for p in phases]
    names = [s.name for s in servers]
    peers = servers[1:]
    lines = ["# Serving: pegmask against its peers, one invocation", ""]
    if reasons:
        lines += ["**NOT PUBLISHABLE**: other work shared the machine (or could not be told "
                  "apart) while this ran:", ""] + [f"- {r}" for r in reasons[:12]]
        if len(reasons) > 12:
            lines.append(f"- and {len(reasons) - 12} more (see the JSON)")
        lines.append("")
    facts = meta["machine"]
    lines += [
        f"{facts['date']}; {facts['usable_cores']} usable cores, {facts['cpu']}, "
        f"{facts['system']}; pegmask {facts['checkout']}. Load average before any server "
        f"started: {meta['start_load']:.2f}.", "",
        *_read_speed_lines(meta["read_speed"], facts.get("last_level_cache")),
        f"Command: `{meta['command']}`", "",
        f"Protocol: Chat Completions streamed with `stream_options.include_usage`, max_tokens "
        f"{meta['max_tokens']} with `ignore_eos`, temperature {meta['temperature']}; per "
        f"client one warm-up request (all clients together, not measured), then "
        f"{meta['requests']} measured back to back; tokens/s: the output tokens the servers "
        "report over the measured wall time. A tool-call request is valid when it holds a call "
        "and every call names one of the two tools with arguments valid under its schema. "
        + ("Phases alternated: for each client count and mode, every server in turn, the "
           "others paused (SIGSTOP)." if not meta["blocks"] else
           "Servers ran one after the other (`--blocks`), each started before its phases "
           "and stopped after them."), "",
        "| server | what ran | model |", "|---|---|---|",
    ]
    lines += [f"| {s.name} | `{s.describe()}` | `{s.model}` |" for s in servers]
    # The headline: each other engine at its defaults (the first peer, and every later one
    # that runs another program); the rest are the first peer's engine reconfigured.
    engines = [p for k, p in enumerate(peers) if k == 0 or not _same_engine(p, peers[0])]
    variants = [p for p in peers if p not in engines]
    lines += ["", "## " + (f"Headline: pegmask and {', '.join(p.name for p in engines)} (each "
                           "run at its defaults but for what its command above sets)"
                           if peers else "pegmask"), ""]
    lines += _table(rows, ["pegmask"] + [p.name for p in engines], modes, clients)
    if variants:
        lines += ["", f"## Equalized: {', '.join(p.name for p in variants)}", "",
                  f"What each command changes against {peers[0].name}'s:", ""]
        lines += [f"- {p.name}: `{_changes(p, peers[0])}`" for p in variants]
        lines += [""] + _table(rows, ["pegmask"] + [p.name for p in variants], modes, clients)
    if peers:
        lines += ["", "Ratios, pegmask / peer (tokens/s):", "",
                  f"| pegmask / | {' | '.join(MODE_NAMES[m] for m in modes)} |",
                  "|---|" + "---|" * len(modes)]
        for peer in peers:
            cells = []
            for mode in modes:
                ours, theirs = (_figures(rows, n, mode, clients)[0] for n in ("pegmask",
                                                                              peer.name))
                cells.append(" / ".join(f"{a / b:.2f}x" if b else "-"
                                        for a, b in zip(ours, theirs, strict=True)))
            lines.append(f"| {peer.name} | " + " | ".join(cells) + " |")
    prefill = sorted({r["mode"] for r in rows if r["mode"].startswith(PREFILL)},
                     key=lambda m: int(m[len(PREFILL):]))
    if prefill:
        lines += _prefill_lines(rows, names, prefill)
    ttft_clients = 8 if 8 in clients else max(clients)
    lines += ["", f"Time to first token, p50 at {ttft_clients} clients:", "",
              "| server | " + " | ".join(MODE_NAMES[m] for m in modes) + " |",
              "|---|" + "---|" * len(modes)]
    for name in names:
        cells = [milliseconds(next(r["ttft_p50_s"] for r in rows if (r["server"], r["mode"],
                                   r["clients"]) == (name, m, ttft_clients))) for m in modes]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "## The machine during each phase", "",
              "CPU seconds over the whole phase (warm-up included) of the server's process "
              "tree, of the bench's process, and of everything else (as a share of one core; "
              f"limit {OTHER_CORES_LIMIT}); the 1-minute load average at the phase's start "
              "beside the bench's own share of it (estimated).", "",
              "| server | clients | mode | requests | errors | output tokens | tokens/s | "
              "phase s | server CPU s | bench CPU s | other, cores | load avg (own) |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        server_cpu = "?" if r["server_cpu_s"] is None else f"{r['server_cpu_s']:.1f}"
        other = "?" if r["other_cores"] is None else f"{r['other_cores']:.3f}"
        lines.append(
            f"| {r['server']} | {r['clients']} | {r['mode']} | {r['requests']} | "
            f"{r['errors']} | {r['tokens']} | {r['tokens_per_s']:.1f} | {r['elapsed_s']:.1f} | "
            f"{server_cpu} | {r['bench_cpu_s']:.1f} | {other} | "
            f"{r['load_average']:.2f} ({r['own_load']:.2f}) |")
    errors = sorted({e for r in rows for e in r["error_examples"]})
    if errors:
        lines += ["", "Errors seen: " + "; ".join(errors[:6])]
    return "\n".join(lines) + "\n"


def _prefill_lines(rows: list[dict[str, Any]], names: list[str],
                   modes: list[str]) -> list[str]:
    """The prefill phases: prompt tokens/s per server and prompt size, and pegmask's ratio."""
    def cell(name: str, mode: str) -> dict[str, Any]:
        return next(r for r in rows if (r["server"], r["mode"]) == (name, mode))

    sizes = [m[len(PREFILL):] for m in modes]
    lines = ["", f"Prefill, one request at a time (fresh prompts of about {' / '.join(sizes)} "
             "tokens, one output token; prompt tokens/s over the measured wall time, as the "
             "server counted the prompt):", "",
             "| server | " + " | ".join(f"~{size} tokens" for size in sizes) + " |",
             "|---|" + "---|" * len(modes)]
    for name in names:
        cells = []
        for mode in modes:
            row, ours = cell(name, mode), cell("pegmask", mode)
            text = (f"{row['tokens_per_s']:.0f} ({row['tokens'] // max(1, row['requests'])} "
                    "tokens)")
            if name != "pegmask" and row["tokens_per_s"]:
                text += f", pegmask {ours['tokens_per_s'] / row['tokens_per_s']:.2f}x"
            cells.append(text if not row["errors"] else text + f", {row['errors']} errors")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def _read_speed_lines(speeds: dict[str, dict[int, float]], cache: str | None) -> list[str]:
    """The machine's memory speed at the run's start and end (`reporting.memory_read_speed`),
    and a warning where the model-sized working set read at another speed by the end."""
    before, after = speeds["before"], speeds["after"]
    lines = [f"Memory read speed: {reporting.describe_read_speed(before)} before the first "
             f"server started, {reporting.describe_read_speed(after)} after the last stopped "
             f"(the last-level cache, {cache or 'of unknown size'}, is the host's: what it "
             "holds of a model moves with other tenants, and so do runs' figures; compare "
             "runs by these).", ""]
    if READ_DRIFT_SET_MIB in before and READ_DRIFT_SET_MIB in after:
        change = after[READ_DRIFT_SET_MIB] / before[READ_DRIFT_SET_MIB] - 1
        if abs(change) > READ_DRIFT_LIMIT:
            lines += [f"**The machine's speed moved during the run**: {READ_DRIFT_SET_MIB} MiB "
                      f"read {change:+.0%} by the end; phases alternate, but a server measured "
                      "nearer one end saw another machine.", ""]
    return lines


def plot(rows: list[dict[str, Any]], names: list[str], modes: list[str], out: Path) -> Path:
    """Tokens/s against clients, a panel per mode, a line per server."""
    panels = {f"clients, {MODE_NAMES[m].split(',')[0]}": {
        name: points for name in names
        if (points := [(r["clients"], r["tokens_per_s"]) for r in rows
                       if r["server"] == name and r["mode"] == m and r["tokens_per_s"] > 0])}
        for m in modes}
    return plots.scaling(panels, title="Output tokens/s, all clients (same run)",
                         ylabel="tokens/s", out=out)


# --------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="pegmask bench serve --compare",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--peer", action="append", default=[], metavar="NAME=URL[,pid=PID]",
                        help="a server already running (pid: its process, for its CPU time)")
    parser.add_argument("--peer-command", action="append", default=[], metavar="NAME=COMMAND",
                        help="a shell command starting a server on {port} (env vars allowed)")
    parser.add_argument("--model", help="model for the pegmask server (default: embedded)")
    parser.add_argument("--server-arg", action="append", default=[],
                        help="extra argument for `pegmask serve` (repeatable)")
    parser.add_argument("--clients", default="1,8,32")
    parser.add_argument("--modes", default="unconstrained,constrained")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--requests", type=int, default=2, help="measured requests per client")
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--prefill", default="560,2000",
                        help="prompt sizes (tokens) of the prefill phases, one client each "
                             "('' for none)")
    parser.add_argument("--blocks", action="store_true",
                        help="each server started, measured and stopped in turn (no pausing)")
    parser.add_argument("--ready-timeout", type=float, default=1800.0,
                        help="seconds a started server may take to answer /v1/models")
    parser.add_argument("--settle-timeout", type=float, default=SETTLE_TIMEOUT_S,
                        help="longest wait, before the first server starts and before each "
                             "phase, for the load average to come down (seconds; default 300)")
    parser.add_argument("--allow-load", action="store_true",
                        help="exit 0 even when the load check fails (the report still says so)")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "serve.md")
    args = parser.parse_args(argv)
    clients = [int(c) for c in args.clients.split(",")]
    modes = [m for m in args.modes.split(",") if m]
    if not modes or set(modes) - set(MODES):
        parser.error(f"--modes takes {', '.join(MODES)}")
    try:
        peers = parse_peers(args.peer, args.peer_command)
    except ValueError as exc:
        parser.error(str(exc))
    extra = args.server_arg + (["--model", args.model] if args.model else [])
    pegmask = Server("pegmask", command=server_command(args.model, 0, args.server_arg),
                     label=shlex.join(["pegmask", "serve", *extra]))
    servers = [pegmask, *peers]
    plan = [(c, m) for c in clients for m in modes]
    plan += [(1, f"{PREFILL}{int(size)}") for size in args.prefill.split(",") if size]

    start_load = settle(lambda: START_LOAD_LIMIT, args.settle_timeout)
    wait_quiet(args.settle_timeout)
    read_before = reporting.memory_read_speed()
    own = OwnLoad()
    own.start()
    logs = Path(tempfile.mkdtemp(prefix="pegmask-serve-compare-"))
    try:
        phases = run_all(servers, plan, args, own, logs)
    finally:
        own.stop()
        for server in servers:
            server.stop()
    wait_quiet(args.settle_timeout)
    read_after = reporting.memory_read_speed()
    reasons = verdict(start_load, phases)
    meta = {"machine": reporting.machine(), "start_load": start_load,
            "read_speed": {"before": read_before, "after": read_after},
            "command": reporting.command_line("serve", ["--compare", *argv]),
            "max_tokens": args.max_tokens, "temperature": args.temperature,
            "requests": args.requests, "blocks": args.blocks, "logs": str(logs),
            "servers": [{"name": s.name, "what": s.describe(), "model": s.model}
                        for s in servers]}
    reporting.publish(report(phases, servers, reasons, meta, clients, modes), args.out)
    rows = [p.summary() for p in phases]
    reporting.write_json({"meta": meta, "publishable": not reasons, "reasons": reasons,
                          "phases": rows}, args.out.with_suffix(".json"))
    plot(rows, [s.name for s in servers], modes, args.out.with_suffix(".png"))
    if reasons and not args.allow_load:
        print(f"NOT PUBLISHABLE ({len(reasons)} reasons; --allow-load to accept)",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
