"""pegmask's vLLM plugin against the installed vLLM (scripts/vllm_check.sh's venv; not collected
where vLLM is missing, see conftest.py): parser registration, the parsers composed by vLLM's
own `ParserManager` and driven like its serving layer (whole and streamed) on SmolLM2's real
tokenizer, and the logits processor through both model runners' interfaces, closing within
each request's `max_tokens`."""

from __future__ import annotations

import copy
import json
import os
import re
from types import SimpleNamespace

import jsonschema
import numpy as np
import pytest
import torch
from vllm import SamplingParams
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.parser.parser_manager import ParserManager
from vllm.reasoning import ReasoningParserManager
from vllm.tool_parsers import ToolParser, ToolParserManager
from vllm.v1.sample.logits_processor import (
    BatchUpdate,
    MoveDirectionality,
    validate_logits_processors_parameters,
)
from vllm.v1.worker.gpu import buffer_utils
from vllm.v1.worker.gpu.sample.logits_processor import (
    LogitsContext,
    build_custom_logits_processors,
    build_custom_logits_processors_params_validator,
)
from vllm.v1.worker.gpu.states import RequestState
from vocabularies import smollm2_tokenizer

from pegmask.dialects import dialect_names
from pegmask.integrations import vllm as plugin
from pegmask.integrations.vllm.logits import (
    PegmaskLogitsProcessor,
    request_budget,
    request_spec,
)

pytestmark = pytest.mark.vllm

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}},
    "required": ["city"], "additionalProperties": False}}}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
          "additionalProperties": False}


def request(**options) -> ChatCompletionRequest:
    return ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "Hi"}],
                                 tools=[WEATHER], **options)


def composed(reasoning: bool = True):
    plugin.register()
    parser_cls = ParserManager.get_parser(
        tool_parser_name="pegmask-hermes", enable_auto_tools=True,
        reasoning_parser_name="pegmask-hermes" if reasoning else None,
        tokenizer=smollm2_tokenizer())
    return parser_cls(smollm2_tokenizer(), request().tools, chat_template_kwargs={})


def test_every_dialect_is_a_tool_and_a_reasoning_parser() -> None:
    plugin.register()
    for dialect in dialect_names():
        tool = ToolParserManager.get_tool_parser(f"pegmask-{dialect}")
        assert issubclass(tool, ToolParser) and tool.dialect_name == dialect
        reasoning = ReasoningParserManager.get_reasoning_parser(f"pegmask-{dialect}")
        assert reasoning.dialect_name == dialect


@pytest.mark.parametrize("reasoning", [True, False])
def test_whole_output_parsed_by_vllms_composed_parser(reasoning: bool) -> None:
    output = "I'll look it up.\n" + CALL + "<|im_end|>"
    found, content, calls = composed(reasoning).parse(output, request(tool_choice="auto"),
                                                      enable_auto_tools=True)
    assert found is None and content == "I'll look it up."
    [call] = calls
    assert (call.name, json.loads(call.arguments)) == ("get_weather", {"city": "Paris"})


def test_reasoning_then_call_whole_and_streamed() -> None:
    output = "<think>\nThe user wants weather.\n</think>\n\nSure.\n" + CALL + "<|im_end|>"
    req = request(tool_choice="required")
    reasoning, content, calls = composed().parse(output, req, enable_auto_tools=True)
    assert (reasoning, content) == ("The user wants weather.", "Sure.")
    assert [c.name for c in calls] == ["get_weather"]

    # Streamed after a prompt whose template opened the reasoning block itself: the output
    # starts inside it (vLLM hands the parser the prompt, which says so).
    parser = composed()
    opening = "<think>\n"
    ids = smollm2_tokenizer().encode(output[len(opening):], add_special_tokens=False)
    prompt = smollm2_tokenizer().encode(
        generation_prompt() + opening, add_special_tokens=False)
    pieces = {"reasoning": "", "content": "", "calls": {}}
    for i, token in enumerate(ids):
        text = smollm2_tokenizer().decode([token])
        delta = parser.parse_delta(text, [token], req, prompt_token_ids=prompt,
                                   finished=i == len(ids) - 1)
        if delta is None:
            continue
        pieces["reasoning"] += delta.reasoning or ""
        pieces["content"] += delta.content or ""
        for piece in delta.tool_calls:
            call = pieces["calls"].setdefault(piece.index, {"name": "", "arguments": ""})
            call["name"] += piece.function.name or ""
            call["arguments"] += piece.function.arguments or ""
    assert pieces["reasoning"] == "The user wants weather."
    assert pieces["content"].strip() == "Sure."
    assert [(c["name"], json.loads(c["arguments"])) for c in pieces["calls"].values()] == [
        ("get_weather", {"city": "Paris"})]


