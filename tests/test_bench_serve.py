"""`pegmask bench serve` end to end, tiny: a pegmask server in a subprocess, streaming clients
through two APIs, constrained and not; the report's figures are consistent. Its comparison mode
(`--compare`): pegmask against itself as a peer, the load check refusing a busy machine, and the
report's layout and verdict from made-up phases."""

from __future__ import annotations

import asyncio
import json
import shlex
import subprocess
import sys
from pathlib import Path

import httpx

from pegmask.bench import reporting
from pegmask.bench.reporting import settle
from pegmask.bench.serve_bench import Sample, _events
from pegmask.bench.serve_compare import (
    Phase,
    Server,
    _changes,
    parse_peers,
    report,
    verdict,
)
from pegmask.cli import main as cli


def test_serve_bench_smoke(tmp_path: Path) -> None:
    out = tmp_path / "serve.md"
    assert cli(["bench", "serve", "--clients", "1,2", "--requests", "2", "--max-tokens", "32",
                "--apis", "chat,messages", "--no-probe", "--out", str(out)]) == 0
    data = json.loads(out.with_suffix(".json").read_text())
    phases = {(p["clients"], p["mode"]): p for p in data["phases"]}
    assert set(phases) == {(c, m) for c in (1, 2) for m in ("constrained", "unconstrained")}
    for phase in phases.values():
        assert phase["errors"] == 0 and phase["requests"] == 2
        assert phase["tokens"] > 0 and phase["tokens_per_s"] > 0
        assert phase["ttft_p50_s"] is not None
    for clients in (1, 2):
        constrained = phases[(clients, "constrained")]
        # Every constrained answer holds a call whose arguments are a JSON object.
        assert constrained["with_calls"] == constrained["calls_valid"] == 2
    assert "| clients | mode |" in out.read_text()
    assert out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"


def _compare(tmp_path: Path, *options: str) -> tuple[int, dict, str]:
    out = tmp_path / "serve.md"
    code = cli(["bench", "serve", "--compare", "--clients", "1", "--requests", "1",
                "--settle-timeout", "0", "--out", str(out), *options])
    return code, json.loads(out.with_suffix(".json").read_text()), out.read_text()


def test_serve_compare_against_pegmask_as_peer(tmp_path: Path) -> None:
    """Two servers started by the bench, alternating (one paused while the other runs): the
    figures, the CPU accounting and the report's tables."""
    peer = (f"{shlex.quote(sys.executable)} -m pegmask.cli serve --host 127.0.0.1 "
            "--port {port} --log-level warning")
    code, data, text = _compare(tmp_path, "--peer-command", f"twin={peer}",
                                "--max-tokens", "24", "--prefill", "120", "--allow-load")
    assert code == 0
    rows = {(p["server"], p["mode"]): p for p in data["phases"]}
    assert set(rows) == {(s, m) for s in ("pegmask", "twin")
                         for m in ("constrained", "unconstrained", "prefill-120")}
    for row in rows.values():
        assert row["errors"] == 0 and row["requests"] == 1 and row["tokens"] > 0
        # The server's process tree did the decoding: its CPU time is measured.
        assert row["server_cpu_s"] > 0 and row["other_cpu_s"] is not None
    assert rows[("pegmask", "constrained")]["valid"] == rows[("twin", "constrained")]["valid"] == 1
    assert rows[("pegmask", "unconstrained")]["tokens"] == 24  # ignore_eos
    # a prefill phase counts the prompt's tokens (about the size asked), the same for both
    prompt = rows[("pegmask", "prefill-120")]["tokens"]
    assert 60 < prompt < 240 and rows[("twin", "prefill-120")]["tokens"] == prompt
    assert "Prefill, one request at a time (fresh prompts of about 120 tokens" in text
    assert f"({prompt} tokens), pegmask " in text
    assert data["publishable"] == (not data["reasons"])
    assert "| tokens/s at 1 clients | plain text | tool call" in text
    assert "| pegmask | " in text and "| twin | " in text and "every call valid, 1/1" in text
    assert "| pegmask / | plain text |" in text and "Time to first token, p50 at 1 clients" in text
    assert tmp_path.joinpath("serve.png").read_bytes()[:4] == b"\x89PNG"


def test_serve_compare_refuses_a_busy_machine(tmp_path: Path) -> None:
    """A process spinning beside the phase: NOT PUBLISHABLE at the top and exit 1 (servers
    started in blocks, the other way to run them)."""
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        code, data, text = _compare(tmp_path, "--modes", "unconstrained", "--max-tokens", "8",
                                    "--prefill", "", "--blocks")
    finally:
        busy.kill()
        busy.wait()
    assert code == 1 and not data["publishable"]
    assert text.startswith("# Serving: pegmask against its peers, one invocation\n\n"
                           "**NOT PUBLISHABLE**")
    assert any("other processes used" in reason for reason in data["reasons"])
    assert "Servers ran one after the other (`--blocks`)" in text


def test_serve_compare_waits_for_start_ups_to_leave_the_load_average(monkeypatch) -> None:
    """Before the first server and before each phase: until the load average is within its
    bound, and no longer than the timeout."""
    sleeps: list[float] = []
    with monkeypatch.context() as patch:
        loads = iter([2.9, 2.0, 1.4, 1.0, 0.6])
        patch.setattr("os.getloadavg", lambda: (next(loads), 0.0, 0.0))
        patch.setattr("time.sleep", sleeps.append)
        settle(lambda: 1.3, timeout_s=60)
    assert len(sleeps) == 3  # 2.9, 2.0 and 1.4 are above 1.3
    sleeps.clear()
    with monkeypatch.context() as patch:
        clock = iter([0.0, 10.0, 20.0, 30.0])
        patch.setattr("os.getloadavg", lambda: (5.0, 0.0, 0.0))
        patch.setattr("time.sleep", sleeps.append)
        patch.setattr("time.monotonic", lambda: next(clock))
        settle(lambda: 1.3, timeout_s=30)
    assert len(sleeps) == 2  # gives up at 30 s


