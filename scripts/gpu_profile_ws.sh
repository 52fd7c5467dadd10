#!/usr/bin/env bash
# One device call for issue 14 (docs/performance.md, v19): Nsight Compute on the warp-specialised stage 1
# and cuBLAS (bench/ws_profile.py: one profiled call per case, chosen by NVTX range), to see what the noise
# epilogue competes with (pipe activity, L1/shared-memory and L2 throughput, issue slots, stall reasons)
# and why B = 192 runs slower than B = 256. Text reports under $OUT; the table ncu prints last.
# Usage: OUT=... SHAPE=4096x151936 BATCHES=1024,256,192 [CASES=cublas,greedy,noise] bash scripts/gpu_profile_ws.sh
# (v78's question, DRAM bytes of a short last tile against the padded launch: BATCHES=192 CASES=padded,short)
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh
OUT="${OUT:-bench/results}"
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
ncu --version | tail -1
start=$SECONDS
SECTIONS="--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
  --section WarpStateStats --section SchedulerStats --section LaunchStats --section Occupancy"
timeout -k 10 "${PROFILE_TIMEOUT:-420}" ncu --clock-control none --nvtx --nvtx-include "regex:profiled:.*/" \
  $SECTIONS --print-units base --page details \
  python3 bench/ws_profile.py --shape "${SHAPE:-4096x151936}" --batches "${BATCHES:-1024,256,192}" \
  --cases "${CASES:-cublas,greedy,noise}" > "$OUT/ws_profile_ncu.txt" 2>&1
rc=$?
echo "ncu rc=$rc after $((SECONDS - start))s"
if grep -q "No kernels were profiled" "$OUT/ws_profile_ncu.txt"; then
  # The NVTX filter matched nothing: skip the warm-up round's launches by count instead.
  nb=$(echo "${BATCHES:-1024,256,192}" | tr ',' '\n' | wc -l)
  nc=$(echo "${CASES:-cublas,greedy,noise}" | tr ',' '\n' | wc -l)
  n=$((nb * nc))
  timeout -k 10 "${PROFILE_TIMEOUT:-420}" ncu --clock-control none \
    --kernel-name "regex:fused_sample_ws|nvjet|gemm|xmma|cutlass" --launch-skip "$n" --launch-count "$n" \
    $SECTIONS --print-units base --page details \
    python3 bench/ws_profile.py --shape "${SHAPE:-4096x151936}" --batches "${BATCHES:-1024,256,192}" \
    --cases "${CASES:-cublas,greedy,noise}" > "$OUT/ws_profile_ncu.txt" 2>&1
  rc=$?
  echo "ncu (by launch count) rc=$rc after $((SECONDS - start))s"
fi
# The few lines that answer the question, per profiled kernel (the NVTX range names the case).
grep -E "profiled:|^  [a-z_]+.*\(|Duration|Compute \(SM\) Throughput|Memory Throughput|L1/TEX Hit|L2 Hit|\
DRAM Throughput|Issue Slots Busy|Executed Ipc Active|Shared Memory|Registers Per|Warp Cycles Per Issued|\
No Eligible|Dynamic Shared|Block Limit|highest-utilized|[Ss]tall" "$OUT/ws_profile_ncu.txt" | head -150
exit "$rc"
