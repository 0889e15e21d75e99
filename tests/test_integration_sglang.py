"""The SGLang grammar backend against the installed SGLang 0.5.23 (scripts/make_sglang_venv.sh's
venv; not collected where SGLang is missing, see conftest.py): its grammar-object base classes,
its registration (the `sglang.srt.plugins` entry point run by SGLang's own `load_plugins`), its
vocabulary-mask batching (`SamplingBatchInfo.update_regex_vocab_mask`), and its grammar manager
binding grammars to requests, which is where pegmask's grammars learn `max_new_tokens` and close
within it. On SmolLM2's real tokenizer."""

from __future__ import annotations

import inspect
import json
import re

import jsonschema
import pytest
import torch
from sglang.srt.constrained import base_grammar_backend as sglang_base
from sglang.srt.constrained.base_grammar_backend import (
    BaseGrammarBackend,
    BaseGrammarObject,
    GrammarRow,
)
from sglang.srt.constrained.grammar_manager import GrammarManager
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
from sglang.srt.sampling.sampling_params import SamplingParams
from vocabularies import smollm2_tokenizer

from pegmask.integrations.sglang import (
    BACKEND_NAME,
    InvalidGrammarObject,
    PegmaskGrammar,
    PegmaskGrammarBackend,
    create_backend,
)
from pegmask.kernels import unpack_bitmask

pytestmark = pytest.mark.sglang

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
          "required": ["city", "days"], "additionalProperties": False}
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}}


@pytest.fixture(scope="module")
def backend() -> PegmaskGrammarBackend:
    """The backend as SGLang makes it: the init function its registry holds for the name,
    called with create_grammar_backend's arguments, after SGLang's own plugin loading ran
    pegmask's entry point."""
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import GRAMMAR_BACKEND_CHOICES

    load_plugins()
    assert BACKEND_NAME in GRAMMAR_BACKEND_CHOICES
    init = sglang_base.GRAMMAR_BACKEND_REGISTRY[BACKEND_NAME]
    assert init is create_backend
    tokenizer = smollm2_tokenizer()
    made = init(None, tokenizer, len(tokenizer), {tokenizer.eos_token_id})
    assert isinstance(made, BaseGrammarBackend)
    return made


def tokens(text: str) -> list[int]:
    return smollm2_tokenizer().encode(text, add_special_tokens=False)


def decode(grammar: PegmaskGrammar, backend: PegmaskGrammarBackend, ids: list[int],
           row: int = 1, batch: int = 3) -> None:
    """Drive `grammar` as SGLang's scheduler does: fill its row, check the token is allowed,
    apply the mask to logits, accept."""
    width = backend.constraints.vocab.size
    for token in ids:
        mask = grammar.allocate_vocab_mask(width, batch, "cpu")
        type(grammar).fill_vocab_mask_batched([GrammarRow(row=row, grammar=grammar)], mask)
        allowed = unpack_bitmask(mask.numpy(), width)
        assert allowed[row, token], smollm2_tokenizer().decode([token])
        assert allowed[0].all() and allowed[2].all()  # rows not filled stay free
        logits = torch.zeros(batch, width)
        grammar.apply_vocab_mask(logits, grammar.move_vocab_mask(mask, "cpu"))
        assert torch.isfinite(logits[row]).sum() == allowed[row].sum()
        grammar.accept_token(token)


def test_json_schema_grammar_follows_a_valid_output(backend: PegmaskGrammarBackend) -> None:
    grammar = backend.dispatch_json(json.dumps(SCHEMA))
    assert isinstance(grammar, PegmaskGrammar)
    text = tokens('{"city": "Paris", "days": 3}')
    decode(grammar, backend, text[:-1])
    assert not grammar.is_terminated()
    decode(grammar, backend, text[-1:])
    assert grammar.is_terminated()  # nothing can follow: SGLang ends the request here
    decode(grammar, backend, [smollm2_tokenizer().eos_token_id])  # only EOS is allowed now
    assert grammar.is_terminated()
    with pytest.raises(ValueError, match="outside the pegmask grammar"):
        backend.dispatch_json(json.dumps(SCHEMA)).accept_token(tokens("[")[0])


def test_rollback_and_copy(backend: PegmaskGrammarBackend) -> None:
    template = backend.dispatch_regex(r"(yes|no)-[0-9]{2}")
    grammar = template.copy()
    decode(grammar, backend, tokens("yes-4"))
    grammar.rollback(len(tokens("yes-4")))
    decode(grammar, backend, tokens("no-12"))
    assert grammar.is_terminated()
    fresh = template.copy()  # the cached template was never advanced
    with pytest.raises(ValueError):
        fresh.accept_token(tokens("-")[0])
    decode(fresh, backend, tokens("yes-07"))


def test_ebnf_takes_the_peg_dsl_or_a_dialect_constraint(backend: PegmaskGrammarBackend) -> None:
    decode(backend.dispatch_ebnf('root = "a" [0-9]+'), backend, tokens("a42"))
    spec = json.dumps({"dialect": "hermes", "reasoning": False, "tools": [TOOL],
                       "tool_choice": "required"})
    call = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}'
            "\n</tool_call>")
    grammar = backend.dispatch_ebnf(spec)
    decode(grammar, backend, tokens(call))
    with pytest.raises(ValueError):  # tool_choice "required": no free text first
        backend.dispatch_ebnf(spec).accept_token(tokens("Sure")[0])


