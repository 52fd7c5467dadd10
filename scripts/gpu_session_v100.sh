#!/usr/bin/env bash
# One device call on one GPU for v100 (docs/performance.md): the dynamic tile schedule of the warp-specialised
# stage 1 (launch_fused_ws(dynamic=True): tiles from a run-time counter, in order), after v99 found the round-robin
# programs' drift costing the weight tile's L2 sharing at B = 1024. Parts (PARTS, default "tests probe memory"), cut at
# what is left of $CALL_BUDGET s (default 560):
#   tests   the dynamic schedule's GPU tests (tests/ops/test_fused_ws_gpu.py -k dyn: the Triton kernel's candidates
#           bit for bit, a short last tile, 3 programs walking hundreds of tiles; ties, NaN and inf)
#   probe   bench/noise_cost_probe.py, stage 1 alone: the shipped round robin against the dynamic schedule, with noise
#           and greedy, B = 256 / 512 / 1024, both shapes, three runs a cell (checked bit for bit first)
#   memory  Nsight Compute's DRAM and L2 bytes of the same at D = 4096, B = 1024 and 256 (scripts/gpu_profile_ws_pipes.sh)
# JSONs in $OUT, logs in $OUT/v100_logs.tgz. Usage: export OUT; bash scripts/gpu_session_v100.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh
pack_on_exit v100
PARTS="${PARTS:-tests probe memory}"
rc=0
if wants tests; then
  TESTS_TIMEOUT=$(part_limit 200) bash scripts/gpu_tests_parallel.sh \
    "tests/ops/test_fused_ws_gpu.py -k '(hand_off or ties) and dyn and not cap3'" \
    "tests/ops/test_fused_ws_gpu.py -k 'hand_off and dyn_cap3'" || rc=1
fi
if wants probe; then
  TAIL=30 run_part probe "$(part_limit 220)" v100_noise_cost_console.log python3 bench/noise_cost_probe.py \
    --repeat "${V100_REPEAT:-3}" --seconds 0 --batches "${V100_BATCHES:-256,512,1024}" \
    --methods "${V100_METHODS:-ws_greedy,ws_dyn,ws_dyn_greedy}" || rc=1
fi
if wants memory; then
  METRICS="dram__bytes_read.sum,lts__t_bytes.sum,lts__t_sector_hit_rate.pct,gpu__time_duration.sum,\
sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active" BATCHES=1024,256 \
    CASES=greedy,noise,dyn_greedy,dyn,noise,dyn PROFILE_TIMEOUT=$(part_limit 120) \
    bash scripts/gpu_profile_ws_pipes.sh > "$OUT/v100_ncu_console.log" 2>&1 || rc=1
  grep -E "ncu rc|metric|dram__bytes_read.sum|lts__t_bytes.sum|duration.sum|hit_rate|tensor_cycles_active.avg" \
    "$OUT/v100_ncu_console.log"
  cp "$OUT/v98_ncu_pipes.csv" "$OUT/v100_ncu_memory.csv" 2>/dev/null
  cp "$OUT/v100_ncu_memory.csv" "$PACK_FINAL/" 2>/dev/null
fi
exit $rc
