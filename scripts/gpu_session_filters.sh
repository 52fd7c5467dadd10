#!/usr/bin/env bash
# One device call for the filtered path (issue 11, v14) and the real-size decode loop (issue 13):
#   1. GPU tests of the packed threshold search, the kept logits, the fp32 stage fit and the
#      filters (tests/ops/test_select_filtered.py, test_kept_logits.py, test_configs.py,
#      tests/test_gpu_serving.py: 10^6-draw chi-squared at V=151936, graphs, no host sync,
#      peak memory; tests/test_filters.py on CUDA)                         -> $OUT/gpu_tests.log
#   2. bench/filter_probe.py: select_filtered per search cap, whole calls as CUDA graphs
#      (filtered with the packed and the full search, plain), B = 1, 16, 64, 256
#                                                    -> $OUT/filter_probe.log, filter_probe_*.json
#   3. examples/generate.py at its real size (Llama-shaped, hidden 4096, V = 128256, fp32 and
#      bf16): greedy equal to model.generate, sampled rows   -> $OUT/generate_real_{fp32,bf16}.log
# Usage: bash scripts/gpu_session_filters.sh [seconds for the tests, 200] [for the probe, 200]
set -uo pipefail
cd "$(dirname "$0")/.."
export NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT="${OUT:-bench/results}"
mkdir -p "$OUT"
start=$SECONDS
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
timeout -s INT -k 20 "${1:-200}" python3 -m pytest -q -p no:warnings -p no:cacheprovider -rfE --durations=15 \
  tests/ops/test_select_filtered.py tests/ops/test_kept_logits.py tests/ops/test_configs.py \
  tests/test_gpu_serving.py tests/test_filters.py > "$OUT/gpu_tests.log" 2>&1
echo "tests rc=$? after $((SECONDS - start))s"
grep -E " passed| failed| error|^FAILED|^ERROR" "$OUT/gpu_tests.log" | tail -12
timeout -s INT -k 20 "${2:-200}" python3 bench/filter_probe.py --only select,graph --batches 1,16,64,256 \
  > "$OUT/filter_probe.log" 2>&1
echo "probe rc=$? after $((SECONDS - start))s"
cp bench/results/filter_probe_*.json "$OUT/" 2>/dev/null
for dt in float32 bfloat16; do
  timeout -k 10 100 python3 examples/generate.py --size real --dtype "$dt" --modes greedy sampled \
    > "$OUT/generate_real_${dt}.log" 2>&1
  echo "generate $dt rc=$? after $((SECONDS - start))s"; tail -6 "$OUT/generate_real_${dt}.log"
done
grep -E "^B=" "$OUT/filter_probe.log"
