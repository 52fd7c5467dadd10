#!/usr/bin/env bash
# One device call on one H100 for the forty-third session's open runs (docs/performance.md: v112's switch checked,
# v114, v115, v116). Parts (PARTS, default "test v115 waits v114", run in that order), each cut at what is left of
# $CALL_BUDGET s (default 560): on a fresh machine (cold compile cache) all four need about two calls; the second can
# name the parts the first did not reach (e.g. PARTS="waits v114").
#   test   in three parallel groups: the ping-pong kernel's power test (fixed), its dispatch / padded / fan-out tests
#          and the new ew8 and wait-probe cases; the serving tests (no host sync, CUDA graphs, the all-greedy
#          ping-pong call); the ws kernel's greedy cases (which now hold the ws kernel)
#   v114   bench/noise_cost_probe.py: ws against 4 epilogue warps at B = 256 / 384, five runs a cell
#   v115   the same probe: 8 epilogue warps at B = $V115_BATCHES (default 256-1024), $V115_REPEAT (3) runs a cell
#   waits  v116: bench/pp_waits.py, where the consumers spend each tile (sh8, ew4, ew8; greedy and noise; B = 512 /
#          1024, both shapes)
# PP_TESTS (pytest -k) and TESTS_LIMIT (s) trim the tests for a short call.
# JSONs in $OUT, logs in $OUT/v115_logs.tgz. Usage: export OUT; bash scripts/gpu_session_v115.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh
pack_on_exit v115
PARTS="${PARTS:-test v115 waits v114}"
rc=0
if wants test; then
  TESTS_TIMEOUT=$(part_limit "${TESTS_LIMIT:-150}") bash scripts/gpu_tests_parallel.sh \
    "tests/ops/test_fused_pp_gpu.py -k '${PP_TESTS:-comparison or launch_fused or padded or fan_out or ew8 or wait}'" \
    "tests/test_gpu_serving.py -k 'ping_pong or never_synchron or cuda_graph'" \
    "tests/ops/test_fused_ws_gpu.py -k 'greedy and not wait'" || rc=1
  echo "test part done after $((SECONDS - start))s"
fi
if wants v115; then
  TAIL=40 run_part v115 "$(part_limit 200)" v115_console.log python3 bench/noise_cost_probe.py --check pp \
    --methods ws_greedy,ws_epi,pp_ew4,pp_ew8,pp_ew8_s4,pp_ew8_epi --batches "${V115_BATCHES:-256,384,512,1024}" \
    --repeat "${V115_REPEAT:-3}" \
    --seconds 0 || rc=1
fi
if wants waits; then
  TAIL=30 run_part waits "$(part_limit 180)" v116_console.log python3 bench/pp_waits.py || rc=1
fi
if wants v114; then
  TAIL=14 run_part v114 "$(part_limit 120)" v114_console.log python3 bench/noise_cost_probe.py --check pp \
    --methods ws_greedy,pp_ew4,pp_ew4_s4 --batches 256,384 --repeat 5 --seconds 0 || rc=1
fi
exit $rc
