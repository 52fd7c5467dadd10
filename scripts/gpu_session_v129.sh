#!/usr/bin/env bash
# One device call on any single GPU: the rest of the fifty-second session's whole-suite GPU regression
# (docs/performance.md, v129). That run (one H100, JOBS=12 SPLIT=tests, 420 s a block, 12 blocks side by side) passed
# seven blocks; block 9 (--shard 8/12) reported 12 failed tests whose log did not come back (the tool returns 8 files);
# blocks 2, 3, 7 and 12 were cut by the time limit. Parts, each in parallel pytest processes on the one GPU with each
# failure's traceback written as it happens (gpu_tests_parallel.sh):
#   p9   block 9 again as four blocks of 48 (--shard 32/48 .. 35/48: the same tests), $P9_LIMIT s (default 200)
#   cut  blocks 2, 3, 7 and 12 (--shard 1, 2, 6, 11 of 12) as two blocks of 24 each, in what is left of $CALL_BUDGET s
#        (default 560)
# PARTS picks the parts (default "p9 cut"). Logs: $OUT/v129_<part>_logs.tgz; each block's summary on stdout.
# Usage: export OUT; bash scripts/gpu_session_v129.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh
PARTS="${PARTS:-p9 cut}"
rc=0
SUITE="tests --ignore=tests/tensor_parallel"

# blocks PART LIMIT SHARD..: the suite's blocks --shard SHARD side by side, cut at LIMIT s, logs packed into
# $OUT/v129_PART_logs.tgz
blocks() {
  local part=$1 limit=$2 groups=() dir="$OUT/v129_$1" r=0
  shift 2
  for s in "$@"; do groups+=("$SUITE --shard $s"); done
  mkdir -p "$dir"
  echo "== $part: ${#groups[@]} blocks, ${limit}s =="
  OUT="$dir" TESTS_TIMEOUT="$limit" bash scripts/gpu_tests_parallel.sh "${groups[@]}" || r=1
  tar czf "$OUT/v129_${part}_logs.tgz" -C "$dir" . && rm -rf "$dir"
  return $r
}

if wants p9; then
  blocks p9 "$(part_limit "${P9_LIMIT:-200}")" 32/48 33/48 34/48 35/48 || rc=1
fi
if wants cut; then
  blocks cut "$(part_limit 600)" 2/24 3/24 4/24 5/24 12/24 13/24 22/24 23/24 || rc=1
fi
exit $rc
