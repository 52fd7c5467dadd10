#!/usr/bin/env bash
# One device call for issue 14 (docs/performance.md, v16): which fused tile configs hide their epilogue
# at B > 64 (bench/epilogue_bench.py: cuBLAS alone, fp32-output cuBLAS, fsdist.sample as shipped, the
# fused kernel under each config, cuBLAS + compiled Gumbel argmax; [B] parameter tensors), then
# (PARTS with "kernel") the full harness at issue 14's batch sizes.
# Everything under $OUT (default bench/results); the short tables go to stdout last.
# (PARTS with "probe": bench/large_batch_probe.py first; with "tests": the GPU tests of the large-batch
# paths last, log in $OUT/gpu_tests.log.)
# Usage: PARTS="probe configs kernel" CONFIGS=64x128x64w4s4t,... BATCHES=96,128 bash scripts/gpu_session_v16.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh  # env, $OUT, GPU and versions printed, $start, wants, run_part
PARTS="${PARTS:-configs}"
BATCHES="${BATCHES:-96,128,192,256,384,512,768,1024}"
CONFIGS="${CONFIGS:-64x128x64w4s4t,64x128x64w4s3t,64x128x64w4s4,128x128x64w8s3t,128x128x64w8s4t,64x128x128w4s2t}"
if [[ " $PARTS " == *" probe "* ]]; then
  timeout -k 10 "${PROBE_TIMEOUT:-150}" python3 bench/large_batch_probe.py --shape "${PROBE_SHAPE:-4096x151936}" \
    --batches "${PROBE_BATCHES:-128,192,256}" > "$OUT/large_batch_probe.log" 2>&1
  echo "probe rc=$? after $((SECONDS - start))s"; cat "$OUT/large_batch_probe.log"
fi
if [[ " $PARTS " == *" configs "* ]]; then
  timeout -k 10 "${CONFIGS_TIMEOUT:-480}" python3 bench/epilogue_bench.py --shapes "${SHAPES:-4096x151936,8192x128256}" \
    --batches "$BATCHES" --budgets 0 --reps "${REPS:-30}" --warmup 5 --only cublas,sample,fused,gumbel \
    --fused-configs "$CONFIGS" > "$OUT/epilogue_bench_console.log" 2>&1
  echo "configs rc=$? after $((SECONDS - start))s"; tail -40 "$OUT/epilogue_bench_console.log"
fi
if [[ " $PARTS " == *" kernel "* ]]; then
  BENCH_TIMEOUT="${KERNEL_TIMEOUT:-540}" bash bench/run_gpu.sh kernel \
    --methods cublas,fsdist,fsdist_fused,fsdist_chunked,gumbel_compiled \
    --graph-methods cublas,fsdist,fsdist_fused,fsdist_chunked \
    --shapes "${SHAPES:-4096x151936,8192x128256}" --batches "${KERNEL_BATCHES:-1,16,64,96,128,192,256,384,512,768,1024}" \
    --reps "${REPS:-30}" --repeats 1 --warmup 8 ${KERNEL_EXTRA:-} > "$OUT/kernel_bench_console.log" 2>&1
  echo "kernel rc=$? after $((SECONDS - start))s"; tail -45 "$OUT/kernel_bench_console.log"
fi
if [[ " $PARTS " == *" tests "* ]]; then
  timeout -k 10 "${TESTS_TIMEOUT:-400}" python3 -m pytest -q -p no:warnings -p no:cacheprovider -rfE \
    ${TESTS:-tests/ops/test_sample_gpu.py tests/test_gpu_serving.py tests/test_processors_gpu.py} > "$OUT/gpu_tests.log" 2>&1
  echo "tests rc=$? after $((SECONDS - start))s"; tail -15 "$OUT/gpu_tests.log"
fi
