# Sourced, after `cd` to the repository root, by every GPU launcher in scripts/ and bench/run_gpu.sh:
# NVLink multicast off in NVSHMEM, torch symmetric memory and NCCL (it can take a shared host's GPUs
# down; fsdist.env.SAFE_ENV is the Python side of the same switches), unbuffered Python output (the
# device tool keeps the tail of what a call prints) and the working tree's fsdist ahead of any other.
export NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
