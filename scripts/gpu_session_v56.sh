#!/usr/bin/env bash
# One device call on one GPU (nvidia-h200 preferred) for v56 (docs/performance.md): does starting the odd programs
# of stage 1's first wave late (TileConfig.stagger_us) hide the extended epilogue at B <= 16? With one program per
# SM and equal tiles, every SM runs its epilogue at once while the memory idles; two groups half a tile apart
# would keep it streaming.
#   probe: bench/filter_probe.py --only stage1,graph at B = $V56_BATCHES (default 1,16), D = $V56_SHAPE (default
#          4096x151936), [B] parameters: stage 1 alone (plain and extended, CUDA events, L2 flushed) for the shipped
#          tile and each of $V56_CONFIGS; whole calls as CUDA-graph replays (plain, top-k 50 + top-p 0.9, min-p
#          0.05) with each, and whether each config gives the shipped tile's tokens.
# Usage: export OUT; bash scripts/gpu_session_v56.sh      (JSON in $OUT, logs in $OUT/v56_logs.tgz)
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh
pack_on_exit v56
CONFIGS="${V56_CONFIGS:-16x128x128w4s5d8,16x128x128w4s5d14,16x128x128w4s5d20}"
CASES="plain,k50+p0.9,min_p0.05"
for c in ${CONFIGS//,/ }; do CASES="$CASES,plain $c,k50+p0.9 $c,min_p0.05 $c"; done
rc=0
TAIL=40 run_part probe "${PROBE_TIMEOUT:-540}" v56_probe.log python3 bench/filter_probe.py --only stage1,graph \
  --shape "${V56_SHAPE:-4096x151936}" --batches "${V56_BATCHES:-1,16}" --caps 0 --configs "$CONFIGS" \
  --graph-cases "$CASES" || rc=1
grep -hE "stage1|graph" "$OUT/v56_probe.log" | tail -60
exit $rc
