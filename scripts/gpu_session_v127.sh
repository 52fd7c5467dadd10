#!/usr/bin/env bash
# One device call on one GPU for v127 (docs/performance.md): the noise-skip rules' A/B again, interleaved
# (bench/filter_probe.py --interleave: every graph captured first, then timed in turns, each round's on / off ratio),
# because v126 found the lent H100 drifting 2-5% between blocks, more than the effects v123-v125 measured. Parts
# (PARTS, default "plain filtered large"), each cut at what is left of $CALL_BUDGET s (default 560):
#   plain     plain calls, every call asking for the skip's code ("skipall") against none ("noskip"): the shipped
#             plain-call rule (v125, B >= 256) and B = 192 below it; D = 4096 and 8192, B = $BPLAIN (192,256,512,1024)
#   filtered  top-k + top-p calls (every row restricted, and "mixed": every 8th row unfiltered), the shipped skip
#             ("skip", v123) against none ("noskip"); D = 4096 and 8192, B = $BFILT (256,1024)
#   large     issue 14's large batches against cuBLAS (bench/kernel_bench.py, B = 96,256,512,1024, both shapes) with
#             --graph-rounds 20: fsdist / cuBLAS round by round beside the block medians
# ROUNDS (default 40) rounds of 5 replays a graph. PLAIN_LIMIT / FILTERED_LIMIT / LARGE_LIMIT (s) cap the parts
# (240, 240, 200).
# JSONs in $OUT, logs in $OUT/v127_logs.tgz.
# Usage: export OUT; bash scripts/gpu_session_v127.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh
pack_on_exit v127
PARTS="${PARTS:-plain filtered large}"
ROUNDS="${ROUNDS:-40}"
rc=0
for shape in 4096x151936 8192x128256; do
  if wants plain; then
    TAIL=8 run_part "plain_${shape%%x*}" "$(part_limit "$(( ${PLAIN_LIMIT:-240} / 2 ))")" "v127_plain_${shape%%x*}.log" \
      python3 bench/filter_probe.py --shape "$shape" --batches "${BPLAIN:-192,256,512,1024}" --only graph --caps 0 \
      --pdl noskip,skipall --graph-cases plain --interleave "$ROUNDS" || rc=1
  fi
  if wants filtered; then
    TAIL=8 run_part "filtered_${shape%%x*}" "$(part_limit "$(( ${FILTERED_LIMIT:-240} / 2 ))")" \
      "v127_filtered_${shape%%x*}.log" python3 bench/filter_probe.py --shape "$shape" --batches "${BFILT:-256,1024}" \
      --only graph --caps 0 --pdl noskip,skip --graph-cases "plain,k50+p0.9,k50+p0.9 mixed" \
      --interleave "$ROUNDS" || rc=1
  fi
done
if wants large; then
  LARGE_ROUNDS="${LARGE_ROUNDS:-20}" LARGE_BATCHES="${LARGE_BATCHES:-96,256,512,1024}" large_batches_bench || rc=1
fi
exit $rc
