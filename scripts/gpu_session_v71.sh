#!/usr/bin/env bash
# One device call on one GPU (an H200 wanted) for v71 or v72 (docs/performance.md), candidates of select_filtered on
# branches: v71-lazy-ids (U's ids loaded only where a branch uses them) and v72-sorted-top-p (the k-th largest and
# top-p over P from one sort), each as an A/B/A against main. Run it from a checkout of the branch, with ab_base/ =
# main's fsdist / bench / scripts (carry ["ab_base"]), and NAME=v71 (default) or NAME=v72:
#   git checkout v71-lazy-ids && rm -rf ab_base && mkdir ab_base
#   git archive main fsdist bench scripts | tar -x -C ab_base
# bench/filter_probe.py --only graph (plain / top-k 50 + top-p 0.9 / min-p 0.05, CUDA-graph replays, L2 flushed, [B]
# parameters) at D = 4096, B = $AB_BATCHES (default 1,16,64), $AB_TIMEOUT s a run (default 120); then the GPU tests of
# select_filtered's callers (the kept-logit / select / fallback / min-p winner suites, the serving tests,
# test_filters' real-vocabulary cases) and the ws processors test at B = 24 that v70's review added, cut at the call's
# remaining time. JSONs and logs in $OUT.
# Usage: export OUT; NAME=v71 bash scripts/gpu_session_v71.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh
OUT="$(cd "$OUT" && pwd)"
rc=0
AB_TIMEOUT="${AB_TIMEOUT:-120}" ab_runs "${NAME:-v71}" python3 bench/filter_probe.py --only graph \
  --shape 4096x151936 --batches "${AB_BATCHES:-1,16,64}" --caps 0 --graph-cases plain,k50+p0.9,min_p0.05 || rc=1
CALL_BUDGET="${CALL_BUDGET:-560}" tests_in_the_time_left \
  "tests/ops/test_kept_logits.py tests/ops/test_select_filtered.py" \
  "tests/ops/test_fallback.py tests/ops/test_min_p_winners.py" \
  "tests/test_gpu_serving.py -k 'chi_squared or cuda_graph'" \
  "tests/test_filters.py -k 'same_token or chi_squared or flat or mirror'" \
  "tests/ops/test_fused_ws_gpu.py -k 'processors and 24'" || rc=1
exit $rc
