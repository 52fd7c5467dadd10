"""Which copy of a double buffer a launch uses, decided on the device.

A tensor-parallel head keeps two copies of its exchange buffer and alternates them by
step (so a fast rank's next step never overwrites what a slow rank is still reading).
The copy must come from a counter in device memory, not from a host integer: a host
integer would be frozen into a captured CUDA graph, and every replay would use the
same copy. Every kernel that reads or writes such a buffer adds ``(counter & 1) *
stride`` to its element offsets through :func:`parity_offsets`.
"""
from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl


@dataclass(frozen=True)
class DeviceParity:
    """The counter (one int64 on the buffers' device) and the distance between the two copies,
    in elements of the fp32 and of the int32 buffer. Strides of 0 mean a single copy."""

    counter: torch.Tensor
    stride_f: int
    stride_i: int


def parity_args(parity: Optional[DeviceParity], dummy: torch.Tensor):
    """(pointer, stride_f, stride_i, DEVICE_PARITY) kernel arguments; dummy stands in for no counter."""
    if parity is None:
        return dummy, 0, 0, False
    return parity.counter, parity.stride_f, parity.stride_i, True


@triton.jit
def parity_offsets(off_f, off_i, parity_ptr, stride_f, stride_i, DEVICE_PARITY: tl.constexpr):
    """(off_f, off_i) moved to the copy picked by counter & 1; unchanged without DEVICE_PARITY."""
    if DEVICE_PARITY:
        par = (tl.load(parity_ptr) & 1).to(tl.int32)
        off_f += par * stride_f
        off_i += par * stride_i
    return off_f, off_i
