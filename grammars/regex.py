r"""Regular expressions -> grammar IR, for `Grammar.from_regex` and JSON Schema's `pattern`.

A small recursive-descent parser instead of Python's private `re._parser`: that module changes
between Python versions, reports no positions for what *we* reject, and speaks Python's dialect
where structured-output patterns are mostly ECMAScript (JSON Schema) with Python-isms mixed in.

`regex_to_node(p)` is the language of `re.fullmatch(p, s)`; `regex_to_node_search(p)` is the
language of an unanchored ECMAScript search (JSON Schema `pattern`). The IR is exact (bounds are
kept, nothing is widened), so on this subset a grammar's verdict is `re`'s verdict.

Supported subset
----------------
* Literals; escapes ``\n \t \r \f \v \0`` (``\0oo`` octal), ``\xHH``, ``\uXXXX`` (a
  UTF-16 surrogate pair ``\uD83D\uDE00`` is one character), ``\u{X...}``, ``\UXXXXXXXX``,
  and a backslash before any ASCII punctuation or non-ASCII character (``\. \/ \-``).
* Class escapes with their ECMAScript meanings, which are ASCII except ``\s``:
  ``\d`` = ``[0-9]``, ``\w`` = ``[A-Za-z0-9_]``, ``\s`` = ECMAScript white space and line
  terminators (ASCII ``[\t\n\v\f\r ]`` plus U+00A0, U+1680, U+2000-U+200A, U+2028, U+2029,
  U+202F, U+205F, U+3000, U+FEFF); ``\D \W \S`` are their complements.
* Character classes ``[...]`` and ``[^...]`` with ranges, class escapes and ``\b`` (backspace)
  inside. ``[]`` and ``[^]`` are rejected: they mean "nothing"/"anything" in ECMAScript but
  start a class containing ``]`` in Python; write ``\]``.
* ``.`` is any character except ``\n`` (any character at all under the ``s`` flag).
* Groups ``(...)``, ``(?:...)``, ``(?P<name>...)``, ``(?<name>...)`` (all plain groups, no
  captures are reported) and comments ``(?#...)``.
* Alternation ``|``; quantifiers ``* + ? {n} {n,} {n,m} {,m}`` and their lazy ``?`` forms (the
  language is the same). As in Python, ``{,m}`` is ``{0,m}`` and a ``{`` that does not start a
  quantifier is a literal.
* Anchors ``^``/``\A`` and ``$``/``\Z``/``\z`` anywhere outside a repetition (inside an
  optional group too): ``(^\d+$)``, ``^$|(^a)``, ``(^|,)x``. Each is pushed out to the ends of
  its branch: a ``^`` holds only where everything before it in the match is empty and the
  match starts the text (`_forms`), so ``a^b`` matches nothing. ``$`` matches only at the very
  end (ECMAScript).
* Lookaheads ``(?=...)`` ``(?!...)`` and lookbehinds ``(?<=...)`` ``(?<!...)`` (of any
  width) at the top level of a branch, lookbehinds before lookaheads: ``^(?!foo)\w+``,
  ``(?=.*[A-Z])(?=.*\d).{8,}``, ``foo(?!bar)``. Regular languages are closed under
  intersection and difference, so the text after a lookahead (before a lookbehind) is
  intersected with (or stripped of) the lookaround's language on DFAs
  (`pegmask.grammars.json_schema.regular`, with its size caps; beyond them a `RegexError`).
* Unicode property classes ``\p{...}`` / ``\P{...}`` of general categories (``L``,
  ``Letter``, ``Lu``, ``gc=Nd``, ``General_Category=Punctuation``, ``LC``) and ``Any``,
  ``ASCII``, ``Assigned``, from Python's `unicodedata` (its Unicode version).
* Inline flags ``i`` (case-insensitive) and ``s`` (dot matches newline): global ``(?is)`` at the
  start of the pattern, or scoped ``(?i:...)`` / ``(?-i:...)``. Case folding pairs each
  character with its single-character lower/upper case forms, but never an ASCII with a
  non-ASCII character (as ECMAScript without the ``u`` flag: ``(?i)k`` does not match the Kelvin
  sign); ``\d \w \s`` are not folded.

Rejected with a `GrammarError` (`RegexError`) naming the construct and its position:
backreferences (``\1``, ``\k<n>``, ``(?P=n)``), lookarounds inside groups, a lookbehind after
a lookahead, conditionals ``(?(...)``, atomic groups ``(?>...)``, possessive quantifiers
``a*+``, word boundaries ``\b \B``, anchors inside a repetition, Unicode scripts
(``\p{Script=Greek}``: `unicodedata` has no script data) and other properties, POSIX classes
``[:alpha:]``, other inline flags (``m x a u L``), classes that match no character, lone
surrogates outside classes (UTF-8 cannot encode them), and full-match patterns that match no
string (a search for one is the empty language, `Choice(())`).

Size bounds keep hostile patterns from hanging the compiler: at most `MAX_PATTERN_LENGTH`
characters, groups nested at most `MAX_GROUP_DEPTH` deep, and at most `max_size` (default
`MAX_EXPANDED_SIZE`) items once the repetitions the compiler unrolls are expanded. Each character
or class counts 1. A repetition of an item that may match the empty string is unrolled, and
every copy of it is a parser thread before any input: `x{n,m}` counts `m` times `x` (`x{n,}`
counts `n + 1` times), so nested ones multiply. Any other repetition counts as its item: large
counts compile to O(log n) rules (`pegmask.grammars.counted`), so `a{1000000000}` is a small
grammar. A repetition of a repetition is folded into one where that is exact
(`((a?){100}){100}` is `a{0,10000}`), which keeps the parser's live-thread count small.
"""

