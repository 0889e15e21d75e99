"""What a chat template's assistant turn looks like, read off the template's own renderings of
probe conversations: `derive_format(template) -> TurnFormat` (`DerivationError` names what
cannot be derived); `pegmask.dialects.derive` writes a dialect's grammar from it.

The probes are conversations whose assistant turn holds distinctive text: a content
(`PGCONTENT`), a reasoning (`PGREASON`), one call, a call without arguments, two calls (of
`pgfn_one` and `pgfn_two`, ids `pgcallida` / `pgcallidb`) and a call with a nested argument. Each
turn is the text the template writes after the generation prompt; their differences give:

* the end of the turn (the first token after the content) and the reasoning delimiters;
* the call section: the text before the first call (`open`), between calls (`sep`) and after
  the last (`close`), found by diffing one call against two (the calls' text repeats); a
  template that cannot write two calls (Llama 3.1's raises) gets a one-call format
  (`parallel` False: its grammar allows one call a turn);
* a call's framing around its name: the text before it (`head`) and after it; in that text, the
  arguments are a JSON object (after the name, or in one object with the name, in either order,
  beside members holding the call's id or index), or key/value parameters whose framing
  (`param_open` KEY `param_mid` VALUE `param_close`) is diffed from a call with two arguments
  and one with none; where the framing types the value (DSML's `string="false"`), `json_mid`
  stands for `param_mid` before values other than strings;
* call ids (`pgcallida`) and indices (0/1 or 1/2 where the calls differ) the framing holds;
* string values between a quote token that ends `param_mid` and starts `param_close` (Gemma 4's
  `key:<|"|>value<|"|>`), other values in that quote's JSON dialect (`quoted_values`);
* reasoning a template writes before calls only (Gemma 4's), content it writes after the calls
  (`content_after_calls`) or in a turn before theirs (`content_own_turn`), and a content addressed like a call (Functionary v3.2's `all\n`,
  parts separated by `sep`, the prompt opening the first: `addressed`).

A call that is a bare JSON object (no marker before it: Llama 3's, Phi-4 mini's template) is a
whole turn: the object's `{` triggers it, and an answer cannot start with one (`calls_alone`).
Where the history's rendering drops the start of the generation prompt's header (Mistral Nemo
moves the system message into the last user turn), the turn starts after the header's end.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pegmask.dialects import quoted_values
from pegmask.dialects.pythonic import faithful
from pegmask.dialects.textdiff import (
    TOKEN,
    common_prefix,
    common_suffix,
    find_json,
    first_token,
    header_overlap,
    json_at,
    token_spans,
)

#: framing placeholders: the call's id and its index (as the template writes them)
ID_SLOT = "\ue000"
INDEX_SLOT = "\ue001"

_CONTENT, _REASON = "PGCONTENT", "PGREASON"
_NAMES = ("pgfn_one", "pgfn_two")
_IDS = ("pgcallida", "pgcallidb")  # nine alphanumerics: Mistral's templates check the shape
_STRINGS = {"pgk_a": "pgv_a", "pgk_b": "pgv_b"}
_NESTED = {"x": [1, True, None]}
_NESTED_ARGS = {"pgk_a": "pgv_a", "pgk_n": _NESTED, "pgk_z": None}
_PROPERTIES = {"pgk_a": {"type": "string"}, "pgk_b": {"type": "string"},
               "pgk_n": {"type": "object"}}  # (a "null" type sends Hermes 2 Pro's into a loop)
_TOOLS = [{"type": "function", "function": {
    "name": name, "description": "Probe.",
    "parameters": {"type": "object", "properties": _PROPERTIES, "required": []}}}
    for name in _NAMES]
_HISTORY = [{"role": "system", "content": "System."}, {"role": "user", "content": "Question?"}]


class DerivationError(ValueError):
    """A chat template whose assistant turn could not be derived; the message says what."""


# --------------------------------------------------------------------------- what is derived
@dataclass(frozen=True)
class TurnFormat:
    """An assistant turn's structure, as derived from a template. Framing strings may hold
    `ID_SLOT` / `INDEX_SLOT`."""

    eos: tuple[str, ...]  # what ends a turn (special tokens)
    think_open: str | None  # reasoning delimiters (None: the template writes no reasoning)
    think_close: str | None
    reasoning_default: bool | None  # True: the generation prompt opens reasoning
    open: str  # before the first call of a turn
    sep: str  # between calls
    close: str  # after the last call
    head: str  # a call's framing before its name (or before its JSON object)
    # "object" (one JSON object with the name), "json" (after the name), "params", "python"
    # (a pythonic call list: `open` ends with "[", `close` starts with "]")
    arguments: str
    tail: str = ""  # a call's framing after its arguments (or its parameters)
    mid: str = ""  # json: between the name and the arguments; params: after the name
    # object: its members in order, (key, "name" | "arguments" | a fixed value's JSON text,
    # which holds a slot: Mistral Nemo's `"id": "{id}"`, Command R7B's `"tool_call_id": "{index}"`)
    members: tuple[tuple[str, str], ...] = (("name", "name"), ("arguments", "arguments"))
    param_open: str = ""  # params: KEY between param_open and param_mid, then the value,
    param_mid: str = ""  # then param_close; parameters joined by param_sep
    param_close: str = ""
    param_sep: str = ""
    # params: how non-string values are written: "json", "python" (`str(value)`), "mixed"
    # (nested values as JSON, booleans and null as Python: `True`, `None`) or "quoted" (strings
    # between the `quote` token, other values in a JSON dialect of bare, sorted keys: quoted_values);
    # python: "literals" (the template writes every value back as one) or "rewritten" (it
    # does not: past calls are written into the content as a model writes them)
    values: str = "json"
    quote: str | None = None
    # params: what stands for param_mid before a value other than a string, where the framing
    # types values (DSML's `string="false"` where strings have `string="true"`)
    json_mid: str | None = None
    # the tokens a turn's content is wrapped in (Command R7B's <|START_RESPONSE|> ...
    # <|END_RESPONSE|>), None: the content is written as it is
    content: tuple[str, str] | None = None
    parallel: bool = True  # False: the template writes at most one call in a turn
    # True: the template writes a turn's content after its calls (Gemma 4's past turns), where
    # a model writes it before them: the grammar reads content before calls only
    content_after_calls: bool = False
    # True: the template ends a turn after its content and writes the calls in a turn of their
    # own (Nemotron Nano v2's), where a model writes both in one: the grammar reads them so
    content_own_turn: bool = False
    # the text a turn's content is addressed with, as a call with its name (Functionary v3.2's
    # `all\n`): parts of a turn are separated by `sep`, and the generation prompt opens the
    # first (None: the content is not addressed)
    recipient: str | None = None
    # the longest whitespace the template writes as layout (a turn's start, around its call
    # section): the strict grammar's framing whitespace reaches that far (vLLM's R1 template
    # starts a turn with 20 spaces of its own indentation)
    layout: int = 4
    notes: tuple[str, ...] = field(default=())

    @property
    def bare(self) -> bool:
        """Whether a turn's calls start with no marker: a bare JSON object (Llama 3's, Phi-4
        mini's template). Such a turn is an answer or calls, never both."""
        return self.arguments == "object" and not (self.open + self.head).strip()

    def describe(self) -> str:
        """What was derived, one line a part (what `pegmask dialect TEMPLATE` prints)."""
        def show(text: str | None) -> str:
            if text is None:
                return "-"
            return repr(text.replace(ID_SLOT, "{id}").replace(INDEX_SLOT, "{index}"))

        lines = [f"end of turn:  {' | '.join(map(show, self.eos)) or '-'}",
                 f"reasoning:    {show(self.think_open)} ... {show(self.think_close)}"
                 f" (default: {self.reasoning_default})",
                 f"call section: {show(self.open)} call ({show(self.sep)} call)* "
                 f"{show(self.close)}" + ("" if self.parallel else " (one call a turn)")]
        if self.content is not None:
            lines.append(f"content:      {show(self.content[0])} CONTENT {show(self.content[1])}")
        if self.layout > 4:
            lines.append(f"layout:       up to {self.layout} whitespace characters")
        if self.recipient is not None:
            lines.append(f"content:      {show(self.recipient)} CONTENT ({show(self.sep)} "
                         f"calls)?, the prompt opening the first part")
        if self.arguments == "object":
            members = ", ".join(f"{key!r}: " + (f"{{{value}}}" if value in ("name", "arguments")
                                                  else show(value))
                                for key, value in self.members)
            lines.append(f"call:         {show(self.head)} {{{members}}} {show(self.tail)}")
        elif self.arguments == "python":
            back = "as the template writes them" if self.values == "literals" else \
                "written into the content: the template writes them otherwise"
            lines.append(f"call:         NAME(KEY=VALUE, ...) in a Python list, values as Python "
                         f"literals (past calls {back})")
        elif self.arguments == "json":
            lines.append(f"call:         {show(self.head)} NAME {show(self.mid)} "
                         f"JSON-ARGUMENTS {show(self.tail)}")
        else:
            lines.append(f"call:         {show(self.head)} NAME {show(self.mid)} "
                         f"(PARAMETER ({show(self.param_sep)} PARAMETER)*)? {show(self.tail)}")
            lines.append(f"parameter:    {show(self.param_open)} KEY {show(self.param_mid)} "
                         f"VALUE {show(self.param_close)} (values other than strings: "
                         f"{self.values}" + (f", after {show(self.json_mid)})" if self.json_mid
                                             else f", strings in {show(self.quote)})"
                                             if self.quote else ")"))
        lines += [f"note:         {note}" for note in self.notes]
        return "\n".join(lines)


