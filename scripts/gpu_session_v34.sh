#!/usr/bin/env bash
# One device call of the nineteenth session (docs/performance.md, v34 / v35). PARTS, any of:
#   pdl    (v34, at commit 9aa226d only: the PDL experiment was reverted) bench/filter_probe.py --only graph
#          --no-pdl, B = $PDL_BATCHES
#   pad    bench/ws_probe.py --pad: the warp-specialised stage 1 on a hidden zero-padded to whole batch tiles
#          against the unpadded launch (same candidates checked), B = $PAD_BATCHES on 128-row tiles and
#          $PAD_SMALL on 64-row tiles, D = 4096
#   tests  the GPU tests of this session's changes ($TESTS), log in $OUT/gpu_tests.log
# The short tables go to stdout last. Usage: PARTS="pad tests" bash scripts/gpu_session_v34.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh  # env, $OUT, GPU and versions printed, $start, wants, run_part
PARTS="${PARTS:-pad}"
if wants pdl; then
  TAIL=40 run_part pdl "${PDL_TIMEOUT:-300}" filter_probe_pdl.log \
    python3 bench/filter_probe.py --only graph --no-pdl --batches "${PDL_BATCHES:-1,16,64}" --reps 50
fi
if wants tests; then
  # shellcheck disable=SC2086
  run_part tests "${TESTS_TIMEOUT:-240}" gpu_tests.log python3 -m pytest -q -p no:warnings -p no:cacheprovider \
    --tb=short -rfE --durations=8 ${TESTS:-tests/ops/test_fused_ws_gpu.py -k padded}
fi
if wants pad; then
  TAIL=14 run_part pad_small "${PAD_TIMEOUT:-150}" ws_probe_pad_small.log \
    python3 bench/ws_probe.py --shapes 4096x151936 --batches "${PAD_SMALL:-1,16}" --check-cells "" \
    --variants s5r8e8b64 --pad --reps 20
  TAIL=14 run_part pad "${PAD_TIMEOUT:-200}" ws_probe_pad.log \
    python3 bench/ws_probe.py --shapes 4096x151936 --batches "${PAD_BATCHES:-160,192,256,320}" --check-cells "" \
    --variants s5r8e8 --pad --reps 20
fi
