"""render_chat_template must produce transformers' apply_chat_template bytes for real templates."""

from __future__ import annotations

import copy
import csv
import hashlib
import json
from pathlib import Path

import jinja2
import pytest
import tokenizers
import transformers
from vocabularies import smollm2_gguf_path

from pegmask.bench.data import TEMPLATES_DIR
from pegmask.dialects.templating import (
    ChatTemplateError,
    ChatTemplateNotFoundError,
    ReservedTemplateVariableError,
    detect_content_format,
    render_chat_template,
    render_history,
    resolve_chat_template,
)

TEMPLATES = TEMPLATES_DIR


def _provenance() -> list[dict[str, str]]:
    with open(TEMPLATES / "PROVENANCE.tsv", encoding="utf-8") as f:
        return list(csv.DictReader(f, delimiter="\t"))


TEMPLATE_FILES = [row["local_file"] for row in _provenance()] if TEMPLATES.is_dir() else []

# The special tokens each family's tokenizer defines (what apply_chat_template passes along).
SPECIAL_TOKENS = {
    "deepseek": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "DeepSeek": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "openai": ("<|startoftext|>", "<|return|>"),
    "llm-jp": ("<|startoftext|>", "<|return|>"),
    "NousResearch": ("<|begin_of_text|>", "<|im_end|>"),
}


def _special_tokens(name: str) -> tuple[str, str]:
    return next((v for k, v in SPECIAL_TOKENS.items() if name.startswith(k)), ("<s>", "<|im_end|>"))


_TOKENIZERS: dict[tuple[str, str], object] = {}


def hf_tokenizer(bos: str, eos: str):
    """A real transformers tokenizer built locally (nothing downloaded)."""
    if (bos, eos) not in _TOKENIZERS:
        vocab = {bos: 0, eos: 1, "[UNK]": 2}
        model = tokenizers.models.WordLevel(vocab, unk_token="[UNK]")
        _TOKENIZERS[bos, eos] = transformers.PreTrainedTokenizerFast(
            tokenizer_object=tokenizers.Tokenizer(model),
            bos_token=bos,
            eos_token=eos,
            unk_token="[UNK]",
        )
    return _TOKENIZERS[bos, eos]


# --------------------------------------------------------------------------------------------
# The battery: conversations every template is rendered with
# --------------------------------------------------------------------------------------------

NESTED_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": 'Weather for a <city> & its "area" — 東京 too',
            "parameters": {
                "type": "object",
                "properties": {
                    "zone": {"type": "string", "description": "Zone <b>name</b>"},
                    "units": {"type": "string", "enum": ["c", "f"], "default": "c"},
                    "opts": {
                        "type": "object",
                        "properties": {
                            "zz": {"type": "integer"},
                            "aa": {"type": "array", "items": {"type": "string"}},
                        },
                        "required": ["zz"],
                    },
                    "days": {"type": "integer", "description": "How many days"},
                },
                "required": ["zone"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the web",
            "parameters": {
                "type": "object",
                "properties": {"q": {"type": "string", "description": "Query"}},
                "required": ["q"],
            },
        },
    },
]

UNICODE = "日本語 <b>bold</b> & \"quotes\" 'apos' é ß 🚀 \\backslash\\ </script>"


def _call(call_id: str, name: str, arguments) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