def generation_prompt() -> str:
    """SmolLM2's rendered prompt for one question (its template writes no `<think>`)."""
    return smollm2_tokenizer().apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        tokenize=False, add_generation_prompt=True)


def reasoning_parser(template_reasons: bool = False):
    """A pegmask-hermes reasoning parser on SmolLM2's tokenizer; `template_reasons`: with a
    chat template that mentions `<think>` (without opening it), so the prompt leaves reasoning
    to the model."""
    plugin.register()
    tokenizer = smollm2_tokenizer()
    if template_reasons:
        tokenizer = copy.copy(tokenizer)
        tokenizer.chat_template = tokenizer.chat_template + "{# the model may open <think> #}"
    return ReasoningParserManager.get_reasoning_parser("pegmask-hermes")(tokenizer)


def test_reasoning_end_read_from_the_tail_of_prompt_and_output() -> None:
    """vLLM's structured-output gate asks with the prompt's ids, then with prompt + output ids
    (`StructuredOutputManager._get_constraint_bounds`): constraining starts where it says True."""
    parser = reasoning_parser()
    encode = smollm2_tokenizer().encode

    def ended(text: str) -> bool:
        return parser.is_reasoning_end(encode(text, add_special_tokens=False))

    prompt = generation_prompt()
    assert ended(prompt)  # SmolLM2's template does not reason: constrained from the start
    assert ended(prompt + "<think>\n\n</think>\n\n")  # the template closed an empty block
    opened = prompt + "<think>\n"  # the template opened the block itself
    assert not ended(opened)
    assert not ended(opened + "still going")
    assert ended(opened + "ok\n</think>\n\nHello")
    assert not ended(opened + "ok\n</think>\n\nHello<think>\nagain")

    # The gate's walk over a prompt that opened the block: True from the close marker on.
    output = encode("ok, done\n</think>\n\n{}", add_special_tokens=False)
    start = encode(opened, add_special_tokens=False)
    flips = [i for i in range(len(output) + 1)
             if parser.is_reasoning_end_streaming(start + output[:i], output[:i][-1:])]
    close = smollm2_tokenizer().decode(output[:flips[0]])
    assert close.endswith("</think>") and flips == list(range(flips[0], len(output) + 1))

    # Bare outputs (no prompt) still read as before.
    done = encode("<think>\nok\n</think>\n\nHello there", add_special_tokens=False)
    assert parser.is_reasoning_end(done)
    content = parser.extract_content_ids(done)
    assert smollm2_tokenizer().decode(content).strip().startswith("Hello")


def test_a_prompt_that_names_no_marker_leaves_reasoning_to_the_output() -> None:
    """A template that knows `<think>` but did not open it: the model may open it, so a prompt
    has not ended reasoning (as vLLM's own parsers); switched off, it has."""
    parser = reasoning_parser(template_reasons=True)
    encode = smollm2_tokenizer().encode
    prompt = generation_prompt()
    assert not parser.is_reasoning_end(encode(prompt, add_special_tokens=False))
    assert parser.is_reasoning_end(encode(prompt + "<think>\n\n</think>\n\n",
                                          add_special_tokens=False))
    off = ReasoningParserManager.get_reasoning_parser("pegmask-hermes")(
        parser.model_tokenizer, chat_template_kwargs={"enable_thinking": False})
    assert off.is_reasoning_end(encode(prompt, add_special_tokens=False))


