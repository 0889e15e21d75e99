"""`GrammarMatcher`: one generation's cursor over a `CompiledGrammar` (xgrammar's matcher
side): it fills bitmask rows, accepts tokens, rolls back, and closes the output under a
token budget."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from pegmask.grammars.completion import UNREACHABLE
from pegmask.grammars.configurations import DEAD
from pegmask.kernels.bitmask import pack_token_ids

if TYPE_CHECKING:
    from pegmask.grammars.compiler import CompiledGrammar


class GrammarMatcher:
    """Per-generation cursor over a `CompiledGrammar` (xgrammar's GrammarMatcher shape)."""

    def __init__(self, compiled: CompiledGrammar):
        self.compiled = compiled
        self._masks = compiled._masks
        self.reset()

    def reset(self) -> None:
        self._history: list[int] = [self.compiled.initial_state]
        self._terminated = False
        # What the next mask is for: the last configuration, DEAD once terminated (read
        # on every fill, so kept apart from the history).
        self._state = self.compiled.initial_state
        self._bitmask: Any = None
        self._bitmask_view: np.ndarray | None = None
        self._bitmask_bytes: memoryview | None = None  # of a C-contiguous bitmask
        self._row_bytes = self._row_count = 0
        self._row_index: int | None = None  # the row `_row_slice` is for
        self._row_slice = slice(0)

    @property
    def state(self) -> int:
        return self._history[-1]

    def fill_next_token_bitmask(self, bitmask: Any, index: int = 0) -> bool:
        """Write the allowed-token mask into row `index` of `bitmask` (torch CPU or numpy int32).

        Returns False when every ordinary token is allowed (an unconstrained, lazy region: the
        caller may skip applying the mask); the row is filled exactly either way.
        """
        # The warm path is a dictionary hit and a byte copy: each line here costs a few
        # percent of it, so the cache is read directly and the bitmask's views are kept.
        state = self._state
        entry = self._masks.get(state)
        if entry is None:
            entry = self.compiled.cached_mask(state)
        else:
            self._masks.move_to_end(state)  # least recently used goes first
        if bitmask is not self._bitmask:  # views of a tensor cost microseconds: made once
            self._bind(bitmask)
        raw = entry[2]
        if index == self._row_index:
            self._bitmask_bytes[self._row_slice] = raw
            return not entry[1]
        size = self._row_bytes
        if size == len(raw) and 0 <= index < self._row_count:  # half numpy's cost
            self._row_index, self._row_slice = index, slice(index * size, (index + 1) * size)
            self._bitmask_bytes[self._row_slice] = raw
            return not entry[1]
        self._copy_row(entry[0], index)
        return not entry[1]

    def _copy_row(self, packed: np.ndarray, index: int) -> None:
        """Write `packed` into row `index` of the bound bitmask (zeros past the vocabulary
        where the logits are wider)."""
        target = self._bitmask_view[index]
        width = len(packed)
        if len(target) == width:
            target[:] = packed
        else:
            width = min(width, len(target))
            target[:width] = packed[:width]
            target[width:] = 0

    # ----------------------------------------------------------------- closing under a budget
    # The figures below walk one configuration per symbol of the shortest completion, so they
    # raise `GrammarTooLarge` where it is longer than `GrammarLimits.max_completion_length`
    # (`completion_token_floor` never does).
    def completion_distance(self) -> int | None:
        """The fewest symbols that complete the grammar from here (bytes; a special token the
        vocabulary has counts one, one it lacks the bytes of its spelling): 0 where the grammar
        may end (free text of a lazy grammar included, and after a stop token), None where no
        input completes it."""
        if self._terminated:
            return 0
        distance = self.compiled.completions.distance(self._state)
        return None if distance >= UNREACHABLE else distance

    def shortest_completion(self) -> list[bytes | int]:
        """One completion of `completion_distance` symbols, as runs of bytes and special-token
        ids (a special the vocabulary lacks is in the bytes, spelled); [] where the grammar may
        end. Raises `GrammarError` where no input completes the grammar."""
        return [] if self._terminated else self.compiled.completions.pieces(self._state)

    def completion_tokens(self) -> list[int]:
        """The fewest tokens that spell `shortest_completion` (`accept_tokens` takes them, and
        the grammar may end after them). After the first of them, this is the rest of them:
        each token of the plan shortens it by one. Raises `GrammarError` where no input
        completes the grammar."""
        return [] if self._terminated else self.compiled.completions.plan(self._state)

    def completion_token_count(self) -> int | None:
        """`len(completion_tokens())`, memoized per configuration; None where no input
        completes the grammar."""
        if self._terminated:
            return 0
        count = self.compiled.completions.plan_length(self._state)
        return None if count >= UNREACHABLE else count

    def completion_token_floor(self) -> int | None:
        """A lower bound on `completion_token_count()` that walks nothing (the program's bound on
        the distance over the vocabulary's longest token), for a quick "cannot fit in N
        tokens"; None where no input completes the grammar."""
        if self._terminated:
            return 0
        floor = self.compiled.completions.token_floor(self._state)
        return None if floor >= UNREACHABLE else floor

    def overlong_tokens(self, limit: int) -> np.ndarray:
        """The allowed tokens after which `completion_token_count()` would be more than
        `limit` (or None): those a host that cannot take a token back must not sample when
        `limit + 1` tokens are left (see `Completions.overlong_tokens`)."""
        if self._terminated:
            return np.zeros(0, dtype=np.int64)
        return self.compiled.completions.overlong_tokens(self._state, limit)

    def fill_closing_bitmask(self, bitmask: Any, index: int, remaining: int) -> None:
        """Write into row `index` the tokens that close the output within `remaining` tokens
        (this one included): allowed tokens that lower `completion_distance` and leave a
        completion of at most `remaining - 1` tokens (`completion_token_count`); where the
        distance is 0, the stop tokens that end the output here (not one the grammar also reads
        as a symbol and would go on with: then none, and the output can only be cut here).

        With `remaining >= completion_token_count() > 0` the row is never empty (the plan's
        first token is in it) and sampling from such rows ends in a complete parse within the
        budget; with less, the row is that of `remaining = completion_token_count()` (the
        quickest way to a complete parse). No tokens where no input completes the grammar."""
        if bitmask is not self._bitmask:
            self._bind(bitmask)
        compiled = self.compiled
        count = self.completion_token_count()
        if count is None or self._terminated:
            tokens: Sequence[int] = []
        elif count == 0:
            tokens = [t for t in compiled._mask_stop_ids if t in compiled.stop_ids
                      or compiled.state_after_token(self._state, t) == DEAD]
        else:
            candidates, lengths = compiled.completions.closing_candidates(self._state)
            tokens = candidates[lengths <= max(remaining, count) - 1]
        self._copy_row(pack_token_ids(tokens, compiled.vocab.size), index)

    def _bind(self, bitmask: Any) -> None:
        self._bitmask = bitmask
        view = bitmask.numpy() if hasattr(bitmask, "numpy") else bitmask
        self._bitmask_view = view
        if view.ndim == 2 and view.dtype == np.int32 and view.flags.c_contiguous:
            self._bitmask_bytes = memoryview(view).cast("B")
            self._row_count, self._row_bytes = view.shape[0], view.shape[1] * 4
        else:
            self._bitmask_bytes, self._row_count, self._row_bytes = None, 0, 0
        self._row_index = None  # the row slice was for the bitmask bound before

    def accept_token(self, token_id: int) -> bool:
        """Advance by one token; returns False (state unchanged) if it is not allowed."""
        if self._terminated:
            return False
        compiled, state = self.compiled, self._state
        nxt = compiled._token_next[state].get(token_id)
        if nxt is None:
            if token_id in compiled.stop_ids and compiled._accepting[state]:
                return self._stop()
            nxt = compiled.state_after_token(state, token_id)
            if nxt == DEAD:
                if token_id in compiled._symbol_stop_ids and compiled._accepting[state]:
                    return self._stop()
                return False
            compiled._token_next[state][token_id] = nxt
            compiled._token_next_count += 1
        self._history.append(nxt)
        self._state = nxt
        return True

    def _stop(self) -> bool:
        self._history.append(self._state)
        self._terminated, self._state = True, DEAD
        return True

    @property
    def stopped(self) -> bool:
        """Whether a stop token ended the generation (it is not part of the output)."""
        return self._terminated

    def accept_tokens(self, token_ids: Sequence[int]) -> bool:
        """Accept several tokens; on the first rejected one, undo them all and return False."""
        for count, token_id in enumerate(token_ids):
            if not self.accept_token(token_id):
                self.rollback(count)
                return False
        return True

    def accept_string(self, text: str | bytes) -> bool:
        """Advance by raw text bytes (used for jump-forward); False and no change if rejected."""
        if self._terminated:
            return False
        data = text.encode() if isinstance(text, str) else text
        state = self._state
        for byte in data:
            state = self.compiled.next_state(state, byte)
            if state == DEAD:
                return False
        self._history.append(state)
        self._state = state
        return True

    def rollback(self, num_tokens: int = 1) -> None:
        """Undo the last `num_tokens` accepted tokens (or strings)."""
        if num_tokens < 0 or num_tokens >= len(self._history):
            raise ValueError(f"cannot roll back {num_tokens} tokens (have {len(self._history) - 1})")
        if num_tokens:
            del self._history[-num_tokens:]
            self._terminated = False
            self._state = self._history[-1]

    def is_terminated(self) -> bool:
        """True after a stop token was accepted, or when the grammar is complete and nothing
        more can follow."""
        state = self.state
        return self._terminated or (
            self.compiled.is_accepting(state) and not self.compiled.can_continue(state)
        )

    def is_accepting(self) -> bool:
        """True when the output so far is a complete sentence of the grammar."""
        return self.compiled.is_accepting(self.state)

    def find_jump_forward_string(self, limit: int = 4096) -> bytes:
        """The bytes that every continuation must start with (jump-forward decoding)."""
        compiled = self.compiled
        state = self.state
        forced = bytearray()
        while len(forced) < limit:
            byte = compiled.forced_bytes(state)
            if byte is None:
                break
            forced += byte
            state = compiled.next_state(state, byte[0])
        return bytes(forced)


def fill_next_token_bitmasks(matchers: Sequence[GrammarMatcher], bitmask: Any) -> list[bool]:
    """Fill one bitmask row per matcher (row i for matchers[i]); returns each row's `need`."""
    return [m.fill_next_token_bitmask(bitmask, i) for i, m in enumerate(matchers)]