# --------------------------------------------------------------------------- the probes
class _Probes:
    """Renders assistant turns of the probe conversation with one template."""

    def __init__(self, template: str, template_kwargs: dict[str, Any]):
        from pegmask.dialects.templating import render_chat_template

        self.template = template
        self.kwargs = template_kwargs
        self._render_template = render_chat_template
        self.header = ""  # the generation prompt's turn header (of the last turn rendered)

    def _render(self, messages: list[dict[str, Any]], prompt: bool) -> str:
        return self._render_template(self.template, messages, tools=_TOOLS,
                                     add_generation_prompt=prompt, **self.kwargs)

    def turn(self, message: dict[str, Any]) -> str:
        """The text of `message` as the template writes it after the generation prompt (to the
        end of the rendering)."""
        before = self._render(_HISTORY, False)
        prompt = self._render(_HISTORY, True)
        full = self._render([*_HISTORY, message], False)
        shared = common_prefix(full, before)
        header, region = prompt[shared:], full[shared:]
        self.header = header
        return region[header_overlap(region, header):]

    def end_before_next(self, message: dict[str, Any]) -> str | None:
        """The token after `message`'s content where a user turn follows it: the end of a
        turn that a template writes only before another (Hy3's, GLM's next header)."""
        try:
            text = self._render([*_HISTORY, message, {"role": "user", "content": "Again?"}],
                                False)
        except Exception:  # noqa: BLE001 - a template may fail in any way
            return None
        return first_token(text.split(_CONTENT, 1)[1]) if _CONTENT in text else None

    def with_call(self, marker: str, **fields: str) -> str:
        """The turn of a message with `fields` (content, reasoning_content) and one call
        (arguments as an object, else as JSON text), "" if none renders both the call and
        `marker`."""
        for arguments in (_STRINGS, json.dumps(_STRINGS)):
            message = {"role": "assistant", "content": "", **fields, "tool_calls": [
                {"id": _IDS[0], "type": "function",
                 "function": {"name": _NAMES[0], "arguments": arguments}}]}
            try:
                text = self.turn(message)
            except Exception:  # noqa: BLE001, S112 - a template may fail in any way
                continue
            if marker in text and _NAMES[0] in text:
                return text
        return ""

    def calls(self, calls: Sequence[tuple[str, dict[str, Any]]]) -> str:
        """The turn of a message holding only `calls`: arguments as an object, else as JSON
        text, content "" else None (templates expect one or the other); "" if none renders
        the names. One that writes an object's arguments as a Python literal (Apriel's
        `{'a': 'b'}`: the template wants JSON text) gives way to the next."""
        named = ""
        for as_text in (False, True):
            for content in ("", None):
                message = {"role": "assistant", "content": content, "tool_calls": [
                    {"id": _IDS[i], "type": "function",
                     "function": {"name": name, "arguments": json.dumps(args) if as_text
                                  else args}} for i, (name, args) in enumerate(calls)]}
                try:
                    text = self.turn(message)
                except Exception:  # noqa: BLE001, S112 - a template may fail in any way
                    continue
                if not all(name in text for name, _ in calls):
                    continue
                if not any(args and repr(args) in text for _, args in calls):
                    return text
                named = named or text
        return named


