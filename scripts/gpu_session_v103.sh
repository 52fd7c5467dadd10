#!/usr/bin/env bash
# One device call on one GPU for v103 (docs/performance.md): where the warp-specialised tile's MMA warpgroup waits,
# with and without noise (launch_fused_ws(wait_probe=): %clock64 around the MMA warpgroup's operand, wgmma-retire and
# hand-off waits, the load warp's free-stage waits and the epilogue's accumulator waits). Parts (PARTS, default
# "tests waits"), cut at what is left of $CALL_BUDGET s (default 560):
#   tests  the wait probe's GPU test (the Triton kernel's candidates bit for bit, the counts add up), the noise's
#          bit checks (tests/ops/test_noise_gpu.py) and the legacy noise probes among the hand-off variants' tests
#   waits  bench/ws_waits.py: greedy / noise / legacy instructions / 7 rounds, B = 256 and 1024, both shapes
# JSONs in $OUT, logs in $OUT/v103_logs.tgz. Usage: export OUT; bash scripts/gpu_session_v103.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh
pack_on_exit v103
PARTS="${PARTS:-tests waits}"
rc=0
if wants tests; then
  TESTS_TIMEOUT=$(part_limit 150) bash scripts/gpu_tests_parallel.sh \
    "tests/ops/test_fused_ws_gpu.py -k wait_probe" "tests/ops/test_noise_gpu.py" \
    "tests/ops/test_fused_ws_gpu.py -k '(hand_off or ties) and legacy'" || rc=1
fi
if wants waits; then
  TAIL=20 run_part waits "$(part_limit 300)" v103_ws_waits_console.log python3 bench/ws_waits.py \
    --batches "${V103_BATCHES:-256,1024}" --cases "${V103_CASES:-greedy,noise,legacy,rounds7}" || rc=1
fi
exit $rc
