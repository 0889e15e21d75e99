"""pegmask's LogitsProcessor inside transformers' `generate`: the embedded SmolLM2 writing JSON
under a schema and a Hermes tool call, batches mixing constraints and free rows, sampling,
beam search, closing within `max_new_tokens`, and the errors a misuse gets."""

from __future__ import annotations

import json
import os
import re
from typing import Any

import jsonschema
import pytest
import torch
from transformers import LogitsProcessor

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from pegmask.engine.model import ModelBackend, load_backend  # noqa: E402
from pegmask.engine.requests import InvalidRequestError  # noqa: E402
from pegmask.grammars.vocab import Vocabulary  # noqa: E402
from pegmask.integrations.constraints import Constraints, chat_request  # noqa: E402
from pegmask.integrations.transformers import (  # noqa: E402
    PegmaskLogitsProcessor,
    model_vocabulary,
)

PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 24},
    "age": {"type": "integer", "minimum": 0, "maximum": 120}},
    "required": ["name", "age"], "additionalProperties": False}
PHONE = r"[0-9]{3}-[0-9]{4}"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 32},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}


@pytest.fixture(scope="module")
def smollm2() -> ModelBackend:
    return load_backend()


@pytest.fixture(scope="module")
def constraints(smollm2: ModelBackend) -> Constraints:
    return Constraints(model_vocabulary(smollm2.model, smollm2.tokenizer))


def pad_id(backend: ModelBackend) -> int:
    """The id `generate` pads finished rows with: the tokenizer's pad token, else its EOS."""
    tokenizer = backend.tokenizer
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def chat_batch(backend: ModelBackend, prompts: list[str]) -> dict[str, torch.Tensor]:
    tokenizer = backend.tokenizer
    tokenizer.padding_side = "left"
    return tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)


def user(backend: ModelBackend, text: str) -> str:
    return backend.tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                                 tokenize=False, add_generation_prompt=True)


def outputs(backend: ModelBackend, batch: dict,
            sequences: torch.Tensor) -> list[tuple[list[int], bool]]:
    """Each row's generated ids up to (without) its EOS, and whether an EOS ended it (else
    max_new_tokens cut it)."""
    eos = set(backend.vocab.eos_ids)
    rows = []
    for row in sequences[:, batch["input_ids"].shape[1]:].tolist():
        end = next((i for i, token in enumerate(row) if token in eos), None)
        rows.append((row[:end], end is not None))
    return rows

def assert_follows(spec: dict, ids: list[int], backend: ModelBackend, vocab: Any) -> None:
    """A finished output follows its constraint: its schema, pattern or choice, or (a chat
    spec) it holds tool calls whose arguments follow the weather tool's parameters."""
    text = backend.tokenizer.decode(ids)
    if "json_schema" in spec:
        jsonschema.validate(json.loads(text), spec["json_schema"])
    elif "regex" in spec:
        assert re.fullmatch(PHONE, text), text
    elif "choice" in spec:
        assert text in ("yes", "no")
    else:
        dialect, request = chat_request(spec)
        calls = dialect.parse(ids, request, vocab, trusted=True)["tool_calls"]
        assert calls, text
        for call in calls:
            jsonschema.validate(json.loads(call["function"]["arguments"]),
                                WEATHER["function"]["parameters"])



def test_model_vocabulary_is_the_engines(smollm2: ModelBackend, constraints: Constraints) -> None:
    vocab = constraints.vocab
    assert vocab.size == smollm2.logits_width == smollm2.vocab.size
    assert vocab.eos_ids == smollm2.vocab.eos_ids
    assert vocab.token_bytes == smollm2.vocab.token_bytes


