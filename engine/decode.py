"""One choice of one request in flight (a `Row`): its grammar matcher, sampling, stop strings and
output parser, from the logits of a step to the OpenAI deltas they release.

The scheduler (engine/scheduler.py) runs the steps: it masks a whole batch of logits at once,
then hands each row its own row of logits; everything per request happens here.

Sampling order, as in vLLM: grammar mask, logit bias, penalties, banned stop tokens (min_tokens,
ignore_eos), then temperature, top-k, top-p and min-p. Log-probabilities, when asked for, are
those of the distribution the token was drawn from at the request's temperature (the mask
included: a token the grammar forbids has none).

Closing under the budget (`close_on_length`, on by default): in a constrained region, once the
tokens left (`room`) come within `CLOSING_MARGIN` of the fewest tokens that complete the grammar
(`GrammarMatcher.completion_token_count`, bounded above by the cheaper `completion_distance`),
the row samples from the closing mask (tokens that move toward the end and leave room for it);
when they equal it, the planned completion is appended without sampling. A token drawn under
the plain mask that leaves no room for the completion is taken back and replaced by the plan's
first token. So a constrained answer cut by `max_tokens` still parses; its finish_reason stays
"length".

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch

from pegmask.grammars import GrammarTooLarge
from pegmask.kernels import apply_token_bitmask_inplace, sample_masked
from pegmask.kernels.logits import apply_logit_bias, apply_penalties

if TYPE_CHECKING:
    from pegmask.dialects import DialectStreamParser
    from pegmask.engine.requests import SamplingParams
    from pegmask.engine.speculation import PromptLookup
    from pegmask.grammars.compiler import CompiledGrammar
    from pegmask.grammars.matcher import GrammarMatcher
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
        self.matched: str | None = None  # the stop string that ended the output

    def push(self, token_ids: Sequence[int]) -> tuple[list[int], bytes, bool]:
        """Add tokens; returns (tokens to release, tail bytes, whether a stop string matched).

        On a match, the released tokens and the tail end right before the stop string.
        """
        token_bytes = self.vocab.token_bytes
        self._held += token_ids
        self._buffer += b"".join(token_bytes[t] or b"" for t in token_ids)
        found = [(at, stop) for stop in self.stops if (at := self._buffer.find(stop)) >= 0]
        if found:
            at, stop = min(found)
            self.matched = stop.decode("utf-8")
            return (*self._split(at), True)
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
    """What the engine prepared for one request: everything but the per-choice state, which
    `Row` makes from it (one row per choice when `sampling.n > 1`)."""

    prompt_ids: list[int]
    sampling: SamplingParams
    max_new_tokens: int
    make_output: Callable[[], Output]
    compiled: CompiledGrammar | None = None
    stop_ids: frozenset[int] = frozenset()  # end the output without being part of it
    eos_ids: frozenset[int] = frozenset()  # the vocabulary's end tokens (for ignore_eos)
    encode: Callable[[str], list[int]] | None = None  # text -> token ids, for jump-forward
    prompt_text: str | None = None  # a chat prompt the dialect rendered natively (for replay)

    @property
    def kv_tokens(self) -> int:
        """What its choices can hold in the key/value cache: the prompt and the output budget,
        each."""
        return self.sampling.n * (len(self.prompt_ids) + self.max_new_tokens)


@dataclass
class DecodeStats:
    """Where the time went (for the benchmark, logs and /metrics). A step runs one forward over
    every row's new tokens; `prefill_s` is the part of the forwards spent on prompts (a step
    that only prefills), `forward_s` the rest."""

    steps: int = 0
    prefill_s: float = 0.0
    forward_s: float = 0.0
    mask_s: float = 0.0
    sample_s: float = 0.0
    tokens: int = 0
    forced_tokens: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0  # of `prompt_tokens`, read from the prefix cache
    drafted_tokens: int = 0  # fed as drafts (engine/speculation.py)
    draft_tokens_kept: int = 0  # of `drafted_tokens`, what the samples agreed with


@dataclass
class TokenLogprob:
    """One output token's log-probability and the best alternatives, as OpenAI reports them."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


CLOSING_MARGIN = 3  # tokens of slack before a constrained region must head for its end
_REDRAWS = 8  # draws that may each be refused for leaving no room for the completion


