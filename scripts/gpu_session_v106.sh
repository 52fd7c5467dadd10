#!/usr/bin/env bash
# One device call on one GPU for v106 (docs/performance.md): is the ws tile's operand stream limited by bytes or by
# latency? bench/ws_waits.py with 64-row batch tiles (1.5x the operand bytes a product) and 6 operand stages (more
# bytes in flight) beside the shipped launch and cuBLAS's matmul, greedy / noise, B = $V106_BATCHES (default
# 1024,256), both shapes. (v104 / v105 ran gpu_session_v104.sh / gpu_session_v105.sh at commits de1ba60 / 8606a02.)
# JSONs in $OUT, logs in $OUT/v106_logs.tgz. Usage: export OUT; bash scripts/gpu_session_v106.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh
pack_on_exit v106
TAIL=40 run_part waits "$(part_limit 400)" v106_ws_waits_console.log python3 bench/ws_waits.py \
  --batches "${V106_BATCHES:-1024,256}" --cases "${V106_CASES:-greedy,noise}" \
  --variants "${V106_VARIANTS:-shipped,b64,s6,s4,b64+s6}"
