#!/usr/bin/env bash
# One device call on two GPUs (nvidia-h200-x2 / nvidia-h100-x2, carry [".whl"]) for v64 (docs/performance.md, a
# profile, no code change): where a TP = 2 call with logit bias + penalties on 1,000 ids per row spends the 15-25 µs
# it adds to the plain TP call (v48: 1.09-1.15x against issue 12's 1.08x), kernel by kernel, against the plain TP = 2
# call and the same calls at TP = 1 (GPU 0).
#   tp_sweep --profile-breakdown, D = 4096, nvshmem, candidates, graph replays beside, for each of $V64_FILTERS
#   (default "none bias_pen") at B = $V64_BATCHES (default 1,16,64); PARTS (default "tp1 tp2").
#   JSONs in $OUT, logs in $OUT/v64_logs.tgz.
# Usage: export OUT; bash scripts/gpu_session_v64.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh
pack_on_exit v64
PARTS="${PARTS:-tp1 tp2}"
carried_wheels
rc=0
# each part's timeout, cut so the whole call ends inside the device tool's 600 s (the packed logs need a few seconds)
CALL_BUDGET_DEFAULT=570  # (part_limit's budget when $CALL_BUDGET is unset)
for filt in ${V64_FILTERS:-none bias_pen}; do
  ARGS=(bench/tp_sweep.py --max-minutes 2 --shapes 4096x151936 --batches "${V64_BATCHES:-1,16,64}" --filters "$filt"
        --transports nvshmem --reductions candidates --baselines matmul_shard --runs 3 --iters 50 --graph
        --profile-breakdown)
  if wants tp1; then
    TAIL=20 run_part "tp1 $filt" "$(part_limit 150)" "v64_tp1_$filt.log" \
      env PYTHON=python3 launch/torchrun.sh 1 "${ARGS[@]}" || rc=1
  fi
  if wants tp2; then
    TAIL=30 run_part "tp2 $filt" "$(part_limit 180)" "v64_tp2_$filt.log" \
      env PYTHON=python3 launch/torchrun.sh 2 "${ARGS[@]}" || rc=1
  fi
done
exit $rc
