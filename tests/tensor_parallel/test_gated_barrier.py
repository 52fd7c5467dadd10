"""The gated barrier (``fsdist/tensor_parallel/transports/gated_barrier.py``) on peer-store buffers.

On CPU its kernel runs under Triton's interpreter on ``shm`` segments: the spin really polls a pad that
other processes store into. (The ``shm`` transport itself gates on the host, where the count is free to
read; these tests build the device barrier on it explicitly.) On GPUs the same tests run on nvshmem and
symm_mem buffers.

What must hold: (1) an open gate is a full barrier: a rank's stores before it are seen by every rank
after it, even when that rank comes late (a test that would fail without the wait: the power case);
(2) a closed gate costs nothing and changes nothing, on any rank; (3) a rank that skips a closed
barrier its peers never enqueue (the diverged step) leaves the group in step for the next open one;
(4) the count is compared with ``above`` as ``count > above``.
"""
import time

import pytest
import torch
import torch.distributed as dist
import triton
import triton.language as tl

from fsdist.tensor_parallel.transports import make_transport
from fsdist.tensor_parallel.transports.gated_barrier import GatedBarrier
from tp_helpers import PEER_TRANSPORTS, gather_objects

mpi = pytest.mark.mpi(min_size=2)
LATE = 0.5  # seconds the late rank waits before its stores: far longer than a barrier


@triton.jit
def _store_into_peers(table, value, slot, WORLD: tl.constexpr):
    """value into element ``slot`` of every rank's buffer (int64 each), through the peer table."""
    for p in tl.static_range(WORLD):
        peer = tl.load(table + p).to(tl.pointer_type(tl.int64))
        tl.store(peer + slot, value)


def _setup(ctx, name):
    transport = make_transport(name, dist.group.WORLD, ctx.device)
    data = transport.alloc(ctx.world_size, torch.int64)
    data.local.fill_(-1)
    gate = GatedBarrier(transport)  # its own barrier also covers data's fill
    return transport, data, gate


def _count(n, ctx):
    return torch.tensor([n], dtype=torch.int32, device=ctx.device)


def _sync(ctx):
    if ctx.device.type == "cuda":
        torch.cuda.synchronize(ctx.device)


def _rounds(ctx, name, open_gate: bool, late_rank: int, rounds: int = 3):
    """Each round every rank stores round * 10 + its rank into slot `rank` of every buffer (late_rank
    after LATE seconds), passes the gated barrier, and reads its own buffer."""
    transport, data, gate = _setup(ctx, name)
    seen = []
    for r in range(rounds):
        if ctx.rank == late_rank:
            _sync(ctx)
            time.sleep(LATE)
        _store_into_peers[(1,)](data.peer_ptrs, r * 10 + ctx.rank, ctx.rank, WORLD=ctx.world_size)
        gate(_count(1 if open_gate else 0, ctx), 0)
        seen.append(data.local.cpu().tolist())
        transport.barrier()  # nobody stores the next round before everyone has read this one
    epoch = int(gate.epoch.item())
    transport.close()
    return seen, epoch


@mpi
@pytest.mark.parametrize("name", PEER_TRANSPORTS)
def test_open_gate_waits_for_a_late_rank(dist_ctx, name):
    late = dist_ctx.world_size - 1
    seen, epoch = _rounds(dist_ctx, name, open_gate=True, late_rank=late)
    everyone = gather_objects((seen, epoch))
    want = [[r * 10 + q for q in range(dist_ctx.world_size)] for r in range(3)]
    for rank, (got, ep) in enumerate(everyone):
        assert got == want, f"rank {rank} read {got}, want {want}"
        assert ep == 3, f"rank {rank} passed {ep} gated barriers, want 3"


@mpi
@pytest.mark.parametrize("name", PEER_TRANSPORTS)
def test_closed_gate_does_not_wait_so_the_check_above_can_fail(dist_ctx, name):
    """The power case of the test above: with the gate closed nobody waits for the late rank, so the others
    read its slot before it stored there (its previous round's value, or -1), and nobody's epoch moves."""
    late = dist_ctx.world_size - 1
    seen, epoch = _rounds(dist_ctx, name, open_gate=False, late_rank=late)
    everyone = gather_objects((seen, epoch))
    for rank, (got, ep) in enumerate(everyone):
        assert ep == 0, f"rank {rank}: a closed gate moved the epoch to {ep}"
        if rank != late:
            stale = [row[late] for row in got]
            assert stale == [-1, 0 * 10 + late, 1 * 10 + late], f"rank {rank} read the late slot as {stale}"


@mpi
@pytest.mark.parametrize("name", PEER_TRANSPORTS)
def test_a_closed_gate_on_some_ranks_only_keeps_the_group_in_step(dist_ctx, name):
    """The diverged step: rank 0 enqueues two closed barriers the others never see, then every rank passes an
    open one (which must not be satisfied by a stale signal: the late rank's store must be seen)."""
    ctx = dist_ctx
    transport, data, gate = _setup(ctx, name)
    if ctx.rank == 0:
        gate(_count(0, ctx), 0)
        gate(_count(3, ctx), 3)  # count > above is false at equality
    late = ctx.world_size - 1
    if ctx.rank == late:
        _sync(ctx)
        time.sleep(LATE)
    _store_into_peers[(1,)](data.peer_ptrs, 7, ctx.rank, WORLD=ctx.world_size)
    gate(_count(4, ctx), 3)
    got = (data.local.cpu().tolist(), int(gate.epoch.item()))
    transport.close()
    everyone = gather_objects(got)
    for rank, (vals, ep) in enumerate(everyone):
        assert vals == [7] * ctx.world_size and ep == 1, f"rank {rank}: {vals}, epoch {ep}"


@mpi
@pytest.mark.parametrize("name", PEER_TRANSPORTS)
def test_bad_counts_are_refused(dist_ctx, name):
    transport, data, gate = _setup(dist_ctx, name)
    try:
        for bad in (torch.zeros(1, dtype=torch.int64, device=dist_ctx.device),
                    torch.zeros(2, dtype=torch.int32, device=dist_ctx.device)):
            with pytest.raises(ValueError, match="count must be one int32"):
                gate(bad, 0)
    finally:
        transport.close()
    with pytest.raises(RuntimeError, match="pad was freed"):
        gate(_count(1, dist_ctx), 0)