def test_adjust_request_asks_for_the_dialect_grammar() -> None:
    parser = composed()
    adjusted = parser.adjust_request(request(tool_choice="required", parallel_tool_calls=False))
    assert adjusted.skip_special_tokens is False
    spec = json.loads(adjusted.vllm_xargs["pegmask"])
    # SmolLM2's chat template has no <think>: reasoning off, as the engine decides
    assert spec == {"dialect": "hermes", "tools": [WEATHER], "tool_choice": "required",
                    "parallel_tool_calls": False, "reasoning": False}
    assert adjusted.structured_outputs is None  # vLLM's own JSON mode stays off
    mine = request(vllm_xargs={"pegmask": '{"regex": "x"}'})
    assert composed().adjust_request(mine).vllm_xargs == {"pegmask": '{"regex": "x"}'}
    with_format = request(response_format={"type": "json_object"})
    assert not (composed().adjust_request(with_format).vllm_xargs or {})
    assert not (composed().adjust_request(request(tool_choice="none")).vllm_xargs or {})


# --------------------------------------------------------------------------- logits processor
@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    folder = tmp_path_factory.mktemp("smollm2-tokenizer")
    smollm2_tokenizer().save_pretrained(folder)
    return str(folder)


def config(tokenizer_dir: str, width: int, rows: int = 4) -> SimpleNamespace:
    """The parts of a VllmConfig the processor reads, for SmolLM2's tokenizer."""
    model = SimpleNamespace(tokenizer=tokenizer_dir, tokenizer_revision=None,
                            trust_remote_code=False, get_vocab_size=lambda: width,
                            try_get_generation_config=lambda: {"eos_token_id": 2})
    return SimpleNamespace(model_config=model, speculative_config=None,
                           scheduler_config=SimpleNamespace(max_num_seqs=rows))


def pick(logits: torch.Tensor, row: int) -> int:
    return int(torch.argmax(logits[row]))


def text(ids: list[int]) -> str:
    return smollm2_tokenizer().decode(ids)


def masked_params(spec: dict) -> SamplingParams:
    return SamplingParams(extra_args={"pegmask": json.dumps(spec)})


def test_v1_processor_masks_its_rows_and_follows_moves(tokenizer_dir: str) -> None:
    width = len(smollm2_tokenizer())
    processor = PegmaskLogitsProcessor(config(tokenizer_dir, width), torch.device("cpu"), False)
    assert processor.is_argmax_invariant() is False
    outputs: list[list[int]] = [[], [], []]
    processor.update_state(BatchUpdate(batch_size=3, removed=[], moved=[], added=[
        (0, masked_params({"json_schema": SCHEMA}), [1], outputs[0]),
        (1, SamplingParams(), [1], outputs[1]),
        (2, masked_params({"regex": "[a-c]{3}"}), [1], outputs[2])]))
    generator = torch.Generator().manual_seed(0)
    for step in range(12):
        logits = torch.randn(3, width, generator=generator)
        free = logits[1].clone()
        processor.apply(logits)
        assert torch.equal(logits[1], free)
        for row in (0, 2):
            if not outputs[row] or outputs[row][-1] != 2:
                outputs[row].append(pick(logits, row))
        outputs[1].append(pick(logits, 1))
        if step == 5:  # the engine swaps rows 0 and 2, then moves 1 to 0's old place
            processor.update_state(BatchUpdate(batch_size=3, removed=[], added=[], moved=[
                (0, 2, MoveDirectionality.SWAP)]))
            outputs[0], outputs[2] = outputs[2], outputs[0]
    json_row, regex_row = outputs[2], outputs[0]
    assert regex_row[-1] == 2 and len(text(regex_row[:-1])) == 3
    assert set(text(regex_row[:-1])) <= set("abc")
    if json_row[-1] == 2:
        assert isinstance(json.loads(text(json_row[:-1]))["n"], int)
    processor.update_state(BatchUpdate(batch_size=2, removed=[2], added=[], moved=[]))
    assert set(processor.rows) == {0}


