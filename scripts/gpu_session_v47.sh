#!/usr/bin/env bash
# One device call on two GPUs (nvidia-h200-x2 / nvidia-h100-x2, carry .whl) for v47 (docs/performance.md): the
# head's step barriers as fsdist's own signal-pad barrier with a timeout (FSDIST_DEVICE_BARRIER=1).
#   tests: the device barrier's GPU test (same tokens as the library's barriers, plain / filtered / graph; a
#          skipped call times out on the peers instead of hanging) and test_gated_barrier.py; logs
#          $OUT/v47_tests_rank<r>.log
#   sweep: tp_sweep at TP = 2, D = 4096, B = 1 / 16 / 64, nvshmem and symm_mem, graph replays, each head
#          with the library's barriers and with FSDIST_DEVICE_BARRIER=1 (methods ..._devbar), side by side
#   v48:   tp_sweep --filters bitmask and bias_pen at TP = 2 (D = 4096, B = 1 / 16 / 64, nvshmem, graph replays,
#          against ag_filtered), then the plain sweep on the same machine: v48's prediction in docs/performance.md
#   unchecked: the TP GPU tests of code changed since its last GPU run (the gated barrier's flag count and poison,
#          the local-error path, the filtered graph test): logs $OUT/v47_unchecked_rank<r>.log
#   PARTS (default "tests sweep"; the twenty-fourth session: "tests v48 unchecked"), V47_BATCHES (default 1,16,64)
# Usage: export OUT; bash scripts/gpu_session_v47.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh
PARTS="${PARTS:-tests sweep}"
carried_wheels  # nvshmem4py for the nvshmem cases
rc=0
if wants tests; then
  export FSDIST_TEST_HARD_TIMEOUT=90 FSDIST_TEST_TIMEOUT=60
  TORCHRUN_ARGS=--no-python timeout -s INT -k 15 "${TESTS_TIMEOUT:-200}" launch/torchrun.sh 2 bash scripts/rank_pytest.sh \
    v47_tests -v -p no:warnings -p no:cacheprovider -rfE tests/tensor_parallel/test_gpu.py \
    tests/tensor_parallel/test_gated_barrier.py -k "device_step_barriers or gated_barrier" \
    > "$OUT/v47_tests_launcher.log" 2>&1 || rc=1
  for f in "$OUT"/v47_tests_rank*.log; do echo "== $f"; grep -E "PASSED|FAILED|ERROR| passed| failed" "$f" | tail -14; done
fi
if wants sweep; then
  TAIL=30 run_part sweep "${SWEEP_TIMEOUT:-120}" v47_sweep.log env PYTHON=python3 launch/torchrun.sh 2 \
    bench/tp_sweep.py --max-minutes 1.6 --shapes 4096x151936 --batches "${V47_BATCHES:-1,16,64}" \
    --transports nvshmem,symm_mem --reductions candidates --baselines matmul_shard --runs 3 --iters 50 --graph \
    --ab-device-barrier || rc=1
fi
if wants v48; then
  for f in bitmask bias_pen none; do
    TAIL=14 run_part "v48_$f" "${V48_TIMEOUT:-110}" "v48_$f.log" env PYTHON=python3 launch/torchrun.sh 2 \
      bench/tp_sweep.py --max-minutes 1.3 --filters "$f" --shapes 4096x151936 --batches "${V47_BATCHES:-1,16,64}" \
      --transports nvshmem --reductions candidates --runs 3 --iters 50 --graph \
      --baselines "$([ "$f" = none ] && echo matmul_shard || echo matmul_shard,ag_filtered)" || rc=1
  done
fi
if wants unchecked; then
  export FSDIST_TEST_HARD_TIMEOUT=90 FSDIST_TEST_TIMEOUT=60
  TORCHRUN_ARGS=--no-python timeout -s INT -k 15 "${UNCHECKED_TIMEOUT:-200}" launch/torchrun.sh 2 \
    bash scripts/rank_pytest.sh v47_unchecked -v -p no:warnings -p no:cacheprovider -rfE \
    tests/tensor_parallel/test_divergence.py tests/tensor_parallel/test_gpu.py \
    -k "local_error or filters_on_one_rank or fallback_rows_replay" > "$OUT/v47_unchecked_launcher.log" 2>&1 || rc=1
  for f in "$OUT"/v47_unchecked_rank*.log; do echo "== $f"; grep -E "FAILED|ERROR| passed| failed" "$f" | tail -8; done
fi
exit $rc
