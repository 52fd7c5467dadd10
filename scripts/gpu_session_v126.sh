#!/usr/bin/env bash
# One device call on one GPU (nvidia-h100-x1) for v125c / v126 (docs/performance.md): v125's shipped rule
# (plain sampled calls on the ws 128-row tile ask for the skip's code, configs.SKIP_NOISE_PLAIN_WIDE_TILE) checked and
# timed, and issue 14's large batches against cuBLAS on the code as it now is. Parts (PARTS, default "tests probe
# large"), each cut at what is left of $CALL_BUDGET s (default 560):
#   tests  in parallel groups: the shipped path against the Triton tile (a plain B = 256 call on the ws 128-row tile,
#          eager and in a CUDA graph), tests/ops/test_skip_noise.py, the no-sync tests of test_gpu_serving.py
#   probe  bench/filter_probe.py graph replays at D = 4096, A/B/A/B of every skip off ("noskip") and as shipped
#          ("skip"), plain calls, batches $B4096 (default 96,256,1024)
#   large  bench/kernel_bench.py's large batches (cuBLAS, fsdist, cuBLAS + compiled Gumbel-max; both shapes; graph
#          replays): issue 14's table
# TESTS_LIMIT, PROBE_LIMIT and LARGE_LIMIT (s) cap the parts (200, 120, 220). JSONs in $OUT, logs in $OUT/v126_logs.tgz.
# Usage: export OUT; bash scripts/gpu_session_v126.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh
pack_on_exit v126
PARTS="${PARTS:-tests probe large}"
rc=0
if wants probe; then  # (first: its timings taken before the test processes compile beside it)
  TAIL=12 run_part probe "$(part_limit "${PROBE_LIMIT:-120}")" v126_probe.log python3 bench/filter_probe.py \
    --shape 4096x151936 --batches "${B4096:-96,256,1024}" --only graph --caps 0 \
    --pdl noskip,skip,noskip,skip --graph-cases plain || rc=1
fi
if wants large; then
  LARGE_LIMIT="${LARGE_LIMIT:-220}" LARGE_BATCHES="${LARGE_BATCHES:-96,256,512,1024}" large_batches_bench || rc=1
fi
if wants tests; then
  TESTS_TIMEOUT=$(part_limit "${TESTS_LIMIT:-200}") bash scripts/gpu_tests_parallel.sh \
    "tests/ops/test_fused_ws_gpu.py -k sample_uses_it" \
    "tests/ops/test_skip_noise.py" \
    "tests/test_gpu_serving.py -k 'synchronises'" || rc=1
fi
exit $rc