@pytest.mark.parametrize(("kind", "key", "message"), [
    ("json", "{not json", "json_schema is not JSON"),
    ("regex", "[unclosed", "invalid regex"),
    ("ebnf", 'root ::= "a"', "GBNF"),
    ("ebnf", '{"dialect": "nope"}', "unknown dialect"),
    ("structural_tag", "{}", "structural tags"),
])
def test_bad_grammars_are_invalid_objects_with_the_reason(
        backend: PegmaskGrammarBackend, kind: str, key: str, message: str) -> None:
    grammar = getattr(backend, f"dispatch_{kind}")(key)
    assert isinstance(grammar, InvalidGrammarObject)
    assert message in grammar.error_message


def test_any_json(backend: PegmaskGrammarBackend) -> None:
    decode(backend.dispatch_json("$$ANY$$"), backend, tokens('[1, {"a": null}]'))


# --------------------------------------------------------------------------- SGLang's interface
def test_the_grammar_object_keeps_sglangs_interface() -> None:
    """Every method SGLang calls on a grammar object that pegmask overrides still has SGLang's
    signature (a renamed or reshaped method fails here, not on a live server)."""
    assert issubclass(PegmaskGrammar, BaseGrammarObject)
    assert issubclass(PegmaskGrammarBackend, BaseGrammarBackend)
    for name in ("accept_token", "rollback", "is_terminated", "allocate_vocab_mask",
                 "fill_vocab_mask", "reset_vocab_mask", "move_vocab_mask", "apply_vocab_mask",
                 "copy", "try_jump_forward"):
        ours, theirs = getattr(PegmaskGrammar, name), getattr(BaseGrammarObject, name)
        assert ours is not theirs, name
        assert (list(inspect.signature(ours).parameters)
                == list(inspect.signature(theirs).parameters)), name
    for name in ("dispatch_json", "dispatch_regex", "dispatch_ebnf", "dispatch_structural_tag"):
        assert (list(inspect.signature(getattr(PegmaskGrammarBackend, name)).parameters)
                == list(inspect.signature(getattr(BaseGrammarBackend, name)).parameters)), name
    create = inspect.signature(sglang_base.create_grammar_backend)
    assert list(create.parameters)[:4] == ["server_args", "tokenizer", "vocab_size",
                                           "eos_token_ids"]


class Request:
    """The parts of SGLang's `Req` its grammar manager touches (`schedule_batch.Req` imports
    SGLang's multimodal configs, which need torchvision)."""

    def __init__(self, params: SamplingParams, prompt_ids: list[int] | None = None):
        self.sampling_params = params
        self.origin_input_ids = prompt_ids or [1, 2, 3]
        self.require_reasoning = False
        self.grammar = None
        self.grammar_key = None
        self.grammar_wait_ct = 0
        self.aborted: str | None = None

    def finished(self) -> bool:
        return self.aborted is not None

    def set_finish_with_abort(self, message: str) -> None:
        self.aborted = message


def grammar_manager(backend: PegmaskGrammarBackend) -> GrammarManager:
    """SGLang's grammar manager over the pegmask backend, without a scheduler (single rank)."""
    manager = GrammarManager.__new__(GrammarManager)
    manager.grammar_backend = backend
    manager.grammar_queue = []
    manager._enable_strict_thinking = False
    manager.pp_rank, manager.pp_size, manager.pp_group = 0, 1, None
    manager.grammar_sync_size = 1
    manager.SGLANG_GRAMMAR_POLL_INTERVAL = 0.05
    manager.SGLANG_GRAMMAR_MAX_POLL_ITERATIONS = 1000
    return manager


def admitted(manager: GrammarManager, params: SamplingParams,
             prompt_ids: list[int] | None = None) -> Request:
    """A request through the grammar manager until its grammar is ready, as the scheduler
    does (compiled in the backend's executor, or copied from its cache)."""
    req = Request(params, prompt_ids)
    if manager.process_req_with_grammar(req):
        while req not in manager.get_ready_grammar_requests():
            pass
    assert isinstance(req.grammar, PegmaskGrammar), req.grammar
    return req


