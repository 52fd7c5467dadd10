"""A barrier that the device skips when a device integer says there is nothing to wait for.

The exact fallback of a filtered tensor-parallel call runs rounds whose number the host does not
know (how many rows fell back is a device integer; reading it would synchronise every call). With
peer stores each round is two barriers. ``nvshmem.core.barrier_all`` and symm_mem's handle barrier
are always entered once enqueued, so a rank whose call was filtered waited in them for peers whose
call was not (ranks that diverged), a hang with no timeout. This barrier takes the count and a
threshold: it is a full barrier when ``count > above`` and a no-op otherwise, decided on the device.
Ranks whose merged candidates agree compute the same count and so make the same decision; in a
step whose ranks diverged the merge flags no row anywhere, so the filtered ranks skip exactly the
barriers their peers never enqueued.

How it works: every rank owns a symmetric int64 *signal pad* with a slot per rank, plus one more slot
for its *epoch* (how many gated barriers it has passed; only its owner writes it, so the setup's
only fallible step is the agreed allocation). Passing one means: epoch += 1, store the new epoch
into slot ``rank`` of every rank's pad (a system-scope release), then poll the own pad until every
slot has reached the epoch (system-scope acquire). Slots only grow, so a fast rank that is already
in the next barrier (epoch + 1) still releases a slow one. A skipped barrier changes nothing, on
any rank. Everything stays on the device: CUDA-graph capturable, no host read.

The gate exists so that peers always arrive or all skip. For a peer that never arrives anyway (it
skipped a call, or stalls), a barrier with a status word attached (``attach_status``, on a GPU: the
interpreter has no device clock) gives up after a timeout and ORs a status bit into the caller's
step status instead of waiting forever. ``open()`` is the same barrier without a count: with
``Transport.device_barrier`` (the default on GPUs; FSDIST_DEVICE_BARRIER=0 turns it off) every step
barrier of a peer-store head is this one, so a skipped call costs the peers an error, not a hang
(docs/tensor_parallel.md, section 5).
"""
import math

import torch
import triton
import triton.language as tl

from ...ops.utils import flagged_count
from ...runtime import interpreting


@triton.jit
def _system_fence(x):
    """fence.acq_rel.sys: the stores of the kernels before this one (some into peers' memory over
    NVLink) are ordered before the signal that follows; the loads after the wait see the peers'.
    Passes x through (inline assembly needs an operand)."""
    return tl.inline_asm_elementwise("fence.acq_rel.sys;\n\tmov.b32 $0, $1;", "=r,r", [x], dtype=tl.int32,
                                     is_pure=False, pack=1)


@triton.jit
def _device_count(count_ptr, n, FLAGS: tl.constexpr, BLOCK: tl.constexpr):
    """The count: the int32 at count_ptr, or (FLAGS) how many of the n bools there are set."""
    if FLAGS:
        total = flagged_count(count_ptr, n, BLOCK)
    else:
        total = tl.load(count_ptr)
    return total


@triton.jit
def _globaltimer(x):
    """%globaltimer: the device's nanosecond clock (x: a dummy operand, as for the fence)."""
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [x], dtype=tl.int64, is_pure=False,
                                     pack=1)


# A slot value no epoch reaches: a rank that gave up waiting (timeout) stores it into its slot of every pad, so
# that every later barrier of every rank passes at once *and reports the timeout*, instead of the group going on
# with the ranks' epochs out of step (a lagging rank's next barrier would otherwise be satisfied by the peer's
# earlier arrival, with no sync and no error).
POISON = tl.constexpr(1 << 62)


