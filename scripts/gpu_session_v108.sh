#!/usr/bin/env bash
# One device call on one H200 (nvidia-h200) for v108 (docs/performance.md): issue 14's final table on the H200, and
# v96's stage-1 part. Parts (PARTS, default "bench probe"), cut at what is left of $CALL_BUDGET s (default 560):
#   bench  bench/kernel_bench.py at every B of issue 14's list (1-1024 and 96 / 192 / 384 / 768), both shapes:
#          cuBLAS's matmul alone, fsdist and compiled Gumbel-max, eager and graph replays, [B] temperatures, L2
#          flushed, two interleaved runs a cell
#   probe  v96's stage 1 alone: 4 against 5 operand stages with noise and greedy at B = 512 / 768 / 1024
#          (bench/noise_cost_probe.py, three runs a cell)
# JSONs in $OUT, logs in $OUT/v108_logs.tgz. Usage: export OUT; bash scripts/gpu_session_v108.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh
pack_on_exit v108
PARTS="${PARTS:-bench probe}"
rc=0
if wants bench; then
  m=cublas,fsdist,gumbel_compiled
  lim=$(part_limit 320)
  TAIL=45 run_part bench "$lim" v108_kernel_bench_console.log env BENCH_TIMEOUT="$((lim > 25 ? lim - 15 : 10))" \
    bash bench/run_gpu.sh kernel --methods "$m" --graph-methods "$m" --shapes 4096x151936,8192x128256 \
    --batches 1,2,4,8,16,32,64,96,128,192,256,384,512,768,1024 --reps 40 --repeats 2 --warmup 5 || rc=1
fi
if wants probe; then
  TAIL=40 run_part probe "$(part_limit 200)" v96_noise_cost_console.log python3 bench/noise_cost_probe.py --repeat 3 \
    --seconds 0 --batches 512,768,1024 --methods ws_s4,ws_s5,ws_s4_greedy,ws_s5_greedy || rc=1
fi
exit $rc
