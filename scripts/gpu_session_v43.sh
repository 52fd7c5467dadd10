#!/usr/bin/env bash
# One device call on two GPUs (nvidia-h100-x2 or nvidia-h200-x2) for v43 (docs/performance.md): the tensor-parallel
# head with per-row top-k 50 + top-p 0.9 ([B] device tensors) at TP = 1 and 2, and the same sweep without
# filters, side by side on one machine; the plain sweep also times each head with the separate end_step
# launch (v44's A/B: methods ..._endk). nvshmem needs the nvshmem4py wheel in .whl/ (carry=[".whl"]).
#   PARTS, any of: filtered plain tests   (default "filtered plain"; run "tests" as a second call: the TP GPU tests
#          of the code the twenty-second session could not GPU-run: the gated barrier's revisions, the graph test's
#          three-round case, the merge that ends a plain step; logs $OUT/tp_gpu_tests_rank<r>.log, TESTS_TIMEOUT s;
#          TP_TESTS: other pytest paths / node ids, split on spaces; -v, so a killed run still names its last test)
#   V43_BATCHES (default 1,16,64,128,256), V43_TIMEOUT seconds per part, TP = 1 and 2 together (default 250)
# JSONs: tp_sweep_top_k_top_p_tp{1,2}_<gpu>_<date>.json and tp_sweep_tp{1,2}_<gpu>_<date>.json in $OUT, consoles
# v43_<part>.log. Usage: export OUT; bash scripts/gpu_session_v43.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh
PARTS="${PARTS:-filtered plain}"
common=(--shapes 4096x151936,8192x128256 --batches "${V43_BATCHES:-1,16,64,128,256}" --transports nvshmem,symm_mem
        --reductions candidates --runs 3 --iters 50 --graph)
rc=0
for part in filtered plain; do
  wants "$part" || continue
  if [ "$part" = filtered ]; then
    extra=(--filters top_k_top_p --baselines matmul_shard,ag_matmul,ag_filtered)
  else
    extra=(--baselines matmul_shard,ag_matmul,ag_gumbel --ab-merge-end-step)  # v44's A/B too
  fi
  BENCH_TIMEOUT="${V43_TIMEOUT:-250}" TAIL=40 run_part "$part" "$((${V43_TIMEOUT:-250} + 30))" "v43_$part.log" \
    bash bench/run_gpu.sh tp "1 2" "${common[@]}" "${extra[@]}" || rc=1
done
if wants tests; then
  carried_wheels  # nvshmem4py for the nvshmem cases
  export FSDIST_TEST_HARD_TIMEOUT=120 FSDIST_TEST_TIMEOUT=90  # a hang fails its test
  TORCHRUN_ARGS=--no-python timeout -s INT -k 20 "${TESTS_TIMEOUT:-540}" launch/torchrun.sh 2 bash scripts/rank_pytest.sh \
    tp_gpu_tests -v -p no:warnings -p no:cacheprovider -rfE --durations=15 ${TP_TESTS:-tests/tensor_parallel/test_gated_barrier.py \
    tests/tensor_parallel/test_gpu.py tests/tensor_parallel/test_divergence.py} > "$OUT/tp_gpu_tests_launcher.log" 2>&1 || rc=1
  for f in "$OUT"/tp_gpu_tests_rank*.log; do echo "== $f"; grep -E " passed| failed|^FAILED|^ERROR" "$f" | tail -8; done
fi
exit $rc
