#!/usr/bin/env bash
# One device call on one GPU (an H200 wanted) for v68 (docs/performance.md): the warp-specialised 64-row tile on a
# zero-padded hidden wherever the batch leaves it partly empty (configs.PAD_TILE_ROWS = 64, one pad launch), and
# calls with bias / penalty entries at B = 17-32 on that tile (configs.SPARSE_WS_MIN_BATCH), as an A/B/A against the
# carried ab_base/ tree (the commit before) at B = $AB_BATCHES (default 24,32,48), D = 4096 (bench/filter_probe.py
# --only graph: plain / top-k 50 + top-p 0.9 / min-p 0.05 / bias + penalties, CUDA-graph replays, L2 flushed, [B]
# parameters), $AB_TIMEOUT s a run (default 120); then the GPU tests of the padded launches and of the processors,
# cut at the call's remaining time. JSONs and logs in $OUT.
# Usage: export OUT; bash scripts/gpu_session_v68.sh   (carry ["ab_base"])
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh
OUT="$(cd "$OUT" && pwd)"
rc=0
AB_TIMEOUT="${AB_TIMEOUT:-120}" ab_runs v68 python3 bench/filter_probe.py --only graph --shape 4096x151936 \
  --batches "${AB_BATCHES:-24,32,48}" --caps 0 --graph-cases plain,k50+p0.9,min_p0.05,bias_pen || rc=1
CALL_BUDGET="${CALL_BUDGET:-540}" tests_in_the_time_left \
  "tests/ops/test_fused_ws_gpu.py -k 'padded or partial'" \
  "tests/test_processors_gpu.py" \
  "tests/test_gpu_serving.py -k 'cuda_graph or sync or memory'" || rc=1
exit $rc
