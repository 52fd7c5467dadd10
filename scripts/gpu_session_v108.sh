#!/usr/bin/env bash
# One device call on one H200 (nvidia-h200) for v108 (docs/performance.md): issue 14's final table on the H200, and
# v96's stage-1 part. Parts (PARTS, default "bench probe"), cut at what is left of $CALL_BUDGET s (default 560):
#   bench  bench/kernel_bench.py (gpu_session_lib.sh's large_batches_bench) at every B of issue 14's list (1-1024
#          and 96 / 192 / 384 / 768), both shapes: cuBLAS's matmul alone, fsdist and compiled Gumbel-max, eager and
#          graph replays, [B] temperatures, L2 flushed, two interleaved runs a cell
#   probe  v96's stage 1 alone: 4 against 5 operand stages with noise and greedy at B = 512 / 768 / 1024
#          (scripts/gpu_session_v96.sh's probe part: bench/noise_cost_probe.py, three runs a cell)
# LARGE_BATCHES, LARGE_REPS, LARGE_REPEATS and LARGE_LIMIT (s) trim the bench part for a short call.
# JSONs in $OUT, logs in $OUT/v108_logs.tgz (the probe's in v96_logs.tgz).
# Usage: export OUT; bash scripts/gpu_session_v108.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh
FINAL="$OUT"
pack_on_exit v108
PARTS="${PARTS:-bench probe}"
rc=0
if wants bench; then
  TAIL=45 LARGE_LIMIT="${LARGE_LIMIT:-320}" LARGE_REPS="${LARGE_REPS:-40}" LARGE_REPEATS="${LARGE_REPEATS:-2}" \
    LARGE_LOG=v108_kernel_bench_console.log \
    LARGE_BATCHES="${LARGE_BATCHES:-1,2,4,8,16,32,64,96,128,192,256,384,512,768,1024}" large_batches_bench || rc=1
fi
if wants probe; then
  OUT="$FINAL" CALL_BUDGET=$(part_limit 200) PARTS=probe bash scripts/gpu_session_v96.sh || rc=1
fi
exit $rc
