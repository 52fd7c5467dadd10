#!/usr/bin/env bash
# One device call on two GPUs (nvidia-h200-x2 / nvidia-h100-x2, carry .whl): where a filtered TP step's time goes.
# v43 measured the TP = 2 head with top-k 50 + top-p 0.9 at 1.36-1.40x its plain call (D = 4096, B <= 64, graph
# replays), against 1.12-1.15x for fsdist.sample on one GPU. This profiles both at TP = 2 (device time per kernel,
# torch.profiler, plus graph replays), re-times ag_filtered (its compile failed at B >= 16 in v43), and re-runs
# the GPU test that the twenty-third session's reserve fix is for.
#   PARTS, any of: filtered plain tests (default all); TPF_BATCHES (default 1,16,64); TPF_SHAPES (4096x151936)
# Usage: export OUT; bash scripts/gpu_session_tpfilt.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh
PARTS="${PARTS:-filtered plain tests}"
carried_wheels  # nvshmem4py for the nvshmem cases
common=(--shapes "${TPF_SHAPES:-4096x151936}" --batches "${TPF_BATCHES:-1,16,64}" --transports nvshmem
        --reductions candidates --runs 3 --iters 50 --graph --profile-breakdown)
rc=0
for part in filtered plain; do
  wants "$part" || continue
  extra=(--baselines matmul_shard)
  [ "$part" = filtered ] && extra=(--filters top_k_top_p --baselines matmul_shard,ag_filtered)
  TAIL=60 run_part "$part" "${TPF_TIMEOUT:-200}" "tpfilt_$part.log" \
    env PYTHON=python3 launch/torchrun.sh 2 bench/tp_sweep.py --max-minutes 2.5 "${common[@]}" "${extra[@]}" || rc=1
done
if wants tests; then
  export FSDIST_TEST_HARD_TIMEOUT=120 FSDIST_TEST_TIMEOUT=90
  TORCHRUN_ARGS=--no-python timeout -s INT -k 20 "${TESTS_TIMEOUT:-150}" launch/torchrun.sh 2 bash scripts/rank_pytest.sh \
    tp_gpu_tests -v -p no:warnings -p no:cacheprovider -rfE tests/tensor_parallel/test_gpu.py::test_gpu_graph_capture_does_not_grow_buffers \
    tests/tensor_parallel/test_divergence.py -k "graph_capture or reserve or capturing" > "$OUT/tp_gpu_tests_launcher.log" 2>&1 || rc=1
  for f in "$OUT"/tp_gpu_tests_rank*.log; do echo "== $f"; grep -E " passed| failed|^FAILED|^ERROR" "$f" | tail -8; done
fi
exit $rc