class Row:
    """One choice of one request in flight (see the module docstring)."""

    def __init__(self, spec: RowSpec, index: int, vocab: Vocabulary, device: torch.device):
        self.spec = spec
        self.index = index
        self.vocab = vocab
        self.output: Output = spec.make_output()
        self.matcher: GrammarMatcher | None = (spec.compiled.matcher()
                                               if spec.compiled is not None else None)
        self.generator: torch.Generator | None = None
        if spec.sampling.seed is not None:
            self.generator = torch.Generator(device=device).manual_seed(
                spec.sampling.seed + index)
        sampling = spec.sampling
        self.stops = StopStrings(sampling.stop, vocab) if sampling.stop else None
        self.stop_ids = spec.stop_ids | frozenset(sampling.stop_token_ids)
        if sampling.ignore_eos:
            self.stop_ids -= spec.eos_ids
        self.seq = -1  # the runner's sequence, set by the scheduler
        self.generated: list[int] = []
        self.pending: list[int] = []  # tokens for the next forward
        self.finish_reason: str | None = None
        self.forced = 0
        self.released: list[int] = []  # what reached the output
        self.tail = b""  # the part of a token cut by a stop string that reached it
        self.logprobs: list[TokenLogprob] = []
        self.closing = False  # this step's mask is the closing mask
        self.plan: list[int] = []  # a completion to append without sampling (budget's end)
        self.failure: Exception | None = None  # raised while filling the mask
        self.lookup: PromptLookup | None = None  # its drafts (made by the scheduler)
        self._bias: tuple[torch.Tensor, torch.Tensor] | None = None
        if sampling.logit_bias:
            ids, values = zip(*sampling.logit_bias, strict=True)
            self._bias = (torch.tensor(ids, dtype=torch.long, device=device),
                          torch.tensor(values, dtype=torch.float32, device=device))

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

    # ----------------------------------------------------------------- masks
    def fill_mask(self, bitmask: torch.Tensor, index: int) -> bool:
        """Fill row `index` of `bitmask` for this row's next token; whether the mask must be
        applied (False in free text). Near the budget's end: the closing mask, or a plan."""
        matcher = self.matcher
        self.closing, self.plan = False, []
        if matcher is None:
            return False
        need = matcher.fill_next_token_bitmask(bitmask, index)
        if not (need and self.spec.sampling.close_on_length):
            return need
        count = self._completion_count(self.room - CLOSING_MARGIN - 1)
        # count 0: the output may end here (free text), nothing to close.
        if not count or self.room > count + CLOSING_MARGIN:
            return need
        if self.room <= count:
            self.plan = matcher.completion_tokens()
        else:
            matcher.fill_closing_bitmask(bitmask, index, self.room)
            self.closing = True
        return need

    def _completion_count(self, fits: int) -> int | None:
        """The fewest tokens that complete the grammar, None where nothing completes it within
        the grammar's closing budget (`GrammarLimits.max_completion_length`: a token that
        leads there is taken back like one whose completion does not fit). Where the distance
        in symbols (which bounds the count and is cheaper) is at most `fits`, that distance
        stands in for the count: the completion surely fits."""
        matcher = self.matcher
        try:
            distance = matcher.completion_distance()
            if distance is None or distance <= fits:
                return distance
            return matcher.completion_token_count()
        except GrammarTooLarge:
            return None

    # ----------------------------------------------------------------- sampling
    def step(self, logits: torch.Tensor, bitmask: torch.Tensor, masked: bool,
             drawn: int | None = None) -> list[Delta]:
        """Sample (or append the plan) and advance: the deltas this step releases. `drawn`: the
        row's draw from `draw_rows` (its logits processed already), None to draw here."""
        if self.plan:
            return self._complete(self.plan)
        picked = self.sample(logits, bitmask, masked, drawn)
        # No allowed token: the grammar cannot be finished, the output is cut short.
        return self.finish("length") if picked is None else self.advance(*picked)

    def sample(self, logits: torch.Tensor, bitmask: torch.Tensor, masked: bool,
               drawn: int | None = None) -> tuple[int, TokenLogprob | None] | None:
        """Draw this row's next token from its row of logits (edited in place) and advance the
        matcher; None if no token is allowed. `bitmask` is this row's filled mask, already
        applied to `logits` when `masked`. `drawn`: the first draw, made with other rows'
        (`draw_rows`) from these logits, processed.

        A row whose mask was skipped (every ordinary token allowed, `masked` False) may still
        draw a special token the grammar forbids: then its mask is applied and it draws again.
        """
        matcher = self.matcher
        if drawn is None:
            if masked and not bool(bitmask.any()):
                return None
            self._adjust(logits)
            banned = self.banned()
            if banned:
                _ban(logits[None], [0], banned, [masked])
            token = self._draw(logits)
        else:
            token = drawn
        if matcher is not None and not matcher.accept_token(token):
            if masked:
                return None  # a masked draw the matcher refuses: cannot happen, but never raise
            apply_token_bitmask_inplace(logits, bitmask.to(logits.device))
            token = self._draw(logits)
            if not matcher.accept_token(token):
                return None
        if masked and not self.closing and self.spec.sampling.close_on_length:
            token = self._within_budget(logits, token)
            if token is None:
                return None
        return token, self._logprob(logits, token)

    def _within_budget(self, logits: torch.Tensor, token: int) -> int | None:
        """`token` (accepted) if the completion still fits in the tokens left after it; else
        the plan's first token, or, where the output may end now (free text before a call
        that would not fit), another draw without the tokens that do not fit."""
        matcher = self.matcher
        for _ in range(_REDRAWS):
            count = self._completion_count(self.room - 1)
            # None: the token led where nothing completes the grammar; taken back like one
            # whose completion does not fit.
            if count is not None and count <= self.room - 1:
                return token
            matcher.rollback(1)
            plan = matcher.completion_tokens()
            if plan:
                return plan[0] if matcher.accept_token(plan[0]) else None
            logits[token] = float("-inf")
            if not bool((logits > float("-inf")).any()):
                return None
            token = self._draw(logits)
            if not matcher.accept_token(token):
                return None
        return None

    def _adjust(self, logits: torch.Tensor) -> None:
        """Logit bias and penalties, on this row's logits."""
        sampling = self.spec.sampling
        if self._bias is not None:
            apply_logit_bias(logits, *self._bias)
        if sampling.penalized:
            apply_penalties(logits, self.generated, self.spec.prompt_ids,
                            frequency=sampling.frequency_penalty,
                            presence=sampling.presence_penalty,
                            repetition=sampling.repetition_penalty)

    def draftable(self, tokens: Sequence[int]) -> list[int]:
        """The leading `tokens` a draft may hold: those the grammar accepts one after the other
        (the matcher is left as it was), up to a stop or end token (the row ends there)."""
        matcher, kept = self.matcher, []
        for token in tokens:
            if token in self.stop_ids or token in self.spec.eos_ids:
                break
            if matcher is not None and not matcher.accept_token(token):
                break
            kept.append(token)
            if matcher is not None and (matcher.stopped or matcher.is_terminated()):
                break
        if matcher is not None and kept:
            matcher.rollback(len(kept))
        return kept

    def banned(self) -> frozenset[int]:
        """The tokens this step may not draw: end tokens under ignore_eos, and stop tokens
        before min_tokens."""
        sampling = self.spec.sampling
        banned = self.spec.eos_ids if sampling.ignore_eos else frozenset()
        if len(self.generated) < sampling.min_tokens:
            banned = banned | self.stop_ids | self.spec.eos_ids
        return banned

    def _draw(self, logits: torch.Tensor) -> int:
        params = self.spec.sampling
        return int(sample_masked(logits, params.temperature, params.top_p, params.top_k,
                                 self.generator, min_p=params.min_p))

    @property
    def draws_like(self) -> tuple[float, float, int, float]:
        """What a draw depends on besides the logits: rows alike are drawn together."""
        params = self.spec.sampling
        return params.temperature, params.top_p, params.top_k, params.min_p

    def _logprob(self, logits: torch.Tensor, token: int) -> TokenLogprob | None:
        sampling = self.spec.sampling
        if not sampling.logprobs:
            return None
        temperature = sampling.temperature if sampling.temperature > 0 else 1.0
        logprobs = torch.log_softmax(logits.float() / temperature, dim=-1)
        top: list[tuple[int, float]] = []
        if sampling.top_logprobs:
            values, ids = logprobs.topk(sampling.top_logprobs)
            top = [(int(i), float(v)) for i, v in zip(ids, values, strict=True)
                   if v > float("-inf")]
        return TokenLogprob(token, float(logprobs[token]), top)

    # ----------------------------------------------------------------- output
    def advance(self, token_id: int, logprob: TokenLogprob | None = None) -> list[Delta]:
        """Take a sampled (and accepted) token plus any forced continuation; return the deltas
        they release."""
        matcher = self.matcher
        self.generated.append(token_id)
        if logprob is not None:
            self.logprobs.append(logprob)
        if token_id in self.stop_ids or (matcher is not None and matcher.stopped):
            return self.finish("stop")
        tokens = [token_id]
        if matcher is not None and not matcher.is_terminated():
            forced = self._jump_forward(matcher)
            tokens += forced
            if self.spec.sampling.logprobs:
                self.logprobs += [TokenLogprob(t, 0.0, [(t, 0.0)]) for t in forced]
        deltas = self._release(tokens)
        if self.finish_reason is not None:
            return deltas
        if matcher is not None and matcher.is_terminated():
            return deltas + self.finish("stop")
        if self.room <= 0:
            return deltas + self.finish("length")
        self.pending = tokens
        return deltas

    def _complete(self, tokens: list[int]) -> list[Delta]:
        """Append a planned completion: the grammar is complete and the budget spent."""
        if not self.matcher.accept_tokens(tokens):
            return self.finish("length")
        self.generated += tokens
        self.forced += len(tokens)
        if self.spec.sampling.logprobs:
            self.logprobs += [TokenLogprob(t, 0.0, [(t, 0.0)]) for t in tokens]
        deltas = self._release(tokens)
        return deltas + self.finish("length")

    def _jump_forward(self, matcher: GrammarMatcher) -> list[int]:
        forced = matcher.find_jump_forward_string()
        if not forced or self.spec.encode is None:
            return []
        try:
            text = forced.decode("utf-8")
        except UnicodeDecodeError as exc:
            text = forced[: exc.start].decode("utf-8")
        tokens = self.spec.encode(text)[:-1][: self.room]
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
        return self.output.feed(tokens, tail)

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
        final, self.finish_reason = self.output.finish(reason)
        self.pending = []
        return deltas + final


