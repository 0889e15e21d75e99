"""The scheduler: one decode loop owns the model; every request is submitted to it.

`Engine.generate`, `generate_batch`, `run-batch` and the server all call `Scheduler.submit` from
any thread with a prepared request (a `RowSpec`: prompt tokens, compiled grammar, sampling). The
loop runs in its own thread. Between two steps it admits waiting requests while there is room
for their choices (`Limits.max_running`) and for all they can hold in the key/value cache
(`Limits.kv_cache_tokens`), and drops the rows of cancelled or timed-out requests.
Each step is one forward over every row's new tokens: a prompt chunk of at most
`Limits.prefill_chunk` tokens for requests still prefilling (beside decoding rows, under
`Limits.decode_first`, no more tokens than those rows), the sampled (and jump-forward) tokens of
the others (and, in a step of few rows, drafts of their next tokens checked in the same
forward: engine/speculation.py), so a long prompt does not stall the rows that decode. A
prompt that begins with a kept prefix (the tool definitions every request of a client repeats)
starts as a copy of it and prefills only the rest (engine/prefix_cache.py). Then every row
that has logits is masked (one bitmask for the step), sampled and advanced on its own: one row's
failure ends only its request. A request with `n > 1` prefills its prompt once; its other
choices are copies of that sequence.

A `Submission` is the caller's handle: the events of its choices (OpenAI deltas, log-probs,
finish reasons) read with `events()` from a thread or `aevents()` from asyncio, `cancel()`,
and its rows once it is done.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from pegmask.engine.decode import DecodeStats, Delta, Row, RowSpec, TokenLogprob, draw_rows
from pegmask.engine.prefix_cache import PrefixCache
from pegmask.engine.speculation import PromptLookup
from pegmask.kernels import allocate_token_bitmask, apply_token_bitmask_inplace

if TYPE_CHECKING:
    from pegmask.engine.metrics import Metrics
    from pegmask.engine.runner import Chunk, SequenceRunner
    from pegmask.grammars.vocab import Vocabulary

logger = logging.getLogger("pegmask.scheduler")

# The prompt tokens a step takes at least beside decoding rows under `Limits.decode_first`: a
# block, which also attends in the batched call (llama_runner.BATCHED_CHUNK).
DECODE_FIRST_MIN = 16
# A drafted row's chunk (its sampled and forced tokens, then the draft) holds at most this many
# tokens: the runner's batched attention call takes chunks up to 16 (llama_runner.BATCHED_CHUNK).
MAX_CHUNK = 16


@dataclass(frozen=True)
class Limits:
    """Bounds of one engine: rows decoding at once (each choice of a request is a row), requests
    waiting for room, prompt tokens per step, and the time a request may take (queue included;
    None: no bound)."""

    max_running: int = 32
    max_queued: int = 256
    prefill_chunk: int = 256
    # While rows decode, a step takes at most as many prompt tokens as it has decoding rows
    # (at least `DECODE_FIRST_MIN`): on a CPU a step costs about its rows, so a long prompt
    # about doubles the decoding rows' step time rather than stalling them (False: up to
    # `prefill_chunk` tokens a step whatever decodes).
    decode_first: bool = False
    request_timeout_s: float | None = None
    prefix_cache: int = 4  # prompt prefixes kept for reuse (engine/prefix_cache.py; 0: none)
    # drafts (engine/speculation.py) are added while a step holds fewer tokens (0: none)
    draft_budget: int = 48
    # the key/value cache's tokens held for running requests (`RowSpec.kv_tokens`, each
    # request's whole prompt and output budget); a request waits while it does not fit (None:
    # no bound)
    kv_cache_tokens: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_running", "max_queued", "prefill_chunk"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        for name in ("prefix_cache", "draft_budget"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be at least 0")
        if self.request_timeout_s is not None and self.request_timeout_s <= 0:
            raise ValueError("request_timeout_s must be positive")
        if self.kv_cache_tokens is not None and self.kv_cache_tokens < 1:
            raise ValueError("kv_cache_tokens must be at least 1")


class QueueFullError(RuntimeError):
    """The scheduler's queue holds `max_queued` requests already (HTTP 429)."""