# --------------------------------------------------------------------------- derivation
def derive_format(template: str, **template_kwargs: Any) -> TurnFormat:
    """The turn structure `template` writes (`template_kwargs`: its variables, e.g.
    `eos_token`, which some templates end a turn with); `DerivationError` says what fails."""
    return _derive(template, tuple(sorted(template_kwargs.items())))


@functools.lru_cache(maxsize=32)
def _derive(template: str, kwargs: tuple[tuple[str, Any], ...]) -> TurnFormat:
    probes = _Probes(template, {"bos_token": "", "eos_token": "", **dict(kwargs)})
    try:
        text = probes.turn({"role": "assistant", "content": _CONTENT})
    except Exception as exc:
        raise DerivationError(f"the template cannot render an assistant turn: {exc}") from exc
    if _CONTENT not in text:
        raise DerivationError("the template does not write an assistant turn's content")
    before, after = text.split(_CONTENT, 1)
    notes: list[str] = []
    think_open, think_close, default = _reasoning(probes, before, after)
    if think_close is not None:
        before = before.replace(think_close, "").replace(think_open or think_close, "")
    content = _content_framing(before, after)
    recipient = None  # text before the content: the content may be addressed like a call
    if content is not None:
        after = after[after.index(content[1]) + len(content[1]):]
    elif before.strip() and TOKEN.search(before) is None:
        recipient = before
    elif before.strip():
        raise DerivationError(f"the template writes {before.strip()!r} before a turn's content")
    # the end of a turn is a special token, whether or not it looks like a tag ("[e~[")
    end = first_token(after) or next(iter(after.split()), None) \
        or probes.end_before_next({"role": "assistant", "content": _CONTENT})

    one = probes.calls([(_NAMES[0], _STRINGS)])
    if not one:
        raise DerivationError("the template writes no tool calls (a call's name is not in its "
                              "rendering)")
    two = probes.calls([(_NAMES[0], _STRINGS), (_NAMES[1], _STRINGS)])
    section_one, ends = _section(one, text, after, end)
    if two:
        section_two, _ = _section(two, text, after, end)
        if section_two.count(_NAMES[0]) != 1 or section_two.count(_NAMES[1]) != 1:
            raise DerivationError("the template writes a call's name more than once")
        open_, head, tail_one, sep, close = _calls_layout(section_one, section_two)
    else:
        open_, head, tail_one, sep, close = _single_call_layout(section_one)
        notes.append("the template writes one call a turn: parallel calls are off")
    eos = tuple(dict.fromkeys(token for token in (end, ends) if token))
    beside = probes.with_call(_CONTENT, content=_CONTENT)
    after_calls = _content_after_calls(beside, eos)
    if after_calls:
        notes.append("the template writes a turn's content after its calls")
    own_turn = _content_in_own_turn(beside, eos)
    if own_turn:
        notes.append("the template writes a turn's content and its calls as two turns")
    if recipient is not None:
        # the prompt opens the first part of the turn: the content's recipient, or a call's
        if (open_ + head).strip() or not sep.strip() or not probes.header.endswith(sep):
            raise DerivationError(f"the template writes {recipient.strip()!r} before a turn's "
                                  f"content")
        notes.append("the content is addressed like a call; the prompt opens the first part")
    common = {"eos": eos, "think_open": think_open, "think_close": think_close,
              "reasoning_default": default, "open": open_, "sep": sep, "close": close,
              "parallel": bool(two), "content": content, "content_after_calls": after_calls,
              "content_own_turn": own_turn,
              "recipient": recipient, "layout": _layout_width(before, _leading_space(one), open_, sep, close),
              "notes": tuple(notes)}
    if not (open_ or head).strip() and recipient is None:
        raise DerivationError("a turn's calls start with no marker (their name comes first)")
    if open_.rstrip().endswith("[") and not head.strip() and tail_one.startswith("("):
        return _python_format(template, tail_one, common)
    found = find_json(head + _NAMES[0] + tail_one, _STRINGS)
    if found is not None:
        return _json_format(head, tail_one, found, common)
    empty = probes.calls([(_NAMES[0], {})])
    if not empty:
        raise DerivationError("the template cannot write a call without arguments")
    nested = probes.calls([(_NAMES[0], _NESTED_ARGS)])
    return _params_format(head, tail_one, _section(empty, text, after, end)[0], nested, common)


