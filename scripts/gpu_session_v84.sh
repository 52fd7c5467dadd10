#!/usr/bin/env bash
# One device call on one GPU (nvidia-h100-x1) for v84 (docs/performance.md): the H100's side-by-side benches on the
# current code, the first since v62. PARTS (default "serving large"):
#   serving  bench/kernel_bench.py as v66 / v79 ran it (scripts/gpu_session_v66.sh) for $SHAPES (default
#            4096x151936): cuBLAS, plain fsdist, top-k 50 + top-p 0.9, min-p 0.05, the bitmask, bias + penalties on
#            1,000 ids a row, each with its compiled materialized baseline; B = 1 / 16 / 32 / 64 / 128 / 256
#   large    issue 14's large batches, both shapes, B = 96-1024: cuBLAS, fsdist, compiled Gumbel-max
#   tests    the GPU tests of the paths an H100 takes (the 32-row Triton tile for processors and extended calls at
#            B = 17-32, the padded fused path at B = 129-192, the 10^6-sample chi-squared tests), parallel groups
# Parts cut at what is left of $CALL_BUDGET s (default 560). JSONs in $OUT, logs in $OUT/v84_logs.tgz.
# Usage: export OUT; bash scripts/gpu_session_v84.sh; SHAPES=8192x128256 PARTS=serving bash ...; PARTS=tests ...
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh
pack_on_exit v84
PARTS="${PARTS:-serving large}"
rc=0
if wants serving; then
  KERNEL_TIMEOUT=$(part_limit 340) bash scripts/gpu_session_v66.sh || rc=1
fi
if wants large; then
  TAIL=30 large_batches_bench || rc=1
fi
if wants tests; then
  TESTS_TIMEOUT=$(part_limit 400) bash scripts/gpu_tests_parallel.sh \
    "tests/test_gpu_serving.py -k 'chi_squared'" \
    "tests/test_gpu_serving.py -k 'not chi_squared'" \
    "tests/test_processors_gpu.py" \
    "tests/ops/test_sample_gpu.py tests/test_pdl_chain.py" \
    "tests/ops/test_fused_ws_gpu.py" \
    "tests/ops/test_select_filtered.py tests/ops/test_noise.py" || rc=1
fi
exit $rc