CONVERSATIONS: dict[str, tuple[list[dict], list[dict] | None]] = {
    "plain": ([{"role": "user", "content": "Hello"}], None),
    "system": (
        [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}],
        None,
    ),
    "multi_turn": (
        [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "Tell me a joke"},
        ],
        None,
    ),
    "tools_unsorted_schema": (
        [{"role": "system", "content": "Use tools."}, {"role": "user", "content": "Weather?"}],
        NESTED_TOOLS,
    ),
    "unicode_html": (
        [
            {"role": "system", "content": UNICODE},
            {"role": "user", "content": UNICODE},
            {"role": "assistant", "content": UNICODE},
            {"role": "user", "content": "again: " + UNICODE},
        ],
        NESTED_TOOLS,
    ),
    "call_string_arguments": (
        [
            {"role": "user", "content": "Weather in 東京?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [_call("c1", "get_weather", '{"zone": "東京", "days": 2}')],
            },
            {
                "role": "tool",
                "tool_call_id": "c1",
                "name": "get_weather",
                "content": '{"temp": 20}',
            },
        ],
        NESTED_TOOLS,
    ),
    "call_object_arguments": (
        [
            {"role": "user", "content": "Weather in 東京?"},
            {
                "role": "assistant",
                "content": "Checking <now>.",
                "tool_calls": [_call("c1", "get_weather", {"zone": "東京", "opts": {"zz": 1}})],
            },
            {
                "role": "tool",
                "tool_call_id": "c1",
                "name": "get_weather",
                "content": "sunny & 20°C",
            },
        ],
        NESTED_TOOLS,
    ),
    "parallel_results_then_answer": (
        [
            {"role": "system", "content": "Use tools."},
            {"role": "user", "content": "Weather in Tokyo and Osaka?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    _call("a", "get_weather", {"zone": "Tokyo"}),
                    _call("b", "get_weather", {"zone": "Osaka"}),
                ],
            },
            {"role": "tool", "tool_call_id": "a", "name": "get_weather", "content": '{"temp": 20}'},
            {"role": "tool", "tool_call_id": "b", "name": "get_weather", "content": '{"temp": 22}'},
            {"role": "assistant", "content": "Tokyo 20, Osaka 22."},
            {"role": "user", "content": "Thanks"},
        ],
        NESTED_TOOLS,
    ),
    "reasoning_in_history": (
        [
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "4", "reasoning_content": "Simple <math>."},
            {"role": "user", "content": "3+3?"},
        ],
        None,
    ),
    "reasoning_in_tool_loop": (
        [
            {"role": "user", "content": "Weather?"},
            {
                "role": "assistant",
                "content": "",
                "reasoning_content": "Need the weather tool.",
                "tool_calls": [_call("c9", "get_weather", {"zone": "Kyoto"})],
            },
            {"role": "tool", "tool_call_id": "c9", "name": "get_weather", "content": "rain"},
        ],
        NESTED_TOOLS,
    ),
    "think_tags_in_content": (
        [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nHello"},
            {"role": "user", "content": "Bye"},
        ],
        None,
    ),
    "null_content_tool_call": (
        [
            {"role": "user", "content": "Search cats"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [_call("s", "search", '{"q": "cats"}')],
            },
            {"role": "tool", "tool_call_id": "s", "name": "search", "content": "many cats"},
        ],
        NESTED_TOOLS,
    ),
    "content_parts": (
        [
            {"role": "system", "content": [{"type": "text", "text": "Be kind."}]},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Part one."},
                    {"type": "text", "text": "Two."},
                ],
            },
        ],
        None,
    ),
    "assistant_last": (
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello there"}],
        None,
    ),
}

VARIANTS = [
    (add_generation_prompt, kwargs)
    for add_generation_prompt in (False, True)
    for kwargs in ({}, {"enable_thinking": True}, {"enable_thinking": False})
]


def _outcome(render, *args, **kwargs) -> tuple[str, str]:
    try:
        return "ok", render(*args, **kwargs)
    except Exception as error:  # parity includes failing the same way
        return "error", type(error).__name__


