#!/usr/bin/env bash
# One device call on one GPU (nvidia-h200) for v77 (docs/performance.md): the warp-specialised kernel reading a
# one-tile batch's hidden in TMA boxes of configs.WS_BOX_ROWS rows instead of a zero-padded copy. PARTS (default
# "tests"; the first call ran "tests probe"):
#   tests  the ws kernel's GPU tests of partial tiles (boxes against the padded copy bit for bit, B = 1-96, plain and
#          extended; the padded launches; processed calls and processors on the 64-row tile at B = 24), the
#          processors' GPU suite and the filter kernels' suites (gpu_session_lib.sh's filter_gpu_tests), in parallel
#   probe  filter_probe --only graph, D = 4096, B = V77_BATCHES (17,24,32,48,96): plain / top-k + top-p / min-p /
#          bias + penalties (V77_CASES), --pdl V77_PDL (box0,box8,box0: an A/B/A of the padded copy against boxes)
# Parts cut at what is left of $CALL_BUDGET s (default 560). JSONs in $OUT, logs in $OUT/v77_logs.tgz.
# Usage: export OUT; PARTS="tests probe" bash scripts/gpu_session_v77.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh
pack_on_exit v77
PARTS="${PARTS:-tests}"
rc=0
if wants tests; then
  # the ws kernel's partial-tile tests (boxes against the padded copy, the padded launches, processed calls and the
  # processors at B = 24) and the processors' GPU suite beside the filter kernels' suites (their B = 17-32 calls now
  # read boxes)
  TESTS_TIMEOUT=$(part_limit 520) filter_gpu_tests "tests/ops/test_fused_ws_gpu.py -k 'boxes or partial or \
processed_calls or (64_row_tile_with_processors and 24)'" "tests/test_processors_gpu.py" || rc=1
  grep -hE "passed|failed" "$OUT"/gpu_tests_group*.log | tail -8
fi
if wants probe; then
  TAIL=3 run_part "probe" "$(part_limit 400)" v77_probe.log python3 bench/filter_probe.py --only graph \
    --shape 4096x151936 --batches "${V77_BATCHES:-17,24,32,48,96}" --caps 0 --pdl "${V77_PDL:-box0,box8,box0}" \
    --graph-cases "${V77_CASES:-plain,k50+p0.9,min_p0.05,bias_pen}" || rc=1
  grep " graph " "$OUT/v77_probe.log"
fi
exit $rc
