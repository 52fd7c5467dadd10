"""``symm_mem``: torch.distributed._symmetric_memory buffers (GPUs of one host).

``symm_mem.empty`` allocates from torch's symmetric-memory allocator and
``rendezvous(t, group)`` maps every rank's allocation into every other rank (CUDA
IPC / VMM). The peer table holds the address of every rank's tensor: from
``handle.get_remote_tensor`` where torch has it, else ``buffer_ptrs[r] + (own data_ptr
- buffer_ptrs[own rank])`` (the tensor's offset inside its allocation is the same on
every rank: allocations happen in the same order everywhere). The barrier is the handle's stream-ordered
signal-pad barrier. Unlike ``nvshmem`` this works for any process group (e.g. a TP
group inside a larger data-parallel world).

Multicast / NVLS APIs are never touched (TORCH_SYMM_MEM_DISABLE_MULTICAST=1).
"""
import torch
import torch.distributed as dist

from .base import SymmetricBuffer, Transport


class SymmMemTransport(Transport):
    name = "symm_mem"
    peer_stores = True

    def __init__(self, group, device: torch.device):
        super().__init__(group, device)
        if self.device.type != "cuda":
            raise ValueError(f"the symm_mem transport needs CUDA tensors, got device {self.device}")
        try:
            import torch.distributed._symmetric_memory as symm_mem
        except Exception as e:  # pragma: no cover - torch built without distributed
            raise RuntimeError(f"torch.distributed._symmetric_memory is unavailable: {e}") from e
        self._sm = symm_mem
        name = getattr(group, "group_name", None)
        enable = getattr(symm_mem, "enable_symm_mem_for_group", None)
        is_enabled = getattr(symm_mem, "is_symm_mem_enabled_for_group", None)
        if enable is not None and name is not None and (is_enabled is None or not is_enabled(name)):
            try:  # needed by older torch; newer versions deprecate it and do it on rendezvous
                enable(name)
            except Exception:
                pass

    def _rendezvous(self, t: torch.Tensor):
        try:
            return self._sm.rendezvous(t, self.group)
        except TypeError:  # older torch wants the group name
            return self._sm.rendezvous(t, self.group.group_name)

    def _reserve(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        return self._sm.empty(numel, dtype=dtype, device=self.device)

    def _connect(self, t: torch.Tensor, numel: int, dtype: torch.dtype) -> SymmetricBuffer:
        handle = self._rendezvous(t)
        try:  # newer torch: a view of the peer's tensor at this tensor's offset in the allocation
            addrs = [t.data_ptr() if r == self.rank else handle.get_remote_tensor(r, (numel,), dtype).data_ptr()
                     for r in range(self.world_size)]
        except (AttributeError, RuntimeError, TypeError):
            bases = [int(p) for p in handle.buffer_ptrs]
            delta = t.data_ptr() - bases[self.rank]
            addrs = [b + delta for b in bases]
        ptrs = torch.tensor(addrs, dtype=torch.int64, device=self.device)
        return SymmetricBuffer(t, ptrs, state={"tensor": t, "handle": handle})

    def _live_handle(self):
        for buf in reversed(self._buffers):
            if buf._state is not None:
                return buf._state["handle"]
        return None

    def barrier(self) -> None:
        handle = self._live_handle()
        if handle is None:
            dist.barrier(group=self.group)
        else:
            handle.barrier(channel=0)

    def free(self, buf: SymmetricBuffer) -> None:
        if not buf.freed:
            # Nobody may still store into the allocation being dropped.
            self.barrier()
            torch.cuda.synchronize(self.device)
        super().free(buf)
