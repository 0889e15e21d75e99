"""Dialects derived from a chat template alone: for a template no family module claims, the
assistant turn's structure is read off the template's own renderings of probe conversations
(`pegmask.dialects.probe`), and the dialect is written from it.

    derive_dialect(template, eos_token="</s>") -> DerivedDialect   # or DerivationError
    derive_format(template) -> TurnFormat        # what was derived (pegmask.dialects.probe)

From the format, `DerivedDialect` writes the `.peg` sections a family module would (the rules
`TurnDialect` composes), so triggers, tool_choice, parallel calls, reasoning and the closing of
a turn are those of the families. Framing that looks like a tag (`<...>`, `[UPPER]`) is a
special token: a vocabulary without it spells it (`grammars/spelling.py`), so this costs nothing
where the guess is wrong. What cannot be derived raises `DerivationError`, naming it.
"""

from __future__ import annotations

import json
import re
from typing import Any, ClassVar

from pegmask.dialects import quoted_values
from pegmask.dialects.addressed import addressed_root
from pegmask.dialects.base import TurnDialect, peg_literal
from pegmask.dialects.probe import ID_SLOT, INDEX_SLOT, DerivationError, TurnFormat, derive_format
from pegmask.dialects.pythonic import PythonicDialect
from pegmask.dialects.textdiff import TOKEN

DERIVED = "derived"

#: what a slot of the framing matches
_SLOT_PEG = {ID_SLOT: "[A-Za-z0-9_.:\\-]{1,64}", INDEX_SLOT: "[0-9]{1,4}"}


def framing_peg(text: str) -> str:
    """PEG for framing text: tags as special tokens, slots as their patterns, whitespace
    between two tags or after the last one as `ws` (the families' framing whitespace), the
    rest as literals (`""` when empty). A tag that only introduces a call's id, with the id,
    is optional (Mistral's `[CALL_ID]`: models leave it out)."""
    parts: list[str] = []
    position = 0
    pattern = re.compile("(?:" + TOKEN.pattern + ")" + ID_SLOT + "|" + TOKEN.pattern
                         + "|[" + ID_SLOT + INDEX_SLOT + "]")
    for match in pattern.finditer(text):
        if match.start() > position:
            gap = text[position:match.start()]
            # whitespace between two tags is layout, not text: any (bounded when strict)
            between_tags = position > 0 and not gap.strip() and len(gap) <= 4
            parts.append("ws" if between_tags else peg_literal(gap))
        piece = match.group()
        if piece in _SLOT_PEG:
            parts.append(_SLOT_PEG[piece])
        elif piece.endswith(ID_SLOT):
            parts.append(f"(token({peg_literal(piece[:-1])}) {_SLOT_PEG[ID_SLOT]})?")
        else:
            parts.append(f"token({peg_literal(piece)})")
        position = match.end()
    rest = text[position:]
    if rest:  # whitespace after a last tag is layout too
        parts.append("ws" if position > 0 and not rest.strip() and len(rest) <= 4
                      else peg_literal(rest))
    return " ".join(parts) or '""'


# --------------------------------------------------------------------------- the dialect
#: a tool name where the framing does not say what ends it
_NAME_CHARS = "[^ \\t\\r\\n\"'<>\\[\\]{}(),:=]+"


