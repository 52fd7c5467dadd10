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

nvshmem4py is imported lazily (``fsdist.nvshmem_runtime``) so the package works without it.
"""
import logging

import torch
import torch.distributed as dist

from ... import nvshmem_runtime
from .base import SymmetricBuffer, Transport

log = logging.getLogger("fsdist")


class NvshmemTransport(Transport):
    name = "nvshmem"
    peer_stores = True

    def __init__(self, group, device: torch.device):
        super().__init__(group, device)
        if self.device.type != "cuda":
            raise ValueError(f"the nvshmem transport needs CUDA tensors, got device {self.device}")
        self._core, self._nvtorch = nvshmem_runtime.import_nvshmem()
        world = dist.get_world_size()
        if self.world_size != world:
            raise ValueError(
                f"the nvshmem transport needs the tensor-parallel group to be the whole job "
                f"(group size {self.world_size}, world size {world}): NVSHMEM allocations and "
                "barrier_all span every PE. Use transport='symm_mem' or 'collective' for sub-groups.")
        if not nvshmem_runtime.initialized():
            log.info("fsdist: initialising NVSHMEM (UID bootstrap over torch.distributed)")
            nvshmem_runtime.init(device=self.device)
        # PE of each group rank: NVSHMEM is initialised with the global rank as PE.
        self._pes = [dist.get_global_rank(group, r) for r in range(self.world_size)]
        n_pes = int(self._core.n_pes())
        if n_pes != self.world_size:
            raise ValueError(f"NVSHMEM has {n_pes} PEs but the tensor-parallel group has {self.world_size} ranks")
        nvshmem_runtime.track(self)  # closed before NVSHMEM is finalised

    def _reserve(self, numel: int, dtype: torch.dtype) -> None:
        return None  # NVSHMEM's allocation is itself collective: all of it happens in _connect

    def _connect(self, _local, numel: int, dtype: torch.dtype) -> SymmetricBuffer:
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
        super().close()
        nvshmem_runtime.untrack(self)
