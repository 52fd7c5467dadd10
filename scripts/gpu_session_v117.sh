#!/usr/bin/env bash
# One device call on one H100 (or H200) for the forty-fourth session's cleanup of the ping-pong kernel
# (docs/performance.md "v117"): its GPU tests after the register epilogue, lookahead and epilogue warps were removed
# (the shipped variant's SASS is unchanged but for the unused barriers' initialisation: a local sm_90 compile), and
# the serving tests the v116 call's time limit cut (no host sync on the tensor-parallel head, CUDA graphs, the
# all-greedy call on the ping-pong kernel). Four parallel pytest groups under $TESTS_TIMEOUT s (default 420);
# logs in $OUT/v117_logs.tgz. Usage: export OUT; bash scripts/gpu_session_v117.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh
pack_on_exit v117
TESTS_TIMEOUT="${TESTS_TIMEOUT:-420}" bash scripts/gpu_tests_parallel.sh \
  "tests/ops/test_fused_pp_gpu.py -k 'writes_the_ws'" \
  "tests/ops/test_fused_pp_gpu.py -k 'not writes_the_ws'" \
  "tests/test_gpu_serving.py -k 'test_head_never_synchronises'" \
  "tests/test_gpu_serving.py -k 'cuda_graph or ping_pong'"
