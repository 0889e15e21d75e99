"""Tool grammars built incrementally: each tool's JSON Schema rules are cached across grammars
(`SCHEMA_RULES_CACHE`), and a grammar built with the cache is the grammar built without it."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from vocabularies import smollm2, smollm2_tokenizer

from pegmask.bench.compile_scale import bfcl_tools
from pegmask.dialects.registry import get_dialect
from pegmask.dialects.request import ChatRequest
from pegmask.grammars import Grammar
from pegmask.grammars.bounded_cache import BoundedCache
from pegmask.grammars.compiler import compile_grammar
from pegmask.grammars.json_schema import SCHEMA_RULES_CACHE, expand_json_schemas
from pegmask.grammars.program import Program


def tool_program(tools: list[dict]) -> Program:
    request = ChatRequest(tools=tools, tool_choice="required")
    return get_dialect("hermes").grammar(request).program


def test_one_tool_changed_compiles_the_same_program_from_the_cache() -> None:
    tools = bfcl_tools(25)
    first, changed = tools[:24], tools[:11] + tools[24:] + tools[12:24]  # tool 11 replaced
    SCHEMA_RULES_CACHE.clear()
    tool_program(first)
    built = SCHEMA_RULES_CACHE.misses  # the tools' schemas (and the grammar's own)
    assert built >= 24 and SCHEMA_RULES_CACHE.hits == 0
    warm = tool_program(changed)
    assert (SCHEMA_RULES_CACHE.misses, SCHEMA_RULES_CACHE.hits) == (built + 1, built - 1)
    SCHEMA_RULES_CACHE.clear()
    cold = tool_program(changed)
    assert warm == cold
    assert tool_program(first) != cold


def test_cached_tool_grammar_gives_the_same_masks() -> None:
    tools = bfcl_tools(6)
    SCHEMA_RULES_CACHE.clear()
    request = ChatRequest(tools=tools[1:], tool_choice="required")
    get_dialect("hermes").grammar(ChatRequest(tools=tools[:5], tool_choice="required")).compile()
    warm = get_dialect("hermes").grammar(request).compile()
    SCHEMA_RULES_CACHE.clear()
    cold = get_dialect("hermes").grammar(request).compile()
    vocab = smollm2()
    matchers = [compile_grammar(g, vocab).matcher() for g in (warm, cold)]
    masks = np.zeros((2, (vocab.size + 31) // 32), dtype=np.int32)
    call = f'<tool_call>\n{{"name": "{tools[3]["function"]["name"]}", "arguments": {{"'
    for token in smollm2_tokenizer().encode(call, add_special_tokens=False):
        for row, matcher in enumerate(matchers):
            matcher.fill_next_token_bitmask(masks, row)
        assert (masks[0] == masks[1]).all() and masks[0].any()
        assert all(matcher.accept_token(token) for matcher in matchers)


def test_schema_rules_are_named_by_content_not_position() -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    one = Grammar.from_peg('root = json(a) "," json(b)', schemas={"a": schema, "b": True})
    two = Grammar.from_peg('root = json(b) "," json(a)', schemas={"a": schema, "b": True})
    rules = [set(g.compile().program and expand_json_schemas(g.ir).rules) for g in (one, two)]
    assert rules[0] == rules[1]
    assert one.matches('{"city": "Oslo"},1') and two.matches('1,{"city": "Oslo"}')


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 20), st.integers(0, 40)), max_size=60),
       st.integers(0, 6), st.integers(0, 100))
def test_bounded_cache_keeps_its_bounds(puts: list[tuple[int, int]], entries: int,
                                        budget: int) -> None:
    cache: BoundedCache[int] = BoundedCache(entries, budget)
    for key, size in puts:
        value = cache.get_or_build(key, lambda key=key, size=size: (key * 2, size))
        assert value == key * 2
        assert len(cache) <= entries and cache.bytes <= budget
    assert cache.hits + cache.misses == len(puts)
