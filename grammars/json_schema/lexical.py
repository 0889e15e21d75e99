"""JSON tokens as grammar IR, for the JSON Schema front-end: string characters with their
escapes, numbers within bounds, multiples, and literal JSON values.

Spelling rule (one rule everywhere, so enum values, keys, patterns and free strings agree):
printable ASCII is written as itself (`/` may also be `\\/`; `"` and `\\` only as `\\"` and
`\\\\`), control characters as a short escape (`\\n`) or `\\u00XX`, and every other character
either as itself (UTF-8) or as a `\\uXXXX` escape, astral characters as a surrogate pair.
Lone surrogates are not accepted: a JSON string here always decodes to Unicode scalar values,
so one escape (or one pair) is one character for `minLength` / `maxLength`.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from decimal import Decimal
from functools import lru_cache

from pegmask.grammars.ir import (
    EMPTY,
    MAX_UNICODE,
    ByteClass,
    CharClass,
    Choice,
    Literal,
    Node,
    Ref,
    Repeat,
    Seq,
    choice,
    optional,
    seq,
)
from pegmask.grammars.json_schema.regular import CharDFA, class_ranges

QUOTE = Literal(b'"')
DIGIT = CharClass(((0x30, 0x39),))
NONZERO = CharClass(((0x31, 0x39),))
DIGITS = Repeat(DIGIT, 1, None)
_SHORT_ESCAPES = {0x08: b"b", 0x09: b"t", 0x0A: b"n", 0x0C: b"f", 0x0D: b"r"}
_SURROGATES = (0xD800, 0xDFFF)
Ranges = tuple[tuple[int, int], ...]


# ---------------------------------------------------------------------------- digit ranges
DigitClass = Callable[[int, int], Node]


def decimal_digit(lo: int, hi: int) -> Node:
    return Literal(bytes([0x30 + lo])) if lo == hi else CharClass(((0x30 + lo, 0x30 + hi),))


def hex_digit(lo: int, hi: int) -> Node:
    """Hex digits lo..hi, letters in either case."""
    ranges: list[tuple[int, int]] = []
    if lo <= 9:
        ranges.append((0x30 + lo, 0x30 + min(hi, 9)))
    if hi >= 10:
        a, b = max(lo, 10) - 10, hi - 10
        ranges += [(0x41 + a, 0x41 + b), (0x61 + a, 0x61 + b)]
    if len(ranges) == 1 and ranges[0][0] == ranges[0][1]:
        return Literal(bytes([ranges[0][0]]))
    return CharClass(tuple(ranges))


def fixed_width_range(lo: int, hi: int, width: int, base: int, digit: DigitClass) -> Node:
    """Strings of exactly `width` base-`base` digits whose value lies in [lo, hi]."""
    if width == 0:
        return EMPTY
    unit = base ** (width - 1)
    (ld, lr), (hd, hr) = divmod(lo, unit), divmod(hi, unit)
    if ld == hd:
        return seq(digit(ld, ld), fixed_width_range(lr, hr, width - 1, base, digit))
    alts: list[Node] = []
    first_full, last_full = ld + (lr != 0), hd - (hr != unit - 1)
    if lr != 0:
        alts.append(seq(digit(ld, ld), fixed_width_range(lr, unit - 1, width - 1, base, digit)))
    if first_full <= last_full:
        rest = Repeat(digit(0, base - 1), width - 1, width - 1) if width > 1 else EMPTY
        alts.append(seq(digit(first_full, last_full), rest))
    if hr != unit - 1:
        alts.append(seq(digit(hd, hd), fixed_width_range(0, hr, width - 1, base, digit)))
    return choice(*alts)


def natural_range(lo: int, hi: int | None) -> Node | None:
    """Decimal naturals without leading zeros in [lo, hi] (hi None: unbounded). The lowest
    and highest widths are digit ranges; every width between is `[1-9][0-9]{w-1}`, one node."""
    if hi is not None and hi < lo:
        return None
    low_width = len(str(lo))
    high_width = len(str(hi)) if hi is not None else None

    def width_range(width: int) -> Node:
        wlo = max(lo, 10 ** (width - 1) if width > 1 else 0)
        whi = 10**width - 1 if hi is None else min(hi, 10**width - 1)
        return fixed_width_range(wlo, whi, width, 10, decimal_digit)

    alts = [width_range(low_width)]
    if high_width is None:
        alts.append(seq(NONZERO, Repeat(DIGIT, low_width, None)))
    elif high_width > low_width:
        if high_width > low_width + 1:
            alts.append(seq(NONZERO, Repeat(DIGIT, low_width, high_width - 2)))
        alts.append(width_range(high_width))
    return choice(*alts)


def integer_range(lo: int | None, hi: int | None) -> Node | None:
    """JSON integers (`-0` included when 0 is allowed) in [lo, hi]; None when empty."""
    alts: list[Node] = []
    if hi is None or hi >= 0:
        node = natural_range(max(lo, 0) if lo is not None else 0, hi)
        if node is not None:
            alts.append(node)
    if lo is None or lo <= 0:
        low_mag = 0 if hi is None or hi >= 0 else -hi
        node = natural_range(low_mag, None if lo is None else -lo)
        if node is not None:
            alts.append(seq(Literal(b"-"), node))
    return choice(*alts) if alts else None


# ---------------------------------------------------------------------------- numbers
FRACTION = seq(Literal(b"."), DIGITS)
EXPONENT = seq(CharClass(((0x45, 0x45), (0x65, 0x65))), optional(CharClass(((0x2B, 0x2B), (0x2D, 0x2D)))), DIGITS)
INTEGER = seq(optional(Literal(b"-")), choice(Literal(b"0"), seq(NONZERO, Repeat(DIGIT, 0, None))))
NUMBER = seq(INTEGER, optional(FRACTION), optional(EXPONENT))
# Numbers that are not integers (JSON Schema counts `1.0` as one): a fraction with a non-zero
# digit and no exponent, the only non-integral spellings the grammar generates.
NON_INTEGRAL = seq(INTEGER, Literal(b"."), Repeat(Literal(b"0"), 0, None), NONZERO, Repeat(DIGIT, 0, None))


def _fraction_digits(value: Decimal) -> tuple[int, str]:
    """(integer part, fraction digits without trailing zeros) of a non-negative decimal."""
    whole = int(value)
    text = format(value - whole, "f")
    frac = text.split(".", 1)[1].rstrip("0") if "." in text else ""
    return whole, frac


def _at_least(frac: str, strict: bool) -> Node:
    """Non-empty digit strings F with 0.F >= 0.frac (> when strict); frac has no trailing
    zeros. Nested per digit, with zero runs as one repetition, so the size stays linear."""
    anything = Repeat(DIGIT, 0, None)
    if not frac:
        return seq(anything, NONZERO, anything) if strict else DIGITS
    zeros = len(frac) - len(frac.lstrip("0"))
    if zeros:
        beyond = seq(Repeat(Literal(b"0"), 0, zeros - 1), NONZERO, anything)
        return choice(beyond, seq(Literal(b"0" * zeros), _at_least(frac[zeros:], strict)))
    head, rest = int(frac[0]), frac[1:]
    alts = [seq(decimal_digit(head + 1, 9), anything)] if head < 9 else []
    if rest:
        alts.append(seq(Literal(frac[0].encode()), _at_least(rest, strict)))
    elif not strict:
        alts.append(seq(Literal(frac[0].encode()), Repeat(DIGIT, 0, None)))
    else:
        alts.append(seq(Literal(frac[0].encode()), Repeat(DIGIT, 0, None), NONZERO, Repeat(DIGIT, 0, None)))
    return choice(*alts)


def _at_most(frac: str, strict: bool) -> Node | None:
    """Non-empty digit strings F with 0.F <= 0.frac (< when strict); None when there are none."""
    if not frac:
        return None if strict else Repeat(Literal(b"0"), 1, None)
    zeros = len(frac) - len(frac.lstrip("0"))
    if zeros:
        rest = _at_most(frac[zeros:], strict)  # never None: frac[zeros:] is not empty
        shorter = [Repeat(Literal(b"0"), 1, zeros - 1)] if zeros > 1 else []
        return choice(*shorter, seq(Literal(b"0" * zeros), optional(rest)))
    head, rest_digits = int(frac[0]), frac[1:]
    alts = [seq(decimal_digit(0, head - 1), Repeat(DIGIT, 0, None))]
    after = _at_most(rest_digits, strict)
    if after is not None and rest_digits:
        alts.append(seq(Literal(frac[0].encode()), optional(after)))
    elif not strict:
        alts.append(seq(Literal(frac[0].encode()), Repeat(Literal(b"0"), 0, None)))
    return choice(*alts)


def _fraction_at_least(frac: str, strict: bool) -> Node:
    """Optional fraction parts `(.digits)?` whose value is >= (or >) 0.frac."""
    alts = [seq(Literal(b"."), _at_least(frac, strict))]
    if not frac and not strict:
        alts.append(EMPTY)
    return choice(*alts)


def _fraction_at_most(frac: str, strict: bool) -> Node | None:
    """Optional fraction parts whose value is <= (or <) 0.frac; None when there are none."""
    alts: list[Node] = []
    if frac or not strict:
        alts.append(EMPTY)
    fraction = _at_most(frac, strict)
    if fraction is not None:
        alts.append(seq(Literal(b"."), fraction))
    return choice(*alts) if alts else None


def magnitude_range(lo: Decimal, lo_strict: bool, hi: Decimal | None, hi_strict: bool) -> Node | None:
    """Unsigned decimals `digits(.digits)?` (no exponent) with value in the interval."""
    lo_int, lo_frac = _fraction_digits(lo)
    at_lo = seq(Literal(str(lo_int).encode()), _fraction_at_least(lo_frac, lo_strict))
    if hi is None:
        return choice(seq(natural_range(lo_int + 1, None), optional(FRACTION)), at_lo)
    hi_int, hi_frac = _fraction_digits(hi)
    at_hi = _fraction_at_most(hi_frac, hi_strict)
    if lo_int == hi_int:
        if at_hi is None:
            return None
        lo_part = _fraction_at_least(lo_frac, lo_strict)
        both = CharDFA.from_node(lo_part).intersect(CharDFA.from_node(at_hi)).to_node()
        return None if both is None else seq(Literal(str(lo_int).encode()), both)
    alts = [at_lo]
    middle = natural_range(lo_int + 1, hi_int - 1)
    if middle is not None:
        alts.append(seq(middle, optional(FRACTION)))
    if at_hi is not None:
        alts.append(seq(Literal(str(hi_int).encode()), at_hi))
    return choice(*alts)


def number_range(lo: Decimal | None, lo_strict: bool, hi: Decimal | None, hi_strict: bool,
                 ) -> Node | None:
    """JSON numbers in the interval (None bounds: open).

    Exponent notation is accepted where the sign alone decides the bounds (a side that is
    unbounded and whose other end is 0); elsewhere only plain decimals are produced.
    """
    alts: list[Node] = []
    zero_ok = ((lo is None or lo < 0 or (lo == 0 and not lo_strict))
               and (hi is None or hi > 0 or (hi == 0 and not hi_strict)))
    # Non-negative values.
    if hi is None or hi > 0 or (hi == 0 and zero_ok):
        mlo, mlo_strict = (lo, lo_strict) if lo is not None and lo >= 0 else (Decimal(0), False)
        node = magnitude_range(mlo, mlo_strict, hi, hi_strict)
        if node is not None:
            if hi is None and mlo == 0:
                node = seq(node, optional(EXPONENT))
            alts.append(node)
    # Negative values (and `-0` forms when zero is allowed).
    if lo is None or lo < 0 or (lo == 0 and zero_ok):
        if hi is not None and hi < 0:
            mlo, mlo_strict = -hi, hi_strict
        else:
            mlo, mlo_strict = Decimal(0), not zero_ok
        node = magnitude_range(mlo, mlo_strict, None if lo is None else -lo, lo_strict)
        if node is not None:
            if lo is None and mlo == 0:
                node = seq(node, optional(EXPONENT))
            alts.append(seq(Literal(b"-"), node))
    return choice(*alts) if alts else None


def multiple_of_dfa(step: Decimal, integer_only: bool) -> CharDFA | None:
    """Decimals (optional `-`, no exponent) that are multiples of `step`; None if not
    expressible.

    With step = k / 10^d, a value is a multiple iff it has at most d significant fraction
    digits and its value scaled by 10^d is divisible by k: a DFA over (remainder, digits read).
    """
    if step <= 0:
        return None
    _, digits, exponent = step.normalize().as_tuple()
    assert isinstance(exponent, int)
    k = int("".join(map(str, digits))) * 10 ** max(0, exponent)
    d = max(0, -exponent)
    if integer_only and d:  # an integer is a multiple of k/10^d iff of k / gcd(k, 10^d)
        k, d = k // math.gcd(k, 10**d), 0
    if k > 1000 or d > 12:
        return None
    # States: ("start"), ("zero"), ("int", r), ("dot", r, f), ("frac", r, f), ("tail"), dead.
    names: dict[tuple, int] = {}
    rows: list[list[tuple[int, int, tuple]]] = []
    accepting: list[bool] = []

    def sid(name: tuple) -> int:
        if name not in names:
            names[name] = len(names)
            rows.append([])
            accepting.append(False)
        return names[name]

    def scaled_ok(r: int, f: int) -> bool:
        return (r * 10 ** (d - f)) % k == 0

    dead = ("dead",)
    todo = [("start",)]
    sid(todo[0])
    sid(dead)
    while todo:
        name = todo.pop()
        kind = name[0]
        out: list[tuple[int, int, tuple]] = []
        if kind in ("start", "signed"):
            if kind == "start":
                out.append((0x2D, 0x2D, ("signed",)))
            out.append((0x30, 0x30, ("int", 0, True)))
            out += [(0x30 + i, 0x30 + i, ("int", i % k, False)) for i in range(1, 10)]
        elif kind == "int":
            r, is_zero = name[1], name[2]
            accepting[names[name]] = scaled_ok(r, 0)
            if not is_zero:
                out += [(0x30 + i, 0x30 + i, ("int", (10 * r + i) % k, False)) for i in range(10)]
            if not integer_only:
                out.append((0x2E, 0x2E, ("dot", r, 0)))
        elif kind in ("dot", "frac"):
            r, f = name[1], name[2]
            if kind == "frac":
                accepting[names[name]] = scaled_ok(r, f)
            for i in range(10):
                if f < d:
                    out.append((0x30 + i, 0x30 + i, ("frac", (10 * r + i) % k, f + 1)))
                elif i == 0:
                    out.append((0x30, 0x30, ("frac", r, f)))
        for _, _, target in out:
            if target not in names:
                sid(target)
                todo.append(target)
        rows[names[name]] = [(lo, hi, names[t]) for lo, hi, t in out]
    dead_id = names[dead]
    trans = []
    for row in rows:
        edges: list[tuple[int, int, int]] = []
        pos = 0
        for lo, hi, t in sorted(row):
            if lo > pos:
                edges.append((pos, lo - 1, dead_id))
            edges.append((lo, hi, t))
            pos = hi + 1
        if pos <= MAX_UNICODE:
            edges.append((pos, MAX_UNICODE, dead_id))
        trans.append(tuple(edges))
    return CharDFA(trans, accepting).minimize()


# ---------------------------------------------------------------------------- string characters
ALL: Ranges = ((0, _SURROGATES[0] - 1), (_SURROGATES[1] + 1, MAX_UNICODE))
# Characters that have an escaped spelling: controls, `"`, `/`, `\\`, and all non-ASCII.
_ESCAPABLE: Ranges = ((0, 0x1F), (0x22, 0x22), (0x2F, 0x2F), (0x5C, 0x5C),
                      (0x7F, _SURROGATES[0] - 1), (_SURROGATES[1] + 1, MAX_UNICODE))


def _intersect(ranges: Ranges, lo: int, hi: int) -> list[tuple[int, int]]:
    return [(max(a, lo), min(b, hi)) for a, b in ranges if a <= hi and b >= lo]


def _covers(ranges: Ranges, needed: Ranges) -> bool:
    return all(sum(b - a + 1 for a, b in _intersect(ranges, lo, hi)) == hi - lo + 1
               for lo, hi in needed)


@lru_cache(maxsize=4096)
def _hex4(lo: int, hi: int) -> Node:
    return fixed_width_range(lo, hi, 4, 16, hex_digit)


def _raw_part(ranges: Ranges) -> Node | None:
    raw = [r for lo, hi in ((0x20, 0x21), (0x23, 0x5B), (0x5D, MAX_UNICODE))
           for r in _intersect(ranges, lo, hi)]
    return CharClass(tuple(raw)) if raw else None


@lru_cache(maxsize=4096)
def escape_part(ranges: Ranges) -> Node | None:
    """The escaped spellings of the characters in `ranges` (None when there are none).

    They share their leading backslash (and `u`), so that a string's configuration has one
    thread waiting for `\\` rather than one per escape."""
    letters = [spelling for code, spelling in ((0x22, b'"'), (0x5C, b"\\"), (0x2F, b"/"))
               if _intersect(ranges, code, code)]
    hex_escapes: list[Node] = []
    for lo, hi in _intersect(ranges, 0, 0x1F):
        hex_escapes.append(_hex4(lo, hi))
        letters.extend(_SHORT_ESCAPES[c] for c in range(lo, hi + 1) if c in _SHORT_ESCAPES)
    for lo, hi in _intersect(ranges, 0x7F, 0xFFFF):
        hex_escapes.append(_hex4(lo, hi))
    for lo, hi in _intersect(ranges, 0x10000, MAX_UNICODE):
        hex_escapes.append(_surrogate_pairs(lo, hi))
    after: list[Node] = []
    if letters:
        codes = sorted(letter[0] for letter in letters)
        after.append(CharClass(tuple((code, code) for code in codes)))
    if hex_escapes:
        after.append(seq(Literal(b"u"), choice(*hex_escapes)))
    return seq(Literal(b"\\"), choice(*after)) if after else None


def _surrogate_pairs(lo: int, hi: int) -> Node:
    """`uD8xx\\uDCxx` (after the first backslash) pairs for the astral scalars lo..hi."""
    (hl, ll), (hh, lh) = divmod(lo - 0x10000, 0x400), divmod(hi - 0x10000, 0x400)

    def pair(h_lo: int, h_hi: int, l_lo: int, l_hi: int) -> Node:
        return seq(_hex4(0xD800 + h_lo, 0xD800 + h_hi),
                   Literal(b"\\u"), _hex4(0xDC00 + l_lo, 0xDC00 + l_hi))

    if hl == hh:
        return pair(hl, hl, ll, lh)
    alts = [pair(hl, hl, ll, 0x3FF)]
    if hl + 1 <= hh - 1:
        alts.append(pair(hl + 1, hh - 1, 0, 0x3FF))
    alts.append(pair(hh, hh, 0, lh))
    return choice(*alts)


def encode_ranges(ranges: Ranges, rest: Node | None = None) -> Node | None:
    """One JSON string character (raw or escaped) whose decoded scalar lies in `ranges`
    (sorted, merged, without surrogates); None when the ranges are empty. `rest` stands for
    `NOT_PLAIN` (usually a shared rule) when the ranges include all of it."""
    if rest is not None and _covers(ranges, _ESCAPABLE):
        plain = _intersect(ranges, 0x20, 0x7E)
        raw = [r for lo, hi in ((0x20, 0x21), (0x23, 0x5B), (0x5D, 0x7E)) for r in _intersect(tuple(plain), lo, hi)]
        return choice(CharClass(tuple(raw)), rest) if raw else rest
    alts = [a for a in (_raw_part(ranges), escape_part(ranges)) if a is not None]
    return choice(*alts) if alts else None


PLAIN = CharClass(((0x20, 0x21), (0x23, 0x5B), (0x5D, 0x7E)))
# Every character spelling except printable ASCII: raw non-ASCII (UTF-8) and all escapes.
NOT_PLAIN = choice(CharClass(((0x7F, MAX_UNICODE),)), escape_part(ALL))


def encode_text(text: str) -> Node:
    """The JSON spellings of the characters of `text` (without the quotes)."""
    if _PLAIN_TEXT.fullmatch(text):  # most enum values and keys: one literal
        return Literal(text.encode())
    parts: list[Node] = []
    plain = bytearray()
    for char in text:
        code = ord(char)
        if 0x20 <= code < 0x7F and char not in '"\\/':
            plain += char.encode()
            continue
        if plain:
            parts.append(Literal(bytes(plain)))
            plain.clear()
        parts.append(_spelled(code))
    if plain:
        parts.append(Literal(bytes(plain)))
    return seq(*parts)


_PLAIN_TEXT = re.compile(r"[\x20\x21\x23-\x2e\x30-\x5b\x5d-\x7e]*")


@lru_cache(maxsize=4096)
def _spelled(code: int) -> Node:
    """The spellings of one character that has several. Memoized: the values of an enum then
    hold the same node for the same character, and the compiler's trie of them shares it
    (`pegmask.grammars.alternation`)."""
    node = encode_ranges(((code, code),))
    if node is None:  # a lone surrogate in the schema itself
        raise ValueError(f"string contains a lone surrogate U+{code:04X}")
    return node


def encode_node(node: Node, encode_class: Callable[[Ranges], Node | None] = encode_ranges,
                ) -> Node | None:
    """Map a character-level IR node (a regular expression over characters) to the IR of its
    JSON spellings; None when it matches nothing. `encode_class` spells one character class
    (the emitter passes one that shares big classes as rules); a `Ref` names a rule that is
    spelled separately and is kept as is."""
    if isinstance(node, Ref):  # a rule spelled separately
        return node
    if isinstance(node, Literal):
        return encode_text(node.data.decode("utf-8"))
    if isinstance(node, (CharClass, ByteClass)):
        return encode_class(tuple(class_ranges(node)))
    if isinstance(node, Seq):
        items = [encode_node(i, encode_class) for i in node.items]
        return None if any(i is None for i in items) else seq(*items)
    if isinstance(node, Choice):
        alts = [a for a in (encode_node(a, encode_class) for a in node.alts) if a is not None]
        return choice(*alts) if alts else None
    if isinstance(node, Repeat):
        item = encode_node(node.item, encode_class)
        if item is None:
            return EMPTY if node.min == 0 else None
        return Repeat(item, node.min, node.max)
    raise ValueError(f"{type(node).__name__} is not a character-level regular expression")



def string_literal(text: str) -> Node:
    spelled = encode_text(text)
    if isinstance(spelled, Literal):
        return Literal(b'"' + spelled.data + b'"')
    return seq(QUOTE, spelled, QUOTE)


# ---------------------------------------------------------------------------- literal values
def number_literal(value: int | float) -> Node:
    """The canonical spellings of a number constant (an integral value also as `N.0`)."""
    if isinstance(value, bool):
        raise TypeError("booleans are not numbers")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("non-finite number")
        if not value.is_integer():
            return Literal(json.dumps(value).encode())
        value = int(value)
    text = str(value).encode()
    return choice(Literal(text), Literal(text + b".0"))


def value_literal(value: object, ws: Node) -> Node:
    """IR for one JSON constant (`const` / `enum` member) with the configured whitespace;
    object members keep the constant's key order."""
    if value is None:
        return Literal(b"null")
    if value is True:
        return Literal(b"true")
    if value is False:
        return Literal(b"false")
    if isinstance(value, (int, float)):
        return number_literal(value)
    if isinstance(value, str):
        return string_literal(value)
    sep = seq(ws, Literal(b","), ws)
    if isinstance(value, list):
        items: list[Node] = []
        for i, item in enumerate(value):
            items += [sep] if i else []
            items.append(value_literal(item, ws))
        return seq(Literal(b"["), ws, *items, ws, Literal(b"]"))
    if isinstance(value, dict):
        members: list[Node] = []
        for i, (key, item) in enumerate(value.items()):
            members += [sep] if i else []
            members += [string_literal(key), ws, Literal(b":"), ws, value_literal(item, ws)]
        return seq(Literal(b"{"), ws, *members, ws, Literal(b"}"))
    raise TypeError(f"not a JSON value: {type(value).__name__}")
