#!/usr/bin/env bash
# One device call for issue 14 (docs/performance.md, v89): Nsight Compute's per-SASS-instruction stall samples of
# the warp-specialised stage 1, greedy against noise (bench/ws_profile.py's profiled round), to see where the noise
# slows the MMA warpgroup's main loop: its wgmma loop's instructions waiting for instruction fetch (the epilogue's
# code crowding the instruction caches), for a pipe, or for the wgmmas themselves. Details in $OUT/v89_ncu_details.log,
# the per-instruction samples gzipped in $OUT/v89_ws_sass.csv.gz (bench/sass_stalls.py reads them).
# WAIT_PROBE=1 (v109): the ws launches also carry launch_fused_ws's wait probe, and the log ends with its shares of the
# profiled launch (bench/ws_profile.py --wait-probe), to set beside the samples of the same launch
# (bench/sass_stalls.py --segments).
# Usage: OUT=... [SHAPE=4096x151936] [BATCHES=1024] [CASES=greedy,noise] [WAIT_PROBE=1]
#   bash scripts/gpu_profile_ws_sass.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh
OUT="${OUT:-bench/results}"
mkdir -p "$OUT"
ncu --version | tail -1
rep="$OUT/v89_ws"
start=$SECONDS
timeout -k 10 "${PROFILE_TIMEOUT:-400}" ncu --clock-control none --nvtx --nvtx-include "regex:profiled:.*/" \
  --kernel-name "regex:fused_sample_ws" --import-source yes --section WarpStateStats --section SourceCounters \
  --section SpeedOfLight --section InstructionStats -o "$rep" -f \
  python3 bench/ws_profile.py --shape "${SHAPE:-4096x151936}" --batches "${BATCHES:-1024}" \
  --cases "${CASES:-greedy,noise}" ${WAIT_PROBE:+--wait-probe} > "$OUT/v89_ncu.log" 2>&1
rc=$?
echo "ncu rc=$rc after $((SECONDS - start))s"
tail -5 "$OUT/v89_ncu.log"
grep "^wait probe" "$OUT/v89_ncu.log"
if [ -f "$rep.ncu-rep" ]; then
  ncu -i "$rep.ncu-rep" --page details --print-units base > "$OUT/v89_ncu_details.log" 2>&1
  ncu -i "$rep.ncu-rep" --page source --csv --print-source sass | gzip -c > "$OUT/v89_ws_sass.csv.gz"
  rm -f "$rep.ncu-rep"
  grep -E "profiled:|Duration|Warp Cycles Per Issued|Issue Slots Busy|No Instruction|[Ss]tall" \
    "$OUT/v89_ncu_details.log" | head -40
fi
exit "$rc"
