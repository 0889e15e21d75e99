#!/usr/bin/env bash
# One-shot GPU check, run from the repository root on a lent CUDA machine without network:
#
#   bash scripts/device_check.sh            # results in $OUT (default /tmp/device_check_out)
#   DEVICE_CHECK_CPU=1 bash scripts/device_check.sh   # the same steps on the CPU, tiny sizes
#
# The CPU run tests the steps here: PYTHON is a venv holding what the device's Python has
# (torch, triton, transformers, matplotlib for `pegmask bench serve`'s plot, ...), and
# DEVICE_CHECK_EXTRA_WHEELS a pydantic-core wheel for it where its Python is not 3.12:
#
#   PYTHON=/tmp/gpuvenv/bin/python DEVICE_CHECK_EXTRA_WHEELS=/tmp/whl311 \
#     DEVICE_CHECK_BUDGET=1000 DEVICE_CHECK_CPU=1 bash scripts/device_check.sh
#
# It needs the two ignored folders made here by `python -m pegmask.bench.gpu_check prepare`:
# .whl (the wheels the machine lacks) and .gpudata/smollm2 (SmolLM2-135M's config, tokenizer
# and chat template). Steps, each in its own process under its own time limit (a failure or
# a timeout loses only that step), all within DEVICE_CHECK_BUDGET seconds (default 390):
#   install     the wheels into $WORK/site (PYTHONPATH), pegmask laid out from the checkout
#   env         versions, GPU, whether the triton kernel runs there   -> env.json
#   make-model  random-weight SmolLM2-135M (bfloat16) in $WORK/SmolLM2-135M-Instruct-random
#   kernels     triton bitmask kernel == torch path, timings            -> kernels.json
#   decode      Engine.generate_batch, 3 modes x batch 1/8/32           -> decode.json
#   serve       pegmask serve + pegmask bench serve --url               -> serve.json
#   report      the tables                                              -> gpu.md
# Everything printed also goes to $OUT/device_check.log.
set -uo pipefail

REPO=$(pwd)
OUT=${OUT:-/tmp/device_check_out}
WORK=${DEVICE_CHECK_WORK:-/tmp/gpucheck}
PY=${PYTHON:-python3}
BUDGET=${DEVICE_CHECK_BUDGET:-390}
CPU=${DEVICE_CHECK_CPU:-0}
mkdir -p "$OUT" "$WORK"
LOG="$OUT/device_check.log"
: > "$LOG"
START=$SECONDS
export PYTHONUNBUFFERED=1 PYTHONSAFEPATH=1 PYTHONDONTWRITEBYTECODE=1
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export NO_PROXY=127.0.0.1,localhost no_proxy=127.0.0.1,localhost  # the server is on loopback
export TRITON_CACHE_DIR="$WORK/triton-cache"

say() { echo "[device_check +$((SECONDS - START))s] $*" | tee -a "$LOG"; }

# step NAME LIMIT COMMAND...: run under min(LIMIT, what the budget leaves minus a reserve for
# the report), output into the log; `timeout` ends the step's whole process group.
step() {
  local name=$1 limit=$2 rc left
  shift 2
  left=$((BUDGET - (SECONDS - START) - 15))
  if [ "$left" -lt "$limit" ]; then limit=$left; fi
  if [ "$limit" -lt 10 ]; then
    say "SKIP $name: the budget is spent"
    return 1
  fi
  say "BEGIN $name (limit ${limit}s): $*"
  GPU_CHECK_STEP_LIMIT=$limit timeout -k 10 "$limit" "$@" 2>&1 | tee -a "$LOG"
  rc=${PIPESTATUS[0]}
  say "END $name rc=$rc$([ "$rc" = 124 ] && echo ' (timed out)')"
  return "$rc"
}

say "repo $REPO, out $OUT, work $WORK, python $($PY --version 2>&1), budget ${BUDGET}s, cpu=$CPU"
command -v nvidia-smi >/dev/null && nvidia-smi 2>&1 | head -20 | tee -a "$LOG"

if [ "$CPU" = 1 ]; then
  DEVICE=cpu
  export TRITON_INTERPRET=1 OMP_NUM_THREADS=1  # a functional test on a small, shared CPU
  KERNEL_ARGS=(--cpu --batches 1,3,5 --vocabs 1000,5003 --dtypes float32,bfloat16 --repeats 2 --calls 3)
  DECODE_ARGS=(--batches 2 --max-tokens 32 --budget 300)
  SERVE_ARGS=(--clients 1,2 --max-tokens 32 --requests 2 --time-limit 90 --budget 300)
  LIMITS=(60 60 100 90 360 320)  # install env make-model kernels decode serve
else
  DEVICE=cuda
  KERNEL_ARGS=(--budget 70)
  DECODE_ARGS=(--batches 1,8,32 --max-tokens 128 --budget 120)
  SERVE_ARGS=(--clients 1,8,32 --max-tokens 128 --time-limit 25 --budget 135)
  LIMITS=(60 60 100 90 150 160)
fi

# 1. Packages: PYTHONPATH=$WORK/site holds the carried wheels and pegmask itself.
# DEVICE_CHECK_EXTRA_WHEELS: another wheel folder (a local test's cp311 pydantic-core).
EXTRA=()
if [ -n "${DEVICE_CHECK_EXTRA_WHEELS:-}" ]; then EXTRA=(--extra-wheels "$DEVICE_CHECK_EXTRA_WHEELS"); fi
step install "${LIMITS[0]}" "$PY" "$REPO/bench/gpu_check.py" install --wheels "$REPO/.whl" ${EXTRA[@]+"${EXTRA[@]}"} \
  --target "$WORK/site" --repo "$REPO" --record "$WORK/install.json"
export PYTHONPATH="$WORK/site${PYTHONPATH:+:$PYTHONPATH}"
cd "$WORK"  # nothing from the checkout's root shadows the installed layout
GC=("$PY" -m pegmask.bench.gpu_check)
MODEL="$WORK/SmolLM2-135M-Instruct-random"

# 2. Machine facts.
step env "${LIMITS[1]}" "${GC[@]}" env --out "$OUT/env.json"

# 3. The model: SmolLM2-135M's architecture and tokenizer, random weights.
step make-model "${LIMITS[2]}" "${GC[@]}" make-model --config "$REPO/.gpudata/smollm2" --out "$MODEL" \
  --device "$DEVICE" --dtype bfloat16 --seed 0

# 4. The bitmask kernel.
step kernels "${LIMITS[3]}" "${GC[@]}" kernels --out "$OUT/kernels.json" "${KERNEL_ARGS[@]}"

if [ -f "$MODEL/config.json" ]; then
  # 5. The decode loop.
  step decode "${LIMITS[4]}" "${GC[@]}" decode --model "$MODEL" --device "$DEVICE" \
    --out "$OUT/decode.json" "${DECODE_ARGS[@]}"
  # 6. The server under load.
  step serve "${LIMITS[5]}" "${GC[@]}" serve --model "$MODEL" --device "$DEVICE" \
    --work "$WORK/serve" --out "$OUT/serve.json" "${SERVE_ARGS[@]}"
else
  say "no model: decode and serve skipped"
fi

# 7. The tables (also made later here: python -m pegmask.bench.gpu_check report DIR).
say "BEGIN report"
timeout -k 5 30 "${GC[@]}" report "$OUT" --out "$OUT/gpu.md" >>"$LOG" 2>&1
say "END report rc=$?"
say "done in $((SECONDS - START))s; results: $(cd "$OUT" && ls | tr '\n' ' ')"
