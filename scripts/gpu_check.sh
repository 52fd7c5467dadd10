#!/usr/bin/env bash
# GPU test entry point (run on a lent GPU): the single-GPU suite on CUDA, GPU-only tests
# included. Usage: bash scripts/gpu_check.sh [extra pytest args]
set -uo pipefail
cd "$(dirname "$0")/.."
export NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
python3 -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name(), torch.__version__)"
python3 -m pytest -q -p no:warnings -p no:cacheprovider tests --ignore=tests/tensor_parallel "$@"
