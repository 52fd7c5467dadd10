#!/usr/bin/env bash
# One device call on one H200 (nvidia-h200) for v96 (docs/performance.md): does the H100's 4-stage rule for the
# warp-specialised 128-row tile (configs.WS_FEWER_STAGES_FROM, v91-v95) pay on fast memory too? Parts (PARTS, default
# "probe whole tests"), cut at what is left of $CALL_BUDGET s (default 560):
#   probe  bench/noise_cost_probe.py, stage 1 alone, 4 and 5 stages (absolute) with noise and greedy, B = 512 / 768 /
#          1024, both shapes, three runs a cell
#   whole  bench/filter_probe.py graph replays of whole plain calls in A/B/A/B order: the dispatch (5 stages on fast
#          memory) against the same tile forced to 4 stages, B = 768 / 1024, both shapes
#   tests  the GPU tests of the 4-stage and hand-off variants (tests/ops/test_fused_ws_gpu.py), and the no-sync and
#          CUDA-graph serving tests (not run since the 4-stage rule was narrowed to the ws kernel)
# JSONs in $OUT, logs in $OUT/v96_logs.tgz. Usage: export OUT; bash scripts/gpu_session_v96.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh
pack_on_exit v96
PARTS="${PARTS:-probe whole tests}"
rc=0
if wants probe; then
  TAIL=40 run_part probe "$(part_limit 200)" v96_noise_cost_console.log python3 bench/noise_cost_probe.py --repeat 3 \
    --seconds 0 --batches 512,768,1024 --methods ws_s4,ws_s5,ws_s4_greedy,ws_s5_greedy || rc=1
fi
if wants whole; then
  C4=128x128x64w8s4t-ws
  for shape in 4096x151936 8192x128256; do
    TAIL=4 run_part "whole_${shape%%x*}" "$(part_limit 100)" "v96_whole_${shape%%x*}.log" \
      python3 bench/filter_probe.py --shape "$shape" --batches 768,1024 --only graph --caps 0 --configs "$C4" \
      --graph-cases "plain,plain $C4,plain,plain $C4" || rc=1
  done
fi
if wants tests; then
  TESTS_TIMEOUT=$(part_limit 150) bash scripts/gpu_tests_parallel.sh \
    "tests/ops/test_fused_ws_gpu.py -k 'hand_off or ties'" \
    "tests/test_gpu_serving.py -k 'cuda_graph or never_synchron'" || rc=1
fi
exit $rc
