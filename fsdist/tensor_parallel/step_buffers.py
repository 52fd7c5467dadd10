"""Per-step exchange buffers, replicated by step parity so buffer reuse is race-free.

Why two copies: with one buffer, a fast rank that has finished step s can run stage 1
of step s+1 and store its candidates into a slow rank's buffer while the slow rank is
still reducing step s from it. With two copies step s uses copy ``s % 2``. A rank only
starts writing copy ``s % 2`` again at step s+2, after it has passed the barrier of
step s+1, and every rank reaches that barrier only after finishing its reduction of
step s. So one barrier per step is all the synchronisation needed.
(``num_buffers = 1`` exists only so tests can show that the race is real.)

Where s comes from: a one-element int64 counter in device memory (owned by the
reduction, see ``reduction.py``), read by the kernels themselves and advanced on the
stream after each step's stage 2. A host integer would do in eager mode, but a CUDA
graph would freeze it at capture time and every replay would use the same copy: the
race would be back. Eager calls use the device counter too, so eager steps and graph
replays interleave without losing the alternation.

The collective transport keeps a single copy. Its all-gather needs a buffer address
known on the host (NCCL bakes it into the captured graph), so it could not follow a
device counter; and it does not need to: a collective writes into a rank's memory only
while that rank is itself inside the collective, i.e. after its stage 2 of the previous
step in stream order.

Every rank must run the same number of steps (eager calls plus graph replays): the
counters, hence the parities, stay equal across ranks by that contract.
"""
from typing import Tuple

import torch

from ..ops.layout import BufferPair
from ..ops.parity import DeviceParity
from .transports.base import Transport


class StepBuffers:
    """Up to two copies of an (fp32, int32) buffer pair, allocated from a transport.

    ``dest`` is what stage-1 kernels write through (the peer tables, or this rank's
    buffers), ``src`` what stage 2 reads (this rank's buffers); both carry the parity
    (the counter and the distance between the copies, 0 with a single copy), so launches
    use base offset 0 and the kernel adds the copy's offset. ``exchange`` publishes this
    rank's blocks and waits for everyone's (``Transport.exchange``).
    """

    def __init__(self, transport: Transport, float_numel: int, int_numel: int, counter: torch.Tensor,
                 num_buffers: int = 2):
        if num_buffers not in (1, 2):
            raise ValueError(f"num_buffers must be 1 or 2, got {num_buffers}")
        self.transport = transport
        self.float_numel = int(float_numel)
        self.int_numel = int(int_numel)
        self.num_buffers = num_buffers if transport.peer_stores else 1
        two = self.num_buffers == 2
        self.parity = DeviceParity(counter, self.float_numel if two else 0, self.int_numel if two else 0)
        # Collective allocations: every rank makes them in this order.
        self.f = transport.alloc(self.num_buffers * self.float_numel, torch.float32)
        try:
            self.i = transport.alloc(self.num_buffers * self.int_numel, torch.int32)
        except Exception:  # (agreed on every rank by alloc) nothing of this object may stay allocated
            transport.free(self.f)
            raise
        (wf, npeers), (wi, _) = transport.write_target(self.f), transport.write_target(self.i)
        self.dest = BufferPair(wf, wi, npeers=npeers, parity=self.parity)
        self.src = BufferPair(self.f.local, self.i.local, parity=self.parity)

    def exchange(self, block_f: int, block_i: int) -> None:
        """Every rank's block (block_f fp32 / block_i int32 elements, rank-major from offset 0
        of the copy in use) becomes visible in every rank's buffers. Collective."""
        self.transport.exchange([(self.f, 0, block_f), (self.i, 0, block_i)])

    def copy(self, k: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """This rank's (fp32, int32) views of copy k (tests and debugging)."""
        if not 0 <= k < self.num_buffers:
            raise ValueError(f"copy {k} out of range ({self.num_buffers} copies)")
        return (self.f.local[k * self.float_numel:(k + 1) * self.float_numel],
                self.i.local[k * self.int_numel:(k + 1) * self.int_numel])

    def free(self) -> None:
        """Collective."""
        self.transport.free(self.i)
        self.transport.free(self.f)
