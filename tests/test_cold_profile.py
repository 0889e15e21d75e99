"""`pegmask.bench.cold_profile`'s recorder, on the real SmolLM2 vocabulary: it must see the
masks the automaton computes, tell their kinds apart, find the repeated ones, and leave
`CompiledGrammar` as it was (it wraps private methods, which a refactoring may rename)."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from vocabularies import smollm2

from pegmask.bench.cold_profile import KINDS, WRAPPED, Recorder, recording
from pegmask.grammars.compiler import CompiledGrammar, compile_grammar
from pegmask.grammars.grammar import Grammar


def test_recorder_tells_mask_kinds_apart_and_counts_repeated_masks():
    schema = {"type": "object",
              "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}
    compiled = compile_grammar(Grammar.from_json_schema(schema), smollm2())
    methods = {name: getattr(CompiledGrammar, name) for name in WRAPPED}
    recorder = Recorder()
    with recording(recorder):
        state = compiled.initial_state
        for byte in b'{"a": 12, "b": 12}':
            compiled.mask(state)
            state = compiled.next_state(state, byte)
    assert {name: getattr(CompiledGrammar, name) for name in methods} == methods
    # Every mask computed is recorded once, and every kind occurs on this schema: the runs
    # after `{`, `:` and `,`, the punctuation, the keys (any other key is allowed beside the
    # names: plain text), and the integers. The second member repeats the first's masks.
    assert len(recorder.masks) == len(compiled._masks)
    assert {mask.kind for mask in recorder.masks} == set(KINDS)
    assert all(mask.seconds >= 0 and mask.configurations >= 0 for mask in recorder.masks)
    # Repeated masks are those equal, bit for bit, to one of another configuration.
    distinct = {packed.tobytes() for packed, _, _ in compiled._masks.values()}
    repeated = sum(mask.repeated for mask in recorder.masks)
    assert repeated == len(compiled._masks) - len(distinct) > 0


# Small JSON Schemas that share members: a key met in one grammar comes again in another.
_SCALARS = st.sampled_from([{"type": "integer"}, {"type": "boolean"}, {"type": "string"},
                            {"type": "number"}, {"enum": ["red", "green"]},
                            {"type": "string", "maxLength": 3}])
_SCHEMAS = st.recursive(_SCALARS, lambda inner: st.one_of(
    st.builds(lambda props: {"type": "object", "properties": props, "required": sorted(props)},
              st.dictionaries(st.sampled_from(["a", "id", "name"]), inner, min_size=1,
                              max_size=3)),
    st.builds(lambda item: {"type": "array", "items": item}, inner)), max_leaves=4)


def _walk_under_masks(compiled: CompiledGrammar, rng: random.Random, steps: int) -> None:
    """Masks along a random path of ordinary tokens each mask allows."""
    vocab, state = compiled.vocab, compiled.initial_state
    for _ in range(steps):
        packed, _ = compiled.mask(state)
        bits = np.unpackbits(packed.view(np.uint8), bitorder="little")[: vocab.size]
        allowed = [t for t in np.flatnonzero(bits).tolist() if vocab.token_bytes[t]]
        if not allowed:
            return
        state = compiled.state_after_token(state, rng.choice(allowed))


@settings(max_examples=12, deadline=None)
@given(schemas=st.lists(_SCHEMAS, min_size=2, max_size=3), seed=st.integers(0, 2**16))
def test_masks_under_one_key_are_one_mask_across_grammars(schemas, seed):
    """`future_key` decides the mask: wherever a key comes again, in the same grammar or
    another, the mask computed fresh is the one first computed under it, token by token (the
    recorder compares them and raises otherwise)."""
    vocab, rng, recorder = smollm2(), random.Random(seed), Recorder()
    with recording(recorder):
        for schema in schemas:
            _walk_under_masks(compile_grammar(Grammar.from_json_schema(schema), vocab), rng, 30)
    assert all(m.keyed for m in recorder.masks if m.shared)


def test_a_new_grammar_meets_keys_of_an_earlier_one():
    """Two grammars that share members share keys; a configuration inside plain text gets
    none (its walk covers most of the trie, and so would its key)."""
    first = {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}
    second = {"type": "object", "required": ["id", "name"],
              "properties": {"id": {"type": "integer"}, "name": {"type": "string"}}}
    recorder = Recorder()
    with recording(recorder):
        for schema, text in ((first, b'{"id": 12}'), (second, b'{"id": 7, "name": "Ann"}')):
            compiled = compile_grammar(Grammar.from_json_schema(schema), smollm2())
            state = compiled.initial_state
            for byte in text:
                compiled.mask(state)
                state = compiled.next_state(state, byte)
    assert any(m.shared for m in recorder.masks)
    assert not any(m.keyed for m in recorder.masks if m.kind == "text")
    with pytest.raises(AssertionError, match="two masks under one key"):
        recorder._keys = dict.fromkeys(recorder._keys, b"another mask")
        with recording(recorder):
            compiled = compile_grammar(Grammar.from_json_schema(first), smollm2())
            compiled.mask(compiled.initial_state)
