"""The decode loop: forward -> logits -> token bitmask -> sample -> matcher -> output deltas.

Several requests decode as one batch: one forward over the batch's KV cache, one bitmask tensor
filled row by row by the grammar matchers and one `apply_token_bitmask_inplace` call per step.
Rows leave the batch (and the cache) as soon as they finish.

Jump-forward: when the grammar allows only one continuation, its bytes are tokenized and the
tokens are appended without sampling, fed to the model in the next forward together with the
sampled token. The last forced token is left to the sampler (under a mask that forces it or a
longer token that goes on past the forced bytes), so tokenization at the boundary stays the
model's own.

Output goes through a stop-string filter (tokens that might begin a stop string are held back
until that is settled) into an `Output`: plain text for completions, the dialect's streaming
parser for chats. Nothing here raises once decoding has started: a grammar that cannot be
finished ends the row with finish_reason "length".
"""

from __future__ import annotations

import codecs
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch

from pegmask.kernels import allocate_token_bitmask, apply_token_bitmask_inplace, sample_masked

if TYPE_CHECKING:
    from pegmask.dialects import DialectStreamParser
    from pegmask.engine.model import ModelBackend
    from pegmask.engine.requests import SamplingParams
    from pegmask.grammars.automaton import GrammarMatcher
    from pegmask.grammars.vocab import Vocabulary

Delta = dict[str, Any]


# --------------------------------------------------------------------------- outputs
class Output(Protocol):
    """Where released tokens go: turns them into OpenAI deltas."""

    def feed(self, token_ids: Sequence[int], tail: bytes = b"") -> list[Delta]:
        """Whole tokens, then `tail`: the bytes of a token cut short by a stop string."""
        ...

    def finish(self, reason: str) -> tuple[list[Delta], str]:
        """Last deltas and the finish_reason, given the loop's ("stop" or "length")."""
        ...


class TextOutput:
    """Plain text under one delta field (`text` for completions, `content` for a chat whose
    whole answer follows a grammar). Special tokens are not text: they are skipped."""

    def __init__(self, vocab: Vocabulary, field: str = "text"):
        self.vocab = vocab
        self.field = field
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def feed(self, token_ids: Sequence[int], tail: bytes = b"") -> list[Delta]:
        token_bytes = self.vocab.token_bytes
        data = b"".join(token_bytes[t] or b"" for t in token_ids) + tail
        return self._delta(self._decoder.decode(data))

    def finish(self, reason: str) -> tuple[list[Delta], str]:
        return self._delta(self._decoder.decode(b"", final=True)), reason

    def _delta(self, piece: str) -> list[Delta]:
        return [{self.field: piece}] if piece else []


class ChatOutput:
    """A dialect's streaming parser: content, reasoning and tool-call deltas."""

    def __init__(self, parser: DialectStreamParser):
        self.parser = parser

    def feed(self, token_ids: Sequence[int], tail: bytes = b"") -> list[Delta]:
        deltas = self.parser.feed_tokens(token_ids) if token_ids else []
        if tail:
            deltas += self.parser.feed(tail.decode("utf-8", errors="replace"))
        return deltas

    def finish(self, reason: str) -> tuple[list[Delta], str]:
        deltas = self.parser.finish()
        return deltas, "length" if reason == "length" else self.parser.finish_reason

    @property
    def message(self) -> dict[str, Any]:
        return self.parser.message


# --------------------------------------------------------------------------- stop strings
class StopStrings:
    """Holds back tokens while the text so far might end in the start of a stop string."""

    def __init__(self, stops: Sequence[str], vocab: Vocabulary):
        self.stops = [s.encode("utf-8") for s in stops]
        self.vocab = vocab
        self._held: list[int] = []
        self._buffer = b""  # bytes of the held tokens

    def push(self, token_ids: Sequence[int]) -> tuple[list[int], bytes, bool]:
        """Add tokens; returns (tokens to release, tail bytes, whether a stop string matched).

        On a match, the released tokens and the tail end right before the stop string.
        """
        token_bytes = self.vocab.token_bytes
        self._held += token_ids
        self._buffer += b"".join(token_bytes[t] or b"" for t in token_ids)
        found = [i for i in (self._buffer.find(stop) for stop in self.stops) if i >= 0]
        if found:
            return (*self._split(min(found)), True)
        keep_from = next(
            (i for i in range(max(0, len(self._buffer) - max(map(len, self.stops)) + 1),
                              len(self._buffer))
             if any(stop.startswith(self._buffer[i:]) for stop in self.stops)),
            len(self._buffer),
        )
        released, _ = self._split(keep_from, keep_rest=True)
        return released, b"", False

    def flush(self) -> list[int]:
        held, self._held, self._buffer = self._held, [], b""
        return held

    def _split(self, cut: int, keep_rest: bool = False) -> tuple[list[int], bytes]:
        """Release the tokens that end at or before byte `cut`; the bytes of the token that
        straddles `cut` (up to it) are the tail unless `keep_rest` keeps that token held."""
        token_bytes = self.vocab.token_bytes
        position, count = 0, 0
        for token_id in self._held:
            size = len(token_bytes[token_id] or b"")
            if position + size > cut or (size == 0 and position == cut and keep_rest):
                break
            position += size
            count += 1
        released = self._held[:count]
        tail = self._buffer[position:cut]
        self._held = self._held[count:]
        self._buffer = self._buffer[position:]
        return released, b"" if keep_rest else tail


