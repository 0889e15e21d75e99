"""`GrammarLimits`: the size budgets a grammar is compiled and closed under.

Why: a request chooses its grammar, so a grammar's cost must be bounded by the server, not by
the request: a count such as `minLength: 1000000000` must give an error (`GrammarTooLarge`,
a 400 on the server) or a compact grammar, never a process that grows until it is killed.
Counted repetitions compile to O(log n) instructions (`pegmask.grammars.counted`), so what is
left to bound is the program's size and how far the closing computations walk
(`pegmask.grammars.completion`). The time a compilation may take is the compile service's.
"""

from __future__ import annotations

from dataclasses import dataclass

from pegmask.grammars.errors import GrammarTooLarge


@dataclass(frozen=True)
class GrammarLimits:
    """`max_instructions`: the most instructions a compiled program may have (checked on an
    estimate before any is emitted). `max_completion_length`: the longest shortest completion,
    in symbols (bytes, special tokens), that the closing computations (`completion_distance`,
    `completion_tokens`, the closing mask) walk; each symbol of it makes a configuration of
    the token automaton (about 3 KB)."""

    max_instructions: int = 400_000
    max_completion_length: int = 100_000

    def __post_init__(self) -> None:
        for name in ("max_instructions", "max_completion_length"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"GrammarLimits.{name} must be a positive integer, not {value!r}")

    def check(self, limit: str, value: int, what: str) -> None:
        """Raise `GrammarTooLarge` where `value` is past the budget named `limit`."""
        allowed = getattr(self, limit)
        if value > allowed:
            flag = "--grammar-" + limit.replace("_", "-")
            raise GrammarTooLarge(
                limit, f"grammar too large: {what} ({value} > {limit}={allowed}; raise it with "
                f"GrammarLimits({limit}=...), Engine(grammar_limits=...) or "
                f"`pegmask serve {flag}`)", allowed=allowed, value=value)


DEFAULT_LIMITS = GrammarLimits()
