"""Special tokens recognized by their spelling in a byte stream.

Special tokens are atomic: text never spells one. When the input is text, or when a model's
vocabulary lacks a grammar's special token (SmolLM2 has no `<tool_call>`, so it writes the
spelling with ordinary tokens), the spelling *is* the special token wherever it appears, and
never text. `SpellingLexer` is that one rule, shared by the streaming parser and the token
automaton so that both read the same symbols from the same bytes.

Lexing goes left to right: at each position the first spelling (in the order given) that starts
there becomes its special symbol; bytes that may still be the start of a spelling are held back
until the next bytes decide; at the end of the input (or before a special token that arrives as
a token id) held-back bytes are plain bytes.
"""

from __future__ import annotations

from collections.abc import Container, Mapping
from typing import TYPE_CHECKING

from pegmask.grammars.program import SPECIAL_BASE, Program

if TYPE_CHECKING:
    from pegmask.grammars.vocab import Vocabulary

# One lexed unit: (symbol, bytes it spans): a byte 0-255 or a special symbol (256+).
Lexeme = tuple[int, bytes]


class SpellingLexer:
    """Splits bytes into plain bytes and special symbols, given each special's spelling."""

    def __init__(self, spellings: Mapping[bytes, int]):
        self.spellings = {spelling: symbol for spelling, symbol in spellings.items() if spelling}
        self._prefixes = frozenset(
            spelling[:n] for spelling in self.spellings for n in range(1, len(spelling))
        )
        #: bytes that can start a spelling: any other byte, with nothing held back, is plain
        self.first_bytes = frozenset(spelling[0] for spelling in self.spellings)
        self._firsts = tuple(bytes((b,)) for b in sorted(self.first_bytes))
        self._longest = max(map(len, self.spellings), default=0)

    def __bool__(self) -> bool:
        return bool(self.spellings)

    def split(self, data: bytes) -> tuple[tuple[Lexeme, ...], bytes]:
        """The lexemes that `data` certainly starts with, and the bytes held back after them
        (a proper prefix of some spelling, decided by what comes next)."""
        out: list[Lexeme] = []
        i, n = 0, len(data)
        while i < n:
            # Bytes before the next possible spelling start are plain.
            j = min([k for k in (data.find(first, i) for first in self._firsts) if k >= 0],
                    default=n)
            out.extend((b, bytes((b,))) for b in data[i:j])
            if j == n:
                break
            i = j
            for spelling, symbol in self.spellings.items():
                if data.startswith(spelling, i):
                    out.append((symbol, spelling))
                    i += len(spelling)
                    break
            else:
                if n - i < self._longest and data[i:] in self._prefixes:
                    return tuple(out), data[i:]
                out.append((data[i], data[i : i + 1]))
                i += 1
        return tuple(out), b""

    @staticmethod
    def flush(held: bytes) -> tuple[Lexeme, ...]:
        """Held-back bytes as plain bytes (the input ended, or a special token id came)."""
        return tuple((b, bytes((b,))) for b in held)


def specials_lexer(program: Program, known: Container[str] = ()) -> SpellingLexer:
    """The lexer for the grammar's special tokens, except those in `known`."""
    return SpellingLexer({
        name.encode("utf-8"): SPECIAL_BASE + i
        for i, name in enumerate(program.specials) if name not in known
    })


def spelled_specials(program: Program, vocab: Vocabulary) -> SpellingLexer:
    """The lexer for the grammar's special tokens that `vocab` has no id for: a model with that
    vocabulary can only write them as text, and they stay atomic all the same."""
    return specials_lexer(program, vocab.special_ids)
