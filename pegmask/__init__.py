"""pegmask: grammar-constrained decoding for chat models.

The public facade; the implementation lives in the subpackages `pegmask.grammars`,
`pegmask.dialects`, `pegmask.kernels`, `pegmask.engine` and `pegmask.bench`.
"""

from pegmask.grammars import Grammar, GrammarError, GrammarLimits, GrammarTooLarge, ParseError
from pegmask.grammars.compiler import CompiledGrammar, GrammarCompiler, compile_grammar
from pegmask.grammars.matcher import GrammarMatcher
from pegmask.grammars.vocab import Vocabulary

__all__ = [
    "CompiledGrammar",
    "Engine",
    "Grammar",
    "GrammarCompiler",
    "GrammarError",
    "GrammarLimits",
    "GrammarMatcher",
    "GrammarTooLarge",
    "ParseError",
    "Vocabulary",
    "compile_grammar",
]


def __getattr__(name: str) -> object:
    """`Engine` is imported on first use: it pulls in torch and transformers, which grammar-only
    users do not need."""
    if name == "Engine":
        from pegmask.engine import Engine

        return Engine
    raise AttributeError(f"module 'pegmask' has no attribute {name!r}")