from __future__ import annotations

import bisect
import functools
import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass

from pegmask.grammars.counted import count_literal
from pegmask.grammars.errors import GrammarError
from pegmask.grammars.ir import (
    EMPTY,
    MAX_UNICODE,
    Capture,
    CharClass,
    Choice,
    Literal,
    Node,
    Repeat,
    Seq,
    choice,
    seq,
)
from pegmask.grammars.program import char_class_scalar_ranges, is_nullable

MAX_PATTERN_LENGTH = 20_000
MAX_EXPANDED_SIZE = 10_000
MAX_GROUP_DEPTH = 100

Ranges = tuple[tuple[int, int], ...]

DIGIT: Ranges = ((0x30, 0x39),)
WORD: Ranges = ((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A))
SPACE: Ranges = (
    (0x09, 0x0D), (0x20, 0x20), (0xA0, 0xA0), (0x1680, 0x1680), (0x2000, 0x200A),
    (0x2028, 0x2029), (0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000), (0xFEFF, 0xFEFF),
)  # fmt: skip
_CLASS_ESCAPES = {"d": DIGIT, "w": WORD, "s": SPACE}
_CHAR_ESCAPES = {"n": 0x0A, "t": 0x09, "r": 0x0D, "f": 0x0C, "v": 0x0B}
ANY_CHAR = CharClass(((0, MAX_UNICODE),))
_DOT = CharClass(((0x0A, 0x0A),), negated=True)
_SUPPORTED_FLAGS = "is"

# A `{...}` that is a quantifier (Python's reading: `{}` is a literal, `{,}` means `{0,}`).
_BRACES = re.compile(r"\{(\d*)(?:(,)(\d*))?\}")
_GROUP_NAME = re.compile(r"[^\W\d]\w*")
_INLINE_FLAGS = re.compile(r"\(\?([a-zA-Z]*)(?:-([a-zA-Z]*))?([:)])")
_POSIX_CLASS = re.compile(r"\[:[A-Za-z]+:\]")
_HEX = frozenset("0123456789abcdefABCDEF")
_OCTAL = frozenset("01234567")


class RegexError(GrammarError):
    """A pattern is malformed or outside the supported subset; `position` indexes `pattern`."""

    def __init__(self, message: str, pattern: str, position: int):
        self.pattern = pattern
        self.position = position
        super().__init__(f"{message} at position {position} in regex {_excerpt(pattern, position)}")


class _NoMatch(RegexError):
    """The pattern is well formed but matches no string (`regex_to_node_search` says so with
    the empty language; a full-match grammar must match something)."""


