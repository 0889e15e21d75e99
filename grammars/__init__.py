"""pegmask.grammars: grammar IR, front-ends (PEG DSL, JSON Schema, regex), the streaming parser
and the token automaton."""

from pegmask.grammars.errors import (
    GrammarError,
    GrammarTooLarge,
    ParseError,
    SchemaError,
    UnsupportedSchemaError,
)
from pegmask.grammars.grammar import Grammar
from pegmask.grammars.parser import CaptureNode, Event, ParseResult, StreamParser

__all__ = [
    "CaptureNode",
    "Event",
    "Grammar",
    "GrammarError",
    "GrammarTooLarge",
    "ParseError",
    "ParseResult",
    "SchemaError",
    "StreamParser",
    "UnsupportedSchemaError",
]