# --------------------------------------------------------------------------- rows
@dataclass
class RowSpec:
    """What the engine prepared for one request."""

    prompt_ids: list[int]
    sampling: SamplingParams
    max_new_tokens: int
    output: Output
    matcher: GrammarMatcher | None = None
    stop_ids: frozenset[int] = frozenset()  # end the output without being part of it


@dataclass
class DecodeStats:
    """Where the time went (for the benchmark and logs). A step samples one token per row;
    `forward_s` is the decode forwards, the prompts' forward is `prefill_s`."""

    steps: int = 0
    prefill_s: float = 0.0
    forward_s: float = 0.0
    mask_s: float = 0.0
    sample_s: float = 0.0
    tokens: int = 0
    forced_tokens: int = 0


@dataclass
class Row:
    """One request in flight."""

    spec: RowSpec
    encode: Any  # text -> token ids, for jump-forward
    vocab: Vocabulary
    generator: torch.Generator | None
    generated: list[int] = field(default_factory=list)
    pending: list[int] = field(default_factory=list)  # tokens for the next forward
    finish_reason: str | None = None
    stops: StopStrings | None = None
    forced: int = 0
    released: list[int] = field(default_factory=list)  # what reached the output
    tail: bytes = b""  # the part of a token cut by a stop string that reached it

    @property
    def room(self) -> int:
        return self.spec.max_new_tokens - len(self.generated)

    def text(self, spell_specials: bool) -> str:
        """The output text (special tokens spelled or skipped), without a special token that
        ended it."""
        ids = self.released
        if ids and self.finish_reason != "length" and self.vocab.token_bytes[ids[-1]] is None:
            ids = ids[:-1]
        names = self.vocab.special_names if spell_specials else {}
        data = b"".join(self.vocab.token_bytes[t] or names.get(t, "").encode() for t in ids)
        return (data + self.tail).decode("utf-8", errors="replace")

    def sample(self, logits: torch.Tensor, bitmask: torch.Tensor, slot: int,
               masked: bool) -> int | None:
        """Draw this row's next token and advance the matcher; None if no token is allowed.

        A row whose mask was skipped (every ordinary token allowed, `masked` False) may still
        draw a special token the grammar forbids: then its mask is applied and it draws again.
        """
        matcher = self.spec.matcher
        if masked and not bool(bitmask[slot].any()):
            return None
        token = self._draw(logits, slot)
        if matcher is None or matcher.accept_token(token):
            return token
        if not masked:
            apply_token_bitmask_inplace(logits, bitmask.to(logits.device), indices=[slot])
            token = self._draw(logits, slot)
            if matcher.accept_token(token):
                return token
        return None  # a masked draw the matcher refuses: cannot happen, but never raise

    def _draw(self, logits: torch.Tensor, slot: int) -> int:
        params = self.spec.sampling
        return int(sample_masked(logits[slot], params.temperature, params.top_p, params.top_k,
                                 self.generator))

    def advance(self, token_id: int) -> list[Delta]:
        """Take a sampled (and accepted) token plus any forced continuation; return the deltas
        they release."""
        spec, matcher = self.spec, self.spec.matcher
        self.generated.append(token_id)
        if token_id in spec.stop_ids or (matcher is not None and matcher.stopped):
            return self.finish("stop")
        tokens = [token_id]
        if matcher is not None and not matcher.is_terminated():
            tokens += self._jump_forward(matcher)
        deltas = self._release(tokens)
        if self.finish_reason is not None:
            return deltas
        if matcher is not None and matcher.is_terminated():
            return deltas + self.finish("stop")
        if self.room <= 0:
            return deltas + self.finish("length")
        self.pending = tokens
        return deltas

    def _jump_forward(self, matcher: GrammarMatcher) -> list[int]:
        forced = matcher.find_jump_forward_string()
        if not forced:
            return []
        try:
            text = forced.decode("utf-8")
        except UnicodeDecodeError as exc:
            text = forced[: exc.start].decode("utf-8")
        tokens = self.encode(text)[:-1][: self.room]
        pieces = [self.vocab.token_bytes[t] for t in tokens]
        if not tokens or None in pieces or not forced.startswith(b"".join(pieces)):
            return []  # a tokenizer that rewrites text (e.g. a SentencePiece prefix space)
        if not matcher.accept_tokens(tokens):
            return []
        self.generated += tokens
        self.forced += len(tokens)
        return tokens

    def _feed(self, tokens: list[int], tail: bytes = b"") -> list[Delta]:
        self.released += tokens
        self.tail += tail
        return self.spec.output.feed(tokens, tail)

    def _release(self, tokens: list[int]) -> list[Delta]:
        if self.stops is None:
            return self._feed(tokens)
        released, tail, matched = self.stops.push(tokens)
        deltas = self._feed(released, tail)
        if matched:
            self.stops.flush()  # what follows the stop string is not output
            deltas += self.finish("stop")
        return deltas

    def finish(self, reason: str) -> list[Delta]:
        if self.finish_reason is not None:
            return []
        deltas: list[Delta] = []
        if self.stops is not None:
            deltas += self._feed(self.stops.flush())
        final, self.finish_reason = self.spec.output.finish(reason)
        self.pending = []
        return deltas + final


