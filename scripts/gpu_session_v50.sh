#!/usr/bin/env bash
# One device call on two GPUs (nvidia-h200-x2 / nvidia-h100-x2, carry [".whl"]) for v50 (docs/performance.md, a
# profile, no code change): where a plain TP = 2 step at B = 64 / 128 / 256 spends its time after v49, against the
# same profile at TP = 1 (stage 1 on the whole weight), so the shard's stage 1 can be compared with half of it
# (the 594-tile shard's half-empty last wave, "Open questions") and the fixed costs (merge, barrier, graph nodes)
# read off per kernel.
#   tp2: tp_sweep --profile-breakdown at TP = 2, D = 4096, nvshmem, graph replays beside, matmul_shard
#   tp1: the same at TP = 1 (GPU 0)
#   PARTS (default "tp1 tp2"), V50_BATCHES (default 64,128,256); JSONs in $OUT, logs in $OUT/v50_logs.tgz.
# Usage: export OUT; bash scripts/gpu_session_v50.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh
pack_on_exit v50
PARTS="${PARTS:-tp1 tp2}"
carried_wheels
ARGS=(bench/tp_sweep.py --max-minutes 2 --shapes 4096x151936 --batches "${V50_BATCHES:-64,128,256}"
      --transports nvshmem --reductions candidates --baselines matmul_shard --runs 3 --iters 50 --graph
      --profile-breakdown)
rc=0
if wants tp1; then
  TAIL=30 run_part tp1 170 v50_tp1.log env PYTHON=python3 launch/torchrun.sh 1 "${ARGS[@]}" || rc=1
fi
if wants tp2; then
  TAIL=40 run_part tp2 200 v50_tp2.log env PYTHON=python3 launch/torchrun.sh 2 "${ARGS[@]}" || rc=1
fi
exit $rc
