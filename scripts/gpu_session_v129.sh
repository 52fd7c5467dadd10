#!/usr/bin/env bash
# One device call on any single GPU: the rest of the fifty-second session's whole-suite GPU regression
# (docs/performance.md, v129). That run (one H100, JOBS=12 SPLIT=tests: the single-GPU suite, tests/ but
# tests/tensor_parallel, in 12 blocks of 121-122 tests side by side, 420 s each; block k is --shard k-1/12) passed
# seven blocks; block 9 reported 12 failed tests whose log did not come back (the tool returns 8 files); blocks 2, 3,
# 7 and 12 were cut by the time limit. Parts, each in parallel pytest processes on the one GPU, each failure's
# traceback written to its log as it happens (gpu_tests_parallel.sh):
#   p9   block 9's test files, whole (a superset of its tests that does not move when tests are added elsewhere), in
#        four groups: test_prepare_processors + test_processors_halves + test_processors_search, test_sample_gpu,
#        test_sample_logits, test_skip_noise; $P9_LIMIT s (default 240: test_skip_noise alone took 154 s)
#   cut  blocks 2, 3, 7 and 12 as two halves each (--shard 2/24 + 3/24 = 1/12, 4/24 + 5/24, 12/24 + 13/24,
#        22/24 + 23/24; the suite has gained 5 tests since, which moves the edges by at most 5 tests, into blocks that
#        passed), in what is left of $CALL_BUDGET s (default 560), at most $CUT_LIMIT s; some halves may be cut again
# PARTS picks the parts (default "p9 cut"). Logs: $OUT/v129_<part>_logs.tgz; each group's summary on stdout.
# Usage: export OUT; bash scripts/gpu_session_v129.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh
PARTS="${PARTS:-p9 cut}"
rc=0
SUITE="tests --ignore=tests/tensor_parallel"

# groups PART LIMIT GROUP..: the pytest groups side by side, cut at LIMIT s, their logs packed into
# $OUT/v129_PART_logs.tgz (GPU_TESTS_PACK=0: one pack, not a pack inside a pack)
groups() {
  local part=$1 limit=$2 dir="$OUT/v129_$1" r=0
  shift 2
  mkdir -p "$dir"
  echo "== $part: $# groups, ${limit}s =="
  OUT="$dir" TESTS_TIMEOUT="$limit" GPU_TESTS_PACK=0 bash scripts/gpu_tests_parallel.sh "$@" || r=1
  tar czf "$OUT/v129_${part}_logs.tgz" -C "$dir" . && rm -rf "$dir"
  return $r
}

if wants p9; then
  groups p9 "$(part_limit "${P9_LIMIT:-240}")" \
    "tests/ops/test_prepare_processors.py tests/ops/test_processors_halves.py tests/ops/test_processors_search.py" \
    tests/ops/test_sample_gpu.py tests/ops/test_sample_logits.py tests/ops/test_skip_noise.py || rc=1
fi
if wants cut; then
  halves=()
  for s in 2/24 3/24 4/24 5/24 12/24 13/24 22/24 23/24; do halves+=("$SUITE --shard $s"); done
  groups cut "$(part_limit "${CUT_LIMIT:-560}")" "${halves[@]}" || rc=1
fi
exit $rc
