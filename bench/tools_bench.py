"""How much does constraining help a model's tool calls? The Berkeley Function Calling
Leaderboard (BFCL) questions, answered by one model in three modes and scored by BFCL's own AST
checker, offline (`pegmask.bench.bfcl`).

Modes, on the same rendered prompt (the chat template with the question's tools):

* **required**: constrained, `tool_choice="required"`: the grammar forces a call to one of the
  tools with arguments that follow its schema. Run on categories whose every question expects
  a call (not the irrelevance ones).
* **auto**: constrained, `tool_choice="auto"`: the model may answer in text; once it starts a
  call (the dialect's trigger), the call is constrained.
* **unconstrained**: the same prompt decoded as a plain completion with no grammar, its output
  parsed with the dialect's lenient parser: what a server without a grammar backend returns.

`parallel_tool_calls` is true on parallel categories and false elsewhere, in every mode (a
constrained decode enforces it; unconstrained, only the first parsed call is kept, as vLLM does
without a grammar). Decoding is greedy (temperature 0). Per category and mode: outputs that
parse into calls, calls whose arguments validate against their tool's JSON Schema, AST accuracy
(BFCL's checker; for irrelevance, the share of answers with no call), outputs cut off at
max_tokens, and decode tokens/s (completion tokens over the mode's wall time, batches of
`--batch-size`).

    pegmask bench tools [--quick] [--sample N] [--categories a,b] [--model PATH] [--out F.md]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pegmask.bench.bfcl import (
    CATEGORIES,
    BFCLNotInstalled,
    Question,
    check,
    is_irrelevance,
    is_parallel,
    load_category,
    read_arguments,
    sample,
    tools,
)
from pegmask.bench.plots import bars
from pegmask.bench.reporting import (
    RESULTS_DIR,
    command_line,
    machine,
    machine_info,
    publish,
    write_json,
)

MODES = ("required", "auto", "unconstrained")
DEFAULT_CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple", "irrelevance")
QUICK = {"categories": ("simple_python", "parallel", "irrelevance"), "sample": 2,
         "max_tokens": 128}
DEFAULT_MAX_TOKENS = 256
DEFAULT_BATCH = 8


# ----------------------------------------------------------------------------- engine access


class UnconstrainedDecoding:
    """The one place this bench reaches past `Engine.generate`: an unconstrained chat is the
    chat's rendered prompt (`Engine.render`) decoded as a completion with no grammar, and its
    output parsed by the dialect's lenient parser (`Dialect.parse`, token ids with the
    vocabulary, so special tokens count by id)."""

    def __init__(self, engine: Any):
        from pegmask.engine.requests import build_request

        self.engine = engine
        self.build_request = build_request

    def request(self, question: Question, options: dict[str, Any]) -> tuple[dict[str, Any], Any]:
        """A completion request for `question`'s chat prompt, and the chat request to parse
        its output against."""
        chat = self.build_request(question.messages, tools=tools(question), tool_choice="auto",
                                  parallel_tool_calls=options["parallel_tool_calls"])
        sampling = {key: options[key] for key in ("max_tokens", "temperature", "seed")}
        return {"prompt": self.engine.render(chat), **sampling}, chat

    def message(self, result: Any, chat: Any) -> dict[str, Any]:
        """The assistant message a server without a grammar would return for `result`."""
        return self.engine.dialect.parse(result.token_ids, chat.chat, self.engine.vocab)


# ----------------------------------------------------------------------------- running


@dataclass
class Outcome:
    """One question answered in one mode."""

    id: str
    calls: list[dict[str, Any]]  # [{name: arguments}], as the checker reads them
    made: int  # tool calls the output parses into (after the parallel_tool_calls rule)
    valid: int  # of those, calls to a given tool whose arguments follow its schema
    correct: bool  # BFCL's AST checker (irrelevance: no call)
    completion_tokens: int
    prompt_tokens: int
    finish_reason: str
    error: str | None = None  # a request the engine refused (e.g. a schema it cannot compile)


@dataclass
class ModeRun:
    """One category in one mode."""

    category: str
    mode: str
    seconds: float = 0.0
    outcomes: list[Outcome] = field(default_factory=list)

    @property
    def questions(self) -> int:
        return len(self.outcomes)

    @property
    def with_calls(self) -> int:
        return sum(o.made > 0 for o in self.outcomes)

    @property
    def calls(self) -> int:
        return sum(o.made for o in self.outcomes)

    @property
    def valid(self) -> int:
        return sum(o.valid for o in self.outcomes)

    @property
    def correct(self) -> int:
        return sum(o.correct for o in self.outcomes)

    @property
    def cut_off(self) -> int:
        return sum(o.finish_reason == "length" for o in self.outcomes)

    @property
    def errors(self) -> int:
        return sum(o.error is not None for o in self.outcomes)

    @property
    def tokens_per_s(self) -> float:
        tokens = sum(o.completion_tokens for o in self.outcomes)
        return tokens / self.seconds if self.seconds else float("nan")

    def figures(self) -> dict[str, Any]:
        return {"category": self.category, "mode": self.mode, "questions": self.questions,
                "with_calls": self.with_calls, "calls": self.calls, "valid_calls": self.valid,
                "correct": self.correct, "accuracy": self.correct / max(1, self.questions),
                "cut_off": self.cut_off, "errors": self.errors, "seconds": self.seconds,
                "tokens_per_s": self.tokens_per_s,
                "outcomes": [asdict(o) for o in self.outcomes]}


def _validator(question: Question) -> dict[str, Any]:
    """A JSON Schema validator per tool name of `question`."""
    import jsonschema

    validators = {}
    for tool in tools(question):
        schema = tool["function"]["parameters"]
        validators[tool["function"]["name"]] = jsonschema.validators.validator_for(schema)(schema)
    return validators


def score(question: Question, message: dict[str, Any], parallel: bool) -> tuple[
        list[dict[str, Any]], int, int, bool]:
    """(calls as the checker reads them, calls made, calls valid, correct) of a message."""
    made = message.get("tool_calls") or []
    if not parallel:
        made = made[:1]
    functions = {f["name"]: f for f in question.functions}
    validators = _validator(question)
    calls, valid, readable = [], 0, True
    for call in made:
        name, arguments = call["function"]["name"], call["function"]["arguments"]
        try:
            value = read_arguments(arguments, functions.get(name))
        except ValueError:
            readable = False
            continue
        calls.append({name: value})
        validator = validators.get(name)
        valid += validator is not None and isinstance(value, dict) and validator.is_valid(value)
    correct = readable and check(question, calls)
    return calls, len(made), valid, correct


def run_mode(engine: Any, questions: list[Question], mode: str, *, max_tokens: int,
             batch_size: int, seed: int, progress: Any) -> ModeRun:
    """Answer `questions` (one category) in `mode`, `batch_size` at a time."""
    from pegmask.engine.requests import InvalidRequestError

    run = ModeRun(questions[0].category, mode)
    free = UnconstrainedDecoding(engine)
    for start in range(0, len(questions), batch_size):
        chunk = questions[start : start + batch_size]
        requests, chats = [], []
        for i, question in enumerate(chunk):
            options = {"max_tokens": max_tokens, "temperature": 0.0, "seed": seed + start + i,
                       "parallel_tool_calls": is_parallel(question.category)}
            if mode == "unconstrained":
                request, chat = free.request(question, options)
                requests.append(request)
                chats.append(chat)
            else:
                requests.append({"messages": question.messages, "tools": tools(question),
                                 "tool_choice": mode, **options})
        began = time.perf_counter()
        results = engine.generate_batch(requests, return_errors=True)
        run.seconds += time.perf_counter() - began
        for i, (question, result) in enumerate(zip(chunk, results, strict=True)):
            if isinstance(result, InvalidRequestError):
                run.outcomes.append(Outcome(question.id, [], 0, 0, False, 0, 0, "error",
                                            str(result)[:300]))
                continue
            message = free.message(result, chats[i]) if chats else result.message
            calls, made, valid, correct = score(question, message,
                                                is_parallel(question.category))
            run.outcomes.append(Outcome(
                question.id, calls, made, valid, correct, result.usage["completion_tokens"],
                result.usage["prompt_tokens"], result.finish_reason))
        progress.update(len(chunk))
    return run


def modes_for(category: str, modes: Sequence[str]) -> list[str]:
    """The modes run on `category`: `required` only where every question expects a call."""
    return [m for m in modes if not (m == "required" and is_irrelevance(category))]


# ----------------------------------------------------------------------------- report


def _percent(part: int, whole: int) -> str:
    return f"{part}/{whole} ({100 * part / whole:.0f}%)" if whole else "-"


def category_table(runs: list[ModeRun]) -> str:
    header = ["category", "mode", "questions", "outputs with calls", "calls valid",
              "AST accuracy", "cut off at max_tokens", "request errors", "tokens/s"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for run in runs:
        accuracy = _percent(run.correct, run.questions)
        if is_irrelevance(run.category):
            accuracy += " (no call)"
        lines.append("| " + " | ".join([
            run.category, run.mode, str(run.questions), _percent(run.with_calls, run.questions),
            _percent(run.valid, run.calls), accuracy, str(run.cut_off), str(run.errors),
            f"{run.tokens_per_s:.1f}"]) + " |")
    return "\n".join(lines)


def accuracy_table(runs: list[ModeRun], modes: Sequence[str]) -> str:
    """AST accuracy, one row per category, one column per mode."""
    categories = list(dict.fromkeys(run.category for run in runs))
    found = {(run.category, run.mode): run for run in runs}
    lines = ["| category | " + " | ".join(modes) + " |", "|---|" + "---|" * len(modes)]
    for category in categories:
        cells = []
        for mode in modes:
            run = found.get((category, mode))
            cells.append(f"{100 * run.correct / max(1, run.questions):.0f}%" if run else "-")
        lines.append(f"| {category} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def findings(runs: list[ModeRun]) -> list[str]:
    """What the figures say against the expectations: constrained calls parse and validate,
    constrained accuracy at least unconstrained; plus the same-prompt check."""
    notes = []
    required = [r for r in runs if r.mode == "required"]
    if required:
        finished = [o for r in required for o in r.outcomes
                    if o.finish_reason not in ("length", "error")]
        notes.append(
            f"- required: of the outputs that ended before max_tokens, "
            f"{sum(o.made > 0 for o in finished)}/{len(finished)} parse into calls and "
            f"{sum(o.valid for o in finished)}/{sum(o.made for o in finished)} of their calls "
            f"validate against their schema; {sum(r.cut_off for r in required)} outputs were "
            f"cut off at max_tokens (a call cut off is kept unfinished, so it does not "
            f"validate), {sum(r.errors for r in required)} requests were refused.")
    found = {(r.category, r.mode): r for r in runs}
    for (category, mode), run in found.items():
        free = found.get((category, "unconstrained"))
        if mode != "unconstrained" and free and run.correct < free.correct:
            notes.append(f"- {category}: {mode} ({run.correct}) is below unconstrained "
                         f"({free.correct}): see the outcomes in the JSON report.")
    for category in dict.fromkeys(r.category for r in runs):
        auto, free = found.get((category, "auto")), found.get((category, "unconstrained"))
        if auto and free:
            same = sum(a.prompt_tokens == f.prompt_tokens
                       for a, f in zip(auto.outcomes, free.outcomes, strict=True))
            if same != auto.questions:
                notes.append(f"- {category}: the unconstrained prompt differed from auto's in "
                             f"{auto.questions - same} of {auto.questions} questions.")
    return notes


def report(runs: list[ModeRun], *, engine: Any, command: str, settings: str,
           plot: Path | None, out: Path) -> str:
    modes = [m for m in MODES if any(r.mode == m for r in runs)]
    parts = [
        "# Tool calling on BFCL: constrained vs unconstrained",
        machine_info(("bfcl_eval", "torch", "transformers")),
        f"Command: `{command}`",
        f"Model {engine.model_name} (dialect {engine.dialect_name}) on "
        f"{engine.backend.device}; {settings}.",
        "\n\n".join(__doc__.split("\n\n")[1:4]),
        "## AST accuracy by category",
        accuracy_table(runs, modes),
        "## Per category and mode",
        category_table(runs),
        "*outputs with calls*: outputs that parse into at least one tool call; *calls valid*: "
        "calls to one of the question's tools whose arguments validate against its JSON "
        "Schema, of all calls made; *AST accuracy*: BFCL's checker (irrelevance: no call); "
        "*tokens/s*: completion tokens over the mode's wall time (batched).",
        "## Findings",
        "\n".join(findings(runs)) or "- as expected: constrained calls parse and validate, "
        "constrained accuracy at least unconstrained in every category.",
    ]
    if plot:
        parts.append(f"![BFCL accuracy]({plot.relative_to(out.parent).as_posix()})")
    return "\n\n".join(parts) + "\n"


def draw(runs: list[ModeRun], out: Path) -> Path:
    categories = list(dict.fromkeys(r.category for r in runs))
    found = {(r.category, r.mode): r for r in runs}
    series = {mode: [100 * found[c, mode].correct / max(1, found[c, mode].questions)
                     if (c, mode) in found else 0.0 for c in categories]
              for mode in MODES if any(r.mode == mode for r in runs)}
    return bars(categories, series, title="BFCL AST accuracy: constrained vs unconstrained",
                ylabel="% correct", out=out, ylim=(0, 105))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(prog="pegmask bench tools",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"a few minutes: {QUICK['sample']} questions of "
                        f"{', '.join(QUICK['categories'])}, max_tokens {QUICK['max_tokens']}")
    parser.add_argument("--categories", help=f"comma-separated, of {', '.join(CATEGORIES)} "
                        f"(default {','.join(DEFAULT_CATEGORIES)})")
    parser.add_argument("--sample", type=int, help="questions per category, a seeded sample "
                        "(default: all)")
    parser.add_argument("--modes", default=",".join(MODES),
                        help=f"comma-separated, of {', '.join(MODES)} (default all)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the sample")
    parser.add_argument("--max-tokens", type=int,
                        help=f"per answer (default {DEFAULT_MAX_TOKENS})")
    parser.add_argument("--batch-size", type=int, default=DEFAULT_BATCH,
                        help=f"questions decoded together (default {DEFAULT_BATCH})")
    parser.add_argument("--model", help="GGUF file or local HF folder (default: SmolLM2-135M)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype")
    parser.add_argument("--dialect", default="auto")
    parser.add_argument("--no-plots", action="store_true")
    parser.add_argument("--out", type=Path, help="markdown report (JSON and PNG beside it; "
                        "default bench/results/bfcl[_quick].md)")
    args = parser.parse_args(argv)
    quick = QUICK if args.quick else {}
    categories = (args.categories.split(",") if args.categories
                  else list(quick.get("categories", DEFAULT_CATEGORIES)))
    modes = args.modes.split(",")
    unknown = [c for c in categories if c not in CATEGORIES] + [m for m in modes
                                                               if m not in MODES]
    if unknown:
        parser.error(f"unknown categories or modes: {', '.join(unknown)}")
    count = args.sample if args.sample is not None else quick.get("sample")
    max_tokens = (args.max_tokens if args.max_tokens is not None
                  else quick.get("max_tokens", DEFAULT_MAX_TOKENS))
    if (count is not None and count < 1) or max_tokens < 1 or args.batch_size < 1:
        parser.error("--sample, --max-tokens and --batch-size must be at least 1")
    try:
        questions = {c: sample(load_category(c), count, args.seed) for c in categories}
    except BFCLNotInstalled as exc:
        parser.error(str(exc))

    from tqdm import tqdm

    from pegmask.engine import Engine

    engine = Engine(args.model, device=args.device, dtype=args.dtype, dialect=args.dialect)
    plan = [(c, m) for c in categories for m in modes_for(c, modes)]
    runs = []
    with tqdm(total=sum(len(questions[c]) for c, _ in plan), desc="BFCL", unit="question",
              file=sys.stderr, dynamic_ncols=True) as progress:
        for category, mode in plan:
            progress.set_postfix_str(f"{category} {mode}")
            runs.append(run_mode(engine, questions[category], mode, max_tokens=max_tokens,
                                 batch_size=args.batch_size, seed=args.seed, progress=progress))
    out = args.out or RESULTS_DIR / ("bfcl_quick.md" if args.quick else "bfcl.md")
    plot = None if args.no_plots else draw(runs, out.with_suffix(".png"))
    command = command_line("tools", argv)
    settings = (f"{count or 'all'} questions per category (seed {args.seed}), greedy, "
                f"max_tokens {max_tokens}, batches of {args.batch_size}")
    publish(report(runs, engine=engine, command=command, settings=settings, plot=plot, out=out),
            out)
    write_json({"command": command, "machine": machine(("bfcl_eval", "torch", "transformers")),
                "model": engine.model_name, "dialect": engine.dialect_name,
                "settings": settings, "runs": [run.figures() for run in runs]},
               out.with_suffix(".json"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
