"""The `pegmask` command line.

    pegmask demo                                    # a forced tool call and a JSON answer
    pegmask generate "prompt" [--json-schema S | --regex R | --grammar G | --choice A B ...]
    pegmask chat                                    # interactive, streamed
    pegmask serve --host 127.0.0.1 --port 8000 [--model PATH]
    pegmask run-batch -i in.jsonl -o out.jsonl      # OpenAI request bodies, one per line
    pegmask dialect TEMPLATE [--eos-token T] [--tokenizer P]  # a chat template's dialect
    pegmask bench grammars|tools|e2e|serve|compile [--quick] [ARGS...]  # benchmarks

`--model` takes a GGUF file or a local Hugging Face folder; without it the embedded
SmolLM2-135M-Instruct runs. Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import pkgutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pegmask.grammars.limits import GrammarLimits

# `pegmask bench` names from DESIGN.md -> modules of pegmask.bench
BENCH_ALIASES = {"grammars": "grammar_bench", "tools": "tools_bench", "e2e": "decode_throughput",
                 "serve": "serve_bench", "compile": "compile_scale"}


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args, rest = parser.parse_known_args(argv)
    if args.command != "bench" and rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        return int(args.run(args, rest) or 0)
    except ValueError as exc:  # bad requests and options: a message, not a traceback
        print(f"pegmask: error: {exc}", file=sys.stderr)
        return 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pegmask", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser("demo", help="a constrained tool call and a JSON-schema answer")
    _model_options(demo)
    demo.set_defaults(run=_demo)

    generate = commands.add_parser("generate", help="generate once from a prompt")
    _model_options(generate)
    _sampling_options(generate)
    generate.add_argument("prompt", help="the prompt ('-' reads stdin)")
    generate.add_argument("--chat", action="store_true",
                          help="send the prompt as a user message (chat template, dialect)")
    generate.add_argument("--system", help="a system message (implies --chat)")
    group = generate.add_mutually_exclusive_group()
    group.add_argument("--json-schema", metavar="SCHEMA",
                       help="JSON Schema the output must follow (JSON text or a file)")
    group.add_argument("--json", action="store_true", help="any JSON object")
    group.add_argument("--regex", help="regular expression the output must match")
    group.add_argument("--grammar", metavar="PEG", help="PEG grammar (text or a file)")
    group.add_argument("--choice", nargs="+", help="the output is one of these strings")
    generate.set_defaults(run=_generate)

    chat = commands.add_parser("chat", help="interactive chat in the terminal")
    _model_options(chat, compiled_step="auto")
    _sampling_options(chat)
    chat.add_argument("--system", help="a system message")
    chat.set_defaults(run=_chat)

    serve = commands.add_parser(
        "serve", help="HTTP server: OpenAI Chat Completions, Completions and Responses, "
                      "Anthropic Messages")
    _model_options(serve, compiled_step="auto")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--api-key", help="require this key (Bearer or x-api-key); default: none")
    serve.add_argument("--served-model-name", action="append", default=[],
                       help="a model name clients may use (repeatable; the first is reported)")
    serve.add_argument("--max-body-bytes", type=int, default=8 * 1024 * 1024,
                       help="largest request body (default 8 MiB; larger: 413)")
    serve.add_argument("--max-body-depth", type=int, default=128,
                       help="deepest nesting of arrays and objects in a request body "
                            "(default 128; deeper: 400)")
    serve.add_argument("--log-level", default="info", help="uvicorn's log level")
    serve.set_defaults(run=_serve)

    batch = commands.add_parser("run-batch", help="answer a JSONL file of OpenAI requests")
    _model_options(batch)
    batch.add_argument("-i", "--input", required=True, type=Path)
    batch.add_argument("-o", "--output", required=True, type=Path)
    batch.set_defaults(run=_run_batch)

    dialect = commands.add_parser(
        "dialect", help="the tool-call format a chat template writes: its family, and what "
                        "pegmask derives from the template alone")
    dialect.add_argument("template", help="a chat template (a .jinja file, or its text)")
    dialect.add_argument("--eos-token", default="",
                         help="the tokenizer's eos_token, for templates that end turns with it")
    dialect.add_argument("--bos-token", default="", help="the tokenizer's bos_token")
    dialect.add_argument("--tokenizer", default=None,
                         help="a tokenizer.json / tokenizer_config.json (or their folder): its "
                              "special tokens pick the family where the template writes no call")
    dialect.set_defaults(run=_dialect)

    bench = commands.add_parser("bench", help="benchmarks (pegmask.bench modules)",
                                add_help=False)
    bench.add_argument("name", nargs="?",
                       help="grammars, tools, e2e, serve, compile, or a pegmask.bench module")
    bench.set_defaults(run=_bench)
    return parser


def _model_options(parser: argparse.ArgumentParser, compiled_step: str = "off") -> None:
    """The model and engine options; `compiled_step`: that option's default (auto for the
    long-lived commands, whose single stream earns a build of seconds; off for one-shot
    ones)."""
    parser.add_argument("--model", help="GGUF file or local HF folder (default: SmolLM2-135M)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto")
    parser.add_argument("--dtype", default=None, help="float32, bfloat16, float16 (default auto)")
    # engine/llama_runner.WEIGHT_MODES, spelled out here: the CLI starts without importing torch
    parser.add_argument("--weights", default="auto",
                        choices=("auto", "quantized", "bfloat16", "float16", "float32"),
                        help="the CPU products' weights (llama-family models): auto (default: "
                             "a GGUF file's quantized blocks for steps of a few rows where "
                             "torch's int4 kernel is fast, bfloat16 weights where the CPU has "
                             "bfloat16 instructions, else float16, for the rest), quantized "
                             "(the file's blocks for every step), bfloat16, float16 (float32 "
                             "compute), float32; rounded formats can change greedy picks at "
                             "near-ties (docs/serving.md)")
    parser.add_argument("--compiled-step", default=compiled_step, choices=("auto", "on", "off"),
                        help="a lone request's decode steps as one graph compiled by "
                             "torch.compile (CPU, llama-family models, a C++ compiler), built "
                             "at start (about a minute the first time on a machine, then "
                             "seconds): auto (where it can run), on (an error where it "
                             f"cannot), off (default here: {compiled_step})")
    parser.add_argument("--dialect", default="auto",
                        help="hermes, hermes-xml, harmony, llmjp-harmony, dsml (default: detect)")
    parser.add_argument("--threads", type=int, help="torch CPU threads")
    parser.add_argument("--max-running", type=int, default=32,
                        help="sequences decoding at once (default 32)")
    parser.add_argument("--max-queued", type=int, default=256,
                        help="requests waiting for room (default 256; more: 429)")
    parser.add_argument("--max-model-len", type=int, default=None,
                        help="prompt + output tokens of one request at most (default: the "
                             "model's context)")
    parser.add_argument("--prefill-chunk", type=int, default=256,
                        help="prompt tokens per decode step (default 256)")
    parser.add_argument("--no-decode-first", dest="decode_first", action="store_false",
                        default=None,
                        help="take --prefill-chunk prompt tokens a step even beside decoding "
                             "rows (default on a CPU: at most as many as rows decode, at least "
                             "16, so that a long prompt does not stall the others)")
    parser.add_argument("--kv-cache-memory-bytes", type=int, default=None,
                        help="the key/value cache the running requests may hold, each counted "
                             "with its prompt and max_tokens; a request waits for room, and "
                             "one that never fits is refused (default 4 GiB; 0: no bound)")
    parser.add_argument("--prefix-cache", type=int, default=4,
                        help="prompt prefixes kept so that requests sharing one (the same "
                             "tools) skip its prefill, in whole blocks of 16 tokens (default 4; "
                             "0: none)")
    parser.add_argument("--draft-budget", type=int, default=48,
                        help="steps holding fewer tokens than this add prompt-lookup drafts "
                             "of rows' next tokens, checked in the same forward (default 48; "
                             "0: none)")
    parser.add_argument("--request-timeout", type=float, default=None,
                        help="seconds a request may take, queue included (default: no limit)")
    parser.add_argument("--no-strict-tool-arguments", dest="strict_tool_arguments",
                        action="store_false",
                        help="tool parameter objects without additionalProperties take any "
                             "other key (plain JSON Schema; default: they take none)")
    limits = GrammarLimits()
    parser.add_argument("--grammar-max-instructions", type=int, default=limits.max_instructions,
                        help="instructions a request's compiled grammar may have (default "
                             f"{limits.max_instructions}; more: a 400 naming the limit)")
    parser.add_argument("--grammar-max-completion-length", type=int,
                        default=limits.max_completion_length,
                        help="bytes (and special tokens) of the shortest output that closes "
                             "a request's grammar, which close_on_length walks (default "
                             f"{limits.max_completion_length}; more: a 400 naming the limit)")
    # Left out unless given: the Engine's defaults (engine/compile_service.py) hold.
    parser.add_argument("--compile-workers", type=int, default=argparse.SUPPRESS,
                        help="processes that compile grammars, so that no compile holds up "
                             "decoding (default 1; 0: compile in this process, without the "
                             "budgets below)")
    parser.add_argument("--compile-timeout", dest="compile_timeout_s", type=_limit(float),
                        metavar="SECONDS", default=argparse.SUPPRESS,
                        help="CPU seconds one grammar's compile may take in its worker (10 "
                             "times that of wall time at most); past it the request is a 400 "
                             "naming compile_time (default 10; 0: no limit)")
    parser.add_argument("--compile-memory", dest="compile_memory_bytes", type=_limit(_size),
                        metavar="SIZE", default=argparse.SUPPRESS,
                        help="memory one grammar's compile may add to its worker (bytes, or "
                             "with KiB, MiB, GiB); past it the request is a 400 naming "
                             "compile_memory (default 2GiB; 0: no limit)")


def _size(text: str) -> int:
    """Bytes from `123`, `512MiB`, `2GiB` (or KiB)."""
    units = {"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}
    lowered = text.strip().lower()
    for unit, factor in units.items():
        if lowered.endswith(unit):
            return int(float(lowered[:-len(unit)]) * factor)
    return int(lowered)


def _limit(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """An option's parser where 0 means no limit (None)."""
    def parsed(text: str) -> Any:
        try:
            value = parse(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if value < 0:
            raise argparse.ArgumentTypeError(f"must not be negative: {text!r}")
        return value or None

    return parsed


def _sampling_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--top-p", type=float)
    parser.add_argument("--top-k", type=int)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--stop", action="append", help="stop string (repeatable)")


def _engine(args: argparse.Namespace) -> Any:
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    from pegmask.engine import Engine

    engine_options = {name: getattr(args, name) for name in
                      ("compile_workers", "compile_timeout_s", "compile_memory_bytes")
                      if hasattr(args, name)}
    if args.kv_cache_memory_bytes is not None:  # else the engine's default
        engine_options["kv_cache_bytes"] = args.kv_cache_memory_bytes or None
    return Engine(args.model, device=args.device, dtype=args.dtype, dialect=args.dialect,
                  weights=args.weights,
                  compiled_step={"auto": None, "on": True, "off": False}[args.compiled_step],
                  max_running=args.max_running, max_queued=args.max_queued,
                  prefill_chunk=args.prefill_chunk, decode_first=args.decode_first,
                  prefix_cache=args.prefix_cache,
                  draft_budget=args.draft_budget,
                  request_timeout_s=args.request_timeout,
                  strict_tool_arguments=args.strict_tool_arguments,
                  max_model_len=args.max_model_len,
                  grammar_limits=GrammarLimits(
                      max_instructions=args.grammar_max_instructions,
                      max_completion_length=args.grammar_max_completion_length),
                  **engine_options)


def _sampling(args: argparse.Namespace) -> dict[str, Any]:
    return {"max_tokens": args.max_tokens, "temperature": args.temperature, "top_p": args.top_p,
            "top_k": args.top_k, "seed": args.seed, "stop": args.stop}


def _text_or_file(value: str) -> str:
    """An option given inline or as a path to a file holding it."""
    path = Path(value)
    try:
        return path.read_text(encoding="utf-8") if path.is_file() else value
    except OSError:  # e.g. a name too long to be a path: it is the text
        return value


def _response_format(args: argparse.Namespace) -> dict[str, Any] | None:
    if args.json_schema:
        schema = json.loads(_text_or_file(args.json_schema))
        return {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}
    if args.json:
        return {"type": "json_object"}
    if args.regex:
        return {"type": "regex", "regex": args.regex}
    if args.grammar:
        return {"type": "grammar", "grammar": _text_or_file(args.grammar)}
    if args.choice:
        return {"type": "choice", "choice": args.choice}
    return None


def _generate(args: argparse.Namespace, _: list[str]) -> int:
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    source: Any = prompt
    if args.chat or args.system:
        source = ([{"role": "system", "content": args.system}] if args.system else [])
        source.append({"role": "user", "content": prompt})
    engine = _engine(args)
    stream = engine.generate(source, stream=True, response_format=_response_format(args),
                             **_sampling(args))
    for delta in stream:
        _print_delta(delta)
    print()
    print(f"[finish_reason={stream.finish_reason} usage={json.dumps(stream.result.usage)}]",
          file=sys.stderr)
    return 0


def _print_delta(delta: dict[str, Any]) -> None:
    for field in ("text", "reasoning_content", "content"):
        if delta.get(field):
            print(delta[field], end="", flush=True)
    for call in delta.get("tool_calls", []):
        function = call.get("function", {})
        if function.get("name"):
            print(f"\n[tool call {function['name']}] ", end="", flush=True)
        print(function.get("arguments", ""), end="", flush=True)


DEMO_TOOLS = [{"type": "function", "function": {
    "name": "get_weather",
    "description": "Current weather in a city",
    "strict": True,
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    }, "required": ["city", "unit"]},
}}]
DEMO_SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string"},
    "population_millions": {"type": "number"},
    "landmarks": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
}, "required": ["name", "population_millions", "landmarks"], "additionalProperties": False}


