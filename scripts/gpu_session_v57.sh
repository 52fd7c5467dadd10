#!/usr/bin/env bash
# One device call on one GPU (an H200 wanted) for v57 (docs/performance.md): at B = 17-32, does the warp-specialised
# 64-row tile (its epilogue beside the next tile's wgmmas, half its rows empty) beat the shipped 32-row Triton tile
# (staggered first wave since v56)? bench/filter_probe.py --only graph (plain, top-k 50 + top-p 0.9, min-p 0.05;
# CUDA-graph replays, L2 flushed, [B] parameters) at B = $V57_BATCHES (default 24,32) for D = 4096 and 8192 with the
# shipped tile and 64x128x64w8s5t-ws, and whether both give the same tokens. First, the GPU test written after v56's
# review (the staggered configs' stage-1 buffers bit for bit those of the unstaggered ones; not yet run on a GPU).
# JSONs and logs in $OUT.
# Usage: export OUT; bash scripts/gpu_session_v57.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh
WS=64x128x64w8s5t-ws
cases="plain,k50+p0.9,min_p0.05,plain $WS,k50+p0.9 $WS,min_p0.05 $WS"
rc=0
TAIL=4 run_part "stagger test" "${TEST_TIMEOUT:-200}" v57_stagger_test.log python3 -m pytest -v -p no:cacheprovider \
  tests/ops/test_sample_gpu.py -k first_wave_stagger || rc=1
for shape in 4096x151936 8192x128256; do
  TAIL=6 run_part "probe $shape" "${PROBE_TIMEOUT:-200}" "v57_probe_$shape.log" python3 bench/filter_probe.py \
    --only graph --shape "$shape" --batches "${V57_BATCHES:-24,32}" --caps 0 --configs "$WS" --graph-cases "$cases" \
    || rc=1
done
exit $rc
