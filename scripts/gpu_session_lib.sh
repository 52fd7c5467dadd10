# Sourced, after `cd` to the repository root, by the one-call GPU session scripts (gpu_session*.sh,
# gpu_tests_parallel.sh): the safe environment (gpu_env.sh), $OUT (default bench/results) created, the GPU,
# driver and versions printed first (so every log says what it ran on), $start for elapsed times, and
#   wants PART                      true when PART is one of the words of $PARTS
#   carried_wheels                  installs the wheels a call carried in .whl/ (e.g. nvshmem4py for the nvshmem
#                                   cases; carry=[".whl"]) into /tmp/site and puts it on PYTHONPATH; none: nothing
#   pack_on_exit NAME               for calls that bring back few files: logs go to $OUT/NAME_work (OUT is moved
#                                   there), and on exit the JSONs are copied to the caller's $OUT and the logs
#                                   (and CSVs, e.g. ncu's, and packed test logs) packed into $OUT/NAME_logs.tgz
#   run_part NAME SECONDS LOG CMD.. CMD under a hard timeout, output to $OUT/LOG; prints NAME's exit status,
#                                   the elapsed time and the log's last $TAIL lines (default 15)
#   ncu_select NAME                 Nsight Compute on select_filtered_kernel (v51 / v52), reports named NAME_*
#   filter_gpu_tests [GROUP..]      the filter kernels' GPU tests in five parallel groups (v54 / v55), $TESTS_TIMEOUT s,
#                                   and each GROUP (pytest arguments) beside them
#   ab_runs NAME CMD..              an A/B/A of CMD: in ab_base/ (the code before, carried), here, in ab_base/ again, each
#                                   under $AB_TIMEOUT s (default 130), logs NAME_ab_{before,after,before2}.log
#   part_for_gpu ON_H200 OTHERWISE  the part a one-call script runs on the GPU that came ($FORCE wins)
#   tests_in_the_time_left GROUP..  gpu_tests_parallel.sh cut at what is left of $CALL_BUDGET s
#   part_limit SECONDS              SECONDS, or what is left of the call's $CALL_BUDGET s (default $CALL_BUDGET_DEFAULT,
#                                   else 560) if less, at least 10: a part's timeout
#   large_batches_bench             issue 14's large batches (kernel_bench.py, B = 96-1024, both shapes) in one part
start=$SECONDS  # first: callers budget their parts against the whole call
source scripts/gpu_env.sh
OUT="${OUT:-bench/results}"
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi (no GPU)"
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, flush=True)'

wants() { [[ " ${PARTS:-} " == *" $1 "* ]]; }

run_part() {
  local name=$1 limit=$2 log=$3
  shift 3
  timeout -k 10 "$limit" "$@" > "$OUT/$log" 2>&1
  local rc=$?
  echo "$name rc=$rc after $((SECONDS - start))s"
  tail -"${TAIL:-15}" "$OUT/$log"
  return $rc
}

pack_on_exit() {
  PACK_FINAL="$OUT" PACK_NAME="$1"
  export OUT="$PACK_FINAL/${1}_work"
  mkdir -p "$OUT"
  trap _pack EXIT
}

_pack() {
  cp "$OUT"/*.json "$PACK_FINAL"/ 2>/dev/null
  tar czf "$PACK_FINAL/${PACK_NAME}_logs.tgz" -C "$OUT" $(cd "$OUT" && ls *.log *.csv *.tgz 2>/dev/null) 2>/dev/null
  rm -rf "$OUT"
}

carried_wheels() {
  if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      && export PYTHONPATH="$PYTHONPATH:/tmp/site" || echo "warning: installing the carried wheels failed" >&2
  fi
}

# ncu_select NAME: Nsight Compute on select_filtered_kernel alone (bench/filter_profile.py's profiled round, B = 1 and
# 64, top-k + top-p and min-p): warp states, launch and source counters in $OUT/NAME_ncu_details.log, and the
# per-SASS-instruction stall samples and executed instructions (to map onto source lines with a local compile's
# `nvdisasm -gi`, as v51 did) gzipped into ${FINAL_OUT:-$OUT}/NAME_ncu_select_sass.csv.gz. Returns ncu's status.
ncu_select() {
  local name=$1 rep="$OUT/$1_select" rc=0
  ncu --version | tail -1
  TAIL=4 run_part ncu "${NCU_TIMEOUT:-200}" "${name}_ncu.log" ncu --clock-control none --nvtx \
    --nvtx-include "regex:profiled:.*/" --kernel-name "regex:select_filtered" --import-source yes \
    --section WarpStateStats --section SourceCounters --section LaunchStats --section Occupancy \
    --section SpeedOfLight -o "$rep" -f python3 bench/filter_profile.py --batches 1,64 --cases topkp,minp || rc=1
  if [ -f "$rep.ncu-rep" ]; then
    ncu -i "$rep.ncu-rep" --page details --print-units base > "$OUT/${name}_ncu_details.log" 2>&1
    ncu -i "$rep.ncu-rep" --page source --csv --print-source sass | gzip -c \
      > "${FINAL_OUT:-$OUT}/${name}_ncu_select_sass.csv.gz"
    grep -E "profiled:|Duration|Warp Cycles Per Issued|Registers Per" "$OUT/${name}_ncu_details.log" | head -20
  fi
  return $rc
}