def _python_format(template: str, tail: str, common: dict[str, Any]) -> TurnFormat:
    """A pythonic call list, `[name(key=value), ...]` between the framing of `common` (a start
    and an end token, or none: a bare list). Its values are Python literals, as models write
    them: "literals" where the template writes every value of a past call back so, else
    "rewritten" (Llama 3.2's writes strings unquoted, Llama 4's quotes every value): the
    dialect writes past calls into the content as a model does."""
    keys = ", ?".join(re.escape(key) + "=[^,]+" for key in _STRINGS)
    if not re.fullmatch(rf"\(\s*{keys}\s*\)", tail):
        raise DerivationError(f"a pythonic call list whose calls are not by keyword "
                              f"({_NAMES[0]}{tail})")
    start, end = common["open"].rstrip()[:-1].strip(), common["close"].lstrip()[1:].strip()
    if bool(start) != bool(end) or any(text and not TOKEN.fullmatch(text) for text in (start, end)):
        raise DerivationError(f"a pythonic call list framed by other than a start and an end "
                              f"token ({common['open']!r} ... {common['close']!r})")
    values = "literals" if faithful(template) else "rewritten"
    return TurnFormat(head="", arguments="python", values=values, **common)


def _layout_width(*framing: str) -> int:
    """The longest run of whitespace in `framing`, at least the families' bound of 4."""
    return max([4, *(len(run) for text in framing for run in re.findall(r"[ \t\r\n]+", text))])