def test_v1_placeholders_and_bad_specs(tokenizer_dir: str) -> None:
    width = len(smollm2_tokenizer())
    processor = PegmaskLogitsProcessor(config(tokenizer_dir, width), torch.device("cpu"), False)
    output = [-1]  # an async-scheduling placeholder read in apply(): the request is ended
    processor.update_state(BatchUpdate(batch_size=1, removed=[], moved=[], added=[
        (0, masked_params({"regex": "x+"}), [1], output)]))
    logits = processor.apply(torch.zeros(1, width))
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [2]  # EOS only
    with pytest.raises(ValueError, match="invalid regex"):
        PegmaskLogitsProcessor.validate_params(masked_params({"regex": "[unclosed"}))
    with pytest.raises(ValueError, match="exactly one of"):
        PegmaskLogitsProcessor.validate_params(
            SamplingParams(extra_args={"pegmask": '{"regex": "a", "grammar": "b"}'}))
    PegmaskLogitsProcessor.validate_params(SamplingParams())  # no constraint: nothing to check


def test_a_dialect_spec_masks_the_whole_turn(tokenizer_dir: str) -> None:
    width = len(smollm2_tokenizer())
    processor = PegmaskLogitsProcessor(config(tokenizer_dir, width), torch.device("cpu"), False)
    adjusted = composed().adjust_request(request(tool_choice="required"))
    spec = json.loads(adjusted.vllm_xargs["pegmask"])
    processor.update_state(BatchUpdate(batch_size=1, removed=[], moved=[], added=[
        (0, masked_params(spec), [1], [])]))
    logits = processor.apply(torch.zeros(1, width))
    allowed = set(torch.isfinite(logits[0]).nonzero().flatten().tolist())
    # tool_choice "required": no answer text, the turn opens with a tag (SmolLM2 spells them)
    encode = smollm2_tokenizer().encode
    assert encode("<", add_special_tokens=False)[0] in allowed
    assert encode("Sure", add_special_tokens=False)[0] not in allowed


def test_a_dialect_spec_starts_in_reasoning_where_the_prompt_opened_it(
        tokenizer_dir: str) -> None:
    """The tool parser's spec says reasoning off (SmolLM2's template has no `<think>`), but a
    prompt that opens the block itself is continued inside it: the V1 runner hands the prompt."""
    width = len(smollm2_tokenizer())
    processor = PegmaskLogitsProcessor(config(tokenizer_dir, width), torch.device("cpu"), False)
    spec = json.loads(composed().adjust_request(request(tool_choice="required"))
                      .vllm_xargs["pegmask"])
    encode = smollm2_tokenizer().encode
    prompts = [encode(generation_prompt() + tail, add_special_tokens=False)
               for tail in ("<think>\n", "<think>\n\n</think>\n\n", "")]
    params = SamplingParams(max_tokens=4096, extra_args={"pegmask": json.dumps(spec)})
    processor.update_state(BatchUpdate(batch_size=3, removed=[], moved=[], added=[
        (i, params, prompt, []) for i, prompt in enumerate(prompts)]))
    logits = processor.apply(torch.zeros(3, width))
    sure = encode("Sure", add_special_tokens=False)[0]
    assert [bool(torch.isfinite(logits[row, sure])) for row in range(3)] == [True, False, False]


# --------------------------------------------------------------------------- closing
PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 24},
    "tags": {"type": "array", "items": {"type": "string"}},
    "age": {"type": "integer", "minimum": 0, "maximum": 120}},
    "required": ["name", "age"], "additionalProperties": False}


def v1_run(processor: PegmaskLogitsProcessor, params: list[SamplingParams], width: int,
           seed: int) -> list[list[int]]:
    """Decode a batch through the V1 interface on random logits (noise the mask must hold
    in), each row until EOS or its max_tokens; the outputs without EOS."""
    outputs: list[list[int]] = [[] for _ in params]
    processor.update_state(BatchUpdate(batch_size=len(params), removed=[], moved=[], added=[
        (i, p, [1], outputs[i]) for i, p in enumerate(params)]))
    generator = torch.Generator().manual_seed(seed)
    live = set(range(len(params)))
    while live:
        logits = processor.apply(torch.randn(len(params), width, generator=generator))
        for row in sorted(live):
            token = pick(logits, row)
            outputs[row].append(token)
            if token == 2 or len(outputs[row]) == params[row].max_tokens:
                live.discard(row)
    return [out[:-1] if out and out[-1] == 2 else out for out in outputs]