def _demo(args: argparse.Namespace, _: list[str]) -> int:
    """The README's main job: what constrained decoding guarantees, on the default model."""
    engine = _engine(args)
    print(f"model {engine.model_name}, dialect {engine.dialect_name}", file=sys.stderr)
    question = [{"role": "user", "content": "What is the weather like in Paris today?"}]
    result = engine.generate(question, tools=DEMO_TOOLS, tool_choice="required",
                             parallel_tool_calls=False, max_tokens=96, temperature=0.7, seed=0)
    print("tool call:", json.dumps(result.message["tool_calls"], indent=2))
    city = [{"role": "user", "content": "Describe the city of Paris as JSON."}]
    answer = engine.generate(city, max_tokens=160, temperature=0.7, seed=0, response_format={
        "type": "json_schema", "json_schema": {"name": "city", "schema": DEMO_SCHEMA}})
    print("JSON answer:", answer.message["content"])
    print(f"finish reasons: {result.finish_reason}, {answer.finish_reason}", file=sys.stderr)
    return 0


def _chat(args: argparse.Namespace, _: list[str]) -> int:
    from pegmask.dialects import accumulate

    engine = _engine(args)
    messages = [{"role": "system", "content": args.system}] if args.system else []
    print(f"pegmask chat with {engine.model_name} ({engine.dialect_name}); Ctrl-D to quit",
          file=sys.stderr)
    while True:
        try:
            line = input("> ")
        except (EOFError, KeyboardInterrupt):
            print()
            return 0
        if not line.strip():
            continue
        messages.append({"role": "user", "content": line})
        deltas = []
        for delta in engine.generate(messages, stream=True, **_sampling(args)):
            _print_delta(delta)
            deltas.append(delta)
        print()
        reply = accumulate(deltas)
        messages.append({key: value for key, value in reply.items() if value})