# --------------------------------------------------------------------------- the loop
def start_rows(backend: ModelBackend, vocab: Vocabulary, specs: Sequence[RowSpec]) -> list[Row]:
    """Rows ready to decode: each with its prompt pending and its own seeded generator."""
    rows = []
    for spec in specs:
        seed = spec.sampling.seed
        generator = None
        if seed is not None:
            generator = torch.Generator(device=backend.device).manual_seed(seed)
        stops = StopStrings(spec.sampling.stop, vocab) if spec.sampling.stop else None
        rows.append(Row(spec, backend.encode, vocab, generator, pending=list(spec.prompt_ids),
                        stops=stops))
    return rows


def decode_rows(
    backend: ModelBackend, rows: list[Row], stats: DecodeStats | None = None
) -> Iterator[tuple[int, list[Delta]]]:
    """Decode `rows` as one batch; yields (row index, deltas) as rows produce output. When the
    iterator is exhausted every row has its finish_reason."""
    stats = stats if stats is not None else DecodeStats()
    active = list(range(len(rows)))
    bitmask = allocate_token_bitmask(len(rows), backend.logits_width)
    start = time.perf_counter()
    state, logits = backend.prefill([row.pending for row in rows])
    stats.prefill_s += time.perf_counter() - start
    start = time.perf_counter()
    while True:
        masked = time.perf_counter()
        need = {slot for slot, i in enumerate(active) if _fill(rows[i], bitmask, slot)}
        if need:
            device_mask = bitmask if logits.device.type == "cpu" else bitmask.to(logits.device)
            apply_token_bitmask_inplace(logits, device_mask, indices=sorted(need))
        sampled = time.perf_counter()
        for slot, i in enumerate(active):
            row = rows[i]
            token = row.sample(logits, bitmask, slot, masked=slot in need)
            # No allowed token: the grammar cannot be finished, the output is cut short.
            deltas = row.finish("length") if token is None else row.advance(token)
            if deltas:
                yield i, deltas
        done = time.perf_counter()
        stats.steps += 1
        stats.forward_s += masked - start
        stats.mask_s += sampled - masked
        stats.sample_s += done - sampled
        keep = [slot for slot, i in enumerate(active) if rows[i].finish_reason is None]
        if not keep:
            break
        if len(keep) < len(active):
            backend.select(state, keep)
            active = [active[slot] for slot in keep]
        start = time.perf_counter()
        logits = backend.forward(state, [rows[i].pending for i in active])
    stats.tokens += sum(len(row.generated) for row in rows)
    stats.forced_tokens += sum(row.forced for row in rows)


def _fill(row: Row, bitmask: torch.Tensor, slot: int) -> bool:
    matcher = row.spec.matcher
    return matcher is not None and matcher.fill_next_token_bitmask(bitmask, slot)
