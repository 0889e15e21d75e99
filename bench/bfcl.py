"""The Berkeley Function Calling Leaderboard, offline: its questions, tool specs and answers,
and its AST checker, from the `bfcl-eval` package (installed with `--no-deps` by
scripts/install.sh; its declared dependencies are the hosted-model SDKs of its own runner,
which this bench does not use).

Facts this module relies on (bfcl-eval 2026.3.23):

* questions are `bfcl_eval/data/BFCL_v4_<category>.json`, one JSON object a line (`id`,
  `question`: a list of turns, each a list of messages; `function`: tool specs in BFCL types);
  answers are `data/possible_answer/BFCL_v4_<category>.json`, aligned by `id` (irrelevance
  categories have none: they pass only with no call);
* the checker, `bfcl_eval.eval_checker.ast_eval.ast_checker.ast_checker`, imports
  `bfcl_eval.constants.model_config`, which imports every hosted-model SDK; it only reads
  `MODEL_CONFIG_MAPPING[name].underscore_to_dot`, so a stand-in module answers that
  (`underscore_to_dot=False`: dotted function names such as `math.factorial` are kept, as this
  bench gives them to the model);
* BFCL types map to JSON Schema by the package's `GORILLA_TO_OPENAPI` (dict -> object,
  float -> number, tuple -> array, any -> string); the checker wants a Python `float` where
  BFCL says float inside an array (a bare `5` in `[5, 2.5]` fails it), so such numbers are
  read as floats (`read_arguments`), in every mode alike.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import random
import sys
import tempfile
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

INSTALL_HINT = ('pip install --no-deps "bfcl-eval==2026.3.23" (scripts/install.sh does it; '
                "--no-deps: its dependencies are hosted-model SDKs this bench does not use)")
CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple", "irrelevance",
              "live_simple", "live_multiple", "live_parallel", "live_parallel_multiple",
              "live_irrelevance")
PYTHON_HINT = " Note that the provided function is in Python 3 syntax."  # BFCL's own suffix
CHECKER_MODEL_NAME = "pegmask"
_DROPPED_KEYS = ("optional",)  # BFCL-only annotations, not JSON Schema


class BFCLNotInstalled(RuntimeError):
    """bfcl-eval is missing: the message says how to install it."""


def data_dir() -> Path:
    """The `data` folder of the installed bfcl-eval package (nothing of it is imported)."""
    spec = importlib.util.find_spec("bfcl_eval")
    if spec is None or not spec.submodule_search_locations:
        raise BFCLNotInstalled(f"the BFCL bench needs bfcl-eval: {INSTALL_HINT}")
    return Path(next(iter(spec.submodule_search_locations))) / "data"


def is_irrelevance(category: str) -> bool:
    """Categories whose questions no given function answers: correct means no call."""
    return category.endswith("irrelevance")


def is_parallel(category: str) -> bool:
    """Categories whose answers may hold several calls (BFCL checks them in any order)."""
    return "parallel" in category


@dataclass(frozen=True)
class Question:
    """One BFCL question: the first turn's messages, the functions in BFCL types, and the
    possible answers (None for irrelevance: no call is right)."""

    id: str
    category: str
    messages: list[dict[str, Any]]
    functions: list[dict[str, Any]]
    answers: list[dict[str, Any]] | None


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip()]


def load_category(category: str) -> list[Question]:
    """Every question of `category`, with its answers."""
    if category not in CATEGORIES:
        raise ValueError(f"unknown BFCL category {category!r}: {', '.join(CATEGORIES)}")
    folder = data_dir()
    entries = _lines(folder / f"BFCL_v4_{category}.json")
    answers: dict[str, Any] = {}
    if not is_irrelevance(category):
        answers = {a["id"]: a["ground_truth"]
                   for a in _lines(folder / "possible_answer" / f"BFCL_v4_{category}.json")}
    questions = []
    for entry in entries:
        if len(entry["question"]) != 1:
            raise ValueError(f"{entry['id']}: a multi-turn question, which this bench does not "
                             "run")
        if not is_irrelevance(category) and entry["id"] not in answers:
            raise ValueError(f"{entry['id']}: no possible answer in bfcl-eval's data")
        questions.append(Question(entry["id"], category, entry["question"][0],
                                  entry["function"], answers.get(entry["id"])))
    return questions


def sample(questions: list[Question], count: int | None, seed: int) -> list[Question]:
    """`count` questions drawn with `seed` (all when `count` is None or larger), in file
    order."""
    if count is None or count >= len(questions):
        return list(questions)
    picked = sorted(random.Random(seed).sample(range(len(questions)), count))
    return [questions[i] for i in picked]


# ----------------------------------------------------------------------------- tool specs


def _gorilla_to_openapi() -> Mapping[str, str]:
    data_dir()  # a clear message when the package is missing
    from bfcl_eval.constants.type_mappings import GORILLA_TO_OPENAPI

    return GORILLA_TO_OPENAPI


def json_schema(spec: Mapping[str, Any]) -> dict[str, Any]:
    """A BFCL parameter spec as JSON Schema: types mapped (unknown ones become string, as
    BFCL does), nested properties and items converted, BFCL-only keys dropped."""
    mapping = _gorilla_to_openapi()
    schema = {key: copy.deepcopy(value) for key, value in spec.items()
              if key not in _DROPPED_KEYS and key not in ("properties", "items")}
    schema["type"] = mapping.get(spec.get("type", "string"), "string")
    if "properties" in spec:
        schema["properties"] = {name: json_schema(value)
                                for name, value in spec["properties"].items()}
    if "items" in spec:
        schema["items"] = json_schema(spec["items"])
    return schema


def tools(question: Question) -> list[dict[str, Any]]:
    """The question's functions as OpenAI tools, with BFCL's Python-syntax note appended to
    each description (what BFCL sends every function-calling model on these categories)."""
    return [{"type": "function", "function": {
        "name": function["name"],
        "description": function.get("description", "") + PYTHON_HINT,
        "parameters": json_schema(function["parameters"]),
    }} for function in question.functions]


def _floats_in_arrays(value: Any, spec: Mapping[str, Any], in_array: bool) -> Any:
    kind = spec.get("type")
    if kind == "float" and in_array and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind in ("array", "tuple") and isinstance(value, list) and "items" in spec:
        return [_floats_in_arrays(item, spec["items"], True) for item in value]
    if kind == "dict" and isinstance(value, dict) and "properties" in spec:
        props = spec["properties"]
        return {key: _floats_in_arrays(item, props[key], in_array) if key in props else item
                for key, item in value.items()}
    return value


def read_arguments(arguments: str, function: Mapping[str, Any] | None) -> Any:
    """A call's JSON arguments as the checker wants them: numbers where BFCL says float inside
    an array read as floats. Raises ValueError when they are not JSON."""
    value = json.loads(arguments)
    if function is None or not isinstance(value, dict):
        return value
    return _floats_in_arrays(value, function["parameters"], False)


# ----------------------------------------------------------------------------- checker


class _CheckerModelConfig:
    underscore_to_dot = False


class _AnyModel(dict):
    """`MODEL_CONFIG_MAPPING` stand-in: every model keeps dotted function names."""

    def __missing__(self, name: str) -> _CheckerModelConfig:
        return _CheckerModelConfig()


def ast_checker() -> Callable[..., dict[str, Any]]:
    """bfcl-eval's AST checker, imported without the hosted-model SDKs (see the module
    docstring). `BFCL_PROJECT_ROOT` points at a temporary folder first, for bfcl-eval
    versions whose import writes `result/` and `score/` under it."""
    data_dir()
    name = "bfcl_eval.constants.model_config"
    if name not in sys.modules:
        stand_in = types.ModuleType(name)
        stand_in.__doc__ = "pegmask's stand-in: only what the AST checker reads"
        stand_in.MODEL_CONFIG_MAPPING = _AnyModel()  # type: ignore[attr-defined]
        sys.modules[name] = stand_in
    os.environ.setdefault("BFCL_PROJECT_ROOT", tempfile.mkdtemp(prefix="pegmask-bfcl-"))
    from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker as checker

    return checker


def check(question: Question, calls: list[dict[str, Any]]) -> bool:
    """Whether `calls` (`[{name: arguments}]`, arguments read by `read_arguments`) answer
    `question` by BFCL's AST checker; for an irrelevance question, whether there is none."""
    if question.answers is None:
        return not calls
    from bfcl_eval.constants.enums import Language

    checker = ast_checker()
    try:
        result = checker(question.functions, calls, question.answers, Language.PYTHON,
                         question.category, CHECKER_MODEL_NAME)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError):
        return False  # output the checker cannot read (e.g. arguments that are not an object)
    return bool(result["valid"])
