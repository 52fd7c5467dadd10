#!/usr/bin/env bash
# One device call on one GPU (an H200 wanted) for v63 (docs/performance.md): the split first-wave stagger of the
# 32-row tile (plain 6 µs, extended 16 at D = 4096) as an A/B/A against the carried ab_base/ tree (the commit before
# it: 12 µs for both) at B = $AB_BATCHES (default 24,32), D = 4096 (bench/filter_probe.py --only graph: plain /
# top-k 50 + top-p 0.9 / min-p 0.05, CUDA-graph replays, L2 flushed, [B] parameters), $AB_TIMEOUT s a run (default
# 90); then the GPU tests of the new defaults in parallel groups, cut at the call's remaining time. JSONs and logs
# in $OUT.
# Usage: export OUT; bash scripts/gpu_session_v63.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh
OUT="$(cd "$OUT" && pwd)"
rc=0
AB_TIMEOUT="${AB_TIMEOUT:-90}" ab_runs v63 python3 bench/filter_probe.py --only graph --shape 4096x151936 \
  --batches "${AB_BATCHES:-24,32}" --caps 0 --graph-cases plain,k50+p0.9,min_p0.05 || rc=1
CALL_BUDGET="${CALL_BUDGET:-400}" tests_in_the_time_left \
  "tests/ops/test_sample_gpu.py -k first_wave_stagger" \
  "tests/ops/test_sample_gpu.py -k 'not first_wave_stagger'" \
  "tests/test_golden.py" \
  "tests/test_gpu_serving.py -k 'cuda_graph or chi_squared'" || rc=1
exit $rc
