#!/usr/bin/env bash
# Launch N ranks on this host with torchrun.
#
#   launch/torchrun.sh N script.py [args...]
#   launch/torchrun.sh N -m module [args...]        e.g. launch/torchrun.sh 2 -m pytest tests/tensor_parallel
#
# torchrun exports RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT;
# fsdist.distributed.init_distributed() maps LOCAL_RANK to a GPU (cuda:LOCAL_RANK % #GPUs)
# and picks NCCL there, gloo on a machine without GPUs.
# Environment: PYTHON (default: python), TORCHRUN_ARGS (extra torchrun options).
set -euo pipefail

if [[ $# -lt 2 ]]; then
    echo "usage: $0 N script.py [args...]  |  $0 N -m module [args...]" >&2
    exit 2
fi
N=$1
shift
if ! [[ "$N" =~ ^[1-9][0-9]*$ ]]; then
    echo "$0: N must be a positive integer, got '$N'" >&2
    exit 2
fi

# NVLink multicast / NVLS stays off: it can take a shared host's GPUs down.
export NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_NVLS_ENABLE=0
# One interpreter thread pool per rank is plenty on a shared CPU box; keep the user's choice.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

# shellcheck disable=SC2086
exec "${PYTHON:-$(command -v python3 || command -v python)}" -m torch.distributed.run --standalone --nproc-per-node "$N" ${TORCHRUN_ARGS:-} "$@"
