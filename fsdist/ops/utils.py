"""Small pieces every kernel launcher and kernel shares: per-row parameters, device flags."""
import functools

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from ..runtime import interpreting


@triton.jit
def load_row_param(ptr, scalar, offs, mask, DTYPE: tl.constexpr, PER_ROW: tl.constexpr):
    """One value per row: loaded from ptr[offs] (PER_ROW) or the scalar broadcast to offs' shape
    (and layout: ``offs * 0`` rather than tl.full, so Gluon kernels can call it too)."""
    if PER_ROW:
        return tl.load(ptr + offs, mask=mask, other=0).to(DTYPE)
    else:
        return (offs * 0).to(DTYPE) + scalar


@triton.jit
def pdl_wait_point(ON: tl.constexpr):
    """A programmatic dependent's wait placed later than its first instruction (``launch_select_filtered(late=True)``):
    with ON, wait here until the launch before it has ended and its writes are visible. Everything before it may
    read only what was complete when that launch started (it let this one launch only after its own wait)."""
    if ON:
        gdc_wait()


@triton.jit
def pdl_prologue(WAIT: tl.constexpr, TRIGGER: tl.constexpr):
    """The first instructions of a kernel in a chain of programmatic dependent launches (sm_90+; configs.pdl_*).
    WAIT: launched as a dependent (``pdl_args(device, wait=True)``): wait until the launch before it has ended and
    its writes are visible, before any memory access, so the early launch changes no result, only when the programs
    start.
    TRIGGER: the caller's next launch is such a dependent and may launch now (it still waits for this one's end)."""
    pdl_wait_point(WAIT)
    if TRIGGER:
        gdc_launch_dependents()


def pdl_supported(device) -> bool:
    """Whether programmatic dependent launch can run on ``device``: an NVIDIA GPU of compute capability 9 or more
    (griddepcontrol) with a CUDA 12.3+ build of torch, never under the interpreter (it has no griddepcontrol)."""
    if getattr(device, "type", None) != "cuda" or torch.version.hip is not None or interpreting():
        return False
    # (CUDA 12.3+: a programmatic launch inside CUDA-graph capture, which serving stacks use)
    if _version_pair(torch.version.cuda) < (12, 3):
        return False
    return device_capability(device)[0] >= 9


@functools.lru_cache(maxsize=8)
def _version_pair(version) -> tuple:
    """(major, minor) of a version string such as torch.version.cuda ("12.8"); (0, 0) for None. Cached by the
    string: a launch asks it several times a call."""
    return tuple(int(x) for x in (version or "0.0").split(".")[:2])


def device_capability(device) -> tuple:
    """``torch.cuda.get_device_capability(device)`` (a CUDA torch.device or index), asked once per device: a sample
    call asks it several times (PDL, the ws kernel, TMA), each a few µs of Python on a slow host. The cache is keyed
    by the query function too, so that a stand-in installed in its place (tests monkeypatch
    torch.cuda.get_device_capability) is asked, never a cached answer of the real one."""
    if not isinstance(device, int):  # (a device without an index means the current one: key by its index)
        device = torch.device(device)
        device = device.index if device.index is not None else torch.cuda.current_device()
    return _capability_of(torch.cuda.get_device_capability, device)


@functools.lru_cache(maxsize=32)
def _capability_of(query, index: int) -> tuple:
    return tuple(query(index))


def pdl_args(device, wait: bool = False, trigger: bool = False, late: bool = False) -> dict:
    """The launch arguments of a kernel with a ``pdl_prologue(PDL_WAIT, TRIGGER)``: its two switches and, where it
    waits, ``launch_pdl``. late (a kernel whose wait is a ``pdl_wait_point(PDL_LATE)`` further in, not its first
    instruction: launch_select_filtered's ``late``): its PDL_LATE switch too, and ``launch_pdl`` where it is on. All
    off where ``pdl_supported(device)`` is not (a CPU, the interpreter, an older GPU): the launches then run in
    order, as without PDL."""
    # (nothing asked: every switch is off whatever the device, so it is not asked)
    on = bool(wait or trigger or late) and pdl_supported(device)
    wait, trigger, late_on = bool(wait) and on, bool(trigger) and on, bool(late) and on
    return dict(PDL_WAIT=wait, TRIGGER=trigger, **({"PDL_LATE": late_on} if late else {}),
                **({"launch_pdl": True} if wait or late_on else {}))


@triton.jit
def flagged_count(flags_ptr, B, SCAN: tl.constexpr):
    """How many of the B flags (bool or int8, dense) are set: the fallback's kernels list a round's rows
    from it, and the tensor-parallel gated barrier decides from it whether to wait."""
    n = tl.zeros([], tl.int32)
    for start in range(0, B, SCAN):
        offs = start + tl.arange(0, SCAN)
        n += tl.sum(tl.load(flags_ptr + offs, mask=offs < B, other=0).to(tl.int32), axis=0)
    return n


@triton.jit
def global_ns(anchor):
    """The GPU's global nanosecond timer (PTX ``%globaltimer``), read anew at every call (not pure, so never hoisted
    or merged); anchor: any int32 scalar, the operand Triton's inline assembly needs."""
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [anchor], dtype=tl.int64, is_pure=False,
                                     pack=1)


@triton.jit
def sm_clock(anchor):
    """The SM's cycle counter (PTX ``%clock64``), read anew at every call (not pure: never hoisted or merged);
    anchor: any int32 scalar, as global_ns's. For launch_fused_ws's wait_probe (benchmarks)."""
    return tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l,r", [anchor], dtype=tl.int64, is_pure=False,
                                     pack=1)


@triton.jit
def stagger_start(pid, first_wave, delay_ns, ON: tl.constexpr):
    """Hold the odd programs among the first ``first_wave`` (one per SM) for delay_ns nanoseconds before they
    start (TileConfig.stagger_us). A memory-bound grid of many waves whose programs all take the same time finishes
    its tiles, and runs their epilogues, in lockstep: every SM computes while the memory idles. Two groups apart in
    time keep it streaming; the later programs inherit the offset from the SMs they land on. GPU only (PTX). The
    wait sleeps 256 ns a step and gives up after 4x the steps the delay needs, so even a timer that stood still could
    not hold a program for long."""
    if ON:
        if (pid < first_wave) & (pid % 2 == 1):
            t0 = global_ns(pid)
            steps = 0
            while (global_ns(pid) - t0 < delay_ns) & (steps < delay_ns // 64):
                tl.inline_asm_elementwise("nanosleep.u32 256; mov.u32 $0, 0;", "=r,r", [pid], dtype=tl.int32,
                                          is_pure=False, pack=1)
                steps += 1


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) of host integers, as triton.cdiv computes it. Host code calls this one: triton.cdiv is a constexpr
    function in Triton 3.6, ~2 µs a call on the host against ~0.01 (a filtered call made ~15 such calls: ~35 µs of its
    host time, docs/performance.md "Open questions")."""
    return (a + b - 1) // b


def next_pow2(n: int) -> int:
    """The smallest power of two >= n for host integers, as triton.next_power_of_2 computes it (0 for n = 0); ~3 µs
    a call there, again a constexpr function (see cdiv)."""
    n -= 1
    n |= n >> 1
    n |= n >> 2
    n |= n >> 4
    n |= n >> 8
    n |= n >> 16
    n |= n >> 32
    return n + 1


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