def test_greedy_batch_mixes_a_schema_a_regex_and_a_free_row(
        smollm2: ModelBackend, constraints: Constraints) -> None:
    batch = chat_batch(smollm2, [
        user(smollm2, "Describe a person as JSON with a name and an age."),
        user(smollm2, "Write a phone number."),
        user(smollm2, "What is the capital of France?"),
    ])
    options = {"max_new_tokens": 32, "do_sample": False, "pad_token_id": pad_id(smollm2)}
    processor = PegmaskLogitsProcessor(constraints, [{"json_schema": PERSON},
                                                     {"regex": PHONE}, None])
    masked = smollm2.model.generate(**batch, logits_processor=[processor], **options)
    free = smollm2.model.generate(**batch, **options)
    rows = outputs(smollm2, batch, masked)
    assert rows[0][1] and rows[1][1]  # both constrained rows ended with EOS
    person, phone, answer = (smollm2.tokenizer.decode(ids) for ids, _ in rows)
    jsonschema.validate(json.loads(person), PERSON)
    assert re.fullmatch(PHONE, phone), phone
    # The free row is untouched: the same greedy tokens as without the processor.
    assert rows[2] == outputs(smollm2, batch, free)[2]
    assert "Paris" in answer


def test_tool_call_under_the_hermes_grammar_with_sampling(
        smollm2: ModelBackend, constraints: Constraints) -> None:
    spec = {"dialect": "hermes", "reasoning": False, "tools": [WEATHER],
            "tool_choice": "required", "parallel_tool_calls": False}
    dialect, request = chat_request(spec)
    prompt = dialect.render([{"role": "user", "content": "What's the weather in Tokyo?"}],
                            tools=[WEATHER])
    batch = chat_batch(smollm2, [prompt])
    processor = PegmaskLogitsProcessor(constraints, [spec])
    torch.manual_seed(0)
    sequences = smollm2.model.generate(
        **batch, logits_processor=[processor], max_new_tokens=60, do_sample=True,
        temperature=1.0, num_return_sequences=2, pad_token_id=pad_id(smollm2))
    assert len(processor.rows) == 2  # one matcher per returned sequence, one constraint
    for ids, ended in outputs(smollm2, batch, sequences):
        assert ended, smollm2.tokenizer.decode(ids)
        message = dialect.parse(ids, request, constraints.vocab, trusted=True)
        assert message["content"] is None, message
        [call] = message["tool_calls"]
        assert call["function"]["name"] == "get_weather"
        jsonschema.validate(json.loads(call["function"]["arguments"]),
                            WEATHER["function"]["parameters"])


def test_beam_search_keeps_every_beam_in_the_grammar(
        smollm2: ModelBackend, constraints: Constraints) -> None:
    """Beams are reordered between steps: each row's matcher rolls back to what it shares
    with the row it now holds."""
    batch = chat_batch(smollm2, [user(smollm2, "Write a phone number.")])
    processor = PegmaskLogitsProcessor(constraints, {"regex": PHONE})
    sequences = smollm2.model.generate(
        **batch, logits_processor=[processor], max_new_tokens=12, num_beams=3,
        num_return_sequences=3, do_sample=False, pad_token_id=pad_id(smollm2))
    texts = [smollm2.tokenizer.decode(ids) for ids, _ in outputs(smollm2, batch, sequences)]
    assert len(set(texts)) == 3
    for text in texts:
        assert re.fullmatch(PHONE, text), texts


