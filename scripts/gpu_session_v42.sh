#!/usr/bin/env bash
# One single-GPU device call for what the twenty-first session (2026-11-27, no device time left) could not run
# (docs/performance.md, v42). PARTS, any of:
#   ws      tests/ops/test_fused_ws_gpu.py in four processes side by side (its strengthened tensor-parallel buffer
#           cases were never GPU-run), logs $OUT/gpu_tests_group<i>.log
#   fixes   the API-audit fixes of 2026-11-27 on CUDA: top-N past the allowed ids (select and fallback), id tables of
#           any strides, top_k past int32, greedy in the temperature's dtype, and the no-sync serving tests,
#           log $OUT/gpu_tests_fixes.log
#   probe   v42: bench/ws_probe.py --processors --processor-set bitmask (the bitmask alone on the ws 64- / 128-row
#           tiles against the Triton twin, checked bit for bit first), D = 4096 and 8192, B = $PROBE_BATCHES
# The short tables go to stdout last. Usage: export OUT; PARTS="ws fixes probe" bash scripts/gpu_session_v42.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh  # env, $OUT, GPU and versions printed, $start, wants, run_part
PARTS="${PARTS:-ws fixes probe}"
rc=0
if wants ws; then
  TESTS_TIMEOUT="${WS_TIMEOUT:-200}" bash scripts/gpu_tests_parallel.sh \
    "tests/ops/test_fused_ws_gpu.py -k 'tensor_parallel or cannot_take or checked_layout'" \
    "tests/ops/test_fused_ws_gpu.py -k '64_row_tile_with_processors'" \
    "tests/ops/test_fused_ws_gpu.py -k '64_row_tile_writes or filtered_calls or processed_calls or bias_past'" \
    "tests/ops/test_fused_ws_gpu.py -k 'ws_writes or partial or padded or one_ulp or sample_uses or ties'" || rc=1
fi
if wants fixes; then
  run_part fixes "${FIXES_TIMEOUT:-240}" gpu_tests_fixes.log python3 -m pytest -q -p no:warnings -p no:cacheprovider \
    --tb=short -rfE --durations=5 tests/test_processors.py tests/test_filters.py tests/test_gpu_serving.py \
    -k "forbidden_ones or any_strides or past_int32 or own_dtype or top_n or never_synchronises" || rc=1
fi
if wants probe; then
  TAIL=24 run_part probe "${PROBE_TIMEOUT:-300}" ws_probe_bitmask.log \
    python3 bench/ws_probe.py --processors --processor-set bitmask --shapes 4096x151936,8192x128256 \
    --batches "${PROBE_BATCHES:-128,256,512}" --check-cells "" --variants s4r8e8 --reps 20 || rc=1
fi
exit $rc