# --------------------------------------------------------------------------- batched draws
def draw_rows(rows: Sequence[Row], logits: torch.Tensor, bitmask: torch.Tensor,
              masked: Sequence[bool]) -> list[int | None]:
    """The first draw of every row of a step, made for rows alike at once (`Row.draws_like`):
    logits processed row by row (bias, penalties), banned tokens and the draw per group of rows.
    Drawn one row at a time, a step of 32 rows spent a sixth of its time here. None for a row
    left to `Row.sample`, its logits untouched: one with a plan, a failure, or a mask that
    allows nothing. A row left with no token by its bias and penalties fails, as it would
    alone. `logits` row i belongs to rows[i] and is edited in place; `bitmask` is the
    step's."""
    drawn: list[int | None] = [None] * len(rows)
    live = [i for i, row in enumerate(rows) if row.failure is None and not row.plan]
    checked = [i for i in live if masked[i]]
    if checked:
        allowed = bitmask[checked].any(dim=1).tolist()
        empty = {i for i, ok in zip(checked, allowed, strict=True) if not ok}
        live = [i for i in live if i not in empty]
    adjusted = []
    for i in live:
        try:
            rows[i]._adjust(logits[i])
        except Exception as exc:  # noqa: BLE001 - one row's failure ends only its request
            rows[i].failure = exc
            continue
        adjusted.append(i)
    for banned, members in _groups(adjusted, lambda i: rows[i].banned()).items():
        if banned:
            _ban(logits, members, banned, [masked[i] for i in members])
    if not adjusted:
        return drawn
    # amax, not `(logits > -inf).any()`: 0.1 ms against 1 ms for 32 rows
    alive = (_rows_of(logits, adjusted).amax(dim=1) > float("-inf")).tolist()
    for i, ok in zip(adjusted, alive, strict=True):
        if not ok:
            rows[i].failure = ValueError("a row of logits has no allowed token (all -inf)")
    ready = [i for i, ok in zip(adjusted, alive, strict=True) if ok]
    for _, members in _groups(ready, lambda i: rows[i].draws_like).items():
        params = rows[members[0]].spec.sampling
        tokens = sample_masked(_rows_of(logits, members), params.temperature, params.top_p,
                               params.top_k, [rows[i].generator for i in members],
                               min_p=params.min_p)
        for i, token in zip(members, tokens.tolist(), strict=True):
            drawn[i] = token
    return drawn


