"""Start and stop torch.distributed (and optionally NVSHMEM) from whatever launched us.

Launchers we understand (first match wins):

* torchrun / torch.distributed.run / fsdist's launch scripts: RANK, WORLD_SIZE,
  LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT;
* Open MPI: OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK / _LOCAL_SIZE;
* MPICH / Hydra / Intel MPI: PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS;
* Slurm srun: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE;
* nothing: a single process (world size 1).

Under MPI without MASTER_ADDR / MASTER_PORT, rank 0 picks a free port and broadcasts
it with mpi4py. The backend is NCCL when CUDA is available, else gloo; the local
rank picks the GPU (``local_rank % device_count``).

Before anything initialises, NVLink multicast / NVLS is switched off:
``NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_NVLS_ENABLE=0``
(multicast can take a shared host's GPUs down). These are forced, with a warning if
the environment said otherwise.

Typical use::

    from fsdist.distributed import distributed
    with distributed(nvshmem=False) as ctx:      # ctx.rank, ctx.world_size, ctx.device
        head = fsdist.ShardedFlashLMHead(4096, 128256, device=ctx.device)
        ...
        head.close()
"""
import contextlib
import logging
import os
import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import Mapping, Optional

import torch
import torch.distributed as dist

from . import nvshmem_runtime
from .env import SAFE_ENV, apply_safe_env

log = logging.getLogger("fsdist")

DEFAULT_TIMEOUT = timedelta(minutes=10)

apply_safe_env()  # as early as possible: importing fsdist.distributed is usually the first step


@dataclass(frozen=True)
class LaunchInfo:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    launcher: str  # "torchrun" | "openmpi" | "mpich" | "slurm" | "single"


def _int(env: Mapping[str, str], *keys: str, default: Optional[int] = None) -> Optional[int]:
    for k in keys:
        v = env.get(k)
        if v not in (None, ""):
            try:
                return int(str(v).split("(")[0].split(",")[0])
            except ValueError:
                raise RuntimeError(f"environment variable {k}={v!r} is not an integer") from None
    return default


def detect_launch(env: Optional[Mapping[str, str]] = None) -> LaunchInfo:
    """Rank, world size and local rank from the launcher's environment variables."""
    env = os.environ if env is None else env
    if "RANK" in env and "WORLD_SIZE" in env:
        rank, world = _int(env, "RANK"), _int(env, "WORLD_SIZE")
        local = _int(env, "LOCAL_RANK", default=rank)
        lws = _int(env, "LOCAL_WORLD_SIZE", default=world)
        launcher = "torchrun"
    elif "OMPI_COMM_WORLD_RANK" in env:
        rank, world = _int(env, "OMPI_COMM_WORLD_RANK"), _int(env, "OMPI_COMM_WORLD_SIZE")
        local = _int(env, "OMPI_COMM_WORLD_LOCAL_RANK", default=rank)
        lws = _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", default=world)
        launcher = "openmpi"
    elif "PMI_RANK" in env:
        rank, world = _int(env, "PMI_RANK"), _int(env, "PMI_SIZE", default=1)
        local = _int(env, "MPI_LOCALRANKID", "PMI_LOCAL_RANK", default=rank)
        lws = _int(env, "MPI_LOCALNRANKS", "PMI_LOCAL_SIZE", default=world)
        launcher = "mpich"
    elif "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        rank, world = _int(env, "SLURM_PROCID"), _int(env, "SLURM_NTASKS")
        local = _int(env, "SLURM_LOCALID", default=rank)
        lws = _int(env, "SLURM_NTASKS_PER_NODE", default=world)
        launcher = "slurm"
    else:
        rank, world, local, lws, launcher = 0, 1, 0, 1, "single"
    if world < 1 or not 0 <= rank < world:
        raise RuntimeError(f"inconsistent launch environment ({launcher}): rank {rank}, world size {world}")
    return LaunchInfo(rank, world, local, lws, launcher)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rendezvous_address(info: LaunchInfo):
    """(MASTER_ADDR, MASTER_PORT) for init_process_group."""
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if addr and port:
        return addr, int(port)
    if info.world_size == 1:
        return addr or "127.0.0.1", int(port) if port else _free_port()
    if info.launcher in ("openmpi", "mpich", "slurm"):
        try:
            from mpi4py import MPI
        except ImportError:
            raise RuntimeError("launched by MPI without MASTER_ADDR/MASTER_PORT and mpi4py is not installed: "
                               "export MASTER_ADDR and MASTER_PORT, or use launch/mpirun.sh") from None
        comm = MPI.COMM_WORLD
        if comm.Get_size() != info.world_size:
            raise RuntimeError(f"MPI world size {comm.Get_size()} != launch world size {info.world_size}")
        mine = (socket.gethostname(), _free_port()) if comm.Get_rank() == 0 else None
        host0, port0 = comm.bcast(mine, root=0)
        single_host = info.local_world_size == info.world_size
        return addr or ("127.0.0.1" if single_host else host0), int(port) if port else port0
    raise RuntimeError(f"{info.launcher} launch without MASTER_ADDR/MASTER_PORT set")


