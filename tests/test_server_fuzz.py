"""Hostile and heavy traffic against the real `pegmask serve`, started as deployed (a subprocess,
the embedded model, an 8 GiB address-space limit so that a runaway request cannot take the test
machine down).

The fuzzer draws request bodies for every POST route with hypothesis: random JSON and bytes,
and valid bodies mutated (wrong types, out-of-range and huge numbers, nested junk, unknown
fields, broken histories, bad tools / tool_choice / response_format). Generations stay short by
construction: an output budget is only ever replaced by an invalid one, never removed. Every
answer must be a 2xx or a 4xx in its API's error shape, never a 5xx (nor a server fault sent
inside a stream), and afterwards the server must be alive, healthy and within its memory bound.
The loop runs for `PEGMASK_FUZZ_SECONDS` (30 by default, for CI); a longer run finds more.

The slow test sends a corpus of pathological grammars (huge counts, deep nesting, huge enums,
`$ref` cycles, catastrophic patterns, 1,000 tools): each must be answered 2xx or 4xx within a
time bound and the memory bound; the server is restarted after an item that broke it, so that
one run reports every item.
"""

from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

ADDRESS_SPACE = 8 << 30  # RLIMIT_AS of the server process
MEMORY_BOUND_KIB = 4 << 20  # the server's peak RSS (VmHWM) may not pass 4 GiB
# Wall time of the fuzzing loop (server start-up excluded); longer runs find more.
FUZZ_BUDGET_S = float(os.environ.get("PEGMASK_FUZZ_SECONDS", "30"))
ITEM_TIME_BOUND_S = 60.0  # a pathological grammar is answered within this
STARTUP_S = 600.0
ROUTES = {"/v1/chat/completions": "openai", "/v1/completions": "openai",
          "/v1/responses": "openai", "/v1/messages": "anthropic",
          "/v1/messages/count_tokens": "anthropic"}


# --------------------------------------------------------------------------- the server process
@dataclass
class Served:
    """A `pegmask serve` subprocess on a free loopback port, its log in `log`."""

    log: Path
    process: subprocess.Popen[bytes] | None = None
    url: str = ""

    def start(self) -> None:
        port = _free_port()
        self.url = f"http://127.0.0.1:{port}"
        command = [sys.executable, "-m", "pegmask.cli", "serve", "--host", "127.0.0.1",
                   "--port", str(port), "--log-level", "warning", "--request-timeout", "30"]
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, preexec_fn=_limit_memory,
                env={**os.environ, "HF_HUB_OFFLINE": "1"})
        deadline = time.monotonic() + STARTUP_S
        while not self.healthy():
            if not self.alive() or time.monotonic() > deadline:
                raise RuntimeError(f"pegmask serve did not start:\n{self.log_tail()}")
            time.sleep(0.5)

    def stop(self) -> None:
        if self.process is not None and self.alive():
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def restart(self) -> None:
        self.stop()
        self.start()

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def healthy(self) -> bool:
        try:
            return httpx.get(f"{self.url}/health", timeout=10).status_code == 200
        except httpx.HTTPError:
            return False

    def memory_kib(self, field: str = "VmHWM") -> int:
        """A field of /proc/PID/status in KiB: VmRSS now, VmHWM the peak."""
        assert self.process is not None
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
        raise KeyError(field)

    def reset_peak(self) -> None:
        """Start VmHWM over from the current RSS (Linux: 5 to clear_refs)."""
        assert self.process is not None
        Path(f"/proc/{self.process.pid}/clear_refs").write_text("5")

    def log_tail(self, lines: int = 30) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    server = Served(tmp_path_factory.mktemp("serve") / "serve.log")
    server.start()
    try:
        yield server
    finally:
        server.stop()


# --------------------------------------------------------------------------- checking answers
def answer_problem(path: str, response: httpx.Response) -> str | None:
    """What is wrong with an answer (None: a 2xx, or a 4xx in the route's error shape)."""
    status = response.status_code
    if status >= 500:
        return f"{status}: {response.text[:500]}"
    if status >= 400:
        return _shape_problem(ROUTES[path], response)
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        faults = [data for data in _stream_errors(response.text) if _server_fault(data)]
        return f"a server fault in the stream: {faults[0][:500]}" if faults else None
    try:
        response.json()
    except ValueError:
        return f"{status} with a body that is not JSON: {response.text[:200]}"
    return None


