"""Whether a tensor-parallel group is still in step: the device status word, brought home lazily.

The merge kernels compare every rank's call header with their own (``fsdist.ops.step_check``)
and OR what they find into an int32 status word on the device (folded into a sticky word
when each step ends). This module brings that word to the host **without synchronising**: after each step the word is copied into
pinned host memory on the stream (``non_blocking``) and an event is recorded; a later call
looks at the copy once its event has completed (``Event.query`` does not block). On a CPU
device the copy is immediate.

So a divergence is *detected* on every rank in the step where it happens (those tokens are
-1, never wrong), and *raised* on every rank as :class:`TensorParallelMismatchError` as soon
as the host sees it: at once on CPU, one or two calls later on a GPU, or right away with
``head.check()`` (which synchronises). Because the status word is sticky, every later step
returns -1 and raises too: a group that diverged once cannot be trusted again; build a new
head (every rank). Under CUDA-graph capture nothing is copied (the graph would freeze the
copy's bookkeeping); call ``head.check()`` between replays to look.
"""
from typing import List, Optional

import torch

from ..ops.step_check import describe_status, new_status


class TensorParallelMismatchError(RuntimeError):
    """The ranks of a tensor-parallel group did not make the same call (see the message)."""


class StepMonitor:
    """Owns the status word of one head and the pinned copies that bring it to the host."""

    def __init__(self, device: torch.device, where: str):
        self.device = torch.device(device)
        self.where = where  # e.g. "rank 1 of 2": for the error message
        self.status = new_status(self.device)
        self.seen = 0  # the latest status word the host knows
        self._cuda = self.device.type == "cuda"
        self._slots: Optional[torch.Tensor] = None
        self._events: List[Optional["torch.cuda.Event"]] = [None, None]
        self._next = 0
        if self._cuda:
            self._slots = torch.zeros(2, dtype=torch.int32, pin_memory=True)

    def after_step(self) -> None:
        """Queue the copy of the status word behind this step (no synchronisation)."""
        if not self._cuda:
            self.seen |= int(self.status[0])  # a CPU tensor (folded by end_step): reading it waits for nothing
            return
        if torch.cuda.is_current_stream_capturing():
            return
        k = self._next
        self._slots[k:k + 1].copy_(self.status[:1], non_blocking=True)
        ev = torch.cuda.Event()
        ev.record()
        self._events[k] = ev
        self._next = 1 - k

    def poll(self) -> int:
        """Fold in every copy that has landed; returns the status word known so far.
        While a CUDA graph is being captured nothing is looked at: querying an event is not
        permitted then (it would invalidate the capture); the next eager call looks."""
        if self._cuda and not torch.cuda.is_current_stream_capturing():
            for k in (self._next, 1 - self._next):  # older copy first
                ev = self._events[k]
                if ev is not None and ev.query():
                    self.seen |= int(self._slots[k])
                    self._events[k] = None
        return self.seen

    def check(self) -> int:
        """The status word now (synchronises with the device)."""
        self.seen |= int(self.status[0].item()) | int(self.status[1].item())
        return self.seen

    def raise_if_mismatched(self, bits: Optional[int] = None) -> None:
        bits = self.seen if bits is None else bits
        if bits:
            raise TensorParallelMismatchError(
                f"ShardedFlashLMHead ({self.where}): the tensor-parallel ranks diverged: {describe_status(bits)}. "
                "Every rank must call forward the same number of times, with the same batch size, flags and "
                "per-row parameters. The rows of the mismatched step and of every later step returned token -1; "
                "build a new head on every rank.")
