"""Prompt-lookup drafts: guesses of a row's next tokens taken from its own prompt and output,
checked by the model in the step that would have produced only one of them.

Why: a tool call repeats what came before it. Parallel calls copy the first call's arguments,
a date or a place name comes back from the question, a model in a loop spins the same few
tokens. Where the last tokens of a sequence occurred before, the tokens that followed them
then are a draft of what follows now; the forward takes them beside the row's own tokens (a
few more rows of the same products, as forced tokens are) and gives the logits after each.
The scheduler then samples position by position, exactly as it would have step by step, and
keeps the draft's tokens as long as the samples agree with them: the output's distribution
(and a seeded row's draws) do not change, only the number of steps.

Measured on the serve bench's tool calls (SmolLM2, temperature 0.7, 320 requests logged from a
server): where the longest earlier occurrence of the sequence's tail is 12 tokens or more, the
next token matched its draft 94% of the time and the 8th 66%; at 4-5 tokens 71% and 42% for the
first and third; at 3 or fewer under 45% for the first. Plain text repeats itself less (the
first token 68% at 4, 94% at 12 or more, but 12 or more is rare). So the draft's length follows
the match's length (`draft_length`). A drafted token costs a row of the forward whether it is
kept or not: cheap while a step is bound by reading the weights (few rows), not at 32 rows,
where it costs what a row's share of the step saves. The scheduler therefore drafts only while
a step holds fewer than `Limits.draft_budget` tokens, longest matches first.
"""

from __future__ import annotations

from collections.abc import Sequence

NGRAM = 3  # tokens of the tail looked up
MAX_MATCH = 12  # a match counted this long needs no longer count (`draft_length`)
_OCCURRENCES = 4  # earlier places kept per n-gram (the latest ones)


def draft_length(match: int, rows: int) -> int:
    """Tokens worth drafting after a match of `match` tokens in a step of `rows` rows (see the
    module docstring): beside a few rows, every match of 4 or more; beside more, only the
    matches of 12 or more, whose drafts are mostly kept."""
    if match >= 12:
        return 8
    if rows > 2:
        return 0
    if match >= 6:
        return 4
    if match >= 4:
        return 2
    return 0


class PromptLookup:
    """The drafts of one row: an index of every `NGRAM` tokens of its prompt and output to
    where they occurred, kept up to date as the output grows."""

    def __init__(self, prompt: Sequence[int]):
        self.tokens = list(prompt)
        self._prompt = len(self.tokens)
        self._places: dict[tuple[int, ...], list[int]] = {}
        self._indexed = 0  # n-grams starting before this are indexed

    def follow(self, generated: Sequence[int]) -> None:
        """Take the row's output so far (what is new since the last call is appended)."""
        self.tokens.extend(generated[len(self.tokens) - self._prompt:])

    def propose(self, rows: int) -> tuple[list[int], int]:
        """(the draft, the match's length): the tokens that followed the latest earlier
        occurrence of the sequence's tail, of the longest match (up to `MAX_MATCH`), as many as
        `draft_length` gives for a step of `rows` rows; ([], 0) where the tail did not occur
        before."""
        tokens, end = self.tokens, len(self.tokens)
        # only n-grams with a token after them are indexed (the tail itself is not)
        for start in range(self._indexed, end - NGRAM):
            places = self._places.setdefault(tuple(tokens[start:start + NGRAM]), [])
            places.append(start)
            if len(places) > _OCCURRENCES:
                del places[0]
        self._indexed = max(self._indexed, end - NGRAM)
        if end <= NGRAM:
            return [], 0
        best, match = -1, 0
        for start in reversed(self._places.get(tuple(tokens[end - NGRAM:]), ())):
            length = NGRAM
            while (length < MAX_MATCH and start - (length - NGRAM) > 0
                   and tokens[start - (length - NGRAM) - 1] == tokens[end - length - 1]):
                length += 1
            if length > match:
                best, match = start, length
        if best < 0:
            return [], 0
        follows = best + NGRAM
        return tokens[follows:follows + draft_length(match, rows)], match
