"""The grammar IR: a small tree of immutable nodes that every front-end produces.

Every front-end (PEG DSL, JSON Schema, regex) builds these nodes; the compiler
(`pegmask.grammars.program`) turns them into one instruction program from which both the
streaming parser and the token-mask automaton run, so the two can never disagree.

Semantics (shared by parser and automaton):

* The language of a grammar is context-free: `Choice` is the union of its alternatives and
  repetition is not possessive. Alternatives are *ordered* only to pick which captures are
  reported when one input can be derived in several ways (the first alternative wins).
* Text is bytes (UTF-8 for `Literal` / `CharClass`). Special tokens are separate symbols that
  text can never spell; `Special("<|channel|>")` matches only that token (a vocabulary that
  lacks it writes its spelling, which is then read as the token: `pegmask.grammars.spelling`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

MAX_UNICODE = 0x10FFFF


class Node:
    """Base class of IR nodes (all are frozen dataclasses, hashable and comparable)."""

    __slots__ = ()


@dataclass(frozen=True)
class Literal(Node):
    """An exact byte string (UTF-8 encoded text)."""

    data: bytes

    @staticmethod
    def of(text: str) -> Literal:
        return Literal(text.encode("utf-8"))


@dataclass(frozen=True)
class ByteClass(Node):
    """One byte within any of the inclusive `ranges` (used for raw byte-level grammars)."""

    ranges: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class CharClass(Node):
    """One Unicode scalar value (encoded as UTF-8) inside any inclusive range of `ranges`.

    `negated` means any scalar value *outside* the ranges. Surrogates are never matched.
    """

    ranges: tuple[tuple[int, int], ...]
    negated: bool = False


@dataclass(frozen=True)
class Seq(Node):
    items: tuple[Node, ...]


@dataclass(frozen=True)
class Choice(Node):
    """Union of alternatives; the order only ranks derivations for captures."""

    alts: tuple[Node, ...]


@dataclass(frozen=True)
class Repeat(Node):
    """`item` repeated between `min` and `max` times (`max=None`: unbounded)."""

    item: Node
    min: int = 0
    max: int | None = None


@dataclass(frozen=True)
class Ref(Node):
    """A reference to a named rule of the enclosing `Grammar` (recursion allowed)."""

    name: str


@dataclass(frozen=True)
class Special(Node):
    """A special-token terminal: matched by the token named `name`, never by text."""

    name: str


@dataclass(frozen=True)
class Until(Node):
    """Any text (bytes) that does not contain any of the `stops` byte strings (no stops: any
    text). It never consumes a special token: a special token always ends it.
    """

    stops: tuple[bytes, ...]


@dataclass(frozen=True)
class Capture(Node):
    """Reports the text matched by `item` under `tag` (captures nest)."""

    tag: str
    item: Node


@dataclass(frozen=True)
class JsonSchema(Node):
    """A JSON value constrained by a JSON Schema; expanded by the JSON Schema front-end.

    `schema` is kept as canonical JSON text so the node stays hashable.
    `options` is a tuple of (name, value) pairs for `Grammar.from_json_schema`'s keyword options.
    """

    schema_json: str
    options: tuple[tuple[str, Any], ...] = ()


def json_schema_node(schema: Any, **options: Any) -> JsonSchema:
    """The node for `schema` (dict or bool) with the JSON Schema front-end's `options`
    (see `pegmask.grammars.json_schema.schema_to_rules`), in the node's hashable form."""
    hashable = {k: tuple(v) if isinstance(v, list) else v for k, v in options.items()}
    return JsonSchema(json.dumps(schema), tuple(sorted(hashable.items())))


@dataclass(frozen=True)
class Trigger(Node):
    """Marks where a lazily constrained region starts (the matcher reports it).

    Semantically it is just `item`; the engine uses the mark to know a constrained region began
    (e.g. `<tool_call>` or `to=functions.`).
    """

    item: Node


EMPTY = Seq(())
# JSON's insignificant whitespace: the JSON Schema front-end emits bounded runs of it, and the
# token automaton prepares every vocabulary for them (`compiler.prepare_vocabulary`).
JSON_WHITESPACE = CharClass(((0x09, 0x0A), (0x0D, 0x0D), (0x20, 0x20)))


def seq(*items: Node) -> Node:
    """Sequence that flattens nested sequences and drops empty ones."""
    flat: list[Node] = []
    for item in items:
        if isinstance(item, Seq):
            flat.extend(item.items)
        else:
            flat.append(item)
    if len(flat) == 1:
        return flat[0]
    return Seq(tuple(flat))


def choice(*alts: Node) -> Node:
    """Choice that flattens nested choices; a single alternative is returned as is."""
    flat: list[Node] = []
    for alt in alts:
        if isinstance(alt, Choice):
            flat.extend(alt.alts)
        else:
            flat.append(alt)
    if len(flat) == 1:
        return flat[0]
    return Choice(tuple(flat))


def optional(item: Node) -> Node:
    return Repeat(item, 0, 1)


def list_separator(item: Node, following: Node) -> Node | None:
    """`sep` where `following` is `(sep item)*` after `item` (the same node, or a reference
    to the same rule, after a separator, any number of times); None otherwise."""
    if not (isinstance(following, Repeat) and following.min == 0 and following.max is None
            and isinstance(following.item, Seq) and len(following.item.items) > 1):
        return None
    *separator, last = following.item.items
    if not (last is item or (isinstance(item, Ref) and last == item)):
        return None
    return seq(*separator)


@dataclass(frozen=True)
class GrammarIR:
    """A set of named rules and the start rule's name."""

    rules: Mapping[str, Node]
    start: str = "root"
    specials: tuple[str, ...] | None = None  # None: collected from the rules

    def __post_init__(self) -> None:
        object.__setattr__(self, "rules", dict(self.rules))
        if self.specials is None:
            object.__setattr__(self, "specials", tuple(sorted(collect_specials(self.rules))))


def children(node: Node) -> tuple[Node, ...]:
    """Direct sub-nodes of `node` (used by every IR walk)."""
    if isinstance(node, Seq):
        return node.items
    if isinstance(node, Choice):
        return node.alts
    if isinstance(node, (Repeat, Capture, Trigger)):
        return (node.item,)
    return ()


def collect_specials(rules: Mapping[str, Node]) -> set[str]:
    """Names of all special tokens referenced by the rules."""
    found: set[str] = set()
    stack = list(rules.values())
    while stack:
        node = stack.pop()
        if isinstance(node, Special):
            found.add(node.name)
        stack.extend(children(node))
    return found


def contains_json_schema(node: Node) -> bool:
    """Whether `node` holds a `JsonSchema` node (which the JSON Schema front-end expands before
    the rules are compiled: `Grammar.program`)."""
    stack = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, JsonSchema):
            return True
        stack.extend(children(current))
    return False