def _groups(items: list[int], key: Callable[[int], Any]) -> dict[Any, list[int]]:
    groups: dict[Any, list[int]] = {}
    for item in items:
        groups.setdefault(key(item), []).append(item)
    return groups


def _rows_of(logits: torch.Tensor, members: list[int]) -> torch.Tensor:
    """`logits[members]`: a view where they are all rows in order (the usual step)."""
    if members == list(range(logits.shape[0])):
        return logits
    return logits[members]


def _ban(logits: torch.Tensor, members: list[int], banned: frozenset[int],
         masked: list[bool]) -> None:
    """-inf for the `banned` tokens of rows `members`; a masked row that this leaves with no
    token gets them back (only a mask can do that: then the grammar wins)."""
    device = logits.device
    ids = torch.tensor(sorted(t for t in banned if t < logits.shape[-1]), dtype=torch.long,
                       device=device)
    if not ids.numel():
        return
    where = (torch.tensor(members, dtype=torch.long, device=device)[:, None], ids[None, :])
    saved = logits[where]
    logits[where] = float("-inf")
    # only a masked row whose mask allowed a banned token can be left with none (a tool-call
    # row outside its last call allows no end token: no pass over its whole row)
    allowed = (saved > float("-inf")).any(dim=1).tolist()
    checked = [k for k, flag in enumerate(masked) if flag and allowed[k]]
    if not checked:
        return
    rows = _rows_of(logits, [members[k] for k in checked])
    left = (rows.amax(dim=1) > float("-inf")).tolist()
    for k, ok in zip(checked, left, strict=True):
        if not ok:
            logits[members[k], ids] = saved[k]
