#!/usr/bin/env bash
# GPU tests in parallel pytest processes on one GPU: the suites are bound by Triton's compile time on the
# host (one process compiles one kernel at a time), so N processes finish ~N times sooner on a 16-core host.
# Usage: bash scripts/gpu_tests_parallel.sh "<pytest args of group 1>" "<group 2>" ...
#   e.g. bash scripts/gpu_tests_parallel.sh "tests/test_filters.py -k 'top_n or bad_'" tests/test_processors.py
# Each group's log: $OUT/gpu_tests_group<i>.log; a hang fails its group after $TESTS_TIMEOUT s (default 450),
# and faulthandler dumps every thread of a test running past 150 s. Prints each group's summary line (or, for a
# group cut by its timeout, its last test, its counts so far and the tests that failed or errored), then the totals
# of the groups that finished. Each failure's traceback is written to its log as the test fails
# (FSDIST_INSTANT_FAILURES, tests/conftest.py), not only at the end, which a group cut by its timeout never reaches.
# More than 6 groups: the logs are packed into $OUT/gpu_tests_logs.tgz (gpu_tests_logs_2.tgz, ... if taken; the
# device tool brings back at most 8 files a call); GPU_TESTS_PACK=0 leaves them loose (a caller that packs them).
# The GPU's used memory is sampled every 2 s while the groups run (nvidia-smi) and its peak printed after them; the
# samples, $OUT/gpu_tests_memory.csv, go into the pack, or stay for a caller that packs, else are removed.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh
[[ $# -gt 0 ]] || { echo "usage: bash scripts/gpu_tests_parallel.sh \"<pytest args of group 1>\" [\"<group 2>\" ...]"; exit 2; }
export FSDIST_INSTANT_FAILURES=1
# The GPU's used memory (every process's, as nvidia-smi sees it) every 2 s while the groups run: N processes share one
# GPU, and a test that fails only beside the others may have run out of memory (v129). Summarised after the groups;
# the samples come back in the pack (> 6 groups), else only the summary.
mem_csv="$OUT/gpu_tests_memory.csv" mem_pid=""
if command -v nvidia-smi >/dev/null 2>&1; then
  # (stopped on any exit, a caller's timeout killing this script too: no sampler left writing into $OUT; the traps
  # first, so that no TERM finds the sampler started and the traps not yet set)
  trap '[[ -n "$mem_pid" ]] && kill "$mem_pid" 2>/dev/null' EXIT
  trap 'exit 143' TERM
  nvidia-smi --query-gpu=timestamp,index,memory.used,memory.total --format=csv,noheader,nounits -l 2 \
    > "$mem_csv" 2>/dev/null &
  mem_pid=$!
fi
i=0
pids=()
for group in "$@"; do
  i=$((i + 1))
  # (eval: a group may quote a -k expression)
  eval "timeout -k 10 ${TESTS_TIMEOUT:-450} python3 -m pytest -v -p no:warnings -p no:cacheprovider --tb=short \
    -rfE --durations=5 -o faulthandler_timeout=150 $group" > "$OUT/gpu_tests_group$i.log" 2>&1 &
  pids+=($!)
done
# pytest -v's own result lines (anchored: the tracebacks written in between may quote such words), for cut groups
line_of() { echo "^tests/.*::.* ($1) +\[ *[0-9]+%\]\$"; }
result=$(line_of 'PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS') passed=$(line_of PASSED) bad=$(line_of 'FAILED|ERROR')
rc=0
summaries=""  # each finished group's summary line ("==== 3 failed, 140 passed, 5 deselected in 300.12s ====")
for j in "${!pids[@]}"; do
  wait "${pids[$j]}"; r=$?
  [[ $r -ne 0 ]] && rc=$r
  log="$OUT/gpu_tests_group$((j + 1)).log"
  # (ERROR: too, for pytest's own usage errors, e.g. a -k expression it cannot parse)
  echo "group $((j + 1)) rc=$r: $(grep -E '^(FAILED|ERROR)[ :]' "$log" | head -5)"
  summary=$(grep -E '^=+ .* in [0-9.]+s' "$log" | tail -1)
  if [[ -n "$summary" ]]; then
    echo "$summary"
    summaries+="$summary"$'\n'
  else
    # cut by the timeout (rc 124 / 137) or killed: what ran before
    echo "  no summary line; last test line: $(grep -E "$result" "$log" | tail -1 | cut -c1-160)"
    nbad=$(grep -cE "$bad" "$log")
    echo "  passed / failed or errored before it stopped: $(grep -cE "$passed" "$log") / $nbad"
    grep -E "$bad" "$log" | head -15 | sed 's/^/  failed: /' | cut -c1-170
    (( nbad > 15 )) && echo "  ... and $((nbad - 15)) more"
  fi
done
if [[ -n "$mem_pid" ]]; then
  kill "$mem_pid" 2>/dev/null; wait "$mem_pid" 2>/dev/null
  mem_pid=""  # reaped: the EXIT trap has nothing left to kill (its pid may be another process's by then)
  # the fullest sample of any GPU: "timestamp, index, used MiB, total MiB"
  awk -F', *' 'NF >= 4 && $3 ~ /^[0-9]+$/ { n++; if ($3 + 0 >= peak) { peak = $3 + 0; total = $4; at = $1; gpu = $2 } }
    END { if (n) printf "GPU memory used, peak of %d samples (a GPU a line, every 2 s: a lower bound): %d of %d MiB (GPU %s, %s)\n", n, peak, total, gpu, at
          else print "GPU memory used: no samples from nvidia-smi" }' "$mem_csv"
fi
# Totals over those summary lines, "deselected" left out (with --shard each group deselects the others' tests).
printf '%s' "$summaries" | python3 -c '
import re, sys
tot = {}
for line in sys.stdin:
    for n, what in re.findall(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed)\b", line):
        what = "errors" if what.startswith("error") else what
        tot[what] = tot.get(what, 0) + int(n)
print("totals over the groups that finished:", ", ".join(f"{v} {k}" for k, v in sorted(tot.items())) or "none")'
if [[ $# -gt 6 && "${GPU_TESTS_PACK:-1}" != 0 ]]; then
  pack=gpu_tests_logs.tgz n=1
  while [[ -e "$OUT/$pack" ]]; do n=$((n + 1)); pack="gpu_tests_logs_$n.tgz"; done
  (cd "$OUT" && tar czf "$pack" gpu_tests_group*.log $(ls gpu_tests_memory.csv 2>/dev/null) \
    && rm -f gpu_tests_group*.log gpu_tests_memory.csv) && echo "group logs: $OUT/$pack"
fi
# (packed above, or summarised: one file fewer for the device tool's 8; a caller that packs keeps it)
[[ "${GPU_TESTS_PACK:-1}" != 0 ]] && rm -f "$mem_csv"
exit $rc