@triton.jit
def _pass_barrier(pad_table, rank, status_ptr, timeout_ns, status_bit, WORLD: tl.constexpr, FENCE: tl.constexpr,
                  TIMEOUT: tl.constexpr, REPORT: tl.constexpr):
    """Arrive (epoch + 1 into slot ``rank`` of every pad), then wait for every rank's slot of the own pad to
    reach the epoch. TIMEOUT: give up once ``timeout_ns`` have passed since the arrival, OR ``status_bit`` into
    both words of ``status_ptr`` (the caller's status: [0] sticky, read by the merge that follows, so the rows
    of this step come back -1; [1] this step's) and poison this rank's slot everywhere (POISON): a peer that
    never comes (it skipped a call, or stalls) then costs an error on every rank, not a hang. A poisoned slot
    seen later reports the timeout the same way. REPORT: a status word is attached (TIMEOUT needs the device
    clock besides, so the interpreter reports poisoned slots without ever timing out)."""
    own = tl.load(pad_table + rank).to(tl.pointer_type(tl.int64))
    epoch_ptr = own + WORLD
    epoch = tl.load(epoch_ptr) + 1
    tl.store(epoch_ptr, epoch)
    # One system-scope fence, then relaxed (strong) atomics: a fence followed by a strong write is a release
    # pattern in PTX's memory model, so the arrivals need no release of their own (each would be a fence
    # more: WORLD of them per barrier). Likewise the polls below are relaxed and the fence after the wait
    # makes them an acquire pattern.
    if FENCE:
        _system_fence(rank)
    for p in tl.static_range(WORLD):  # arrive: slot `rank` of every pad (this rank's too)
        pad = tl.load(pad_table + p).to(tl.pointer_type(tl.int64))
        tl.atomic_max(pad + rank, epoch, sem="relaxed", scope="sys")
    if TIMEOUT:
        t0 = _globaltimer(rank)
    missing = tl.zeros([], tl.int32)
    for p in tl.static_range(WORLD):  # wait: every rank's slot of this pad
        # Adding 0 at system scope: a strong read, never served from a stale cache line (the fence after
        # the wait orders the loads that follow).
        seen = tl.atomic_add(own + p, 0, sem="relaxed", scope="sys")
        if TIMEOUT:
            waiting = (seen < epoch) & (_globaltimer(rank) - t0 <= timeout_ns)
            while waiting:
                seen = tl.atomic_add(own + p, 0, sem="relaxed", scope="sys")
                waiting = (seen < epoch) & (_globaltimer(rank) - t0 <= timeout_ns)
        else:
            while seen < epoch:
                seen = tl.atomic_add(own + p, 0, sem="relaxed", scope="sys")
        missing += ((seen < epoch) | (seen >= POISON)).to(tl.int32)
    if REPORT:
        if missing > 0:
            tl.atomic_or(status_ptr, status_bit)
            tl.atomic_or(status_ptr + 1, status_bit)
            for p in tl.static_range(WORLD):
                pad = tl.load(pad_table + p).to(tl.pointer_type(tl.int64))
                tl.atomic_max(pad + rank, POISON, sem="release", scope="sys")
    if FENCE:
        _system_fence(rank)


@triton.jit
def gated_barrier_kernel(count_ptr, n, above, pad_table, rank, status_ptr, timeout_ns, status_bit,
                         WORLD: tl.constexpr, FENCE: tl.constexpr, FLAGS: tl.constexpr = False,
                         OPEN: tl.constexpr = False, TIMEOUT: tl.constexpr = False, REPORT: tl.constexpr = False,
                         BLOCK: tl.constexpr = 256):
    """One program. count_ptr: int32 [1] (the device count), or (FLAGS) bool [n] whose set entries are
    the count; OPEN: no count, always a barrier. pad_table: int64 [WORLD] base addresses of every rank's
    pad (int64 [WORLD + 1] each: a slot per rank, then the owner's epoch). TIMEOUT: see _pass_barrier."""
    if OPEN:
        _pass_barrier(pad_table, rank, status_ptr, timeout_ns, status_bit, WORLD, FENCE, TIMEOUT, REPORT)
    else:
        if _device_count(count_ptr, n, FLAGS, BLOCK) > above:
            _pass_barrier(pad_table, rank, status_ptr, timeout_ns, status_bit, WORLD, FENCE, TIMEOUT, REPORT)


