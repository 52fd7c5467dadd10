#!/usr/bin/env bash
# One device call on two GPUs (nvidia-h200-x2 / nvidia-h100-x2, carry [".whl", "ab_base"]) for v49
# (docs/performance.md): the TP merge's header loads issued before its loop and its last program spared a
# dependent load, relaxed atomics where an acquire-release one only added a fence, and fsdist's device barrier
# with one system fence per side instead of one per arrival.
#   ab:    tp_sweep at TP = 2, D = 4096, B = $V49_BATCHES (default 1,16,64,128), nvshmem and symm_mem, graph
#          replays, each head also with FSDIST_DEVICE_BARRIER=1 (_devbar): first the code before (run from ab_base/,
#          a copy of the parent commit's fsdist/, bench/, launch/ and scripts/ that the call carries:
#          git archive bae3a01 fsdist bench launch scripts | tar -x -C ab_base --exclude='bench/results/*'),
#          then this tree's, same machine
#   base:  tp_sweep --filters top_k_top_p with --graph-baselines: ag_filtered and the shard matmul as CUDA-graph
#          replays beside their eager calls, so fsdist's replays meet the baseline's device time
#   div:   tests/tensor_parallel/test_divergence.py on the GPUs (the header check the merge now splits in two)
#   devbar: test_gpu.py, test_gated_barrier.py and test_graphs.py with FSDIST_DEVICE_BARRIER=1 (the default's
#          candidate), then tests/test_gpu_serving.py -k never_synchronises on GPU 0
#   flip:  with the device barrier on by default on GPUs (no FSDIST_DEVICE_BARRIER set): test_divergence.py and
#          test_gpu.py's device-barrier test (FSDIST_DEVICE_BARRIER=0 for its library half)
#   PARTS (default "ab base div"); the device tool brings back few files, so the JSONs land in $OUT and the
#   logs in $OUT/v49_logs.tgz.
# Usage: export OUT; bash scripts/gpu_session_v49.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh
pack_on_exit v49
PARTS="${PARTS:-ab base div}"
carried_wheels
SWEEP=(env PYTHON=python3 launch/torchrun.sh 2 bench/tp_sweep.py --max-minutes 1.8 --shapes 4096x151936
       --batches "${V49_BATCHES:-1,16,64,128}" --transports nvshmem,symm_mem --reductions candidates
       --baselines matmul_shard --runs 3 --iters 50 --graph --ab-device-barrier)
rc=0
if wants ab; then
  # The code before runs from ab_base/, a copy of the parent commit's fsdist/, bench/, launch/ and scripts/:
  # bench/common.py puts its own repository root first on sys.path, so only a whole tree selects the package.
  if [ -d ab_base/fsdist ] && [ -d ab_base/bench ]; then
    (cd ab_base && python3 -c 'import sys; sys.path.insert(0, "bench"); import common, fsdist; print("before: fsdist from", fsdist.__file__)')
    (cd ab_base && TAIL=22 run_part ab_before 150 v49_ab_before.log "${SWEEP[@]}") || rc=1
  else
    echo "no ab_base/ tree carried: the 'before' sweep is skipped"
  fi
  python3 -c 'import sys; sys.path.insert(0, "bench"); import common, fsdist; print("after: fsdist from", fsdist.__file__)'
  TAIL=22 run_part ab_after 150 v49_ab_after.log "${SWEEP[@]}" || rc=1
fi
if wants base; then
  TAIL=16 run_part base 130 v49_base.log env PYTHON=python3 launch/torchrun.sh 2 bench/tp_sweep.py --max-minutes 1.6 \
    --filters top_k_top_p --shapes 4096x151936 --batches 1,16,64 --transports nvshmem --reductions candidates \
    --runs 3 --iters 50 --graph --graph-baselines --baselines matmul_shard,ag_filtered || rc=1
fi
if wants div; then
  export FSDIST_TEST_HARD_TIMEOUT=90 FSDIST_TEST_TIMEOUT=60
  TORCHRUN_ARGS=--no-python timeout -s INT -k 15 "${DIV_TIMEOUT:-150}" launch/torchrun.sh 2 bash scripts/rank_pytest.sh \
    v49_div -v -p no:warnings -p no:cacheprovider -rfE tests/tensor_parallel/test_divergence.py \
    > "$OUT/v49_div_launcher.log" 2>&1 || rc=1
  for f in "$OUT"/v49_div_rank*.log; do echo "== $f"; grep -E "^FAILED|^ERROR| passed| failed" "$f" | tail -6; done
fi
if wants devbar; then
  export FSDIST_TEST_HARD_TIMEOUT=90 FSDIST_TEST_TIMEOUT=60
  FSDIST_DEVICE_BARRIER=1 TORCHRUN_ARGS=--no-python timeout -s INT -k 15 "${DEVBAR_TIMEOUT:-300}" launch/torchrun.sh 2 \
    bash scripts/rank_pytest.sh v49_devbar -v -p no:warnings -p no:cacheprovider -rfE tests/tensor_parallel/test_gpu.py \
    tests/tensor_parallel/test_gated_barrier.py tests/tensor_parallel/test_graphs.py > "$OUT/v49_devbar_launcher.log" 2>&1 || rc=1
  for f in "$OUT"/v49_devbar_rank*.log; do echo "== $f"; grep -E "^FAILED|^ERROR| passed| failed" "$f" | tail -6; done
  CUDA_VISIBLE_DEVICES=0 TAIL=4 run_part nosync 120 v49_nosync.log python3 -m pytest -q -p no:warnings \
    -p no:cacheprovider -rfE tests/test_gpu_serving.py -k never_synchronises || rc=1
fi
if wants flip; then
  export FSDIST_TEST_HARD_TIMEOUT=90 FSDIST_TEST_TIMEOUT=60
  unset FSDIST_DEVICE_BARRIER
  TORCHRUN_ARGS=--no-python timeout -s INT -k 15 "${FLIP_TIMEOUT:-200}" launch/torchrun.sh 2 bash scripts/rank_pytest.sh \
    v49_flip -v -p no:warnings -p no:cacheprovider -rfE tests/tensor_parallel/test_divergence.py \
    "tests/tensor_parallel/test_gpu.py::test_gpu_device_step_barriers_equal_the_library_barriers_and_time_out_on_a_skipped_call" \
    > "$OUT/v49_flip_launcher.log" 2>&1 || rc=1
  for f in "$OUT"/v49_flip_rank*.log; do echo "== $f"; grep -E "^FAILED|^ERROR| passed| failed" "$f" | tail -6; done
fi
exit $rc
