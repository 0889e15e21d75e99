"""The JSON Schema front-end: a schema to grammar IR rules for the JSON texts it accepts.

`schema_to_rules(schema, prefix=...)` lowers the schema to a normal form (a union of per-type
atoms, `normal`; keywords to atoms in `lower`) and emits IR from it (`emit`); JSON tokens are in
`lexical`, regular-language operations in `regular`, formats in `formats`, `$ref` targets in
`refs`.
`expand_json_schemas` replaces a grammar's `JsonSchema` nodes by such rules before the grammar
is compiled (`Grammar.program`): the compiler never sees a schema.

Exact or an error
    A keyword is enforced exactly or rejected at compile time with `UnsupportedSchemaError`
    (keyword and JSON pointer), never silently skipped. Not expressible by any grammar:
    `uniqueItems` unless the items come from a finite set of values (enum, const, booleans,
    null; `emit.MAX_UNIQUE_STATES`) or `maxItems` <= 1, `$recursiveRef`. Not supported (yet):
    `unevaluatedItems` / `unevaluatedProperties` beside `anyOf` / `oneOf` / `if` /
    `dependentSchemas` that evaluate items / properties (beside `allOf`, `$ref`,
    `$dynamicRef` they are exact: what those evaluate is static), `unevaluatedItems` beside
    `contains`, `contains` with `prefixItems` / `maxItems` / `minItems` > 1 / `maxContains` /
    `minContains` > 1, `not` of forms other than type, enum/const (strings, null, booleans),
    required, pattern, length / item / numeric bounds, properties, items, anyOf, allOf,
    disjoint oneOf, not, $ref, "not integer" (the non-integral decimals); `if` whose
    condition cannot be negated; `multipleOf` beyond k/10^d with small k; patterns outside the
    regex subset (`pegmask.grammars.regex`); remote `$ref` and a `$schema` naming a custom
    meta-schema (nothing is downloaded).
    `ignore_keywords=("uniqueItems", ...)` drops the named keywords everywhere, on request:
    the grammar is then looser than the schema.
oneOf
    Exact: branches `Algebra.disjoint` proves disjoint (type, const / enum, a required
    discriminator, numeric ranges, string lengths / languages, array lengths and items, keys
    a closed object forbids; within the schema's own type keywords) are a union; a branch
    that may overlap another is intersected with that one's complement (`Lowering.negate`,
    atom by atom where only the branch's own atoms make it expressible: a closed object's
    keys). Otherwise `UnsupportedSchemaError`; `one_of="any"` compiles the union instead
    (values matching several branches are then accepted too).
Annotations
    Unknown keywords (`title`, `description`, `default`, `examples`, `readOnly`, vendor
    `x-...`, ...) are ignored, and so are unknown `format`s (JSON Schema's default); the known
    formats (`formats.FORMATS`: date-time, date, time, duration, email, hostname,
    ipv4, ipv6, uuid, uri, uri-reference, iri, json-pointer, ...) are enforced.
Objects
    `additionalProperties` absent means allowed (the JSON Schema rule); `strict=True` treats
    it as false on every object schema (OpenAI's strict mode); `strict="declared"` on every
    object schema that declares its properties (`properties` or `patternProperties`, even
    empty), leaving a bare `{"type": "object"}` any object (xgrammar's strict mode, which vLLM
    applies to tool arguments). Extra keys can never
    be named keys (so a named key cannot reappear with another value). `property_order=
    "schema"` (default) accepts named properties in schema order, each optional one skippable,
    extra properties after them; "any" accepts any order for objects with at most
    `ANY_ORDER_MAX_PROPERTIES` named properties, while the schema's budget of 2^n states
    (`emit.ANY_ORDER_BUDGET`) lasts; larger objects, objects past the budget, and
    counted objects with extra properties keep schema order. `patternProperties`, `propertyNames`, `dependentRequired`,
    `dependentSchemas` / `dependencies`, `minProperties` / `maxProperties` are exact.
Strings
    Lengths count characters (an escape or a surrogate pair is one); lone surrogates are not
    accepted; the spelling rule is in `lexical`. `pattern` is an unanchored
    ECMAScript search. Patterns, formats and lengths are intersected exactly (DFAs); a length
    bound that a pattern's structure cannot absorb costs rules of about 2*sqrt(maxLength)
    nested calls and is refused above `regular.MAX_RULE_DEPTH`.
Numbers
    Integers are spelled without fraction or exponent (a generation choice, the third beside
    asserted formats and schema property order: JSON Schema counts `1.0` as an integer);
    bounds are exact (digit ranges, also for decimals such as 0.25); exponent notation is
    accepted where the sign alone decides the bounds (e.g. `minimum: 0`), else not. Constants accept their canonical spelling (an
    integral value also as `N.0`).
References
    As the specification resolves them, within the document (`refs`): base URIs from `$id` at
    every level, fragments as JSON pointers (`~0 ~1 %xx` escapes) or `$anchor`s of the
    resource the base names, `$dynamicRef` by the dynamic scope, which is static per path
    through the schema (the lowering is memoized per location and scope); recursion becomes
    grammar recursion. Siblings of `$ref` are ignored for drafts
    3-7 (the draft rule) and applied for 2019-09, 2020-12 and schemas without `$schema`.
Whitespace
    "flexible" (default): up to `max_whitespace` (default 32) whitespace characters between
    tokens, never unbounded; "compact": none, as `json.dumps(separators=(",", ":"))`. The value
    itself has no leading or trailing whitespace.
Bad schemas
    `SchemaError` with the pointer: wrong keyword types, unresolvable `$ref`, contradictory
    bounds, a schema that accepts nothing, reference cycles without content; sizes are capped
    (atoms, rules, automaton states, pattern size; the compiler caps instructions).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any

from pegmask.grammars.bounded_cache import BoundedCache
from pegmask.grammars.errors import GrammarError, SchemaError
from pegmask.grammars.ir import (
    Capture,
    Choice,
    GrammarIR,
    JsonSchema,
    Node,
    Repeat,
    Seq,
    Trigger,
)
from pegmask.grammars.json_schema.emit import CommonRules, Emitter
from pegmask.grammars.json_schema.lower import Lowering

WHITESPACE_MODES = ("flexible", "compact")
PROPERTY_ORDERS = ("schema", "any")
DEFAULT_MAX_WHITESPACE = 32
ANY_ORDER_MAX_PROPERTIES = 8
STRICT_MODES = (False, True, "declared")
ONE_OF_MODES = ("exact", "any")


def schema_to_rules(
    schema: dict[str, Any] | bool,
    *,
    prefix: str,
    common: CommonRules | None = None,
    whitespace: str = "flexible",
    max_whitespace: int = DEFAULT_MAX_WHITESPACE,
    property_order: str = "schema",
    strict: bool | str = False,
    ignore_keywords: Iterable[str] = (),
    raw_until: str | None = None,
    one_of: str = "exact",
) -> tuple[Node, dict[str, Node]]:
    """IR for the JSON texts valid under `schema`: (root node, rules it references).

    `raw_until`: instead, the *raw text* of the strings `schema` accepts (a string schema:
    lengths, patterns, formats, enums), unescaped, as XML-parameter tool calls write them,
    never containing `raw_until` (the text that ends the value there).

    Every rule name starts with `prefix`, except those that depend on no schema, only on the
    whitespace options (whitespace, any string, any value, numbers): those of `common` where
    it is given, which schemas compiled into one grammar with the same whitespace share
    (`expand_json_schemas`). Raises `SchemaError` for an invalid schema (with the
    JSON pointer of the offending subschema) and `UnsupportedSchemaError` for a keyword the
    grammar cannot enforce; see the module docstring for the options.
    """
    if whitespace not in WHITESPACE_MODES:
        raise GrammarError(f"whitespace must be one of {WHITESPACE_MODES}, not {whitespace!r}")
    if property_order not in PROPERTY_ORDERS:
        raise GrammarError(f"property_order must be one of {PROPERTY_ORDERS}, not {property_order!r}")
    if not isinstance(max_whitespace, int) or max_whitespace < 0:
        raise GrammarError("max_whitespace must be a non-negative integer")
    if strict not in STRICT_MODES:
        raise GrammarError(f"strict must be one of {STRICT_MODES}, not {strict!r}")
    if one_of not in ONE_OF_MODES:
        raise GrammarError(f"one_of must be one of {ONE_OF_MODES}, not {one_of!r}")
    if isinstance(ignore_keywords, str):
        ignore_keywords = (ignore_keywords,)
    lowering = Lowering(schema, strict=strict, ignore=frozenset(ignore_keywords), one_of=one_of)
    try:
        root_schema = lowering.lower(schema, "")
        emitter = Emitter(lowering, prefix=prefix, common=common,
                          max_whitespace=max_whitespace if whitespace == "flexible" else 0,
                          any_order_limit=ANY_ORDER_MAX_PROPERTIES if property_order == "any" else 1)
        if raw_until is not None:
            if not raw_until:
                raise GrammarError("raw_until must be a non-empty string")
            root, rules = emitter.emit_raw_root(root_schema, raw_until)
        else:
            root, rules = emitter.emit_root(root_schema)
    except RecursionError as exc:
        raise SchemaError("schema is nested too deeply") from exc
    return root, rules


#: each schema's rules, kept across grammars: a tool list is mostly the same from one request
#: to the next (bounded: entries, and bytes estimated from the schema text and the rule count)
SCHEMA_RULES_CACHE: BoundedCache[tuple[Node, dict[str, Node]]] = BoundedCache(
    max_entries=4096, max_bytes=64 << 20)
_RULE_BYTES = 512  # estimated bytes of one generated rule


def schema_prefix(node: JsonSchema) -> str:
    """The rule-name prefix of a schema's rules: from its text and options, not its place in
    the grammar, so that its rules are the same in every grammar that holds it (cacheable)."""
    digest = hashlib.blake2b(repr((node.schema_json, node.options)).encode(), digest_size=6)
    return f"json_{digest.hexdigest()}"


def expand_json_schemas(ir: GrammarIR) -> GrammarIR:
    """Replace every `JsonSchema` node by the rules of the JSON Schema front-end.

    Each schema's rules are named by its content (`schema_prefix`) and built on their own (the
    rules that depend on no schema, only on the whitespace, under one shared name per
    whitespace: a dialect's tools share one whitespace rule, not one per tool), so they are
    taken from `SCHEMA_RULES_CACHE` when another grammar built them: the grammar is the same
    with the cache as without. Only the grammar's own rules are rewritten, each distinct node
    once (by identity: hashing a frozen node rehashes its whole subtree, so a value-keyed memo
    costs more than it saves). The front-end's rules are taken as they are: they contain no
    `JsonSchema` node, and copying them took about a quarter of a large schema's compile time.
    """
    extra: dict[str, Node] = {}
    cache: dict[JsonSchema, Node] = {}
    memo: dict[int, Node] = {}  # by id: `ir` keeps every node it rewrites alive meanwhile
    prefixes: dict[str, JsonSchema] = {}

    def build(node: JsonSchema, prefix: str) -> tuple[tuple[Node, dict[str, Node]], int]:
        options = dict(node.options)
        spaces = (options.get("max_whitespace", DEFAULT_MAX_WHITESPACE)
                  if options.get("whitespace", "flexible") == "flexible" else 0)
        root, rules = schema_to_rules(json.loads(node.schema_json), prefix=prefix,
                                      common=CommonRules(f"json_w{spaces}"), **options)
        return (root, rules), len(node.schema_json) + _RULE_BYTES * len(rules)

    def rewrite(node: Node) -> Node:
        key = id(node)
        if key not in memo:
            memo[key] = _rewrite(node)
        return memo[key]

    def _rewrite(node: Node) -> Node:
        if isinstance(node, JsonSchema):
            if node not in cache:
                prefix = base = schema_prefix(node)
                while prefixes.setdefault(prefix, node) != node:  # a digest collision
                    prefix = f"{base}x{len(prefixes)}"
                root, rules = SCHEMA_RULES_CACHE.get_or_build(
                    (node, prefix), lambda: build(node, prefix))
                extra.update(rules)
                cache[node] = root
            return cache[node]
        if isinstance(node, Seq):
            return Seq(tuple(rewrite(i) for i in node.items))
        if isinstance(node, Choice):
            return Choice(tuple(rewrite(a) for a in node.alts))
        if isinstance(node, Repeat):
            return Repeat(rewrite(node.item), node.min, node.max)
        if isinstance(node, Capture):
            return Capture(node.tag, rewrite(node.item))
        if isinstance(node, Trigger):
            return Trigger(rewrite(node.item))
        return node

    rules = {name: rewrite(body) for name, body in ir.rules.items()}
    clash = set(rules) & set(extra)
    if clash:
        raise GrammarError(f"rule names clash with generated JSON Schema rules: {sorted(clash)}")
    rules.update(extra)
    return GrammarIR(rules, ir.start, ir.specials)  # the front-end's rules read no special


__all__ = ["ANY_ORDER_MAX_PROPERTIES", "DEFAULT_MAX_WHITESPACE", "SCHEMA_RULES_CACHE",
           "expand_json_schemas", "schema_prefix", "schema_to_rules"]