@dataclass
class DistContext:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: torch.device
    backend: str
    launcher: str
    created_group: bool  # False if torch.distributed was already initialised by someone else


class _State:
    ctx: Optional[DistContext] = None


def nvshmem_is_initialized() -> bool:
    return nvshmem_runtime.initialized()


def _pick_device(info: LaunchInfo, device) -> torch.device:
    if device is not None:
        device = torch.device(device)
        if device.type == "cuda":
            if device.index is None:
                device = torch.device("cuda", info.local_rank % torch.cuda.device_count())
            torch.cuda.set_device(device)
        return device
    if torch.cuda.is_available():
        device = torch.device("cuda", info.local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


def init_distributed(backend: Optional[str] = None, *, device=None, nvshmem: bool = False,
                     timeout: Optional[timedelta] = None) -> DistContext:
    """Initialise the default process group from the launcher's environment.

    backend: default "nccl" on CUDA, "gloo" on CPU. device: default cuda:(local_rank %
    GPUs) when CUDA is available, else cpu. nvshmem: also initialise NVSHMEM (UID
    bootstrap over torch.distributed). If torch.distributed is already initialised it
    is reused (and not destroyed by :func:`shutdown`).
    """
    apply_safe_env()
    info = detect_launch()
    device = _pick_device(info, device)
    created = False
    if not dist.is_initialized():
        backend = backend or ("nccl" if device.type == "cuda" else "gloo")
        addr, port = _rendezvous_address(info)
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = addr, str(port)
        kwargs = dict(backend=backend, init_method=f"tcp://{addr}:{port}", rank=info.rank,
                      world_size=info.world_size, timeout=timeout or DEFAULT_TIMEOUT)
        if backend == "nccl" and device.type == "cuda":
            kwargs["device_id"] = device  # binds the communicator to this rank's GPU
        try:
            dist.init_process_group(**kwargs)
        except TypeError:  # older torch without device_id
            kwargs.pop("device_id", None)
            dist.init_process_group(**kwargs)
        created = True
    ctx = DistContext(dist.get_rank(), dist.get_world_size(), info.local_rank, info.local_world_size, device,
                      str(dist.get_backend()), info.launcher, created)
    _State.ctx = ctx
    log.info("fsdist: rank %d/%d (local %d) on %s, backend %s, launcher %s", ctx.rank, ctx.world_size,
             ctx.local_rank, device, ctx.backend, info.launcher)
    if nvshmem:
        init_nvshmem(device=device)
    return ctx


def init_nvshmem(device=None) -> None:
    """Initialise NVSHMEM over the default process group (see fsdist.nvshmem_runtime.init)."""
    nvshmem_runtime.init(device)


def finalize_nvshmem() -> None:
    """Close live NVSHMEM transports (collective frees), then finalise NVSHMEM. Collective."""
    nvshmem_runtime.finalize()


def shutdown(*, collective: bool = True) -> None:
    """Tear down what :func:`init_distributed` set up.

    collective=True (normal exit): NVSHMEM transports are closed and NVSHMEM finalised
    (both collective), then the process group is destroyed if fsdist created it.
    collective=False (error path): skip everything that would wait for other ranks.
    """
    nvshmem_runtime.finalize(collective=collective)
    ctx = _State.ctx
    if ctx is not None and ctx.created_group and dist.is_initialized():
        dist.destroy_process_group()
    _State.ctx = None


@contextlib.contextmanager
def distributed(backend: Optional[str] = None, *, device=None, nvshmem: bool = False,
                timeout: Optional[timedelta] = None):
    """Context manager around :func:`init_distributed` / :func:`shutdown`.

    On an exception the teardown skips collectives, so one failing rank does not leave
    the others' exits hanging on it.
    """
    ctx = init_distributed(backend, device=device, nvshmem=nvshmem, timeout=timeout)
    ok = False
    try:
        yield ctx
        ok = True
    finally:
        shutdown(collective=ok)


__all__ = ["SAFE_ENV", "apply_safe_env", "LaunchInfo", "detect_launch", "DistContext", "init_distributed",
           "init_nvshmem", "finalize_nvshmem", "shutdown", "distributed", "nvshmem_is_initialized"]