def run_batch(requests: list[Request], width: int, seed: int) -> list[list[int]]:
    """Decode as SGLang's scheduler does, on random logits: a batch mask from
    `SamplingBatchInfo.update_regex_vocab_mask` (a free row among them), applied by the mask's
    grammar, argmax, then `accept_token`; a row ends at EOS, when its grammar is terminated,
    or at max_new_tokens."""
    rows = len(requests) + 1  # the last row is free
    outputs: list[list[int]] = [[] for _ in requests]
    generator = torch.Generator().manual_seed(seed)
    eos = smollm2_tokenizer().eos_token_id
    while True:
        live = [i for i, req in enumerate(requests) if not req.grammar.finished]
        if not live:
            return outputs
        info = SamplingBatchInfo(
            temperatures=torch.ones(rows, 1), top_ps=torch.ones(rows), top_ks=torch.ones(rows),
            min_ps=torch.zeros(rows), is_all_greedy=True, is_any_greedy=True,
            need_top_p_sampling=False, need_top_k_sampling=False, need_min_p_sampling=False,
            vocab_size=width, grammars=[req.grammar for req in requests] + [None],
            device="cpu")
        info.update_regex_vocab_mask()
        logits = torch.randn(rows, width, generator=generator)
        free = logits[-1].clone()
        info.grammar_mask.apply(logits)
        assert torch.equal(logits[-1], free)
        for i in live:
            grammar, token = requests[i].grammar, int(torch.argmax(logits[i]))
            grammar.accept_token(token)
            outputs[i].append(token)
            if (token == eos or grammar.is_terminated()
                    or len(outputs[i]) == requests[i].sampling_params.max_new_tokens):
                grammar.finished = True


PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 24},
    "tags": {"type": "array", "items": {"type": "string"}},
    "age": {"type": "integer", "minimum": 0, "maximum": 120}},
    "required": ["name", "age"], "additionalProperties": False}
EMAIL = "[a-z]{4,}@[a-z]{6,}\\.com"


def text(ids: list[int]) -> str:
    eos = smollm2_tokenizer().eos_token_id
    return smollm2_tokenizer().decode([t for t in ids if t != eos])


@pytest.mark.parametrize("budget", [13, 21, 34])
def test_requests_close_within_max_new_tokens(backend: PegmaskGrammarBackend,
                                              budget: int) -> None:
    """Through SGLang's grammar manager (compiled, then cache hits) and mask batching: every
    constrained row ends complete within max_new_tokens; with custom_params close_on_length
    false the same noise leaves documents cut."""
    manager = grammar_manager(backend)
    width = backend.constraints.vocab.size
    cut = 0
    for seed in range(3):
        document = admitted(manager, SamplingParams(max_new_tokens=budget,
                                                    json_schema=json.dumps(PERSON)))
        address = admitted(manager, SamplingParams(max_new_tokens=budget, regex=EMAIL))
        plain = admitted(manager, SamplingParams(max_new_tokens=budget,
                                                 json_schema=json.dumps(PERSON),
                                                 custom_params={"close_on_length": False}))
        assert (document.grammar.budget, plain.grammar.budget) == (budget, None)
        ids = run_batch([document, address, plain], width, seed)
        assert all(len(out) <= budget for out in ids)
        jsonschema.validate(json.loads(text(ids[0])), PERSON)
        assert re.fullmatch(EMAIL, text(ids[1])), text(ids[1])
        try:
            jsonschema.validate(json.loads(text(ids[2])), PERSON)
        except ValueError:
            cut += 1
    assert cut >= 2


def test_a_cached_grammar_is_a_fresh_one_with_its_own_budget(
        backend: PegmaskGrammarBackend) -> None:
    manager = grammar_manager(backend)
    key = json.dumps({"type": "object", "properties": {"k": {"type": "string"}}})
    first = admitted(manager, SamplingParams(max_new_tokens=50, json_schema=key))
    first.grammar.accept_token(smollm2_tokenizer().encode("{", add_special_tokens=False)[0])
    second = admitted(manager, SamplingParams(max_new_tokens=7, json_schema=key))  # cache hit
    assert second.grammar is not first.grammar
    assert (second.grammar.budget, second.grammar.accepted) == (7, 0)
    assert first.grammar.budget == 50


def test_a_dialect_grammar_starts_in_reasoning_where_the_prompt_opened_it(
        backend: PegmaskGrammarBackend) -> None:
    """The same dialect constraint (reasoning off, a call required) after prompts whose template
    opened `<think>` itself, closed an empty block, or wrote none (SmolLM2's own): the first
    compiled, the others cache hits; only the first output starts inside reasoning."""
    manager = grammar_manager(backend)
    spec = json.dumps({"dialect": "hermes", "reasoning": False, "tools": [TOOL],
                       "tool_choice": "required"})
    prompt = smollm2_tokenizer().apply_chat_template(
        [{"role": "user", "content": "Weather in Paris?"}], tokenize=False,
        add_generation_prompt=True)
    sure = tokens("Sure")[0]
    started = []
    for tail in ("<think>\n", "<think>\n\n</think>\n\n", ""):
        req = admitted(manager, SamplingParams(max_new_tokens=100, ebnf=spec),
                       tokens(prompt + tail))
        started.append(req.grammar.matcher.accept_token(sure))
    assert started == [True, False, False]


def test_mask_buffers_are_sglangs_layout(backend: PegmaskGrammarBackend) -> None:
    grammar = backend.dispatch_regex("[0-9]+")
    mask = grammar.allocate_vocab_mask(backend.constraints.vocab.size, 2, "cpu")
    assert mask.dtype == torch.int32 and mask.shape == (2, (backend.constraints.vocab.size + 31)
                                                        // 32)
    grammar.fill_vocab_mask(mask, 1)
    grammar.reset_vocab_mask(mask)
    assert bool((mask == -1).all())
