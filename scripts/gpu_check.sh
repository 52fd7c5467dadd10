#!/usr/bin/env bash
# GPU test entry point (run on a lent GPU): the single-GPU suite on CUDA, GPU-only tests
# included (tests/test_processors_gpu.py, tests/test_gpu_serving.py, tests/ops/test_sample_gpu.py,
# ...). With $OUT set (the device tool), the log is also written to $OUT/gpu_check.log.
# Usage: bash scripts/gpu_check.sh [extra pytest args]
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh
log="${OUT:+$OUT/gpu_check.log}"
python3 -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name(), torch.__version__)"
python3 -m pytest -q -p no:warnings -p no:cacheprovider -rfE tests --ignore=tests/tensor_parallel "$@" \
  2>&1 | tee "${log:-/dev/null}"
exit "${PIPESTATUS[0]}"
