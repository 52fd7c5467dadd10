#!/usr/bin/env bash
# One device call on one GPU (an H200 wanted) for v69 (docs/performance.md): the padded-launch GPU tests after the
# half-empty rule (configs.PAD_HALF_TILE_ROWS), then bench/filter_probe.py --only graph at D = 4096, B = 24 / 32 / 48,
# plain and bias + penalties (CUDA-graph replays, L2 flushed, [B] parameters). JSONs and logs in $OUT.
# Usage: export OUT; bash scripts/gpu_session_v69.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh
rc=0
TAIL=4 run_part "padding tests" "${TEST_TIMEOUT:-150}" v69_pad_tests.log python3 -m pytest -v -p no:cacheprovider \
  tests/ops/test_fused_ws_gpu.py -k "padded or partial" || rc=1
TAIL=4 run_part "probe" "${PROBE_TIMEOUT:-150}" v69_probe.log python3 bench/filter_probe.py --only graph \
  --shape 4096x151936 --batches 24,32,48 --caps 0 --graph-cases plain,bias_pen || rc=1
exit $rc
