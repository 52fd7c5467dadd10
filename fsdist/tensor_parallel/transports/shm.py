"""``shm``: symmetric buffers in host shared memory, for CPU tests under Triton's interpreter.

This is the CPU stand-in for NVSHMEM. Each rank creates one POSIX shared-memory
segment per buffer, the segment names are exchanged with ``all_gather_object``, and
every rank maps every peer's segment. The peer address table holds the *host
addresses* of those mappings in this process, so the fused kernel running under
``TRITON_INTERPRET=1`` really stores into other processes' memory through the same
PEER_TABLE code path it uses with NVSHMEM on GPUs. The barrier is ``dist.barrier``
(a socket round trip, which orders the preceding stores on every rank).

Segments are unlinked by their owner on :meth:`free` / :meth:`close`, and at
interpreter exit for anything still open.
"""
import atexit
import os
import sys
import uuid
from multiprocessing import resource_tracker, shared_memory

import torch
import torch.distributed as dist

from ...runtime import interpreting
from .base import SymmetricBuffer, Transport

# Segments this process created and has not unlinked yet, by name. Held strongly so that
# a head dropped without close() still gets its segments unlinked at interpreter exit.
_OWNED = {}


def _attach(name: str) -> shared_memory.SharedMemory:
    """Map a peer's segment without making this process responsible for unlinking it."""
    if sys.version_info >= (3, 13):
        return shared_memory.SharedMemory(name=name, create=False, track=False)
    seg = shared_memory.SharedMemory(name=name, create=False)
    # Before 3.13 attaching registers the segment with this process's resource
    # tracker, which would unlink it (and warn) when this process exits.
    try:
        resource_tracker.unregister(seg._name, "shared_memory")
    except Exception:  # pragma: no cover - tracker internals vary
        pass
    return seg


class ShmTransport(Transport):
    name = "shm"
    peer_stores = True

    def __init__(self, group, device: torch.device):
        super().__init__(group, device)
        if self.device.type != "cpu" or not interpreting():
            raise ValueError("the shm transport runs on CPU tensors under Triton's interpreter "
                             f"(TRITON_INTERPRET=1); got device {self.device} with "
                             f"TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET')!r}")

    def _reserve(self, numel: int, dtype: torch.dtype) -> shared_memory.SharedMemory:
        itemsize = torch.empty((), dtype=dtype).element_size()
        own = shared_memory.SharedMemory(name=f"fsdist_{os.getpid()}_{uuid.uuid4().hex[:12]}",
                                         create=True, size=numel * itemsize)
        _OWNED[own.name] = own
        return own

    def _unreserve(self, own: shared_memory.SharedMemory) -> None:
        own.close()
        _unlink(own)

    def _connect(self, own: shared_memory.SharedMemory, numel: int, dtype: torch.dtype) -> SymmetricBuffer:
        names = [None] * self.world_size
        dist.all_gather_object(names, own.name, group=self.group)
        segments = [own if r == self.rank else _attach(n) for r, n in enumerate(names)]
        views = [torch.frombuffer(seg.buf, dtype=dtype, count=numel) for seg in segments]
        ptrs = torch.tensor([v.data_ptr() for v in views], dtype=torch.int64)
        return SymmetricBuffer(views[self.rank], ptrs, state={"segments": segments, "views": views})

    def _free(self, buf: SymmetricBuffer) -> None:
        state = buf._state
        super()._free(buf)  # drop the head's references to the views first
        if state is None:
            return
        segments = state["segments"]
        state["views"].clear()  # releases the buffer exports so the mappings can close
        for r, seg in enumerate(segments):
            try:
                seg.close()
            except BufferError:
                pass  # someone still holds a view: leave the mapping to process exit
            if r == self.rank:
                _unlink(seg)

    def free(self, buf: SymmetricBuffer) -> None:
        # Nobody may still store into (or read) the segments being dropped.
        if not buf.freed and dist.is_initialized():
            dist.barrier(group=self.group)
        super().free(buf)


def _unlink(seg: shared_memory.SharedMemory) -> None:
    _OWNED.pop(seg.name, None)
    try:
        seg.unlink()
    except FileNotFoundError:
        pass


@atexit.register
def _cleanup():
    # No collectives at exit (peers may be gone): unmap and unlink what this process created.
    for seg in list(_OWNED.values()):
        try:
            seg.close()
        except BufferError:
            pass  # a view is still alive; the mapping goes away with the process
        _unlink(seg)
