#!/usr/bin/env bash
# One device call on one GPU (an H200 wanted) for v66 (docs/performance.md): bench/kernel_bench.py on the current code
# for one shape ($SHAPES, default 4096x151936; run again with SHAPES=8192x128256), B = $KERNEL_BATCHES (default
# 1,16,32,64,128,256), [B] parameters, eager and graph replays with L2 flushed, side by side: cuBLAS, plain fsdist,
# top-k 50 + top-p 0.9 and min-p 0.05 with their compiled baselines, the token bitmask and bias + penalties with
# theirs. JSON and logs in $OUT.
# Usage: export OUT; bash scripts/gpu_session_v66.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh
M=cublas,fsdist,fsdist_topk_topp,torch_topk_topp_compiled_es,fsdist_minp,torch_minp_compiled
M=$M,fsdist_bitmask,torch_bitmask_compiled,fsdist_bias_pen,torch_bias_pen_compiled
TAIL=40 run_part kernel "$((${KERNEL_TIMEOUT:-540} + 20))" kernel_bench_console.log \
  env BENCH_TIMEOUT="${KERNEL_TIMEOUT:-540}" bash bench/run_gpu.sh kernel --methods "$M" --graph-methods "$M" \
  --shapes "${SHAPES:-4096x151936}" --batches "${KERNEL_BATCHES:-1,16,32,64,128,256}" \
  --reps "${REPS:-30}" --repeats 1 --warmup 8
