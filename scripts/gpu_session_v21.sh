#!/usr/bin/env bash
# One device call for issue 11's filtered-call overhead (docs/performance.md, v21). PARTS, any of:
#   profile  Nsight Compute over whole calls (bench/filter_profile.py): every kernel of a plain, a
#            top-k + top-p and a min-p call per batch size; report in $OUT/filter_profile_ncu.txt
#   probe    bench/filter_probe.py (stage 1 plain / extended, select_filtered, per-kernel device times,
#            CUDA-graph replays), log in $OUT/filter_probe.log, JSON under $OUT
#   tests    the GPU tests of the filters ($TESTS), log in $OUT/gpu_tests.log
#   kernel   the harness's filtered methods (bench/run_gpu.sh kernel)
# The short tables go to stdout last. Usage: PARTS="profile probe" bash scripts/gpu_session_v21.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh  # env, $OUT, GPU and versions printed, $start, wants, run_part
PARTS="${PARTS:-probe}"
if [[ " $PARTS " == *" profile "* ]]; then
  SECTIONS="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section LaunchStats \
    --section Occupancy --section InstructionStats --section MemoryWorkloadAnalysis"
  timeout -k 10 "${PROFILE_TIMEOUT:-240}" ncu --clock-control none --nvtx --nvtx-include "regex:profiled:.*/" \
    $SECTIONS --print-units base --page details \
    python3 bench/filter_profile.py --shape "${PROFILE_SHAPE:-4096x151936}" --batches "${PROFILE_BATCHES:-1,64}" \
    > "$OUT/filter_profile_ncu.txt" 2>&1
  echo "profile rc=$? after $((SECONDS - start))s"
  grep -E "profiled:|^  [a-z_]+.*\(|Duration|Registers Per|Achieved Occupancy|Issue Slots Busy|Warp Cycles Per Issued|\
No Eligible|Executed Instructions  |Theoretical Occupancy|Block Limit Shared|DRAM Throughput|Memory Throughput|\
Compute \(SM\) Throughput|Stall" "$OUT/filter_profile_ncu.txt" | head -120
fi
if [[ " $PARTS " == *" probe "* ]]; then
  timeout -k 10 "${PROBE_TIMEOUT:-240}" python3 bench/filter_probe.py --shape "${PROBE_SHAPE:-4096x151936}" \
    --batches "${PROBE_BATCHES:-1,16,64}" --only "${PROBE_ONLY:-stage1,select,kernels,graph}" ${PROBE_EXTRA:-} \
    > "$OUT/filter_probe.log" 2>&1
  echo "probe rc=$? after $((SECONDS - start))s"; tail -16 "$OUT/filter_probe.log"
fi
if [[ " $PARTS " == *" tests "* ]]; then
  timeout -k 10 "${TESTS_TIMEOUT:-330}" python3 -m pytest -q -p no:warnings -p no:cacheprovider -x --tb=short -rfE \
    --durations=8 ${TESTS:-tests/ops/test_select_filtered.py tests/ops/test_fallback.py tests/test_gpu_serving.py} \
    > "$OUT/gpu_tests.log" 2>&1
  echo "tests rc=$? after $((SECONDS - start))s"; tail -15 "$OUT/gpu_tests.log"
fi
if [[ " $PARTS " == *" kernel "* ]]; then
  BENCH_TIMEOUT="${KERNEL_TIMEOUT:-540}" bash bench/run_gpu.sh kernel \
    --methods cublas,fsdist,fsdist_topk_topp,fsdist_minp,torch_topk_topp_compiled,torch_minp_compiled \
    --graph-methods fsdist,fsdist_topk_topp,fsdist_minp \
    --shapes "${SHAPES:-4096x151936,8192x128256}" --batches "${KERNEL_BATCHES:-1,16,64,256}" \
    --reps "${REPS:-30}" --repeats 1 --warmup 8 ${KERNEL_EXTRA:-} > "$OUT/kernel_bench_console.log" 2>&1
  echo "kernel rc=$? after $((SECONDS - start))s"; tail -60 "$OUT/kernel_bench_console.log"
fi