class DerivedDialect(TurnDialect):
    """The dialect of a derived `TurnFormat`: the `.peg` sections a family module would ship,
    written from the format. Not a registered family (the registry asks the families first;
    `get_dialect("derived", chat_template=t)` builds this)."""

    priority = 10_000
    #: the format's sections, instead of a `.peg` file
    peg_text: ClassVar[str] = ""
    #: values in the quoted syntax (a format's `quote`: any `<|x|>` token where a value starts),
    #: and Python literals (a pythonic call list)
    value_readers = {"quoted": quoted_values.read_value, **PythonicDialect.value_readers}

    def __init__(self, turn: TurnFormat, **options: Any):
        if turn.think_close is None:
            options["reasoning"] = False
        elif "reasoning" not in options or options["reasoning"] is None:
            options["reasoning"] = turn.reasoning_default
        super().__init__(**options)
        self.format = turn
        # a pythonic call list: the pythonic family's grammar pieces, framed as derived
        self.python = _pythonic(turn) if turn.arguments == "python" else None
        self.STRICT_WS = f"[ \\t\\r\\n]{{0,{turn.layout}}}"
        # what a family declares as class attributes, this dialect has from its format
        self.reasons = turn.think_close is not None
        self.raw_until = turn.quote or turn.param_close.rstrip() \
            if turn.arguments == "params" else None
        self._sections = _sections(turn) if self.python is None else \
            _python_sections(turn, self.python)
        # a bare JSON call or call list is a whole turn: an answer cannot start like one
        self.calls_alone = turn.bare or (self.python is not None and self.python.calls_alone)
        self.answer_rule = "answer" if self.calls_alone else "text"
        opening = first_piece(turn.open or turn.head or turn.sep)
        self.word_stop = None if self.calls_alone or TOKEN.fullmatch(opening) else opening

    def sections(self) -> dict[str, str]:
        return self._sections

    def template_inputs(self, messages: Any, tools: list[dict[str, Any]] | None
                        ) -> tuple[Any, list[dict[str, Any]] | None]:
        """Past calls whose values a pythonic template does not write as Python literals go
        into the content as the model writes them (`PythonicDialect.template_inputs`)."""
        if self.python is not None:
            return self.python.template_inputs(messages, tools)
        return super().template_inputs(messages, tools)

    def root_rule(self, request: Any, strict: bool) -> tuple[str, Any]:
        """An addressed content: `addressed_root`; else `TurnDialect`'s, the content wrapped
        in the format's content tokens (leniently, either may be missing)."""
        if self.format.recipient is not None:
            return addressed_root(request, strict)
        root, schema = super().root_rule(request, strict)
        if self.format.content is None:
            return root, schema
        opening, closing = (f"token({peg_literal(token)})" for token in self.format.content)
        wrap = (lambda m: f"{opening} {m.group()} {closing}") if strict else \
            (lambda m: f"({opening} ws)? {m.group()} (ws {closing})?")
        return re.sub(r"@content:\S+", wrap, root), schema

    def unsaid_reasoning(self, request: Any) -> bool | None:
        """A prompt that does not close the reasoning the template's default prompt closes
        (Gemma 4's, `enable_thinking` on) leaves the model to open it: detected."""
        mode = super().unsaid_reasoning(request)
        if mode is False and self.format.reasoning_default is False \
                and request.reasoning_enabled(True) is not False:
            return None
        return mode

    def substitutions(self, strict: bool) -> dict[str, str]:
        """Quoted values: whitespace inside them (none when strict, as templates write them);
        a pythonic call list: its framing."""
        if self.python is not None:
            return self.python.substitutions(strict)
        return {"gws": '""' if strict else "[ \\t\\r\\n]*"} if self.format.quote else {}

    def param_rules(self, sections: dict[str, str], index: int, schema: dict[str, Any],
                    grammar_of: Any) -> tuple[str, str, dict[str, Any]]:
        """Quoted values: their rules from the schema (quoted_values), keys sorted."""
        turn = self.format
        if self.python is not None:
            return self.python.param_rules(sections, index, schema, grammar_of)
        if turn.quote is None:
            return super().param_rules(sections, index, schema, grammar_of)
        return quoted_values.quoted_params(
            index, schema, turn.quote, "quoted",
            lambda key: f"{framing_peg(turn.param_open)} @key:{peg_literal(key)} "
                        f"{framing_peg(turn.param_mid)}")


def first_piece(text: str) -> str:
    """The token `text` starts with, else its text up to the first token or whitespace."""
    text = text.lstrip()
    match = TOKEN.match(text)
    if match:
        return match.group()
    stop = re.search(TOKEN.pattern + r"|\s", text)
    return text[:stop.start()] if stop else text


def _triggered(text: str) -> str:
    """Framing whose first piece is the grammar's trigger."""
    text = text.lstrip()
    first = first_piece(text)
    return f"trigger({framing_peg(first)}) {framing_peg(text[len(first):])}"