def test_provenance_lists_every_template_with_its_hash():
    rows = _provenance()
    assert sorted(row["local_file"] for row in rows) == sorted(
        p.name for p in TEMPLATES.glob("*.jinja")
    )
    for row in rows:
        data = (TEMPLATES / row["local_file"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == row["sha256"]


@pytest.mark.parametrize("conversation", sorted(CONVERSATIONS))
@pytest.mark.parametrize("template_file", TEMPLATE_FILES)
def test_byte_parity_with_transformers(template_file: str, conversation: str):
    template = (TEMPLATES / template_file).read_text(encoding="utf-8")
    messages, tools = CONVERSATIONS[conversation]
    bos, eos = _special_tokens(template_file)
    tokenizer = hf_tokenizer(bos, eos)
    for add_generation_prompt, kwargs in VARIANTS:
        expected = _outcome(
            tokenizer.apply_chat_template,
            copy.deepcopy(messages),
            tools=copy.deepcopy(tools),
            chat_template=template,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            **kwargs,
        )
        got = _outcome(
            render_chat_template,
            template,
            messages,
            tools,
            add_generation_prompt,
            bos_token=bos,
            eos_token=eos,
            unk_token="[UNK]",
            **kwargs,
        )
        assert got == expected, (add_generation_prompt, kwargs)


@pytest.mark.parametrize("template_file", TEMPLATE_FILES)
def test_continue_final_message_parity(template_file: str):
    template = (TEMPLATES / template_file).read_text(encoding="utf-8")
    messages = [
        {"role": "user", "content": "Write a haiku"},
        {"role": "assistant", "content": "Autumn moonlight   ", "reasoning_content": "A poem."},
    ]
    bos, eos = _special_tokens(template_file)
    tokenizer = hf_tokenizer(bos, eos)
    for field in (True, "reasoning_content"):
        expected = _outcome(
            tokenizer.apply_chat_template,
            copy.deepcopy(messages),
            chat_template=template,
            tokenize=False,
            continue_final_message=field,
        )
        got = _outcome(
            render_chat_template,
            template,
            messages,
            continue_final_message=field,
            bos_token=bos,
            eos_token=eos,
            unk_token="[UNK]",
        )
        assert got == expected


def test_continue_final_message_trims_after_the_text():
    template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>\n{% endfor %}"
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hel"}]
    assert render_chat_template(template, messages, continue_final_message=True) == (
        "<user>Hi</user>\n<assistant>Hel"
    )
    with pytest.raises(ValueError, match="not compatible"):
        render_chat_template(
            template, messages, add_generation_prompt=True, continue_final_message=True
        )


def test_tojson_keeps_order_utf8_and_html_and_takes_options():
    value = {"z": "<b>&</b>", "a": ["é", 1], "m": {"y": None, "b": True}}
    assert render_chat_template("{{ v | tojson }}", [{"role": "user", "content": ""}], v=value) == (
        '{"z": "<b>&</b>", "a": ["é", 1], "m": {"y": null, "b": true}}'
    )
    template = (
        "{{ v | tojson(indent=2) }}|{{ v | tojson(sort_keys=True) }}|"
        "{{ v | tojson(ensure_ascii=True) }}|{{ v | tojson(separators=(',', ':')) }}"
    )
    got = render_chat_template(template, [{"role": "user", "content": ""}], v=value)
    assert got == "|".join(
        [
            json.dumps(value, ensure_ascii=False, indent=2),
            json.dumps(value, ensure_ascii=False, sort_keys=True),
            json.dumps(value, ensure_ascii=True),
            json.dumps(value, ensure_ascii=False, separators=(",", ":")),
        ]
    )
    expected = hf_tokenizer("<s>", "</s>").apply_chat_template(
        [{"role": "user", "content": ""}], chat_template=template, tokenize=False, v=value
    )
    assert got == expected


def test_tool_schema_key_order_reaches_the_prompt():
    template = (TEMPLATES / "Qwen-Qwen3-0.6B.jinja").read_text(encoding="utf-8")
    prompt = render_chat_template(template, [{"role": "user", "content": "x"}], NESTED_TOOLS)
    assert json.dumps(NESTED_TOOLS[0], ensure_ascii=False) in prompt
    assert (
        prompt.index('"zone"')
        < prompt.index('"units"')
        < prompt.index('"opts"')
        < prompt.index('"days"')
    )
    assert prompt.index('"zz"') < prompt.index('"aa"')


@pytest.mark.parametrize(
    "source",
    [
        "{{ ''.__class__.__mro__ }}",
        "{{ messages.__class__.__subclasses__() }}",
        "{% set x = [] %}{{ x.append(1) }}",
        "{% set ns = namespace() %}{% set ns._secret = 1 %}",
        "{{ namespace(__init__=1) }}",
    ],
)
def test_sandbox_refuses_escapes(source: str):
    with pytest.raises(jinja2.exceptions.SecurityError):
        render_chat_template(source, [{"role": "user", "content": "x"}])


def test_template_helpers():
    messages = [{"role": "user", "content": "x"}]
    with pytest.raises(jinja2.exceptions.TemplateError, match="nope"):
        render_chat_template("{{ raise_exception('nope') }}", messages)
    assert len(render_chat_template("{{ strftime_now('%Y-%m-%d') }}", messages)) == 10
    assert (
        render_chat_template(
            "{% for i in range(9) %}{% if i == 3 %}{% break %}{% endif %}{{ i }}{% endfor %}",
            messages,
        )
        == "012"
    )
    assert (
        render_chat_template(
            "{% for i in range(4) %}{% if i == 1 %}{% continue %}{% endif %}{{ i }}{% endfor %}",
            messages,
        )
        == "023"
    )
    assert render_chat_template("a{% generation %}b{% endgeneration %}c", messages) == "abc"
    assert render_chat_template("{{ dict(a=1) | tojson }}", messages) == '{"a": 1}'
    assert (
        render_chat_template("{% set ns = namespace(n=1) %}{% set ns.n = 2 %}{{ ns.n }}", messages)
        == "2"
    )


def test_template_variables_and_reserved_names():
    template = "{{ enable_thinking }}|{{ custom }}|{{ bos_token }}|{{ documents | tojson }}"
    messages = [{"role": "user", "content": "x"}]
    got = render_chat_template(
        template,
        messages,
        documents=[{"title": "T", "text": "body"}],
        chat_template_kwargs={"enable_thinking": False, "custom": "ok"},
        bos_token="<s>",
    )
    assert got == 'False|ok|<s>|[{"title": "T", "text": "body"}]'
    assert render_chat_template("{{ documents }}", messages) == "None"
    for name in ("messages", "tools", "add_generation_prompt", "raise_exception", "namespace"):
        with pytest.raises(ReservedTemplateVariableError, match=name):
            render_chat_template(template, messages, chat_template_kwargs={name: 1})
    assert issubclass(ReservedTemplateVariableError, ValueError)
    with pytest.raises(TypeError, match="Documents"):
        render_chat_template(template, messages, documents=["not a dict"])
    with pytest.raises(ValueError, match="empty conversation"):
        render_chat_template(template, [])


def test_callable_tools_are_converted_like_transformers():
    def get_time(zone: str, precise: bool = False):
        """Current time.

        Args:
            zone: The time zone.
            precise: Whether to include seconds.
        """

    template = "{{ tools | tojson }}"
    messages = [{"role": "user", "content": "x"}]
    expected = hf_tokenizer("<s>", "</s>").apply_chat_template(
        messages, tools=[get_time], chat_template=template, tokenize=False
    )
    assert render_chat_template(template, messages, [get_time]) == expected
    with pytest.raises(ValueError, match="JSON schema"):
        render_chat_template(template, messages, ["not a tool"])


def test_none_values_are_dropped_and_reasoning_is_aliased():
    template = "{% for m in messages %}{{ 'content' in m }}:{{ m.thinking }}:{{ m.reasoning_content }};{% endfor %}"
    messages = [
        {"role": "user", "content": None},
        {"role": "assistant", "content": "a", "reasoning": "r"},
    ]
    assert render_chat_template(template, messages) == "False::;True:r:r;"


# --------------------------------------------------------------------------------------------
# Content format and structured history
# --------------------------------------------------------------------------------------------


def test_detect_content_format():
    assert detect_content_format((TEMPLATES / "Qwen3.5-4B.jinja").read_text()) == "openai"
    assert detect_content_format((TEMPLATES / "Qwen-Qwen3-0.6B.jinja").read_text()) == "string"
    assert detect_content_format((TEMPLATES / "openai-gpt-oss-120b.jinja").read_text()) == "string"
    direct = "{% for message in messages %}{% for part in message['content'] %}{{ part.text }}{% endfor %}{% endfor %}"
    assert detect_content_format(direct) == "openai"
    through_set = "{% for m in messages[1:] %}{% set c = m.content %}{% for p in c %}{{ p.text }}{% endfor %}{% endfor %}"
    assert detect_content_format(through_set) == "openai"
    indexed = "{% for m in messages %}{{ m.content[0]['text'] }}{% endfor %}"
    assert detect_content_format(indexed) == "openai"
    assert (
        detect_content_format(
            "{% for m in messages %}{% for c in m.content.split() %}{% endfor %}{% endfor %}"
        )
        == "string"
    )


def test_render_history_gives_templates_the_content_form_they_read():
    parts = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}],
        }
    ]
    string_template = "{% for m in messages %}[{{ m.content }}]{% endfor %}"
    assert render_history(string_template, parts, add_generation_prompt=False) == "[one\ntwo]"
    parts_template = (
        "{% for m in messages %}{% for p in m.content %}<{{ p.text }}>{% endfor %}{% endfor %}"
    )
    assert (
        render_history(
            parts_template, [{"role": "user", "content": "solo"}], add_generation_prompt=False
        )
        == "<solo>"
    )
    assert render_history(parts_template, parts, add_generation_prompt=False) == "<one><two>"


