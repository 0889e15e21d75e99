"""The dialect framework: one PEG grammar per dialect, specialized per request, and the mapping
from its captures to OpenAI messages and streaming deltas.

A dialect is written once as a `.peg` file (the PEG DSL of `pegmask.grammars.peg`). Its module
subclasses `Dialect` and returns, for a request, the grammar text plus the JSON Schemas that its
`json(name)` calls use. Two grammars come from that one source:

* the **strict** grammar (`Dialect.grammar(request)`): what constrained decoding enforces (tools,
  tool_choice, parallel_tool_calls, reasoning, response_format);
* the **lenient** grammar (`Dialect.parse_grammar(request)`): any tool name, any JSON arguments,
  content around calls; used to parse output of unconstrained models.

Public API (stable; the engine and the Harmony dialects build on it)::

    d = get_dialect(name, **options)   # pegmask.dialects.registry: every family's name
    d.render(messages, tools=None, add_generation_prompt=True, **template_kwargs) -> str
    d.grammar(request) -> Grammar                  # strict, cached per request shape
    d.parse_grammar(request) -> Grammar            # lenient, cached
    d.parse(text_or_token_ids, request=None, vocab=None, *, trusted=False, seed=None) -> dict
    p = d.stream_parser(request=None, vocab=None, *, trusted=False, seed=None)
    p.feed(text) / p.feed_tokens(ids) / p.finish() -> list of delta dicts
    p.message, p.finish_reason, p.incomplete

What the parser makes of an output (messages, deltas) and the capture tags a dialect grammar
reports: `pegmask.dialects.stream`; how parameter values are read: `pegmask.dialects.values`.

Writing a dialect (a model family): one `.peg` file and one module in `pegmask.dialects`, and
nothing else to edit (the registry finds the module's class). Subclass `Dialect` (or
`TurnDialect` for `reasoning? content? calls?` outputs) and declare, as class attributes, its
`name`, its detection `priority`, what its templates write (`probe`, or `template_marker`; an
`owns_template` override where neither says it), and where the family needs them
`reasoning_default`, `renderer` / `turn_header` (a native renderer, for templates that cannot
render tools or history) and `value_readers` (a value syntax of its own); say what a template
implies (`template_options`), and implement `grammar_source(request, strict) -> (peg_text,
schemas)` with start rule `root` (`TurnDialect` composes it from the `.peg`'s rules).
`peg_sections`, `fill`, `peg_literal`, `alternatives` and `separated` build the per-request
text from the `.peg` templates. The base wraps `root` as ``pegmask_turn = @turn:root`` (so the
rule name `pegmask_turn` and the tag `turn` are reserved) and caches grammars per
`grammar_key`, which must cover everything `grammar_source` reads from the request.
"""

from __future__ import annotations

import functools
import json
import re
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from string import Template
from typing import TYPE_CHECKING, Any, ClassVar

from pegmask.dialects.request import ChatRequest
from pegmask.dialects.stream import DialectStreamParser, Message
from pegmask.dialects.values import ValueReader, schema_type
from pegmask.grammars import Grammar
from pegmask.grammars.alternation import left_factored
from pegmask.grammars.ir import (
    Choice,
    GrammarIR,
    JsonSchema,
    Node,
    Ref,
    children,
    choice,
    json_schema_node,
)

if TYPE_CHECKING:
    from pegmask.grammars.vocab import Vocabulary

#: a native prompt renderer: (history, tools, add_generation_prompt, **template variables) -> text
Renderer = Callable[..., str]

TURN_TAG = "turn"  # wraps the whole output so every byte lies inside some capture
_GRAMMAR_CACHE_SIZE = 64


# --------------------------------------------------------------------------- grammar text helpers
def peg_literal(text: str) -> str:
    """`text` as a double-quoted PEG DSL string literal (tool names, keys, enum values)."""
    out = ['"']
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def load_peg(filename: str) -> str:
    """Text of a `.peg` file shipped next to this module."""
    return (Path(__file__).parent / filename).read_text(encoding="utf-8")


