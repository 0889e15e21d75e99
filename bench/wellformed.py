"""Well-formed at the budget's edge: how many constrained outputs parse and validate when
max_tokens cuts them, before and after closing under the budget and strict tool arguments.

The embedded model (or `--model`) answers six prompts with three tools, under
`tool_choice="required"` and `"auto"`, and two prompts under a `response_format` JSON schema,
at several budgets (`--budgets 40,80,160,400`) and seeds, twice:

* **before**: `close_on_length=False` and plain JSON Schema tool arguments
  (`strict_tool_arguments=False`): what pegmask did before, and what other engines do;
* **after**: the defaults (closing under the budget, strict arguments).

Per mode, budget and variant: outputs, those refused before decoding (a 400: the budget is
below the grammar's shortest output), those holding a call (tools) or an answer (JSON), the
share whose calls / answers parse as JSON, the share that validate against their schema, and
the mean output tokens. Results: bench/results/wellformed.md (+ .json).

    pegmask bench wellformed [--quick] [--budgets 40,80,160,400] [--seeds 3] [--model PATH]
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema

from pegmask.bench.reporting import RESULTS_DIR, publish, write_json
from pegmask.engine import Engine, InvalidRequestError

RESULTS = RESULTS_DIR / "wellformed.md"
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "unit": {"type": "string",
                                                 "enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"]}}},
    {"type": "function", "function": {
        "name": "create_event", "description": "Put an event in the calendar",
        "parameters": {"type": "object", "properties": {
            "title": {"type": "string"}, "description": {"type": "string"},
            "date": {"type": "string"}, "attendees": {"type": "array",
                                                      "items": {"type": "string"}}},
            "required": ["title", "description", "date"]}}},
    {"type": "function", "function": {
        "name": "set_reminder", "description": "Remind the user of something",
        "parameters": {"type": "object", "properties": {
            "text": {"type": "string"}, "minutes": {"type": "integer"}},
            "required": ["text", "minutes"]}}},
]
TOOL_PROMPTS = [
    "What's the weather like in Reykjavik right now?",
    "Create an event for the LIFES stock market platform launch with a detailed description.",
    "Remind me to call my grandmother about her garden in an hour and a half.",
    "Plan a team offsite in Lisbon next month and tell everybody about it.",
    "Is it going to be cold in Montreal this evening? Use celsius.",
    "Set up a long meeting about the quarterly budget review with the finance team.",
]
SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string"}, "population_millions": {"type": "number"},
    "landmarks": {"type": "array", "items": {"type": "string"}},
    "summary": {"type": "string"},
}, "required": ["name", "population_millions", "landmarks", "summary"],
    "additionalProperties": False}
JSON_PROMPTS = ["Describe the city of Paris as JSON.", "Describe Tokyo in detail as JSON."]
MODES = ("required", "auto", "json")
VARIANTS = {"before": {"close_on_length": False}, "after": {}}


@dataclass
class Cell:
    """The outputs of one (mode, budget, variant)."""

    outputs: int = 0
    refused: int = 0
    answered: int = 0  # held a call (tools) or any text (json)
    parsed: int = 0
    valid: int = 0
    tokens: list[int] = field(default_factory=list)

    def row(self) -> dict[str, Any]:
        decoded = self.outputs - self.refused
        return {"outputs": self.outputs, "refused": self.refused, "answered": self.answered,
                "parse": self.parsed / self.answered if self.answered else None,
                "valid": self.valid / self.answered if self.answered else None,
                "mean_tokens": sum(self.tokens) / decoded if decoded else None}


def requests(mode: str, budget: int, seeds: int, prompts: int) -> list[dict[str, Any]]:
    out = []
    questions = JSON_PROMPTS if mode == "json" else TOOL_PROMPTS[:prompts]
    for question in questions:
        for seed in range(seeds):
            item: dict[str, Any] = {"messages": [{"role": "user", "content": question}],
                                    "max_tokens": budget, "temperature": 1.0, "seed": seed}
            if mode == "json":
                item["response_format"] = {"type": "json_schema",
                                           "json_schema": {"name": "city", "schema": SCHEMA}}
            else:
                item["tools"] = TOOLS
                item["tool_choice"] = mode
            out.append(item)
    return out


def score(cell: Cell, mode: str, result: Any) -> None:
    cell.tokens.append(result.usage["completion_tokens"])
    if mode == "json":
        cell.answered += 1
        try:
            value = json.loads(result.message["content"] or "")
        except ValueError:
            return
        cell.parsed += 1
        cell.valid += jsonschema.Draft202012Validator(SCHEMA).is_valid(value)
        return
    calls = result.message["tool_calls"]
    if not calls:
        return
    cell.answered += 1
    schemas = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}
    try:
        arguments = [(c["function"]["name"], json.loads(c["function"]["arguments"]))
                     for c in calls]
    except ValueError:
        return
    cell.parsed += 1
    # Validated as a strict tool schema: no keys beyond the declared ones.
    cell.valid += all(
        name in schemas and jsonschema.Draft202012Validator(
            {**schemas[name], "additionalProperties": False}).is_valid(value)
        for name, value in arguments)


def run(model: str | None, budgets: list[int], seeds: int, prompts: int,
        modes: list[str]) -> dict[tuple[str, int, str], Cell]:
    from tqdm import tqdm

    cells: dict[tuple[str, int, str], Cell] = {}
    engines = {"before": Engine(model, strict_tool_arguments=False), "after": Engine(model)}
    plan = [(mode, budget, variant) for mode in modes for budget in budgets
            for variant in VARIANTS]
    with tqdm(total=len(plan), desc="cells", file=sys.stderr) as progress:
        for mode, budget, variant in plan:
            engine = engines[variant]
            cell = cells[(mode, budget, variant)] = Cell()
            items = [{**item, **VARIANTS[variant]}
                     for item in requests(mode, budget, seeds, prompts)]
            for result in engine.generate_batch(items, return_errors=True):
                cell.outputs += 1
                if isinstance(result, InvalidRequestError):
                    cell.refused += 1
                else:
                    score(cell, mode, result)
            progress.update(1)
    for engine in engines.values():
        engine.close()
    return cells


def report(cells: dict[tuple[str, int, str], Cell], meta: dict[str, Any]) -> str:
    lines = ["# Well-formed at the budget's edge", "",
             f"{meta['date']}; model `{meta['model']}`; {meta['machine']}; temperature 1.0, "
             f"{meta['seeds']} seeds per prompt. Command: `{meta['command']}`", "",
             "before: `close_on_length=False`, plain JSON Schema tool arguments; after: the "
             "defaults. `answered`: outputs holding a call (required / auto) or an answer "
             "(json); parse / valid are shares of those (valid: against the schema with no "
             "extra keys); refused: a 400 because the budget is below the grammar's shortest "
             "output.", "",
             "| mode | max_tokens | variant | outputs | refused | answered | parse | valid | "
             "mean tokens |", "|---|---|---|---|---|---|---|---|---|"]
    for (mode, budget, variant), cell in cells.items():
        row = cell.row()
        lines.append(f"| {mode} | {budget} | {variant} | {row['outputs']} | {row['refused']} | "
                     f"{row['answered']} | {_share(row['parse'])} | {_share(row['valid'])} | "
                     f"{_number(row['mean_tokens'])} |")
    return "\n".join(lines) + "\n"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pegmask bench wellformed", description=__doc__)
    parser.add_argument("--model")
    parser.add_argument("--budgets", default="40,80,160,400")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=len(TOOL_PROMPTS))
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--quick", action="store_true",
                        help="budgets 40 and 80, two tool prompts, one seed")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.quick:
        args.budgets, args.seeds, args.prompts = "40,80", 1, 2
    budgets = [int(b) for b in args.budgets.split(",")]
    modes = [m for m in args.modes.split(",") if m]
    if not modes or set(modes) - set(MODES):
        parser.error(f"--modes takes {', '.join(MODES)}")
    cells = run(args.model, budgets, args.seeds, args.prompts, modes)
    meta = {"date": datetime.date.today().isoformat(), "model": args.model or "SmolLM2-135M",
            "machine": f"{platform.machine()}, Python {platform.python_version()}",
            "seeds": args.seeds,
            "command": "pegmask bench wellformed " + " ".join(
                argv if argv is not None else sys.argv[1:])}
    publish(report(cells, meta), args.out)
    write_json({"meta": meta, "cells": [{"mode": m, "max_tokens": b, "variant": v, **c.row()}
                                        for (m, b, v), c in cells.items()]},
               args.out.with_suffix(".json"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