def _leading_space(text: str) -> str:
    return text[:len(text) - len(text.lstrip())]


def _content_after_calls(turn: str, eos: tuple[str, ...]) -> bool:
    """Whether `turn` (content and a call) writes the content after the call, in the same
    turn (R1's, after an end of turn, is another turn's)."""
    call, content = turn.find(_NAMES[0]), turn.find(_CONTENT)
    return 0 <= call < content and not any(token in turn[call:content] for token in eos)


def _content_in_own_turn(turn: str, eos: tuple[str, ...]) -> bool:
    """Whether `turn` (content and a call) ends a turn after the content and writes the call
    in the next (Nemotron Nano v2's)."""
    call, content = turn.find(_NAMES[0]), turn.find(_CONTENT)
    return 0 <= content < call and any(token in turn[content:call] for token in eos)


def _content_framing(before: str, after: str) -> tuple[str, str] | None:
    """The tokens a template wraps a turn's content in: one token before the content whose
    counterpart ends it (Command R7B's `<|START_RESPONSE|>` ... `<|END_RESPONSE|>`)."""
    opening, closing = before.strip(), first_token(after)
    if closing is None or not TOKEN.fullmatch(opening) or opening not in _openings(closing):
        return None
    return opening, closing


def _reasoning(probes: _Probes, before: str, after: str
               ) -> tuple[str | None, str | None, bool | None]:
    """(opening, closing delimiter, default mode) of reasoning, from a turn with
    reasoning_content beside the content's."""
    try:
        text = probes.turn({"role": "assistant", "content": _CONTENT,
                            "reasoning_content": _REASON})
    except Exception:  # noqa: BLE001 - a template may fail in any way
        return _split_reasoning(probes)
    if _REASON not in text or _CONTENT not in text:
        empty = _EMPTY_BLOCK.fullmatch(before.strip())
        if empty:  # an empty block before every content (Kimi K2 Thinking's past turns)
            return empty.group(1), empty.group(3), None
        split = _split_reasoning(probes)
        # else reasoning the template writes before calls only (Gemma 4's)
        text = probes.with_call(_REASON, reasoning_content=_REASON)
        if split[1] is not None or not text:
            return split
        try:
            return _reasoning_delimiters(probes, text, before)
        except DerivationError:  # (Command R7B's: no reasoning is derived)
            return split
    return _reasoning_delimiters(probes, text, before)


def _reasoning_delimiters(probes: _Probes, text: str, before: str
                          ) -> tuple[str | None, str | None, bool | None]:
    """(opening, closing delimiter, default mode) of the reasoning `text` writes (`before`:
    what the content-only turn writes before its content)."""
    ahead, behind = text.split(_REASON, 1)
    close = first_token(behind)
    if close is None:
        raise DerivationError(f"reasoning is not closed by a special token: {behind[:40]!r}")
    header = probes.header.rstrip()
    named = _named_block(behind.lstrip(), header)
    if named is not None:
        raise DerivationError(f"reasoning is a named block ({named[0]!r} ... {named[1]!r}): a "
                              f"turn of named blocks (reasoning, content, calls, arguments) is "
                              f"not derived")
    for opening in _openings(close):
        prompt_opens = header.endswith(opening)
        if ahead.rstrip().endswith(opening) or prompt_opens:
            # opened in the turn (detected) or by the generation prompt (on)
            return opening, close, True if prompt_opens else None
        if not ahead.strip() and opening in header:
            # opened where the turn and the prompt agree; the prompt may close it (off)
            return _labelled(opening, header), close, False if header.endswith(close) else None
        if ahead.strip().startswith(opening) and _LABEL.fullmatch(ahead.strip()[len(opening):]):
            # opened by the token and a label; the prompt may open it (on)
            opening = ahead.strip()
            return opening, close, True if header.endswith(opening) else \
                False if header.endswith(close) else None
    if not ahead.strip() and before.lstrip().startswith(close):
        # the turn starts inside reasoning: its opening is the prompt's
        return next(iter(_openings(close)), close), close, True
    raise DerivationError(f"reasoning is not opened by a counterpart of {close!r}")


# A word after a token that opens reasoning, naming it (Gemma 4's `<|channel>thought`).
_LABEL = re.compile(r"[A-Za-z_]+")


def _named_block(closing: str, header: str) -> tuple[str, str] | None:
    """(opening, closing) where `closing` starts with a block's closing of the form token,
    name, token, whose opening (another token, the same name and token) ends `header`
    (Kimi K3's `<|open|>think<|sep|>` ... `<|close|>think<|sep|>`), else None."""
    spans = token_spans(closing)
    if len(spans) < 2 or spans[0][0] != 0:
        return None
    name = _LABEL.fullmatch(closing[spans[0][1]:spans[1][0]])
    if name is None:
        return None
    rest = closing[spans[0][1]:spans[1][1]]  # the name and the token after it
    at = len(header) - len(rest)
    opened = [start for start, end in token_spans(header) if end == at]
    if not header.endswith(rest) or not opened or header[opened[0]:at] == closing[:spans[0][1]]:
        return None
    return header[opened[0]:], closing[:spans[1][1]]