@pytest.fixture(scope="module")
def noise_model(smollm2: ModelBackend) -> tuple[torch.nn.Module, Vocabulary]:
    """A tiny random Llama with SmolLM2's tokenizer: noise, which the mask must hold in."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=smollm2.logits_width, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                         max_position_embeddings=512, eos_token_id=smollm2.vocab.eos_ids[0],
                         pad_token_id=pad_id(smollm2))
    model = LlamaForCausalLM(config).eval()
    return model, model_vocabulary(model, smollm2.tokenizer)


def test_noise_rows_with_different_grammars_stay_inside_them(
        smollm2: ModelBackend, noise_model: tuple) -> None:
    model, vocab = noise_model
    tool = {"dialect": "hermes", "reasoning": False, "tools": [WEATHER],
            "tool_choice": "required"}
    specs = [{"json_schema": PERSON}, {"regex": PHONE}, tool, {"choice": ["yes", "no"]}, None]
    batch = chat_batch(smollm2, [user(smollm2, "Go.")] * len(specs))
    finished = 0
    for seed in range(3):
        processor = PegmaskLogitsProcessor(vocab, specs)
        torch.manual_seed(seed)
        sequences = model.generate(**batch, logits_processor=[processor], max_new_tokens=80,
                                   do_sample=True, temperature=1.0, top_k=0,
                                   pad_token_id=pad_id(smollm2))
        rows = outputs(smollm2, batch, sequences)
        for spec, (ids, ended) in zip(specs, rows, strict=True):
            if spec is None or not ended:
                continue  # free, or cut off by max_new_tokens
            finished += 1
            assert_follows(spec, ids, smollm2, vocab)
    assert finished >= 4


PEOPLE = {"type": "object", "properties": {"people": {"type": "array", "items": PERSON,
                                                    "minItems": 1}},
          "required": ["people"], "additionalProperties": False}


def test_an_answer_cut_by_max_new_tokens_is_still_complete_json(
        smollm2: ModelBackend, constraints: Constraints) -> None:
    """SmolLM2 lists people well past the budget: without closing the JSON is cut mid-way,
    with it (the default) the same budget ends on a complete, valid document (heading for the
    end as the budget runs out, it may end before it)."""
    batch = chat_batch(smollm2, [user(smollm2, "List ten famous scientists as JSON: an "
                                               "object with people, each a name and an age.")])
    budget = 30
    options = {"max_new_tokens": budget, "do_sample": False, "pad_token_id": pad_id(smollm2)}
    texts = {}
    for close in (False, True):
        processor = PegmaskLogitsProcessor(constraints, {"json_schema": PEOPLE},
                                           max_new_tokens=budget, close_on_length=close)
        sequences = smollm2.model.generate(**batch, logits_processor=[processor], **options)
        [(ids, ended)] = outputs(smollm2, batch, sequences)
        assert len(ids) <= budget
        texts[close] = smollm2.tokenizer.decode(ids)
        if not close:
            assert len(ids) == budget and not ended, texts  # the budget cut it
    with pytest.raises(json.JSONDecodeError):
        json.loads(texts[False])
    answer = json.loads(texts[True])
    jsonschema.validate(answer, PEOPLE)
    # The same greedy start: closing changes only the end.
    assert texts[True][:20] == texts[False][:20], texts


@pytest.mark.parametrize("budget", [14, 23, 40])
def test_noise_cut_by_any_budget_ends_complete(smollm2: ModelBackend, noise_model: tuple,
                                               budget: int) -> None:
    """Random logits, a budget that cuts most rows: every constrained row still parses, ended
    by EOS or not. (A tool call under Hermes' grammar takes about 30 tokens at least.)"""
    model, vocab = noise_model
    tool = {"dialect": "hermes", "reasoning": False, "tools": [WEATHER],
            "tool_choice": "required"}
    specs = [{"json_schema": PERSON}, {"json_schema": PEOPLE}, {"regex": PHONE},
             {"choice": ["yes", "no"]}] + ([tool] if budget >= 40 else [])
    batch = chat_batch(smollm2, [user(smollm2, "Go.")] * len(specs))
    for seed in range(3):
        processor = PegmaskLogitsProcessor(vocab, specs, max_new_tokens=budget)
        torch.manual_seed(seed)
        sequences = model.generate(**batch, logits_processor=[processor], max_new_tokens=budget,
                                   do_sample=True, temperature=1.0, top_k=0,
                                   pad_token_id=pad_id(smollm2))
        for spec, (ids, _) in zip(specs, outputs(smollm2, batch, sequences), strict=True):
            assert len(ids) <= budget
            assert_follows(spec, ids, smollm2, vocab)


class ForceToken(LogitsProcessor):
    """Leaves one token only: runs after the mask, so the mask cannot stop it."""

    def __init__(self, token: int):
        self.token = token

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        forced = torch.full_like(scores, float("-inf"))
        forced[:, self.token] = 0.0
        return forced


def test_a_token_outside_the_grammar_is_an_error_not_ignored(
        smollm2: ModelBackend, constraints: Constraints) -> None:
    batch = chat_batch(smollm2, [user(smollm2, "Write a phone number.")])
    letter = smollm2.tokenizer.convert_tokens_to_ids("x")
    processor = PegmaskLogitsProcessor(constraints, {"regex": PHONE})
    with pytest.raises(ValueError, match=r"row 0: token \d+ \('x'\) is outside the grammar"):
        smollm2.model.generate(**batch, logits_processor=[processor, ForceToken(letter)],
                               max_new_tokens=4, do_sample=False, pad_token_id=pad_id(smollm2))


def test_misuse_gets_clear_errors(smollm2: ModelBackend, constraints: Constraints) -> None:
    batch = chat_batch(smollm2, [user(smollm2, "Hi."), user(smollm2, "Hello.")])
    options = {"max_new_tokens": 2, "do_sample": False, "pad_token_id": pad_id(smollm2)}
    processor = PegmaskLogitsProcessor(constraints, [{"regex": PHONE}] * 3)
    with pytest.raises(ValueError, match="3 constraints for a batch of 2 rows"):
        smollm2.model.generate(**batch, logits_processor=[processor], **options)

    processor = PegmaskLogitsProcessor(constraints, {"regex": PHONE})
    smollm2.model.generate(**batch, logits_processor=[processor], **options)
    with pytest.raises(ValueError, match="serves one generate call"):
        smollm2.model.generate(**chat_batch(smollm2, [user(smollm2, "Other.")] * 2),
                               logits_processor=[processor], **options)

    wide = Vocabulary.from_hf(smollm2.tokenizer, smollm2.logits_width + 32)
    with pytest.raises(ValueError, match="model_vocabulary"):
        smollm2.model.generate(**batch, logits_processor=[PegmaskLogitsProcessor(
            wide, {"regex": PHONE})], **options)

    for spec, param in [({"regex": PHONE, "choice": ["a"]}, "pegmask"),
                        ({"json_schema": PERSON, "tools": []}, "tools"),
                        ({"regex": "[unclosed"}, "response_format"),
                        ({"dialect": "nope"}, "dialect"),
                        ({"dialect": "hermes", "tool_choice": "required"}, "tool_choice"),
                        ("{not json", "pegmask")]:
        with pytest.raises(InvalidRequestError) as info:
            PegmaskLogitsProcessor(constraints, [spec])
        assert info.value.param == param, (spec, info.value)


def test_a_dialect_row_starts_in_reasoning_where_its_prompt_opened_it(
        smollm2: ModelBackend, constraints: Constraints) -> None:
    """Rows after prompts whose template opened `<think>` itself, closed an empty block, or
    wrote none (SmolLM2's own): only the first starts inside reasoning, where answer text may
    come before the required call's tag."""
    spec = {"dialect": "hermes", "reasoning": False, "tools": [WEATHER],
            "tool_choice": "required"}
    prompt = user(smollm2, "What's the weather in Tokyo?")
    batch = chat_batch(smollm2, [prompt + "<think>\n", prompt + "<think>\n\n</think>\n\n",
                                 prompt])
    processor = PegmaskLogitsProcessor(constraints, spec)
    scores = processor(batch["input_ids"], torch.zeros(3, constraints.vocab.size))
    sure = smollm2.tokenizer.encode("Sure", add_special_tokens=False)[0]
    assert torch.isfinite(scores[:, sure]).tolist() == [True, False, False]
