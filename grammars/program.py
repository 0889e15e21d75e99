"""Compile the grammar IR into one instruction program (a pushdown NFA over symbols).

Symbols are bytes 0-255 and special tokens 256 + index into `Program.specials`. The streaming
parser (`pegmask.grammars.parser`) and the token automaton (`pegmask.grammars.configurations`)
both execute this same program, which is what makes them accept exactly the same language.

Instructions are stored in parallel lists (fast to index from the interpreters):

* ``BYTE``     consume one byte b with ``accept[pc][b]`` set, go to ``arg[pc]``
* ``SPECIAL``  consume special symbol ``aux[pc]``, go to ``arg[pc]``
* ``SPLIT``    epsilon to every pc of ``targets[pc]``, earlier ones preferred for captures
* ``JUMP``     epsilon to ``arg[pc]``
* ``CALL``     push ``aux[pc]`` (return pc), go to ``arg[pc]`` (a rule's entry)
* ``RET``      pop the return pc (an empty stack means the start rule finished: accept)
* ``OPEN`` / ``CLOSE``  capture ``aux[pc]`` starts / ends, go to ``arg[pc]``
* ``MATCH``    the whole input matched
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from pegmask.grammars.alternation import Alternation, Mark, Symbol, alternation_trie
from pegmask.grammars.errors import GrammarError
from pegmask.grammars.ir import (
    MAX_UNICODE,
    ByteClass,
    Capture,
    CharClass,
    Choice,
    GrammarIR,
    JsonSchema,
    Literal,
    Node,
    Ref,
    Repeat,
    Seq,
    Special,
    Trigger,
    Until,
    children,
    list_separator,
)
from pegmask.grammars.limits import DEFAULT_LIMITS, GrammarLimits

BYTE, SPECIAL, SPLIT, JUMP, CALL, RET, OPEN, CLOSE, MATCH = range(9)
SPECIAL_BASE = 256


@dataclass
class Program:
    kind: list[int]
    arg: list[int]
    aux: list[int]
    targets: list[tuple[int, ...]]
    accept: list[bytes | None]
    start: int
    specials: tuple[str, ...]
    tags: tuple[str, ...]
    # Bounded runs of one byte class (`[ \t\n\r]{0,32}`): for each BYTE instruction of such
    # a run, (how many bytes of the class a thread there may still read, this one included;
    # the pc where the run exits). The automaton reads whole runs at once with it.
    runs: dict[int, tuple[int, int]]
    # The most call frames a derivation stacks outside recursion, the start rule's included
    # (`call_depth`): a runtime whose `max_depth` is below it would cut words of the grammar
    # that no recursion bound explains, so it refuses the program instead.
    call_depth: int = 1
    # Per instruction, the BYTE instructions a thread there reads its next byte with (see
    # `byte_leaves`): closures park on a SPLIT that only chooses between bytes; and whether a
    # thread there waits for a symbol (a SPECIAL, a BYTE, such a SPLIT), so that a seed
    # there is its own closure. Derived once per program: every stream parser's runtime
    # reads them.
    leaves: list[tuple[int, ...]] = field(init=False)
    parks: bytes = field(init=False)

    def __post_init__(self) -> None:
        self.leaves = byte_leaves(self.kind, self.targets)
        self.parks = bytes(k == SPECIAL or bool(leaves)
                           for k, leaves in zip(self.kind, self.leaves, strict=True))

    def special_symbol(self, name: str) -> int | None:
        """Symbol number of special token `name`, or None if the grammar never uses it."""
        try:
            return SPECIAL_BASE + self.specials.index(name)
        except ValueError:
            return None

    def __len__(self) -> int:
        return len(self.kind)


def byte_leaves(kind: list[int], targets: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """Per instruction: itself for a BYTE; for a SPLIT whose alternatives are BYTEs or such
    SPLITs (the lead bytes of UTF-8 sequences, a choice of literals) those BYTEs, first
    alternative first; () for every other instruction. A thread on such a SPLIT is one
    thread where its closure would park one per alternative (a JSON string's escapes and
    UTF-8 sequences are one thread instead of nine)."""
    leaves: list[tuple[int, ...]] = [()] * len(kind)
    # Nested choices come after the SPLIT that chooses them: from the last instruction back,
    # every alternative of a SPLIT is decided before it (loops back are not choices of bytes).
    for pc in range(len(kind) - 1, -1, -1):
        k = kind[pc]
        if k == BYTE:
            leaves[pc] = (pc,)
        elif k == SPLIT:
            found: dict[int, None] = {}
            for alt in targets[pc]:
                sub = leaves[alt] if alt > pc else (alt,) if kind[alt] == BYTE else ()
                if not sub:
                    break
                found.update(dict.fromkeys(sub))
            else:
                leaves[pc] = tuple(found)
    return leaves


def check_rules(ir: GrammarIR, generated: Iterable[str] = ()) -> None:
    """Reject undefined rules and left recursion (which a top-down program cannot run).
    Rules named in `generated` (the JSON Schema front-end's, complete by construction) are
    not searched for undefined references."""
    if ir.start not in ir.rules:
        raise GrammarError(f"start rule {ir.start!r} is not defined")
    skipped = frozenset(generated)
    for name, body in ir.rules.items():
        if name in skipped:
            continue
        stack = [body]
        while stack:
            node = stack.pop()
            if isinstance(node, Ref) and node.name not in ir.rules:
                raise GrammarError(f"rule {name!r} references undefined rule {node.name!r}")
            stack.extend(children(node))
    nullable = nullable_rules(ir.rules)
    left_calls = {name: _left_refs(body, nullable) for name, body in ir.rules.items()}
    # Depth-first search for a cycle in the "may call at the left edge" graph.
    state: dict[str, int] = {}
    for root in ir.rules:
        if state.get(root):
            continue
        path: list[tuple[str, list[str]]] = [(root, sorted(left_calls[root]))]
        state[root] = 1
        while path:
            name, pending = path[-1]
            if not pending:
                state[name] = 2
                path.pop()
                continue
            nxt = pending.pop()
            if state.get(nxt) == 1:
                cycle = [n for n, _ in path]
                cycle = cycle[cycle.index(nxt) :] + [nxt]
                raise GrammarError("left recursion: " + " -> ".join(cycle))
            if not state.get(nxt):
                state[nxt] = 1
                path.append((nxt, sorted(left_calls[nxt])))


def nullable_rules(rules: Mapping[str, Node]) -> set[str]:
    """Names of rules that can match the empty string (least fixpoint)."""
    result: set[str] = set()
    changed = True
    while changed:
        changed = False
        for name, body in rules.items():
            if name not in result and is_nullable(body, result):
                result.add(name)
                changed = True
    return result


def is_nullable(node: Node, nullable: set[str]) -> bool:
    if isinstance(node, Literal):
        return not node.data
    if isinstance(node, (ByteClass, CharClass, Special, JsonSchema)):
        return False  # a JSON value is never empty
    if isinstance(node, Seq):  # loops, not all(): a choice of 20,000 strings comes here
        for item in node.items:
            if not is_nullable(item, nullable):
                return False
        return True
    if isinstance(node, Choice):
        for alt in node.alts:
            if is_nullable(alt, nullable):
                return True
        return False
    if isinstance(node, Repeat):
        return node.min == 0 or is_nullable(node.item, nullable)
    if isinstance(node, (Capture, Trigger)):
        return is_nullable(node.item, nullable)
    if isinstance(node, Until):
        return True
    if isinstance(node, Ref):
        return node.name in nullable
    raise GrammarError(f"cannot compile IR node {type(node).__name__}")


def _left_refs(node: Node, nullable: set[str]) -> set[str]:
    """Rules that `node` may call before consuming any symbol."""
    found: set[str] = set()
    stack = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, Ref):
            found.add(current.name)
        elif isinstance(current, Seq):
            for item in current.items:
                stack.append(item)
                if not is_nullable(item, nullable):
                    break
        else:
            stack.extend(children(current))
    return found


def utf8_sequences(lo: int, hi: int) -> list[list[tuple[int, int]]]:
    """Split the scalar range [lo, hi] into byte-range sequences that match exactly its UTF-8
    encodings (the classic utf8-ranges construction)."""
    out: list[list[tuple[int, int]]] = []
    bounds = [(0, 0x7F), (0x80, 0x7FF), (0x800, 0xFFFF), (0x10000, MAX_UNICODE)]
    for blo, bhi in bounds:
        a, b = max(lo, blo), min(hi, bhi)
        if a <= b:
            _split_same_length(a, b, out)
    return out


def _split_same_length(lo: int, hi: int, out: list[list[tuple[int, int]]]) -> None:
    if lo <= 0x7F:
        out.append([(lo, hi)])
        return
    nbytes = 2 if hi <= 0x7FF else 3 if hi <= 0xFFFF else 4
    for i in range(1, nbytes):
        mask = (1 << (6 * i)) - 1
        if lo & ~mask != hi & ~mask:
            if lo & mask != 0:
                _split_same_length(lo, lo | mask, out)
                _split_same_length((lo | mask) + 1, hi, out)
                return
            if hi & mask != mask:
                _split_same_length(lo, (hi & ~mask) - 1, out)
                _split_same_length(hi & ~mask, hi, out)
                return
    a, b = chr(lo).encode(), chr(hi).encode()
    out.append([(a[i], b[i]) for i in range(len(a))])


def char_class_scalar_ranges(node: CharClass) -> list[tuple[int, int]]:
    """Merged scalar ranges of a char class, negation applied and surrogates removed."""
    merged: list[tuple[int, int]] = []
    for lo, hi in sorted(node.ranges):
        if lo > hi:
            raise GrammarError(f"empty character range {lo:#x}-{hi:#x}")
        if merged and lo <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    if node.negated:
        inverted: list[tuple[int, int]] = []
        nxt = 0
        for lo, hi in merged:
            if lo > nxt:
                inverted.append((nxt, lo - 1))
            nxt = hi + 1
        if nxt <= MAX_UNICODE:
            inverted.append((nxt, MAX_UNICODE))
        merged = inverted
    result: list[tuple[int, int]] = []
    for lo, hi in merged:
        if lo < 0xD800 <= hi or lo <= 0xDFFF < hi or (0xD800 <= lo and hi <= 0xDFFF):
            if lo < 0xD800:
                result.append((lo, 0xD7FF))
            if hi > 0xDFFF:
                result.append((0xE000, hi))
        else:
            result.append((lo, hi))
    return result


@functools.lru_cache(maxsize=4096)
def char_class_sequences(node: CharClass) -> tuple[tuple[tuple[int, int], ...], ...]:
    """The UTF-8 byte-range sequences of a char class (memoized: schemas repeat the same few
    classes, and the compiler and its size estimate both need them)."""
    return tuple(tuple(seq) for lo, hi in char_class_scalar_ranges(node)
                 for seq in utf8_sequences(lo, hi))


def accept_table(ranges: list[tuple[int, int]] | tuple[tuple[int, int], ...]) -> bytes:
    """The 256 accept flags of a BYTE instruction reading any byte of `ranges` (memoized: a
    bounded run such as JSON whitespace emits its class dozens of times)."""
    return _accept_table(tuple(ranges))


@functools.lru_cache(maxsize=4096)
def _accept_table(ranges: tuple[tuple[int, int], ...]) -> bytes:
    table = bytearray(256)
    for lo, hi in ranges:
        if not 0 <= lo <= hi <= 255:
            raise GrammarError(f"invalid byte range {lo}-{hi}")
        table[lo : hi + 1] = b"\x01" * (hi - lo + 1)
    return bytes(table)


_ONE_BYTE = tuple(accept_table(((byte, byte),)) for byte in range(256))


@functools.lru_cache(maxsize=256)
def until_automaton(stops: tuple[bytes, ...]) -> tuple[list[dict[int, int]], int]:
    """Aho-Corasick DFA over bytes for 'text containing none of `stops`'.

    Returns (transitions per state: byte -> state, forbidden marker). A transition to the
    marker (-1) means a stop string would be completed, so that byte is not allowed there.
    Memoized (the compiler and `instruction_count` both need it); callers do not modify it.
    """
    if any(not s for s in stops):
        raise GrammarError("until() needs non-empty stop strings")
    goto: list[dict[int, int]] = [{}]
    terminal = [False]
    for stop in stops:
        state = 0
        for byte in stop:
            if byte not in goto[state]:
                goto.append({})
                terminal.append(False)
                goto[state][byte] = len(goto) - 1
            state = goto[state][byte]
        terminal[state] = True
    fail = [0] * len(goto)
    order: list[int] = []
    queue = list(goto[0].values())
    while queue:
        state = queue.pop(0)
        order.append(state)
        for byte, nxt in goto[state].items():
            f = fail[state]
            while f and byte not in goto[f]:
                f = fail[f]
            fail[nxt] = goto[f][byte] if byte in goto[f] and goto[f][byte] != nxt else 0
            terminal[nxt] = terminal[nxt] or terminal[fail[nxt]]
            queue.append(nxt)
    delta: list[dict[int, int]] = []
    for state in range(len(goto)):
        row: dict[int, int] = {}
        for byte in range(256):
            s = state
            while s and byte not in goto[s]:
                s = fail[s]
            nxt = goto[s].get(byte, 0)
            row[byte] = -1 if terminal[nxt] else nxt
        delta.append(row)
    return delta, -1


def instruction_count(nodes: Iterable[Node], memo: dict[int, tuple[Node, int]] | None = None
                      ) -> int:
    """How many instructions the compiler emits for `nodes`, plus one each (a rule's RET):
    exact, except that a list `item (sep item)*` counts its item twice (the compiler emits it
    once) and a choice counts its alternatives whole (the compiler shares their common starts,
    `grammars/alternation.py`), so never less. Arithmetic on the counts: nothing proportional to a repetition count
    is built. `memo` (by node identity, the node kept alive) may be shared between calls."""
    memo = {} if memo is None else memo

    def size(node: Node) -> int:
        hit = memo.get(id(node))
        if hit is not None and hit[0] is node:
            return hit[1]
        if isinstance(node, Literal):
            result = len(node.data) or 1
        elif isinstance(node, (ByteClass, Special)):
            result = 1
        elif isinstance(node, Seq):
            result = sum(size(i) for i in node.items) or 1
        elif isinstance(node, Choice):
            result = 1 + sum(size(a) for a in node.alts)
        elif isinstance(node, Repeat):
            # The entry JUMP, `min` copies, then a loop (SPLIT, a copy, JUMP) or `max - min`
            # optional copies (SPLIT, a copy, the skip's JUMP).
            optional = 1 if node.max is None else node.max - node.min
            result = 1 + size(node.item) * (node.min + optional) + 2 * max(optional, 0)
        elif isinstance(node, CharClass):
            sequences = char_class_sequences(node)
            multi = [len(s) for s in sequences if len(s) > 1]
            result = (len(sequences) > len(multi)) + sum(multi) + (1 if multi else 0)
        elif isinstance(node, Capture):
            result = 2 + size(node.item)
        elif isinstance(node, Trigger):
            result = size(node.item)
        elif isinstance(node, Until):
            delta, forbidden = until_automaton(node.stops)
            result = 2 + sum(1 + len(set(row.values()) - {forbidden}) for row in delta)
        else:  # a Ref (CALL, JUMP); a JsonSchema is expanded before
            result = 2
        memo[id(node)] = (node, result)
        return result

    return sum(size(n) + 1 for n in nodes)


class _Compiler:
    def __init__(self, ir: GrammarIR):
        self.ir = ir
        self.kind: list[int] = []
        self.arg: list[int] = []
        self.aux: list[int] = []
        self.targets: list[tuple[int, ...]] = []
        self.accept: list[bytes | None] = []
        self.specials = ir.specials
        self.tags: list[str] = []
        self.rule_entry: dict[str, int] = {}
        self.pending_calls: list[tuple[int, str]] = []
        self.run_skips: dict[int, tuple[int, int]] = {}  # BYTE pc -> (remaining, skip JUMP pc)

    def emit(self, kind: int, arg: int = -1, aux: int = -1, targets: tuple[int, ...] = (),
             accept: bytes | None = None) -> int:
        self.kind.append(kind)
        self.arg.append(arg)
        self.aux.append(aux)
        self.targets.append(targets)
        self.accept.append(accept)
        return len(self.kind) - 1

    def patch(self, pc: int, arg: int) -> None:
        self.arg[pc] = arg

    def byte_instr(self, ranges: list[tuple[int, int]] | tuple[tuple[int, int], ...]) -> int:
        return self.emit(BYTE, accept=accept_table(ranges))

    def literal(self, data: bytes) -> list[int]:
        """One BYTE per byte of `data`, each leading to the next; the last one's pc. Emitted
        in bulk: an enum of thousands of strings is mostly this."""
        start, count = len(self.kind), len(data)
        self.kind += [BYTE] * count
        self.arg += range(start + 1, start + count + 1)
        self.aux += [-1] * count
        self.targets += [()] * count
        self.accept += [_ONE_BYTE[byte] for byte in data]
        return [start + count - 1]

    def compile(self) -> Program:
        # Entry: call the start rule, then accept.
        entry = self.emit(CALL)
        match = self.emit(MATCH)
        self.aux[entry] = match
        self.pending_calls.append((entry, self.ir.start))
        for name, body in self.ir.rules.items():
            start = len(self.kind)
            exits = self.node(body)
            ret = self.emit(RET)
            self.link(exits, ret)
            self.rule_entry[name] = start
        for pc, name in self.pending_calls:
            self.arg[pc] = self.rule_entry[name]
        self.tail_calls()
        runs = {pc: (remaining, self.arg[skip]) for pc, (remaining, skip) in self.run_skips.items()}
        return Program(
            self.kind, self.arg, self.aux, self.targets, self.accept, entry,
            tuple(self.specials), tuple(self.tags), runs, self.call_depth(entry),
        )

    def tail_calls(self) -> None:
        """A call whose return leads (through jumps) straight to its rule's RET becomes a
        jump: the callee returns for its caller. A chain of rules (`a = b`, `b = c`, ...) and a
        right-recursive list then stack nothing, where each call took a frame of `max_depth`
        (a chain of 300 rules matched nothing)."""
        kind, arg, aux = self.kind, self.arg, self.aux
        for pc, _ in self.pending_calls:
            after, seen = aux[pc], set()
            while kind[after] == JUMP and after not in seen:
                seen.add(after)
                after = arg[after]
            if kind[after] == RET:
                kind[pc], aux[pc] = JUMP, -1

    def call_depth(self, entry: int) -> int:
        """The most frames a derivation stacks outside recursion: one for the entry's call,
        plus the longest chain of calls (tail calls take none) between the rules' recursive
        components, each component counted once (its own recursion is what `max_depth`
        bounds)."""
        starts = sorted((start, name) for name, start in self.rule_entry.items())
        firsts = [start for start, _ in starts]
        calls: dict[str, list[tuple[str, int]]] = {name: [] for name in self.rule_entry}
        for pc, callee in self.pending_calls:
            if pc != entry:
                caller = starts[bisect.bisect_right(firsts, pc) - 1][1]
                calls[caller].append((callee, int(self.kind[pc] == CALL)))
        component = call_components(calls)
        longest: dict[int, int] = {}
        for name in sorted(calls, key=component.__getitem__):  # callees' components first
            own = component[name]
            deepest = longest.get(own, 0)
            for callee, frames in calls[name]:
                if component[callee] != own:
                    deepest = max(deepest, frames + longest[component[callee]])
            longest[own] = deepest
        return 1 + longest[component[self.ir.start]]

    def link(self, exits: list[int], target: int) -> None:
        for pc in exits:
            self.arg[pc] = target

    def node(self, node: Node) -> list[int]:
        """Emit code for `node` at the current end; return the pcs whose `arg` must be
        patched to the code that follows. Code for a node always starts at the next pc."""
        if isinstance(node, Literal):
            return self.literal(node.data) if node.data else [self.emit(JUMP)]
        if isinstance(node, ByteClass):
            if not node.ranges:
                raise GrammarError("empty byte class")
            return [self.byte_instr(node.ranges)]
        if isinstance(node, CharClass):
            return self.char_class(node)
        if isinstance(node, Seq):
            if not node.items:
                return [self.emit(JUMP)]
            exits: list[int] = []
            items, i = node.items, 0
            while i < len(items):
                self.link(exits, len(self.kind))
                separator = list_separator(items[i], items[i + 1]) if i + 1 < len(items) else None
                if separator is not None:
                    exits = self.separated(items[i], separator)
                    i += 2
                else:
                    exits = self.node(items[i])
                    i += 1
            return exits
        if isinstance(node, Choice):
            if not node.alts:  # the empty union: an instruction that accepts no byte
                return [self.emit(BYTE, accept=bytes(256))]
            trie = alternation_trie(node.alts)
            if trie is not None:
                return self.alternation(trie)
            split = self.emit(SPLIT)
            starts: list[int] = []
            exits = []
            for alt in node.alts:
                starts.append(len(self.kind))
                exits.extend(self.node(alt))
            self.targets[split] = tuple(starts)
            return exits
        if isinstance(node, Repeat):
            return self.repeat(node)
        if isinstance(node, Ref):
            pc = self.emit(CALL)
            self.aux[pc] = pc + 1
            self.pending_calls.append((pc, node.name))
            return [self.emit(JUMP)]
        if isinstance(node, Special):
            return [self.emit(SPECIAL, aux=SPECIAL_BASE + self.specials.index(node.name))]
        if isinstance(node, Until):
            return self.until(node)
        if isinstance(node, Capture):
            self.emit(OPEN, aux=self.tag(node.tag), arg=len(self.kind) + 1)
            exits = self.node(node.item)
            close = self.emit(CLOSE, aux=self.tag(node.tag))
            self.link(exits, close)
            return [close]
        if isinstance(node, Trigger):
            return self.node(node.item)
        if isinstance(node, JsonSchema):
            raise GrammarError("JsonSchema nodes must be expanded before compiling")
        raise GrammarError(f"cannot compile IR node {type(node).__name__}")

    def tag(self, name: str) -> int:
        """The number of capture tag `name`."""
        if name not in self.tags:
            self.tags.append(name)
        return self.tags.index(name)

    def alternation(self, trie: Alternation) -> list[int]:
        """A choice as the trie of its alternatives (`pegmask.grammars.alternation`): a node
        of several branches is a SPLIT whose targets read each branch's symbol, so a node
        that branches on bytes is one parked thread. Walked from a work list, depth first: a
        trie is as deep as its longest alternative."""
        exits: list[int] = []
        work: list[tuple[list[int], int, list[int]]] = [(list(range(len(trie))), 0, [])]
        while work:
            members, depth, incoming = work.pop()
            if len(members) == 1:  # one alternative's rest
                exits.extend(self.chain(trie.rest(members[0], depth), incoming))
                continue
            branches = trie.branches(members, depth)
            if branches == [(None, None)] and incoming:  # they end where that symbol does
                exits.extend(incoming)
                continue
            self.link(incoming, len(self.kind))
            split = self.emit(SPLIT) if len(branches) > 1 else None
            starts: list[int] = []
            children: list[tuple[list[int], int, list[int]]] = []
            for symbol, group in branches:
                starts.append(len(self.kind))
                if group is None:
                    exits.append(self.emit(JUMP))
                else:
                    children.append((group, depth + 1, self.symbol(symbol)))
            if split is not None:
                self.targets[split] = tuple(starts)
            work.extend(reversed(children))
        return exits

    def chain(self, symbols: bytes | tuple[Symbol, ...], incoming: list[int]) -> list[int]:
        """Code for `symbols` one after another, entered from `incoming`; its exits."""
        if isinstance(symbols, bytes):
            if not symbols:
                return incoming
            self.link(incoming, len(self.kind))
            return self.literal(symbols)
        for symbol in symbols:
            self.link(incoming, len(self.kind))
            incoming = self.symbol(symbol)
        return incoming

    def symbol(self, symbol: Symbol) -> list[int]:
        """Code for one symbol of an alternative (see `alternation.symbols`)."""
        if isinstance(symbol, int):
            return [self.emit(BYTE, accept=_ONE_BYTE[symbol])]
        if isinstance(symbol, Mark):
            return [self.emit(CLOSE if symbol.close else OPEN, aux=self.tag(symbol.tag))]
        return self.node(symbol)

    def char_class(self, node: CharClass) -> list[int]:
        sequences = char_class_sequences(node)
        if not sequences:
            raise GrammarError("character class matches nothing")
        # Group single-byte sequences into one instruction; multi-byte ones as a choice, one
        # branch per continuation (E1-EC and EE-EF, say, lead to the same two bytes), so that
        # a configuration inside text waits on as few threads as there are continuations.
        singles = [sequence[0] for sequence in sequences if len(sequence) == 1]
        tails: dict[tuple[tuple[int, int], ...], list[tuple[int, int]]] = {}
        for sequence in sequences:
            if len(sequence) > 1:
                tails.setdefault(tuple(sequence[1:]), []).append(sequence[0])
        if not tails:
            return [self.byte_instr(singles)]
        split = self.emit(SPLIT)
        starts: list[int] = []
        exits: list[int] = []
        if singles:
            starts.append(len(self.kind))
            exits.append(self.byte_instr(singles))
        for tail, leads in tails.items():
            starts.append(len(self.kind))
            prev = [self.byte_instr(leads)]
            for lo, hi in tail:
                pc = self.byte_instr([(lo, hi)])
                self.link(prev, pc)
                prev = [pc]
            exits.extend(prev)
        self.targets[split] = tuple(starts)
        return exits

    def repeat(self, node: Repeat) -> list[int]:
        if node.min < 0 or (node.max is not None and node.max < node.min):
            raise GrammarError(f"invalid repetition bounds {{{node.min},{node.max}}}")
        table: bytes | None = None

        def item() -> list[int]:
            """The item's code; once it is seen to be one BYTE instruction (a byte class, the
            32 optional bytes of JSON whitespace), its copies reuse that accept table."""
            nonlocal table
            if table is not None:
                return [self.emit(BYTE, accept=table)]
            start = len(self.kind)
            item_exits = self.node(node.item)
            if item_exits == [start] and len(self.kind) == start + 1 and self.kind[start] == BYTE:
                table = self.accept[start]
            return item_exits

        exits: list[int] = [self.emit(JUMP)]
        for _ in range(node.min):
            self.link(exits, len(self.kind))
            exits = item()
        if node.max is None:
            loop = self.emit(SPLIT)
            self.link(exits, loop)
            body = len(self.kind)
            body_exits = item()
            self.link(body_exits, loop)
            done = self.emit(JUMP)
            self.targets[loop] = (body, done)
            return [done]
        optional_exits: list[int] = []
        count = node.max - node.min
        for done in range(count):
            split = self.emit(SPLIT)
            self.link(exits, split)
            body = len(self.kind)
            exits = item()
            skip = self.emit(JUMP)
            optional_exits.append(skip)
            self.targets[split] = (body, skip)
            if exits == [body] and len(self.kind) == body + 2 and self.kind[body] == BYTE:
                self.run_skips[body] = (count - done, skip)
        return exits + optional_exits

    def separated(self, item: Node, separator: Node) -> list[int]:
        """`item (separator item)*` with one copy of `item`, which the separator jumps back
        to: the items of a JSON array run on the same instructions, so the automaton's
        configurations inside the second item are those of the first (two copies would make
        each of them twice)."""
        start = len(self.kind)
        item_exits = self.node(item)
        split = self.emit(SPLIT)
        self.link(item_exits, split)
        body = len(self.kind)
        self.link(self.node(separator), start)
        done = self.emit(JUMP)
        self.targets[split] = (body, done)  # another item first, as the loop would
        return [done]

    def until(self, node: Until) -> list[int]:
        delta, forbidden = until_automaton(node.stops)
        entry = self.emit(JUMP)
        # One SPLIT per DFA state: continue with a byte (grouped by target state), or leave.
        state_pc = [self.emit(SPLIT) for _ in delta]
        self.arg[entry] = state_pc[0]
        branches_of: list[list[int]] = []
        for row in delta:
            by_target: dict[int, list[int]] = {}
            for byte, nxt in row.items():
                if nxt != forbidden:
                    by_target.setdefault(nxt, []).append(byte)
            branches: list[int] = []
            for nxt, byte_list in sorted(by_target.items()):
                pc = self.byte_instr(_to_ranges(byte_list))
                self.arg[pc] = state_pc[nxt]
                branches.append(pc)
            branches_of.append(branches)
        exit_pc = self.emit(JUMP)
        for pc, branches in zip(state_pc, branches_of, strict=False):
            self.targets[pc] = (*branches, exit_pc)
        return [exit_pc]


def call_components(calls: Mapping[str, list[tuple[str, int]]]) -> dict[str, int]:
    """Each rule's strongly connected component of the call graph, numbered so that a
    component's callees come before it (Tarjan's order), found without recursion: generated
    grammars have chains of thousands of rules."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    component: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = 0
    for root in calls:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            name, edge = work.pop()
            if edge == 0:
                index[name] = low[name] = len(index)
                stack.append(name)
                on_stack.add(name)
            edges = calls[name]
            if edge > 0:  # back from edges[edge - 1]'s callee
                callee = edges[edge - 1][0]
                low[name] = min(low[name], low[callee])
            while edge < len(edges) and edges[edge][0] in index:
                callee = edges[edge][0]
                if callee in on_stack:
                    low[name] = min(low[name], index[callee])
                edge += 1
            if edge < len(edges):
                work.append((name, edge + 1))
                work.append((edges[edge][0], 0))
                continue
            if low[name] == index[name]:
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component[member] = components
                    if member == name:
                        break
                components += 1
    return component


def _to_ranges(values: list[int]) -> list[tuple[int, int]]:
    values = sorted(values)
    ranges: list[tuple[int, int]] = []
    for v in values:
        if ranges and v == ranges[-1][1] + 1:
            ranges[-1] = (ranges[-1][0], v)
        else:
            ranges.append((v, v))
    return ranges


def compile_program(ir: GrammarIR, *, generated: Iterable[str] = (),
                    limits: GrammarLimits = DEFAULT_LIMITS) -> Program:
    """Check the rules and emit the instruction program. Front-ends have expanded their nodes
    first (`Grammar.program`: JSON Schemas, large counted repetitions); `generated` names the
    rules they made (see `check_rules`). A program past `limits.max_instructions` is refused on
    its `instruction_count`, before any instruction is emitted."""
    check_rules(ir, generated)
    limits.check("max_instructions", 2 + instruction_count(ir.rules.values()),
                 "its program has too many instructions")
    return _Compiler(ir).compile()
