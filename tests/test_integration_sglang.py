"""The SGLang grammar backend against the contract SGLang 0.5.23 drives (accept, rollback, fill
the int32 bitmask, apply it, termination, copy), on SmolLM2's real tokenizer. SGLang itself is
not installed here: the backend derives from the stand-in base classes."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from vocabularies import smollm2_tokenizer

from pegmask.integrations.sglang import (
    InvalidGrammarObject,
    PegmaskGrammar,
    PegmaskGrammarBackend,
    create_backend,
)
from pegmask.kernels import unpack_bitmask

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
          "required": ["city", "days"], "additionalProperties": False}
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}}


@pytest.fixture(scope="module")
def backend() -> PegmaskGrammarBackend:
    tokenizer = smollm2_tokenizer()
    return create_backend(SimpleNamespace(), tokenizer, len(tokenizer), [tokenizer.eos_token_id])


def tokens(text: str) -> list[int]:
    return smollm2_tokenizer().encode(text, add_special_tokens=False)


def decode(grammar: PegmaskGrammar, backend: PegmaskGrammarBackend, ids: list[int],
           row: int = 1, batch: int = 3) -> None:
    """Drive `grammar` as SGLang's scheduler does: fill its row, check the token is allowed,
    apply the mask to logits, accept."""
    width = backend.constraints.vocab.size
    for token in ids:
        mask = grammar.allocate_vocab_mask(width, batch, "cpu")
        type(grammar).fill_vocab_mask_batched([SimpleNamespace(row=row, grammar=grammar)], mask)
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