def peg_sections(text: str) -> dict[str, str]:
    """Split a dialect `.peg` into its shared part ('') and template sections started by a
    line ``#@ section name``; sections are instantiated per tool / parameter with `Template`."""
    sections: dict[str, list[str]] = {"": []}
    current = ""
    for line in text.splitlines():
        if line.startswith("#@ "):
            current = line[3:].strip()
            sections[current] = []
        else:
            sections[current].append(line)
    return {name: "\n".join(lines) + "\n" for name, lines in sections.items()}


def fill(template: str, **values: Any) -> str:
    """Substitute ``$name`` placeholders of a grammar template (all must be given)."""
    return Template(template).substitute({k: str(v) for k, v in values.items()})


def alternatives(items: Sequence[str]) -> str:
    """PEG choice of the given expressions, parenthesized."""
    return "(" + " | ".join(items) + ")"


def separated(required: Sequence[str], optional: Sequence[str], sep: str) -> str:
    """Expression for the required items in order followed by each optional item at most once
    (in order), joined by `sep`; empty text when there are no items."""
    if required:
        parts = [f" {sep} ".join(required)]
        parts += [f"({sep} {item})?" for item in optional]
        return "(" + " ".join(parts) + ")"
    if not optional:
        return '""'
    firsts = []
    for i, first in enumerate(optional):
        rest = " ".join(f"({sep} {item})?" for item in optional[i + 1 :])
        firsts.append(f"{first} {rest}".strip())
    return alternatives(firsts) + "?"


_PLAIN_STRING_KEYS = {"type", "description", "title", "default", "examples", "$comment"}


def raw_string_values(schema: Any) -> list[str] | None:
    """How a string parameter can be written raw: [] for any text, the allowed values for an
    all-string enum / const, None when it is not a plain string (use JSON instead)."""
    if schema_type(schema) != "string":
        return None
    values = schema.get("enum", [schema["const"]] if "const" in schema else None)
    if values is not None:
        return list(values) if all(isinstance(v, str) for v in values) else None
    return [] if set(schema) <= _PLAIN_STRING_KEYS else None


def tool_choice(ir: GrammarIR, *, exclusive: bool) -> GrammarIR:
    """`ir` with its rule `tool`, the choice of the rules `tool_<i>`, holding their bodies
    instead: the compiler shares the symbols alternatives begin with (`grammars.alternation`),
    so the tools' names make one trie, where a configuration had a thread per tool at every
    byte up to the name. `exclusive`: the calls name their tool as a JSON string at the same
    place of the same framing, so no two tools' calls match the same text, and the framing
    before the name (whose whitespace rule the compiler would not share) leaves the choice
    first (`left_factored`). The inlined rules are dropped where nothing else calls them."""
    body = ir.rules.get("tool")
    alts = body.alts if isinstance(body, Choice) else (body,)
    if not all(isinstance(alt, Ref) and alt.name.startswith("tool_") for alt in alts):
        return ir
    names = [alt.name for alt in alts if isinstance(alt, Ref)]
    bodies = [ir.rules[name] for name in names]
    rules = dict(ir.rules)
    rules["tool"] = left_factored(bodies) if exclusive else choice(*bodies)
    called = _called(body for name, body in rules.items() if name not in names)
    for name in names:
        if name not in called:
            del rules[name]
    return GrammarIR(rules, ir.start, ir.specials)


def _called(bodies: Iterable[Node]) -> set[str]:
    """The rules that `bodies` call."""
    found: set[str] = set()
    stack = list(bodies)
    while stack:
        node = stack.pop()
        if isinstance(node, Ref):
            found.add(node.name)
        stack.extend(children(node))
    return found


_PEG_STRING = r'"(?:[^"\\]|\\.)*"'
_PEG_PIECE = re.compile(rf"\s*(?:token\(({_PEG_STRING})\)|({_PEG_STRING}))")


def _literal_rule(peg: str, rule: str) -> str | None:
    """The text rule `rule` of `peg` matches, where it is a sequence of literals and special
    tokens (`token("<|channel>") "thought"`), else None."""
    found = re.search(rf"^{rule}\s*=(.*)$", peg, re.MULTILINE)
    if found is None:
        return None
    body, position, text = found.group(1).rstrip(), 0, []
    while position < len(body):
        piece = _PEG_PIECE.match(body, position)
        if piece is None:
            return None
        text.append(json.loads(piece.group(1) or piece.group(2)))
        position = piece.end()
    return "".join(text) or None


