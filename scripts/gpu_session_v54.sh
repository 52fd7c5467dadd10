#!/usr/bin/env bash
# One device call on one GPU (nvidia-h200 preferred; carry ["ab_base"]) for v54 (docs/performance.md): the kept
# logits laid out [tile, row, KEEP] (layout.kept_offset), checked on the GPU and timed against the layout before.
#   tests: five pytest processes side by side (scripts/gpu_tests_parallel.sh), $TESTS_TIMEOUT s (default 300): the
#          warp-specialised 64-row tile's fields and filtered calls against the Triton kernel's, the kept-logit and
#          select / fallback / winners suites, the serving tests (10^6-sample chi-squared at V = 151936, graphs, no
#          sync, memory), test_filters' real-vocabulary cases
#   ab:    bench/filter_probe.py --only graph (plain, top-k 50 + top-p 0.9, min-p 0.05; CUDA-graph replays, L2
#          flushed, [B] parameters), B = $V54_BATCHES (default 1,16,64), D = 4096: the code before (ab_base/), this
#          tree's, the code before again. Build ab_base/ with the previous layout's fsdist and this tree's bench,
#          launch and scripts:
#            rm -rf ab_base && mkdir ab_base && git archive e993dbe fsdist | tar -x -C ab_base \
#              && git archive HEAD bench launch scripts | tar -x -C ab_base --exclude='bench/results/*'
#   PARTS (default "tests ab"). Usage: export OUT; bash scripts/gpu_session_v54.sh  (logs in $OUT/v54_logs.tgz)
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh
OUT="$(cd "$OUT" && pwd)"
PARTS="${PARTS:-tests ab}"
rc=0
if wants tests; then
  TESTS_TIMEOUT="${TESTS_TIMEOUT:-300}" bash scripts/gpu_tests_parallel.sh \
    "tests/ops/test_fused_ws_gpu.py -k 'writes_the_triton or filtered_calls or padded_partial_tile_writes'" \
    "tests/ops/test_kept_logits.py tests/ops/test_select_filtered.py" \
    "tests/ops/test_fallback.py tests/ops/test_min_p_winners.py" \
    "tests/test_gpu_serving.py" \
    "tests/test_filters.py -k 'same_token or chi_squared or flat or mirror'" || rc=1
fi
pack_on_exit v54
PROBE=(bench/filter_probe.py --only graph --batches "${V54_BATCHES:-1,16,64}" --caps 0
       --graph-cases plain,k50+p0.9,min_p0.05)
if wants ab; then
  AB_TIMEOUT="${AB_TIMEOUT:-130}" ab_runs v54 python3 "${PROBE[@]}" || rc=1
fi
exit $rc
