"""NVSHMEM's lifecycle in one place: import, initialise, track live users, finalise.

Everything in fsdist that touches NVSHMEM goes through this module, which depends on
nothing else in fsdist (the pattern of Megatron-Core's symmetric-memory manager):

* :func:`import_nvshmem` imports nvshmem4py lazily, with an error that says how to get it;
* :func:`init` bootstraps NVSHMEM over an initialised torch.distributed default group
  (rank 0's unique id is broadcast; PE = global rank), idempotently;
* :func:`track` / :func:`untrack` keep the live users of the symmetric heap (transports):
  symmetric buffers must be freed collectively and explicitly (nvshmem4py raises if one
  is garbage collected), so :func:`finalize` closes whatever is still open, in creation
  order (the same on every rank), before finalising NVSHMEM itself.

The no-multicast switches (``fsdist.env``) are applied before NVSHMEM starts.
"""
import logging
from typing import List

from .env import apply_safe_env

log = logging.getLogger("fsdist")

_initialized_by_fsdist = False
_live: List[object] = []  # objects with a collective close(), in creation order


def import_nvshmem():
    """(nvshmem.core, nvshmem.core.interop.torch), or RuntimeError saying how to get them."""
    try:
        import nvshmem.core as core
        from nvshmem.core.interop import torch as nvtorch
    except Exception as e:  # ImportError, or a CUDA library failing to load
        raise RuntimeError(
            "the nvshmem transport needs nvshmem4py (pip install nvshmem4py-cu13; on the GPU image "
            f"install the carried wheel with --no-deps): import failed with {type(e).__name__}: {e}") from e
    return core, nvtorch


def importable() -> bool:
    try:
        import_nvshmem()
        return True
    except RuntimeError:
        return False


def initialized() -> bool:
    """Whether NVSHMEM is initialised in this process (by fsdist or by the caller)."""
    if _initialized_by_fsdist:
        return True
    try:  # nvshmem4py's own bookkeeping (internal, hence guarded)
        from nvshmem.core import _internal_tracking as tracking

        return int(tracking._is_initialized["status"]) == 1
    except Exception:
        return False


def _cuda_core_device(index: int):
    try:
        from cuda.core import Device
    except ImportError:
        from cuda.core.experimental import Device
    return Device(index)


def init(device=None) -> None:
    """Initialise NVSHMEM over the default process group (UID bootstrap; PE = global rank).

    Rank 0 creates the unique id, torch.distributed broadcasts it, every rank calls
    ``nvshmem.core.init(..., initializer_method="uid")`` on its GPU. Idempotent; collective.
    """
    global _initialized_by_fsdist
    import torch
    import torch.distributed as dist

    apply_safe_env()
    if initialized():
        return
    if not dist.is_initialized():
        raise RuntimeError("NVSHMEM needs torch.distributed initialised first (fsdist.distributed.init_distributed)")
    if not torch.cuda.is_available():
        raise RuntimeError("NVSHMEM needs CUDA GPUs; none is available")
    core, _ = import_nvshmem()
    device = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
    index = device.index if device.index is not None else torch.cuda.current_device()
    torch.cuda.set_device(index)
    cu_dev = _cuda_core_device(index)
    cu_dev.set_current()
    rank, world = dist.get_rank(), dist.get_world_size()
    holder = [core.get_unique_id() if rank == 0 else None]
    dist.broadcast_object_list(holder, src=0)
    core.init(device=cu_dev, uid=holder[0], rank=rank, nranks=world, initializer_method="uid")
    _initialized_by_fsdist = True
    log.info("fsdist: NVSHMEM initialised, PE %d of %d on cuda:%d", rank, world, index)


def track(user) -> None:
    """Register a live user of the symmetric heap (closed by finalize if still open)."""
    if user not in _live:
        _live.append(user)


def untrack(user) -> None:
    if user in _live:
        _live.remove(user)


def finalize(collective: bool = True) -> None:
    """Close live users (collective frees), then finalise NVSHMEM if fsdist initialised it.

    collective=False (error path): forget the users without touching other ranks."""
    global _initialized_by_fsdist
    if not collective:
        _live.clear()
        return
    for user in list(_live):
        user.close()
    _live.clear()
    if _initialized_by_fsdist:
        import nvshmem.core as core
        import torch

        torch.cuda.synchronize()
        core.finalize()
        _initialized_by_fsdist = False


__all__ = ["import_nvshmem", "importable", "initialized", "init", "track", "untrack", "finalize"]
