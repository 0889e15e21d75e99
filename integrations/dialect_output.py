"""A dialect's output seen the way serving frameworks split it: a reasoning parser takes the
leading reasoning, a tool-call parser the rest. Both run pegmask's dialect grammar and its
parser (`Dialect.parse_grammar`, `DialectStreamParser`): no second reading of the formats.

`ReasoningSplit` follows an output as text pieces and finds where its leading reasoning ends:
the first capture that is not reasoning (content, a call) opens. The rest, handed to the
tool-call parser, starts at the latest point before that capture from which the rest still
parses as a turn of the dialect without reasoning (`rest_dialect`: after Hermes'
`</think>\\n\\n`, at Harmony's `<|channel|>` of the next message), so that the tool-call
parser reads it as a whole output.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from pegmask.dialects import ChatRequest, Dialect
from pegmask.grammars import Grammar, ParseError
from pegmask.integrations.constraints import dialect_named

#: captures that end the leading reasoning when they open
_ANSWER_TAGS = frozenset({"content", "call", "calls"})


def rest_dialect(dialect: Dialect) -> Dialect:
    """The dialect that reads what follows the leading reasoning: the same, reasoning off (a
    request then must not turn it back on: parse with one that has no chat_template_kwargs)."""
    return dialect_named(dialect.name, False)


def inside_reasoning(dialect: Dialect, text: str, request: ChatRequest | None = None
                     ) -> bool | None:
    """Whether the model continues `text` (a rendered prompt, maybe with output after it)
    inside reasoning. The last of the dialect's reasoning markers decides, as vLLM's own
    reasoning parsers read ids (an opening one: inside; a closing one: out); where `text` holds
    neither, the mode `request` gets with `text` as its generation prompt
    (`Dialect.reasoning_mode`). None where that leaves it to the output (a detected mode)."""
    if not dialect.reasons:
        return False
    last = last_reasoning_marker(dialect, text)
    if last is not None:
        return last
    return dialect.reasoning_mode(
        dataclasses.replace(request or ChatRequest(), generation_prompt=text))


def last_reasoning_marker(dialect: Dialect, text: str) -> bool | None:
    """Whether the last of the dialect's textual reasoning markers in `text` opens reasoning
    (True) or closes it (False); None where `text` holds neither or the dialect spells none."""
    delimiters = _reasoning_markers(dialect)
    if delimiters is None:
        return None
    opening, closing = delimiters
    opened = text.rfind(opening)
    closed = text.rfind(closing) if closing != opening else -1
    if opened < 0 and closed < 0:
        return None
    return opened > closed


def _reasoning_markers(dialect: Dialect) -> tuple[str, str] | None:
    """The text that opens and closes reasoning, for a dialect that reasons and spells it."""
    return dialect.reasoning_delimiters() if dialect.reasons else None


class ReasoningMarkerTail:
    """`last_reasoning_marker` of growing token ids (a rendered prompt, then prompt + output
    after each decode step), reading only the ids added since the last call.

    Why: vLLM's structured-output gate asks whether reasoning ended with all ids so far at
    every step until it has; decoding them all each time made a long reasoning cost quadratic
    time. Where the ids extend those of the last call, only their new ids and the few before
    them that a marker could start in are decoded: a marker there decides, else the answer
    stands. Other ids (a shorter prefix, another sequence) are read whole.
    """

    def __init__(self, dialect: Dialect, decode: Callable[[list[int]], str]):
        self._dialect, self._decode = dialect, decode
        delimiters = _reasoning_markers(dialect)
        # ids a marker can span: each spells at least one byte, a character at most four
        self._overlap = 4 * max(map(len, delimiters)) if delimiters else 0
        self._ids: list[int] | None = None  # the last call's ids
        self._last: bool | None = None  # and its answer

    def last(self, ids: Sequence[int]) -> bool | None:
        if not self._overlap:
            return None
        ids = list(ids)
        known = self._ids
        if known is not None and len(ids) >= len(known) and ids[:len(known)] == known:
            window = self._decode(ids[max(0, len(known) - self._overlap):])
            found = last_reasoning_marker(self._dialect, window)
            if found is not None:
                self._last = found
        else:
            self._last = last_reasoning_marker(self._dialect, self._decode(ids))
        self._ids = ids
        return self._last


class _Start:
    """A possible start of the rest: a parser of the rest grammar fed from there, and whether
    it has opened the answer capture where the output's parser did (`confirmed`) or failed."""

    def __init__(self, grammar: Grammar, start: int, tag: str, offset: int):
        self.start = start
        self._parser = grammar.stream_parser()
        self._tag, self._offset = tag, offset  # the answer's capture and where it opens
        self._covered = 0
        self.confirmed = False
        self.failed = False

    def feed(self, text: str) -> None:
        if self.confirmed or self.failed:
            return
        try:
            self._see(self._parser.feed(text))
        except ParseError:
            self.failed = True

    def finish(self) -> None:
        if not (self.confirmed or self.failed):
            try:
                self._see(self._parser.finish())
            except ParseError:
                self.failed = True
        self.failed = self.failed or not self.confirmed

    def _see(self, events: list[Any]) -> None:
        for event in events:
            if event.kind == "text":
                self._covered += len(event.text)
            elif event.kind == "open" and event.tag == self._tag:
                if self._covered == self._offset:
                    self.confirmed = True
                    return
            if self._covered > self._offset:
                self.failed = True
                return


