#!/usr/bin/env bash
# One device call on one GPU (nvidia-h200) for v75 (docs/performance.md). PARTS picks (default "probe"):
#   probe  filter_probe --only graph, D = 4096, B = 24 / 32 (V75_BATCHES): plain / top-k + top-p / min-p
#          (V75_CASES) as shipped, without the fallback's launches (--pdl nofb: an upper bound on what removing them
#          saves), as shipped again (V75_PDL); the first call also timed select_filtered at 32 warps
#          (V75_WARPS=32 V75_CASES="plain,k50+p0.9,min_p0.05,k50+p0.9 warps=32,min_p0.05 warps=32"); the second
#          V75_PDL=fallback,nofb,nomat,nores,tiny,fallback; the third V75_PDL=fallback,beside,fallback
#          V75_BATCHES=1,16,24,32,64 (v76: select_filtered beside the merge against v74's folded merge).
#   tests  the filter kernels' GPU suites (gpu_session_lib.sh's filter_gpu_tests) with select_filtered beside the
#          merge as shipped, the PDL chain bit for bit (tests/test_pdl_chain.py), the processors' PDL tests and the
#          GPU tests left from v74 (the stagger test, the serving graph capture with filter tensors, the padded ws
#          64-row tile's extended candidates and filtered calls).
# Parts cut at what is left of $CALL_BUDGET s (default 560). JSONs in $OUT, logs in $OUT/v75_logs.tgz.
# Usage: export OUT; PARTS="probe" bash scripts/gpu_session_v75.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh
pack_on_exit v75
PARTS="${PARTS:-probe}"
rc=0
if wants probe; then
  TAIL=3 run_part "probe" "$(part_limit 400)" v75_probe.log python3 bench/filter_probe.py --only graph \
    --shape 4096x151936 --batches "${V75_BATCHES:-24,32}" --caps 0 --pdl "${V75_PDL:-fallback,nofb,fallback}" \
    ${V75_WARPS:+--select-warps $V75_WARPS} --graph-cases "${V75_CASES:-plain,k50+p0.9,min_p0.05}" || rc=1
  grep " graph " "$OUT/v75_probe.log"
fi
if wants tests; then
  # the filter kernels' GPU suites in parallel (five groups: the serving chi-squared, no-sync and graph tests, the
  # stagger test, the padded ws tile's filtered calls ...), with the PDL chain's bit-for-bit test (select_filtered
  # beside the merge included) and the padded ws tile's extended candidates beside them
  TESTS_TIMEOUT=$(part_limit 520) filter_gpu_tests "tests/test_pdl_chain.py tests/test_processors_gpu.py -k \
'pdl or test_pdl_chain'" "tests/ops/test_fused_ws_gpu.py -k partial_64_row" || rc=1
  grep -hE "passed|failed" "$OUT"/gpu_tests_group*.log | tail -8
fi
exit $rc
