"""Family-specific outputs the templates do not write: the lenient forms models produce (and
vLLM / llama.cpp accept), malformed calls, Python-literal values, parsed whole and streamed in
random chunkings."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_dialect_base import CHUNKINGS, assert_stream_matches, message, without_ids

from pegmask.dialects import ChatRequest, get_dialect

WEATHER = ("get_weather", '{"city": "Tokyo"}')
TIME = ("get_time", "{}")

# (dialect, options, output, expected message)
EXAMPLES = {
    "llama3 with python_tag": (
        "llama3", {}, '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Tokyo"}}'
                      '<|eom_id|>', message(None, None, [WEATHER])),
    "llama3 arguments key, reversed, ';' between calls": (
        "llama3", {}, '{"arguments": {"city": "Tokyo"}, "name": "get_weather"}; '
                      '{"name": "get_time", "parameters": {}}<|eot_id|>',
        message(None, None, [WEATHER, TIME])),
    "llama3 text before a call is all text": (
        "llama3", {}, 'Sure: {"name": "get_time", "parameters": {}}',
        message('Sure: {"name": "get_time", "parameters": {}}')),
    "llama3 malformed call is text": (
        "llama3", {}, '{"name": "get_time", "parameters": {oops}}',
        message('{"name": "get_time", "parameters": {oops}}')),
    "mistral content, then two calls, one with an id": (
        "mistral", {}, 'Checking.[TOOL_CALLS]get_weather[ARGS]{"city": "Tokyo"}'
                       '[TOOL_CALLS]get_time[CALL_ID]a1b2c3d4e[ARGS]{}</s>',
        message("Checking.", None, [WEATHER, TIME])),
    "mistral v3 list read by the v11 dialect": (
        "mistral", {}, '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Tokyo"}, '
                       '"id": "a1b2c3d4e"}, {"arguments": {}, "name": "get_time"}]</s>',
        message(None, None, [WEATHER, TIME])),
    "mistral reasoning": (
        "mistral", {}, "[THINK]Two tools.[/THINK][TOOL_CALLS]get_time[ARGS]{}",
        message(None, "Two tools.", [TIME])),
    "mistral truncated call is dropped": (
        "mistral", {}, 'Ok.[TOOL_CALLS]get_weather[ARGS]{"city": "To', message("Ok.")),
    "deepseek-r1 reasoning, content, fenced call": (
        "deepseek-r1", {}, "Think.\n</think>\n\nOk.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>"
                           "function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Tokyo\"}\n```"
                           "<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>",
        message("Ok.", "Think.", [WEATHER])),
    "deepseek-v3.1 calls back to back, no reasoning": (
        "deepseek-v3.1", {}, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
                             "{\"city\": \"Tokyo\"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_time"
                             "<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        message(None, None, [WEATHER, TIME])),
    "deepseek-v3.1 thinking": (
        "deepseek-v3.1", {}, "Hmm.</think>Hello.<｜end▁of▁sentence｜>", message("Hello.", "Hmm.")),
    "dsml v4.1: a space after ｜DSML｜": (
        "dsml", {"version": "v4.1"}, "Look.</think>\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"get_weather\">"
        "\n<｜DSML｜ parameter name=\"city\" string=\"true\">Tokyo</｜DSML｜ parameter>\n"
        "</｜DSML｜ invoke>\n</｜DSML｜ calls><｜end▁of▁sentence｜>",
        message(None, "Look.", [WEATHER])),
    "mimo compact XML after reasoning": (
        "mimo", {}, "<think>Look.</think><tool_call><function=get_weather><parameter=city>Tokyo"
                    "</parameter></function></tool_call><|im_end|>",
        message(None, "Look.", [WEATHER])),
    "kimi-k3 JSON block arguments, no reasoning": (
        "kimi-k3", {"reasoning": False}, "Ok.<|close|>response<|sep|><|open|>tools<|sep|>"
        "<|open|>call tool=\"get_weather\" index=\"1\"<|sep|><|open|>json type=\"object\"<|sep|>"
        "{\"city\": \"Tokyo\"}<|close|>json<|sep|><|close|>call<|sep|><|close|>tools<|sep|>"
        "<|close|>message<|sep|><|end_of_msg|>", message("Ok.", None, [WEATHER])),
    "gemma nested values, Python None, a quoted key": (
        "gemma", {}, '<|channel>thought\nLook.\n<channel|><|tool_call>call:f{cfg:{<|"|>a b<|"|>: '
        '[1, None, <|"|>x<|"|>]}, on:true}<tool_call|><|tool_response>',
        message(None, "Look.", [("f", '{"cfg": {"a b": [1, null, "x"]}, "on": true}')])),
    "kimi id without the functions. prefix": (
        "kimi", {}, "<think>Look.</think><|tool_calls_section_begin|><|tool_call_begin|>"
                    "get_weather:3<|tool_call_argument_begin|>{\"city\": \"Tokyo\"}"
                    "<|tool_call_end|><|tool_calls_section_end|><|im_end|>",
        message(None, "Look.", [WEATHER])),
    "glm 4.6 spacing": (
        "glm", {}, "\n<think>Look.</think>\nOk.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n"
                   "<arg_value>Tokyo</arg_value>\n</tool_call>",
        message("Ok.", "Look.", [WEATHER])),
    "glm untyped values are guessed, Python literals read": (
        "glm", {"reasoning": False}, "<tool_call>f<arg_key>n</arg_key><arg_value>42</arg_value>"
                                     "<arg_key>on</arg_key><arg_value>True</arg_value>"
                                     "<arg_key>cfg</arg_key><arg_value>{'a': [1, None]}"
                                     "</arg_value></tool_call>",
        message(None, None, [("f", '{"n": 42, "on": true, "cfg": {"a": [1, null]}}')])),
    "minimax two invokes": (
        "minimax", {}, "Look.\n</think>\n\n<minimax:tool_call>\n<invoke name=\"get_weather\">\n"
                       "<parameter name=\"city\">Tokyo</parameter>\n</invoke>\n"
                       "<invoke name=\"get_time\">\n</invoke>\n</minimax:tool_call>[e~[",
        message(None, "Look.", [WEATHER, TIME])),
    "a tag in plain text stays content": (
        "minimax", {"reasoning": False}, "Use <invoke name=\"x\"> to call.",
        message("Use <invoke name=\"x\"> to call.")),
    "cohere action after thinking": (
        "cohere", {}, "Plan.<|END_THINKING|><|START_ACTION|>[\n    {\"tool_call_id\": \"0\", "
                      "\"tool_name\": \"get_weather\", \"parameters\": {\"city\": \"Tokyo\"}}\n]"
                      "<|END_ACTION|><|END_OF_TURN_TOKEN|>",
        message(None, "Plan.", [WEATHER])),
    "command-r action on the Action: line, fence closed on its own line (Cohere's docs)": (
        "command-r", {}, "I will look.\nAction: ```json\n[{\"tool_name\": \"get_weather\", "
                         "\"parameters\": {\"city\": \"Tokyo\"}}, {\"tool_name\": \"get_time\", "
                         "\"parameters\": {}}]\n```<|END_OF_TURN_TOKEN|>",
        message("I will look.", None, [WEATHER, TIME])),
    "nemotron content then list": (
        "nemotron", {}, "<think>\nLook.\n</think>\n\nOk.<TOOLCALL>[{\"name\": \"get_weather\", "
                        "\"arguments\": {\"city\": \"Tokyo\"}}]</TOOLCALL><|eot_id|>",
        message("Ok.", "Look.", [WEATHER])),
    "seed-oss str() values": (
        "seed-oss", {}, "<seed:think>Look.</seed:think>\n<seed:tool_call>\n<function=f>\n"
                        "<parameter=flags>[True, False]</parameter>\n</function>\n"
                        "</seed:tool_call><seed:eos>",
        message(None, "Look.", [("f", '{"flags": [true, false]}')])),
    "hunyuan call block": (
        "hunyuan", {"reasoning": True}, "Look.</think:opensource><tool_calls:opensource>\n"
        "<tool_call:opensource>get_weather<tool_sep:opensource>\n<arg_key:opensource>city"
        "</arg_key:opensource>\n<arg_value:opensource>Tokyo</arg_value:opensource>\n"
        "</tool_call:opensource>\n</tool_calls:opensource><｜hy_eos:opensource｜>",
        message(None, "Look.", [WEATHER])),
    "exaone reasoning then compact calls": (
        "exaone", {"reasoning": True}, "Look.\n</think>\n\nOk.\n<tool_call>{\"name\": "
        "\"get_weather\", \"arguments\": {\"city\": \"Tokyo\"}}</tool_call>\n<tool_call>"
        "{\"name\": \"get_time\", \"arguments\": {}}</tool_call>[|endofturn|]",
        message("Ok.", "Look.", [WEATHER, TIME])),
    "minimax-m3 nested elements guessed without a schema": (
        "minimax-m3", {"reasoning": False}, "]<]minimax[>[<tool_call>\n]<]minimax[>[<invoke "
        "name=\"f\">\n]<]minimax[>[<cfg>\n]<]minimax[>[<item>1]<]minimax[>[</item>\n"
        "]<]minimax[>[<item>x y]<]minimax[>[</item>\n]<]minimax[>[</cfg>\n]<]minimax[>[<on>true"
        "]<]minimax[>[</on>\n]<]minimax[>[</invoke>\n]<]minimax[>[</tool_call>[e~[",
        message(None, None, [("f", '{"cfg": [1, "x y"], "on": true}')])),
    "minimax-m3 adaptive: a lone </mm:think>, text right before the block": (
        "minimax-m3", {}, "</mm:think>Ok.]<]minimax[>[<tool_call>]<]minimax[>[<invoke "
        "name=\"get_time\">]<]minimax[>[</invoke>]<]minimax[>[</tool_call>",
        message("Ok.", None, [TIME])),
    "cohere-xml typed values, an escaped name": (
        "cohere-xml", {}, "Plan.<|END_THINKING|><cofl:tool_calls><cofl:tool_call id=\"0\" "
        "name=\"f\"><cofl:value name=\"n\" type=\"raw\">7</cofl:value><cofl:value name=\"o\" "
        "type=\"dict\"><cofl:value name=\"a&amp;b\" type=\"json\">null</cofl:value>"
        "</cofl:value><cofl:value name=\"l\" type=\"list\"><cofl:value type=\"json\">2"
        "</cofl:value><cofl:value type=\"raw\">x</cofl:value></cofl:value></cofl:tool_call>"
        "</cofl:tool_calls><|END_OF_TURN_TOKEN|>",
        message(None, "Plan.", [("f", '{"n": "7", "o": {"a&b": null}, "l": [2, "x"]}')])),
    "cohere-xml malformed value is content": (
        "cohere-xml", {"reasoning": False}, "<cofl:tool_calls><cofl:tool_call id=\"0\" name=\"f\">"
        "<cofl:value name=\"n\" type=\"int\">7</cofl:value></cofl:tool_call></cofl:tool_calls>",
        message("<cofl:tool_calls><cofl:tool_call id=\"0\" name=\"f\"><cofl:value name=\"n\" "
                "type=\"int\">7</cofl:value></cofl:tool_call></cofl:tool_calls>")),
    "apriel past call with its id, after thinking": (
        "apriel", {}, '<thinking>Look.</thinking>Ok.\n<tool_calls>[{"name": "get_weather", '
                      '"arguments": {"city": "Tokyo"}, "id": "call_1"}, {"arguments": {}, '
                      '"name": "get_time"}]</tool_calls>\n<|end|>',
        message("Ok.", "Look.", [WEATHER, TIME])),
    "phi4-mini text before the functools list": (
        "phi4-mini", {}, 'Checking. functools[{"name": "get_weather", "arguments": '
                         '{"city": "Tokyo"}}]<|end|>', message("Checking.", None, [WEATHER])),
    "granite cut-off list is dropped": (
        "granite", {}, '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "To',
        message(None)),
    "apertus deliberation, then calls": (
        "apertus", {}, '<|inner_prefix|>Look.<|inner_suffix|><|tools_prefix|>[{"get_weather": '
                       '{"city": "Tokyo"}}, {"get_time": {}}]<|tools_suffix|>',
        message(None, "Look.", [WEATHER, TIME])),
    "functionary-v3.2 plain text without a recipient is content": (
        "functionary-v3.2", {}, "Hello there.<|eot_id|>", message("Hello there.")),
    "functionary-v3.2 content then calls": (
        "functionary-v3.2", {}, 'all\nOk.>>>get_weather\n{"city": "Tokyo"}>>>get_time\n{}'
                                "<|eot_id|>", message("Ok.", None, [WEATHER, TIME])),
    "functionary-v3.1 python tag code (not spoken) stays raw content": (
        "functionary-v3.1", {}, "<|python_tag|>print(1)<|eom_id|>",
        message("<|python_tag|>print(1)")),
}


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_examples(name: str) -> None:
    dialect, options, output, expected = EXAMPLES[name]
    assert without_ids(get_dialect(dialect, **options).parse(output)) == expected


@pytest.mark.parametrize("name", sorted(EXAMPLES))
@CHUNKINGS
@given(data=st.data())
def test_streaming_matches_whole_parse_for_any_chunking(name: str, data: st.DataObject) -> None:
    dialect, options, output, _ = EXAMPLES[name]
    cuts = data.draw(st.lists(st.integers(0, len(output)), max_size=10))
    assert_stream_matches(get_dialect(dialect, **options), output, cuts)


@pytest.mark.parametrize("dialect", ["glm", "minimax", "seed-oss", "hunyuan", "mimo",
                                     "minimax-m3"])
def test_xml_values_are_typed_by_the_schema(dialect: str) -> None:
    """"7" is a string for a string parameter and a number for an integer one; an object
    parameter written as a Python literal is the object."""
    forms = {
        "glm": lambda k, v: f"<arg_key>{k}</arg_key><arg_value>{v}</arg_value>",
        "minimax": lambda k, v: f'<parameter name="{k}">{v}</parameter>',
        "seed-oss": lambda k, v: f"<parameter={k}>{v}</parameter>",
        "mimo": lambda k, v: f"<parameter={k}>{v}</parameter>",
        "minimax-m3": lambda k, v: f"]<]minimax[>[<{k}>{v}]<]minimax[>[</{k}>",
        "hunyuan": lambda k, v: (f"<arg_key:opensource>{k}</arg_key:opensource>"
                                 f"<arg_value:opensource>{v}</arg_value:opensource>"),
    }
    params = "".join(forms[dialect](k, v) for k, v in
                     (("s", "7"), ("n", "7"), ("o", "{'a': True}")))
    calls = {
        "glm": f"<tool_call>f{params}</tool_call>",
        "minimax": f'<minimax:tool_call><invoke name="f">{params}</invoke></minimax:tool_call>',
        "seed-oss": f"<seed:tool_call><function=f>{params}</function></seed:tool_call>",
        "mimo": f"<tool_call><function=f>{params}</function></tool_call>",
        "minimax-m3": (f']<]minimax[>[<tool_call>]<]minimax[>[<invoke name="f">'
                       f"{params}]<]minimax[>[</invoke>]<]minimax[>[</tool_call>"),
        "hunyuan": (f"<tool_calls:opensource><tool_call:opensource>f<tool_sep:opensource>{params}"
                    "</tool_call:opensource></tool_calls:opensource>"),
    }
    tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"s": {"type": "string"}, "n": {"type": "integer"},
                                         "o": {"type": "object"}}}}}
    request = ChatRequest(tools=[tool])
    parsed = get_dialect(dialect, reasoning=False).parse(calls[dialect], request)
    assert without_ids(parsed) == message(None, None, [("f", '{"s": "7", "n": 7, "o": {"a": true}}')])


def test_dsml_v41_strict_grammar_writes_the_spaced_tags() -> None:
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    request = ChatRequest(tools=[tool], tool_choice="required",
                          chat_template_kwargs={"enable_thinking": False})
    spaced = EXAMPLES["dsml v4.1: a space after ｜DSML｜"][2].removeprefix("Look.</think>")
    v41, v4 = (get_dialect("dsml", version=v).grammar(request) for v in ("v4.1", "v4"))
    assert v41.matches(spaced) and not v4.matches(spaced)
    unspaced = spaced.replace("｜DSML｜ ", "｜DSML｜").replace("calls>", "tool_calls>")
    assert v4.matches(unspaced) and not v41.matches(unspaced)


def test_command_r_template_gets_tools_it_can_type() -> None:
    """Command R+'s signature macro fails on a parameter without a description or an object
    without `additionalProperties`; the dialect fills them in (untypable types become `Any`)."""
    from pegmask.bench.data import TEMPLATES_DIR
    from pegmask.dialects import render_chat_template

    template = (TEMPLATES_DIR / "CohereForAI-c4ai-command-r-plus-tool_use.jinja").read_text()
    tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"o": {"type": "object"}, "n": {"type": "null"},
                                         "s": {"type": "string", "description": "S."}},
        "required": ["s"]}}}
    messages = [{"role": "user", "content": "Go."}]
    with pytest.raises(Exception, match="description|additionalProperties"):
        render_chat_template(template, messages, tools=[tool])
    prompt = get_dialect("command-r", chat_template=template).render(messages, [tool])
    assert ("def f(o: Optional[Dict[str, Any]] = None, n: Optional[Any] = None, s: str)"
            in prompt)
    assert "        s (str): S." in prompt


MIMO_TEMPLATE = (  # MiMo-V2.6's call rendering, reduced to what detection reads
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{%- for tc in m.tool_calls or [] %}<tool_call><function={{ tc.function.name }}>"
    "{%- for k, v in tc.function.arguments.items() %}<parameter={{ k }}>{{ v }}</parameter>"
    "{%- endfor %}</function></tool_call>{%- endfor %}<|im_end|>\n{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}")


def test_compact_xml_is_mimo_and_framed_xml_hermes_xml() -> None:
    from pegmask.dialects import detect_dialect

    assert detect_dialect(MIMO_TEMPLATE) == "mimo"
    framed = MIMO_TEMPLATE.replace("<tool_call><function={{ tc.function.name }}>",
                                   "<tool_call>\n<function={{ tc.function.name }}>\n")
    assert detect_dialect(framed) == "hermes-xml"


# The three formats' calls as a template would write them, reduced to what detection reads.
XGRAMMAR_FORMAT_TEMPLATES = {
    "exaone": (
        "{%- for m in messages %}[|{{ m.role }}|]\n{{ m.content }}{%- for tc in m.tool_calls or [] %}"
        "<tool_call>{\"name\": \"{{ tc.function.name }}\", \"arguments\": "
        "{{ tc.function.arguments | tojson }}}</tool_call>{%- endfor %}[|endofturn|]\n"
        "{%- endfor %}{%- if add_generation_prompt %}[|assistant|]\n{%- endif %}"),
    "minimax-m3": (
        "{%- for m in messages %}]~b]{{ m.role }}\n{{ m.content }}{%- if m.tool_calls %}"
        "]<]minimax[>[<tool_call>\n{%- for tc in m.tool_calls %}]<]minimax[>[<invoke name=\""
        "{{ tc.function.name }}\">]<]minimax[>[</invoke>\n{%- endfor %}]<]minimax[>[</tool_call>"
        "{%- endif %}[e~[\n{%- endfor %}"),
    "cohere-xml": (
        "{%- for m in messages %}<|START_OF_TURN_TOKEN|>{{ m.content }}{%- if m.tool_calls %}"
        "<cofl:tool_calls>{%- for tc in m.tool_calls %}<cofl:tool_call id=\"{{ loop.index0 }}\" "
        "name=\"{{ tc.function.name }}\"></cofl:tool_call>{%- endfor %}</cofl:tool_calls>"
        "{%- endif %}<|END_OF_TURN_TOKEN|>{%- endfor %}"),
}


@pytest.mark.parametrize("dialect", sorted(XGRAMMAR_FORMAT_TEMPLATES))
def test_xgrammar_formats_are_detected(dialect: str) -> None:
    """EXAONE's compact calls are not taken for Hermes; a ChatML turn with them is Hermes."""
    from pegmask.dialects import detect_dialect

    template = XGRAMMAR_FORMAT_TEMPLATES[dialect]
    assert detect_dialect(template) == dialect
    if dialect == "exaone":
        chatml = template.replace("[|{{ m.role }}|]", "<|im_start|>{{ m.role }}").replace(
            "[|assistant|]", "<|im_start|>assistant")
        assert detect_dialect(chatml) == "hermes"