def _excerpt(pattern: str, position: int, width: int = 60) -> str:
    """The pattern, or a window of it around `position` when it is long."""
    if len(pattern) <= width:
        return _quoted(pattern)
    start = max(0, min(position - width // 2, len(pattern) - width))
    end = start + width
    prefix = "..." if start else ""
    suffix = "..." if end < len(pattern) else ""
    return prefix + _quoted(pattern[start:end]) + suffix


def _quoted(text: str) -> str:
    """`text` in quotes as written in the pattern (`repr` would double every backslash)."""
    return "'" + "".join(c if c.isprintable() else repr(c)[1:-1] for c in text) + "'"


def regex_to_node(pattern: str, *, max_size: int = MAX_EXPANDED_SIZE) -> Node:
    """IR for the strings `pattern` fully matches (`re.fullmatch` semantics)."""
    parser = _Parser(pattern, max_size)
    return parser.language(parser.parse(), search=False)


def regex_to_node_search(pattern: str, *, max_size: int = MAX_EXPANDED_SIZE) -> Node:
    """IR for the strings in which `pattern` matches somewhere (JSON Schema `pattern`); the
    empty choice when there are none (`a^b`).

    Each alternative gets `[\\s\\S]*` before it unless anchored with `^`, and after it unless
    anchored with `$`; alternatives anchored alike share one wrapper.
    """
    parser = _Parser(pattern, max_size)
    try:
        return parser.language(parser.parse(), search=True)
    except _NoMatch:
        return Choice(())  # a schema's `pattern` that can never match: no string is valid


# Anchors while parsing: zero-width markers that `_forms` pushes out to the ends of a branch.
# (Captures, so the parser's nullability checks see them as empty; regexes report no captures.)
_START = Capture("regex ^", EMPTY)
_END = Capture("regex $", EMPTY)
_ANYTHING = Repeat(ANY_CHAR, 0, None)
_LOOKAROUNDS = {"(?=": "lookahead", "(?!": "negative lookahead", "(?<=": "lookbehind",
                "(?<!": "negative lookbehind"}

Forms = dict[tuple[bool, bool], Node]  # (anchored at start, anchored at end) -> the rest


@dataclass(frozen=True)
class _Look(Node):
    """A lookaround at the top level of a branch (until `_Parser.looked` resolves it)."""

    prefix: str  # one of `_LOOKAROUNDS`
    body: Node
    position: int

    @property
    def ahead(self) -> bool:
        return self.prefix in ("(?=", "(?!")

    @property
    def negative(self) -> bool:
        return self.prefix.endswith("!")


def _forms(node: Node) -> Forms:
    """`node`'s language split by which anchors a match needs: `^` inside is satisfied only
    where everything before it in the match is empty and the match starts the text (`$`
    likewise at the end). Subtrees without anchors come back as they are."""
    if node == _START:
        return {(True, False): EMPTY}
    if node == _END:
        return {(False, True): EMPTY}
    if isinstance(node, Seq):
        parts = [_forms(item) for item in node.items]
        if all(_plain(f, item) for f, item in zip(parts, node.items, strict=True)):
            return {(False, False): node}
        acc: Forms = {(False, False): EMPTY}
        for part in parts:
            acc = _concat(acc, part)
        return acc
    if isinstance(node, Choice):
        alts = [_forms(alt) for alt in node.alts]
        if all(_plain(f, alt) for f, alt in zip(alts, node.alts, strict=True)):
            return {(False, False): node}
        merged: Forms = {}
        for forms in alts:
            for key, sub in forms.items():
                merged[key] = choice(merged[key], sub) if key in merged else sub
        return merged
    if isinstance(node, Repeat):
        inner = _forms(node.item)
        if _plain(inner, node.item):
            return {(False, False): node}
        # The parser allows anchors only in items repeated at most once (`(^a)?`).
        forms = dict(inner)
        if node.min == 0:
            forms[(False, False)] = choice(forms[(False, False)], EMPTY) \
                if (False, False) in forms else EMPTY
        return forms
    return {(False, False): node}


def _plain(forms: Forms, node: Node) -> bool:
    return len(forms) == 1 and forms.get((False, False)) is node


def _concat(left: Forms, right: Forms) -> Forms:
    """Forms of a sequence: a start anchor on the right empties the left, and vice versa."""
    out: Forms = {}
    for (left_start, left_end), a in left.items():
        for (right_start, right_end), b in right.items():
            if (right_start and not is_nullable(a, set())) or (left_end and not is_nullable(b, set())):
                continue
            joined = seq(EMPTY if right_start else a, EMPTY if left_end else b)
            key = (left_start or right_start, left_end or right_end)
            out[key] = choice(out[key], joined) if key in out else joined
    return out


def _wrapped(forms: Forms, before: bool, after: bool) -> list[Node]:
    """Each form with `[\\s\\S]*` on the sides it is not anchored on (where asked)."""
    out = []
    for (start, end), node in forms.items():
        lead, trail = before and not start, after and not end
        node = _absorbed(node, lead, trail)
        if node == EMPTY and lead and trail:
            out.append(_ANYTHING)
            continue
        out.append(seq(*((_ANYTHING,) if lead else ()), node, *((_ANYTHING,) if trail else ())))
    return out


def _absorbed(node: Node, lead: bool, trail: bool) -> Node:
    """`node` with a repetition `x{n,m}` at a side next to `[\\s\\S]*` cut to `x{n}`: the
    extra copies are text the wrapper matches anyway, and a DFA need not count them (a
    search for `\\d{1,1000}` is a search for `\\d`)."""
    items = list(node.items) if isinstance(node, Seq) else [node]
    for index, side in ((0, lead), (-1, trail)):
        item = items[index] if items else None
        if side and isinstance(item, Repeat) and item.max != item.min:
            items[index] = _repeat(item.item, item.min, item.min) if item.min else EMPTY
    return seq(*items)


class _Parser:
    """Recursive descent over the pattern; every method leaves `pos` after what it read and
    returns (node, expanded size) so size limits are enforced before anything is built big."""

    def __init__(self, pattern: str, max_size: int):
        self.pattern = pattern
        self.pos = 0
        self.max_size = max_size
        self.anchors = 0  # anchors read so far (to refuse them inside repetitions)

    def error(self, message: str, position: int | None = None) -> RegexError:
        return RegexError(message, self.pattern, self.pos if position is None else position)

    def quote(self, start: int, end: int | None = None) -> str:
        """The pattern text from `start` to `end` (default: `pos`), quoted for a message."""
        return _quoted(self.pattern[start : self.pos if end is None else end])

    def peek(self, ahead: int = 0) -> str:
        return self.pattern[self.pos + ahead : self.pos + ahead + 1]

    def at(self, text: str) -> bool:
        return self.pattern.startswith(text, self.pos)

    def at_start_anchor(self) -> bool:
        return self.peek() == "^" or self.at("\\A")

    def at_end_anchor(self) -> bool:
        return self.peek() == "$" or self.at("\\Z") or self.at("\\z")

    def anchor(self) -> str:
        """The anchor at `pos` (`^`, `$`, or a two-character escape like `\\A`)."""
        return self.pattern[self.pos : self.pos + (1 if self.peek() in "^$" else 2)]

    def check_size(self, size: int, position: int) -> None:
        if size > self.max_size:
            raise self.error(f"regex too large: more than {self.max_size} items once "
                             "repetitions are expanded", position)

    # ----------------------------------------------------------------- structure
    def parse(self) -> list[Node]:
        """The top-level alternatives, anchors and lookarounds still marked in them."""
        if len(self.pattern) > MAX_PATTERN_LENGTH:
            raise self.error(f"pattern too long: {len(self.pattern)} characters "
                             f"(limit {MAX_PATTERN_LENGTH})", MAX_PATTERN_LENGTH)
        flags = self.global_flags()
        branches: list[Node] = []
        size = 0
        while True:
            start = self.pos
            branch, branch_size = self.sequence(flags, 0)
            branches.append(branch)
            size += branch_size
            self.check_size(size, start)
            if self.pos == len(self.pattern):
                return branches
            if self.peek() == ")":
                raise self.error("unbalanced ')'")
            self.pos += 1  # '|'

    def global_flags(self) -> frozenset[str]:
        """Flag groups like `(?i)` at the very start apply to the whole pattern."""
        flags: set[str] = set()
        while (m := _INLINE_FLAGS.match(self.pattern, self.pos)) and m[3] == ")" and m[1] \
                and m[2] is None:
            flags |= self.checked_flags(m[1], self.pos)
            self.pos = m.end()
        return frozenset(flags)

    def checked_flags(self, letters: str, position: int) -> set[str]:
        for letter in letters:
            if letter not in _SUPPORTED_FLAGS:
                raise self.error(f"unsupported inline flag {_quoted(letter)} (only 'i' and 's' are "
                                 "supported)", position)
        return set(letters)

    # ----------------------------------------------------------------- anchors and lookarounds
    def language(self, branches: list[Node], *, search: bool) -> Node:
        """The strings the branches match (somewhere, with `search`): anchors pushed out to
        the ends (alternatives anchored alike share one wrapper), lookarounds resolved."""
        forms: Forms = {}
        alts: list[Node] = []
        for branch in branches:
            items = branch.items if isinstance(branch, Seq) else (branch,)
            if any(isinstance(item, _Look) for item in items):
                looked = self.looked(list(items), search)
                alts += [] if looked is None else [looked]
                continue
            for key, node in _forms(branch).items():
                forms[key] = choice(forms[key], node) if key in forms else node
        alts = _wrapped(forms, search, search) + alts
        if not alts:
            raise _NoMatch("pattern matches no string (an anchor where the text cannot start "
                           "or end, or a lookaround that never holds)", self.pattern, 0)
        return choice(*alts)

    def looked(self, items: list[Node], search: bool) -> Node | None:
        """A branch with lookarounds as the regular language it is: lookbehinds intersect
        (or subtract) the text before them, lookaheads the text after them, so lookbehinds
        must all come before the first lookahead. None when no text qualifies."""
        segments: list[list[Node]] = [[]]
        looks: list[_Look] = []
        for item in items:
            if isinstance(item, _Look):
                looks.append(item)
                segments.append([])
            else:
                segments[-1].append(item)
        behind = 0
        for look in looks:
            if not look.ahead:
                if behind < len(looks) and looks[behind] is not look:
                    raise self.error(f"{_LOOKAROUNDS[look.prefix]} after a lookahead is not "
                                     "supported", look.position)
                behind += 1
        parts: list[Node] = []
        last = len(segments) - 1
        for i, segment in enumerate(segments):
            forms = _forms(seq(*segment))
            if any(start for start, _ in forms) and i > 0:
                raise self.error("anchor '^' after a lookaround is not supported",
                                 looks[i - 1].position)
            if any(end for _, end in forms) and i < last:
                raise self.error("anchor '$' before a lookaround is not supported",
                                 looks[i].position)
            wrapped = _wrapped(forms, search and i == 0, search and i == last)
            if not wrapped:
                return None
            parts.append(choice(*wrapped))
        left: Node | None = parts[0]
        for i in range(behind):
            left = self.restricted(left, looks[i])
            if left is None:
                return None
            left = seq(left, parts[i + 1])
        right: Node | None = EMPTY
        for i in reversed(range(behind, len(looks))):
            right = self.restricted(seq(parts[i + 1], right), looks[i])
            if right is None:
                return None
        return seq(left, right)

    def restricted(self, node: Node, look: _Look) -> Node | None:
        """`node` (all text before a lookbehind, or all text after a lookahead) with those
        texts kept that the lookaround's body accepts (rejects, when negative); None if none."""
        forms = _forms(look.body)
        misplaced = [start for start, _ in forms] if look.ahead else [end for _, end in forms]
        if any(misplaced):  # `(?=^a)`, `(?<=a$)`
            raise self.error(f"anchor inside a {_LOOKAROUNDS[look.prefix]} that cannot match "
                             "there is not supported", look.position)
        body = choice(*_wrapped(forms, not look.ahead, look.ahead))
        # Imported here: the JSON Schema package imports this module when it loads.
        from pegmask.grammars.json_schema.regular import CharDFA, RegularTooLarge

        try:
            text, condition = CharDFA.from_node(node), CharDFA.from_node(body)
            result = text.difference(condition) if look.negative else text.intersect(condition)
            return result.to_node()
        except RegularTooLarge as exc:
            raise self.error(f"{_LOOKAROUNDS[look.prefix]} {_quoted(look.prefix)}: {exc}",
                             look.position) from exc

    def alternation(self, flags: frozenset[str], depth: int) -> tuple[Node, int]:
        alts: list[Node] = []
        size = 0
        while True:
            start = self.pos
            node, node_size = self.sequence(flags, depth)
            alts.append(node)
            size += node_size
            self.check_size(size, start)
            if self.peek() != "|":
                return choice(*alts), size
            self.pos += 1

    def sequence(self, flags: frozenset[str], depth: int) -> tuple[Node, int]:
        """Items up to `|`, `)` or the end (anchors and lookarounds as markers)."""
        items: list[Node] = []
        size = 0
        while self.pos < len(self.pattern) and self.peek() not in "|)":
            start = self.pos
            if self.at_start_anchor() or self.at_end_anchor():
                anchor = self.anchor()
                self.pos += len(anchor)
                if self.quantifier() is not None:
                    raise self.error(f"nothing to repeat after anchor {_quoted(anchor)}")
                self.anchors += 1
                items.append(_START if anchor in ("^", "\\A") else _END)
                continue
            anchors = self.anchors
            atom, atom_size = self.atom(flags, depth)
            if isinstance(atom, _Look):
                if self.quantifier() is not None:
                    raise self.error(f"a {_LOOKAROUNDS[atom.prefix]} cannot be repeated")
            else:
                atom, atom_size = self.quantified(atom, atom_size, start, self.anchors > anchors)
            size += atom_size
            self.check_size(size, start)
            if items and isinstance(atom, Literal) and isinstance(items[-1], Literal):
                items[-1] = Literal(items[-1].data + atom.data)
            else:
                items.append(atom)
        return seq(*items), size

    def atom(self, flags: frozenset[str], depth: int) -> tuple[Node, int]:
        start = self.pos
        c = self.peek()
        if c == "(":
            return self.group(flags, depth)
        if c == "[":
            return self.char_class(flags), 1
        if c == ".":
            self.pos += 1
            return (ANY_CHAR if "s" in flags else _DOT), 1
        if c in "*+?" or (c == "{" and self.quantifier() is not None):
            raise self.error(f"nothing to repeat before {_quoted(c)}", start)
        if c == "\\":
            item = self.escape(in_class=False)
            if isinstance(item, CharClass):
                return item, 1
            return self.char(item, flags, start), 1
        self.pos += 1
        return self.char(ord(c), flags, start), 1

    def char(self, code: int, flags: frozenset[str], position: int) -> Node:
        if 0xD800 <= code <= 0xDFFF:
            raise self.error(f"lone surrogate U+{code:04X} cannot be encoded as UTF-8", position)
        if "i" in flags:
            variants = _fold([(code, code)])
            if len(variants) > 1:
                return CharClass(tuple(variants))
        return Literal(chr(code).encode("utf-8"))

    # ----------------------------------------------------------------- quantifiers
    def quantifier(self) -> tuple[int, int | None, int] | None:
        """(min, max, end position) of a quantifier at `pos`, without consuming it."""
        c = self.peek()
        if c in ("*", "+", "?"):
            return (0 if c != "+" else 1), (1 if c == "?" else None), self.pos + 1
        m = _BRACES.match(self.pattern, self.pos) if c == "{" else None
        if m is None or not (m[1] or m[2]):
            return None
        low = count_literal(m[1]) if m[1] else 0
        high = count_literal(m[3]) if m[3] else (None if m[2] else low)
        return low, high, m.end()

    def quantified(self, atom: Node, size: int, start: int, anchored: bool) -> tuple[Node, int]:
        found = self.quantifier()
        if found is None:
            return atom, size
        low, high, end = found
        if anchored and (high is None or high > 1):
            raise self.error(f"an anchor inside a repetition {self.quote(start, end)} is not "
                             "supported (only inside an optional group)", start)
        quantifier_pos = self.pos
        self.pos = end
        if self.peek() == "+":
            raise self.error(f"possessive quantifier {self.quote(quantifier_pos, end + 1)} is "
                             "not supported", quantifier_pos)
        if self.peek() == "?":
            self.pos += 1  # lazy: same language
        if self.quantifier() is not None:
            raise self.error("multiple repeat (a quantifier cannot follow a quantifier)")
        if high is not None and low > high:
            raise self.error(f"bad repetition {self.quote(quantifier_pos, end)}: minimum "
                             "greater than maximum", quantifier_pos)
        if high == 0:
            return EMPTY, 0
        if size == 0:  # something that matches only "" (or an anchor): once, or not at all
            return (atom if low else _repeat(atom, 0, 1)) if anchored else EMPTY, 0
        repeated = _repeat(atom, low, high)
        if isinstance(repeated, Repeat) and not is_nullable(repeated.item, set()):
            return repeated, size  # counted in rules, not unrolled
        total = size * (high if high is not None else low + 1)
        if total > self.max_size:
            raise self.error(f"repetition too large: {self.quote(start)} expands to more "
                             f"than {self.max_size} items", start)
        return repeated, total

    # ----------------------------------------------------------------- groups
    def group(self, flags: frozenset[str], depth: int) -> tuple[Node, int]:
        start = self.pos
        if depth >= MAX_GROUP_DEPTH:
            raise self.error(f"groups nested too deeply (limit {MAX_GROUP_DEPTH})")
        if self.at("(?#"):
            end = self.pattern.find(")", start)
            if end < 0:
                raise self.error("unterminated comment '(?#'")
            self.pos = end + 1
            return EMPTY, 0
        look = next((p for p in _LOOKAROUNDS if self.at(p)), None)
        if look is not None:
            if depth:
                raise self.error(f"{_LOOKAROUNDS[look]} {_quoted(look)} is only supported outside "
                                 "groups")
            self.pos += len(look)
        else:
            flags = self.group_head(flags)
        node, size = self.alternation(flags, depth + 1)
        if self.peek() != ")":
            raise self.error("missing ')': unterminated group", start)
        self.pos += 1
        return (node, size) if look is None else (_Look(look, node, start), size)

    def group_head(self, flags: frozenset[str]) -> frozenset[str]:
        """Consume `(` and any `?...` group syntax; return the flags inside the group."""
        start = self.pos
        if not self.at("(?"):
            self.pos += 1
            return flags
        unsupported = (
            ("(?P=", "backreference"), ("(?(", "conditional group"), ("(?>", "atomic group"),
        )  # fmt: skip
        for prefix, what in unsupported:
            if self.at(prefix):
                raise self.error(f"{what} {_quoted(prefix)} is not supported")
        if self.at("(?:"):
            self.pos += 3
            return flags
        if self.at("(?P<") or self.at("(?<"):
            self.pos += 4 if self.at("(?P<") else 3
            name = _GROUP_NAME.match(self.pattern, self.pos)
            if name is None or not self.pattern.startswith(">", name.end()):
                raise self.error("bad group name", start)
            self.pos = name.end() + 1
            return flags
        m = _INLINE_FLAGS.match(self.pattern, start)
        if m is None or not (m[1] or m[2]):
            raise self.error(f"unknown group syntax {self.quote(start, start + 3)}")
        on = self.checked_flags(m[1], start)
        off = self.checked_flags(m[2] or "", start)
        if m[3] == ")":
            raise self.error(f"inline flags {_quoted(m[0])} are only supported at the start of the "
                             f"pattern; use a scoped group {_quoted(m[0][:-1] + ':...)')}")
        self.pos = m.end()
        return (flags | on) - off

    # ----------------------------------------------------------------- classes and escapes
    def char_class(self, flags: frozenset[str]) -> CharClass:
        start = self.pos
        self.pos += 1
        negated = self.peek() == "^"
        if negated:
            self.pos += 1
        if self.peek() == "]":
            raise self.error(f"{self.quote(start, self.pos + 1)} is ambiguous (an empty class in "
                             "ECMAScript, a class containing ']' in Python): escape ']' as '\\]'",
                             start)
        ranges: list[tuple[int, int]] = []
        while True:
            if self.pos >= len(self.pattern):
                raise self.error("unterminated character class", start)
            if self.peek() == "]":
                self.pos += 1
                break
            posix = _POSIX_CLASS.match(self.pattern, self.pos)
            if posix:
                raise self.error(f"POSIX character class {_quoted(posix[0])} is not supported")
            item_pos = self.pos
            low = self.class_atom()
            if self.peek() == "-" and self.peek(1) not in ("]", ""):
                self.pos += 1
                high = self.class_atom()
                if isinstance(low, CharClass) or isinstance(high, CharClass) or low > high:
                    raise self.error(f"bad character range {self.quote(item_pos)}", item_pos)
                ranges.append((low, high))
            elif isinstance(low, CharClass):
                ranges.extend(_complement(low.ranges) if low.negated else low.ranges)
            else:
                ranges.append((low, low))
        if "i" in flags:
            ranges = _fold(ranges)
        node = CharClass(tuple(_merge(ranges)), negated)
        if not char_class_scalar_ranges(node):
            raise self.error(f"character class {self.quote(start)} matches no "
                             "character", start)
        return node

    def class_atom(self) -> int | CharClass:
        if self.peek() == "\\":
            return self.escape(in_class=True)
        self.pos += 1
        return ord(self.pattern[self.pos - 1])

    def escape(self, *, in_class: bool) -> int | CharClass:
        """A backslash escape: a code point, or a class for `\\d`-style escapes."""
        start = self.pos
        if start + 1 >= len(self.pattern):
            raise self.error("pattern ends with a lone backslash")
        c = self.pattern[start + 1]
        self.pos = start + 2
        shown = f"'\\{c}'"
        if c in "dws":
            return CharClass(_CLASS_ESCAPES[c])
        if c in "DWS":
            return CharClass(_CLASS_ESCAPES[c.lower()], negated=True)
        if c in _CHAR_ESCAPES:
            return _CHAR_ESCAPES[c]
        if c == "b" and in_class:
            return 0x08
        if c in "bB":
            raise self.error(f"word boundary {shown} is not supported", start)
        if c in "AZz":
            raise self.error(f"anchor {shown} is not allowed in a character class", start)
        if c == "x":
            return self.hex_digits(2, start)
        if c == "u" and self.peek() == "{":
            end = self.pattern.find("}", self.pos)
            digits = self.pattern[self.pos + 1 : end] if end > 0 else ""
            if not 1 <= len(digits) <= 6 or not set(digits) <= _HEX:
                raise self.error("bad escape '\\u{...}': expected 1 to 6 hex digits", start)
            self.pos = end + 1
            return self.checked_code(int(digits, 16), start)
        if c == "u":
            code = self.hex_digits(4, start)
            if 0xD800 <= code <= 0xDBFF and self.at("\\u"):
                resume = self.pos
                self.pos += 2
                low = self.hex_digits(4, resume)
                if 0xDC00 <= low <= 0xDFFF:
                    return 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)
                self.pos = resume
            return code
        if c == "U":
            return self.checked_code(self.hex_digits(8, start), start)
        if c == "0":
            digits = ""
            while len(digits) < 2 and self.peek() in _OCTAL:
                digits += self.peek()
                self.pos += 1
            return int(digits or "0", 8)
        if c in "123456789":
            raise self.error(f"backreference {shown} is not supported", start)
        if c == "k":
            raise self.error("named backreference '\\k<...>' is not supported", start)
        if c in "pP":
            end = self.pattern.find("}", self.pos) if self.peek() == "{" else -1
            if end < 0:
                raise self.error(f"bad escape {shown}: expected '{{name}}'", start)
            name = self.pattern[self.pos + 1 : end]
            ranges = _unicode_property(name)
            if ranges is None:
                raise self.error(f"Unicode property {self.quote(start, end + 1)} is not supported "
                                 "(only general categories, e.g. 'L', 'Letter', 'gc=Lu', and "
                                 "'Any', 'ASCII', 'Assigned')", start)
            self.pos = end + 1
            return CharClass(ranges, negated=c == "P")
        if c.isascii() and c.isalnum():
            raise self.error(f"unsupported escape {shown}", start)
        return ord(c)

    def hex_digits(self, count: int, start: int) -> int:
        digits = self.pattern[self.pos : self.pos + count]
        if len(digits) != count or not set(digits) <= _HEX:
            raise self.error(f"bad escape {self.quote(start, start + 2)}: expected {count} "
                             "hex digits", start)
        self.pos += count
        return int(digits, 16)

    def checked_code(self, code: int, start: int) -> int:
        if code > MAX_UNICODE:
            raise self.error(f"code point {code:#x} is beyond U+10FFFF", start)
        return code


_CATEGORY_NAMES = {
    "Letter": "L", "Cased_Letter": "LC", "Uppercase_Letter": "Lu", "Lowercase_Letter": "Ll",
    "Titlecase_Letter": "Lt", "Modifier_Letter": "Lm", "Other_Letter": "Lo", "Mark": "M",
    "Combining_Mark": "M", "Nonspacing_Mark": "Mn", "Spacing_Mark": "Mc",
    "Enclosing_Mark": "Me", "Number": "N", "Decimal_Number": "Nd", "digit": "Nd",
    "Letter_Number": "Nl", "Other_Number": "No", "Punctuation": "P", "punct": "P",
    "Connector_Punctuation": "Pc", "Dash_Punctuation": "Pd", "Open_Punctuation": "Ps",
    "Close_Punctuation": "Pe", "Initial_Punctuation": "Pi", "Final_Punctuation": "Pf",
    "Other_Punctuation": "Po", "Symbol": "S", "Math_Symbol": "Sm", "Currency_Symbol": "Sc",
    "Modifier_Symbol": "Sk", "Other_Symbol": "So", "Separator": "Z", "Space_Separator": "Zs",
    "Line_Separator": "Zl", "Paragraph_Separator": "Zp", "Other": "C", "Control": "Cc",
    "cntrl": "Cc", "Format": "Cf", "Surrogate": "Cs", "Private_Use": "Co", "Unassigned": "Cn",
}  # fmt: skip


def _unicode_property(name: str) -> Ranges | None:
    """Code point ranges of an ECMAScript `\\p{...}` property: a general category by short or
    long name (`gc=` / `General_Category=` optional), or Any, ASCII, Assigned; None for
    anything else (scripts: Python's `unicodedata` has no script data)."""
    key, _, value = name.partition("=")
    if value and key in ("gc", "General_Category"):
        name = value
    elif value:
        return None
    if name == "Any":
        return ((0, MAX_UNICODE),)
    if name == "ASCII":
        return ((0, 0x7F),)
    categories = _categories()
    if name == "Assigned":
        return tuple(_complement(categories["Cn"]))
    short = _CATEGORY_NAMES.get(name, name)
    if short == "LC":
        return tuple(_merge(categories["Lu"] + categories["Ll"] + categories["Lt"]))
    if len(short) == 1 and short in "LMNPSZC":
        return tuple(_merge(r for cat, ranges in categories.items() if cat[0] == short
                            for r in ranges))
    return categories.get(short)


@functools.cache
def _categories() -> dict[str, Ranges]:
    """Each general category's code point ranges, from Python's Unicode database."""
    runs: dict[str, list[tuple[int, int]]] = {}
    start, current = 0, unicodedata.category("\0")
    for code in range(1, MAX_UNICODE + 2):
        category = unicodedata.category(chr(code)) if code <= MAX_UNICODE else ""
        if category != current:
            runs.setdefault(current, []).append((start, code - 1))
            start, current = code, category
    return {cat: tuple(ranges) for cat, ranges in runs.items()}


def _repeat(item: Node, low: int, high: int | None) -> Node:
    """`item{low,high}`, with a repeated repeat folded into one where that is exact.

    `(x{a,b}){n,m}` is `x{na,mb}` when the counts `k*[a,b]` for `k` in `[n,m]` leave no gap.
    The flat form matters for speed: in `((a?){100}){100}` the parser would otherwise keep a
    thread for every copy that the next `a` could belong to.
    """
    if isinstance(item, Repeat) and _contiguous(item.min, item.max, low, high):
        inner_high = None if item.max is None or high is None else item.max * high
        return Repeat(item.item, item.min * low, inner_high)
    if (low, high) == (1, 1):
        return item
    return Repeat(item, low, high)


def _contiguous(a: int, b: int | None, n: int, m: int | None) -> bool:
    """Whether the union of `[k*a, k*b]` over `k` in `[n, m]` is one interval.

    A gap opens between `k` and `k+1` copies when `(k+1)*a > k*b + 1`; that is likeliest at
    the smallest `k`, so only `k = n` needs checking.
    """
    if m == n:
        return True
    if b is None:
        return n >= 1 or a <= 1
    return (n + 1) * a <= n * b + 1


def _merge(ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for low, high in sorted(ranges):
        if merged and low <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], high))
        else:
            merged.append((low, high))
    return merged


