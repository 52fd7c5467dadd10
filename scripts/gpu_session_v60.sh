#!/usr/bin/env bash
# One device call on one GPU (run it on an H200 and on an H100) for v60 (docs/performance.md): the 32-row Triton tile
# with 5 pipeline stages (32x128x128w4s5d12, the v59 probe's winner on an H200) against the shipped 4 stages, at
# B = $V60_BATCHES (default 20,32) for D = 4096 and 8192: bench/filter_probe.py --only graph, plain / top-k 50 +
# top-p 0.9 / min-p 0.05, CUDA-graph replays, L2 flushed, [B] parameters, and whether both give the same tokens.
# JSONs and logs in $OUT.
# Usage: export OUT; bash scripts/gpu_session_v60.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh
rc=0
for shape in 4096x151936:12 8192x128256:12; do
  S5="32x128x128w4s5d${shape#*:}"
  cases="plain,k50+p0.9,min_p0.05,plain $S5,k50+p0.9 $S5,min_p0.05 $S5"
  TAIL=3 run_part "probe ${shape%:*}" "${PROBE_TIMEOUT:-200}" "v60_probe_${shape%:*}.log" python3 bench/filter_probe.py \
    --only graph --shape "${shape%:*}" --batches "${V60_BATCHES:-20,32}" --caps 0 --configs "$S5" --graph-cases "$cases" \
    || rc=1
done
exit $rc