def _labelled(opening: str, text: str) -> str:
    """`opening` with the label that follows it where `text` last writes it, if any."""
    label = _LABEL.match(text, text.rindex(opening) + len(opening))
    return opening + label.group() if label else opening

# An empty reasoning block: a tag and its closing counterpart.
_EMPTY_BLOCK = re.compile(r"(<([^<>/\s]+)>)\s*(</\2>)")


def _openings(close: str) -> list[str]:
    """The tags that may open what `close` closes: `</x>` -> `<x>`; `END` -> `START` or
    `BEGIN`, `suffix` -> `prefix` (Command A's `<|START_THINKING|>`, Apertus' `<|inner_prefix|>`)."""
    found = ["<" + close[2:]] if close.startswith("</") else []
    if close.startswith("<") and close.endswith("|>") and not close.startswith("<|"):
        found.append("<|" + close[1:-2] + ">")  # <x|> -> <|x> (Gemma 4's <channel|>)
    for end, start in (("END", "START"), ("END", "BEGIN"), ("end", "start"), ("end", "begin"),
                       ("suffix", "prefix")):
        if end in close:
            found.append(close.replace(end, start, 1))
    return found


# A template that drops reasoning from its history cuts it off the content at its closing tag.
_SPLIT = re.compile(r"""\.split\(\s*(['"])(</[^<>\s'"]+>|\[/[A-Z][A-Z_]*\])\1""")


def _split_reasoning(probes: _Probes) -> tuple[str | None, str | None, bool | None]:
    """Reasoning delimiters of a template that writes no reasoning back (R1, DeepSeek V3.1,
    Nemotron Super): it splits a past turn's content on the closing tag, and its counterpart
    opens reasoning, in the generation prompt (on) or the output (detected)."""
    found = _SPLIT.search(probes.template)
    if found is None:
        return None, None, False
    close = found.group(2)
    opening = close.replace("/", "", 1)
    return opening, close, True if probes.header.rstrip().endswith(opening) else None


def _section(turn: str, text: str, after: str, eos: str | None) -> tuple[str, str | None]:
    """The calls of a calls-only turn, with the token ending it: the turn without what the
    content-only turn also writes before its content and at its end, and without what
    follows the end of turn `eos` after the last call (R1's template writes the turn's
    content after its calls, in an assistant turn of its own)."""
    content_at = text.index(_CONTENT)
    start = min(common_prefix(turn, text), content_at)
    end = len(turn) - min(common_suffix(turn, text), len(after))
    last_call = max(turn.rfind(name) for name in _NAMES)
    if eos and start <= last_call and eos in turn[last_call:end]:
        end = turn.index(eos, last_call)
    section = turn[start:end]
    if not section.strip():
        raise DerivationError("the template writes no calls")
    closing = turn[end:]
    return section.strip(), first_token(closing)


def _calls_layout(one: str, two: str) -> tuple[str, str, str, str, str]:
    """(open, head, text after the first name, sep, close) of the call section, from one call
    and two: a call is `head NAME tail`; ids and indices in head and tail become slots."""
    at_one = one.index(_NAMES[0])
    before, after = one[:at_one], one[at_one + len(_NAMES[0]):]
    first, second = two.index(_NAMES[0]), two.index(_NAMES[1])
    between = two[first + len(_NAMES[0]):second]
    tail = between[:common_prefix(between, after)]
    tail = after[:len(tail)]
    head_length = common_suffix(_masked(before), _masked(between))
    if len(tail) + head_length > len(between):
        head_length = len(between) - len(tail)
    head = before[len(before) - head_length:]
    sep = between[len(tail):len(between) - head_length]
    open_, close = before[:len(before) - head_length], after[len(tail):]
    if not two.startswith(open_ + head) or not two.endswith(close):
        raise DerivationError("two calls are not one call's text repeated")
    head_two = two[second - head_length:second]
    tail_two = two[second + len(_NAMES[1]):len(two) - len(close)]
    slots = [_slots(head, head_two, "before"), _slots(tail, tail_two, "after")]
    return open_, slots[0], slots[1], sep, close


