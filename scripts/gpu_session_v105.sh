#!/usr/bin/env bash
# One device call on one GPU for v105 (docs/performance.md): the main loop of two 64-column k-slices a step
# (launch_fused_ws(k_sub=2): one barrier wait, release and loop pass per 128 columns of D) against the shipped loop,
# with the wait probe's shares. (v104's retire_each run: this script at commit de1ba60.) Parts (PARTS, default
# "tests waits"), cut at what is left of $CALL_BUDGET s (default 560):
#   tests  the variant's GPU tests: the Triton kernel's candidates bit for bit on five shapes, ties / NaN / inf
#   waits  bench/ws_waits.py: greedy / noise, B = 256, 512 and 1024, both shapes, variants $V105_VARIANTS (default
#          shipped,k2+s3,k2+s2), each variant and cuBLAS's matmul timed side by side
# JSONs in $OUT, logs in $OUT/v105_logs.tgz. Usage: export OUT; bash scripts/gpu_session_v105.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh
pack_on_exit v105
PARTS="${PARTS:-tests waits}"
rc=0
if wants tests; then
  TESTS_TIMEOUT=$(part_limit 150) bash scripts/gpu_tests_parallel.sh \
    "tests/ops/test_fused_ws_gpu.py -k 'hand_off and k2'" \
    "tests/ops/test_fused_ws_gpu.py -k 'ties and k2'" || rc=1
fi
if wants waits; then
  TAIL=40 run_part waits "$(part_limit 380)" v105_ws_waits_console.log python3 bench/ws_waits.py \
    --batches "${V105_BATCHES:-256,512,1024}" --cases "${V105_CASES:-greedy,noise}" \
    --variants "${V105_VARIANTS:-shipped,k2+s3,k2+s2}" || rc=1
fi
exit $rc
