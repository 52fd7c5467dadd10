#!/usr/bin/env bash
# One device call on one H100 for v109b (docs/performance.md): the wait probe per warp (v110's lockstep ran in the
# same call; reverted). Parts (PARTS, default "test waits profile"), cut at what is left of $CALL_BUDGET s (default
# 560):
#   test     the wait probe's GPU test (tests/ops/test_fused_ws_gpu.py; v110 also ran the lockstep's)
#   waits    bench/ws_waits.py, D = 4096, B = 256 / 1024, greedy and noise (warp 0's waits and the longest retire
#            wait over the MMA warpgroup's threads)
#   lock     (v110's lockstep probe, reverted: in commit 9c28d51)
#   profile  scripts/gpu_profile_ws_sass.sh with the probe (WAIT_PROBE=1) at B = 1024: the probe's shares of the
#            profiled launch beside Nsight Compute's samples of it (v109b_probe_ws_sass.csv.gz, the logs beside)
# then, with PARTS including "bench", scripts/gpu_session_v108.sh's bench part (issue 14's table on this GPU).
# JSONs and CSVs in $OUT, logs in $OUT/v109_logs.tgz. Usage: export OUT; bash scripts/gpu_session_v109.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh
FINAL="$OUT"
pack_on_exit v109
PARTS="${PARTS:-test waits profile}"
rc=0
if wants test; then
  TAIL=3 run_part test "$(part_limit 120)" v109_test.log python3 -m pytest -q -p no:cacheprovider \
    tests/ops/test_fused_ws_gpu.py -k wait_probe || rc=1
fi
if wants waits; then
  TAIL=9 run_part waits "$(part_limit 120)" v109_ws_waits_console.log python3 bench/ws_waits.py \
    --shapes 4096x151936 --batches 256,1024 --cases greedy,noise || rc=1
fi
if wants profile; then
  mkdir -p "$OUT/probe"
  OUT="$OUT/probe" WAIT_PROBE=1 PROFILE_TIMEOUT="$(part_limit 90)" CASES=greedy,noise BATCHES=1024 \
    bash scripts/gpu_profile_ws_sass.sh > "$OUT/v109_profile.log" 2>&1 || rc=1
  grep "wait probe\|rc=" "$OUT/v109_profile.log"
  cp "$OUT/probe/v89_ws_sass.csv.gz" "$FINAL/v109b_probe_ws_sass.csv.gz" 2>/dev/null
  cp "$OUT/probe/v89_ncu.log" "$OUT/v109b_probe_ncu.log" 2>/dev/null
  cp "$OUT/probe/v89_ncu_details.log" "$OUT/v109b_probe_ncu_details.log" 2>/dev/null
fi
if wants bench; then
  OUT="$FINAL" CALL_BUDGET=$(part_limit 560) PARTS=bench bash scripts/gpu_session_v108.sh || rc=1
fi
exit $rc
