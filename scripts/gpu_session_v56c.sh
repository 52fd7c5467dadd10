#!/usr/bin/env bash
# One device call on one GPU for v56c (docs/performance.md): the first-wave stagger as the B <= 32 default.
#   tests: the filter kernels' GPU tests (gpu_session_lib.sh's filter_gpu_tests groups) plus the golden tokens and the
#          processors' GPU tests, six pytest processes side by side, each cut at $TESTS_TIMEOUT s (default 260)
#   ab:    bench/filter_probe.py --only graph (plain, top-k 50 + top-p 0.9, min-p 0.05; CUDA-graph replays, L2 flushed,
#          [B] parameters) at B = $AB_BATCHES (default 1,16,32), D = 4096, as an A/B/A against the carried ab_base/
#          tree (the code before: 0b7f873), $AB_TIMEOUT s a run (default 100)
#   PARTS (default "tests ab"). JSONs in $OUT, logs in $OUT/v56c_logs.tgz.
# Usage: export OUT; bash scripts/gpu_session_v56c.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh
OUT="$(cd "$OUT" && pwd)"
PARTS="${PARTS:-tests ab}"
rc=0
if wants tests; then
  TESTS_TIMEOUT="${TESTS_TIMEOUT:-260}" bash scripts/gpu_tests_parallel.sh \
    "tests/ops/test_fused_ws_gpu.py -k 'writes_the_triton or filtered_calls' tests/ops/test_sample_gpu.py" \
    "tests/ops/test_kept_logits.py tests/ops/test_select_filtered.py" \
    "tests/ops/test_fallback.py tests/ops/test_min_p_winners.py" \
    "tests/test_gpu_serving.py" \
    "tests/test_filters.py -k 'same_token or chi_squared or flat or mirror'" \
    "tests/test_golden.py tests/test_processors_gpu.py" || rc=1
fi
pack_on_exit v56c
if wants ab; then
  AB_TIMEOUT="${AB_TIMEOUT:-100}" ab_runs v56c python3 bench/filter_probe.py --only graph \
    --batches "${AB_BATCHES:-1,16,32}" --caps 0 --graph-cases plain,k50+p0.9,min_p0.05 || rc=1
fi
exit $rc
