#!/usr/bin/env bash
# One device call on one GPU (nvidia-h200) for v74 (docs/performance.md), on the shipped switches (PDL_FALLBACK on,
# PDL_STAGE2 off, extended calls at B = 17-32 on the ws 64-row tile where D <= 4096):
#   the GPU tests: the PDL chain bit for bit with both switches on (tests/test_pdl_chain.py), v73's PDL test, the
#   padded ws 64-row tile's extended candidates and filtered calls, the serving tests' graph capture and no-sync;
#   filter_probe --only graph, D = 4096, B = 1 / 16 / 24 / 32 / 64, plain / top-k + top-p / min-p / bias + penalties,
#   --pdl off,fallback,off (fallback = as shipped), then D = 8192 B = 32 as shipped (the ws rule must not apply).
# (The first two v74 calls, which chose these switches, ran filter_probe directly: see docs/performance.md.)
# Parts cut at what is left of $CALL_BUDGET s. JSONs in $OUT, logs in $OUT/v74_logs.tgz.
# Usage: export OUT; bash scripts/gpu_session_v74.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh
pack_on_exit v74
rc=0
CALL_BUDGET_DEFAULT=540  # (part_limit's budget when $CALL_BUDGET is unset)
TAIL=10 run_part "gpu tests" "$(part_limit 230)" v74_gpu_tests.log python3 -m pytest -q -p no:warnings \
  -p no:cacheprovider -rfE --durations=8 tests/test_pdl_chain.py tests/test_processors_gpu.py \
  tests/test_gpu_serving.py tests/ops/test_fused_ws_gpu.py \
  -k "pdl or synchronise or cuda_graph or partial_64_row or filtered_calls_on_the_64" || rc=1
TAIL=3 run_part "probe pdl" "$(part_limit 200)" v74_probe.log python3 bench/filter_probe.py --only graph \
  --shape 4096x151936 --batches "${V74_BATCHES:-1,16,24,32,64}" --caps 0 --pdl off,fallback,off \
  --graph-cases plain,k50+p0.9,min_p0.05,bias_pen || rc=1
grep " graph " "$OUT/v74_probe.log"
TAIL=3 run_part "probe 8192" "$(part_limit 80)" v74_probe_8192.log python3 bench/filter_probe.py --only graph \
  --shape 8192x128256 --batches 32 --caps 0 --graph-cases plain,k50+p0.9,min_p0.05 || rc=1
grep " graph " "$OUT/v74_probe_8192.log"
exit $rc
