#!/usr/bin/env bash
# One device call on one GPU (nvidia-h100-x1) for v123 (docs/performance.md): a filtered call's stage-1 tiles draw
# no noise where none of their rows reads it (configs.SKIP_FILTERED_NOISE). Parts (PARTS, default "tests probe"),
# each cut at what is left of $CALL_BUDGET s (default 560):
#   tests  in parallel groups: tests/ops/test_skip_noise.py (the Triton tile, the ws 64- and 128-row tiles: candidates
#          with and without the skip, whole calls, scalar filters), the ws kernel's filtered-call tests (ws against
#          the Triton tile, both skipping), the 10^6-sample filtered chi-squared and the no-sync / graph tests of
#          test_gpu_serving.py, test_filters.py
#   probe  bench/filter_probe.py graph replays at D = 4096, A/B/A/B of the switch off ("noskip") and on ("skip"):
#          plain, top-k 50 + top-p 0.9, min-p 0.05 (which never asks for the skip: a control), and top-k + top-p with
#          every 8th row unfiltered ("mixed": every tile still draws; what the skip's code costs); batches $B4096
#   probe8192  the same at D = 8192 (v122: the saving there is 7-9% of stage 1); batches $B8192
# TESTS_LIMIT, PROBE_LIMIT and P8192_LIMIT (s) cap the parts (240, 200, 200). JSONs in $OUT, logs in $OUT/v123_logs.tgz.
# The first call (2026-12-07) cut the four test groups at 210 s: give them 400 (PARTS=tests TESTS_LIMIT=400).
# Usage: export OUT; bash scripts/gpu_session_v123.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh
pack_on_exit v123
PARTS="${PARTS:-tests probe}"
rc=0
if wants tests; then
  TESTS_TIMEOUT=$(part_limit "${TESTS_LIMIT:-240}") bash scripts/gpu_tests_parallel.sh \
    "tests/ops/test_skip_noise.py" \
    "tests/ops/test_fused_ws_gpu.py -k 'filtered_calls'" \
    "tests/test_gpu_serving.py -k 'filtered or synchronises or graph'" \
    "tests/test_filters.py" || rc=1
fi
if wants probe; then
  TAIL=40 run_part probe "$(part_limit "${PROBE_LIMIT:-200}")" v123_probe.log python3 bench/filter_probe.py \
    --shape 4096x151936 --batches "${B4096:-64,256,1024}" --only graph --caps 0 \
    --pdl "${V123_PDL:-noskip,skip,noskip,skip}" --graph-cases "${V123_CASES:-plain,k50+p0.9,min_p0.05,k50+p0.9 mixed}" || rc=1
fi
if wants probe8192; then
  TAIL=30 run_part probe8192 "$(part_limit "${P8192_LIMIT:-200}")" v123_probe_8192.log python3 bench/filter_probe.py \
    --shape 8192x128256 --batches "${B8192:-256,1024}" --only graph --caps 0 \
    --pdl "${V123_PDL:-noskip,skip,noskip,skip}" --graph-cases "${V123_CASES:-plain,k50+p0.9,min_p0.05,k50+p0.9 mixed}" \
    || rc=1
fi
exit $rc
