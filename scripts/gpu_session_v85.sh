#!/usr/bin/env bash
# One device call on one GPU (nvidia-h100-x1) for v85 (docs/performance.md): do the H200-only tile rules for extended
# calls (``fast_memory``) pay on an H100 too? PARTS (default "probe large"):
#   probe  bench/filter_probe.py, graph replays, both shapes, B = V85_BATCHES (24,32,96,128,256), plain, top-k 50 +
#          top-p 0.9 and min-p 0.05 on the H100's dispatch (the 32-row Triton tile at B = 24 / 32, the 128-row Triton
#          twin at B = 96-256) and on the ws 64-row tile (what the H200 runs there at D = 4096); twice, to see the
#          spread of one run
#   large  issue 14's large batches again (as v84's part "large"): the spread between two runs on the H100
# Parts cut at what is left of $CALL_BUDGET s (default 560). JSONs in $OUT, logs in $OUT/v85_logs.tgz.
# Usage: export OUT; bash scripts/gpu_session_v85.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh
pack_on_exit v85
PARTS="${PARTS:-probe large}"
rc=0
if wants probe; then
  C=64x128x64w8s5t-ws
  for run in 1 2; do
    for shape in 4096x151936 8192x128256; do
      TAIL=12 run_part "probe$run" "$(part_limit 120)" "v85_probe_${shape%%x*}_run$run.log" \
        python3 bench/filter_probe.py --shape "$shape" --batches "${V85_BATCHES:-24,32,96,128,256}" --only graph \
        --caps 0 --configs "$C" --graph-cases "plain,k50+p0.9,min_p0.05,plain $C,k50+p0.9 $C,min_p0.05 $C" || rc=1
    done
  done
fi
if wants large; then
  TAIL=20 large_batches_bench || rc=1
fi
exit $rc
