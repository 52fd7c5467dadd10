#!/usr/bin/env bash
# One device call on one GPU for v93 (docs/performance.md): the shipped rule "the H100's ws 128-row tile takes 4
# operand stages from 768 rows" (configs.WS_FEWER_STAGES_FROM) in whole calls and tests. Parts (PARTS, default
# "probe tests large"), cut at what is left of $CALL_BUDGET s (default 560):
#   probe  bench/filter_probe.py graph replays (whole fsdist.sample calls, [B] temperatures, L2 flushed), plain calls
#          on the dispatch ("plain": 4 stages from B = 768 on an H100) against the same tile forced to 5 stages,
#          B = 512, 768, 1024, both shapes, twice
#   tests  the GPU tests through the 128-row tile (the 10^6-sample chi-squared tests with B = 8192 rows, the ws kernel
#          against the Triton kernel, CUDA graphs and the no-sync tests)
#   large  issue 14's kernel bench at B = 768 / 1024 (cuBLAS, fsdist, compiled Gumbel-max), both shapes
# JSONs in $OUT, logs in $OUT/v93_logs.tgz. Usage: export OUT; bash scripts/gpu_session_v93.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh
pack_on_exit v93
PARTS="${PARTS:-probe tests large}"
rc=0
C5=128x128x64w8s5t-ws
if wants probe; then
  for run in 1 2; do
    for shape in 4096x151936 8192x128256; do
      TAIL=6 run_part "probe$run" "$(part_limit 90)" "v93_probe_${shape%%x*}_run$run.log" \
        python3 bench/filter_probe.py --shape "$shape" --batches "${V93_BATCHES:-512,768,1024}" --only graph \
        --caps 0 --configs "$C5" --graph-cases "plain,plain $C5" || rc=1
    done
  done
fi
if wants tests; then
  TESTS_TIMEOUT=$(part_limit 200) bash scripts/gpu_tests_parallel.sh \
    "tests/ops/test_sample_gpu.py" \
    "tests/ops/test_fused_ws_gpu.py -k 'writes_the_triton or short_last or hand_off or ties'" \
    "tests/test_gpu_serving.py -k 'cuda_graph or never_synchron'" || rc=1
fi
if wants large; then
  lim=$(part_limit 150)
  TAIL=20 run_part large "$lim" kernel_bench_large_console.log env BENCH_TIMEOUT="$((lim > 25 ? lim - 15 : 10))" \
    bash bench/run_gpu.sh kernel --methods cublas,fsdist,gumbel_compiled --graph-methods cublas,fsdist,gumbel_compiled \
    --shapes 4096x151936,8192x128256 --batches 768,1024 --reps 20 --repeats 1 --warmup 5 || rc=1
fi
exit $rc
