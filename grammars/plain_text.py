"""Plain text: how many plain characters (`token_trie.is_plain_text`: no control character,
`"` or `\\`) a configuration survives, so that mask walks need not read plain tokens one by one.

Where no plain text dies (inside a JSON string, free text) every plain token is allowed at
once (`TokenMasks`); where some dies only after a few characters (a string of bounded length),
a walk of the vocabulary trie allows every plain token below a node whose longest token after
it is not longer (`TrieWalk`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pegmask.grammars.configurations import DEAD, Configurations, Threads, _bits
from pegmask.grammars.token_trie import PLAIN_ASCII, PLAIN_MULTIBYTE

if TYPE_CHECKING:
    from pegmask.grammars.grammar import Grammar
    from pegmask.grammars.vocab import Vocabulary

_PLAIN_SEARCH = 64  # configurations a search for plain text that dies may visit ...
_LOOP_AHEAD_SEARCH = 8  # ... and one from where text leads on to a loop (see `_plain_depth`)
_FRAME_SEARCH = 1024  # ... and one for the threads of one frame (see `_one_frame_survives`)
_PLAIN_DEPTH = 32  # characters it looks ahead for one that dies, at most
_PLAIN_DEPTH_USEFUL = 8  # fewer let walks cut nowhere: not worth searching UTF-8 sequences
_PLAIN_ALWAYS = 32767  # its answer where none dies


class PlainText(Configurations):
    """How much plain text each configuration survives (the second layer of
    `CompiledGrammar`)."""

    def __init__(self, grammar: Grammar, vocab: Vocabulary, max_depth: int):
        super().__init__(grammar, vocab, max_depth)
        self._plain_ascii = tuple(b for b in PLAIN_ASCII if b not in self.lexer.first_bytes)
        self._plain_ascii_bits = _bits(self._plain_ascii)
        self._multibyte_spelled = any(b >= 0x80 for b in self.lexer.first_bytes)
        self._ascii_next: dict[int, set[int] | None] = {}  # see `_after_plain_ascii`
        self._undecided: set[int] = set()  # short searches that gave up
        self._multibyte_next: dict[int, set[int] | None] = {}  # `_after_plain_multibyte`
        self._frames_at_depth: dict[int, int] = {}  # see `_framed`
        self._multibyte_pcs: dict[int, tuple[tuple[int, ...], ...] | None] = {}  # see `_multibyte_targets`

    def _plain_text_stays_alive(self, config: int) -> bool:
        """Whether no plain text (see `token_trie.is_plain_text`) leads from `config` to DEAD,
        so that every plain token is allowed from it."""
        return self._plain_depth(config) == _PLAIN_ALWAYS

    def _plain_depth(self, config: int, search: int | None = None) -> int:
        """How many plain characters any plain text can read from `config` without dying (a
        lower bound, at most `_PLAIN_DEPTH`), `_PLAIN_ALWAYS` where no plain text dies: a walk
        allows every plain token below a node whose longest token after it is not longer
        (`TokenTrie.height`).

        Found by a breadth-first search of the configurations that plain characters reach:
        inside a JSON string or free text that is `config` itself; in a pattern such as
        `^.+\\.(csv|tsv)$` or a key that counts hex digits a few dozen; in a string of bounded
        length one per character up to its bound. ASCII steps are per group of bytes the
        same threads accept, UTF-8 sequences on thread sets. Every configuration of a search
        where nothing dies is `_PLAIN_ALWAYS` too; a search stops at the first character
        that may die, and one past `_PLAIN_SEARCH` configurations at that depth. Where a
        plain ASCII byte leads on to another configuration that loops on ASCII, a search
        past `_LOOP_AHEAD_SEARCH` gives up (0, not kept: other searches may cross it).
        `search` sets a limit of configurations instead, for a search that never gives up
        (`_one_frame_survives`).
        """
        known = int(self._plain_depths[config])
        if known >= 0:
            return known
        after = self._after_plain_ascii(config)
        # Text that leads on to a configuration that loops on it gets a short search: a key
        # beside a pattern's keys (a few configurations) is decided by it; one beside the
        # properties' names is not (but one frame of it may be), and walks stop at the loop,
        # at less cost than a search of every name.
        short = search is None and after is not None and after != {config} and any(
            self._after_plain_ascii(nxt) == {nxt} for nxt in after if nxt != config)
        if short and config in self._undecided:
            return 0
        if short and self._one_frame_survives(config):
            self._plain_depths[config] = _PLAIN_ALWAYS
            return _PLAIN_ALWAYS
        limit = search or (_LOOP_AHEAD_SEARCH if short else _PLAIN_SEARCH)
        dies, complete = self._ascii_look_ahead(config, _PLAIN_DEPTH_USEFUL, limit)
        if dies:
            self._plain_depths[config] = 0  # a lower bound: walks cut nowhere near it anyway
            return 0
        if short and not complete:
            self._undecided.add(config)
            return 0
        level = {config: 0}
        order = [config]  # grows while it is read: levels never decrease
        depth = _PLAIN_ALWAYS
        for current in order:
            here = level[current]
            if here >= min(depth, _PLAIN_DEPTH):
                depth = min(depth, here)
                break
            ascii_next = self._after_plain_ascii(current)
            multibyte_next = None if ascii_next is None else self._after_plain_multibyte(current)
            if ascii_next is None or multibyte_next is None:  # a character dies after `here`
                depth = here
                break
            for nxt in ascii_next | multibyte_next:
                known = int(self._plain_depths[nxt])  # (grown as configurations are made)
                if nxt in level or known == _PLAIN_ALWAYS:
                    continue
                if known >= 0:
                    depth = min(depth, here + 1 + known)
                elif len(order) < limit:
                    level[nxt] = here + 1
                    order.append(nxt)
                elif short:
                    self._undecided.add(config)
                    return 0
                else:
                    depth = min(depth, here + 1)
        if depth == _PLAIN_ALWAYS:
            self._plain_depths[order] = _PLAIN_ALWAYS
        else:
            self._plain_depths[config] = depth
        return depth

    def _one_frame_survives(self, config: int) -> bool:
        """Whether the threads of `config` at or above the deepest frame of their call stacks
        (a rule call and what it calls) whose threads read every plain ASCII byte, when not
        all of them, survive all plain text by themselves (see `_framed`): then `config`
        does too.

        A key beside the properties' names is such a configuration: its "any other key"
        threads are one rule's (the object's extra member, with the character rules it
        calls), and plain text never kills them; the names' threads die soon. The search of
        `_plain_depth` from the configuration itself visits every prefix of every name, at
        each key; that of the extra member's threads is the same at every key of the
        object, and made once."""
        threads = self._threads[config]
        if len(threads) < 2 or self._lexed:  # (held bytes live on where the input may end)
            return False
        parent, depth = self.runtime.stacks.parent, self.runtime.stacks.depth
        accept_bits = self._accept_bits
        covered: dict[int, int] = {}  # frame -> bytes its threads (at or above it) read
        for pc, stack in threads:
            bits = accept_bits[pc]
            while stack:
                covered[stack] = covered.get(stack, 0) | bits
                stack = parent[stack]
        wanted = self._plain_ascii_bits
        frames = [frame for frame, bits in covered.items() if not wanted & ~bits]
        if not frames:
            return False
        # The deepest such frame only: the frames below it hold more threads, and searching
        # each of them too multiplied the searches where names are many (hundreds of rules).
        framed = self._framed(threads, max(frames, key=depth.__getitem__))
        return framed is not None and self._plain_depth(framed, _FRAME_SEARCH) == _PLAIN_ALWAYS

    def _framed(self, threads: Threads, frame: int) -> int | None:
        """The configuration of the `threads` at or above `frame`, with `frame` and the frames
        below it replaced by as many that return to MATCH (the end of the input); None when
        that is all of them. Up to their return from `frame` they read what they read on
        their own stacks, and nothing after it: whatever plain text they survive, `threads`
        survive too (and calls meet the depth limit at the same depth)."""
        stacks = self.runtime.stacks
        parent, depth, ret = stacks.parent, stacks.depth, stacks.ret
        level = depth[frame]
        base = self._frames_at_depth.get(level)
        if base is None:
            end = self.program.aux[self.program.start]  # the MATCH after the start rule's call
            base = 0
            for _ in range(level):
                base = stacks.push(end, base)
            self._frames_at_depth[level] = base
        moved = []
        for pc, stack in threads:
            above = []
            while depth[stack] > level:
                above.append(ret[stack])
                stack = parent[stack]
            if stack == frame:
                stack = base
                for address in reversed(above):
                    stack = stacks.push(address, stack)
                moved.append((pc, stack))
        return None if len(moved) == len(threads) else self._intern(tuple(moved), False)

    def _ascii_look_ahead(self, config: int, characters: int, limit: int) -> tuple[bool, bool]:
        """(whether some plain ASCII text of at most `characters` bytes leads `config` to DEAD,
        whether the configurations shorter texts reach are at most `limit`): where text
        dies soon (a pattern's states) or branches widely (keys beside the properties'
        names), `_plain_depth` needs no search of UTF-8 sequences."""
        level = {config: 0}
        order = [config]
        for current in order:
            if level[current] == characters:
                break
            reached = self._after_plain_ascii(current)
            if reached is None:
                return True, True
            for nxt in reached:
                if nxt not in level and self._plain_depths[nxt] != _PLAIN_ALWAYS:
                    if len(order) == limit:
                        return False, False
                    level[nxt] = level[current] + 1
                    order.append(nxt)
        return False, True

    def _loops_on_plain_text(self, config: int) -> bool:
        """Whether every plain character leads `config` back to itself (inside a string)."""
        return (self._after_plain_ascii(config) == {config}
                and self._after_plain_multibyte(config) == {config})

    def _after_plain_ascii(self, config: int) -> set[int] | None:
        """The configurations that one plain ASCII byte leads `config` to; None when one leads
        to DEAD (or `config` holds bytes back for a spelled special). Memoized, as searches
        that give up cross the same configurations again.

        Computed per group of bytes that the same threads accept (one closure each, often a
        single group), and kept as those bytes' transitions, without the rest of the row."""
        if config in self._ascii_next:
            return self._ascii_next[config]
        result = None
        if not (self._plain_ascii_bits & ~self._live_bits[config] or self._held[config]):
            row = self._thread_rows[config]
            result = set()
            for group, nxt in self._group_steps(config, self._plain_ascii_bits):
                result.add(nxt)
                for byte in group:
                    row[byte] = nxt
                if not self._lexed:
                    self._table[config, group] = nxt
        self._ascii_next[config] = result
        return result

    def _after_plain_multibyte(self, config: int) -> set[int] | None:
        """The configurations that one plain non-ASCII character leads `config` to; None when
        one leads to DEAD. Memoized: it costs a few dozen closures."""
        if config in self._multibyte_next:
            return self._multibyte_next[config]
        reached = self._threads_after_multibyte(config)
        if reached is None:  # decided on the lexed transitions, configuration by configuration
            reached = set()
            for sequence in PLAIN_MULTIBYTE:
                states = {config}
                for lo, hi in sequence:
                    states = {nxt for s in states for nxt in self._row(s)[lo : hi + 1]}
                    if DEAD in states:
                        break
                reached |= states
        result = None if DEAD in reached else reached
        self._multibyte_next[config] = result
        return result

    def _threads_after_multibyte(self, config: int) -> set[int] | None:
        """`_after_plain_multibyte` on thread sets, with DEAD for a character that dies: each
        byte range of a plain UTF-8 sequence moves the threads that accept all of it, and no
        configuration is made for the states inside a character (a string at a new call site
        would make a dozen). None when that cannot decide: a thread accepts part of a range,
        or a byte may start a spelled special.

        Where the bytes of a character are read by instructions that lead to one another (a
        character class), the threads are followed to the end of each sequence by
        `_multibyte_targets`, and only there closed on their stacks."""
        if self._multibyte_spelled:
            return None
        bits = self._accept_bits
        # Only threads that read some byte past ASCII take part (most threads of a large
        # object's keys read only letters).
        threads = tuple([thread for thread in self._threads[config] if bits[thread[0]] >> 0x80])
        targets = [self._multibyte_targets(pc) for pc, _ in threads]
        if None in targets:
            return self._threads_after_multibyte_stepwise(threads)
        found = set()
        for sequence in range(len(PLAIN_MULTIBYTE)):
            seeds = tuple([(target, stack) for (_, stack), ends in zip(threads, targets, strict=True)
                           for target in ends[sequence]])
            if not seeds:
                return {DEAD}
            found.add(self._intern_closure(seeds))
        return found

    def _multibyte_targets(self, pc: int) -> tuple[tuple[int, ...], ...] | None:
        """Per plain UTF-8 sequence, the instructions that a thread waiting at `pc` goes to
        after the sequence's last byte, where each of its other bytes leads to instructions
        that wait for the next one (with no call or return between them: the same on every
        stack, so found once per instruction); None where one does not, or where one
        accepts part of a byte range (see `_threads_after_multibyte_stepwise`)."""
        if pc in self._multibyte_pcs:
            return self._multibyte_pcs[pc]
        parks = self.program.parks
        found: list[tuple[int, ...]] | None = []
        for sequence in PLAIN_MULTIBYTE:
            current: tuple[int, ...] = (pc,)
            for index, (lo, hi) in enumerate(sequence):
                reached: dict[int, None] = {}
                for at in current:
                    targets = self._range_targets(at, lo, hi)
                    if targets is None:
                        found = None
                        break
                    reached.update(dict.fromkeys(targets))
                current = tuple(reached)
                if found is None or (index + 1 < len(sequence)
                                     and not all(parks[at] for at in current)):
                    found = None
                    break
            if found is None:
                break
            found.append(current)
        result = None if found is None else tuple(found)
        self._multibyte_pcs[pc] = result
        return result

    def _range_targets(self, pc: int, lo: int, hi: int) -> list[int] | None:
        """Where a thread waiting at `pc` goes on any byte from `lo` to `hi` (the instructions
        after its BYTEs that accept all of them); None where one accepts only some."""
        bits, arg, span = self._accept_bits, self.program.arg, ((1 << (hi - lo + 1)) - 1) << lo
        targets = []
        for leaf in self._leaves[pc]:
            accepted = bits[leaf] & span
            if accepted == span:
                targets.append(arg[leaf])
            elif accepted:
                return None
        return targets

    def _threads_after_multibyte_stepwise(self, threads: Threads) -> set[int] | None:
        """`_threads_after_multibyte` by closures after every byte range."""
        # By thread set and range: sequences whose lead bytes lead to the same instruction
        # (the compiler shares continuations) share the steps after it.
        moved: dict[tuple, tuple[Threads, bool]] = {}
        ends: set[tuple[Threads, bool]] = set()
        for sequence in PLAIN_MULTIBYTE:
            current, matched = threads, False
            for lo, hi in sequence:
                known = moved.get((current, lo, hi))
                if known is None:
                    seeds = []
                    for pc, stack in current:
                        targets = self._range_targets(pc, lo, hi)
                        if targets is None:
                            return None
                        seeds += [(target, stack) for target in targets]
                    if not seeds:
                        return {DEAD}
                    known = moved[current, lo, hi] = self.runtime.reach(tuple(seeds))
                current, matched = known
            ends.add((current, matched))
        return {self._intern(current, matched) for current, matched in ends}