def _single_call_layout(one: str) -> tuple[str, str, str, str, str]:
    """The layout of a template that cannot write two calls in a turn (Llama 3.1's raises
    an exception): the call section is that one call, `head NAME tail`, with no section
    framing of its own (one call cannot tell it from the call's)."""
    at = one.index(_NAMES[0])
    head, tail = (part.replace(_IDS[0], ID_SLOT) for part in (one[:at], one[at + len(_NAMES[0]):]))
    return "", head, tail, "", ""


def _masked(text: str) -> str:
    """`text` with the calls' ids and digits masked (lengths kept): what a call's framing
    shares with the next one's, whose id and index differ (Command R7B's `"tool_call_id": "0"`
    before the name)."""
    for call_id in _IDS:
        text = text.replace(call_id, "\ue002" * len(call_id))
    return re.sub("[0-9]", "\ue003", text)


def _slots(first: str, second: str, where: str) -> str:
    """`first` (the first call's framing) with its id and index as slots, checked against
    `second` (the second call's)."""
    first, second = first.replace(_IDS[0], ID_SLOT), second.replace(_IDS[1], ID_SLOT)
    if first == second:
        return first
    if len(first) == len(second):
        diff = [i for i, (a, b) in enumerate(zip(first, second, strict=True)) if a != b]
        for base in ("0", "1"):
            nxt = str(int(base) + 1)
            if all(first[i] == base and second[i] == nxt for i in diff):
                return "".join(INDEX_SLOT if i in diff else ch for i, ch in enumerate(first))
    raise DerivationError(f"the framing {where} a call's name differs between calls: "
                          f"{first!r} and {second!r}")


def _json_format(head: str, tail: str, found: tuple[int, int],
                 common: dict[str, Any]) -> TurnFormat:
    """A call whose arguments are a JSON object (`found`: where, in the call's text): after
    the name, or with it in one object, in either order (vLLM's Hermes template writes the
    arguments first)."""
    text = head + _NAMES[0] + tail
    args_start, args_end = found
    for match in reversed(list(re.finditer(r"\{", head))):
        value = json_at(text, match.start())
        if value is None or not isinstance(value[0], dict) or value[1] < args_end:
            continue
        obj, obj_end = value
        names = [key for key, item in obj.items() if item == _NAMES[0]]
        arguments = [key for key, item in obj.items() if item == _STRINGS]
        if not names or not arguments:
            continue
        roles = {names[0]: "name", arguments[0]: "arguments"}
        others = sorted(key for key, item in obj.items() if key not in roles
                        and not (isinstance(item, str) and _SLOTTED.fullmatch(item)))
        if others:
            raise DerivationError(f"a call's JSON object holds keys beside its name and "
                                  f"arguments: {others}")
        members = tuple((key, roles.get(key) or json.dumps(item, ensure_ascii=False))
                        for key, item in obj.items())
        return TurnFormat(arguments="object", head=head[:match.start()],
                          tail=text[obj_end:], members=members, **common)
    if _NAMES[0] in text[args_start:args_end]:
        raise DerivationError("a call's name is a key of its arguments' object")
    if '"' + _NAMES[0] + '"' in text:
        raise DerivationError("a call's name is written as JSON outside a JSON object")
    mid = text[len(head) + len(_NAMES[0]):args_start]
    if not mid:
        raise DerivationError("nothing ends a call's name before its arguments")
    return TurnFormat(arguments="json", head=head, mid=mid, tail=text[args_end:], **common)


# A member beside a call's name and arguments that the framing fixes: its id or index.
_SLOTTED = re.compile(f"[{ID_SLOT}{INDEX_SLOT}]")


