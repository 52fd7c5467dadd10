"""Small pieces every kernel launcher and kernel shares: per-row parameters, device flags,
programmatic dependent launch."""
import functools
import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from ..runtime import interpreting


@triton.jit
def load_row_param(ptr, scalar, offs, mask, DTYPE: tl.constexpr, PER_ROW: tl.constexpr):
    """One value per row: loaded from ptr[offs] (PER_ROW) or the scalar broadcast to offs' shape
    (and layout: ``offs * 0`` rather than tl.full, so Gluon kernels can call it too)."""
    if PER_ROW:
        return tl.load(ptr + offs, mask=mask, other=0).to(DTYPE)
    else:
        return (offs * 0).to(DTYPE) + scalar


def row_param_args(x, dummy: torch.Tensor):
    """(pointer, scalar, per_row) kernel arguments for a scalar-or-[B]-tensor row parameter.

    dummy: any tensor on the kernel's device, passed as the pointer of a scalar parameter
    (the kernel never reads it then)."""
    if isinstance(x, torch.Tensor):
        return x, 0, True
    return dummy, x, False


def fast_log_ok(device: torch.device) -> bool:
    """The GPU's lg2.approx is available (NVIDIA CUDA); the interpreter and ROCm use tl.log."""
    return device.type == "cuda" and torch.version.hip is None


def pinned_products_ok(device: torch.device) -> bool:
    """A product can be given its own rounding with PTX ``mul.rn.f32`` (NVIDIA CUDA), so that no
    compiler fuses it into a multiply-add (``epilogue.rounded_mul``); the interpreter rounds every
    numpy operation on its own anyway."""
    return device.type == "cuda" and torch.version.hip is None


def sm_count(device: torch.device) -> int:
    """The device's streaming multiprocessors (persistent grids size themselves by it)."""
    return _sm_count_of(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _sm_count_of(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


# Programmatic dependent launch (PDL, sm_90+). The small kernels after stage 1 (merge, select_filtered, the
# fallback's rounds) are launched with it: the GPU may start such a kernel while the one before it in the
# stream drains, so its launch latency hides behind that kernel's tail (in a CUDA graph as in eager calls).
# Each such kernel calls ``wait_for_prior(PDL)`` first, in every program, before it touches memory: that
# waits until the kernel before it has finished and its writes are visible, so the results are those of
# ordinary stream order. (A PDL kernel that could exit without waiting would let the next one overtake the
# kernel before it; the wait comes first for that reason too.) FSDIST_PDL=0 in the environment, or PDL =
# False here, launches them as before (benchmarks A/B it).
PDL = os.environ.get("FSDIST_PDL", "1") != "0"


def pdl_ok(device: torch.device) -> bool:
    """Launch the small kernels with programmatic dependent launch on this device: an NVIDIA GPU of
    compute capability 9.0 or more, the compiled path (the interpreter has no griddepcontrol), PDL on."""
    if not PDL or device.type != "cuda" or torch.version.hip is not None or interpreting():
        return False
    return _capability_of(device.index if device.index is not None else torch.cuda.current_device()) >= (9, 0)


@functools.lru_cache(maxsize=None)
def _capability_of(index: int):
    return torch.cuda.get_device_capability(index)


@triton.jit
def wait_for_prior(PDL: tl.constexpr):
    """With PDL: wait for the kernel before this one in the stream to finish and its writes to be visible
    (``griddepcontrol.wait``; a no-op when the kernel was launched without PDL). Call it first."""
    if PDL:
        gdc_wait()
