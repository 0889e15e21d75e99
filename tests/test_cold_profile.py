"""`pegmask.bench.cold_profile`'s recorder, on the real SmolLM2 vocabulary: it must see the
masks the automaton computes, tell their kinds apart, find the repeated ones, and leave
`CompiledGrammar` as it was (it wraps private methods, which a refactoring may rename)."""

from __future__ import annotations

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