@pytest.mark.parametrize("budget", [12, 17, 30])
def test_v1_closes_json_within_max_tokens(tokenizer_dir: str, budget: int) -> None:
    """Every row ends on a complete document within its max_tokens, cut or not; with
    close_on_length false in vllm_xargs the same noise leaves documents cut."""
    width = len(smollm2_tokenizer())
    spec = json.dumps({"json_schema": PERSON})
    cut = 0
    for seed in range(4):
        processor = PegmaskLogitsProcessor(config(tokenizer_dir, width, rows=2),
                                           torch.device("cpu"), False)
        closing = SamplingParams(max_tokens=budget, extra_args={"pegmask": spec})
        plain = SamplingParams(max_tokens=budget, extra_args={
            "pegmask": spec, "close_on_length": False})
        closed, open_ = v1_run(processor, [closing, plain], width, seed)
        assert len(closed) <= budget
        jsonschema.validate(json.loads(text(closed)), PERSON)
        try:
            jsonschema.validate(json.loads(text(open_)), PERSON)
        except ValueError:
            cut += 1
    assert cut >= 2  # without closing, noise is mostly cut mid-document


def test_close_on_length_is_checked_and_read_from_xargs() -> None:
    spec = json.dumps({"regex": "a+"})
    assert request_budget(SamplingParams(max_tokens=9, extra_args={"pegmask": spec})) == 9
    for off in (False, 0, "false"):
        assert request_budget(SamplingParams(max_tokens=9, extra_args={
            "pegmask": spec, "close_on_length": off})) is None
    with pytest.raises(ValueError, match="close_on_length must be true or false"):
        PegmaskLogitsProcessor.validate_params(SamplingParams(extra_args={
            "pegmask": spec, "close_on_length": "maybe"}))
    # through vLLM's own request model: vllm_xargs carries the flag to the SamplingParams
    req = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "Hi"}],
                                max_completion_tokens=5, vllm_xargs={"pegmask": spec,
                                                          "close_on_length": False})
    params = req.to_sampling_params(max_tokens=5, default_sampling_params={})
    assert request_budget(params) is None and request_spec(params) == spec


@pytest.fixture
def runner_states(monkeypatch: pytest.MonkeyPatch) -> RequestState:
    """The V2 model runner's own per-slot request state. vLLM backs it with pinned memory on a
    CPU platform; this machine has none, so it takes vLLM's explicit-copy fallback
    (`NonUvaBuffer`, as on platforms without pinned memory)."""
    monkeypatch.setattr(buffer_utils, "is_uva_available", lambda: False)
    return RequestState(max_num_reqs=4, max_model_len=96, max_num_batched_tokens=96,
                        num_speculative_steps=0, vocab_size=len(smollm2_tokenizer()),
                        device=torch.device("cpu"))


