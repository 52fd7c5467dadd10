#!/usr/bin/env bash
# Device calls on one GPU (nvidia-h200 preferred; carry ["ab_base"]) for v52 (docs/performance.md): select_filtered's
# grouped pack, one-shard slot addresses and 32-bit lane keys, measured against v51's code, and the GPU tests v51's
# calls could not finish (the small-vocabulary filter tests, compile-bound).
#   tests: five pytest processes side by side (scripts/gpu_tests_parallel.sh): test_filters.py in two halves,
#          test_min_p_winners.py + test_fallback.py, test_select_filtered.py, test_gpu_serving.py (10^6-sample
#          chi-squared at V = 151936, graph capture, no sync, memory); ~5 min of compiles
#   ab:    bench/filter_probe.py --only graph (plain, top-k 50 + top-p 0.9, min-p 0.05 as CUDA-graph replays, L2
#          flushed, [B] parameters), B = $V52_BATCHES (default 1,16,64), D = 4096: the code before (ab_base/), this
#          tree's, the code before again. Build ab_base/ with v51's fsdist and this tree's bench, launch and scripts
#          (bench/common.py puts its own root first on sys.path, so a whole tree is needed; the probe's
#          --graph-cases is new):
#            rm -rf ab_base && mkdir ab_base && git archive 8c8d15c fsdist | tar -x -C ab_base \
#              && git archive HEAD bench launch scripts | tar -x -C ab_base --exclude='bench/results/*'
#   ncu:   as v51's: Nsight Compute on select_filtered_kernel (gpu_session_lib.sh's ncu_select)
#   PARTS (default "ab ncu"; "tests" alone fills a call); logs in $OUT/v52_logs.tgz, JSONs in $OUT.
# Usage: export OUT; PARTS=tests bash scripts/gpu_session_v52.sh   (one call), then
#        export OUT; bash scripts/gpu_session_v52.sh                (another)
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh
OUT="$(cd "$OUT" && pwd)"  # absolute: the "before" runs work from ab_base/
FINAL_OUT="$OUT"
PARTS="${PARTS:-ab ncu}"
rc=0
if wants tests; then
  TESTS_TIMEOUT="${TESTS_TIMEOUT:-420}" bash scripts/gpu_tests_parallel.sh \
    "tests/test_filters.py -k 'same_token or chi_squared or flat or mirror'" \
    "tests/test_filters.py -k 'not same_token and not chi_squared and not flat and not mirror'" \
    "tests/ops/test_min_p_winners.py tests/ops/test_fallback.py" \
    "tests/ops/test_select_filtered.py" \
    "tests/test_gpu_serving.py" || rc=1
  exit $rc
fi
pack_on_exit v52
PROBE=(bench/filter_probe.py --only graph --batches "${V52_BATCHES:-1,16,64}" --caps 0
       --graph-cases plain,k50+p0.9,min_p0.05)
if wants ab; then
  AB_TIMEOUT="${AB_TIMEOUT:-150}" ab_runs v52 python3 "${PROBE[@]}" || rc=1
fi
if wants ncu; then
  ncu_select v52 || rc=1
fi
exit $rc