# ab_runs NAME CMD..: the code before (ab_base/, a whole tree: bench/common.py puts its own root first on sys.path),
# this tree's, the code before again, one after the other on the same GPU; prints the lines with "graph_us" last.
# Returns 1 if any run failed.
ab_runs() {
  local name=$1 rc=0 base=0
  shift
  OUT="$(cd "$OUT" && pwd)"  # absolute: the "before" runs work from ab_base/
  [ -d ab_base/fsdist ] && [ -d ab_base/bench ] && base=1
  if [ "$base" = 1 ]; then
    (cd ab_base && TAIL=4 run_part ab_before "${AB_TIMEOUT:-130}" "${name}_ab_before.log" "$@") || rc=1
  else
    echo "no ab_base/ tree carried: the 'before' runs are skipped"
  fi
  TAIL=4 run_part ab_after "${AB_TIMEOUT:-130}" "${name}_ab_after.log" "$@" || rc=1
  if [ "$base" = 1 ]; then
    (cd ab_base && TAIL=4 run_part ab_before2 "${AB_TIMEOUT:-130}" "${name}_ab_before2.log" "$@") || rc=1
  fi
  grep -h "graph_us" "$OUT"/"${name}"_ab_*.log
  return $rc
}

# filter_gpu_tests: the GPU tests of the filtered path, five pytest processes side by side (gpu_tests_parallel.sh), each
# cut at $TESTS_TIMEOUT s (default 300): the warp-specialised tile against the Triton tile and the plain GPU sampling
# tests, the kept-logit and select suites, the fallback and min-p winners, the serving tests (10^6-sample
# chi-squared at V = 151936, graphs, no sync, memory), test_filters' real-vocabulary cases; each argument is one more
# group (pytest arguments), run beside them.
filter_gpu_tests() {
  TESTS_TIMEOUT="${TESTS_TIMEOUT:-300}" bash scripts/gpu_tests_parallel.sh \
    "tests/ops/test_fused_ws_gpu.py -k 'writes_the_triton or filtered_calls'" "tests/ops/test_sample_gpu.py" \
    "tests/ops/test_kept_logits.py tests/ops/test_select_filtered.py" \
    "tests/ops/test_fallback.py tests/ops/test_min_p_winners.py" \
    "tests/test_gpu_serving.py" \
    "tests/test_filters.py -k 'same_token or chi_squared or flat or mirror'" "$@"
}

# part_for_gpu ON_H200 OTHERWISE: prints $FORCE if set, else ON_H200 on an H200 and OTHERWISE on any other GPU (the
# one-call scripts that do one thing on an H200 and another on an H100), after a line naming the GPU and the part.
part_for_gpu() {
  local gpu part
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
  part="${FORCE:-$([[ "$gpu" == *H200* ]] && echo "$1" || echo "$2")}"
  echo "GPU: $gpu -> part: $part" >&2
  echo "$part"
}

# tests_in_the_time_left GROUP..: gpu_tests_parallel.sh with the given groups, each cut at what is left of the call's
# $CALL_BUDGET s (counted from $start); skipped (status 0) when a minute or less is left.
tests_in_the_time_left() {
  local left=$(( ${CALL_BUDGET:-560} - (SECONDS - start) ))
  echo "tests get ${left}s"
  (( left > 60 )) || return 0
  TESTS_TIMEOUT=$left bash scripts/gpu_tests_parallel.sh "$@"
}

# part_limit SECONDS: a part's timeout, SECONDS or what is left of the call's budget if less (at least 10 s).
part_limit() {
  local left=$(( ${CALL_BUDGET:-${CALL_BUDGET_DEFAULT:-560}} - (SECONDS - start) ))
  echo $(( left < $1 ? (left > 10 ? left : 10) : $1 ))
}

# large_batches_bench: issue 14's large batches (bench/kernel_bench.py, both shapes, B = 96-1024, cuBLAS / fsdist /
# compiled Gumbel-max, eager and graph replays), cut at what is left of the call's budget (at most 200 s); console
# in $OUT/kernel_bench_large_console.log (v84, v85). LARGE_BATCHES, LARGE_REPS, LARGE_REPEATS, LARGE_LIMIT (s) and
# LARGE_LOG change the batches, calls a run, runs a cell, the cap and the console's name (v108: every B of the issue);
# LARGE_ROUNDS > 0 times the graph methods in turns, that many rounds, fsdist / cuBLAS round by round (v127).
large_batches_bench() {
  local m=cublas,fsdist,gumbel_compiled lim
  lim=$(part_limit "${LARGE_LIMIT:-200}")
  # (the bench stops itself 15 s before the part's hard timeout, at least 10 s in)
  TAIL=${TAIL:-30} run_part large "$lim" "${LARGE_LOG:-kernel_bench_large_console.log}" \
    env BENCH_TIMEOUT="$((lim > 25 ? lim - 15 : 10))" \
    bash bench/run_gpu.sh kernel --methods "$m" --graph-methods "$m" --shapes 4096x151936,8192x128256 \
    --batches "${LARGE_BATCHES:-96,192,384,512,768,1024}" --reps "${LARGE_REPS:-20}" --repeats "${LARGE_REPEATS:-1}" \
    --warmup 5 --graph-rounds "${LARGE_ROUNDS:-0}"
}