def v2_run(states: RequestState, params: list[SamplingParams], tokenizer_dir: str,
           seed: int) -> list[list[int]]:
    """Decode a batch through the V2 interface on random logits, the processor built by the V2
    runner's own loader over its `RequestState`, the last request free. Each step's newest
    token is only in input_ids; the ones before it are committed to all_token_ids after the
    step. (The runner commits with Triton kernels, which this CPU build of vLLM lacks: the
    test writes the same cells.)"""
    width, prompt = states.vocab_size, [1, 5, 7]
    [processor] = build_custom_logits_processors(
        config(tokenizer_dir, width), states, False, [PegmaskLogitsProcessor])
    slot_of = []
    for i, p in enumerate(params):
        states.add_request(f"r{i}", prompt_len=len(prompt), all_token_ids=prompt,
                           num_computed_tokens=0, max_tokens=p.max_tokens)
        slot = states.req_id_to_index[f"r{i}"]
        states.all_token_ids.clear_staged_writes()  # (applied by a Triton kernel)
        states.all_token_ids.gpu[slot, :len(prompt)] = torch.tensor(prompt)
        assert processor.add_request(slot, p) is (i < len(params) - 1)
        slot_of.append(slot)
    states.prompt_len.copy_to_uva()
    processor.apply_staged_writes()
    outputs: list[list[int]] = [[] for _ in params]
    live = list(range(len(params)))
    generator = torch.Generator().manual_seed(seed)
    while live:
        fed = [outputs[r][-1] if outputs[r] else prompt[-1] for r in live]
        pos = [len(prompt) - 1 + len(outputs[r]) for r in live]
        mapping = np.array([slot_of[r] for r in live])
        ctx = LogitsContext(
            expanded_idx_mapping=torch.from_numpy(mapping), idx_mapping=torch.from_numpy(mapping),
            idx_mapping_np=mapping, expanded_local_pos=torch.zeros(len(live), dtype=torch.int64),
            input_ids=torch.tensor(fed), pos=torch.tensor(pos),
            seq_lens_upper_bound_np=np.array(pos) + 1)
        logits = torch.randn(len(live), width, generator=generator)
        free = logits[-1].clone() if live[-1] == len(params) - 1 else None
        logits = processor.apply(logits, ctx)
        if free is not None:
            assert torch.equal(logits[-1], free)  # the free request's row is untouched
        for i, row in enumerate(list(live)):
            if outputs[row]:  # commit the token fed this step
                states.all_token_ids.gpu[slot_of[row], len(prompt) + len(outputs[row]) - 1] = \
                    outputs[row][-1]
            token = pick(logits, i)
            outputs[row].append(token)
            if token == 2 or len(outputs[row]) == params[row].max_tokens:
                live.remove(row)
    return [out[:-1] if out and out[-1] == 2 else out for out in outputs]


@pytest.mark.parametrize("budget", [13, 25])
def test_v2_closes_within_max_tokens(runner_states: RequestState, tokenizer_dir: str,
                                     budget: int) -> None:
    """V2: each row follows its slot's committed tokens and the one fed this step, and ends
    complete within its max_tokens."""
    validate = build_custom_logits_processors_params_validator([PegmaskLogitsProcessor])
    specs = [{"json_schema": PERSON}, {"regex": "[a-z]{4,}@[a-z]{6,}\\.com"}]
    params = [SamplingParams(max_tokens=budget, extra_args={"pegmask": json.dumps(s)})
              for s in specs] + [SamplingParams(max_tokens=budget)]
    for p in params:
        validate(p)
    for seed in range(3):
        for req_id in list(runner_states.req_id_to_index):
            runner_states.remove_request(req_id)
        document, address, _ = v2_run(runner_states, params, tokenizer_dir, seed)
        assert len(document) <= budget and len(address) <= budget
        jsonschema.validate(json.loads(text(document)), PERSON)
        assert re.fullmatch("[a-z]{4,}@[a-z]{6,}\\.com", text(address)), text(address)


# --------------------------------------------------------------------------- without vllm_xargs
def admitted(request: ChatCompletionRequest, runner: str) -> SamplingParams:
    """The request's SamplingParams as vLLM's serving layer builds them, after admission by
    the runner's own validator (where the processor takes vLLM's structured outputs)."""
    params = request.to_sampling_params(max_tokens=request.max_completion_tokens or 16,
                                        default_sampling_params={})
    if runner == "v1":
        validate_logits_processors_parameters([PegmaskLogitsProcessor], params)
    else:
        build_custom_logits_processors_params_validator([PegmaskLogitsProcessor])(params)
    return params


