#!/usr/bin/env bash
# One device call for this round of work (logit processors, issue 12): the GPU tests of the
# processors and of the serving case, then the processors kernel benchmark on both shapes
# (D=4096 V=151936 and D=8192 V=128256, B = 1, 4, 16, 64, 256), each bounded so that the whole
# call ends within the device tool's 600 s. Logs and JSONs go to $OUT:
#   gpu_tests.log           pytest -rfE --durations: tests/test_processors_gpu.py, the processors ops tests,
#                           tests/test_gpu_serving.py, tests/test_processors.py (on CUDA)
#   kernel_bench_console.log, kernel_bench.log, kernel_bench_<gpu>_<date>.json
# Usage: bash scripts/gpu_session.sh [seconds for the whole call, 560] [of which for the tests, 220]
# PARTS=tests or PARTS=bench runs one half only: together they need ~300 s + ~280 s on an H200
# (2026-11-23), more than one device call allows, so give each half its own call (PARTS=tests
# defaults the tests' limit to 330 s).
# BENCH_EXTRA="..." appends kernel_bench.py options (later ones win), e.g. for a CPU smoke run:
#   OUT=/tmp/s BENCH_EXTRA="--shapes 64x1000 --batches 2 --reps 2 --warmup 1" bash scripts/gpu_session.sh 400 60
# The benchmark alone: see the kernel_bench.py docstring (--methods processors).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh  # env, $OUT, GPU and versions printed, $start, wants, run_part
PARTS="${PARTS:-all}"
# The tests alone get the ~330 s they need; with the benchmark they share the call (see above).
t_total="${1:-560}"; t_tests="${2:-$([ "$PARTS" = tests ] && echo 330 || echo 220)}"
if [ "$PARTS" != bench ]; then
# SIGINT first: pytest stops and still prints its summary of what ran.
timeout -s INT -k 20 "$t_tests" python3 -m pytest -q -p no:warnings -p no:cacheprovider -rfE --durations=25 \
  tests/test_processors_gpu.py tests/test_gpu_serving.py tests/test_processors.py tests/ops/test_apply_entries.py \
  tests/ops/test_prepare_processors.py > "$OUT/gpu_tests.log" 2>&1
echo "tests rc=$? after $((SECONDS - start))s"
grep -E " passed| failed| error|^FAILED|^ERROR" "$OUT/gpu_tests.log" | tail -15
fi
[ "$PARTS" = tests ] && exit 0
left=$((t_total - (SECONDS - start)))
if [ "$left" -lt 120 ]; then
  echo "only ${left}s left: no benchmark"; exit 1
fi
echo "benchmark: ${left}s"
BENCH_TIMEOUT="$left" bash bench/run_gpu.sh kernel --methods processors \
  --shapes 4096x151936,8192x128256 --batches 1,4,16,64,256 --reps 40 --repeats 1 --warmup 10 \
  --graph-methods fsdist,fsdist_bitmask,fsdist_bias_pen,fsdist_processors_all ${BENCH_EXTRA:-} \
  > "$OUT/kernel_bench_console.log" 2>&1
echo "bench rc=$?"; tail -62 "$OUT/kernel_bench_console.log"
