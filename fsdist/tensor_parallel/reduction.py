"""Common base of the two cross-rank reductions: batch capacity and step bookkeeping.

Buffers are laid out for a batch capacity (batch is the innermost dimension). When a
larger batch arrives the buffers are reallocated, collectively: every rank sees the
same batch size (the head's contract), so every rank grows at the same step. Capacity
grows to the next power of two (at least 16) so a slowly growing batch reallocates
only a few times. Growing allocates symmetric memory, so it must not happen while a
CUDA graph is being captured: warm up with the largest batch first, or pass
``max_batch_size`` to the head.
"""
from typing import Callable, Optional

import torch
import triton

from .transports.base import Transport
from .utils import VocabPartition

DebugHook = Optional[Callable[[str, int], None]]


def capacity_for(batch: int) -> int:
    return max(16, triton.next_power_of_2(max(1, batch)))


class Reduction:
    """Owns the exchange buffers of one head; ``run`` does one sampling step."""

    name = "?"

    def __init__(self, transport: Transport, partition: VocabPartition, block_v: int, num_buffers: int,
                 device: torch.device):
        self.transport = transport
        self.partition = partition
        self.block_v = block_v
        self.num_buffers = num_buffers
        self.device = device
        self.rank = transport.rank
        self.tp = transport.world_size
        self.n_local = triton.cdiv(partition.rows, block_v)  # vocabulary tiles per rank
        self.capacity = 0
        self.buffers = None  # StepBuffers once a batch has arrived

    # subclasses: allocate / free their buffers for self.capacity
    def _allocate(self) -> None:
        raise NotImplementedError

    def _release(self) -> None:
        raise NotImplementedError

    def ensure_capacity(self, batch: int) -> None:
        """Collective when it (re)allocates; a no-op when the batch fits."""
        if batch <= self.capacity:
            return
        if self.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                f"batch {batch} exceeds the tensor-parallel head's buffer capacity {self.capacity} while a "
                "CUDA graph is being captured; growing needs a collective allocation. Run one step with the "
                "largest batch before capturing, or construct the head with max_batch_size.")
        if self.capacity:
            self._release()
        self.capacity = capacity_for(batch)
        self._allocate()

    def close(self) -> None:
        """Collective."""
        if self.capacity:
            self._release()
            self.capacity = 0
