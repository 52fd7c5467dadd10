#!/usr/bin/env bash
# One device call on one GPU (nvidia-h200 preferred) for v53 (docs/performance.md): does another stage-1 tile at
# B <= 16 hide the extended epilogue (kept logits) that a filtered call adds? The shipped 16x128x128 w4 s5 tile runs
# one 4-warp program per SM, so the epilogue of each of its ~9 tiles per SM is paid in full.
#   probe: bench/filter_probe.py --only stage1,kernels,graph at B = $V53_BATCHES (default 1,16), D = 4096, [B]
#          parameters: stage 1 alone (plain and extended, CUDA events, L2 flushed) for the shipped tile and each of
#          $V53_CONFIGS; per-kernel device time of whole calls; whole calls as CUDA-graph replays (plain, top-k 50 +
#          top-p 0.9, min-p 0.05) with each config, and whether each config gives the shipped tile's tokens.
# Usage: export OUT; bash scripts/gpu_session_v53.sh      (JSON in $OUT, logs in $OUT/v53_logs.tgz)
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh
pack_on_exit v53
CONFIGS="${V53_CONFIGS:-16x128x128w8s5,16x128x128w8s4,16x128x128w4s6,16x128x128w4s3,16x128x64w4s6}"
CASES="plain,k50+p0.9,min_p0.05"
for c in ${CONFIGS//,/ }; do CASES="$CASES,plain $c,k50+p0.9 $c,min_p0.05 $c"; done
rc=0
TAIL=40 run_part probe "${PROBE_TIMEOUT:-540}" v53_probe.log python3 bench/filter_probe.py --only stage1,kernels,graph \
  --batches "${V53_BATCHES:-1,16}" --caps 0 --configs "$CONFIGS" --graph-cases "$CASES" || rc=1
grep -hE "stage1|graph" "$OUT/v53_probe.log" | tail -60
exit $rc
