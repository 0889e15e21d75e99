"""How compile time grows with a large alternation: enums of thousands of strings and tool
choices of hundreds of tools, pegmask against xgrammar and llguidance in one process, each at
its defaults (`grammar_engines`), on SmolLM2's vocabulary.

What each engine is given:

* **enum N**: the JSON Schema `{"enum": [N distinct random lowercase words of 3-12 letters]}`,
  the same words for every engine.
* **tools N**: the first N distinct tools of the Berkeley Function Calling Leaderboard
  (bfcl-eval's function specs as OpenAI tools, `bfcl.py`). pegmask compiles the grammar its
  engine enforces for them: the `hermes` dialect with `tool_choice="required"` (the whole
  output turn: `<tool_call>` blocks of `{"name", "arguments"}`, each tool's arguments following
  its schema). The peers get the JSON Schema of one call, `{"anyOf": [{"type": "object",
  "properties": {"name": {"const": NAME}, "arguments": PARAMETERS}, "required": ["name",
  "arguments"], "additionalProperties": false}, ...]}`: what a server hands a JSON Schema
  engine for a required call (it writes the `<tool_call>` framing itself).

After a warm-up (a small enum and two tools, so that no engine's one-time costs count), each
case is compiled `--runs` times from scratch, the engines taking turns in a rotating order:
each run's schema carries a description naming the run (and pegmask's dialect is made anew),
so no compiled-grammar cache answers a repeat, and garbage is collected before each (what the
setup loaded is first frozen out of the collector's reach, as `pegmask serve` does). Times are
medians over the runs: **to first mask** (from the schema's text, or the tool list, to the
first mask filled) and the **first mask** alone (matcher creation and the fill; pegmask's
tool grammar is the dialect at its defaults, so its first mask is at the turn's start, where
reasoning may open). pegmask's figures are also split into its stages: the grammar (front-end
and instruction program), binding it to the vocabulary (`compile_grammar`), the first mask.

    pegmask bench compile [--quick] [--enums 1000,5000,20000] [--tools 10,50,200,500] [--runs 3]
        [--out FILE.md]
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import string
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pegmask.bench.bfcl import CATEGORIES, load_category, tools
from pegmask.bench.grammar_engines import CompileError, Engine, Pegmask, XGrammar, make_engine
from pegmask.bench.grammar_inputs import load_model
from pegmask.bench.plots import scaling
from pegmask.bench.reporting import (
    RESULTS_DIR,
    command_line,
    machine,
    machine_info,
    publish,
    write_json,
)

ENGINES = ("pegmask", "xgrammar", "llguidance")
# xgrammar with its compiled-grammar cache off (on by default): a column after the defaults,
# since a compile with the cache on also builds what the cache keeps.
XGRAMMAR_NO_CACHE = "xgrammar, cache off"
COLUMNS = (*ENGINES, XGRAMMAR_NO_CACHE)
DEFAULTS = {"enums": (1000, 5000, 20000), "tools": (10, 50, 200, 500), "runs": 3}
QUICK = {"enums": (1000, 5000), "tools": (10, 50, 200), "runs": 2}
DIALECT = "hermes"


# ----------------------------------------------------------------------------- inputs
def enum_words(count: int, seed: int = 0) -> list[str]:
    """`count` distinct random lowercase words of 3-12 letters, in random order."""
    rng = random.Random(seed)
    words: set[str] = set()
    while len(words) < count:
        words.add("".join(rng.choices(string.ascii_lowercase, k=rng.randint(3, 12))))
    ordered = sorted(words)
    rng.shuffle(ordered)
    return ordered


def bfcl_tools(count: int) -> list[dict[str, Any]]:
    """The first `count` distinct (by name) BFCL tools, category by category."""
    found: dict[str, dict[str, Any]] = {}
    for category in CATEGORIES:
        for question in load_category(category):
            for tool in tools(question):
                found.setdefault(tool["function"]["name"], tool)
        if len(found) >= count:
            break
    if len(found) < count:
        raise ValueError(f"BFCL has {len(found)} distinct tools, fewer than {count}")
    return list(found.values())[:count]


def call_schema(tool_list: Sequence[dict[str, Any]], run: int) -> dict[str, Any]:
    """The peers' JSON Schema of one call to any of the tools (see the module docstring)."""
    return {"description": f"one tool call, run {run}", "anyOf": [{
        "type": "object",
        "properties": {"name": {"const": tool["function"]["name"]},
                       "arguments": tool["function"]["parameters"]},
        "required": ["name", "arguments"], "additionalProperties": False,
    } for tool in tool_list]}


