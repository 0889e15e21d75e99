"""Chat-template rendering with the exact behavior of transformers' ``apply_chat_template``.

A model's Jinja chat template is untrusted code from the Hub, so it runs in an immutable sandbox;
everything else (``tojson`` without HTML escaping, ``raise_exception``, ``strftime_now``, loop
controls, the ``{% generation %}`` tag, how messages, tools and ``continue_final_message`` are
prepared) follows transformers byte for byte, because a prompt that differs by one byte from the
one the model was trained on is a different prompt.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace

from pegmask.dialects.history import History, normalize_history, normalize_tools

__all__ = [
    "ChatTemplateError",
    "ChatTemplateNotFoundError",
    "ContentFormat",
    "RESERVED_TEMPLATE_VARIABLES",
    "ReservedTemplateVariableError",
    "compile_chat_template",
    "detect_content_format",
    "render_chat_template",
    "render_history",
    "resolve_chat_template",
    "tojson",
]

ContentFormat = Literal["string", "openai"]

# Names the renderer itself binds; a template variable with one of these names would silently
# replace the conversation, the tools or a sandbox helper.
RESERVED_TEMPLATE_VARIABLES = frozenset(
    {
        "messages",
        "tools",
        "documents",
        "add_generation_prompt",
        "continue_final_message",
        "raise_exception",
        "strftime_now",
        "dict",
        "namespace",
    }
)

# Names a message's reasoning travels under; the first is the one most templates read.
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "
_MIN_JINJA = (3, 1, 6)  # older releases have known sandbox escapes


class ChatTemplateError(ValueError):
    """A chat template cannot be found or used as requested."""


class ChatTemplateNotFoundError(ChatTemplateError, FileNotFoundError):
    """A template given as a path does not exist (never a silent fallback to another template)."""


class ReservedTemplateVariableError(ChatTemplateError):
    """A template variable uses a name the renderer binds itself."""


def tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | str | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    """JSON for templates: key order kept, raw UTF-8, no HTML escaping (unlike Jinja's own)."""
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _TemplateDict:
    """``dict(...)`` for templates without exposing the ``dict`` type itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
        return dict.fromkeys(*args, **kwargs)


def _check_namespace_name(name: object) -> None:
    if isinstance(name, str) and name.startswith("_"):
        raise jinja2.exceptions.SecurityError(
            f"Chat templates cannot store underscore-prefixed attributes on a namespace, "
            f"but got {name!r}. Please rename the attribute."
        )


class _TemplateNamespace(Namespace):
    """``namespace()`` that refuses dunder attributes, which lead to CPython internals."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # same signature trick as Jinja's Namespace
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _check_namespace_name(name)
        Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _check_namespace_name(name)
        Namespace.__setitem__(self, name, value)


class _GenerationTag(jinja2.ext.Extension):
    """Accepts ``{% generation %}...{% endgeneration %}`` (assistant-mask markers) as plain output."""

    tags = {"generation"}

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render_body"), [], [], body).set_lineno(
            lineno
        )

    def _render_body(self, caller: Callable[[], str]) -> str:
        return caller()


def _jinja_version() -> tuple[int, ...]:
    return tuple(int(part) for part in jinja2.__version__.split(".")[:3] if part.isdigit())


@lru_cache(maxsize=1)
def _environment() -> ImmutableSandboxedEnvironment:
    if _jinja_version() < _MIN_JINJA:
        raise ImportError(
            f"chat templates need jinja2>={'.'.join(map(str, _MIN_JINJA))} (sandbox fixes); "
            f"found {jinja2.__version__}"
        )
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    return env


@lru_cache(maxsize=64)
def compile_chat_template(template: str) -> jinja2.Template:
    """Compile once per distinct template text (rendering is the hot path, parsing is not)."""
    return _environment().from_string(template)