def _serve(args: argparse.Namespace, _: list[str]) -> int:
    import uvicorn

    from pegmask.server import ServerConfig, create_app

    config = ServerConfig(api_key=args.api_key,
                          served_model_names=tuple(args.served_model_name),
                          max_body_bytes=args.max_body_bytes,
                          max_body_depth=args.max_body_depth)
    engine = _engine(args)
    app = create_app(engine, config)
    # What is loaded by now lives as long as the server (the model, the vocabulary, the
    # dialect's grammars): out of the collector's reach, as vLLM does. Each full collection
    # walked it all again, a 0.2-0.3 s stall of every stream.
    gc.collect()
    gc.freeze()
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    finally:
        engine.close()
    return 0


def _run_batch(args: argparse.Namespace, _: list[str]) -> int:
    """Each input line is a request body (chat if it has `messages`, else a completion), or an
    OpenAI Batch API line `{"custom_id", "url", "body"}`; each output line answers one input
    line, in order, in the same form. Every request goes to the scheduler at once; it decodes
    `--max-running` of them together."""
    from pegmask.engine.requests import InvalidRequestError
    from pegmask.server.errors import as_api_error, error_body
    from pegmask.server.openai_chat import completion_response, openai_request

    lines = [json.loads(line) for line in args.input.read_text(encoding="utf-8").splitlines()
             if line.strip()]
    args.max_queued = max(args.max_queued, len(lines))  # the whole file waits in the queue
    engine = _engine(args)
    answers: list[Any] = [None] * len(lines)
    pending = []
    for i, line in enumerate(lines):
        body = line.get("body", line) if isinstance(line, dict) else line
        chat = isinstance(body, dict) and ("messages" in body or
                                            line.get("url", "").endswith("/chat/completions"))
        try:
            source, options = openai_request(body, chat=chat)
            pending.append((i, chat, engine.submit(engine.request(source, **options))))
        except InvalidRequestError as exc:
            answers[i] = error_body(as_api_error(exc))
    for i, chat, submission in pending:
        try:
            result = engine.wait(submission)
            answers[i] = completion_response(result, engine.model_name, chat=chat,
                                             vocab=engine.vocab)
        except Exception as exc:  # noqa: BLE001 - one failed line does not stop the batch
            answers[i] = error_body(as_api_error(exc))
    failed = 0
    with args.output.open("w", encoding="utf-8") as out:
        for line, answer in zip(lines, answers, strict=True):
            failed += "error" in answer
            out.write(json.dumps(_batch_line(line, answer), ensure_ascii=False) + "\n")
    engine.close()
    print(f"{len(lines)} requests, {failed} failed -> {args.output}", file=sys.stderr)
    return 1 if failed else 0


