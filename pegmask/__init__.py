"""pegmask: grammar-constrained decoding for chat models.

The public facade; the implementation lives in the subpackages `pegmask.grammars`,
`pegmask.dialects`, `pegmask.kernels`, `pegmask.engine` and `pegmask.bench`.
"""

from pegmask.grammars import Grammar, GrammarError, ParseError
from pegmask.grammars.automaton import (
    CompiledGrammar,
    GrammarCompiler,
    GrammarMatcher,
    compile_grammar,
)
from pegmask.grammars.vocab import Vocabulary

__all__ = [
    "CompiledGrammar",
    "Grammar",
    "GrammarCompiler",
    "GrammarError",
    "GrammarMatcher",
    "ParseError",
    "Vocabulary",
    "compile_grammar",
]
