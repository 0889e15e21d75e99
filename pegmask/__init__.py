"""pegmask: grammar-constrained decoding for chat models.

The public facade; the implementation lives in the subpackages `pegmask.grammars`,
`pegmask.dialects`, `pegmask.kernels`, `pegmask.engine` and `pegmask.bench`.
"""

from pegmask.grammars import Grammar, GrammarError, ParseError

__all__ = ["Grammar", "GrammarError", "ParseError"]