# ----------------------------------------------------------------------------- measuring
def _timed(work: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    result = work()
    return result, (time.perf_counter() - start) * 1e3


def measure_pegmask(engine: Pegmask, build: Callable[[], Any]) -> dict[str, float]:
    """pegmask's stages: the grammar (`build` compiles its program), binding, first mask."""
    from pegmask.grammars.compiler import compile_grammar

    grammar, grammar_ms = _timed(lambda: build().compile())
    compiled, bind_ms = _timed(lambda: compile_grammar(grammar, engine.vocab))
    _, mask_ms = _timed(lambda: engine.fill(engine.matcher(compiled))())
    return {"grammar_ms": grammar_ms, "bind_ms": bind_ms, "first_mask_ms": mask_ms,
            "to_first_mask_ms": grammar_ms + bind_ms + mask_ms}


def measure_peer(engine: Engine, schema: dict[str, Any]) -> dict[str, float]:
    """A peer's compile of the schema's text, and its first mask."""
    text = json.dumps(schema)
    compiled, compile_ms = _timed(lambda: engine.compile("json_schema", text))
    _, mask_ms = _timed(lambda: engine.fill(engine.matcher(compiled))())
    return {"compile_ms": compile_ms, "first_mask_ms": mask_ms,
            "to_first_mask_ms": compile_ms + mask_ms}


def enum_case(engines: dict[str, Engine], count: int, runs: int) -> dict[str, Any]:
    from pegmask.grammars import Grammar

    words = enum_words(count)

    def schema(run: int) -> dict[str, Any]:
        return {"description": f"enum, run {run}", "enum": words}

    def pegmask(engine: Pegmask, run: int) -> dict[str, float]:
        return measure_pegmask(engine, lambda: Grammar.from_json_schema(schema(run)))

    return _case(engines, runs, pegmask, schema)


def tools_case(engines: dict[str, Engine], count: int, runs: int) -> dict[str, Any]:
    from pegmask.dialects.registry import get_dialect
    from pegmask.dialects.request import ChatRequest

    tool_list = bfcl_tools(count)

    def pegmask(engine: Pegmask, _run: int) -> dict[str, float]:
        # a new dialect object each run: its grammar cache starts empty
        request = ChatRequest(tools=tool_list, tool_choice="required")
        return measure_pegmask(engine, lambda: get_dialect(DIALECT).grammar(request))

    return _case(engines, runs, pegmask, lambda run: call_schema(tool_list, run))


def _case(engines: dict[str, Engine], runs: int,
          pegmask: Callable[[Pegmask, int], dict[str, float]],
          schema: Callable[[int], dict[str, Any]]) -> dict[str, Any]:
    """Medians over `runs` of each engine's figures (or its error), engines rotating."""
    figures: dict[str, list[dict[str, float]]] = {name: [] for name in engines}
    errors: dict[str, str] = {}
    names = list(engines)
    for run in range(runs):
        for name in names[run % len(names):] + names[: run % len(names)]:
            if name in errors:
                continue
            gc.collect()
            engine = engines[name]
            try:
                if isinstance(engine, Pegmask):
                    figures[name].append(pegmask(engine, run))
                else:
                    figures[name].append(measure_peer(engine, schema(run)))
            except CompileError as exc:
                errors[name] = str(exc)[:200]
    return {name: ({"error": errors[name]} if name in errors else
                   {key: statistics.median(run[key] for run in figures[name])
                    for key in figures[name][0]}) for name in engines}


# ----------------------------------------------------------------------------- report
def _cell(figures: dict[str, float] | None) -> str:
    if figures is None:  # an engine this run did not measure
        return "-"
    if "error" in figures:
        return "error"
    return f"{figures['to_first_mask_ms']:.1f} ({figures['first_mask_ms']:.2f})"


def report(results: dict[str, Any], argv: Sequence[str]) -> str:
    lines = ["# Compile time of large alternations (SmolLM2's vocabulary)", "",
             __doc__.split("\n\n")[0].replace("\n", " "), "",
             "\n".join(__doc__.split("\n\n")[1:4]), "",
             f"Reproduce: `{command_line('compile', argv)}`", "", machine_info(), ""]
    for kind, label in (("enums", "strings"), ("tools", "tools")):
        rows = results[kind]
        if not rows:
            continue
        lines += [f"## {kind.capitalize()}: ms to the first mask (first mask alone)", "",
                  f"| {label} | " + " | ".join(COLUMNS) + " | pegmask / xgrammar "
                  "| pegmask grammar / bind / first mask |",
                  "|---:|" + "---:|" * (len(COLUMNS) + 2)]
        for size, engines in rows.items():
            ours, xgr = engines["pegmask"], engines["xgrammar"]
            ratio = ("" if "error" in ours or "error" in xgr
                     else f"{ours['to_first_mask_ms'] / xgr['to_first_mask_ms']:.2f}x")
            stages = ("" if "error" in ours else
                      f"{ours['grammar_ms']:.1f} / {ours['bind_ms']:.1f} / "
                      f"{ours['first_mask_ms']:.2f}")
            lines.append(f"| {size:,} | " + " | ".join(_cell(engines.get(n)) for n in COLUMNS)
                         + f" | {ratio} | {stages} |")
        lines.append("")
        errors = [f"- {name}, {size:,}: {figures['error']}" for size, engines in rows.items()
                  for name, figures in engines.items() if "error" in figures]
        lines += [*errors, ""] if errors else []
    return "\n".join(lines)


def plot(results: dict[str, Any], out: Path) -> Path:
    panels = {}
    for kind, label in (("enums", "enum strings"), ("tools", "tools")):
        if results[kind]:
            panels[label] = {name: [(int(size), engines[name]["to_first_mask_ms"])
                                    for size, engines in results[kind].items()
                                    if "error" not in engines[name]] for name in COLUMNS
                               if name in next(iter(results[kind].values()))}
    return scaling(panels, title="Compile to the first mask (SmolLM2)", ylabel="ms", out=out)


def _sizes(text: str) -> tuple[int, ...]:
    sizes = tuple(int(part) for part in text.split(",") if part)
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError("a comma-separated list of positive counts")
    return sizes


def main(argv: Sequence[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(prog="pegmask bench compile",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"enums {QUICK['enums']}, tools {QUICK['tools']}, "
                        f"{QUICK['runs']} runs")
    parser.add_argument("--enums", type=_sizes, help="enum sizes (default 1000,5000,20000)")
    parser.add_argument("--tools", type=_sizes, help="tool counts (default 10,50,200,500)")
    parser.add_argument("--runs", type=int, help="fresh compiles per case (default 3)")
    parser.add_argument("--out", type=Path, help="markdown report (JSON and PNG beside it; "
                        "default bench/results/compile_scale[_quick].md)")
    args = parser.parse_args(argv)
    settings = {**DEFAULTS, **(QUICK if args.quick else {}),
                **{key: value for key in DEFAULTS if (value := getattr(args, key)) is not None}}
    if settings["runs"] < 1:
        parser.error("--runs must be at least 1")
    out = args.out or RESULTS_DIR / f"compile_scale{'_quick' if args.quick else ''}.md"
    model = load_model("smollm2")
    engines = {name: make_engine(name, "default", model) for name in ENGINES}
    engines[XGRAMMAR_NO_CACHE] = XGrammar(model, cache_enabled=False)
    enum_case(engines, 10, 1)  # warm-up: the process's one-time costs (imports, lazy tables)
    tools_case(engines, 2, 1)
    # What is loaded by now (the model, its vocabulary and tries, the peers) lives as long as
    # the process: frozen out of the collector's reach, as `pegmask serve` and the grammar
    # bench do. Else a full collection that a compile's garbage sets off walks all of it
    # (0.2 s, once in five compiles of 200 tools), a stall that no pegmask server has.
    gc.collect()
    gc.freeze()
    results: dict[str, Any] = {"enums": {}, "tools": {}}
    for count in settings["enums"]:
        results["enums"][count] = enum_case(engines, count, settings["runs"])
    for count in settings["tools"]:
        results["tools"][count] = tools_case(engines, count, settings["runs"])
    for engine in engines.values():
        engine.close()
    publish(report(results, argv), out)
    write_json({"settings": settings, "machine": machine(), "results": results},
               out.with_suffix(".json"))
    plot(results, out.with_suffix(".png"))


if __name__ == "__main__":
    main()
