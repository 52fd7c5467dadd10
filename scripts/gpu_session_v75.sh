#!/usr/bin/env bash
# One device call on one GPU (nvidia-h200) for v75 (docs/performance.md). PARTS picks (default "probe"):
#   probe  filter_probe --only graph, D = 4096, B = 24 / 32 (V75_BATCHES): plain / top-k + top-p / min-p
#          (V75_CASES) as shipped, without the fallback's launches (--pdl nofb: an upper bound on what removing them
#          saves), as shipped again (V75_PDL); the first call also timed select_filtered at 32 warps
#          (V75_WARPS=32 V75_CASES="plain,k50+p0.9,min_p0.05,k50+p0.9 warps=32,min_p0.05 warps=32"); the second
#          V75_PDL=fallback,nofb,nomat,nores,tiny,fallback.
#   tests  the GPU tests left from v74: the PDL chain (tests/test_pdl_chain.py), the stagger test, the serving
#          graph capture with filter tensors, the padded ws 64-row tile's extended candidates and filtered calls,
#          the processors' PDL tests.
# Parts cut at what is left of $CALL_BUDGET s (default 560). JSONs in $OUT, logs in $OUT/v75_logs.tgz.
# Usage: export OUT; PARTS="probe" bash scripts/gpu_session_v75.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh
pack_on_exit v75
PARTS="${PARTS:-probe}"
rc=0
part_limit() {
  local left=$(( ${CALL_BUDGET:-560} - (SECONDS - start) ))
  echo $(( left < $1 ? (left > 10 ? left : 10) : $1 ))
}
if wants probe; then
  TAIL=3 run_part "probe" "$(part_limit 400)" v75_probe.log python3 bench/filter_probe.py --only graph \
    --shape 4096x151936 --batches "${V75_BATCHES:-24,32}" --caps 0 --pdl "${V75_PDL:-fallback,nofb,fallback}" \
    ${V75_WARPS:+--select-warps $V75_WARPS} --graph-cases "${V75_CASES:-plain,k50+p0.9,min_p0.05}" || rc=1
  grep " graph " "$OUT/v75_probe.log"
fi
if wants tests; then
  TAIL=12 run_part "gpu tests" "$(part_limit 540)" v75_gpu_tests.log python3 -m pytest -q -p no:warnings \
    -p no:cacheprovider -rfE --tb=short --durations=10 tests/test_pdl_chain.py tests/ops/test_sample_gpu.py \
    tests/test_gpu_serving.py tests/ops/test_fused_ws_gpu.py tests/test_processors_gpu.py \
    -k "test_pdl_chain or stagger or cuda_graph_with_filter_tensors or partial_64_row or filtered_calls_on_the_64 \
or pdl" || rc=1
fi
exit $rc
