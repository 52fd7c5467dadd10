#!/usr/bin/env bash
# One device call for v15 (processors in the fused kernel, docs/performance.md): the per-kernel
# device times of processed calls (bench/processors_breakdown.py, D=4096), then the processors
# kernel bench with CUDA-graph replays on both shapes at the fused path's batch sizes, then
# (PARTS with "filters") the filtered methods against the compiled sort-based baselines,
# including the one whose top-p scan stays outside the graph (torch_topk_topp_compiled_es).
# Everything under $OUT (default bench/results); the short tables go to stdout last.
# Usage: PARTS="breakdown bench filters" BATCHES=1,16,64 bash scripts/gpu_session_v15.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh  # env, $OUT, GPU and versions printed, $start, wants, run_part
PARTS="${PARTS:-breakdown bench}"
BATCHES="${BATCHES:-1,16,64}"
if [[ " $PARTS " == *" breakdown "* ]]; then
  timeout -k 10 "${BREAKDOWN_TIMEOUT:-200}" python3 bench/processors_breakdown.py --shape 4096x151936 \
    --batches "$BATCHES" --iters 20 --out "$OUT" > "$OUT/processors_breakdown_console.log" 2>&1
  echo "breakdown rc=$? after $((SECONDS - start))s"; tail -30 "$OUT/processors_breakdown_console.log"
fi
if [[ " $PARTS " == *" bench "* ]]; then
  BENCH_TIMEOUT="${BENCH_TIMEOUT:-300}" bash bench/run_gpu.sh kernel --methods processors \
    --shapes "${SHAPES:-4096x151936,8192x128256}" --batches "$BATCHES" --reps 40 --repeats 1 --warmup 10 \
    --graph-methods fsdist,fsdist_bitmask,fsdist_bias_pen,fsdist_processors_all ${BENCH_EXTRA:-} \
    > "$OUT/kernel_bench_processors_console.log" 2>&1
  echo "bench rc=$? after $((SECONDS - start))s"; tail -45 "$OUT/kernel_bench_processors_console.log"
fi
if [[ " $PARTS " == *" filters "* ]]; then
  BENCH_TIMEOUT="${FILTERS_TIMEOUT:-300}" bash bench/run_gpu.sh kernel \
    --methods cublas,fsdist,fsdist_topk_topp,torch_topk_topp_compiled,torch_topk_topp_compiled_es \
    --shapes "${SHAPES:-4096x151936,8192x128256}" --batches "${FILTER_BATCHES:-1,16,64,256}" --reps 40 \
    --repeats 1 --warmup 10 --graph-methods fsdist,fsdist_topk_topp ${FILTERS_EXTRA:-} \
    > "$OUT/kernel_bench_filters_console.log" 2>&1
  echo "filters rc=$? after $((SECONDS - start))s"; tail -40 "$OUT/kernel_bench_filters_console.log"
fi