def chat(**options) -> ChatCompletionRequest:
    return ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "Hi"}],
                                 **options)


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_response_formats_go_to_pegmask_when_the_server_says_so(
        monkeypatch: pytest.MonkeyPatch, runner: str) -> None:
    schema_format = {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}
    params = admitted(chat(response_format=schema_format, max_completion_tokens=20), runner)
    assert params.structured_outputs is not None and request_spec(params) is None  # vLLM's

    monkeypatch.setenv("PEGMASK_VLLM_STRUCTURED_OUTPUTS", "1")
    params = admitted(chat(response_format=schema_format, max_completion_tokens=20), runner)
    assert params.structured_outputs is None
    assert json.loads(request_spec(params)) == {"json_schema": PERSON}
    params = admitted(chat(response_format={"type": "json_object"}), runner)
    assert params.structured_outputs is None
    assert json.loads(request_spec(params)) == {"json_object": True}
    grammar = admitted(chat(structured_outputs={"grammar": 'root ::= "a"'}), runner)
    assert grammar.structured_outputs.grammar and request_spec(grammar) is None  # vLLM's
    mine = admitted(chat(response_format={"type": "json_object"},
                         vllm_xargs={"pegmask": '{"regex": "x"}'}), runner)
    assert request_spec(mine) == '{"regex": "x"}'  # an explicit constraint wins


def test_tool_choice_required_of_another_tool_parser_goes_to_pegmask(
        monkeypatch: pytest.MonkeyPatch, tokenizer_dir: str) -> None:
    """vLLM's pythonic tool parser asks its backend for a JSON array of calls for required and
    named tool_choice; with the variable set pegmask enforces that schema, and closes it within
    max_tokens. (Parsers that ask for an xgrammar structural tag instead, hermes among them,
    keep vLLM's backend.)"""
    monkeypatch.setenv("PEGMASK_VLLM_STRUCTURED_OUTPUTS", "1")
    parser = ToolParserManager.get_tool_parser("pythonic")(smollm2_tokenizer())
    width = len(smollm2_tokenizer())
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        req = parser.adjust_request(chat(tools=[WEATHER], tool_choice=choice, max_completion_tokens=24))
        params = admitted(req, "v1")
        assert params.structured_outputs is None
        schema = json.loads(request_spec(params))["json_schema"]
        processor = PegmaskLogitsProcessor(config(tokenizer_dir, width, rows=1),
                                           torch.device("cpu"), False)
        [output] = v1_run(processor, [params], width, seed=0)
        assert len(output) <= 24
        jsonschema.validate(json.loads(text(output)), schema)


PEOPLE = {"type": "object", "properties": {"people": {"type": "array", "minItems": 1,
                                                    "items": PERSON}},
          "required": ["people"], "additionalProperties": False}


def test_smollm2_answer_cut_by_max_tokens_is_complete_json(tokenizer_dir: str) -> None:
    """The embedded SmolLM2 (greedy) lists people past the budget, through the V1 interface:
    the request that closes ends on a valid document, the one with close_on_length false in
    vllm_xargs is cut."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from pegmask.engine.model import load_backend

    backend = load_backend()
    width, budget = backend.logits_width, 30
    chat_text = backend.tokenizer.apply_chat_template(
        [{"role": "user", "content": "List ten famous scientists as JSON: an object with "
                                     "people, each a name and an age."}],
        tokenize=False, add_generation_prompt=True)
    prompt = backend.tokenizer.encode(chat_text, add_special_tokens=False)
    spec = json.dumps({"json_schema": PEOPLE})
    outputs: list[list[int]] = []
    for close in (True, False):
        xargs = {"pegmask": spec} if close else {"pegmask": spec, "close_on_length": False}
        processor = PegmaskLogitsProcessor(config(tokenizer_dir, width, rows=1),
                                           torch.device("cpu"), False)
        output: list[int] = []
        processor.update_state(BatchUpdate(batch_size=1, removed=[], moved=[], added=[
            (0, SamplingParams(max_tokens=budget, extra_args=xargs), prompt, output)]))
        with torch.inference_mode():
            step = backend.model(torch.tensor([prompt]), use_cache=True)
            while True:
                output.append(pick(processor.apply(step.logits[:, -1].float()), 0))
                if len(output) == budget or output[-1] == 2:
                    break
                step = backend.model(torch.tensor([output[-1:]]), use_cache=True,
                                     past_key_values=step.past_key_values)
        outputs.append(output)
    closed, cut = (text([t for t in out if t != 2]) for out in outputs)
    assert len(outputs[0]) <= budget
    jsonschema.validate(json.loads(closed), PEOPLE)
    assert len(outputs[1]) == budget
    with pytest.raises(json.JSONDecodeError):
        json.loads(cut)
