"""The one documented door that tests and benchmarks have into a head's internals.

Production code never needs it. Pass a :class:`HeadTestSeam` to
``ShardedFlashLMHead(..., test_seam=seam)``; the head fills in the back references.

* ``num_buffers``: copies of the exchange buffer (2, the default; 1 exists only so a
  test can show that a single copy races, see step_buffers.py).
* ``hook``: called as ``hook(point, step)`` at ``"before_stage1"`` and
  ``"before_stage2"`` of every step, ``step`` being the host-side count (delay a rank,
  time the pieces of a step).
* ``step_buffers()``: the live exchange buffers (``StepBuffers``), to look at copies.
* ``merge_ends_step``: True (the default) lets a plain step's merge end the step (its last
  program advances the device counter); False launches end_step after it, as every step did
  before 2026-11-27: the A/B of ``bench/tp_sweep.py --ab-merge-end-step``.
"""
from dataclasses import dataclass, field
from typing import Callable, Optional


@dataclass
class HeadTestSeam:
    num_buffers: int = 2
    hook: Optional[Callable[[str, int], None]] = None
    merge_ends_step: bool = True
    reduction: Optional[object] = field(default=None, repr=False)  # set by the head

    def step_buffers(self):
        if self.reduction is None:
            raise RuntimeError("this seam is not attached to a head yet")
        return self.reduction.buffers

    def call(self, point: str, step: int) -> None:
        if self.hook is not None:
            self.hook(point, step)
