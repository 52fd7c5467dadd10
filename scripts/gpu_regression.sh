#!/usr/bin/env bash
# The single-process test suite on one GPU (every file under tests/ but tests/tensor_parallel, GPU-marked or not: the
# unmarked ones run their kernels on CUDA there), split into $SHARDS (default 10) contiguous blocks of the collection
# order (`pytest --shard I/N`, tests/sharding.py) run side by side by gpu_tests_parallel.sh, each under
# $TESTS_TIMEOUT s (default 420). tests/tensor_parallel is left out: its multi-rank logic runs on CPU ranks in CI
# (mpirun) and its GPU tests need two GPUs. Blocks are cut by test count, not time: the long compile-bound files
# (LONGEST_FIRST in tests/conftest.py, then test_fused_ws_gpu.py) fill their blocks alone.
# Prints each block's exit status and summary line (a block without one: its status says why, 124 / 137 = timeout,
# and its last started test), then the totals of the blocks that finished.
# Usage: export OUT; bash scripts/gpu_regression.sh        (logs in $OUT/regression_logs.tgz)
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh
pack_on_exit regression
SHARDS="${SHARDS:-10}"
groups=()
for ((i = 0; i < SHARDS; i++)); do
  groups+=("tests --ignore=tests/tensor_parallel --shard $i/$SHARDS")
done
TESTS_TIMEOUT="${TESTS_TIMEOUT:-420}" bash scripts/gpu_tests_parallel.sh "${groups[@]}"
rc=$?
for log in "$OUT"/gpu_tests_group*.log; do
  if ! grep -q -E '^=+ .* in [0-9.]+s' "$log"; then
    echo "$(basename "$log"): no summary line; last test line: $(grep -E '::.*(PASSED|FAILED|ERROR|SKIPPED)' "$log" \
      | tail -1 | cut -c1-160); its tests passed / failed before: $(grep -c ' PASSED' "$log") / $(grep -c ' FAILED' "$log")"
  fi
done
# Totals over the blocks' summary lines ("==== 3 failed, 140 passed, 2 skipped, 5 deselected in 300.12s ===="):
# "deselected" left out (each block deselects the others' tests).
cat "$OUT"/gpu_tests_group*.log | grep -E '^=+ .* in [0-9.]+s' | python3 -c '
import re, sys
tot = {}
for line in sys.stdin:
    for n, what in re.findall(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed)\b", line):
        what = "errors" if what.startswith("error") else what
        tot[what] = tot.get(what, 0) + int(n)
print("totals over the blocks that finished:", ", ".join(f"{v} {k}" for k, v in sorted(tot.items())) or "none")'
exit $rc
