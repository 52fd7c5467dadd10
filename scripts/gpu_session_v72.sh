#!/usr/bin/env bash
# One device call on one GPU (an H200 wanted) for v72 (docs/performance.md): select_filtered's k-th largest and top-p
# over P's packed lanes from one sort (branch v72-sorted-top-p) as an A/B/A against main. Run it from a checkout of
# the branch, with ab_base/ = main's fsdist / bench / scripts (carry ["ab_base"]):
#   git checkout v72-sorted-top-p && rm -rf ab_base && mkdir ab_base
#   git archive main fsdist bench scripts | tar -x -C ab_base
# bench/filter_probe.py --only graph (plain / top-k 50 + top-p 0.9 / min-p 0.05, CUDA-graph replays, L2 flushed, [B]
# parameters) at D = 4096, B = $AB_BATCHES (default 1,16,64), $AB_TIMEOUT s a run (default 120); then the GPU tests of
# select_filtered's callers (the kept-logit / select / fallback / min-p winner suites, the serving tests) and
# test_filters' real-vocabulary cases, cut at the call's remaining time. JSONs and logs in $OUT.
# Usage: export OUT; bash scripts/gpu_session_v72.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh
OUT="$(cd "$OUT" && pwd)"
rc=0
AB_TIMEOUT="${AB_TIMEOUT:-120}" ab_runs v72 python3 bench/filter_probe.py --only graph --shape 4096x151936 \
  --batches "${AB_BATCHES:-1,16,64}" --caps 0 --graph-cases plain,k50+p0.9,min_p0.05 || rc=1
CALL_BUDGET="${CALL_BUDGET:-560}" tests_in_the_time_left \
  "tests/ops/test_kept_logits.py tests/ops/test_select_filtered.py" \
  "tests/ops/test_fallback.py tests/ops/test_min_p_winners.py" \
  "tests/test_gpu_serving.py -k 'chi_squared or cuda_graph'" \
  "tests/test_filters.py -k 'same_token or chi_squared or flat or mirror'" || rc=1
exit $rc