def test_serve_compare_verdict_and_tables() -> None:
    """The thresholds, and the issue's table layout with ratios, from made-up phases."""
    def phase(server: str, clients: int, mode: str, tokens: int, other: float) -> Phase:
        sample = Sample("chat", 0.0, piece_times=[0.5], tokens=tokens, ended=1.0,
                        names=["get_weather"], arguments=['{"city": "Paris"}'])
        return Phase(server, clients, mode, [sample], 1.0, 0.2, 0.1, elapsed_s=10.0,
                     server_cpu_s=15.0, bench_cpu_s=1.0, other_cpu_s=other)

    phases = [phase(s, c, m, t * c, 0.2) for c in (1, 8) for m in ("unconstrained",
              "constrained") for s, t in (("pegmask", 40), ("vllm", 20))]
    assert verdict(0.3, phases) == []
    phases[0].other_cpu_s = 5.0  # half a core
    phases[1].load_average = 3.0
    reasons = verdict(0.9, phases)
    assert len(reasons) == 3 and "load average was 0.90" in reasons[0]
    servers = [Server("pegmask", label="pegmask serve"),
               Server("vllm", command="vllm serve M --port {port}"),
               Server("vllm-fp32", command="X=1 vllm serve M --port {port} --dtype float32")]
    text = report(phases, servers[:2], reasons, {
        "machine": reporting.machine(()), "start_load": 0.9, "command": "c", "max_tokens": 128,
        "temperature": 0.7, "requests": 2, "blocks": False,
        "read_speed": {"before": {64: 47.0, 256: 21.0}, "after": {64: 45.0, 256: 16.0}}},
        [1, 8], ["unconstrained", "constrained"])
    assert "**NOT PUBLISHABLE**" in text.split("\n")[2]
    assert ("Memory read speed: 47 / 21 GiB/s at 64 / 256 MiB before the first server "
            "started, 45 / 16 GiB/s at 64 / 256 MiB after") in text
    assert "256 MiB read -24% by the end" in text
    assert "| pegmask | 40 / 320 | 40 / 320 (every call valid, 2/2) |" in text
    assert "| vllm | 20 / 160 | 20 / 160 (every call valid, 2/2) |" in text
    assert "| vllm | 2.00x / 2.00x | 2.00x / 2.00x |" in text
    assert _changes(servers[2], servers[1]) == "X=1 --dtype float32"
    # another engine (another program) joins the headline; a reconfigured first peer does not
    three = servers + [Server("llama.cpp", command="/x/llama-server -m F --port {port}")]
    more = phases + [phase(s, c, m, t * c, 0.2) for c in (1, 8)
                     for m in ("unconstrained", "constrained")
                     for s, t in (("vllm-fp32", 10), ("llama.cpp", 80))]
    text = report(more, [three[0], three[1], three[3], three[2]], [], {
        "machine": reporting.machine(()), "start_load": 0.1, "command": "c", "max_tokens": 128,
        "temperature": 0.7, "requests": 2, "blocks": False,
        "read_speed": {"before": {64: 47.0}, "after": {64: 47.0}}},
        [1, 8], ["unconstrained", "constrained"])
    headline, equalized = text.split("## Headline")[1].split("## Equalized: vllm-fp32")
    assert headline.startswith(": pegmask and vllm, llama.cpp")
    assert "| llama.cpp | 80 / 640 |" in headline and "| vllm-fp32 |" not in headline
    assert "- vllm-fp32: `X=1 --dtype float32`" in equalized
    assert "| llama.cpp | 0.50x / 0.50x |" in equalized  # the ratios list every peer
    url, command = parse_peers(["up=http://127.0.0.1:8000/,pid=12"], ["mine=serve {port}"])
    assert (url.url, url.pid, url.started_here) == ("http://127.0.0.1:8000", 12, False)
    assert (command.command, command.started_here) == ("serve {port}", True)


def test_memory_read_speed_is_measured_per_working_set() -> None:
    """Real reads: a speed per size, in the order asked. How the sizes' speeds compare is the
    machine's to say, not a test's: under another process's load a 4 MiB set read at 0.5 GiB/s
    and a 64 MiB one at 22 (one team's threads waiting on the other's at every tiny sum)."""
    speeds = reporting.memory_read_speed((4, 64))
    assert list(speeds) == [4, 64] and all(0 < speed < float("inf") for speed in speeds.values())
    cache = reporting.last_level_cache()
    assert cache is None or cache[0].isdigit()


def test_bench_client_reads_events_by_sse_lines() -> None:
    """Events split anywhere across chunks, with characters `str.splitlines` ends lines at
    inside their JSON (a peer may send them raw), and CR LF line ends, are read whole."""
    stream = ('data: {"text": "a\u2028b\x85c"}\r\n\r\n'
              'data: {"text": "d\u2029e"}\n\ndata: [DONE]\n\n').encode()

    async def chunks():
        for start in range(0, len(stream), 5):
            yield stream[start : start + 5]

    async def read() -> list[dict]:
        return [event async for event in _events(httpx.Response(200, content=chunks()))]

    assert asyncio.run(read()) == [{"text": "a\u2028b\x85c"}, {"text": "d\u2029e"}]
