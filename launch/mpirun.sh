#!/usr/bin/env bash
# Launch N ranks on this host with mpirun (MPICH/Hydra or Open MPI).
#
#   launch/mpirun.sh N script.py [args...]
#   launch/mpirun.sh N -m module [args...]      e.g. launch/mpirun.sh 2 -m pytest --with-mpi tests/tensor_parallel
#
# Every rank is started through this same script in "--rank-env" mode, which exports the
# torchrun-style variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE) from MPI's own
# (OMPI_COMM_WORLD_*, PMI_*/MPI_LOCALRANKID, SLURM_*), so the script sees the same environment
# as under torchrun; fsdist.distributed maps LOCAL_RANK to a GPU. MASTER_ADDR/MASTER_PORT are
# chosen here once for all ranks. Works on CPU (gloo) as well.
# Environment: PYTHON (default: python), MPIRUN (default: mpirun), MPIRUN_ARGS (extra options,
# e.g. "--oversubscribe --allow-run-as-root" for Open MPI).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

if [[ "${1:-}" == "--rank-env" ]]; then
    shift
    export RANK=${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-${PMIX_RANK:-${SLURM_PROCID:-0}}}}
    export WORLD_SIZE=${OMPI_COMM_WORLD_SIZE:-${PMI_SIZE:-${SLURM_NTASKS:-1}}}
    export LOCAL_RANK=${OMPI_COMM_WORLD_LOCAL_RANK:-${MPI_LOCALRANKID:-${SLURM_LOCALID:-$RANK}}}
    export LOCAL_WORLD_SIZE=${OMPI_COMM_WORLD_LOCAL_SIZE:-${MPI_LOCALNRANKS:-$WORLD_SIZE}}
    exec "${PYTHON:-$(command -v python3 || command -v python)}" "$@"
fi

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
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
if [[ -z "${MASTER_PORT:-}" ]]; then
    MASTER_PORT=$("${PYTHON:-$(command -v python3 || command -v python)}" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    export MASTER_PORT
fi

MPIRUN=${MPIRUN:-mpirun}
if "$MPIRUN" --version 2>&1 | grep -qi "open mpi"; then
    # Open MPI forwards only the variables named with -x.
    fwd=()
    for v in NVSHMEM_DISABLE_NVLS TORCH_SYMM_MEM_DISABLE_MULTICAST NCCL_NVLS_ENABLE OMP_NUM_THREADS \
             MASTER_ADDR MASTER_PORT PATH PYTHONPATH LD_LIBRARY_PATH PYTHON TRITON_INTERPRET CUDA_VISIBLE_DEVICES; do
        if [[ -n "${!v+x}" ]]; then fwd+=(-x "$v"); fi
    done
    # shellcheck disable=SC2086
    exec "$MPIRUN" -n "$N" "${fwd[@]}" ${MPIRUN_ARGS:-} bash "$HERE/mpirun.sh" --rank-env "$@"
else
    # MPICH / Hydra forwards the whole environment.
    # shellcheck disable=SC2086
    exec "$MPIRUN" -n "$N" ${MPIRUN_ARGS:-} bash "$HERE/mpirun.sh" --rank-env "$@"
fi
