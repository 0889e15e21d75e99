"""pegmask's vLLM plugin against the installed vLLM (scripts/vllm_check.sh's venv; not collected
where vLLM is missing, see conftest.py): parser registration, the parsers composed by vLLM's
own `ParserManager` and driven like its serving layer (whole and streamed) on SmolLM2's real
tokenizer, and the logits processor through both model runners' interfaces."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from vllm import SamplingParams
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.parser.parser_manager import ParserManager
from vllm.reasoning import ReasoningParserManager
from vllm.tool_parsers import ToolParser, ToolParserManager
from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality
from vllm.v1.worker.gpu.sample.logits_processor import LogitsContext, LogitsProcRequestState
from vocabularies import smollm2_tokenizer

from pegmask.dialects import dialect_names
from pegmask.integrations import vllm as plugin
from pegmask.integrations.vllm.logits import PegmaskLogitsProcessor

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

    parser = composed()
    ids = smollm2_tokenizer().encode(output, add_special_tokens=False)
    prompt = smollm2_tokenizer().apply_chat_template(
        [{"role": "user", "content": "Weather in Paris?"}], add_generation_prompt=True)
    pieces = {"reasoning": "", "content": "", "calls": {}}
    for i, token in enumerate(ids):
        text = smollm2_tokenizer().decode([token])
        delta = parser.parse_delta(text, [token], req, prompt_token_ids=prompt["input_ids"],
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


def test_reasoning_end_is_found_in_outputs_not_prompts() -> None:
    parser = composed().reasoning_parser
    encode = smollm2_tokenizer().encode
    prompt = smollm2_tokenizer().apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        tokenize=False, add_generation_prompt=True)
    assert not parser.is_reasoning_end(encode(prompt, add_special_tokens=False))
    thinking = encode("<think>\nstill going", add_special_tokens=False)
    assert not parser.is_reasoning_end(thinking)
    done = encode("<think>\nok\n</think>\n\nHello there", add_special_tokens=False)
    assert parser.is_reasoning_end(done)
    content = parser.extract_content_ids(done)
    assert smollm2_tokenizer().decode(content).strip().startswith("Hello")


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


def test_v2_processor_reads_committed_tokens_and_the_fed_one(tokenizer_dir: str) -> None:
    width, slots, length = len(smollm2_tokenizer()), 4, 64
    all_ids = torch.zeros(slots, length, dtype=torch.int64)
    prompt_len = np.zeros(slots, dtype=np.int32)
    states = LogitsProcRequestState(
        device=torch.device("cpu"), max_num_reqs=slots, vocab_size=width,
        all_token_ids=SimpleNamespace(gpu=all_ids), prompt_len=SimpleNamespace(np=prompt_len),
        prefill_len=SimpleNamespace(np=prompt_len), total_len=SimpleNamespace(gpu=None))
    processor = PegmaskLogitsProcessor(config(tokenizer_dir, width), states)
    assert processor.add_request(3, masked_params({"regex": "[0-9]{2}-[0-9]{2}"})) is True
    assert processor.add_request(1, SamplingParams()) is False
    processor.apply_staged_writes()
    prompt = [1, 5, 7]
    prompt_len[3] = len(prompt)
    all_ids[3, :3] = torch.tensor(prompt)
    generated: list[int] = []
    generator = torch.Generator().manual_seed(1)
    for _ in range(10):
        position = len(prompt) - 1 + len(generated)
        fed = all_ids[3, position].item() if not generated else generated[-1]
        # batch order: slot 1 then slot 3; the newest token is only in input_ids
        ctx = LogitsContext(
            expanded_idx_mapping=torch.tensor([1, 3]), idx_mapping=torch.tensor([1, 3]),
            idx_mapping_np=np.array([1, 3]), expanded_local_pos=torch.zeros(2, dtype=torch.int64),
            input_ids=torch.tensor([0, fed]), pos=torch.tensor([0, position]),
            seq_lens_upper_bound_np=np.array([1, position + 1]))
        logits = torch.randn(2, width, generator=generator)
        free = logits[0].clone()
        processor.apply(logits, ctx)
        assert torch.equal(logits[0], free)
        token = pick(logits, 1)
        if generated:  # commit the token fed this step, as the runner does after it
            all_ids[3, len(prompt) + len(generated) - 1] = generated[-1]
        generated.append(token)
        if token == 2:
            break
    assert generated[-1] == 2
    value = text(generated[:-1])
    assert len(value) == 5 and value[2] == "-" and (value[:2] + value[3:]).isdigit(), value


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
