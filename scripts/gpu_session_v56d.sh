#!/usr/bin/env bash
# One device call on one GPU for v56d (docs/performance.md), decided by the GPU that came:
#   an H200: bench/filter_probe.py --only graph (plain, top-k 50 + top-p 0.9, min-p 0.05; CUDA-graph replays, L2
#            flushed, [B] parameters) at B = $AB_BATCHES (default 1,16,32,64), D = 4096, as an A/B/A against the carried
#            ab_base/ tree (the code before the stagger: 0b7f873), $AB_TIMEOUT s a run (default 110)
#   else:    the GPU tests v56c's 260 s cut, one file a process, each cut at $TESTS_TIMEOUT s (default 330)
# FORCE=ab or FORCE=tests picks a part whatever the GPU. JSONs and logs in $OUT.
# Usage: export OUT; bash scripts/gpu_session_v56d.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh
OUT="$(cd "$OUT" && pwd)"
part=$(part_for_gpu ab tests)
rc=0
if [ "$part" = ab ]; then
  AB_TIMEOUT="${AB_TIMEOUT:-110}" ab_runs v56d python3 bench/filter_probe.py --only graph \
    --batches "${AB_BATCHES:-1,16,32,64}" --caps 0 --graph-cases plain,k50+p0.9,min_p0.05 || rc=1
else
  TESTS_TIMEOUT="${TESTS_TIMEOUT:-330}" bash scripts/gpu_tests_parallel.sh \
    tests/ops/test_kept_logits.py tests/ops/test_select_filtered.py tests/ops/test_fallback.py \
    tests/ops/test_min_p_winners.py tests/test_gpu_serving.py \
    "tests/test_filters.py -k 'same_token or chi_squared or flat or mirror'" || rc=1
fi
exit $rc
