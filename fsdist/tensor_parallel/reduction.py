"""Common base of the two cross-rank reductions: planning, batch capacity, step bookkeeping.

The step counter that picks the exchange buffer's copy lives here, in device memory
(``counter``, one int64), so that it survives buffer reallocation and a CUDA graph
captured around a step reads and advances it at replay time (see step_buffers.py).

Buffers are laid out for a batch capacity (batch is the innermost dimension). When a
larger batch arrives the buffers are reallocated, collectively: every rank sees the
same batch size (the head's contract), so every rank grows at the same step. Capacity
grows to the next power of two (at least 16) so a slowly growing batch reallocates
only a few times. Growing allocates symmetric memory, so it must not happen while a
CUDA graph is being captured: warm up with the largest batch first, or pass
``max_batch_size`` to the head. Growing after a capture would free buffers the graph
still points into, so that raises too.
"""
from typing import Optional, Tuple

import torch
import triton

from ..ops.plan import SamplePlan, plan_sample
from ..params import RowParams
from .testing import HeadTestSeam
from .transports.base import Transport
from .vocab import VocabPartition


def capacity_for(batch: int) -> int:
    return max(16, triton.next_power_of_2(max(1, batch)))


class Reduction:
    """Owns the exchange buffers of one head; ``run`` does one sampling step."""

    def __init__(self, transport: Transport, partition: VocabPartition, block_v: int, device: torch.device,
                 seam: HeadTestSeam):
        self.transport = transport
        self.partition = partition
        self.block_v = block_v
        self.seam = seam
        self.device = device
        self.rank = transport.rank
        self.tp = transport.world_size
        self.n_local = triton.cdiv(partition.rows, block_v)  # vocabulary tiles per rank
        self.capacity = 0
        self.buffers = None  # StepBuffers once a batch has arrived
        # Steps run on the device (eager calls and graph replays); parity = copy in use.
        # int64: never wraps in practice.
        self.counter = torch.zeros(1, dtype=torch.int64, device=device)
        self.captured = False  # a CUDA graph holds pointers into the current buffers

    # subclasses: allocate / free their buffers for self.capacity, and one step
    def _allocate(self) -> None:
        raise NotImplementedError

    def _release(self) -> None:
        raise NotImplementedError

    def _sample(self, hidden: torch.Tensor, weight: torch.Tensor, params: RowParams, logprobs: bool,
                path: Optional[str], step: int) -> Tuple:
        """One step on buffers of sufficient capacity: (tokens, logprobs or None, lse or None)."""
        raise NotImplementedError

    def plan(self, batch: int, hidden_size: int, logprobs: bool, path: Optional[str], n_shards: int) -> SamplePlan:
        """Stage 1 of this rank's shard, into a buffer of the current capacity with n_shards blocks."""
        return plan_sample(batch=batch, hidden_size=hidden_size, weight_rows=self.partition.rows, device=self.device,
                           logprobs=logprobs, path=path, block_v=self.block_v, n_shards=n_shards,
                           batch_cap=self.capacity)

    def run(self, hidden: torch.Tensor, weight: torch.Tensor, params: RowParams, logprobs: bool,
            path: Optional[str], step: int) -> Tuple:
        """One sampling step across the group. ``step`` is the host count, for the test seam only:
        the exchange buffer's copy comes from ``self.counter``."""
        self.ensure_capacity(hidden.shape[0])
        if self.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            self.captured = True
        out = self._sample(hidden, weight, params, logprobs, path, step)
        # Stream ordered after stage 2 has read this step's copy, and captured by a graph,
        # so every replay advances it too.
        self.counter.add_(1)
        return out

    def ensure_capacity(self, batch: int) -> None:
        """Collective when it (re)allocates; a no-op when the batch fits."""
        if batch <= self.capacity:
            return
        if self.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                f"batch {batch} exceeds the tensor-parallel head's buffer capacity {self.capacity} while a "
                "CUDA graph is being captured; growing needs a collective allocation. Warm up with the "
                "largest batch first (one eager step before capturing), or construct the head with "
                "max_batch_size.")
        if self.captured:
            raise RuntimeError(
                f"batch {batch} exceeds the tensor-parallel head's buffer capacity {self.capacity}, and a CUDA "
                "graph was captured on the current buffers: growing would free memory the graph still uses. "
                "Warm up with the largest batch first (before any capture), or construct the head with "
                "max_batch_size.")
        if self.capacity:
            self._release()
        self.capacity = capacity_for(batch)
        self._allocate()

    def close(self) -> None:
        """Collective."""
        if self.capacity:
            self._release()
            self.capacity = 0
