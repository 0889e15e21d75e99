"""The layering of `pegmask.grammars`: the front-ends (PEG DSL, regex, JSON Schema) build IR, and
nothing behind them (the program compiler, the parser, the token automaton, vocabularies)
depends on a front-end. The JSON Schema front-end expands its nodes before the IR reaches the
compiler (`Grammar.program`), and only `Grammar` (the facade) loads front-ends."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pegmask.grammars

GRAMMARS = Path(pegmask.grammars.__file__).parent
FRONT_ENDS = ("pegmask.grammars.peg", "pegmask.grammars.regex", "pegmask.grammars.json_schema")
FACADE = ("__init__", "grammar")
# Every other module of the package: the back-end and what it shares with the front-ends.
BACK_END = sorted(path.stem for path in GRAMMARS.glob("*.py")
                  if f"pegmask.grammars.{path.stem}" not in FRONT_ENDS and path.stem not in FACADE)


def _is_front_end(module: str) -> bool:
    return any(module == name or module.startswith(name + ".") for name in FRONT_ENDS)


def _imported(node: ast.Import | ast.ImportFrom) -> list[str]:
    """The modules an import statement may load (`from a import b` may load `a.b`)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    module = ".".join(filter(None, ("pegmask.grammars" if node.level else "", node.module)))
    return [module, *(f"{module}.{alias.name}" for alias in node.names)]


def test_the_back_end_is_found():
    """(An empty list would pass the tests below.)"""
    assert {"program", "compiler", "matcher", "configurations", "ir"} <= set(BACK_END)


def test_no_back_end_module_imports_a_front_end():
    """Imports inside functions count too: a lazy import is still a dependency."""
    for name in BACK_END:
        tree = ast.parse((GRAMMARS / f"{name}.py").read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found = [module for module in _imported(node) if _is_front_end(module)]
                assert not found, f"pegmask.grammars.{name} imports {found}"


def test_only_a_grammar_with_a_schema_loads_a_front_end():
    """In a fresh interpreter: the back-end (the compiler, the matcher, the program compiler,
    ...) loads no front-end, nor does compiling a grammar without a JSON Schema; compiling one
    with a schema loads the JSON Schema front-end (`Grammar.program` expands it)."""
    loaded = f"print(sorted(m for m in sys.modules if m.startswith({FRONT_ENDS!r})))\n"
    code = ("import sys\n" + "".join(f"import pegmask.grammars.{name}\n" for name in BACK_END)
            + loaded
            + "from pegmask.grammars import Grammar\n"
            + "from pegmask.grammars.ir import GrammarIR, Literal, json_schema_node\n"
            + "Grammar(GrammarIR({'root': Literal(b'x')})).compile()\n" + loaded
            + "Grammar(GrammarIR({'root': json_schema_node({'type': 'integer'})})).compile()\n"
            + loaded)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    back_end, plain, with_schema = done.stdout.splitlines()
    assert back_end == plain == "[]"
    assert "'pegmask.grammars.json_schema'" in with_schema
