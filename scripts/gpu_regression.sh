#!/usr/bin/env bash
# The whole single-process test suite on one GPU (every file under tests/, GPU-marked or not: the unmarked ones run
# their kernels on CUDA there), split into $SHARDS (default 8) contiguous blocks (`pytest --shard I/N`,
# tests/sharding.py) run side by side by gpu_tests_parallel.sh, each under $TESTS_TIMEOUT s (default 420): a block
# cut by its timeout says so in its log. The multi-rank sessions (mpirun) and the TP tests that need two GPUs are not
# in it (they skip on one). Prints each block's summary line, then the totals.
# Usage: export OUT; bash scripts/gpu_regression.sh        (logs in $OUT/regression_logs.tgz)
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh
pack_on_exit regression
SHARDS="${SHARDS:-8}"
groups=()
for ((i = 0; i < SHARDS; i++)); do
  groups+=("tests --shard $i/$SHARDS")
done
TESTS_TIMEOUT="${TESTS_TIMEOUT:-420}" bash scripts/gpu_tests_parallel.sh "${groups[@]}"
rc=$?
# Totals over the blocks' summary lines ("= 12 failed, 140 passed, 3 skipped in 300.1s =").
cat "$OUT"/gpu_tests_group*.log | grep -E '^=+ .*(passed|failed|error|skipped).* in [0-9.]+s' | python3 -c '
import re, sys
tot = {}
for line in sys.stdin:
    for n, what in re.findall(r"(\d+) (passed|failed|errors?|skipped|deselected|xfailed|xpassed)", line):
        tot[what] = tot.get(what, 0) + int(n)
print("totals over the blocks that finished:", ", ".join(f"{v} {k}" for k, v in sorted(tot.items())) or "none")'
echo "blocks without a summary line (cut by the timeout): $(grep -L -E '^=+ .* in [0-9.]+s' "$OUT"/gpu_tests_group*.log \
  | xargs -r -n1 basename | tr '\n' ' ')"
exit $rc
