#!/usr/bin/env bash
# One device call on one GPU (nvidia-h100-x1) after v85 shipped the ws 64-row tile for one GPU's extended calls past
# 64 rows at D <= 4096 on every sm_90 GPU: the GPU tests through that path on an H100 (no fast memory forced now), and
# the shipped dispatch's graph replays at D = 4096, B = 96-512 (filter_probe.py: plain, top-k 50 + top-p 0.9, min-p
# 0.05, and the filtered calls on the 128-row config the H100 ran before), which should match v85's timings; then
# bench/fallback_rate.py on the current code (issue 11's fallback-rate report; its last run, v8, predates
# select_filtered's rewrites), cut at $FALLBACK_SECONDS (120).
# JSONs in $OUT, logs in $OUT/v85b_logs.tgz.
# Usage: export OUT; bash scripts/gpu_session_v85b.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh
pack_on_exit v85b
rc=0
# (the 128-row config, C, is the H100's dispatch before v85 past 64 rows: the rule's new batches, B = 129-191 with a
# partly empty last 64-row tile read without a padded copy, and 384 / 512, against it)
C=128x128x64w8s5t-ws
TAIL=10 run_part probe "$(part_limit 130)" v85b_probe.log python3 bench/filter_probe.py --shape 4096x151936 \
  --batches "${V85B_BATCHES:-96,128,136,160,192,256,384,512}" --only graph --caps 0 --configs "$C" \
  --graph-cases "plain,k50+p0.9,min_p0.05,k50+p0.9 $C,min_p0.05 $C" || rc=1
TESTS_TIMEOUT=$(part_limit 220) bash scripts/gpu_tests_parallel.sh \
  "tests/ops/test_fused_ws_gpu.py -k 'past_64_rows_keep or filtered_calls_on or partial_64_row'" \
  "tests/test_gpu_serving.py -k 'cuda_graph'" \
  "tests/test_gpu_serving.py -k 'chi_squared and (filter or top)'" || rc=1
TAIL=8 run_part fallback "$(part_limit 200)" v85b_fallback_rate.log python3 bench/fallback_rate.py \
  --max-seconds "${FALLBACK_SECONDS:-120}" --out "$OUT" || rc=1
exit $rc
