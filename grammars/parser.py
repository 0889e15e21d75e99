"""The streaming parser: runs a grammar's program over input and reports captures.

Input is text (special tokens recognized by their spelling), bytes, or token ids with a
vocabulary (special tokens recognized by id, so text can never fake one). Events are emitted
as soon as every surviving derivation agrees on them, so the concatenated event stream and the
final result do not depend on how the input was chunked.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pegmask.grammars.errors import ParseError
from pegmask.grammars.program import CLOSE, OPEN, SPECIAL_BASE, Program
from pegmask.grammars.runtime import Log, Runtime, Thread
from pegmask.grammars.spelling import Lexeme, SpellingLexer, specials_lexer, spelled_specials

if TYPE_CHECKING:
    from pegmask.grammars.vocab import Vocabulary


@dataclass
class CaptureNode:
    """One capture in the result tree: its tag, text, byte span and nested captures."""

    tag: str
    text: str
    start: int
    end: int
    children: list[CaptureNode] = field(default_factory=list)

    def find_all(self, tag: str) -> list[CaptureNode]:
        """All captures named `tag` below this one, in document order."""
        found: list[CaptureNode] = []
        for child in self.children:
            if child.tag == tag:
                found.append(child)
            found.extend(child.find_all(tag))
        return found

    def first(self, tag: str) -> CaptureNode | None:
        matches = self.find_all(tag)
        return matches[0] if matches else None


@dataclass
class ParseResult:
    """A complete parse: the whole input text and the capture tree (root tag is '')."""

    text: str
    root: CaptureNode

    @property
    def captures(self) -> list[CaptureNode]:
        return self.root.children

    def find_all(self, tag: str) -> list[CaptureNode]:
        return self.root.find_all(tag)

    def first(self, tag: str) -> CaptureNode | None:
        return self.root.first(tag)


@dataclass(frozen=True)
class Event:
    """A certain piece of the parse: `open`/`close` of capture `tag`, or `text` inside the
    innermost open capture `tag` (`path` lists all open captures, outermost first)."""

    kind: str
    tag: str
    text: str = ""
    path: tuple[str, ...] = ()


INCOMPLETE, COMPLETE, INVALID = "prefix", "complete", "invalid"


class StreamParser:
    """Incremental parser for one grammar program (create one per output)."""

    def __init__(self, program: Program, runtime: Runtime | None = None):
        self.program = program
        self.runtime = runtime or Runtime(program)
        self._text_lexer = specials_lexer(program)  # text spells every special token
        self._token_lexer: tuple[Vocabulary, SpellingLexer] | None = None
        self.reset()

    def reset(self) -> None:
        self._threads, self._matched = self.runtime.initial(track=True)
        self._buffer = bytearray()
        self._pending = b""  # text bytes held back: they may start a special token's spelling
        self._committed: Log = None
        self._open: list[tuple[str, int]] = []  # certain open captures (tag, start)
        self._text_pos = 0  # buffer offset up to which text events were emitted
        self._error: ParseError | None = None
        self._finished = False

    # ----------------------------------------------------------------- status
    @property
    def position(self) -> int:
        """Bytes consumed so far (special tokens count as their spelling)."""
        return len(self._buffer)

    @property
    def status(self) -> str:
        """'complete' (the input so far is a whole sentence), 'prefix' (a valid prefix that
        needs more), or 'invalid'."""
        if self._error is not None:
            return INVALID
        return COMPLETE if self._ends_here() else INCOMPLETE

    def _ends_here(self) -> bool:
        """Whether the input may end now: held-back bytes are then read as text (`finish`)."""
        if not self._pending:
            return bool(self._matched)
        threads, matched = self._threads, self._matched
        for symbol, _ in SpellingLexer.flush(self._pending):
            threads, matched = self.runtime.step(threads, symbol, 0, False)
            if not threads:
                break
        return bool(matched)

    @property
    def error(self) -> ParseError | None:
        return self._error

    @property
    def can_continue(self) -> bool:
        """Whether more input may follow. While bytes are held back (they may start a special
        token's spelling) this may be True although no continuation is valid: the error then
        comes with the next input or at `finish`."""
        return self._error is None and bool(self._threads)

    # ----------------------------------------------------------------- input
    def feed(self, text: str) -> list[Event]:
        """Feed text; special tokens of the grammar are recognized by their spelling."""
        return self.feed_bytes(text.encode("utf-8"))

    def feed_bytes(self, data: bytes) -> list[Event]:
        return self._consume(self._lex(self._text_lexer, data))

    def feed_symbols(self, symbols: Iterable[int]) -> list[Event]:
        """Feed program symbols directly (bytes 0-255, 256+ special tokens)."""
        pairs = []
        for symbol in symbols:
            if symbol < SPECIAL_BASE:
                pairs.append((symbol, bytes((symbol,))))
            else:
                pairs.append((symbol, self.program.specials[symbol - SPECIAL_BASE].encode()))
        return self._consume(pairs)

    def feed_tokens(self, token_ids: Iterable[int], vocab: Vocabulary) -> list[Event]:
        """Feed token ids: special tokens by id, ordinary tokens by their exact bytes. A special
        token of the grammar that `vocab` lacks is read from its spelling in those bytes (see
        `pegmask.grammars.spelling`), as the token automaton reads it."""
        if self._token_lexer is None or self._token_lexer[0] is not vocab:
            self._token_lexer = (vocab, spelled_specials(self.program, vocab))
        lexer = self._token_lexer[1]
        pairs: list[Lexeme] = []
        for token_id in token_ids:
            data = vocab.token_bytes[token_id]
            if data is None:
                pairs.extend(self._flush())
                name = vocab.special_names.get(token_id, f"<special {token_id}>")
                symbol = self.program.special_symbol(name)
                pairs.append((-1 if symbol is None else symbol, name.encode()))
            else:
                pairs.extend(self._lex(lexer, data))
        return self._consume(pairs)

    def finish(self) -> list[Event]:
        """End of input: flush held-back text and emit the remaining events of the chosen
        (highest-priority) complete derivation. Raises ParseError if the input is incomplete."""
        events = self._consume(self._flush()) if self._pending else []
        self._raise_if_failed()
        if not self._matched:
            self._error = ParseError("unexpected end of input", len(self._buffer))
            raise self._error
        self._finished = True
        events.extend(self._emit_until(self._matched[0], len(self._buffer)))
        return events

    def result(self) -> ParseResult:
        """The final parse (call after `finish`)."""
        if not self._finished:
            raise ParseError("result() needs finish() first", len(self._buffer))
        return build_result(bytes(self._buffer), self._matched[0], self.program.tags)

    # ----------------------------------------------------------------- internals
    def _lex(self, lexer: SpellingLexer, data: bytes) -> tuple[Lexeme, ...]:
        """Lexemes of the held-back bytes plus `data`; what may start a spelling is held back."""
        lexemes, self._pending = lexer.split(self._pending + data)
        return lexemes

    def _flush(self) -> tuple[Lexeme, ...]:
        held, self._pending = self._pending, b""
        return SpellingLexer.flush(held)

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error

    def _consume(self, symbols: Iterable[Lexeme]) -> list[Event]:
        self._raise_if_failed()
        if self._finished:
            raise ParseError("input after finish()", len(self._buffer))
        threads, matched = self._threads, self._matched
        step = self.runtime.step
        buffer = self._buffer
        for symbol, spelling in symbols:
            if not threads or symbol < 0:
                self._error = ParseError("unexpected input", len(buffer))
                self._threads, self._matched = [], []
                raise self._error
            position = len(buffer) + len(spelling)
            threads, matched = step(threads, symbol, position, True)
            if not threads and not matched:
                self._error = ParseError(
                    f"unexpected {spelling.decode('utf-8', 'replace')!r}", len(buffer)
                )
                self._threads, self._matched = [], []
                raise self._error
            buffer += spelling
        self._threads, self._matched = threads, matched
        return self._emit_certain()

    def _emit_certain(self) -> list[Event]:
        logs: list[Log] = [log for _, _, log in self._threads]
        logs.extend(self._matched)
        common = _common_ancestor(logs)
        # Text is certain up to the first event any derivation has beyond the common part.
        limit = len(self._buffer)
        for log in logs:
            first_after = _first_after(log, common)
            if first_after is not None:
                limit = min(limit, first_after[2])
        return self._emit_until(common, limit)

    def _emit_until(self, target: Log, text_limit: int) -> list[Event]:
        """Emit the events from the committed log node down to `target`, then text up to
        `text_limit` for the captures still open."""
        new_events: list[tuple] = []
        node = target
        while node is not self._committed and node is not None:
            new_events.append(node)
            node = node[3]
        events: list[Event] = []
        tags = self.program.tags
        for kind, tag_index, pos, _, _ in reversed(new_events):
            events.extend(self._text_events(pos))
            tag = tags[tag_index]
            if kind == OPEN:
                self._open.append((tag, pos))
                events.append(Event("open", tag, path=self._path()))
            elif kind == CLOSE:
                events.append(Event("close", tag, path=self._path()))
                self._open.pop()
        self._committed = target
        events.extend(self._text_events(text_limit))
        return events

    def _path(self) -> tuple[str, ...]:
        return tuple(tag for tag, _ in self._open)

    def _text_events(self, limit: int) -> list[Event]:
        if limit <= self._text_pos:
            return []
        if not self._open:
            self._text_pos = limit
            return []
        end = _utf8_boundary(self._buffer, self._text_pos, limit)
        if end <= self._text_pos:
            return []
        text = bytes(self._buffer[self._text_pos : end]).decode("utf-8", "replace")
        self._text_pos = end
        return [Event("text", self._open[-1][0], text, self._path())]


def _utf8_boundary(buffer: bytearray, start: int, end: int) -> int:
    """Largest offset <= end that does not cut a UTF-8 sequence (never below start)."""
    i = end - 1
    while i >= start and end - i <= 4 and 0x80 <= buffer[i] < 0xC0:
        i -= 1
    if i >= start and buffer[i] >= 0xC0:
        need = 2 if buffer[i] < 0xE0 else 3 if buffer[i] < 0xF0 else 4
        if end - i < need:
            return i
    return end


def _common_ancestor(logs: list[Log]) -> Log:
    """Deepest log node shared by all `logs` (logs are persistent lists)."""
    if not logs:
        return None
    current = list(logs)
    min_depth = min(log[4] if log is not None else 0 for log in current)
    for i, log in enumerate(current):
        while log is not None and log[4] > min_depth:
            log = log[3]
        current[i] = log
    while True:
        first = current[0]
        if all(log is first for log in current):
            return first
        current = [log[3] if log is not None else None for log in current]


def _first_after(log: Log, ancestor: Log) -> tuple | None:
    """The oldest node of `log` below `ancestor` (its first event after the common part)."""
    first = None
    while log is not None and log is not ancestor:
        first = log
        log = log[3]
    return first


def build_result(buffer: bytes, log: Log, tags: tuple[str, ...]) -> ParseResult:
    """Turn a complete derivation's log into the capture tree."""
    events = []
    while log is not None:
        events.append(log)
        log = log[3]
    events.reverse()
    root = CaptureNode("", buffer.decode("utf-8", "replace"), 0, len(buffer))
    stack = [root]
    for kind, tag_index, pos, _, _ in events:
        if kind == OPEN:
            node = CaptureNode(tags[tag_index], "", pos, pos)
            stack[-1].children.append(node)
            stack.append(node)
        else:
            node = stack.pop()
            node.end = pos
            node.text = buffer[node.start : pos].decode("utf-8", "replace")
    return ParseResult(root.text, root)


def parse_program(program: Program, data: bytes | str, runtime: Runtime | None = None) -> ParseResult:
    parser = StreamParser(program, runtime)
    if isinstance(data, str):
        parser.feed(data)
    else:
        parser.feed_bytes(data)
    parser.finish()
    return parser.result()


__all__ = ["CaptureNode", "Event", "ParseResult", "StreamParser", "Thread", "parse_program"]