# --------------------------------------------------------------------------- the dialect base
def _holds(text: str, marker: str | re.Pattern[str]) -> bool:
    """Whether `text` holds a probe marker (a string as is, a pattern searched)."""
    return marker in text if isinstance(marker, str) else marker.search(text) is not None


class Dialect:
    """Base class of dialects. A family is a subclass that declares its `name` and `priority`
    (the registry collects those) and implements `grammar_source`."""

    #: the family's name (`get_dialect(name)`, its native renderer's name); "" for the
    #: abstract bases, which the registry leaves out
    name: ClassVar[str] = ""
    #: detection priority: `detect_dialect` asks the families in ascending order, so a format
    #: whose probe another family's could also match comes first; a family declares its own
    priority: ClassVar[int]
    #: what one of the template's probe renderings holds when it writes this family's calls:
    #: every marker, a string found as is or a pattern searched (see `owns_template`)
    probe: ClassVar[tuple[str | re.Pattern[str], ...]] = ()
    #: text of a template's source that makes it the family's, for templates that cannot
    #: render the probe or that declare their format (None: the probe decides)
    template_marker: ClassVar[str | None] = None
    #: default reasoning mode when the request does not say: True (output starts in reasoning),
    #: False (no reasoning), None (detected from the output)
    reasoning_default: ClassVar[bool | None] = None
    #: whether the family reasons at all (False: no reasoning, whatever the request says)
    reasons: ClassVar[bool] = True
    #: the family's native prompt renderer, `render_native(name, ...)`, used when no chat
    #: template is given (None: prompts come from the model's template)
    renderer: ClassVar[Renderer | None] = None
    #: native renderers of the family's versions, `render_native(f"{name}-{version}", ...)`
    version_renderers: ClassVar[Mapping[str, Renderer]] = {}
    #: where an assistant turn starts in a native prompt (replayed text follows it); None: the
    #: turn is the generated text alone
    turn_header: ClassVar[str | None] = None
    #: the family's own value syntaxes: capture tag -> reader (`pegmask.dialects.stream`)
    value_readers: ClassVar[Mapping[str, ValueReader]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A family declares its own priority: an inherited one would tie with its parent's."""
        super().__init_subclass__(**kwargs)
        if vars(cls).get("name") and "priority" not in vars(cls):
            raise TypeError(f"{cls.__name__} declares name {cls.name!r} but no priority")

    def __init__(self, *, chat_template: str | None = None, reasoning: bool | None = None,
                 **options: Any):
        if options:
            raise TypeError(f"{type(self).__name__}: unknown options {sorted(options)}")
        self.chat_template = chat_template
        self.reasoning = self.reasoning_default if reasoning is None else reasoning
        #: the name of the native renderer `render` uses without a chat template (None: none)
        self.native_renderer: str | None = self.name if self.renderer is not None else None
        self._grammars: OrderedDict[tuple, Grammar] = OrderedDict()

    # ----------------------------------------------------------------- chat templates
    @classmethod
    def owns_template(cls, template: str, renderings: Sequence[str]) -> bool:
        """Whether a chat template writes this family's calls: its source holds
        `template_marker`, or one of `renderings` holds every marker of `probe`. `renderings`
        are the template's renderings of a probe conversation
        (`pegmask.dialects.registry.probe_renderings`: one call of tool `pegmask_probe` with
        argument `pegmask_arg`; empty where the template cannot render it). Say True only for a
        format this dialect parses exactly."""
        if cls.template_marker is not None and cls.template_marker in template:
            return True
        return bool(cls.probe) and any(all(_holds(text, marker) for marker in cls.probe)
                                       for text in renderings)

    @classmethod
    def template_options(cls, template: str) -> dict[str, Any]:
        """Options a family's template implies (e.g. no reasoning when it never writes
        `<think>`); `get_dialect(name, chat_template=t)` applies them."""
        return {}

    # ----------------------------------------------------------------- prompt side
    def render(self, messages: Any, tools: list[dict[str, Any]] | None = None,
               add_generation_prompt: bool = True, **template_kwargs: Any) -> str:
        """The prompt: the dialect's chat template when one was given, else its native
        renderer."""
        if self.chat_template is not None:
            from pegmask.dialects.templating import render_chat_template

            messages, tools = self.template_inputs(messages, tools)
            return render_chat_template(self.chat_template, messages, tools=tools,
                                        add_generation_prompt=add_generation_prompt,
                                        **template_kwargs)
        if self.native_renderer is None:
            raise ValueError(f"dialect {self.name!r} has no native renderer: pass chat_template=")
        from pegmask.dialects.native import render_native

        return render_native(self.native_renderer, messages, tools, add_generation_prompt,
                             **template_kwargs)

    def template_inputs(self, messages: Any, tools: list[dict[str, Any]] | None
                        ) -> tuple[Any, list[dict[str, Any]] | None]:
        """The messages and tools the chat template renders: families whose template cannot
        write past calls put them into the content as the model writes them; one whose template
        reads tools without OpenAI's `function` wrapper gets them so."""
        return messages, tools

    # ----------------------------------------------------------------- grammars
    def grammar_source(self, request: ChatRequest, strict: bool) -> tuple[str, dict[str, Any]]:
        """PEG text (start rule `root`) and the schemas its `json(name)` calls use."""
        raise NotImplementedError

    def reasoning_mode(self, request: ChatRequest | None) -> bool | None:
        """Reasoning on / off / detected: from the request's rendered prompt where it is known
        (`prompt_reasoning`), else from its switches, else the dialect's option."""
        if not self.reasons:
            return False
        if request is None:
            return self.reasoning
        if request.generation_prompt is not None:
            return self.prompt_reasoning(request.generation_prompt, request)
        return request.reasoning_enabled(self.reasoning)

    def reasoning_delimiters(self) -> tuple[str, str] | None:
        """The text that opens and closes reasoning (None: the dialect does not know it as
        text; `TurnDialect` reads its `think_open` / `think_close` rules)."""
        return None

    def prompt_reasoning(self, prompt: str, request: ChatRequest) -> bool | None:
        """The reasoning mode of a request whose rendered prompt is `prompt`: the prompt is what
        the model continues, so its tail decides, however the template spells its switches
        (`enable_thinking`, `reasoning_effort`, `thinking`): an open reasoning block (`<think>\\n`)
        is on, a closed one (`<think>\\n\\n</think>\\n\\n`) off, neither `unsaid_reasoning`.
        A dialect that knows no delimiters reads the request's switches."""
        delimiters = self.reasoning_delimiters()
        if delimiters is None:
            return request.reasoning_enabled(self.reasoning)
        opening, closing = delimiters
        tail = prompt.rstrip()
        if closing != opening and tail.endswith(closing):
            return False
        if tail.endswith(opening):
            return True
        return self.unsaid_reasoning(request)

    def unsaid_reasoning(self, request: ChatRequest) -> bool | None:
        """The mode where the prompt says nothing of reasoning: off where the request's
        switches turn it off (the template ignored them: the model is asked not to reason),
        else the dialect's default. Not "on" for a switch that is on: a prompt that opens no
        reasoning leaves the model to open it (Kolibri-1 at any `reasoning_effort`)."""
        return False if request.reasoning_enabled(True) is False else self.reasoning

    def grammar(self, request: ChatRequest | None = None) -> Grammar:
        """The strict output grammar for `request` (what the token mask enforces)."""
        return self._cached(request or ChatRequest(), strict=True)

    def parse_grammar(self, request: ChatRequest | None = None) -> Grammar:
        """The lenient grammar used to parse output of unconstrained models."""
        return self._cached(request or ChatRequest(), strict=False)

    def _cached(self, request: ChatRequest, strict: bool) -> Grammar:
        key = self.grammar_key(request, strict)
        grammar = self._grammars.get(key)
        if grammar is None:
            text, schemas = self.grammar_source(request, strict)
            text += f"\npegmask_turn = @{TURN_TAG}:root\n"
            grammar = self.grammar_of(text, schemas, strict)
            self._grammars[key] = grammar
            if len(self._grammars) > _GRAMMAR_CACHE_SIZE:
                self._grammars.popitem(last=False)
        else:
            self._grammars.move_to_end(key)
        return grammar

    def grammar_of(self, text: str, schemas: dict[str, Any], strict: bool) -> Grammar:
        """The grammar of `grammar_source`'s text (start rule `pegmask_turn`)."""
        return Grammar.from_peg(text, start="pegmask_turn", schemas=schemas)

    def grammar_key(self, request: ChatRequest, strict: bool) -> tuple:
        """What the grammar depends on (the lenient one only on the reasoning mode)."""
        reasoning = self.reasoning_mode(request)
        if not strict:
            return (False, reasoning)
        shape = {
            "tools": {name: request.tool_schemas[name] for name in request.allowed_tools},
            "min": request.min_calls,
            "max": request.max_calls,
            "strict": sorted(request.strict_tools & set(request.allowed_tools)),
            "strict_arguments": request.strict_tool_arguments,
        }
        return (True, reasoning, json.dumps(shape, sort_keys=True), request.response_grammar)

    # ----------------------------------------------------------------- output side
    def stream_parser(self, request: ChatRequest | None = None, vocab: Vocabulary | None = None,
                      *, trusted: bool = False, seed: int | None = None) -> DialectStreamParser:
        """A streaming parser for one output. `trusted`: the output was generated under
        `grammar(request)`'s mask, so it is parsed with that grammar and calls stream eagerly."""
        grammar = self.grammar(request) if trusted else self.parse_grammar(request)
        return DialectStreamParser(grammar, request, vocab, trusted=trusted, seed=seed)

    def parse(self, output: str | Sequence[int], request: ChatRequest | None = None,
              vocab: Vocabulary | None = None, *, trusted: bool = False,
              seed: int | None = None) -> Message:
        """The OpenAI assistant message for a whole output (text, or token ids with `vocab`)."""
        parser = self.stream_parser(request, vocab, trusted=trusted, seed=seed)
        if isinstance(output, str):
            parser.feed(output)
        else:
            parser.feed_tokens(output)
        parser.finish()
        return parser.message


# --------------------------------------------------------------------------- turn-shaped dialects
class TurnDialect(Dialect):
    """Dialects whose output is `reasoning? content? calls?` (Hermes, Hermes XML, DSML).

    The `.peg` file defines the rules that `root_rule` composes per request: `think_open`,
    `think_close` (reasoning delimiters), `thought` (reasoning text after `think_open`), `eos`,
    `calls_one` (a call region holding exactly one call), `calls_many` (one or more), `region`
    (the lenient call region, repeatable with content between) and `tool` (a call's body)
    defined as `$tools`: the choice of the ``#@ per tool`` template instantiated for each
    allowed tool (strict), or `any_tool` (lenient). Dialects with per-parameter values also
    have ``#@ per string parameter`` / ``#@ per json parameter`` templates and the rules
    `param_sep`, `raw` (a raw string value) and `any_params` (used for a tool that declares
    no properties). The shared rules `ws` and `text` (words separated by whitespace, so the
    whitespace around reasoning and content stays framing) come from `PRELUDE`; strict
    framing whitespace is bounded (`STRICT_WS`).
    """

    peg_file: ClassVar[str] = ""
    #: shared `.peg` pieces whose rules and sections the family's `.peg` builds on (e.g.
    #: ``json_calls.peg``, the `{"name", "arguments"}` objects of the JSON-list formats); a
    #: section the family's file also has is the family's
    peg_includes: ClassVar[tuple[str, ...]] = ()
    #: whether a call region may end reasoning without `think_close` (when parsing)
    implicit_reasoning_end: ClassVar[bool] = True
    #: whether a turn is an answer or calls, never both (Llama 3's JSON calls: a call is the
    #: whole turn, and an answer cannot start like one)
    calls_alone: ClassVar[bool] = False
    #: the rule a free-text answer is made of under the strict grammar
    answer_rule: ClassVar[str] = "text"
    #: framing whitespace: bounded when decoding is constrained, so a sampler cannot loop on it
    STRICT_WS: ClassVar[str] = "[ \\t\\r\\n]{0,4}"
    PRELUDE: ClassVar[str] = (
        "ws   = $ws\n"
        "text = word ([ \\t\\r\\n]+ word)*\n"
    )

    def reasoning_delimiters(self) -> tuple[str, str] | None:
        """The text of the `think_open` and `think_close` rules, where both are literals or
        special tokens (Kimi K3's blocks are not: it reads its prompt itself)."""
        return self._think_delimiters

    @functools.cached_property
    def _think_delimiters(self) -> tuple[str, str] | None:
        shared = self.sections()[""]
        opening, closing = _literal_rule(shared, "think_open"), _literal_rule(shared, "think_close")
        return None if opening is None or closing is None else (opening, closing)

    def grammar_source(self, request: ChatRequest, strict: bool) -> tuple[str, dict[str, Any]]:
        sections = self.sections()
        schemas: dict[str, Any] = {}
        if strict and request.allowed_tools:
            bodies = []
            for i, name in enumerate(request.allowed_tools):
                tool_text, tool_schemas = self.tool_rules(sections, i, name, request)
                bodies.append(tool_text)
                schemas.update(tool_schemas)
            tools = alternatives([f"tool_{i}" for i in range(len(bodies))])
            extra = "".join(bodies)
        else:
            tools, extra = "any_tool", ""
        text = fill(sections[""], tools=tools, **self.substitutions(strict))
        root, answer_schema = self.root_rule(request, strict)
        if answer_schema is not None:
            schemas["response"] = answer_schema
        prelude = fill(self.PRELUDE, ws=self.STRICT_WS if strict else "[ \\t\\r\\n]*")
        return prelude + self.word_rule() + text + extra + root, schemas

    def grammar_of(self, text: str, schemas: dict[str, Any], strict: bool) -> Grammar:
        """The strict grammar's `tool` rule holds the tools' bodies (`tool_choice`)."""
        grammar = super().grammar_of(text, schemas, strict)
        if not strict:
            return grammar
        named_json = "$name_json" in self.sections()[self.tool_section()]
        return Grammar(tool_choice(grammar.ir, exclusive=named_json))

    #: text a word of content or reasoning never contains: a call block's opening that is
    #: written as text (not a special token), so text cannot swallow a block written right
    #: after it (None: words are any non-space text)
    word_stop: ClassVar[str | None] = None

    def word_rule(self) -> str:
        """The `word` rule: non-space text, without `word_stop` (a word starting with its first
        character does not go on with the rest of it)."""
        if self.word_stop is None:
            return "word = [^ \\t\\r\\n]+\n"
        first, rest = self.word_stop[0], self.word_stop[1:]
        escaped = "\\" + first if first in "]\\^-" else first
        stops = ", ".join(peg_literal(s) for s in (self.word_stop, " ", "\t", "\r", "\n"))
        return (f"word = [^ \\t\\r\\n{escaped}] until({stops})"
                f" | {peg_literal(first)} until({peg_literal(rest)}, {stops})\n")

    def sections(self) -> dict[str, str]:
        """The family's `.peg` sections on top of those of its `peg_includes`."""
        merged = {"": ""}
        for filename in (*self.peg_includes, self.peg_file):
            for name, text in peg_sections(load_peg(filename)).items():
                merged[name] = merged[""] + text if name == "" else text
        return merged

    def substitutions(self, strict: bool) -> dict[str, str]:
        """Extra `$placeholders` of the shared part (e.g. DSML's block name)."""
        return {}

    def tool_section(self) -> str:
        """The `.peg` template section instantiated once per allowed tool."""
        return "per tool"

    def tool_rules(self, sections: dict[str, str], index: int, name: str,
                   request: ChatRequest) -> tuple[str, dict[str, Any]]:
        """The strict rules of tool `index` (rule `tool_<index>`) and their schemas (grammar
        nodes, see `ChatRequest.arguments_grammar`).

        The template gets `$i`, `$name` / `$name_json` (the name as a PEG literal, raw or as a
        JSON string), `$schema` (the arguments' schema name) and `$params` (the parameter list,
        for dialects with ``#@ per string parameter`` / ``#@ per json parameter`` sections).
        """
        schema_name = f"s_{index}"
        schema = request.tool_schemas[name]
        params_text, params, schemas = self.param_rules(
            sections, index, schema, lambda part: request.arguments_grammar(name, part))
        text = fill(sections[self.tool_section()], i=index, name=peg_literal(name),
                    name_json=peg_literal(json.dumps(name, ensure_ascii=False)),
                    schema=schema_name, params=params)
        return text + params_text, {schema_name: request.arguments_grammar(name, schema),
                                    **schemas}

    #: what ends a raw parameter value, for dialects that write every string parameter raw
    #: (constrained ones too: their schema then applies to the raw text); None: such strings
    #: are written as JSON
    raw_until: ClassVar[str | None] = None

    def raw_values(self, schema: Any) -> list[str] | None:
        """How a parameter is written raw ([] any text, or its allowed values), None: as JSON
        (or, with `raw_until`, a constrained raw string)."""
        return raw_string_values(schema)

    def param_rules(self, sections: dict[str, str], index: int, schema: dict[str, Any],
                    grammar_of: Callable[[Any], JsonSchema]) -> tuple[str, str, dict[str, Any]]:
        """Rules `p_<index>_<j>` for the declared properties, the expression listing them
        (required ones in order, then each optional one at most once, joined by `param_sep`)
        and the grammars (`grammar_of(schema)`) of the JSON-valued ones. No declared
        properties: `any_params`."""
        if "per json parameter" not in sections:
            return "", '""', {}
        properties = schema.get("properties")
        if not isinstance(properties, dict) or not properties:
            return "", "any_params", {}
        required = set(schema.get("required") or ())
        defs = {k: schema[k] for k in ("$defs", "definitions") if k in schema}  # for $refs
        text, needed, optional, schemas = "", [], [], {}
        for j, (key, sub) in enumerate(properties.items()):
            rule, schema_name = f"p_{index}_{j}", f"s_{index}_{j}"
            values = self.raw_values(sub)
            if values is None and self.raw_until is not None and schema_type(sub) == "string":
                # a constrained string, still written raw: its schema applies to the raw text
                schemas[schema_name] = json_schema_node({**defs, **sub}, raw_until=self.raw_until)
                value: str | None = f"json({schema_name})"
            elif values is None:
                value = None
            else:
                value = alternatives([peg_literal(v) for v in values]) if values else "raw"
            if value is None:
                text += fill(sections["per json parameter"], i=index, j=j,
                             key=peg_literal(key), schema=schema_name)
                schemas[schema_name] = grammar_of({**defs, **sub} if isinstance(sub, dict) else sub)
            else:
                text += fill(sections["per string parameter"], i=index, j=j,
                             key=peg_literal(key), value=value)
            (needed if key in required else optional).append(rule)
        return text, separated(needed, optional, "param_sep"), schemas

    def root_rule(self, request: ChatRequest, strict: bool) -> tuple[str, Any]:
        """The `root` rule for this request, and the answer's schema (or None).

        Reasoning on: the output starts inside reasoning (`think_open` may be in the prompt or
        the output); detected: only a leading `think_open` or a later `think_close` makes text
        reasoning. Leniently, reasoning may also be cut off, or ended by a call region
        (`implicit_reasoning_end`).
        """
        reasoning = self.reasoning_mode(request)
        schema = request.response_grammar if strict else None
        if strict:
            end = "@end:think_close ws body"
            text = f"@content:{self.answer_rule} ws"
            answer = "@content:json(response) ws" if schema is not None else text
            calls = "calls_one ws" if request.max_calls == 1 else "calls_many ws"
            if request.min_calls:
                body = f"{calls} eos?"
            elif schema is not None:  # the JSON answer is due, unless calls come instead
                body = f"{answer} eos?" if request.max_calls == 0 else f"({answer} | {calls}) eos?"
            elif request.max_calls == 0:
                body = f"({answer})? eos?"
            elif self.calls_alone:
                body = f"({calls} | {answer})? eos?"
            else:
                body = f"({answer})? ({calls})? eos?"
        else:
            implicit = " | region ws body" if self.implicit_reasoning_end else ""
            end = f"(@end:think_close ws body{implicit} | eos)?"
            if self.calls_alone:  # calls first: a whole turn that parses as calls is calls
                body = "(region ws | @content:text ws)? eos?"
            else:
                body = "(@content:text ws)? (region ws (@content:text ws)?)* eos?"
        opened = f"ws (@reasoning:thought ws)? {end}"
        root = {  # GLM 4.5 writes a newline before <think>
            True: f"(ws think_open)? {opened}",
            False: "ws body",
            None: f"ws think_open {opened} | (ws (@reasoning:text ws)? @end:think_close)? ws body",
        }[reasoning]
        return f"root = {root}\nbody = {body}\n", schema