GEMMA_TOOL = {"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "required": ["mode", "tags"], "$defs": {"pt": {
        "type": "object", "properties": {"x": {"type": "integer", "minimum": 0}},
        "required": ["x"]}},
    "properties": {
        "mode": {"enum": ["fast", "slow"]},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 2},
        "at": {"$ref": "#/$defs/pt"},
        "code": {"type": "string", "pattern": "^[A-Z]{2}$"},
        "maybe": {"type": ["integer", "null"]},
        "box": {"type": "object", "properties": {"w": {"type": "integer", "maximum": 5}},
                "required": ["w"]}}}}}


@pytest.mark.parametrize(("arguments", "ok"), [
    ('{mode:<|"|>fast<|"|>,tags:[<|"|>a<|"|>]}', True),
    ('{at:{x:3},code:<|"|>AB<|"|>,maybe:None,mode:<|"|>slow<|"|>,tags:[<|"|>a<|"|>,<|"|>b<|"|>]}',
     True),
    ('{mode:<|"|>fast<|"|>,tags:[]}', False),  # minItems
    ('{mode:<|"|>fast<|"|>,tags:[<|"|>a<|"|>,<|"|>b<|"|>,<|"|>c<|"|>]}', False),  # maxItems
    ('{mode:<|"|>medium<|"|>,tags:[<|"|>a<|"|>]}', False),  # enum
    ('{at:{x:-1},mode:<|"|>fast<|"|>,tags:[<|"|>a<|"|>]}', False),  # $ref'd minimum
    ('{code:<|"|>abc<|"|>,mode:<|"|>fast<|"|>,tags:[<|"|>a<|"|>]}', False),  # pattern
    ('{tags:[<|"|>a<|"|>],mode:<|"|>fast<|"|>}', False),  # keys are sorted
    ('{box:{w:3},mode:<|"|>fast<|"|>,tags:[<|"|>a<|"|>]}', True),  # a nested object
    ('{box:{w:9},mode:<|"|>fast<|"|>,tags:[<|"|>a<|"|>]}', False),  # its member's maximum
])
def test_gemma_strict_grammar_follows_the_schema(arguments: str, ok: bool) -> None:
    request = ChatRequest(tools=[GEMMA_TOOL], tool_choice="required",
                          chat_template_kwargs={"enable_thinking": False})
    dialect = get_dialect("gemma")
    output = f"<|tool_call>call:f{arguments}<tool_call|>"
    assert dialect.grammar(request).matches(output) == ok
    if ok:
        assert dialect.parse(output, request, trusted=True, seed=1) == dialect.parse(
            output, request, seed=1)


def test_gemma_refuses_schemas_it_cannot_write() -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"allOf": [{"type": "integer"}]}}}}}
    with pytest.raises(ValueError, match="allOf"):
        get_dialect("gemma").grammar(ChatRequest(tools=[tool]))


def test_gemma_values_read_as_json() -> None:
    from pegmask.dialects.gemma import read_value

    assert read_value('{a:<|"|>x, y<|"|>,b:[1,2.5,-3e2],c:{d:None,e:True}}') == {
        "a": "x, y", "b": [1, 2.5, -300.0], "c": {"d": None, "e": True}}
    for bad in ("{a 1}", "[1 2]", '<|"|>open', "{a:1}}"):
        with pytest.raises(ValueError):
            read_value(bad)