def _sections(turn: TurnFormat) -> dict[str, str]:
    """The `.peg` sections of the format (see `TurnDialect`)."""
    f = framing_peg
    rules = []
    if turn.think_close is not None:
        rules += [f"think_open  = {f(turn.think_open or turn.think_close)}",
                  f"think_close = {f(turn.think_close)}",
                  "thought     = text"]
    eos = " | ".join(f"token({peg_literal(token)})" for token in turn.eos) or '""'
    rules.append(f"eos         = {eos}")
    if turn.recipient is not None:  # the prompt opens the first call (no trigger)
        open_, head = f(turn.open), f(turn.head)
        rules += [f"to_content  = {f(turn.recipient)}", f"sep         = {f(turn.sep)}"]
    elif turn.open.strip():
        open_, head = _triggered(turn.open), f(turn.head)
    elif turn.bare:  # the call's object is its own trigger (Llama 3's `{`)
        open_, head = '""', 'trigger("{") jws'
    else:
        open_, head = '""', _triggered(turn.head)
    if turn.arguments == "object" and not turn.bare:
        head += ' "{" jws'
    tail = f(turn.tail)
    if turn.arguments == "object":
        tail = f'jws "}}" {tail}'
    many = f"call ({f(turn.sep)} call)*" if turn.parallel else "call"
    rules += [f"call        = @call:({head} tool {tail})",
              f"calls_one   = {open_} call {f(turn.close)}",
              f"calls_many  = {open_} {many} {f(turn.close)}",
              "region      = calls_many",
              "tool        = $tools",
              "jws         = [ \\t\\r\\n]*"]
    if turn.bare:  # strict: an answer cannot start like a call
        rules.append("answer      = [^{ \\t\\r\\n] [^ \\t\\r\\n]* ([ \\t\\r\\n]+ word)*")
    per_tool = ""
    sections: dict[str, str] = {}
    if turn.arguments == "object":
        def members(name: str, arguments: str) -> str:
            """The object's members; an id is optional (models leave it out, as Nemo's)."""
            values = {"name": f"@name_json:{name}", "arguments": f"@arguments:{arguments}"}
            text, comma = "", ' jws "," jws '
            for i, (key, value) in enumerate(turn.members):
                member = f'{peg_literal(json.dumps(key))} jws ":" jws ' \
                    f'{values.get(value) or f(value)}'
                if i == 0 and ID_SLOT in value:  # the comma after it is its own
                    text += f"({member}{comma})?"
                    continue
                lead = comma if i and not (i == 1 and text.endswith(")?")) else ""
                text += f" ({lead}{member})?" if ID_SLOT in value else lead + member
            return text

        rules += [f"any_tool    = {members('json_string', 'json()')}",
                  'json_string = "\\"" ([^"\\\\\\x00-\\x1f] | "\\\\" (["\\\\/bfnrt] | "u" '
                  '[0-9a-fA-F]{4}))* "\\""']
        per_tool = f"tool_$i = {members('$name_json', 'json($schema)')}"
    elif turn.arguments == "json":
        rules.append(f"any_tool    = @name:{_NAME_CHARS} {f(turn.mid)} @arguments:json()")
        per_tool = f"tool_$i = @name:$name {f(turn.mid)} @arguments:json($schema)"
    else:
        stops = f'{f(first_piece(turn.param_mid))}, "\\n"'
        value_stop = peg_literal(turn.quote or turn.param_close.rstrip())
        json_mid = turn.json_mid or turn.param_mid
        value = f"{f(turn.param_mid)} @value:raw" if turn.json_mid is None else \
            f"({f(turn.param_mid)} @string:raw | {f(json_mid)} @json:raw)"
        if turn.quote is not None:
            value = f"{f(turn.param_mid)} (Q @string:raw Q | @quoted:gvalue)"
        param = f"@param:({f(turn.param_open)} @key:until({stops}) {value} {f(turn.param_close)})"
        # whitespace after a name before its parameters is layout (GLM 4.6 writes "\n")
        mid = "ws" if turn.mid and not turn.mid.strip() and len(turn.mid) <= 4 else f(turn.mid)
        rules += [f"any_tool    = @name:{_NAME_CHARS} {mid} any_params",
                  f"any_params  = (any_param ({f(turn.param_sep)} any_param)*)?",
                  f"any_param   = {param}",
                  f"param_sep   = {f(turn.param_sep)}",
                  f"raw         = until({value_stop})"]
        per_tool = f"tool_$i = @name:$name {mid} $params"
        sections["per string parameter"] = (
            f"p_${{i}}_${{j}} = @param:({f(turn.param_open)} @key:$key {f(turn.param_mid)} "
            f"@string:$value {f(turn.param_close)})\n")
        sections["per json parameter"] = (
            f"p_${{i}}_${{j}} = @param:({f(turn.param_open)} @key:$key {f(json_mid)} "
            f"@json:json($schema) {f(turn.param_close)})\n")
    shared = "\n".join(rule.replace("$", "$$").replace("$$tools", "$tools") for rule in rules)
    if turn.quote is not None:
        shared += "\n" + quoted_values.value_rules(turn.quote).rstrip("\n")
    return {"": shared + "\n", "per tool": per_tool + "\n", **sections}


def _pythonic(turn: TurnFormat) -> PythonicDialect:
    """The pythonic dialect of the derived framing: the tokens around the list where there
    are (else a bare list, the whole turn), the turn's ends, past calls rewritten where the
    template does not write their values as Python literals."""
    tokens = tuple(token for token in (turn.open.rstrip()[:-1].strip(),
                                       turn.close.lstrip()[1:].strip()) if token)
    return PythonicDialect(call_tokens=tokens, eos=turn.eos,
                           rewrite_calls=turn.values != "literals")


def _python_sections(turn: TurnFormat, python: PythonicDialect) -> dict[str, str]:
    """The pythonic family's sections, with the derived reasoning delimiters."""
    sections = python.sections()
    if turn.think_close is not None:
        rules = {"think_open": framing_peg(turn.think_open or turn.think_close),
                 "think_close": framing_peg(turn.think_close)}
        sections[""] = re.sub(r"^(think_open|think_close)( *)=.*$",
                              lambda m: f"{m[1]}{m[2]}= {rules[m[1]]}", sections[""],
                              flags=re.MULTILINE)
    return sections


def derive_dialect(template: str, *, reasoning: bool | None = None,
                   **template_kwargs: Any) -> DerivedDialect:
    """The dialect `template` writes, derived from its renderings alone (`DerivationError`
    names what could not be derived). `template_kwargs`: the template's variables, such as
    the tokenizer's `eos_token`."""
    return DerivedDialect(derive_format(template, **template_kwargs), chat_template=template,
                          reasoning=reasoning)


def derives(template: str, **template_kwargs: Any) -> bool:
    """Whether a dialect can be derived from `template` (rendered with `template_kwargs`)."""
    try:
        derive_format(template, **template_kwargs)
    except DerivationError:
        return False
    return True
