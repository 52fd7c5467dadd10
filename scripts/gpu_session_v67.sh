#!/usr/bin/env bash
# One device call on one GPU (an H200 wanted) for v67 (docs/performance.md): bias + penalties (1,000 ids a row) at
# B = 17-32, where v66 found 1.115x plain on the H200 (D = 4096, the 32-row Triton tile): bench/filter_probe.py
# --only graph (CUDA-graph replays, L2 flushed, [B] parameters) with the shipped tile, the warp-specialised 64-row tile
# on a zero-padded hidden (--pad-tile-rows 64; its processors run beside the next tile's wgmmas), and the 32-row tile
# with the extended calls' 16 µs stagger and with none, at B = 24 / 32 for D = 4096 and B = 32 for D = 8192, and
# whether every variant gives the shipped tokens. JSONs and logs in $OUT.
# Usage: export OUT; bash scripts/gpu_session_v67.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh
WS=64x128x64w8s5t-ws
rc=0
for shape in 4096x151936 8192x128256; do
  if [ "$shape" = 4096x151936 ]; then batches=24,32; else batches=32; fi
  cfgs="$WS,32x128x128w4s5d16,32x128x128w4s5"
  cases="plain,bias_pen,bias_pen $WS,bias_pen 32x128x128w4s5d16,bias_pen 32x128x128w4s5"
  TAIL=8 run_part "probe $shape" "${PROBE_TIMEOUT:-200}" "v67_probe_$shape.log" python3 bench/filter_probe.py \
    --only graph --shape "$shape" --batches "$batches" --caps 0 --configs "$cfgs" --graph-cases "$cases" \
    --pad-tile-rows 64 || rc=1
done
exit $rc
