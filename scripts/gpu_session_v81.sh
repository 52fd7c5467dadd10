#!/usr/bin/env bash
# One device call on one GPU (nvidia-h200), thirty-sixth session. PARTS (default "tests host"):
#   tests  what v80 left unrun: tests/test_gpu_serving.py's CUDA-graph test with filter tensors (B = 80 on the ws
#          64-row tile, "80-128" on the padded 128-row Triton twin) and v80's dispatch tests, in parallel groups
#   host   bench/host_overhead.py at D = 4096, B = 16 / 64 / 128, plain, top-k + top-p and min-p calls ([B] tensors),
#          with cProfile's top functions for B = 128: the host's submit time per call against the stream's, on the
#          GPU's own host (docs/performance.md, open question "Eager calls are host-bound at D = 4096")
# Parts cut at what is left of $CALL_BUDGET s (default 560). JSONs in $OUT, logs in $OUT/v81_logs.tgz.
# Usage: export OUT; bash scripts/gpu_session_v81.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh
pack_on_exit v81
PARTS="${PARTS:-tests host}"
rc=0
if wants tests; then
  TESTS_TIMEOUT=$(part_limit 300) bash scripts/gpu_tests_parallel.sh \
    "tests/test_gpu_serving.py -k cuda_graph" \
    "tests/ops/test_fused_ws_gpu.py -k 'past_64_rows_keep or filtered_calls_on or partial_64_row'" || rc=1
fi
if wants host; then
  TAIL=40 run_part host "$(part_limit 150)" v81_host_overhead.log python3 bench/host_overhead.py \
    --shape 4096x151936 --batches "${HOST_BATCHES:-16,64,128}" --filters --profile --out "$OUT" || rc=1
fi
exit $rc
