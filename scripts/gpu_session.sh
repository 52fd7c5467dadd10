#!/usr/bin/env bash
# One device call for this round of work: the serving-case GPU tests, then the kernel benchmark
# (plain and filtered fsdist with [B] parameters against the baselines), each with a deadline.
# Logs and JSONs go to $OUT. Usage: bash scripts/gpu_session.sh [seconds for the tests] [for the bench]
set -uo pipefail
cd "$(dirname "$0")/.."
export NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT="${OUT:-bench/results}"
t_tests="${1:-240}"; t_bench="${2:-300}"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout -s INT -k 20 "$t_tests" python3 -m pytest -q -p no:warnings -p no:cacheprovider -rfE --durations=15 \
  tests/test_gpu_serving.py tests/test_filters.py > "$OUT/gpu_serving_tests.log" 2>&1
echo "serving tests rc=$?"; grep -E " passed| failed|^FAILED|^ERROR" "$OUT/gpu_serving_tests.log" | tail -12
BENCH_TIMEOUT="$t_bench" bash bench/run_gpu.sh kernel --quick \
  --methods cublas,fsdist,fsdist_scalar,fsdist_topk_topp,fsdist_minp,gumbel_compiled,torch_topk_topp_compiled,torch_minp_compiled \
  --graph-methods none > "$OUT/kernel_bench_console.log" 2>&1
echo "bench rc=$?"; tail -45 "$OUT/kernel_bench_console.log"
