"""The double-buffer half a kernel uses, read from a device counter (see sampler.DeviceParity).

Every kernel that reads or writes a tensor-parallel exchange buffer calls this on its
element offsets, so a CUDA-graph replay uses the half of the step it replays.
"""
import triton
import triton.language as tl


@triton.jit
def parity_offsets(off_f, off_i, parity_ptr, stride_f, stride_i, DEVICE_PARITY: tl.constexpr):
    """(off_f, off_i) moved to the half picked by counter & 1; unchanged without DEVICE_PARITY."""
    if DEVICE_PARITY:
        par = (tl.load(parity_ptr) & 1).to(tl.int32)
        off_f += par * stride_f
        off_i += par * stride_i
    return off_f, off_i