def _complement(ranges: Ranges) -> list[tuple[int, int]]:
    """Ranges of every code point outside `ranges` (to put `\\D`-style escapes in a class)."""
    result: list[tuple[int, int]] = []
    nxt = 0
    for low, high in _merge(ranges):
        if low > nxt:
            result.append((nxt, low - 1))
        nxt = high + 1
    if nxt <= MAX_UNICODE:
        result.append((nxt, MAX_UNICODE))
    return result


def _fold(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """`ranges` closed under case variants (see the module docstring for the rule)."""
    cased, variants = _case_table()
    result = _merge(ranges)
    extra: list[tuple[int, int]] = []
    for low, high in result:
        for index in range(bisect.bisect_left(cased, low), bisect.bisect_right(cased, high)):
            extra.extend((v, v) for v in variants[index])
    return _merge(result + extra)


@functools.cache
def _case_table() -> tuple[list[int], list[tuple[int, ...]]]:
    """Sorted code points that have case variants, and those variants.

    Characters are linked to their single-character `lower()` / `upper()` forms (one side ASCII
    and the other not is never linked), and variants are whole connected groups, so Greek
    sigma's three forms all match each other. Every cased character lies below U+20000.
    """
    groups: dict[int, set[int]] = {}
    for code in range(0x20000):
        char = chr(code)
        for other in (char.lower(), char.upper()):
            if len(other) != 1 or other == char or (code < 0x80) != (ord(other) < 0x80):
                continue
            group = groups.get(code, {code}) | groups.get(ord(other), {ord(other)})
            for member in group:
                groups[member] = group
    cased = sorted(groups)
    return cased, [tuple(sorted(groups[code] - {code})) for code in cased]