class GatedBarrier:
    """The signal pad and epoch of one transport's gated barriers.

    Construction is collective (a symmetric allocation, zeroed, then one ordinary barrier so no
    rank signals into a pad that is still being zeroed). ``transport`` must have peer stores.
    """

    def __init__(self, transport):
        if not transport.peer_stores:
            raise ValueError(f"a gated barrier needs a transport with peer stores, not {transport.name!r}")
        self.transport = transport
        self.world = transport.world_size
        self.rank = transport.rank
        self.pad = transport.alloc(self.world + 1, torch.int64)  # the slots, then this rank's epoch
        self.pad.local.zero_()
        transport.barrier()

    @property
    def epoch(self) -> torch.Tensor:
        """How many gated barriers this rank has passed (int64 [1], a view into the pad: on the device)."""
        return self.pad.local[self.world:]

    def attach_status(self, status: torch.Tensor, bit: int, timeout_s: float) -> None:
        """From now on a barrier that waits more than ``timeout_s`` for a peer gives up and ORs ``bit`` into
        ``status[1]`` (int32 [2] on the pad's device: a step's status word, see ops/step_check.py). On a GPU
        only (the interpreter has no device clock; there the wait has no limit)."""
        if status.dtype != torch.int32 or status.numel() < 2 or status.device != self.pad.local.device:
            raise ValueError(f"status must be int32 [2] on {self.pad.local.device}")
        if not (timeout_s > 0 and math.isfinite(timeout_s)):
            raise ValueError(f"timeout_s must be a finite number of seconds > 0, got {timeout_s}")
        self._status, self._bit, self._timeout_ns = status, int(bit), int(timeout_s * 1e9)

    def __call__(self, count: torch.Tensor, above: int) -> None:
        """A full barrier over the group when the device count exceeds ``above``; nothing otherwise.
        ``count``: one int32, or a bool vector whose set entries are counted (in the kernel: e.g. the
        fallback's row flags, with no reduction launched before). Every rank must enqueue the same
        sequence of gated barriers with counts that make the same decision (a rank that skips may
        also not enqueue)."""
        self._check_pad()
        check_count(count, self.pad.local.device)
        self._launch(count, count.numel(), int(above), flags=count.dtype == torch.bool, open_=False)

    def open(self) -> None:
        """A full barrier over the group, always (the step's exchange and settle when the transport's
        ``device_barrier`` is on): stream ordered, graph-capturable, with the attached timeout."""
        self._check_pad()
        self._launch(self.pad.local, 0, 0, flags=False, open_=True)

    def _check_pad(self):
        if self.pad.freed:
            raise RuntimeError(f"{self.transport.name} transport: the gated barrier's pad was freed")

    def _launch(self, count, n, above, flags, open_):
        status = getattr(self, "_status", None)
        report = status is not None
        timeout = report and not interpreting()  # the interpreter has no device clock
        gated_barrier_kernel[(1,)](count, n, above, self.pad.peer_ptrs, self.rank,
                                   status if report else self.pad.local,
                                   self._timeout_ns if timeout else 0, self._bit if report else 0,
                                   WORLD=self.world, FENCE=not interpreting(), FLAGS=flags, OPEN=open_,
                                   TIMEOUT=timeout, REPORT=report, num_warps=1)


def check_count(count: torch.Tensor, device: torch.device) -> None:
    """Raise ValueError unless ``count`` is a gate's count on ``device``: one int32, or a contiguous 1-D bool vector."""
    ok = isinstance(count, torch.Tensor) and count.device == device and (
        (count.dtype == torch.int32 and count.numel() == 1)
        or (count.dtype == torch.bool and count.dim() == 1 and count.is_contiguous()))  # the kernel reads it densely
    if not ok:
        what = (f"{count.numel()} x {count.dtype} on {count.device}" if isinstance(count, torch.Tensor)
                else type(count).__name__)
        raise ValueError(f"count must be one int32 or a contiguous 1-D bool tensor on {device}, got {what}")


def host_count(count: torch.Tensor) -> int:
    """The count on the host (a read: a synchronisation on a GPU): the int32, or how many bools are set."""
    return int(count.sum()) if count.dtype == torch.bool else int(count)