def test_render_history_structured_calls_and_results():
    template = (
        "{% for m in messages %}{% if m.tool_calls %}{% for c in m.tool_calls %}"
        "{{ c.id }}={{ c.function.arguments.city }};{% endfor %}{% endif %}"
        "{% if m.role == 'tool' %}{% for prev in messages %}{% for c in prev.tool_calls or [] %}"
        "{% if c.id == m.tool_call_id %}result({{ c.function.name }}/{{ m.name }})={{ m.content }};{% endif %}"
        "{% endfor %}{% endfor %}{% endif %}{{ 'tool_calls' in m }},{% endfor %}"
    )
    messages = [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": "", "tool_calls": []},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [_call("k1", "weather", '{"city": "Paris"}')],
        },
        {"role": "tool", "tool_call_id": "k1", "content": "sunny"},
    ]
    assert render_history(template, messages, add_generation_prompt=False) == (
        "False,False,k1=Paris;True,result(weather/weather)=sunny;False,"
    )


def test_render_history_matches_template_on_native_messages():
    template = (TEMPLATES / "Qwen-Qwen3-0.6B.jinja").read_text(encoding="utf-8")
    messages, tools = CONVERSATIONS["parallel_results_then_answer"]
    assert render_history(template, messages, tools) == render_chat_template(
        template, messages, tools, True
    )


