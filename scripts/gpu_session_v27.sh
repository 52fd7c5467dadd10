#!/usr/bin/env bash
# One device call for the sixteenth session (docs/performance.md, v27 / v28). PARTS, any of:
#   prepare  bench/prepare_probe.py: the preparation's sort variants (rank, bitonic 64 / 32-bit keys, warps),
#            each checked against torch's sort, then timed as graph replays; log in $OUT/prepare_probe.log
#   tests    the GPU tests of this session's changes ($TESTS), log in $OUT/gpu_tests.log
#   kernel   the kernel bench: plain, min-p, top-k + top-p, bias + penalties and their compiled baselines,
#            eager and as graph replays ($SHAPES, $KERNEL_BATCHES)
#   breakdown bench/processors_breakdown.py (device time per kernel of plain / bias+penalties calls)
#   minp     bench/minp_winner_rate.py: the min-p fallback rate of the kernel bench's rows, with and without the
#            proof from the tiles' winners (same tokens checked), $MINP_ROWS rows
# The short tables go to stdout last. Usage: PARTS="prepare tests" bash scripts/gpu_session_v27.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh
OUT="${OUT:-bench/results}"
mkdir -p "$OUT"
PARTS="${PARTS:-prepare}"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, flush=True)'
start=$SECONDS
if [[ " $PARTS " == *" prepare "* ]]; then
  timeout -k 10 "${PREPARE_TIMEOUT:-150}" python3 bench/prepare_probe.py --batches "${PREPARE_BATCHES:-1,16,64,256}" \
    > "$OUT/prepare_probe.log" 2>&1
  echo "prepare rc=$? after $((SECONDS - start))s"; tail -9 "$OUT/prepare_probe.log"
fi
if [[ " $PARTS " == *" tests "* ]]; then
  timeout -k 10 "${TESTS_TIMEOUT:-330}" python3 -m pytest -q -p no:warnings -p no:cacheprovider --tb=short -rfE \
    --durations=8 ${TESTS:-tests/ops/test_min_p_winners.py tests/ops/test_prepare_processors.py \
    tests/ops/test_fused_ws_gpu.py::test_64_row_tile_writes_the_triton_kernels_fields tests/test_filters.py \
    tests/test_processors.py tests/test_gpu_serving.py} \
    > "$OUT/gpu_tests.log" 2>&1
  echo "tests rc=$? after $((SECONDS - start))s"; tail -15 "$OUT/gpu_tests.log"
fi
if [[ " $PARTS " == *" breakdown "* ]]; then
  timeout -k 10 "${BREAKDOWN_TIMEOUT:-120}" python3 bench/processors_breakdown.py --shape "${BREAKDOWN_SHAPE:-4096x151936}" \
    --batches "${BREAKDOWN_BATCHES:-1,16,64}" --iters 20 > "$OUT/processors_breakdown.log" 2>&1
  echo "breakdown rc=$? after $((SECONDS - start))s"; tail -16 "$OUT/processors_breakdown.log"
fi
if [[ " $PARTS " == *" minp "* ]]; then
  timeout -k 10 "${MINP_TIMEOUT:-150}" python3 bench/minp_winner_rate.py --rows "${MINP_ROWS:-16384}" \
    --out "$OUT" > "$OUT/minp_winner_rate.log" 2>&1
  echo "minp rc=$? after $((SECONDS - start))s"; tail -6 "$OUT/minp_winner_rate.log"
fi
if [[ " $PARTS " == *" kernel "* ]]; then
  M="${METHODS:-cublas,fsdist,fsdist_minp,torch_minp_compiled,fsdist_topk_topp,fsdist_bias_pen,torch_bias_pen_compiled}"
  BENCH_TIMEOUT="${KERNEL_TIMEOUT:-540}" bash bench/run_gpu.sh kernel --methods "$M" --graph-methods "$M" \
    --shapes "${SHAPES:-4096x151936,8192x128256}" --batches "${KERNEL_BATCHES:-1,16,64,256}" \
    --reps "${REPS:-30}" --repeats 1 --warmup 8 ${KERNEL_EXTRA:-} > "$OUT/kernel_bench_console.log" 2>&1
  echo "kernel rc=$? after $((SECONDS - start))s"; tail -60 "$OUT/kernel_bench_console.log"
fi