class RequestTimeoutError(RuntimeError):
    """The request ran past `request_timeout_s`."""


class SchedulerClosedError(RuntimeError):
    """The engine was closed while the request waited or ran."""


@dataclass
class Event:
    """What one step released for one choice of a request."""

    index: int
    deltas: list[Delta]
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None


_DONE = object()


class Submission:
    """A request handed to the scheduler (see the module docstring)."""

    def __init__(self, spec: RowSpec, timeout_s: float | None):
        self.spec = spec
        self.rows: list[Row] = []  # one per choice, made when the request is admitted
        self.submitted_at = time.monotonic()
        self.deadline = None if timeout_s is None else self.submitted_at + timeout_s
        self.first_token_at: float | None = None
        self.cached_tokens = 0  # prompt tokens that came from the prefix cache
        self.error: BaseException | None = None
        self.done = threading.Event()
        self.cancelled = False
        self._items: deque[Any] = deque()
        self._cond = threading.Condition()
        self._async_wakeup: tuple[asyncio.AbstractEventLoop, asyncio.Event] | None = None

    def cancel(self) -> None:
        """Give up: the scheduler drops the request's rows before its next step."""
        self.cancelled = True

    def result(self, timeout: float | None = None) -> list[Row]:
        """Wait for the end; the finished rows, or the request's error raised."""
        if not self.done.wait(timeout):
            raise TimeoutError("the request is still running")
        if self.error is not None:
            raise self.error
        return self.rows

    def events(self) -> Iterator[Event]:
        """The request's events as they come, from any thread; raises the request's error."""
        while True:
            with self._cond:
                while not self._items:
                    self._cond.wait()
                item = self._items.popleft()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    async def aevents(self) -> AsyncIterator[Event]:
        """`events()` for asyncio: awaits without blocking the event loop."""
        wakeup = asyncio.Event()
        with self._cond:
            self._async_wakeup = (asyncio.get_running_loop(), wakeup)
        while True:
            with self._cond:
                item = self._items.popleft() if self._items else None
                if item is None:
                    wakeup.clear()
            if item is None:
                await wakeup.wait()
                continue
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    # ----------------------------------------------------------------- the loop's side
    def _put(self, item: Any, wake: bool = True) -> None:
        """Queue `item` for the consumer; `wake` False leaves waking it to a later `_wake`."""
        with self._cond:
            self._items.append(item)
        if wake:
            self._wake()

    def _wake(self) -> None:
        """Wake the consumer to read what is queued."""
        _wake_all([self])

    def _finish(self, error: BaseException | None = None, wake: bool = True) -> None:
        if self.done.is_set():
            return
        self.error = error
        self._put(error if error is not None else _DONE, wake)
        self.done.set()


def _wake_all(submissions: Iterable[Submission]) -> None:
    """Wake the consumers of `submissions`: threads through their conditions, and each event
    loop by one call that sets all of its consumers' events (a call per submission wrote to
    the loop's self-pipe for every request every step: 2.4% of a 32-client server's decode
    thread)."""
    events: dict[asyncio.AbstractEventLoop, list[asyncio.Event]] = {}
    for submission in submissions:
        with submission._cond:
            submission._cond.notify_all()
            wakeup = submission._async_wakeup
        if wakeup is not None:
            events.setdefault(wakeup[0], []).append(wakeup[1])
    for loop, waiting in events.items():
        try:
            loop.call_soon_threadsafe(_set_all, waiting)
        except RuntimeError:  # the consumers' event loop is closed: nobody listens
            pass


def _set_all(events: list[asyncio.Event]) -> None:
    for event in events:
        event.set()


@dataclass
class _Prefill:
    """A request whose prompt is still going into the model's cache."""

    submission: Submission
    seq: int | None = None  # made when its first chunk goes in (from a kept prefix if any)
    position: int = 0


