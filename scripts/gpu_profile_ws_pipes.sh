#!/usr/bin/env bash
# One device call for issue 14 (docs/performance.md, v98): Nsight Compute's pipe utilisation of the warp-specialised
# stage 1 (bench/ws_profile.py's profiled round), greedy / the shipped noise / the legacy noise instructions (v97) /
# 7 Philox rounds, to see which SM pipe the noise epilogue loads while the wgmmas slow: every
# sm__pipe_*_cycles_active and sm__inst_executed_pipe_* metric (as % of peak), the issue-slot use and the duration.
# Raw CSV in $OUT/${NAME}_ncu_pipes.csv, ncu's console in $OUT/${NAME}_ncu_raw.log (NAME default v98); prints a table
# of the metrics that differ. METRICS: other metrics instead (ncu --metrics syntax; v99: the memory side). KERNELS:
# the kernels profiled (ncu --kernel-name; default the ws kernel alone; v130 adds cuBLAS's with its "cublas" case).
# Usage: OUT=... [SHAPE=4096x151936] [BATCHES=1024] [CASES=greedy,noise,legacy,rounds7] [METRICS=...] [NAME=v98]
#        [KERNELS=regex:...] bash scripts/gpu_profile_ws_pipes.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh
OUT="${OUT:-bench/results}"
mkdir -p "$OUT"
ncu --version | tail -1
start=$SECONDS
PIPES="regex:^sm__pipe_.*_cycles_active\.avg\.pct_of_peak_sustained_active$,regex:^sm__inst_executed_pipe_.*\.avg\.\
pct_of_peak_sustained_active$,sm__inst_issued.avg.pct_of_peak_sustained_active,\
smsp__issue_active.avg.pct_of_peak_sustained_active,gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second"
timeout -k 10 "${PROFILE_TIMEOUT:-300}" ncu --clock-control none --nvtx --nvtx-include "regex:profiled:.*/" \
  --kernel-name "${KERNELS:-regex:fused_sample_ws}" --csv --page raw \
  --metrics "${METRICS:-$PIPES}" \
  python3 bench/ws_profile.py --shape "${SHAPE:-4096x151936}" --batches "${BATCHES:-1024}" \
  --cases "${CASES:-greedy,noise,legacy,rounds7}" > "$OUT/${NAME:-v98}_ncu_raw.log" 2>&1
rc=$?
echo "ncu rc=$rc after $((SECONDS - start))s"
grep -v '^"' "$OUT/${NAME:-v98}_ncu_raw.log" | tail -8
grep '^"' "$OUT/${NAME:-v98}_ncu_raw.log" > "$OUT/${NAME:-v98}_ncu_pipes.csv"
python3 bench/ncu_table.py "$OUT/${NAME:-v98}_ncu_pipes.csv" || rc=1
exit "$rc"
