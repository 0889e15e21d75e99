"""pegmask inside vLLM (`pip install pegmask[vllm]`).

`register()` is the `vllm.general_plugins` entry point: vLLM runs it in every process before it
reads its flags, so every pegmask dialect is a tool-call parser and a reasoning parser named
`pegmask-<dialect>` (`--tool-call-parser pegmask-hermes --reasoning-parser pegmask-hermes`).
The parsers (`pegmask.integrations.vllm.parsers`) are imported on first use.

The masks come from `pegmask.integrations.vllm.logits:PegmaskLogitsProcessor`, passed with
`--logits-processors` (both model runners' interfaces). A request asks for a grammar through
`vllm_xargs={"pegmask": <constraint JSON>}` (`pegmask.integrations.constraints`); the pegmask
tool parsers fill that in with the dialect's tool-call grammar for requests with tools.
"""

from __future__ import annotations

from pegmask.dialects import dialect_names

PARSERS_MODULE = "pegmask.integrations.vllm.parsers"


def parser_name(dialect: str) -> str:
    """The `--tool-call-parser` / `--reasoning-parser` name of a dialect."""
    return f"pegmask-{dialect}"


def parser_class_name(dialect: str, kind: str) -> str:
    """`HermesXmlToolParser`, `HarmonyReasoningParser`, ... (kind: "Tool" or "Reasoning")."""
    return "".join(part.title() for part in dialect.split("-")) + f"{kind}Parser"


def register() -> None:
    """Register every dialect's tool and reasoning parser with vLLM (lazily: imported when a
    server names one)."""
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager

    for dialect in dialect_names():
        ToolParserManager.register_lazy_module(
            parser_name(dialect), PARSERS_MODULE, parser_class_name(dialect, "Tool"))
        ReasoningParserManager.register_lazy_module(
            parser_name(dialect), PARSERS_MODULE, parser_class_name(dialect, "Reasoning"))
