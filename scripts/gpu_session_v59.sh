#!/usr/bin/env bash
# One device call on one H200 for v59 (docs/performance.md), D = 4096, CUDA-graph replays, L2 flushed, [B] parameters,
# plain / top-k 50 + top-p 0.9 / min-p 0.05 (bench/filter_probe.py --only graph):
#   1. B = 32: the shipped 32-row tile against other 32-row configs (warps, stages, BLOCK_K, stagger) and two 16-row
#      batch tiles; B = 16: the stagger's size (tuned on an H100 only) against 6 and 24 µs
#   2. the v54 branch (kept logits side by side) as an A/B/A at B = 16 / 32 / 64: the carried ab_base/ holds the
#      v54 tree, so the runs are v54 / this tree / v54 (logs v59_ab_before = v54, v59_ab_after = main)
# PARTS (default "configs v54") picks parts. JSONs and logs in $OUT.
# Usage: export OUT; bash scripts/gpu_session_v59.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh
OUT="$(cd "$OUT" && pwd)"
PARTS="${PARTS:-configs v54}"
rc=0
cases_for() {  # graph-case names of the default call and of each config given
  local out="plain,k50+p0.9,min_p0.05" c
  for c in "$@"; do out+=",plain $c,k50+p0.9 $c,min_p0.05 $c"; done
  echo "$out"
}
if wants configs; then
  C32="32x128x128w8s4d12 32x128x128w4s5d12 32x128x64w4s6d12 32x128x128w4s4d6 32x128x128w4s4d24 16x128x128w4s5d12"
  TAIL=8 run_part "configs B=32" "${PROBE_TIMEOUT:-200}" v59_configs_b32.log python3 bench/filter_probe.py --only graph \
    --shape 4096x151936 --batches 32 --caps 0 --configs "${C32// /,}" --graph-cases "$(cases_for $C32)" || rc=1
  C16="16x128x128w4s5d6 16x128x128w4s5d24"
  TAIL=5 run_part "configs B=16" "${PROBE_TIMEOUT:-200}" v59_configs_b16.log python3 bench/filter_probe.py --only graph \
    --shape 4096x151936 --batches 16 --caps 0 --configs "${C16// /,}" --graph-cases "$(cases_for $C16)" || rc=1
fi
if wants v54; then
  AB_TIMEOUT="${AB_TIMEOUT:-110}" ab_runs v59 python3 bench/filter_probe.py --only graph --shape 4096x151936 \
    --batches 16,32,64 --caps 0 --graph-cases plain,k50+p0.9,min_p0.05 || rc=1
fi
exit $rc
