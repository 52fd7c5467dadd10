#!/usr/bin/env bash
# One device call on one GPU for v58 (docs/performance.md), decided by the GPU that came:
#   an H200: first v57's probe (bench/filter_probe.py --only graph at B = $V57_BATCHES, default 24,32, D = 4096 and
#            8192: the shipped 32-row Triton tile against 64x128x64w8s5t-ws, plain / top-k 50 + top-p 0.9 / min-p
#            0.05, CUDA-graph replays, L2 flushed, [B] parameters), timed alone on the GPU
#   then, on any GPU: the GPU tests that no call has run since the stagger became the default, in parallel groups
#            cut at the call's remaining time: the stagger's bit-for-bit test, the filtered calls' CUDA-graph capture,
#            peak-memory and no-sync tests, and the processors' graph and no-sync tests
# FORCE=probe or FORCE=tests picks the parts whatever the GPU. JSONs and logs in $OUT.
# Usage: export OUT; bash scripts/gpu_session_v58.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh
OUT="$(cd "$OUT" && pwd)"
part=$(part_for_gpu probe tests)
rc=0
if [ "$part" = probe ]; then
  WS=64x128x64w8s5t-ws
  cases="plain,k50+p0.9,min_p0.05,plain $WS,k50+p0.9 $WS,min_p0.05 $WS"
  for shape in 4096x151936 8192x128256; do
    TAIL=6 run_part "probe $shape" "${PROBE_TIMEOUT:-170}" "v58_probe_$shape.log" python3 bench/filter_probe.py \
      --only graph --shape "$shape" --batches "${V57_BATCHES:-24,32}" --caps 0 --configs "$WS" --graph-cases "$cases" \
      || rc=1
  done
fi
tests_in_the_time_left \
  "tests/ops/test_sample_gpu.py -k first_wave_stagger" \
  "tests/test_gpu_serving.py -k 'memory or cuda_graph'" \
  "tests/test_gpu_serving.py -k 'never_synchronises'" \
  "tests/test_processors_gpu.py -k 'cuda_graph or never_synchronise'" || rc=1
exit $rc
