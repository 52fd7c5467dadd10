"""Per-step exchange buffers, replicated by step parity so buffer reuse is race-free.

Why two copies: with one buffer, a fast rank that has finished step s can run stage 1
of step s+1 and store its candidates into a slow rank's buffer while the slow rank is
still reducing step s from it. With ``num_buffers = 2`` step s uses copy ``s % 2``.
A rank only starts writing copy ``s % 2`` again at step s+2, after it has passed the
barrier of step s+1, and every rank reaches that barrier only after finishing its
reduction of step s. So one barrier per step is all the synchronisation needed.
(``num_buffers = 1`` exists only so tests can show that the race is real.)

Every rank must call forward the same number of times with the same batch size: the
step counter, hence the parity, is kept in lock step by that contract.
"""
import torch

from .transports.base import Transport


class StepBuffers:
    """``num_buffers`` copies of an (fp32, int32) buffer pair, allocated from a transport."""

    def __init__(self, transport: Transport, float_numel: int, int_numel: int, num_buffers: int = 2):
        if num_buffers < 1:
            raise ValueError(f"num_buffers must be >= 1, got {num_buffers}")
        self.transport = transport
        self.float_numel = int(float_numel)
        self.int_numel = int(int_numel)
        self.num_buffers = num_buffers
        # Collective allocations: every rank makes them in this order.
        self.f = transport.alloc(num_buffers * self.float_numel, torch.float32)
        self.i = transport.alloc(num_buffers * self.int_numel, torch.int32)

    def offsets(self, step: int):
        """(base_f, base_i): element offsets of the copy that step `step` uses."""
        p = step % self.num_buffers
        return p * self.float_numel, p * self.int_numel

    def free(self) -> None:
        """Collective."""
        self.transport.free(self.i)
        self.transport.free(self.f)
