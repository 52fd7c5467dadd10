#!/usr/bin/env bash
# One device call for the filtered path (issue 11, v14) and the real-size decode loop (issue 13):
#   1. bench/filter_probe.py (PROBE_BATCHES, PROBE_EXTRA e.g. "--shape 8192x128256", PROBE_TIMEOUT):
#      select_filtered per search cap, whole calls as CUDA
#      graphs (filtered with the packed and the full search, plain), B = 1, 16, 64, 256
#                                                    -> $OUT/filter_probe.log, filter_probe_*.json
#   2. examples/generate.py at its real size (Llama-shaped, hidden 4096, V = 128256, fp32 and
#      bf16): greedy equal to model.generate, sampled rows, fsdist's batch invariance on the
#      model's hidden states                               -> $OUT/generate_real_{float32,bfloat16}.log
#   3. GPU tests with what is left of the call: the packed search, the kept logits, the
#      fp32 stage fit, tests/test_gpu_serving.py (10^6-draw chi-squared at V=151936, graphs,
#      no host sync, peak memory) and tests/test_filters.py on CUDA      -> $OUT/gpu_tests.log
# Usage: bash scripts/gpu_session_filters.sh [seconds for the whole call, 570]
# PARTS picks steps: "probe generate tests" (default), e.g. PARTS=tests gives the tests the whole
# call. A fresh machine compiles every kernel first: on an H100 (2026-11-24) the tests alone need
# more than one call, and each decode loop ~150-200 s.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh
OUT="${OUT:-bench/results}"
PARTS=" ${PARTS:-probe generate tests} "
mkdir -p "$OUT"
start=$SECONDS
total="${1:-570}"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
if [[ "$PARTS" == *" probe "* ]]; then
  timeout -s INT -k 20 "${PROBE_TIMEOUT:-200}" python3 bench/filter_probe.py --only select,graph --batches "${PROBE_BATCHES:-1,16,64,256}" ${PROBE_EXTRA:-} \
    > "$OUT/filter_probe.log" 2>&1
  echo "probe rc=$? after $((SECONDS - start))s"
  cp bench/results/filter_probe_*.json "$OUT/" 2>/dev/null
  grep -E "^B=" "$OUT/filter_probe.log"
fi
if [[ "$PARTS" == *" generate "* ]]; then
  for dt in float32 bfloat16; do
    timeout -k 10 "${GEN_TIMEOUT:-240}" python3 examples/generate.py --size real --dtype "$dt" --modes greedy sampled \
      > "$OUT/generate_real_${dt}.log" 2>&1
    echo "generate $dt rc=$? after $((SECONDS - start))s"; tail -8 "$OUT/generate_real_${dt}.log"
  done
fi
[[ "$PARTS" == *" tests "* ]] || exit 0
left=$((total - (SECONDS - start) - 15))
[ "$left" -gt 60 ] || { echo "only ${left}s left: no tests"; exit 0; }
timeout -s INT -k 20 "$left" python3 -m pytest -q -p no:warnings -p no:cacheprovider -rfE --durations=15 \
  tests/ops/test_select_filtered.py tests/ops/test_kept_logits.py tests/ops/test_configs.py \
  tests/test_gpu_serving.py tests/test_filters.py > "$OUT/gpu_tests.log" 2>&1
echo "tests rc=$? after $((SECONDS - start))s"
grep -E " passed| failed| error|^FAILED|^ERROR" "$OUT/gpu_tests.log" | tail -12
