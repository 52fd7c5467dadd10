#!/usr/bin/env bash
# One device call on one GPU for v104 (docs/performance.md): the MMA warpgroup that retires each k-step's wgmma and
# releases its stage before awaiting the next one (launch_fused_ws(retire_each=True)) against the shipped loop, with
# the wait probe's shares. Parts (PARTS, default "tests waits"), cut at what is left of $CALL_BUDGET s (default 560):
#   tests  the variant's GPU tests: the Triton kernel's candidates bit for bit on five shapes, ties / NaN / inf
#   waits  bench/ws_waits.py: greedy / noise, B = 256 and 1024, both shapes, variants $V104_VARIANTS (default
#          shipped,retire,retire+s5,retire+s3,e4,retire+e4), each variant and cuBLAS's matmul timed side by side
# JSONs in $OUT, logs in $OUT/v104_logs.tgz. Usage: export OUT; bash scripts/gpu_session_v104.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh
pack_on_exit v104
PARTS="${PARTS:-tests waits}"
rc=0
if wants tests; then
  TESTS_TIMEOUT=$(part_limit 150) bash scripts/gpu_tests_parallel.sh \
    "tests/ops/test_fused_ws_gpu.py -k 'hand_off and retire'" \
    "tests/ops/test_fused_ws_gpu.py -k 'ties and retire'" || rc=1
fi
if wants waits; then
  TAIL=40 run_part waits "$(part_limit 380)" v104_ws_waits_console.log python3 bench/ws_waits.py \
    --batches "${V104_BATCHES:-256,1024}" --cases "${V104_CASES:-greedy,noise}" \
    --variants "${V104_VARIANTS:-shipped,retire,retire+s5,retire+s3,e4,retire+e4}" || rc=1
fi
exit $rc