class Scheduler:
    """The decode loop and its queue (see the module docstring)."""

    def __init__(self, runner: SequenceRunner, vocab: Vocabulary, limits: Limits,
                 stats: DecodeStats, metrics: Metrics | None = None,
                 on_finish: Callable[[Submission], None] | None = None):
        self.runner = runner
        # saved prefixes hold at most as many tokens as the running requests may
        self.prefixes = PrefixCache(runner, limits.prefix_cache,
                                    max_tokens=limits.kv_cache_tokens)
        self.on_finish = on_finish  # called in the loop for each request that ends well
        self.vocab = vocab
        self.limits = limits
        self.stats = stats
        self.metrics = metrics
        self._cond = threading.Condition()
        self._waiting: deque[Submission] = deque()
        self._prefilling: list[_Prefill] = []
        self._decoding: list[Row] = []
        self._active: list[Submission] = []  # admitted, not finished
        self._owner: dict[Row, Submission] = {}
        self._kv_held = 0  # `RowSpec.kv_tokens` of the admitted requests
        self._thread: threading.Thread | None = None
        self._closed = False

    # ----------------------------------------------------------------- callers' side
    def submit(self, spec: RowSpec) -> Submission:
        """Queue a prepared request; raises QueueFullError when the queue is full."""
        if spec.sampling.n > self.limits.max_running:
            raise ValueError(f"n={spec.sampling.n} exceeds the engine's "
                             f"{self.limits.max_running} running sequences")
        budget = self.limits.kv_cache_tokens
        if budget is not None and spec.kv_tokens > budget:
            raise ValueError(f"the request can hold {spec.kv_tokens} tokens of key/value "
                             f"cache, more than the engine's {budget}")
        submission = Submission(spec, self.limits.request_timeout_s)
        with self._cond:
            if self._closed:
                raise SchedulerClosedError("the engine is closed")
            if len(self._waiting) >= self.limits.max_queued:
                raise QueueFullError(
                    f"{len(self._waiting)} requests are queued already (max_queued)")
            self._waiting.append(submission)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="pegmask-decode",
                                                daemon=True)
                self._thread.start()
            self._cond.notify()
        return submission

    @property
    def queued(self) -> int:
        return len(self._waiting)

    @property
    def running(self) -> int:
        """Rows (choices) admitted and not finished."""
        return len(self._decoding) + sum(p.submission.spec.sampling.n for p in self._prefilling)

    def close(self) -> None:
        """Stop the loop; requests still waiting or running end with SchedulerClosedError."""
        with self._cond:
            self._closed = True
            self._cond.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    # ----------------------------------------------------------------- the loop
    def _run(self) -> None:
        while True:
            with self._cond:
                while not (self._closed or self._waiting or self._active):
                    self._cond.wait()
                if self._closed:
                    break
                self._admit()
            self._drop_ended()
            if not (self._prefilling or self._decoding):
                continue
            try:
                # the forward's logits are inference tensors, edited in place (masks, bias)
                with torch.inference_mode():
                    self._step()
            except Exception as exc:  # noqa: BLE001 - the model failed: fail this step's rows
                logger.exception("decode step failed")
                for submission in list(self._active):
                    self._end(submission, exc)
        error = SchedulerClosedError("the engine was closed")
        with self._cond:
            waiting, self._waiting = list(self._waiting), deque()
        for submission in waiting + list(self._active):
            self._end(submission, error)

    def _admit(self) -> None:
        """Move waiting requests in while their choices fit (first come, first served)."""
        while self._waiting:
            submission = self._waiting[0]
            if self.running + submission.spec.sampling.n > self.limits.max_running:
                return
            budget = self.limits.kv_cache_tokens
            if budget is not None and self._kv_held + submission.spec.kv_tokens > budget:
                return
            self._waiting.popleft()
            if submission.cancelled:
                submission._finish()
                continue
            try:
                spec = submission.spec
                submission.rows = [Row(spec, i, self.vocab, self.runner.device)
                                   for i in range(spec.sampling.n)]
            except Exception as exc:  # noqa: BLE001 - a request that cannot start fails alone
                submission._finish(exc)
                continue
            self._active.append(submission)
            self._kv_held += submission.spec.kv_tokens
            self._owner.update(dict.fromkeys(submission.rows, submission))
            self._prefilling.append(_Prefill(submission))

    def _drop_ended(self) -> None:
        """End cancelled requests and those past their deadline, queued ones included."""
        now = time.monotonic()
        with self._cond:
            expired = [s for s in self._waiting if s.cancelled or _late(s, now)]
            for submission in expired:
                self._waiting.remove(submission)
        for submission in expired + [s for s in self._active if s.cancelled or _late(s, now)]:
            error = None if submission.cancelled else RequestTimeoutError(
                f"the request ran past {self.limits.request_timeout_s} s")
            self._end(submission, error)

    def _end(self, submission: Submission, error: BaseException | None,
             held: dict[Submission, None] | None = None) -> None:
        """Take a request's rows out of the batch and the runner; report its end (its consumer
        woken now, or, with `held`, added to the requests woken at the end of the step)."""
        for prefill in [p for p in self._prefilling if p.submission is submission]:
            self._prefilling.remove(prefill)
            if prefill.seq is not None:
                self.runner.remove(prefill.seq)
        for row in submission.rows:
            self._owner.pop(row, None)
            if row in self._decoding:
                self._decoding.remove(row)
                self.runner.remove(row.seq)
        if submission in self._active:
            self._active.remove(submission)
            self._kv_held -= submission.spec.kv_tokens
        if self.metrics is not None:
            self.metrics.request_ended(submission)
        if error is None and self.on_finish is not None and submission.rows:
            try:
                self.on_finish(submission)
            except Exception:  # noqa: BLE001 - bookkeeping must not fail the request
                logger.exception("on_finish failed")
        submission._finish(error, wake=held is None)
        if held is not None:
            held[submission] = None

    def _step(self) -> None:
        started = time.perf_counter()
        chunks: list[Chunk] = []
        samplers: list[list[Row]] = []  # per chunk: the rows that sample from its logits
        scored: list[int] = []  # per chunk: its last tokens with logits (a draft's, and one)
        drafts = self._drafts() if not self._prefilling else {}
        for row in self._decoding:
            draft = drafts.get(row, [])
            chunks.append((row.seq, row.pending + draft))
            scored.append(1 + len(draft))
            samplers.append([row])
        decoding = len(chunks)
        budget = self.limits.prefill_chunk
        if self.limits.decode_first and decoding:
            budget = min(budget, max(DECODE_FIRST_MIN, decoding))
        completed: list[_Prefill] = []
        advanced: list[tuple[_Prefill, int]] = []  # with the index of its chunk
        # prompts the prefix cache held whole: the logits after their last token, their rows
        kept: list[tuple[torch.Tensor, list[Row]]] = []
        for prefill in self._prefilling:
            if budget <= 0:
                break
            prompt = prefill.submission.spec.prompt_ids
            if prefill.seq is None:  # its first chunk: it starts from the longest kept prefix
                prefill.seq, prefill.position, final = self.prefixes.start(prompt)
                self.runner.expect(prefill.seq, len(prompt))
                prefill.submission.cached_tokens = prefill.position
                self.stats.cached_prompt_tokens += prefill.position
                if final is not None:
                    completed.append(prefill)
                    kept.append((final, prefill.submission.rows))
                    continue
            piece = prompt[prefill.position : prefill.position + budget]
            prefill.position += len(piece)
            budget -= len(piece)
            advanced.append((prefill, len(chunks)))
            chunks.append((prefill.seq, piece))
            scored.append(1)
            if prefill.position == len(prompt):
                completed.append(prefill)
                samplers.append(prefill.submission.rows)
            else:
                samplers.append([])
        if drafts:
            logits = self.runner.forward(chunks, scored)
            # a chunk's first scored row samples as usual; a draft's others wait for `_verify`
            firsts, after_draft, at = [], {}, 0
            for group, count in zip(samplers, scored, strict=True):
                firsts.append(at)
                if count > 1:
                    after_draft[group[0]] = logits[at + 1 : at + count]
                at += count
            logits = logits[firsts]
        elif chunks:
            logits = self.runner.forward(chunks)
        else:
            logits = torch.empty(0, self.runner.logits_width, device=self.runner.device)
        forwarded = time.perf_counter()
        for prefill, index in advanced:  # whole blocks in: requests prefilling behind can use them
            prompt = prefill.submission.spec.prompt_ids
            whole = prefill.position == len(prompt)  # kept whole, with its first logits
            self.prefixes.keep(prefill.seq, prompt[:prefill.position],
                               logits[index] if whole else None)
        if kept:
            logits = torch.cat([logits, torch.stack([final for final, _ in kept]).to(logits)])
            samplers += [rows for _, rows in kept]
        for prefill in completed:  # its prompt is in: its choices decode from now on
            self._start_rows(prefill)
            self._prefilling.remove(prefill)
            self.stats.prompt_tokens += len(prefill.submission.spec.prompt_ids)
        rows = [row for group in samplers for row in group]
        # a row per sampling row, which it may edit: the forward's own where each chunk has
        # one (the prefix cache keeps copies), else copied (n > 1, chunks that sample nothing)
        if any(len(group) != 1 for group in samplers):
            index = torch.tensor([i for i, group in enumerate(samplers) for _ in group],
                                 dtype=torch.long, device=logits.device)
            logits = logits.index_select(0, index)
        bitmask = allocate_token_bitmask(len(rows), logits.shape[-1])
        need = [self._fill(row, bitmask, i) for i, row in enumerate(rows)]
        masked_rows = [i for i, flag in enumerate(need) if flag]
        device_mask = bitmask if logits.device.type == "cpu" else bitmask.to(logits.device)
        if masked_rows:
            apply_token_bitmask_inplace(logits, device_mask, indices=masked_rows)
        masked = time.perf_counter()
        # Consumers are woken once all rows have sampled: a server's event loop woken per row
        # took the interpreter from this loop between rows (8 tool-call clients: 0.80 ms a row
        # sampled, 0.62 woken at the step's end; 32 clients: 6% more tokens/s).
        held: dict[Submission, None] = {}
        try:
            drawn = draw_rows(rows, logits, device_mask, need)
            before = {row: len(row.generated) for row in drafts}
            for i, row in enumerate(rows):
                self._sample(row, logits[i], device_mask[i], need[i], held, drawn[i])
            for row, draft in drafts.items():
                self._verify(row, draft, after_draft[row], before[row], held)
        finally:
            _wake_all(held)
        done = time.perf_counter()
        self._account(started, forwarded, masked, done, decoding, rows)

    def _drafts(self) -> dict[Row, list[int]]:
        """Prompt-lookup drafts (engine/speculation.py) for the decoding rows, longest matches
        first, while the step's tokens stay under `Limits.draft_budget`, each row's under an
        equal share of it (a step's rows wait for its slowest one: drafts for a few rows that
        slow every row's step cost the others more than they gain); each checked against the
        row's grammar and within its room (a chunk of at most `MAX_CHUNK` tokens)."""
        rows = len(self._decoding)
        share = (self.limits.draft_budget - rows) // max(rows, 1)
        if share <= 0:  # the usual step at 24 rows or more: nothing more to count
            return {}
        budget = self.limits.draft_budget - sum(len(row.pending) for row in self._decoding)
        if budget <= 0:
            return {}
        offers = []
        for row in self._decoding:
            room = min(row.room - 1, MAX_CHUNK - len(row.pending), share)
            if room <= 0 or row.failure is not None:
                continue
            if row.lookup is None:
                row.lookup = PromptLookup(row.spec.prompt_ids)
            row.lookup.follow(row.generated)
            draft, match = row.lookup.propose(rows)
            if draft:
                offers.append((match, row, draft[:room]))
        drafts = {}
        for _, row, draft in sorted(offers, key=lambda offer: -offer[0]):
            draft = row.draftable(draft[:budget])
            if draft:
                drafts[row] = draft
                budget -= len(draft)
                if budget <= 0:
                    break
        drafted = sum(len(draft) for draft in drafts.values())
        self.stats.drafted_tokens += drafted
        if self.metrics is not None:
            self.metrics.draft_tokens.inc(drafted)
        return drafts

    def _verify(self, row: Row, draft: list[int], logits: torch.Tensor, start: int,
                held: dict[Submission, None]) -> None:
        """Go on sampling `row` from the logits after its drafted tokens while what it samples
        (and the grammar forces) is the draft: position by position, as later steps would have
        (its mask filled at each). What it produces past or off the draft is its next chunk;
        the draft's tokens after that are dropped from its sequence. `start`: the row's output
        length before this step's first sample."""
        kept = 0  # drafted tokens the samples agreed with (their keys and values stand)
        bitmask = allocate_token_bitmask(1, logits.shape[-1])
        while row.finish_reason is None and row in self._owner:
            produced = row.generated[start:]
            agree = 0
            while (agree < len(produced) and kept + agree < len(draft)
                   and produced[agree] == draft[kept + agree]):
                agree += 1
            kept += agree
            if agree < len(produced) or not produced:
                row.pending = produced[agree:]
                break
            start = len(row.generated)
            after = logits[kept - 1]
            need = self._fill(row, bitmask, 0)
            if need:
                apply_token_bitmask_inplace(after, bitmask[0].to(after.device))
            self._sample(row, after, bitmask[0], need, held, None)
        self.stats.draft_tokens_kept += kept
        if self.metrics is not None:
            self.metrics.draft_tokens_kept.inc(kept)
        if row.finish_reason is None and row in self._owner and kept < len(draft):
            self.runner.truncate(row.seq, self.runner.length(row.seq) - (len(draft) - kept))

    def _fill(self, row: Row, bitmask: torch.Tensor, index: int) -> bool:
        try:
            return row.fill_mask(bitmask, index)
        except Exception as exc:  # noqa: BLE001 - one row's failure ends only its request
            logger.exception("a row's mask failed")
            row.failure = exc
            return False

    def _start_rows(self, prefill: _Prefill) -> None:
        """A request's prompt is in: its rows decode from now on (the first on the prefilled
        sequence, the others on copies of it, made once the forward has put its last chunk in:
        copies made before it held only the prompt's earlier chunks)."""
        for i, row in enumerate(prefill.submission.rows):
            row.seq = prefill.seq if i == 0 else self.runner.fork(prefill.seq)
            self._decoding.append(row)

    def _sample(self, row: Row, logits: torch.Tensor, bitmask: torch.Tensor,
                masked: bool, held: dict[Submission, None], drawn: int | None) -> None:
        """Sample `row` (`drawn`: its first draw, made with the step's other rows); what it
        releases is queued for its request's consumer, who is woken with the others in `held`
        at the end of the step."""
        submission = self._owner[row]
        before, generated, forced = len(row.logprobs), len(row.generated), row.forced
        try:
            if row.failure is not None:
                raise row.failure
            deltas = row.step(logits, bitmask, masked, drawn)
        except Exception as exc:  # noqa: BLE001 - one row's failure ends only its request
            logger.exception("a row failed")
            self._end(submission, exc, held)
            return
        self.stats.tokens += len(row.generated) - generated
        self.stats.forced_tokens += row.forced - forced
        if submission.first_token_at is None:
            submission.first_token_at = time.monotonic()
            if self.metrics is not None:
                self.metrics.first_token(submission)
        if deltas or row.finish_reason is not None or len(row.logprobs) > before:
            submission._put(Event(row.index, deltas, row.logprobs[before:], row.finish_reason),
                            wake=False)
            held[submission] = None
        if row.finish_reason is not None:
            self._decoding.remove(row)
            self.runner.remove(row.seq)
            if all(r.finish_reason is not None for r in submission.rows):
                self._end(submission, None, held)

    def _account(self, started: float, forwarded: float, masked: float, done: float,
                 decoding: int, rows: list[Row]) -> None:
        stats = self.stats
        stats.steps += 1
        if decoding:
            stats.forward_s += forwarded - started
        else:
            stats.prefill_s += forwarded - started
        stats.mask_s += masked - forwarded
        stats.sample_s += done - masked
        if self.metrics is not None:
            self.metrics.step(len(rows), masked - forwarded)


def _late(submission: Submission, now: float) -> bool:
    return submission.deadline is not None and now > submission.deadline
