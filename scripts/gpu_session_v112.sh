#!/usr/bin/env bash
# One device call on one H100 for v112 (docs/performance.md): all-greedy calls on the ping-pong kernel. Parts (PARTS,
# default "test bench"), cut at what is left of $CALL_BUDGET s (default 560):
#   test   the dispatch's GPU test and the ping-pong kernel's fan-out / padded-batch tests
#          (tests/ops/test_fused_pp_gpu.py)
#   bench  bench/greedy_pp_ab.py: whole fsdist.sample(temperature=0.0) calls with the rule on and off, cuBLAS's matmul
#          and the materialized greedy baseline, B = 256 / 512 / 1024, both shapes, three runs a cell
# JSONs in $OUT, logs in $OUT/v112_logs.tgz. Usage: export OUT; bash scripts/gpu_session_v112.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh
pack_on_exit v112
PARTS="${PARTS:-test bench}"
rc=0
if wants test; then
  TAIL=6 run_part test "$(part_limit 90)" v112_test.log python3 -m pytest -q -p no:cacheprovider \
    tests/ops/test_fused_pp_gpu.py -k "launch_fused or padded or fan_out" || rc=1
fi
if wants bench; then
  TAIL=30 run_part bench "$(part_limit 200)" v112_bench_console.log python3 bench/greedy_pp_ab.py \
    --batches 256,512,1024 --repeat 3 || rc=1
fi
exit $rc
