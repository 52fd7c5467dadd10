#!/usr/bin/env bash
# One device call on one GPU (nvidia-h200 preferred) for v56 (docs/performance.md): does starting the odd programs
# of stage 1's first wave late (TileConfig.stagger_us) hide the extended epilogue at B <= 32? With one program per
# SM and equal tiles, every SM runs its epilogue at once while the memory idles; two groups apart would keep it
# streaming.
#   probe runs, one per ';'-separated "SHAPE|BATCHES|CONFIGS" of $V56_RUNS (default: v56b's three below; v56a ran
#   "4096x151936|1,16|16x128x128w4s5d8,16x128x128w4s5d14,16x128x128w4s5d20"): bench/filter_probe.py --only
#   stage1,graph, [B] parameters: stage 1 alone (plain and extended, CUDA events, L2 flushed) for the shipped tile
#   and each config; whole calls as CUDA-graph replays (plain, top-k 50 + top-p 0.9, min-p 0.05) with each, and
#   whether each config gives the shipped tile's tokens. A config equal to the shipped one repeats its baseline last.
# Usage: export OUT; bash scripts/gpu_session_v56.sh      (JSONs in $OUT, logs in $OUT/v56_logs.tgz)
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh
pack_on_exit v56
S16=16x128x128w4s5
RUNS="${V56_RUNS:-4096x151936|1,16|${S16}d3,${S16}d6,${S16}d10,${S16};4096x151936|32|32x128x128w4s4d6,32x128x128w4s4d10,32x128x128w4s4;8192x128256|1,16|${S16}d6,${S16}d12,${S16}d20,${S16}}"
rc=0 n=0
IFS=';' read -ra runs <<< "$RUNS"
for run in "${runs[@]}"; do
  IFS='|' read -r shape batches configs <<< "$run"
  n=$((n + 1))
  cases="plain,k50+p0.9,min_p0.05"
  for c in ${configs//,/ }; do cases="$cases,plain $c,k50+p0.9 $c,min_p0.05 $c"; done
  TAIL=3 run_part "probe$n" "${PROBE_TIMEOUT:-300}" "v56_probe$n.log" python3 bench/filter_probe.py \
    --only stage1,graph --shape "$shape" --batches "$batches" --caps 0 --configs "$configs" --graph-cases "$cases" \
    || rc=1
done
for i in $(seq 1 $n); do grep -hE "stage1_us|graph_us" "$OUT/v56_probe$i.log" | sed 's/ same tokens=True//g'; done
grep -h "DIFFER" "$OUT"/v56_probe*.log
exit $rc
