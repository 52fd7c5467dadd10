"""The exchange buffer's copy is chosen by a device counter (what makes the head CUDA-graph safe).

Run with ``mpirun -n 2 python -m pytest --with-mpi tests/tensor_parallel`` (or -n 4). On CPU
the peer-store transport is ``shm``: the kernels, under Triton's interpreter, store into
the other processes' shared memory exactly as they store into NVSHMEM / symm_mem peers
on GPUs, and read the copy from ``head.step_counter``.

Before each step every rank fills both copies of its own buffer with a sentinel; after
the step, the copy ``counter & 1`` (counter value before the step) must hold every rank's
entries for the batch rows and the other copy must be untouched, the counter must have
advanced by one, and the tokens must be those of the reference (fsdist.sample on the
full weight for ``candidates``, the float64 mirror of Alg. I.4 for ``group_logmass``).
Starting the counter at 1 while the host step is 0 shows that the device counter, not
the host step, decides. The collective transport keeps a single copy.
"""
import itertools

import pytest
import torch
import torch.distributed as dist

import fsdist
from fsdist.tensor_parallel import HeadTestSeam
from tp_helpers import (ALL_TRANSPORTS, assert_same_on_all_ranks, gather_objects, grid, problem,
                        reference_group_logmass, tp_ranges)

mpi = pytest.mark.mpi(min_size=2)
V, D, B = 1000, 32, 12
SENT = -7


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    dist.barrier()


def _check_tokens(reduction, out, h, W, seeds, offset, world):
    if reduction == "candidates":
        ref = fsdist.sample(h, W, seed=seeds, offset=offset, vocab_size=V)
        assert torch.equal(out.tokens, ref.tokens)
    else:
        tok, _, _, margin = reference_group_logmass(h, W, V, tp_ranges(V, world), 1.0, seeds, offset)
        decided = margin > 1e-4
        assert int(decided.sum()) >= B - 1
        assert torch.equal(out.tokens.cpu()[decided], tok[decided])


@mpi
@grid("transport,reduction,start", list(itertools.product(ALL_TRANSPORTS, ["candidates", "group_logmass"], [0, 1])),
      lambda transport, reduction, start: (ALL_TRANSPORTS.index(transport) + (reduction == "group_logmass")) % 2 == 1
      and start == (transport != "collective"),
      "the counter's parity does not depend on the group size: beyond 2 ranks each transport and each reduction runs "
      "once (every rank's slots of both layouts), the peer-store one from counter 1 (the device counter, not the host "
      "step, picks the copy)")
def test_device_counter_alternates_the_exchange_copy(dist_ctx, transport, reduction, start):
    dev, world = dist_ctx.device, dist_ctx.world_size
    W, h = problem(V, D, B, torch.float32, seed=41, scale=3.0, device=dev)
    seam = HeadTestSeam()
    head = fsdist.ShardedFlashLMHead(D, V, transport=transport, reduction=reduction, params_dtype=torch.float32,
                                     device=dev, max_batch_size=B, test_seam=seam)
    head.load_full_weight(W)
    bufs = seam.step_buffers()
    peer = head.transport.peer_stores
    assert bufs.num_buffers == (2 if peer else 1)  # collective: one copy, see step_buffers.py
    counter = head.step_counter
    assert counter.dtype == torch.int64 and counter.numel() == 1 and counter.device == dev
    counter.fill_(start)  # on every rank alike: ranks must keep equal counters
    seeds = torch.arange(B, dtype=torch.int64, device=dev) * 31 + 7
    cap = head.max_batch_size
    used = []
    for s in range(5):
        for k in range(bufs.num_buffers):
            bufs.copy(k)[1].fill_(SENT)
        _sync(dev)  # nobody stores into a peer's buffer before the peer has filled it
        before = int(counter.item())
        out = head(h, seed=seeds, offset=500 + s)
        _sync(dev)  # every rank's stores of this step have landed
        assert int(counter.item()) == before + 1
        k = (before & 1) if peer else 0
        used.append(k)
        ints = [bufs.copy(j)[1].view(world, -1, cap) for j in range(bufs.num_buffers)]
        # Per rank: the entry slots (tiles, or the group record's token), then the call's header:
        # row fingerprints and the 4-word step record (fsdist.ops.step_check).
        # (the candidate layout has room for kept logits' ids after the winners: a plain call leaves it)
        n_entries = -(-head.partition.rows // head.block_v) if reduction == "candidates" else 1
        entries, fps, record = ints[k][:, :n_entries], ints[k][:, -2], ints[k][:, -1]
        assert bool((entries[:, :, :B] != SENT).all()), f"step {s}: copy {k} lacks some rank's entries"
        assert bool((entries[:, :, B:] == SENT).all()), f"step {s}: rows past the batch were written"
        assert bool((fps[:, :B] != SENT).all()) and bool((fps[:, B:] == SENT).all()), f"step {s}: fingerprints"
        assert record[:, 1].tolist() == [B] * world, f"step {s}: step records {record[:, :4].tolist()}"
        assert bool((record[:, 4:] == SENT).all())
        if peer:
            assert bool((ints[1 - k] == SENT).all()), f"step {s}: copy {1 - k} was written"
        _check_tokens(reduction, out, h, W, seeds, 500 + s, world)
        assert_same_on_all_ranks(out)
    assert head.step == 5
    if peer:
        assert used == [(start + s) & 1 for s in range(5)]  # alternates, from the device counter
    head.close()


@mpi
def test_num_buffers_one_is_a_single_copy(dist_ctx):
    """The race test's knob: one copy, whatever the counter (strides 0).

    One copy is exactly what test_step_buffers shows to be racy: a fast rank's next stage 1
    may overwrite the slot a slow rank is still reducing. So every step here is fenced by
    a barrier (each rank has read its buffer before any rank stores the next step), and
    the checks are gathered before asserting, so a failure on one rank cannot leave the
    others waiting in a collective it skipped.
    """
    from tp_helpers import PEER_TRANSPORTS

    dev = dist_ctx.device
    W, h = problem(V, D, B, torch.float32, seed=42, scale=3.0, device=dev)
    seam = HeadTestSeam(num_buffers=1)
    head = fsdist.ShardedFlashLMHead(D, V, transport=PEER_TRANSPORTS[0], params_dtype=torch.float32, device=dev,
                                     max_batch_size=B, test_seam=seam)
    head.load_full_weight(W)
    bufs = seam.step_buffers()
    assert bufs.num_buffers == 1 and bufs.parity.stride_f == 0 and bufs.parity.stride_i == 0
    wrong = []
    for s in range(2):
        out = head(h, seed=3, offset=s)
        _sync(dev)  # one copy: nobody starts step s+1 until everyone has reduced step s
        if not torch.equal(out.tokens, fsdist.sample(h, W, seed=3, offset=s, vocab_size=V).tokens):
            wrong.append(s)
    counter = int(head.step_counter.item())
    head.close()
    everyone = gather_objects((wrong, counter))
    assert all(w == [] for w, _ in everyone), f"steps with wrong tokens, per rank: {everyone}"
    assert all(c == 2 for _, c in everyone), f"step counters, per rank: {everyone}"
