"""``nvshmem``: NVSHMEM symmetric tensors through nvshmem4py (GPUs of one host).

Each buffer is one ``nvshmem.core.interop.torch.tensor`` (a collective allocation on
the symmetric heap). ``get_peer_tensor(t, pe)`` gives this process a view of PE
``pe``'s copy, mapped over NVLink; the data pointers of those views form the peer
table the fused kernel's epilogue stores through. The barrier is
``nvshmem.core.barrier_all`` on the current CUDA stream: it orders every PE's earlier
stream work (including the remote stores) before anything queued after it.

Restrictions (nvshmem4py 0.4.1):

* NVSHMEM's allocations and ``barrier_all`` span every PE of the job, so the
  tensor-parallel group must be the whole NVSHMEM job (one TP group, PE = global rank).
  Use ``symm_mem`` or ``collective`` for TP groups inside a larger world.
* ``get_peer_tensor`` is never asked for this rank's own PE (that leaks the buffer in
  0.4.1): the local tensor stands in for itself in the table.
* Freeing is collective (``free_tensor``); peer views are dropped before it, and
  nvshmem4py does not free peer views itself (they alias memory it owns).

nvshmem4py is imported lazily so the package works without it.
"""
import logging

import torch
import torch.distributed as dist

from .base import SymmetricBuffer, Transport

log = logging.getLogger("fsdist")


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


def nvshmem_importable() -> bool:
    try:
        import_nvshmem()
        return True
    except RuntimeError:
        return False


def nvshmem_initialized(core) -> bool:
    """Whether NVSHMEM is initialised in this process (by fsdist or by the caller)."""
    from ... import distributed

    if distributed.nvshmem_is_initialized():
        return True
    try:  # nvshmem4py's own bookkeeping (internal, hence guarded)
        from nvshmem.core import _internal_tracking as tracking

        return int(tracking._is_initialized["status"]) == 1
    except Exception:
        return False


class NvshmemTransport(Transport):
    name = "nvshmem"
    peer_stores = True

    def __init__(self, group, device: torch.device):
        super().__init__(group, device)
        if self.device.type != "cuda":
            raise ValueError(f"the nvshmem transport needs CUDA tensors, got device {self.device}")
        self._core, self._nvtorch = import_nvshmem()
        world = dist.get_world_size()
        if self.world_size != world:
            raise ValueError(
                f"the nvshmem transport needs the tensor-parallel group to be the whole job "
                f"(group size {self.world_size}, world size {world}): NVSHMEM allocations and "
                "barrier_all span every PE. Use transport='symm_mem' or 'collective' for sub-groups.")
        if not nvshmem_initialized(self._core):
            from ... import distributed

            log.info("fsdist: initialising NVSHMEM (UID bootstrap over torch.distributed)")
            distributed.init_nvshmem(device=self.device)
        # PE of each group rank: NVSHMEM is initialised with the global rank as PE.
        self._pes = [dist.get_global_rank(group, r) for r in range(self.world_size)]
        n_pes = int(self._core.n_pes())
        if n_pes != self.world_size:
            raise ValueError(f"NVSHMEM has {n_pes} PEs but the tensor-parallel group has {self.world_size} ranks")
        from ... import distributed

        distributed._register_transport(self)  # closed before NVSHMEM is finalised

    def _alloc(self, numel: int, dtype: torch.dtype) -> SymmetricBuffer:
        with torch.cuda.device(self.device):
            local = self._nvtorch.tensor((numel,), dtype=dtype)
            views = [local if r == self.rank else self._nvtorch.get_peer_tensor(local, pe)
                     for r, pe in enumerate(self._pes)]
            ptrs = torch.tensor([v.data_ptr() for v in views], dtype=torch.int64, device=self.device)
        return SymmetricBuffer(local, ptrs, state={"tensor": local, "views": views})

    def _free(self, buf: SymmetricBuffer) -> None:
        state = buf._state
        super()._free(buf)
        if state is None:
            return
        torch.cuda.synchronize(self.device)  # no kernel may still be using the memory
        state["views"].clear()
        free = getattr(self._nvtorch, "free_tensor", None)
        if free is None:  # pragma: no cover - older nvshmem4py
            log.warning("fsdist: nvshmem4py has no interop.torch.free_tensor; symmetric buffer not freed")
            return
        free(state.pop("tensor"))  # collective across PEs

    def barrier(self) -> None:
        self._core.barrier_all(stream=torch.cuda.current_stream(self.device))

    def close(self) -> None:
        from ... import distributed

        super().close()
        distributed._forget_transport(self)
