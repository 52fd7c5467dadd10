#!/usr/bin/env bash
# One device call of the sixteenth and seventeenth sessions (docs/performance.md, v27-v30). PARTS, any of:
#   prepare  bench/prepare_probe.py: the preparation's sort variants (rank, bitonic 64 / 32-bit keys, warps),
#            each checked against torch's sort, then timed as graph replays, at $PREPARE_SLOTS ids a row
#            (default 1000; 1500,2000 measures the rows whose default sort is not re-measured); log in
#            $OUT/prepare_probe.log
#   tests    the GPU tests of this session's changes ($TESTS), log in $OUT/gpu_tests.log
#   select   bench/filter_probe.py --only select: select_filtered's device time per search cap ($SELECT_CAPS,
#            default 0,2048), warp count ($SELECT_WARPS, default 8,16,32) and min-p draw width ($SELECT_WIDE,
#            default the launcher's; same tokens and flags checked), B = $SELECT_BATCHES
#   kernel   the kernel bench: plain, min-p, top-k + top-p, bias + penalties and their compiled baselines,
#            eager and as graph replays ($SHAPES, $KERNEL_BATCHES)
#   breakdown bench/processors_breakdown.py (device time per kernel; $BREAKDOWN_GROUPS, default plain, top-k +
#            top-p, min-p, bias + penalties)
#   minp     bench/minp_winner_rate.py: the min-p fallback rate of the kernel bench's rows, with and without the
#            proof from the tiles' winners (same tokens checked), $MINP_ROWS rows
# The short tables go to stdout last. Usage: PARTS="prepare tests" bash scripts/gpu_session_v27.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh  # env, $OUT, GPU and versions printed, $start, wants, run_part
PARTS="${PARTS:-prepare}"
if wants prepare; then
  TAIL=9 run_part prepare "${PREPARE_TIMEOUT:-150}" prepare_probe.log \
    python3 bench/prepare_probe.py --batches "${PREPARE_BATCHES:-1,16,64,256}" --slots "${PREPARE_SLOTS:-1000}"
fi
if wants tests; then
  # shellcheck disable=SC2086
  run_part tests "${TESTS_TIMEOUT:-330}" gpu_tests.log python3 -m pytest -q -p no:warnings -p no:cacheprovider \
    --tb=short -rfE --durations=8 ${TESTS:-tests/ops/test_min_p_winners.py tests/ops/test_prepare_processors.py \
    tests/ops/test_fused_ws_gpu.py::test_64_row_tile_writes_the_triton_kernels_fields tests/test_filters.py \
    tests/test_processors.py tests/test_gpu_serving.py}
fi
if wants breakdown; then
  TAIL=16 run_part breakdown "${BREAKDOWN_TIMEOUT:-120}" processors_breakdown.log \
    python3 bench/processors_breakdown.py --shape "${BREAKDOWN_SHAPE:-4096x151936}" \
    --batches "${BREAKDOWN_BATCHES:-1,16,64}" --groups "${BREAKDOWN_GROUPS:-plain,topk_topp,minp,bias_pen}" --iters 20
fi
if wants minp; then
  TAIL=6 run_part minp "${MINP_TIMEOUT:-150}" minp_winner_rate.log \
    python3 bench/minp_winner_rate.py --rows "${MINP_ROWS:-16384}" --out "$OUT"
fi
if wants select; then
  TAIL=12 run_part select "${SELECT_TIMEOUT:-150}" select_probe.log \
    python3 bench/filter_probe.py --only select --batches "${SELECT_BATCHES:-1,16,64}" \
    --select-warps "${SELECT_WARPS:-8,16,32}" --caps "${SELECT_CAPS:-0,2048}" ${SELECT_WIDE:+--wide-caps "$SELECT_WIDE"}
fi
if wants kernel; then
  M="${METHODS:-cublas,fsdist,fsdist_minp,torch_minp_compiled,fsdist_topk_topp,fsdist_bias_pen,torch_bias_pen_compiled}"
  # shellcheck disable=SC2086
  TAIL=60 run_part kernel "$((${KERNEL_TIMEOUT:-540} + 20))" kernel_bench_console.log \
    env BENCH_TIMEOUT="${KERNEL_TIMEOUT:-540}" bash bench/run_gpu.sh kernel --methods "$M" --graph-methods "$M" \
    --shapes "${SHAPES:-4096x151936,8192x128256}" --batches "${KERNEL_BATCHES:-1,16,64,256}" \
    --reps "${REPS:-30}" --repeats 1 --warmup 8 ${KERNEL_EXTRA:-}
fi