def _params_format(head: str, tail: str, empty: str, nested: str,
                   common: dict[str, Any]) -> TurnFormat:
    """A call whose arguments are key/value parameters, framed alike."""
    positions = []
    at = 0
    for key, value in _STRINGS.items():
        for text in (key, value):
            at = tail.find(text, at)
            if at < 0:
                raise DerivationError("a call's arguments are written neither as a JSON object "
                                      "nor as key/value parameters")
            positions.append(at)
            at += len(text)
    (ka, va, kb, vb), klen, vlen = positions, len("pgk_a"), len("pgv_a")
    first_open = tail[:ka]
    param_mid = tail[ka + klen:va]
    if tail[kb + klen:vb] != param_mid:
        raise DerivationError("two string parameters are framed differently")
    between = tail[va + vlen:kb]
    last = tail[vb + vlen:]
    empty_tail = _empty_tail(empty, common["close"])
    mid = first_open[:common_prefix(first_open, empty_tail)]
    param_open = first_open[len(mid):]
    call_end = empty_tail[len(mid):]
    if not last.endswith(call_end):
        raise DerivationError("the end of a call with parameters differs from one without")
    param_close = last[:len(last) - len(call_end)]
    if not between.startswith(param_close) or not between.endswith(param_open) \
            or len(between) < len(param_close) + len(param_open):
        raise DerivationError("the text between two parameters is not one's end and the "
                              "other's start")
    param_sep = between[len(param_close):len(between) - len(param_open)]
    if not param_open and not param_sep.strip():
        raise DerivationError("nothing starts a parameter (nor parts it from the one before)")
    quote = _quote(param_mid, param_close)
    if quote is not None:  # strings between a quote token: the values' own syntax
        param_mid, param_close = param_mid[:-len(quote)], param_close[len(quote):]
        _check_quoted(nested, quote, param_open + "pgk_n" + param_mid,
                      param_close + param_sep + param_open + "pgk_z" + param_mid, call_end)
        return TurnFormat(arguments="params", head=head, mid=mid, tail=call_end,
                          param_open=param_open, param_mid=param_mid, param_close=param_close,
                          param_sep=param_sep, values="quoted", quote=quote, **common)
    json_mid = _typed_mid(nested, param_open, param_mid)
    values = _value_style(nested, param_open, json_mid, param_close)
    if not param_close.strip():
        raise DerivationError("nothing ends a parameter's value")
    return TurnFormat(arguments="params", head=head, mid=mid, tail=call_end,
                      param_open=param_open, param_mid=param_mid, param_close=param_close,
                      param_sep=param_sep, values=values,
                      json_mid=None if json_mid == param_mid else json_mid, **common)


def _quote(param_mid: str, param_close: str) -> str | None:
    """The token a string value is quoted in: the one that both ends `param_mid` and starts
    `param_close` (Gemma 4's `key:<|"|>value<|"|>`), else None."""
    token = first_token(param_close)
    if token is None or not param_close.startswith(token) or not param_mid.endswith(token):
        return None
    return token


def _check_quoted(nested: str, quote: str, nested_at: str, null_at: str, call_end: str) -> None:
    """That the nested argument and the null one (written after `nested_at`, `null_at`) are
    values of the quoted syntax (a JSON dialect of bare keys, quoted_values)."""
    start, middle = nested.find(nested_at), nested.find(null_at)
    end = nested.rfind(call_end)
    if min(start, middle, end) < 0 or not start < middle < end:
        raise DerivationError("parameters are framed differently by their value's type")
    written = (nested[start + len(nested_at):middle], nested[middle + len(null_at):end])
    try:
        read = tuple(quoted_values.read_value(text, quote=quote) for text in written)
    except ValueError:
        read = None
    if read != (_NESTED, None):
        raise DerivationError(f"a nested argument's value is written neither as JSON nor as "
                              f"a Python literal nor as quoted values: {written[0]!r}")


def _empty_tail(empty: str, close: str) -> str:
    """A call without arguments (the section of that call alone): its text after the name."""
    rest = empty[empty.index(_NAMES[0]) + len(_NAMES[0]):]
    if not rest.endswith(close):
        raise DerivationError("a call without arguments ends its section differently")
    return rest[:len(rest) - len(close)]


def _typed_mid(nested: str, param_open: str, param_mid: str) -> str:
    """What a nested argument's key and value are parted by: `param_mid`, or other framing
    that says the value is not a string (DSML's `string="false">`), the same for the nested
    value and the null one."""
    if param_open + "pgk_n" + param_mid in nested:
        return param_mid
    mids = set()
    for key, value in (("pgk_n", json.dumps(_NESTED)), ("pgk_z", "null")):
        at = nested.find(param_open + key)
        end = nested.find(value, at)
        if at < 0 or end < 0:
            raise DerivationError("parameters are framed differently by their value's type")
        mids.add(nested[at + len(param_open + key):end])
    if len(mids) != 1 or not next(iter(mids)).strip():
        raise DerivationError("parameters are framed differently by their value's type")
    return mids.pop()


def _value_style(nested: str, param_open: str, param_mid: str, param_close: str) -> str:
    """How a nested argument's value and a null one are written: "json", "python" or "mixed"
    (Qwen3.5 writes mappings and sequences with `tojson`, other values with `string`)."""
    def written(key: str) -> str:
        framed = param_open + key + param_mid
        at = nested.find(framed)
        if at < 0:
            raise DerivationError("parameters are framed differently by their value's type")
        start = at + len(framed)
        end = nested.find(param_close.strip(), start)
        return nested[start:end].strip() if end >= 0 else ""

    value = written("pgk_n")
    if value == json.dumps(_NESTED) or value == json.dumps(_NESTED, separators=(",", ":")):
        return "json" if written("pgk_z") == "null" else "mixed"
    if value == repr(_NESTED):
        return "python"
    raise DerivationError(f"a nested argument is written neither as JSON nor as a Python "
                          f"literal: {value!r}")
