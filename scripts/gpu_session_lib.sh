# Sourced, after `cd` to the repository root, by the one-call GPU session scripts (gpu_session*.sh,
# gpu_tests_parallel.sh): the safe environment (gpu_env.sh), $OUT (default bench/results) created, the GPU,
# driver and versions printed first (so every log says what it ran on), $start for elapsed times, and
#   wants PART                      true when PART is one of the words of $PARTS
#   carried_wheels                  installs the wheels a call carried in .whl/ (e.g. nvshmem4py for the nvshmem
#                                   cases; carry=[".whl"]) into /tmp/site and puts it on PYTHONPATH; none: nothing
#   pack_on_exit NAME               for calls that bring back few files: logs go to $OUT/NAME_work (OUT is moved
#                                   there), and on exit the JSONs are copied to the caller's $OUT and the logs
#                                   packed into $OUT/NAME_logs.tgz
#   run_part NAME SECONDS LOG CMD.. CMD under a hard timeout, output to $OUT/LOG; prints NAME's exit status,
#                                   the elapsed time and the log's last $TAIL lines (default 15)
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
  tar czf "$PACK_FINAL/${PACK_NAME}_logs.tgz" -C "$OUT" $(cd "$OUT" && ls *.log 2>/dev/null) 2>/dev/null
  rm -rf "$OUT"
}

carried_wheels() {
  if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      && export PYTHONPATH="$PYTHONPATH:/tmp/site" || echo "warning: installing the carried wheels failed" >&2
  fi
}
