#!/usr/bin/env bash
# One device call on one GPU (an H200 wanted): the GPU tests of calls with logit bias / penalty entries at B = 17-32
# after v68 / v69 (on a fast-memory GPU the warp-specialised 64-row tile on a zero-padded hidden): the float64 mirror
# at B = 1 / 24 / 37 / 64 / 200, CUDA-graph capture with processor tensors at B = 32 / 64 / 128, no host sync; and the
# ws kernel's processor tests. Logs in $OUT.
# Usage: export OUT; bash scripts/gpu_session_v70.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh
CALL_BUDGET="${CALL_BUDGET:-260}" tests_in_the_time_left \
  "tests/test_processors_gpu.py -k 'mirror or cuda_graph or never_synchronise'" \
  "tests/ops/test_fused_ws_gpu.py -k 'processor or bitmask or bias or penalt'"
