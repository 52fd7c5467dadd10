#!/usr/bin/env bash
# One device call on one GPU for v130 (docs/performance.md): issue 14's D = 8192 cells at B = 96 / 128, which need the
# weight streamed about as fast as B <= 64 streams it. Is the 128-row tile's L2 traffic (the hidden re-read for every
# vocabulary tile: as many bytes as the weight at B = 128) what holds them back? Parts (PARTS, default "l2 boxes"),
# each cut at what is left of $CALL_BUDGET s (default 560):
#   l2     Nsight Compute's memory metrics (v99's) of one call each: cuBLAS's matmul, the ws kernel greedy and with
#          [B] temperatures, D = 8192, B = 64 / 96 / 128 (scripts/gpu_profile_ws_pipes.sh, bench/ws_profile.py)
#   boxes  B = 96's hidden read in three 32-row TMA boxes ("box32w": 96 rows a vocabulary tile) against its padded
#          128-row copy ("box0"), plain calls, graph replays timed in turns (bench/filter_probe.py --interleave),
#          D = 8192 and 4096
# ROUNDS (default 40) rounds of 5 replays a graph; L2_LIMIT / BOXES_LIMIT (s) cap the parts (240, 260).
# JSONs in $OUT, logs and the ncu CSV in $OUT/v130_logs.tgz.
# Usage: export OUT; bash scripts/gpu_session_v130.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh
pack_on_exit v130
PARTS="${PARTS:-l2 boxes}"
ROUNDS="${ROUNDS:-40}"
rc=0
if wants l2; then
  # (v99's memory metrics; cuBLAS's kernel is named nvjet_* or *gemm* by the cuBLAS version)
  NAME=v130 SHAPE=8192x128256 BATCHES=64,96,128 CASES=cublas,greedy,noise \
    KERNELS="regex:fused_sample_ws|nvjet|gemm|xmma" PROFILE_TIMEOUT="$(part_limit "${L2_LIMIT:-240}")" \
    METRICS="dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_bytes.sum,\
lts__t_sector_hit_rate.pct,lts__throughput.avg.pct_of_peak_sustained_elapsed,gpu__time_duration.sum,\
sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active" \
    bash scripts/gpu_profile_ws_pipes.sh > "$OUT/v130_l2.log" 2>&1 || rc=1
  echo "l2 rc=$rc after $((SECONDS - start))s"
  tail -25 "$OUT/v130_l2.log"
fi
if wants boxes; then
  for shape in 8192x128256 4096x151936; do
    TAIL=8 run_part "boxes_${shape%%x*}" "$(part_limit "$(( ${BOXES_LIMIT:-260} / 2 ))")" "v130_boxes_${shape%%x*}.log" \
      python3 bench/filter_probe.py --shape "$shape" --batches 96 --only graph --caps 0 --pdl box0,box32w \
      --graph-cases plain --interleave "$ROUNDS" || rc=1
  done
fi
exit $rc
