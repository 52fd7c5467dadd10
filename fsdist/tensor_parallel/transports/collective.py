"""``collective``: private buffers plus an all-gather, over any torch.distributed backend.

Works everywhere torch.distributed does: gloo on CPU (tests, the Triton interpreter),
NCCL on GPUs, across nodes. Each rank writes its own block of the buffer and the head
calls :meth:`all_gather_into` to fill in the others. A collective only touches a
rank's memory while that rank is inside the same collective call, so no peer can
overwrite a slot this rank is still reading: the barrier is implied by the all-gather.
"""
import torch

from .base import SymmetricBuffer, Transport


class CollectiveTransport(Transport):
    name = "collective"
    peer_stores = False

    def _connect(self, local: torch.Tensor, numel: int, dtype: torch.dtype) -> SymmetricBuffer:
        return SymmetricBuffer(local)
