#!/usr/bin/env bash
# One device call on one GPU (nvidia-h200), thirty-sixth session, after the host-overhead changes (plan_sample's
# cache, device queries asked once, fewer tensor ops a call). PARTS (default "tests host"):
#   tests  the GPU tests whose calls go through the changed host code: the serving suite's no-sync and CUDA-graph
#          tests, the PDL chains (pdl_args changed), the one-GPU sample tests, the processors' GPU tests and the ws
#          kernel's dispatch tests, in parallel groups
#   host   bench/host_overhead.py as v81 ran it (D = 4096, B = 16 / 64 / 128, plain, top-k + top-p, min-p, cProfile
#          tops for B = 128): the host's submit time per call after the changes
# Parts cut at what is left of $CALL_BUDGET s (default 560). JSONs in $OUT, logs in $OUT/v83_logs.tgz.
# Usage: export OUT; bash scripts/gpu_session_v83.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh
pack_on_exit v83
PARTS="${PARTS:-tests host}"
rc=0
if wants tests; then
  TESTS_TIMEOUT=$(part_limit 330) bash scripts/gpu_tests_parallel.sh \
    "tests/test_gpu_serving.py -k 'never_synchronises or cuda_graph'" \
    "tests/test_pdl_chain.py tests/test_processors_gpu.py" \
    "tests/ops/test_sample_gpu.py" \
    "tests/ops/test_fused_ws_gpu.py -k 'past_64_rows_keep or filtered_calls_on or partial_64_row'" || rc=1
fi
if wants host; then
  TAIL=14 run_part host "$(part_limit 150)" v83_host_overhead.log python3 bench/host_overhead.py \
    --shape 4096x151936 --batches "${HOST_BATCHES:-16,64,128}" --filters --profile --out "$OUT" || rc=1
fi
exit $rc
