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

Like every device barrier it waits without a timeout for peers that never arrive; the gate exists
so that they always arrive or all skip.
"""
import torch
import triton
import triton.language as tl

from ...runtime import interpreting


@triton.jit
def _system_fence(x):
    """fence.acq_rel.sys: the stores of the kernels before this one (some into peers' memory over
    NVLink) are ordered before the signal that follows; the loads after the wait see the peers'.
    Passes x through (inline assembly needs an operand)."""
    return tl.inline_asm_elementwise("fence.acq_rel.sys;\n\tmov.b32 $0, $1;", "=r,r", [x], dtype=tl.int32,
                                     is_pure=False, pack=1)


@triton.jit
def gated_barrier_kernel(count_ptr, above, pad_table, rank, WORLD: tl.constexpr, FENCE: tl.constexpr):
    """One program. count_ptr: int32 [1] (the device count); pad_table: int64 [WORLD] base addresses
    of every rank's pad (int64 [WORLD + 1] each: a slot per rank, then the owner's epoch)."""
    if tl.load(count_ptr).to(tl.int64) > above:
        own = tl.load(pad_table + rank).to(tl.pointer_type(tl.int64))
        epoch_ptr = own + WORLD
        epoch = tl.load(epoch_ptr) + 1
        tl.store(epoch_ptr, epoch)
        if FENCE:
            _system_fence(rank)
        for p in tl.static_range(WORLD):  # arrive: slot `rank` of every pad (this rank's too)
            pad = tl.load(pad_table + p).to(tl.pointer_type(tl.int64))
            tl.atomic_max(pad + rank, epoch, sem="release", scope="sys")
        for p in tl.static_range(WORLD):  # wait: every rank's slot of this pad
            # Adding 0 with acquire semantics at system scope: the compiler emits ld.acquire.sys (a load that
            # is never served from a stale cache line and orders the loads after it).
            seen = tl.atomic_add(own + p, 0, sem="acquire", scope="sys")
            while seen < epoch:
                seen = tl.atomic_add(own + p, 0, sem="acquire", scope="sys")
        if FENCE:
            _system_fence(rank)


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

    def __call__(self, count: torch.Tensor, above: int) -> None:
        """A full barrier over the group when the device integer ``count`` (int32, one element)
        exceeds ``above``; nothing otherwise. Every rank must enqueue the same sequence of gated
        barriers with counts that make the same decision (a rank that skips may also not enqueue)."""
        if self.pad.freed:
            raise RuntimeError(f"{self.transport.name} transport: the gated barrier's pad was freed")
        if count.dtype != torch.int32 or count.numel() != 1 or count.device != self.pad.local.device:
            raise ValueError(f"count must be one int32 on {self.pad.local.device}, got {count.numel()} x "
                             f"{count.dtype} on {count.device}")
        gated_barrier_kernel[(1,)](count, int(above), self.pad.peer_ptrs, self.rank, WORLD=self.world,
                                   FENCE=not interpreting(), num_warps=1)
