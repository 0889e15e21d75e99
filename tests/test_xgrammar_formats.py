"""xgrammar's own grammars accept what pegmask writes for the families whose formats come from
xgrammar's structural tags and whose templates data/ lacks (EXAONE 4.0, MiniMax M3, Cohere's
XML calls): the random turns of test_families.py, rendered by each dialect's native renderer,
fed byte for byte to an xgrammar matcher compiled from `get_model_structural_tag` on the
family's vocabulary, which then takes the end-of-turn token and terminates. Tools declare
their nested types (xgrammar's strict mode reads an array without `items` as an empty one)."""

from __future__ import annotations

import dataclasses
import functools

import pytest
import xgrammar as xgr
from families import TYPED_VALUES, rendered_turn, turns
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_families import NATIVE

# family -> xgrammar 0.2.9's model key
XGRAMMAR_KEYS = {"exaone-4.0": "exaone", "minimax-m3": "minimax_m3",
                 "cohere-command-xml": "cohere"}


@functools.cache
def xgrammar_compiler(name: str) -> tuple[xgr.GrammarCompiler, int]:
    """xgrammar's compiler on the family's vocabulary, and the id of its end-of-turn token."""
    vocab, _ = NATIVE[name].vocab()
    encoded = [data if data is not None else vocab.special_names[i].encode("utf-8")
               for i, data in enumerate(vocab.token_bytes)]
    info = xgr.TokenizerInfo(encoded, stop_token_ids=sorted(vocab.eos_ids))
    return xgr.GrammarCompiler(info), vocab.special_ids[NATIVE[name].end]


@pytest.mark.parametrize("name", XGRAMMAR_KEYS)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_xgrammar_accepts_the_native_renderings(name: str, data: st.DataObject) -> None:
    family = dataclasses.replace(NATIVE[name], values=TYPED_VALUES, typed_schemas=True)
    tools, message, _, _, _ = data.draw(turns(family))
    output = rendered_turn(family, tools, message).removesuffix(family.end)
    compiler, end = xgrammar_compiler(name)
    tag = xgr.get_model_structural_tag(XGRAMMAR_KEYS[name], tools=tools, reasoning="enabled")
    matcher = xgr.GrammarMatcher(compiler.compile_grammar(xgr.Grammar.from_structural_tag(tag)))
    assert matcher.accept_string(output), output
    assert matcher.accept_token(end) and matcher.is_terminated(), output