def _shape_problem(style: str, response: httpx.Response) -> str | None:
    try:
        body = response.json()
    except ValueError:
        return f"{response.status_code} that is not JSON: {response.text[:200]}"
    if style == "anthropic":
        error = body.get("error") if isinstance(body, dict) else None
        valid = (body.get("type") == "error" and isinstance(error, dict)
                 and isinstance(error.get("type"), str) and _message(error))
    else:
        error = body.get("error") if isinstance(body, dict) else None
        valid = (isinstance(error, dict) and set(error) == {"message", "type", "param", "code"}
                 and isinstance(error["type"], str) and _message(error))
    return None if valid else f"{response.status_code} not in the {style} shape: {body}"


def _message(error: dict[str, Any]) -> bool:
    return isinstance(error.get("message"), str) and bool(error["message"])


def _stream_errors(text: str) -> list[str]:
    """The data of the error events of a server-sent event stream, in the three APIs' forms."""
    errors = []
    for block in text.split("\n\n"):
        name, data = None, ""
        for line in block.split("\n"):
            if line.startswith("event: "):
                name = line[len("event: "):]
            elif line.startswith("data: "):
                data = line[len("data: "):]
        if name == "error" or data.startswith('{"error"'):
            errors.append(data)
    return errors


def _server_fault(data: str) -> bool:
    """An error event that reports the server's own failure (a 5xx), not the request's."""
    payload = json.loads(data)
    error = payload.get("error", payload)
    return (error.get("type") in ("server_error", "api_error")
            or str(payload.get("code", "")).startswith("5"))


# --------------------------------------------------------------------------- the fuzzer's bodies
USER = [{"role": "user", "content": "hi"}]
BASES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"messages": USER, "max_tokens": 2},
    "/v1/completions": {"prompt": "Once upon a time", "max_tokens": 2},
    "/v1/responses": {"input": "hi", "max_output_tokens": 2},
    "/v1/messages": {"messages": USER, "max_tokens": 2},
    "/v1/messages/count_tokens": {"messages": USER},
}
# The output budgets: only ever replaced by an invalid value (never removed, never null, never
# large and valid), so that no drawn request decodes more than a few tokens.
BUDGETS = {"/v1/chat/completions": ("max_tokens", "max_completion_tokens"),
           "/v1/completions": ("max_tokens",), "/v1/responses": ("max_output_tokens",),
           "/v1/messages": ("max_tokens",)}
BAD_BUDGETS = [0, -1, 1.5, "2", True, [], {}, 8192, 8193, 10**12, 10**30, -(10**30)]
SAMPLING = ["temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids",
            "frequency_penalty", "presence_penalty", "repetition_penalty", "logit_bias",
            "ignore_eos", "min_tokens", "close_on_length", "stream", "model", "metadata", "user",
            "x_unknown_field"]
FIELDS: dict[str, list[str]] = {
    "/v1/chat/completions": [
        *SAMPLING, "messages", "n", "tools", "tool_choice", "parallel_tool_calls",
        "response_format", "grammar", "logprobs", "top_logprobs", "stream_options",
        "chat_template_kwargs", "reasoning_effort", "echo", "best_of", "suffix", "functions",
        "function_call", "prompt_logprobs"],
    "/v1/completions": [*SAMPLING, "prompt", "n", "response_format", "grammar", "logprobs",
                        "echo", "best_of", "suffix", "tools", "tool_choice", "stream_options"],
    "/v1/responses": [
        *SAMPLING, "input", "instructions", "tools", "tool_choice", "parallel_tool_calls",
        "text", "reasoning", "previous_response_id", "include", "top_logprobs", "store",
        "background", "truncation", "max_tool_calls"],
    "/v1/messages": [*SAMPLING, "messages", "system", "tools", "tool_choice", "thinking",
                     "stop_sequences", "output_config", "output_format", "container",
                     "mcp_servers"],
    "/v1/messages/count_tokens": ["messages", "system", "tools", "tool_choice", "thinking",
                                  "output_config", "model", "x_unknown_field"],
}

CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
CHAT_TOOL = {"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"a": {"type": "string"}}}}}
FLAT_TOOL = {"type": "function", "name": "f", "parameters": {"type": "object"}}
ANTHROPIC_TOOL = {"name": "f", "input_schema": {"type": "object"}}
USE = {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}


def _deep(levels: int, leaf: Any = 1) -> Any:
    value = leaf
    for _ in range(levels):
        value = [value]
    return value


def _deep_schema(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "array", "items": schema}
    return schema


# Numbers at the edges of int64, float32 and float64, for every numeric field.
NUMBERS = [0, -1, 1, 0.5, 1e-2, 2**63 - 1, 2**63, -(2**63) - 1, 2**64, 10**30, 10**400,
           1e-300, 1e-45, 1e39, 1e308, float("nan"), float("inf"), float("-inf")]
NUMERIC = ("temperature", "top_p", "top_k", "min_p", "seed", "frequency_penalty",
           "presence_penalty", "repetition_penalty", "min_tokens", "n", "logprobs",
           "top_logprobs")
CURATED: dict[str, list[Any]] = {
    **{name: NUMBERS for name in NUMERIC},
    "tools": [[0], [{}], [CHAT_TOOL, CHAT_TOOL], [FLAT_TOOL], [ANTHROPIC_TOOL], [CHAT_TOOL],
              [{"type": "function", "function": {"name": ""}}],
              [{"type": "function", "function": {"name": "f", "parameters": 5}}],
              [{"type": "function", "function": {"name": "f", "parameters": {"type": "x"}}}],
              [{"type": "web_search"}], [{"name": "f", "input_schema": 5}],
              [{"type": "function", "function": {"name": "f", "strict": 0}}]],
    "tool_choice": [0, [], True, "", "auto", "none", "required", "sometimes", {},
                    {"type": "function"}, {"type": "function", "function": {"name": 5}},
                    {"type": "function", "function": {"name": "f"}},
                    {"type": "function", "name": "f"}, {"type": "function", "name": "g"},
                    {"type": "tool", "name": "f"}, {"type": "tool"}, {"type": "any"},
                    {"type": "auto", "disable_parallel_tool_use": 0}, {"type": "none"}],
    "response_format": [
        {"type": "json_schema"}, {"type": "json_schema", "json_schema": {"schema": 5}},
        {"type": "json_schema", "json_schema": {"schema": {"type": "string", "maxLength": 3}}},
        {"type": "json_schema", "json_schema": {"schema": {"type": "nonsense"}}},
        {"type": "json_schema", "json_schema": {"schema": {}, "strict": "yes"}},
        {"type": "json_object"}, {"type": "text"}, {"type": "regex", "regex": "("},
        {"type": "regex", "regex": "[0-9]{2}"}, {"type": "regex", "regex": 5},
        {"type": "grammar", "grammar": 'root = "a"'}, {"type": "grammar", "grammar": "root ="},
        {"type": "choice", "choice": []}, {"type": "choice", "choice": ["a", "b"]},
        {"type": "xml"}],
    "grammar": ['root = "yes" | "no"', "root = (", 'root = "a"{2}', ""],
    "stop": [0, "", [""], ["a"] * 10, [1], "\n"],
    "n": [2, 32, 33, 10**9, *NUMBERS],
    "stream": [True],
    "logit_bias": [{"1": 100}, {"-1": 1}, {"x": 1}, {"1": 1e308}, {str(10**30): 1}],
    "stop_token_ids": [[0], [10**9], [-1], [0.5]],
    "messages": [
        [], "hi", [{"role": "tool", "content": "x"}], [{"role": "user"}],
        [*USER, {"role": "assistant", "content": None, "tool_calls": [CALL]},
         {"role": "tool", "tool_call_id": "call_2", "content": "x"}],
        [*USER, {"role": "assistant", "content": None, "tool_calls": [CALL]},
         {"role": "tool", "tool_call_id": "call_1", "content": "x"}],
        [*USER, {"role": "assistant", "tool_calls": [{"function": {"name": "f"}}]}],
        [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
        [{"role": "assistant", "content": "x"}], [{"role": "system", "content": "x"}],
        [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                                       "content": "x"}]}],
        [*USER, {"role": "assistant", "content": [USE]},
         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_2"}]}],
        [*USER, {"role": "assistant", "content": [USE]},
         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                       "content": "17"}]}],
        [{"role": "assistant", "content": [{**USE, "input": 5}]}],
        [{"role": "user", "content": [{"type": "image", "source": {}}]}]],
    "input": [
        [], "", [{"type": "function_call_output", "call_id": "x", "output": "y"}],
        [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{"}],
        [{"role": "user", "content": "hi"},
         {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
         {"type": "function_call_output", "call_id": "c", "output": "17"}],
        [{"type": "reasoning"}], [{"type": "reasoning", "content": 5}],
        [{"type": "reasoning", "summary": [{"text": 5}]}],
        [{"type": "message", "role": "tool", "content": "x"}],
        [{"type": "bogus"}], [{"type": "message", "role": "user", "content": [
            {"type": "input_image", "image_url": "x"}]}]],
    "text": [{"format": {"type": "json_schema", "schema": {"type": "nonsense"}}},
             {"format": {"type": "json_object"}}, {"format": 5}, {"format": {"type": "x"}}],
    "output_config": [{"format": {"type": "json_schema", "schema": {"type": "integer"}}},
                      {"format": {"type": "regex"}}, {"effort": 5}],
    "thinking": [{"type": "enabled", "budget_tokens": 10**30}, {"type": "x"}, {}],
}

_scalars = (st.none() | st.booleans() | st.integers() | st.floats()
            | st.text(max_size=12)
            | st.sampled_from([*NUMBERS, "", [], {}]))
JSON_VALUES = st.recursive(
    _scalars, lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
# Nesting around the body limit (128): refused at the door above it, handled below it.
DEEP = st.integers(1, 140).flatmap(
    lambda levels: st.sampled_from([_deep(levels), _deep_schema(levels),
                                    {"type": "json_schema",
                                     "json_schema": {"schema": _deep_schema(levels)}}]))


@st.composite
def _mutated(draw: st.DrawFn, path: str) -> dict[str, Any]:
    """A valid body of `path` with one to three fields set, replaced or removed."""
    body = json.loads(json.dumps(BASES[path]))
    budgets = BUDGETS.get(path, ())
    for _ in range(draw(st.integers(1, 3))):
        field = draw(st.sampled_from(FIELDS[path] + list(budgets)))
        if field in budgets:
            body[field] = draw(st.sampled_from(BAD_BUDGETS))
            continue
        if field in body and draw(st.booleans()):
            del body[field]
            continue
        body[field] = draw(st.sampled_from(CURATED[field]) if field in CURATED
                           and draw(st.booleans()) else JSON_VALUES | DEEP)
    return body


@st.composite
def requests(draw: st.DrawFn) -> tuple[str, bytes]:
    """(route, raw body): mostly mutated valid bodies, some random JSON or bytes."""
    path = draw(st.sampled_from(list(ROUTES)))
    kind = draw(st.sampled_from(["mutated"] * 6 + ["json", "bytes"]))
    if kind == "bytes":
        return path, draw(st.binary(max_size=64))
    body = draw(_mutated(path)) if kind == "mutated" else draw(JSON_VALUES)
    return path, json.dumps(body).encode()  # NaN and Infinity included: json.loads takes them


def test_fuzzed_bodies_are_answered_2xx_or_4xx(served: Served) -> None:
    deadline = time.monotonic() + FUZZ_BUDGET_S
    statuses: Counter[int] = Counter()

    @settings(max_examples=int(FUZZ_BUDGET_S * 10), deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(request=requests())
    def run(request: tuple[str, bytes]) -> None:
        if time.monotonic() > deadline:
            return
        path, raw = request
        response = httpx.post(f"{served.url}{path}", content=raw, timeout=120,
                              headers={"content-type": "application/json"})
        statuses[response.status_code] += 1
        problem = answer_problem(path, response)
        assert problem is None, f"POST {path} {raw[:2000]!r}: {problem}\n{served.log_tail()}"

    run()
    print(f"fuzzed {sum(statuses.values())} requests: {dict(sorted(statuses.items()))}")
    assert served.alive() and served.healthy(), served.log_tail()
    assert served.memory_kib() < MEMORY_BOUND_KIB


# --------------------------------------------------------------------------- pathological corpus
# Bodies are JSON text: a schema nested 10,000 levels is past the client's own json.dumps.
Item = tuple[str, bytes]


def _item(path: str, body: dict[str, Any], **texts: str) -> Item:
    """(route, body text); each `texts` key is a placeholder value in `body`, replaced by the
    JSON text given."""
    raw = json.dumps(body)
    for placeholder, text in texts.items():
        raw = raw.replace(json.dumps(placeholder), text)
    return path, raw.encode()


def _chat_format(response_format: dict[str, Any], **texts: str) -> Item:
    return _item("/v1/chat/completions", {"messages": USER, "max_tokens": 8,
                                          "response_format": response_format}, **texts)


def _schema(schema: Any) -> Item:
    return _chat_format({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})


def _nested_schema(levels: int) -> Item:
    """An object schema nested `levels` deep, as text."""
    text = ('{"type": "object", "properties": {"a": ' * levels + '{"type": "string"}'
            + '}, "required": ["a"]}' * levels)
    return _chat_format({"type": "json_schema",
                         "json_schema": {"name": "x", "schema": "SCHEMA"}}, SCHEMA=text)


def _regex(regex: str) -> Item:
    return _item("/v1/completions", {"prompt": "Answer:", "max_tokens": 8,
                                     "response_format": {"type": "regex", "regex": regex}})


def _peg(grammar: str) -> Item:
    return _item("/v1/completions", {"prompt": "Answer:", "max_tokens": 8,
                                     "response_format": {"type": "grammar", "grammar": grammar}})


def _tools(count: int, choice: Any = "auto", parameters: Any = None) -> Item:
    tools = [{"type": "function", "function": {
        "name": f"tool_{i}", "description": f"tool number {i}",
        "parameters": parameters or {"type": "object", "properties": {
            "x": {"type": "integer"}}, "required": ["x"]}}} for i in range(count)]
    return _item("/v1/chat/completions", {"messages": USER, "max_tokens": 8, "tools": tools,
                                          "tool_choice": choice})


BILLION = 10**9
CORPUS: dict[str, Item] = {
    "schema string minLength 1e9": _schema({"type": "string", "minLength": BILLION}),
    "schema string maxLength 1e9": _schema({"type": "string", "maxLength": BILLION}),
    "schema string minLength=maxLength 1e9": _schema(
        {"type": "string", "minLength": BILLION, "maxLength": BILLION}),
    "schema array minItems 1e9": _schema({"type": "array", "minItems": BILLION}),
    "schema array maxItems 1e9": _schema({"type": "array", "items": {"type": "integer"},
                                          "maxItems": BILLION}),
    "schema object minProperties 1e9": _schema({"type": "object", "minProperties": BILLION}),
    "schema integer range 1e300": _schema({"type": "integer", "minimum": 10**300,
                                           "maximum": 10**300 + 5}),
    "schema pattern a{1000000000}": _schema({"type": "string", "pattern": "^a{1000000000}$"}),
    "schema pattern (a+)+$": _schema({"type": "string", "pattern": "^(a+)+$"}),
    "schema nested 10,000 levels": _nested_schema(10_000),
    "schema nested 60 levels (under the body limit)": _nested_schema(60),
    "schema array nested 120 levels": _schema(_deep_schema(120)),
    "schema enum 50,000 strings": _schema({"enum": [f"value-{i}" for i in range(50_000)]}),
    "schema anyOf 5,000 branches": _schema(
        {"anyOf": [{"const": f"branch-{i}"} for i in range(5_000)]}),
    "schema $ref cycle": _schema({"$ref": "#/$defs/a", "$defs": {
        "a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}}),
    "schema $ref self": _schema({"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}}),
    "schema recursive list": _schema({"$ref": "#/$defs/n", "$defs": {"n": {
        "type": "object", "properties": {"next": {"$ref": "#/$defs/n"}}}}}),
    "regex a{1000000000}": _regex("a{1000000000}"),
    "regex [a-z]{1,1000000}": _regex("[a-z]{1,1000000}"),
    "regex (a{1000}){1000}": _regex("(a{1000}){1000}"),
    "regex (a+)+$": _regex("(a+)+$"),
    "regex (a|a)*b": _regex("(a|a)*b"),
    "regex 10,000 nested groups": _regex("(" * 10_000 + "a" + ")" * 10_000),
    "regex 100,000 alternatives": _regex("|".join(f"w{i}" for i in range(100_000))),
    'peg "a"{100000000}': _peg('root = "a"{100000000}'),
    'peg ("a"{10000}){10000}': _peg('root = ("a"{10000}){10000}'),
    "peg 10,000 nested parentheses": _peg("root = " + "(" * 10_000 + '"a"' + ")" * 10_000),
    "peg left recursion": _peg('root = root "a" | "a"'),
    "peg 10,000 chained rules": _peg("\n".join(
        [f"r{i} = r{i + 1}" for i in range(10_000)] + ['r10000 = "a"'])),
    "choice 50,000 strings": _chat_format({"type": "choice",
                                           "choice": [f"c{i}" for i in range(50_000)]}),
    "100 tools, required": _tools(100, "required"),
    "1,000 tools, auto": _tools(1_000),
    "1,000 tools, required": _tools(1_000, "required"),
    "tool arguments minLength 1e9, required": _tools(1, "required", {
        "type": "object", "properties": {"x": {"type": "string", "minLength": BILLION}},
        "required": ["x"]}),
    "responses text.format minLength 1e9": _item("/v1/responses", {
        "input": "hi", "max_output_tokens": 8, "text": {"format": {
            "type": "json_schema", "name": "x",
            "schema": {"type": "string", "minLength": BILLION}}}}),
    "messages tool input_schema maxItems 1e9, any": _item("/v1/messages", {
        "messages": USER, "max_tokens": 8, "tool_choice": {"type": "any"},
        "tools": [{"name": "f", "input_schema": {"type": "object", "properties": {
            "x": {"type": "array", "minItems": BILLION}}, "required": ["x"]}}]}),
}


@pytest.mark.slow
def test_pathological_grammars_are_answered_within_bounds(served: Served) -> None:
    """Each item: 2xx or 4xx within ITEM_TIME_BOUND_S, peak RSS under the bound, the server
    alive after it. Every item runs, on a fresh server after one that failed (memory it kept,
    or a compile still running, would be charged to the next); each item's outcome is printed
    as it comes, the failures listed together."""
    failures = []
    for name, (path, raw) in CORPUS.items():
        served.reset_peak()
        started = time.monotonic()
        status, answer, problems = _send(served, path, raw)
        elapsed = time.monotonic() - started
        peak = served.memory_kib() >> 10 if served.alive() else None
        if peak is None:
            problems.append("the server died")
        elif peak > MEMORY_BOUND_KIB >> 10:
            problems.append(f"peak RSS {peak} MiB")
        print(f"{name}: {status} in {elapsed:.1f} s, peak RSS {peak} MiB: {answer[:120]}",
              flush=True)
        if problems:
            failures.append(f"{name}: {'; '.join(problems)}")
            served.restart()
    assert not failures, "\n".join(failures)


def _send(served: Served, path: str, raw: bytes) -> tuple[int | str, str, list[str]]:
    """(status, answer text, what is wrong with the answer) of one corpus item."""
    try:
        response = httpx.post(f"{served.url}{path}", content=raw, timeout=ITEM_TIME_BOUND_S,
                              headers={"content-type": "application/json"})
    except httpx.TimeoutException:
        return "timeout", "", [f"no answer in {ITEM_TIME_BOUND_S:.0f} s"]
    except httpx.TransportError as exc:
        return "no answer", "", [f"the connection failed: {exc!r}"]
    problem = answer_problem(path, response)
    return response.status_code, response.text, [problem] if problem else []
