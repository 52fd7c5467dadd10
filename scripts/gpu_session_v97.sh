#!/usr/bin/env bash
# One device call on one GPU for v97 (docs/performance.md): the noise in fewer instructions (noise.py: one
# mul.wide.u32 per Philox product, lg2.approx.ftz, one fused multiply-add; the same bits). Parts (PARTS, default
# "tests probe large"), cut at what is left of $CALL_BUDGET s (default 560):
#   tests  the new exhaustive bit checks (tests/ops/test_noise_gpu.py: every 32-bit input of the transform, 2**18
#          Philox counters under each of 64 keys), the noise's mirror tests, the 10^6-sample chi-squared tests, the ws kernel against
#          the Triton kernel, CUDA graphs and the no-sync tests
#   probe  bench/noise_cost_probe.py, stage 1 alone: the shipped noise against the same noise in the instructions
#          before v97 (noise_probe="legacy"; checked bit for bit first) and greedy, B = 256 / 512 / 1024, both
#          shapes, three runs a cell
#   large  issue 14's kernel bench at B = 96-1024 (cuBLAS, fsdist, compiled Gumbel-max; eager and graph replays)
#   noise_tests  tests/ops/test_noise_gpu.py alone (v97b)
# V97_METHODS / V97_REPEAT / V97_BATCHES: the probe's methods (beside cublas and ws), runs a cell, batches.
# JSONs in $OUT, logs in $OUT/v97_logs.tgz. Usage: export OUT; bash scripts/gpu_session_v97.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh
pack_on_exit v97
PARTS="${PARTS:-tests probe large}"
rc=0
if wants noise_tests; then  # (v97b: the bit checks alone)
  TESTS_TIMEOUT=$(part_limit 100) bash scripts/gpu_tests_parallel.sh "tests/ops/test_noise_gpu.py" || rc=1
fi
if wants tests; then
  TESTS_TIMEOUT=$(part_limit 200) bash scripts/gpu_tests_parallel.sh \
    "tests/ops/test_noise_gpu.py tests/ops/test_noise.py" \
    "tests/ops/test_sample_gpu.py" \
    "tests/ops/test_fused_ws_gpu.py -k 'writes_the_triton or short_last or hand_off or ties'" \
    "tests/test_gpu_serving.py -k 'cuda_graph or never_synchron'" || rc=1
fi
if wants probe; then
  TAIL=30 run_part probe "$(part_limit 200)" v97_noise_cost_console.log python3 bench/noise_cost_probe.py \
    --repeat "${V97_REPEAT:-3}" --seconds 0 --batches "${V97_BATCHES:-256,512,1024}" \
    --methods "${V97_METHODS:-ws_legacy,ws_greedy}" || rc=1
fi
if wants large; then
  large_batches_bench || rc=1
fi
exit $rc
