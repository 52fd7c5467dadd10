#!/usr/bin/env bash
# One device call on two GPUs (nvidia-h200-x2, carry [".whl", "ab_base"]) for v73 (docs/performance.md): issue 12
# across TP, the fixed costs of a call with logit bias + penalties. The processors' fingerprint written by the
# preparation kernel (no launch of its own) and the Triton fused kernel launched as a programmatic dependent of
# entry_offsets_kernel (PDL), against ab_base/ (main before them: git archive <rev> fsdist bench scripts):
#   tp_sweep --profile-breakdown, D = 4096, bias + penalties on 1,000 ids a row, nvshmem, candidates, graph
#   replays, B = 1 / 16 / 64: TP = 2 before / after / before again, then TP = 1 and plain TP = 2 after;
#   filter_probe (graph, D = 4096, B = 1 / 16 / 32 / 64) on GPU 0, the select_filtered merge of v71 + v72;
#   the GPU tests: PDL bit for bit and the processors' graph / sync tests, the preparation kernel's fingerprint,
#   the tensor-parallel processor and divergence tests on both GPUs, cut at what is left of $CALL_BUDGET s.
# JSONs in $OUT, logs in $OUT/v73_logs.tgz.
# Usage: export OUT; bash scripts/gpu_session_v73.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh
pack_on_exit v73
carried_wheels
rc=0
CALL_BUDGET_DEFAULT=540  # (part_limit's budget when $CALL_BUDGET is unset)
sweep() {  # sweep FILTER TP: tp_sweep's arguments
  echo bench/tp_sweep.py --max-minutes 2 --shapes 4096x151936 --batches "${V73_BATCHES:-1,16,64}" --filters "$1" \
    --transports nvshmem --reductions candidates --baselines matmul_shard --runs 3 --iters 50 --graph \
    --profile-breakdown --out "$OUT"
}
for part in before after before2; do
  if [ "$part" = after ]; then dir=.; else dir=ab_base; fi
  [ -d "$dir/fsdist" ] || { echo "no $dir tree: $part skipped"; continue; }
  (cd "$dir" && TAIL=12 run_part "tp2 bias_pen $part" "$(part_limit 90)" "v73_tp2_$part.log" \
     env PYTHON=python3 launch/torchrun.sh 2 $(sweep bias_pen)) || rc=1
done
TAIL=8 run_part "tp1 bias_pen after" "$(part_limit 90)" v73_tp1_after.log \
  env PYTHON=python3 launch/torchrun.sh 1 $(sweep bias_pen) || rc=1
TAIL=8 run_part "tp2 plain after" "$(part_limit 70)" v73_tp2_plain.log \
  env PYTHON=python3 launch/torchrun.sh 2 $(sweep none) || rc=1
TAIL=6 run_part "filter_probe merged" "$(part_limit 80)" v73_filter_probe.log env CUDA_VISIBLE_DEVICES=0 \
  python3 bench/filter_probe.py --only graph --shape 4096x151936 --batches 1,16,32,64 --caps 0 \
  --graph-cases plain,k50+p0.9,min_p0.05 || rc=1
TAIL=6 run_part "single-GPU tests" "$(part_limit 150)" v73_gpu_tests.log env CUDA_VISIBLE_DEVICES=0 python3 -m pytest \
  -q -p no:warnings -p no:cacheprovider -rfE --durations=8 tests/ops/test_prepare_processors.py \
  tests/test_processors_gpu.py -k "pdl or cuda_graph or synchronise or fingerprint or entries" || rc=1
export FSDIST_TEST_HARD_TIMEOUT=120 FSDIST_TEST_TIMEOUT=90
TORCHRUN_ARGS=--no-python run_part "tp tests" "$(part_limit 200)" v73_tp_launcher.log launch/torchrun.sh 2 \
  bash scripts/rank_pytest.sh v73_tp_tests -q -p no:warnings -p no:cacheprovider -rfE \
  tests/tensor_parallel/test_processors_tp.py tests/tensor_parallel/test_divergence.py || rc=1
for f in "$OUT"/v73_tp_tests_rank*.log; do
  echo "== $f"; grep -E " passed| failed| error|^FAILED|^ERROR" "$f" | tail -6
done
exit $rc
