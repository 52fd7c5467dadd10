#!/usr/bin/env bash
# One device call on two GPUs (nvidia-h200-x2): the tensor-parallel GPU tests at TP=2 (real
# shapes, every transport; filters and logit processors across ranks; rank divergence), then the
# tensor-parallel sweep at TP=1 and TP=2 in the serving case ([B] device tensors for
# temperature, seed and offset), each bounded so the whole call ends within the tool's 600 s.
# First, on GPU 0 alone, bench/processors_breakdown.py (device time per kernel of a processed call).
# The device tool brings back at most 8 files, so the JSONs land in $OUT and every log in
# $OUT/logs.tgz:
#   tp_gpu_tests_rank<r>.log  each rank's pytest -rfE --durations; tp_gpu_tests_launcher.log torchrun's own
#   tp_sweep_console.log, tp_sweep_tp<N>.log, processors_breakdown.log
#   tp_sweep_tp<N>_<gpu>_<date>.json, processors_breakdown_<gpu>_<date>.json (in $OUT itself)
# Usage: bash scripts/gpu_session_tp.sh [seconds for the whole call, 560] [of which for the tests, 250]
# The default test selection needs ~12 min on 2 GPUs (test_gpu.py + test_divergence.py ~260 s, the filter /
# processor files ~8 min, compile-bound): split it over two calls with TEST_SELECT.
# BREAKDOWN=0 skips the breakdown; WS_TESTS="<pytest args>" runs single-GPU tests on GPU 0 before the TP tests
# (WS_TESTS_TIMEOUT seconds, default 150; the TP tests' budget counts from after them).
# nvshmem needs the nvshmem4py wheel in .whl/ (carry=[".whl"]); bench/run_gpu.sh installs it
# for the sweep, this script for the tests. SWEEP_EXTRA="..." appends tp_sweep.py options; SWEEP_BATCHES="1,16,64,256"
# (default) sets its batches.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh
FINAL="${OUT:-bench/results}"
export OUT="$FINAL/work"
mkdir -p "$OUT"
pack() {  # JSONs next to the archive of the logs; called on every exit
  cp "$OUT"/*.json "$FINAL"/ 2>/dev/null
  tar czf "$FINAL/logs.tgz" -C "$OUT" $(cd "$OUT" && ls *.log 2>/dev/null) 2>/dev/null
  rm -rf "$OUT"
}
trap pack EXIT
t_total="${1:-560}"; t_tests="${2:-250}"
start=$SECONDS
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="$PYTHONPATH:/tmp/site" || echo "warning: wheel install failed" >&2
fi
python3 -c 'import nvshmem.core; print("nvshmem4py importable")' || echo "nvshmem4py NOT importable: nvshmem cases skip"
if [ "${BREAKDOWN:-1}" != 0 ]; then
  CUDA_VISIBLE_DEVICES=0 timeout 120 python3 bench/processors_breakdown.py --out "$OUT" > "$OUT/processors_breakdown.log" 2>&1
  echo "processors_breakdown rc=$?"; tail -20 "$OUT/processors_breakdown.log"
fi
if [ -n "${WS_TESTS:-}" ]; then  # single-GPU tests first, on GPU 0 (e.g. the kernels the heads' stage 1 runs)
  eval "CUDA_VISIBLE_DEVICES=0 timeout -k 10 ${WS_TESTS_TIMEOUT:-150} python3 -m pytest -q -p no:warnings \
    -p no:cacheprovider -rfE --durations=5 $WS_TESTS" > "$OUT/ws_gpu_tests.log" 2>&1
  echo "single-GPU tests rc=$?: $(grep -E ' passed| failed| error' "$OUT/ws_gpu_tests.log" | tail -1)"
  grep -E "^(FAILED|ERROR)" "$OUT/ws_gpu_tests.log" | head -8
fi
# A hang must fail a test, not eat the call: the suite's watchdog kills a test after 120 s.
export FSDIST_TEST_HARD_TIMEOUT=120 FSDIST_TEST_TIMEOUT=90
# Rank 0's and rank 1's pytest logs apart (scripts/rank_pytest.sh), so a rank's failure stays readable.
# TEST_SELECT is parsed as shell words, so a quoted -k expression stays one argument.
eval "select=(${TEST_SELECT:-tests/tensor_parallel/test_gpu.py tests/tensor_parallel/test_divergence.py \
  tests/tensor_parallel/test_filters_tp.py tests/tensor_parallel/test_processors_tp.py})"
TORCHRUN_ARGS=--no-python timeout -s INT -k 20 "$t_tests" launch/torchrun.sh 2 bash scripts/rank_pytest.sh tp_gpu_tests \
  -q -p no:warnings -p no:cacheprovider -rfE --durations=15 "${select[@]}" > "$OUT/tp_gpu_tests_launcher.log" 2>&1
echo "TP tests rc=$? after $((SECONDS - start))s"
for f in "$OUT"/tp_gpu_tests_rank*.log; do echo "== $f"; grep -E " passed| failed| error|^FAILED|^ERROR" "$f" | tail -12; done
left=$((t_total - (SECONDS - start)))
if [ "$left" -lt 150 ]; then
  echo "only ${left}s left: no sweep"; exit 1
fi
echo "sweep: ${left}s"
BENCH_TIMEOUT="$left" bash bench/run_gpu.sh tp "1 2" --shapes 4096x151936,8192x128256 --batches ${SWEEP_BATCHES:-1,16,64,256} \
  --transports nvshmem,symm_mem,collective --reductions candidates --runs 3 --iters 50 --graph ${SWEEP_EXTRA:-} \
  > "$OUT/tp_sweep_console.log" 2>&1
echo "sweep rc=$?"; tail -45 "$OUT/tp_sweep_console.log"
