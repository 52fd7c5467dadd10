#!/usr/bin/env bash
# One device call on one GPU (an H200 wanted) for v65 (docs/performance.md): is v57 / v58's loss of the
# warp-specialised 64-row tile at B = 17-32 the half out-of-bounds TMA box of the hidden (v35's slow zero fill)?
# bench/filter_probe.py --only graph (plain / top-k 50 + top-p 0.9 / min-p 0.05; CUDA-graph replays, L2 flushed, [B]
# parameters) with --pad-tile-rows 64 (a partly empty 64-row tile reads a zero-padded copy of the hidden), the shipped
# tile against 64x128x64w8s5t-ws, at B = $V65_BATCHES (default 16,24,32) for D = 4096 and B = 32 for D = 8192, and
# whether both give the same tokens; then the per-kernel device times of the shipped calls at B = 32 / 64
# (--only kernels: stage 1 against select_filtered), and the stagger / pipeline-depth bit-for-bit GPU test.
# JSONs and logs in $OUT.
# Usage: export OUT; bash scripts/gpu_session_v65.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh
WS=64x128x64w8s5t-ws
cases="plain,k50+p0.9,min_p0.05,plain $WS,k50+p0.9 $WS,min_p0.05 $WS"
rc=0
TAIL=8 run_part "probe 4096" "${PROBE_TIMEOUT:-200}" v65_probe_4096.log python3 bench/filter_probe.py --only graph \
  --shape 4096x151936 --batches "${V65_BATCHES:-16,24,32}" --caps 0 --configs "$WS" --graph-cases "$cases" \
  --pad-tile-rows 64 || rc=1
TAIL=6 run_part "probe 8192" "${PROBE_TIMEOUT:-120}" v65_probe_8192.log python3 bench/filter_probe.py --only graph \
  --shape 8192x128256 --batches 32 --caps 0 --configs "$WS" --graph-cases "$cases" --pad-tile-rows 64 || rc=1
TAIL=8 run_part "kernels" "${KERNELS_TIMEOUT:-120}" v65_kernels.log python3 bench/filter_probe.py --only kernels \
  --shape 4096x151936 --batches 32,64 || rc=1
TAIL=4 run_part "stagger / depth test" "${TEST_TIMEOUT:-200}" v65_stagger_test.log python3 -m pytest -v \
  -p no:cacheprovider tests/ops/test_sample_gpu.py -k first_wave_stagger || rc=1
exit $rc
