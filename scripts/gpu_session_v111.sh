#!/usr/bin/env bash
# One device call on one H100 or H200 for v111 (docs/performance.md): the ping-pong kernel
# (fsdist/ops/fused_sample_pp.py).
# Parts (PARTS, default "test bench serving"), cut at what is left of $CALL_BUDGET s (default 560):
#   test     its GPU tests (tests/ops/test_fused_pp_gpu.py: the ws kernel's candidates bit for bit)
#   bench    stage 1 alone, bench/noise_cost_probe.py: cuBLAS's matmul, the shipped ws kernel (noise, greedy) and the
#            ping-pong kernel (4 / 5 / 6 stages, greedy, lookahead 0 / 2) at B = 256 / 512 / 1024, both shapes, three
#            runs a cell, [B] temperatures (its checks first: the ping-pong candidates equal the dispatched launch's)
#   serving  the serving GPU tests not re-run since v97 (no host sync, CUDA graphs, the wait probe)
# PP_TESTS (pytest -k), PP_METHODS and TEST_LIMIT choose the tests and methods (v111b: PP_TESTS="sh", the pp_sh*
# methods). JSONs in $OUT, logs in $OUT/v111_logs.tgz. Usage: export OUT; bash scripts/gpu_session_v111.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh
pack_on_exit v111
PARTS="${PARTS:-test bench serving}"
rc=0
if wants test; then
  TAIL=6 run_part test "$(part_limit "${TEST_LIMIT:-200}")" v111_test.log python3 -m pytest -q -p no:cacheprovider -x \
    tests/ops/test_fused_pp_gpu.py -k "${PP_TESTS:-}" || rc=1
fi
if wants bench; then
  TAIL=40 run_part bench "$(part_limit 260)" v111_bench_console.log python3 bench/noise_cost_probe.py \
    --check pp --methods "${PP_METHODS:-ws_greedy,pp,pp_greedy,pp_s4,pp_s6,pp_la0,pp_la2}" --batches 256,512,1024 \
    --repeat 3 \
    --seconds 0 || rc=1
fi
if wants serving; then
  TAIL=4 run_part serving "$(part_limit 120)" v111_serving.log python3 -m pytest -q -p no:cacheprovider \
    tests/ops/test_fused_ws_gpu.py tests/test_gpu_serving.py -k "wait_probe or cuda_graph or never_synchron" || rc=1
fi
exit $rc