class ReasoningSplit:
    """The leading reasoning of one output, fed as text (special tokens spelled).

    `feed(text)` returns the reasoning text it makes certain; `ended` turns True once the
    reasoning is over, and `rest` is then the output from the split on (it grows with later
    feeds). An output that does not parse ends the reasoning where it stops parsing.
    """

    def __init__(self, dialect: Dialect, request: ChatRequest | None = None):
        self.grammar: Grammar = dialect.parse_grammar(request)
        self.rest_grammar: Grammar = rest_dialect(dialect).parse_grammar()
        self._parser = self.grammar.stream_parser()
        self._text: list[str] = []  # the output, one character per item
        self._covered = 0  # characters the parser's text events accounted for
        self._reasoning_end = 0  # where the last reasoning capture closed
        self._reasoned = False  # some reasoning capture closed
        self._reasoning = False  # inside a reasoning capture
        self._separator = ""  # written before the next reasoning text ("\n" between messages)
        self._split: int | None = None
        # Once an answer opened: where the rest may start, latest first, each followed by a
        # parser of the rest until it confirms the answer opens at the same place or fails.
        self._starts: list[_Start] = []
        self._finished = False

    @property
    def ended(self) -> bool:
        return self._split is not None

    @property
    def rest(self) -> str:
        """The output after the reasoning (empty while it has not ended)."""
        return "" if self._split is None else "".join(self._text[self._split:])

    def feed(self, text: str) -> str:
        """Read more output; the reasoning text it completes (nothing once ended)."""
        reasoning: list[str] = []
        for ch in text:
            self._text.append(ch)
            if self._split is not None:
                continue
            if self._starts:
                for start in self._starts:
                    start.feed(ch)
                self._decide()
                continue
            try:
                events = self._parser.feed(ch)
            except ParseError:
                self._split = self._reasoning_end if self._reasoned else 0
                continue
            self._events(events, reasoning)
        return "".join(reasoning)

    def finish(self) -> str:
        """End of output: the reasoning text still held back."""
        if self._finished or self._split is not None:
            self._finished = True
            return ""
        self._finished = True
        reasoning: list[str] = []
        parsed = False
        if not self._starts:
            try:
                self._events(self._parser.finish(), reasoning)
                parsed = True
            except ParseError:
                pass
        if self._starts:
            for start in self._starts:
                start.finish()
            self._decide(final=True)
        elif not self._reasoning:  # not cut off inside the reasoning: framing is left
            # (all of it framing when no reasoning closed, an empty `</think>` say)
            low = self._reasoning_end if self._reasoned else 0
            self._split = self._complete_from(low) if self._reasoned or parsed else 0
        return "".join(reasoning)

    def _events(self, events: list[Any], reasoning: list[str]) -> None:
        for event in events:
            if self._starts:
                return
            if event.kind == "text":
                if event.tag == "reasoning":
                    reasoning.append(self._separator + event.text)
                    self._separator = ""
                self._covered += len(event.text)
            elif event.tag == "reasoning":
                self._reasoning = event.kind == "open"
                if event.kind == "open":
                    self._separator = "\n" if self._reasoned else ""
                else:
                    self._reasoned, self._reasoning_end = True, self._covered
            elif event.kind == "open" and event.tag in _ANSWER_TAGS:
                self._open_answer(event.tag)

    def _open_answer(self, tag: str) -> None:
        """An answer opened at `_covered`: try each start from there back to the reasoning's
        end on what was read so far."""
        high, seen = self._covered, "".join(self._text)
        for position in range(high, self._reasoning_end - 1, -1):
            start = _Start(self.rest_grammar, position, tag, high - position)
            start.feed(seen[position:])
            self._starts.append(start)
        self._decide()

    def _decide(self, final: bool = False) -> None:
        """Split at the latest start that confirmed, once every later one failed (`low` when
        none confirms: what does not parse becomes content)."""
        for start in self._starts:
            if start.confirmed:
                self._split = start.start
                return
            if not start.failed:
                return  # undecided: wait for more output
        if final or all(start.failed for start in self._starts):
            self._split = self._starts[-1].start

    def _complete_from(self, low: int) -> int:
        """The latest position from `low` on from which the rest of the output (framing only)
        parses as a whole turn without reasoning."""
        for position in range(len(self._text), low - 1, -1):
            parser = self.rest_grammar.stream_parser()
            try:
                parser.feed("".join(self._text[position:]))
                parser.finish()
            except ParseError:
                continue
            return position
        return low