# ---------------------------------------------------------------------------------------------
# Inputs: what the template may see
# ---------------------------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    """Rebuild a value from plain JSON-like types so no rich object's methods reach the sandbox."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(key): _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_plain(item) for item in value)
    if type(value).__module__ == "numpy" and hasattr(value, "item"):
        return _plain(value.item())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if callable(getattr(value, "model_dump", None)):
        return _plain(value.model_dump())
    return f"<{type(value).__name__}>"


def _as_dicts(value: Any) -> Any:
    """Message objects (dataclasses, pydantic models) to dicts, keeping everything else as is."""
    if isinstance(value, Mapping):
        return {key: _as_dicts(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_as_dicts(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_as_dicts(item) for item in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _as_dicts(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if callable(getattr(value, "model_dump", None)):
        return _as_dicts(value.model_dump())
    return value


def _prepare_messages(messages: Any) -> list[dict]:
    """Dicts without ``None`` values (templates handle a missing key, not a literal None)."""
    chat = _as_dicts(getattr(messages, "messages", messages))
    if not isinstance(chat, (list, tuple)):
        raise TypeError(f"messages should be a list of dicts, got {type(messages).__name__}")
    if not chat:
        raise ValueError(
            "Cannot apply chat template to an empty conversation. Provide at least one message."
        )
    prepared = []
    for message in chat:
        if not isinstance(message, dict):
            raise TypeError(
                f"Chat messages should be dicts, dataclasses or pydantic models, but got {message!r}."
            )
        prepared.append({key: value for key, value in message.items() if value is not None})
    return _plain(prepared)


def _alias_reasoning(chat: list[dict]) -> list[dict]:
    """Offer reasoning under every name templates read (``reasoning_content``, ``thinking``)."""
    aliased = []
    for message in chat:
        reasoning = next(
            (message[key] for key in _REASONING_FIELDS if message.get(key) is not None), None
        )
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        aliased.append(message)
    return aliased


def _tool_schemas(tools: Sequence[Any] | None) -> list | None:
    if tools is None:
        return None
    schemas = []
    for tool in tools:
        if isinstance(tool, Mapping):
            schemas.append(tool)
        elif inspect.isfunction(tool) or inspect.ismethod(tool):
            # Same conversion as transformers (type hints + Google docstring), imported only here
            # because transformers is slow to import and most requests carry JSON schemas.
            from transformers.utils import get_json_schema

            schemas.append(get_json_schema(tool))
        else:
            raise ValueError(
                "Tools should either be a JSON schema, or a callable function with type hints "
                "and a docstring suitable for auto-conversion to a schema."
            )
    return schemas


def _template_variables(
    kwargs: Mapping[str, Any], chat_template_kwargs: Mapping[str, Any] | None
) -> dict[str, Any]:
    variables = dict(kwargs)
    variables.update(chat_template_kwargs or {})
    reserved = sorted(RESERVED_TEMPLATE_VARIABLES.intersection(variables))
    if reserved:
        raise ReservedTemplateVariableError(
            f"template variable name(s) {reserved} are reserved: pass messages, tools, documents, "
            "add_generation_prompt and continue_final_message as arguments of their own"
        )
    return variables


def _mark_final_message(chat: list[dict], template: str, field: str) -> str:
    """Append the continuation tag to the last message's text; return the text to continue."""
    final = chat[-1].get(field)
    if final is None:
        raise ValueError(
            f'continue_final_message is set but the final message has no "{field}" to continue!'
        )
    fields = [field]
    if field in _REASONING_FIELDS:
        fields = [name for name in _REASONING_FIELDS if chat[-1].get(name) == final]
    if not any(name in template for name in fields):
        raise ValueError(
            f'continue_final_message is set to "{field}" but this is not an accepted field in the chat_template'
        )
    if isinstance(final, (list, tuple)):
        for block in reversed(final):
            if "text" in block:
                final = block["text"]
                block["text"] = block["text"] + _CONTINUE_TAG
                return final
        raise ValueError(
            "continue_final_message is set but we could not find any text to continue in the final message!"
        )
    for name in fields:
        chat[-1][name] = chat[-1][name] + _CONTINUE_TAG
    return final


def _cut_at_continuation(rendered: str, final: str) -> str:
    """Drop everything the template wrote after the final message's text."""
    if final.strip() not in rendered or _CONTINUE_TAG.strip() not in rendered:
        raise ValueError(
            "continue_final_message is set but the final message does not appear in the chat after "
            "applying the chat template! This can happen if the chat template deletes portions of "
            "the final message. Please verify the chat template and final message in your chat to "
            f"ensure they are compatible.Final message to continue: {final.strip()}\n"
            f"Rendered chat:\n{rendered}"
        )
    at = rendered.rindex(_CONTINUE_TAG.strip())
    if rendered[at : at + len(_CONTINUE_TAG)] == _CONTINUE_TAG:
        return rendered[:at]
    return rendered[:at].rstrip()  # the template trimmed the tag's trailing space


def render_chat_template(
    template: str | os.PathLike[str],
    messages: Sequence[Mapping[str, Any]] | Any,
    tools: Sequence[Mapping[str, Any] | Callable[..., Any]] | None = None,
    add_generation_prompt: bool = False,
    *,
    documents: Sequence[Mapping[str, Any]] | None = None,
    continue_final_message: bool | str = False,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> str:
    """Render ``messages`` as ``apply_chat_template(..., chat_template=template, tokenize=False)``.

    ``template`` is the template text (a ``Path`` is read from disk). Extra keyword arguments and
    ``chat_template_kwargs`` are template variables (``enable_thinking``, ``bos_token``, ...);
    reserved names raise :class:`ReservedTemplateVariableError`. ``continue_final_message`` may
    name the field to continue (``"content"`` when ``True``).
    """
    if isinstance(template, os.PathLike):
        template = Path(template).read_text(encoding="utf-8")
    variables = _template_variables(kwargs, chat_template_kwargs)
    if continue_final_message and add_generation_prompt:
        raise ValueError(
            "continue_final_message and add_generation_prompt are not compatible. Use "
            "continue_final_message when you want the model to continue the final message, and "
            "add_generation_prompt when you want to add a header that will prompt it to start a "
            "new assistant message instead."
        )
    compiled = compile_chat_template(template)
    tool_schemas = _tool_schemas(tools)
    if documents is not None:
        for document in documents:
            if not isinstance(document, Mapping):
                raise TypeError("Documents should be a list of dicts with 'title' and 'text' keys!")
    chat = _alias_reasoning(_prepare_messages(messages))
    final = None
    if continue_final_message:
        field = continue_final_message if isinstance(continue_final_message, str) else "content"
        final = _mark_final_message(chat, template, field)
    rendered = compiled.render(
        messages=chat,
        tools=_plain(tool_schemas),
        documents=_plain(documents),
        add_generation_prompt=add_generation_prompt,
        **_plain(variables),
    )
    if final is not None:
        rendered = _cut_at_continuation(rendered, final)
    return rendered


# ---------------------------------------------------------------------------------------------
# Content format: does the template want a string or a list of parts?
# ---------------------------------------------------------------------------------------------


def _names_in(node: jinja2.nodes.Node) -> set[str]:
    return {name.name for name in node.find_all(jinja2.nodes.Name)} | (
        {node.name} if isinstance(node, jinja2.nodes.Name) else set()
    )


def _field_of(node: jinja2.nodes.Node) -> tuple[jinja2.nodes.Node, str] | None:
    """``x.attr`` or ``x['attr']`` as (x, attr)."""
    if isinstance(node, jinja2.nodes.Getattr):
        return node.node, node.attr
    if (
        isinstance(node, jinja2.nodes.Getitem)
        and isinstance(node.arg, jinja2.nodes.Const)
        and isinstance(node.arg.value, str)
    ):
        return node.node, node.arg.value
    return None


def _assignments(ast: jinja2.nodes.Template) -> list[tuple[str, jinja2.nodes.Node]]:
    """(name, value) for ``set`` statements and for macro parameters bound at call sites."""
    pairs: list[tuple[str, jinja2.nodes.Node]] = []
    for assign in ast.find_all(jinja2.nodes.Assign):
        if isinstance(assign.target, jinja2.nodes.Name):
            pairs.append((assign.target.name, assign.node))
    macros = {macro.name: macro for macro in ast.find_all(jinja2.nodes.Macro)}
    for call in ast.find_all(jinja2.nodes.Call):
        if isinstance(call.node, jinja2.nodes.Name) and call.node.name in macros:
            params = [arg.name for arg in macros[call.node.name].args]
            pairs.extend(zip(params, call.args, strict=False))
            pairs.extend((kw.key, kw.value) for kw in call.kwargs if kw.key in params)
    return pairs


@lru_cache(maxsize=64)
def detect_content_format(template: str) -> ContentFormat:
    """``"openai"`` when the template iterates over message content or indexes its parts.

    The same idea as vLLM's content-format "auto": a template that loops over
    ``message.content`` (directly, through a ``set``, or through a macro parameter) expects a list
    of ``{"type": "text", "text": ...}`` parts; any other template expects a string.
    """
    ast = _environment().parse(template)
    assignments = _assignments(ast)
    message_lists = {"messages"}
    changed = True
    while changed:  # names derived from `messages` (loop_messages = messages[1:], ...)
        before = len(message_lists)
        message_lists |= {name for name, value in assignments if _names_in(value) & message_lists}
        changed = len(message_lists) != before
    message_vars = {
        loop.target.name
        for loop in ast.find_all(jinja2.nodes.For)
        if isinstance(loop.target, jinja2.nodes.Name) and _names_in(loop.iter) & message_lists
    }

    def is_message(node: jinja2.nodes.Node) -> bool:
        if isinstance(node, jinja2.nodes.Name):
            return node.name in message_vars
        return isinstance(node, jinja2.nodes.Getitem) and bool(_names_in(node.node) & message_lists)

    def is_content(node: jinja2.nodes.Node, content_names: set[str]) -> bool:
        if isinstance(node, jinja2.nodes.Name):
            return node.name in content_names
        field = _field_of(node)
        return field is not None and field[1] == "content" and is_message(field[0])

    content_names: set[str] = set()
    changed = True
    while changed:
        before = len(content_names)
        content_names |= {name for name, value in assignments if is_content(value, content_names)}
        changed = len(content_names) != before
    for loop in ast.find_all(jinja2.nodes.For):
        if is_content(loop.iter, content_names):
            return "openai"
    for node in ast.find_all((jinja2.nodes.Getattr, jinja2.nodes.Getitem)):
        field = _field_of(node)
        if field and field[1] in ("text", "type") and isinstance(field[0], jinja2.nodes.Getitem):
            if is_content(field[0].node, content_names):
                return "openai"  # content[0]['text']
    return "string"


def render_history(
    template: str,
    history: History | Sequence[Mapping[str, Any]] | str,
    tools: Sequence[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    **kwargs: Any,
) -> str:
    """Render a request history (any of the three APIs) with a model's template.

    The template receives the structured history as OpenAI-shaped messages: parsed arguments as
    objects, results carrying their call's id and name, and content as a string or a list of
    parts, whichever the template reads. ``kwargs`` are as for :func:`render_chat_template`.
    """
    messages = normalize_history(history).to_template_messages(detect_content_format(template))
    tool_list = normalize_tools(tools) if tools is not None else None
    return render_chat_template(template, messages, tool_list, add_generation_prompt, **kwargs)


# ---------------------------------------------------------------------------------------------
# Resolution: which template to use
# ---------------------------------------------------------------------------------------------

_TEMPLATE_SYNTAX = ("{%", "{{", "{#")
_TEMPLATE_SUFFIXES = (".jinja", ".jinja2", ".j2", ".tmpl", ".txt")


def _looks_like_path(text: str) -> bool:
    if any(mark in text for mark in _TEMPLATE_SYNTAX) or "\n" in text:
        return False
    return (
        text.endswith(_TEMPLATE_SUFFIXES)
        or "/" in text
        or os.sep in text
        or text.startswith("~")
        or Path(text).exists()
    )


def _pick_named(templates: Mapping[str, str], name: str | None, tools: Any) -> str:
    if name is not None:
        if name not in templates:
            raise ChatTemplateError(
                f"no chat template named {name!r}; available: {sorted(templates)}"
            )
        return templates[name]
    if tools is not None and "tool_use" in templates:
        return templates["tool_use"]
    if "default" in templates:
        return templates["default"]
    raise ChatTemplateError(
        "This model has multiple chat templates with no default specified; pass a template or "
        f"one of the names {sorted(templates)}."
    )


def _named_templates(value: Any) -> dict[str, str] | str | None:
    """A tokenizer's ``chat_template``: a string, a dict, or a list of ``{name, template}``."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, (list, tuple)):
        return {item["name"]: item["template"] for item in value}
    raise ChatTemplateError(f"unsupported chat_template value of type {type(value).__name__}")


def _gguf_templates(path: str | os.PathLike[str]) -> dict[str, str] | str | None:
    """``tokenizer.chat_template`` (and named ``tokenizer.chat_template.NAME``) of a GGUF file."""
    if not Path(path).exists():
        raise ChatTemplateNotFoundError(f"GGUF file not found: {os.fspath(path)}")
    import gguf  # heavy (numpy memmap of the whole file): only when a GGUF file is given

    reader = gguf.GGUFReader(os.fspath(path))
    prefix = "tokenizer.chat_template"
    found = {
        key[len(prefix) + 1 :] or "default": str(field.contents())
        for key, field in reader.fields.items()
        if key == prefix or key.startswith(prefix + ".")
    }
    if not found:
        return None
    if list(found) == ["default"]:
        return found["default"]
    return found


def _read_template(path: str | os.PathLike[str]) -> str:
    resolved = Path(os.path.expanduser(os.fspath(path)))
    if not resolved.is_file():
        raise ChatTemplateNotFoundError(f"chat template file not found: {os.fspath(path)}")
    return resolved.read_text(encoding="utf-8")


def resolve_chat_template(
    template: str | os.PathLike[str] | None = None,
    *,
    tokenizer: Any = None,
    tokenizer_config: Mapping[str, Any] | None = None,
    gguf_file: str | os.PathLike[str] | None = None,
    default: str | os.PathLike[str] | None = None,
    name: str | None = None,
    tools: Any = None,
) -> str:
    """The template text to use: explicit first, then the model's own, then a dialect default.

    ``template`` may be template text, a path, or the name of one of the model's named templates.
    The model's template comes from ``tokenizer_config`` (a ``tokenizer_config.json`` dict),
    ``tokenizer`` (its ``chat_template``) or ``gguf_file`` (its metadata), in that order. Named
    templates are chosen like transformers: ``name``, else ``tool_use`` when tools are given,
    else ``default``. A path that does not exist raises :class:`ChatTemplateNotFoundError`.
    """
    own: dict[str, str] | str | None = None
    if tokenizer_config is not None:
        own = _named_templates(tokenizer_config.get("chat_template"))
    if own is None and tokenizer is not None:
        own = _named_templates(getattr(tokenizer, "chat_template", None))
    if own is None and gguf_file is not None:
        own = _gguf_templates(gguf_file)

    if isinstance(template, os.PathLike):
        return _read_template(template)
    if template is not None:
        if isinstance(own, dict) and template in own:
            return own[template]
        return _read_template(template) if _looks_like_path(template) else template
    if isinstance(own, dict):
        return _pick_named(own, name, tools)
    if own is not None:
        return own
    if default is not None:
        if isinstance(default, os.PathLike) or _looks_like_path(default):
            return _read_template(default)
        return default
    raise ChatTemplateError(
        "no chat template: none was given, the model has none, and no dialect default applies"
    )