def _batch_line(line: Any, answer: dict[str, Any]) -> dict[str, Any]:
    if not (isinstance(line, dict) and "body" in line):
        return answer
    failed = "error" in answer
    return {"id": f"batch_req_{line.get('custom_id', '')}", "custom_id": line.get("custom_id"),
            "response": {"status_code": 400 if failed else 200, "body": answer},
            "error": None}


def _dialect(args: argparse.Namespace, _: list[str]) -> int:
    """Print the family `detect_dialect` picks and the format derived from the template (or why
    none derives), so that a user can check what a template's turns are taken to be."""
    from pegmask.dialects import DerivationError
    from pegmask.dialects.probe import derive_format
    from pegmask.dialects.registry import detection, tokenizer_special_tokens
    from pegmask.dialects.templating import resolve_chat_template

    template = resolve_chat_template(args.template)
    specials = tokenizer_special_tokens(args.tokenizer) if args.tokenizer else ()
    tokens = {"bos_token": args.bos_token, "eos_token": args.eos_token}
    name, reason = detection(template, tokens, specials)
    print(f"detected: {name} ({reason})")
    try:
        turn = derive_format(template, bos_token=args.bos_token, eos_token=args.eos_token)
    except DerivationError as exc:
        print(f"derived: none ({exc})")
        return 1
    print("derived:")
    print("\n".join("  " + line for line in turn.describe().splitlines()))
    return 0


def _bench(args: argparse.Namespace, rest: list[str]) -> int:
    import pegmask.bench

    available = sorted(m.name for m in pkgutil.iter_modules(pegmask.bench.__path__))
    name = BENCH_ALIASES.get(args.name or "", args.name)
    if name not in available:
        print(f"usage: pegmask bench NAME [ARGS]; NAME is one of "
              f"{sorted(BENCH_ALIASES) + available}", file=sys.stderr)
        return 2
    module = importlib.import_module(f"pegmask.bench.{name}")
    if not hasattr(module, "main"):
        print(f"pegmask.bench.{name} has no main()", file=sys.stderr)
        return 2
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
