#!/usr/bin/env bash
# One device call on one GPU (nvidia-h200 preferred; carry ["ab_base"]) for v51 (docs/performance.md): fsdist.sample's
# filtered calls fold stage 2's merge into select_filtered (one launch less a call), and where select_filtered's one
# program per row spends its time.
#   tests: the fold's GPU checks first: tests/ops/test_select_filtered.py (fold = merge then select, every mode),
#          tests/test_gpu_serving.py (10^6-sample chi-squared at V = 151936, graph capture, no sync, memory)
#   ab:    bench/filter_probe.py --only graph (plain, top-k 50 + top-p 0.9, min-p 0.05, bias + penalties as CUDA-graph
#          replays, L2 flushed, [B] parameters), B = $V51_BATCHES (default 1,16,64), D = 4096: first the code before
#          (ab_base/: git archive <parent> fsdist bench launch scripts, bench/results excluded), then this tree's,
#          then the code before again (drift check), same GPU
#   ncu:   Nsight Compute on select_filtered_kernel alone (bench/filter_profile.py's profiled round, B = 1 and 64,
#          top-k + top-p and min-p): warp states and source counters, and the per-source-line stall samples
#   PARTS (default "tests ab ncu"); logs in $OUT/v51_logs.tgz, JSONs and the ncu line table in $OUT.
# Usage: export OUT; bash scripts/gpu_session_v51.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh
OUT="$(cd "$OUT" && pwd)"  # absolute: the "before" runs work from ab_base/
FINAL_OUT="$OUT"
pack_on_exit v51
PARTS="${PARTS:-tests ab ncu}"
rc=0
if wants tests; then
  TAIL=8 run_part tests "${TESTS_TIMEOUT:-240}" v51_tests.log python3 -m pytest -q -x -p no:warnings \
    -p no:cacheprovider -rfE tests/ops/test_select_filtered.py tests/test_gpu_serving.py || rc=1
fi
PROBE=(bench/filter_probe.py --only graph --batches "${V51_BATCHES:-1,16,64}" --caps 0)
if wants ab; then
  if [ -d ab_base/fsdist ] && [ -d ab_base/bench ]; then
    (cd ab_base && TAIL=5 run_part ab_before "${AB_TIMEOUT:-130}" v51_ab_before.log python3 "${PROBE[@]}") \
      || rc=1
  else
    echo "no ab_base/ tree carried: the 'before' runs are skipped"
  fi
  TAIL=5 run_part ab_after "${AB_TIMEOUT:-130}" v51_ab_after.log python3 "${PROBE[@]}" || rc=1
  if [ -d ab_base/fsdist ]; then
    (cd ab_base && TAIL=5 run_part ab_before2 "${AB_TIMEOUT:-130}" v51_ab_before2.log python3 "${PROBE[@]}") \
      || rc=1
  fi
  grep -h "graph_us" "$OUT"/v51_ab_*.log
fi
if wants ncu; then
  ncu --version | tail -1
  rep="$OUT/v51_select"
  TAIL=4 run_part ncu "${NCU_TIMEOUT:-200}" v51_ncu.log ncu --clock-control none --nvtx \
    --nvtx-include "regex:profiled:.*/" --kernel-name "regex:select_filtered" --import-source yes \
    --section WarpStateStats --section SourceCounters --section LaunchStats --section Occupancy \
    --section SpeedOfLight -o "$rep" -f python3 bench/filter_profile.py --batches 1,64 --cases topkp,minp || rc=1
  if [ -f "$rep.ncu-rep" ]; then
    ncu -i "$rep.ncu-rep" --page details --print-units base > "$OUT/v51_ncu_details.log" 2>&1
    # per source line (the kernels' Python, from Triton's line info) and per SASS instruction: stall samples
    ncu -i "$rep.ncu-rep" --page source --csv --print-source cuda > "$OUT/v51_ncu_source_lines.log" 2>&1
    ncu -i "$rep.ncu-rep" --page source --csv --print-source sass > "$OUT/v51_ncu_source_sass.log" 2>&1
    gzip -c "$OUT/v51_ncu_source_lines.log" > "$FINAL_OUT/v51_ncu_source_lines.csv.gz"
    grep -E "profiled:|select_filtered|Duration|Warp Cycles Per Issued|No Eligible|Registers Per|Stall|stall" \
      "$OUT/v51_ncu_details.log" | head -60
    head -c 1500 "$OUT/v51_ncu_source_lines.log"
  fi
fi
exit $rc