# --------------------------------------------------------------------------------------------
# Template resolution
# --------------------------------------------------------------------------------------------


def test_resolution_order(tmp_path: Path):
    own = "{{ 'model' }}"
    path = tmp_path / "t.jinja"
    path.write_text("{{ 'file' }}", encoding="utf-8")
    assert (
        resolve_chat_template("{{ 'explicit' }}", tokenizer_config={"chat_template": own})
        == "{{ 'explicit' }}"
    )
    assert (
        resolve_chat_template(str(path), tokenizer_config={"chat_template": own}) == "{{ 'file' }}"
    )
    assert resolve_chat_template(path) == "{{ 'file' }}"
    assert (
        resolve_chat_template(None, tokenizer_config={"chat_template": own}, default="{{ 'd' }}")
        == own
    )
    assert resolve_chat_template(None, tokenizer_config={}, default="{{ 'd' }}") == "{{ 'd' }}"
    assert resolve_chat_template(None, default=path) == "{{ 'file' }}"
    with pytest.raises(ChatTemplateNotFoundError):
        resolve_chat_template(
            str(tmp_path / "missing.jinja"), tokenizer_config={"chat_template": own}
        )
    with pytest.raises(ChatTemplateNotFoundError):
        resolve_chat_template("templates/missing.j2", default="{{ 'd' }}")
    with pytest.raises(ChatTemplateError):
        resolve_chat_template(None)


def test_resolution_of_named_templates():
    config = {
        "chat_template": [
            {"name": "default", "template": "D"},
            {"name": "tool_use", "template": "T"},
        ]
    }
    assert resolve_chat_template(tokenizer_config=config) == "D"
    assert resolve_chat_template(tokenizer_config=config, tools=[{}]) == "T"
    assert resolve_chat_template("tool_use", tokenizer_config=config) == "T"
    assert resolve_chat_template(tokenizer_config=config, name="tool_use") == "T"
    with pytest.raises(ChatTemplateError, match="no default"):
        resolve_chat_template(tokenizer_config={"chat_template": {"rag": "R"}})


def test_resolution_from_a_transformers_tokenizer():
    tokenizer = hf_tokenizer("<s>", "</s>")
    tokenizer.chat_template = "{{ 'from tokenizer' }}"
    try:
        assert resolve_chat_template(tokenizer=tokenizer) == "{{ 'from tokenizer' }}"
    finally:
        tokenizer.chat_template = None


def test_resolution_from_a_gguf_file():
    path = smollm2_gguf_path()
    template = resolve_chat_template(gguf_file=path)
    assert "<|im_start|>" in template
    prompt = render_chat_template(
        template, [{"role": "user", "content": "Hi"}], add_generation_prompt=True
    )
    assert prompt.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    with pytest.raises(ChatTemplateNotFoundError):
        resolve_chat_template(gguf_file=path.with_name("absent.gguf"))
