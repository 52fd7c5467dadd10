#!/usr/bin/env bash
# One device call on one GPU (nvidia-h200) for what the thirty-fifth session left unrun after v80 (docs/performance.md,
# "v80 outcome"). PARTS (default "tests probe"):
#   tests  tests/test_gpu_serving.py's CUDA-graph test with filter tensors (B = 80 now on the ws 64-row tile on an
#          H200, and "80-128", the padded 128-row Triton twin under a graph) and v80's dispatch tests, beside the ws
#          kernel's 64-row filtered and partial-tile tests, in parallel groups
#   probe  bench/filter_probe.py at B = V80_BATCHES (368,384,512: fused batches past 256, some with a last 64-row tile
#          read past the hidden's end, which v80 ships unmeasured), D = 4096, graph replays, the shipped dispatch (now
#          the 64-row tile) against the 128-row config: does v80's rule hold there?
# Parts cut at what is left of $CALL_BUDGET s (default 560). JSONs in $OUT, logs in $OUT/v80_logs.tgz.
# Usage: export OUT; bash scripts/gpu_session_v80.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh
pack_on_exit v80
PARTS="${PARTS:-tests probe}"
rc=0
if wants tests; then
  TESTS_TIMEOUT=$(part_limit 300) bash scripts/gpu_tests_parallel.sh \
    "tests/test_gpu_serving.py -k cuda_graph" \
    "tests/ops/test_fused_ws_gpu.py -k 'past_64_rows_keep or filtered_calls_on or partial_64_row'" || rc=1
fi
if wants probe; then
  C=128x128x64w8s5t-ws
  TAIL=30 run_part probe "$(part_limit 240)" v80_probe.log python3 bench/filter_probe.py --shape 4096x151936 \
    --batches "${V80_BATCHES:-368,384,512}" --only graph --caps 0 --configs "$C" \
    --graph-cases "plain,k50+p0.9,min_p0.05,k50+p0.9 $C,min_p0.05 $C" || rc=1
fi
exit $rc
