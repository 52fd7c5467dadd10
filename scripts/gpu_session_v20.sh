#!/usr/bin/env bash
# One device call for the fallback that recomputes only the tiles a row needs (docs/performance.md, v20):
# (PARTS with "tests") the GPU tests of the filters and the fallback, log in $OUT/gpu_tests.log; (with
# "probe") bench/fallback_probe.py (graph replays: plain, filtered as shipped, filtered with whole-row
# fallbacks); (with "kernel") the full harness's filtered methods.
# Everything under $OUT (default bench/results); the short tables go to stdout last.
# Usage: PARTS="tests probe" bash scripts/gpu_session_v20.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh  # env, $OUT, GPU and versions printed, $start, wants, run_part
PARTS="${PARTS:-tests probe}"
if [[ " $PARTS " == *" tests "* ]]; then
  timeout -k 10 "${TESTS_TIMEOUT:-330}" python3 -m pytest -q -p no:warnings -p no:cacheprovider -rfE --durations=8 \
    ${TESTS:-tests/ops/test_fallback.py tests/ops/test_select_filtered.py tests/test_filters.py tests/test_gpu_serving.py} \
    > "$OUT/gpu_tests.log" 2>&1
  echo "tests rc=$? after $((SECONDS - start))s"; tail -15 "$OUT/gpu_tests.log"
fi
if [[ " $PARTS " == *" probe "* ]]; then
  timeout -k 10 "${PROBE_TIMEOUT:-240}" python3 bench/fallback_probe.py --shape "${PROBE_SHAPE:-4096x151936}" \
    --batches "${PROBE_BATCHES:-1,16,64}" ${PROBE_EXTRA:-} > "$OUT/fallback_probe.log" 2>&1
  echo "probe rc=$? after $((SECONDS - start))s"; tail -20 "$OUT/fallback_probe.log"
fi
if [[ " $PARTS " == *" kernel "* ]]; then
  BENCH_TIMEOUT="${KERNEL_TIMEOUT:-540}" bash bench/run_gpu.sh kernel \
    --methods cublas,fsdist,fsdist_topk_topp,fsdist_minp,torch_topk_topp_compiled,torch_minp_compiled \
    --graph-methods fsdist,fsdist_topk_topp,fsdist_minp \
    --shapes "${SHAPES:-4096x151936,8192x128256}" --batches "${KERNEL_BATCHES:-1,16,64,256}" \
    --reps "${REPS:-30}" --repeats 1 --warmup 8 ${KERNEL_EXTRA:-} > "$OUT/kernel_bench_console.log" 2>&1
  echo "kernel rc=$? after $((SECONDS - start))s"; tail -60 "$OUT/kernel_bench_console.log"
fi
