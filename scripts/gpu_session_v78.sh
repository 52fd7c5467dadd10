#!/usr/bin/env bash
# One device call on one GPU (nvidia-h200) for v78 (docs/performance.md): past one 128-row tile, a batch whose last
# tile holds at most 64 rows runs that tile on the warp-specialised kernel as half a tile (launch_fused_ws's
# last_box_rows) instead of a whole tile on a zero-padded copy. PARTS (default "tests probe bench"):
#   tests  the ws kernel's GPU tests of partial tiles (the short last tile against the padded launch bit for bit,
#          B = 129-320; the one-tile boxes; the padded launches) and its other GPU tests, then the serving GPU suite
#   probe  bench/ws_probe.py, stage 1 alone, both shapes, B = V78_BATCHES (136,160,192,320): cuBLAS, the Triton
#          kernel, the ws kernel on the padded copy (pad_s5r8e8, what fused calls ran before), unpadded (ws_s5r8e8)
#          and with the short last tile (ws_s5r8e8L8), greedy and epilogue-only; every variant checked bit for bit
#          against the Triton kernel, and the short tile against the padded launch
#   bench  bench/kernel_bench.py, whole calls as graph replays and eager, [B] parameters, both shapes, the same B:
#          cuBLAS, fsdist on the fused path (now with the short tile) and on the chunked path (what choose_path gives
#          these B on an H200 before v78): which path the dispatch should take
# Parts cut at what is left of $CALL_BUDGET s (default 560). JSONs in $OUT, logs in $OUT/v78_logs.tgz.
# Usage: export OUT; PARTS="probe bench" bash scripts/gpu_session_v78.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh
pack_on_exit v78
PARTS="${PARTS:-tests probe bench}"
B78="${V78_BATCHES:-136,160,192,320}"
rc=0
if wants probe; then
  TAIL=30 run_part probe "$(part_limit 330)" v78_ws_probe.log python3 bench/ws_probe.py \
    --shapes 4096x151936,8192x128256 --batches "$B78" --variants s5r8e8,s5r8e8L8 --pad \
    --check-cells 4096x1000:150,4096x1000:200 --reps "${REPS:-20}" || rc=1
fi
if wants bench; then
  M=cublas,fsdist_fused,fsdist_chunked
  lim=$(part_limit 400)
  TAIL=30 run_part bench "$lim" kernel_bench_console.log env BENCH_TIMEOUT="$((lim - 15))" \
    bash bench/run_gpu.sh kernel --methods "$M" --graph-methods "$M" --shapes 4096x151936,8192x128256 \
    --batches "$B78" --reps "${REPS:-20}" --repeats 1 --warmup 5 || rc=1
fi
if wants tests; then
  # V78_TESTS: another selection (pytest arguments), e.g. the short-tile test alone
  eval "sel=(${V78_TESTS:-tests/ops/test_fused_ws_gpu.py tests/test_gpu_serving.py})"
  TAIL=6 run_part tests "$(part_limit 400)" v78_gpu_tests.log python3 -m pytest -q -p no:warnings "${sel[@]}" || rc=1
fi
exit $rc
