"""The gated barrier (``fsdist/tensor_parallel/transports/gated_barrier.py``) on peer-store buffers.

On CPU its kernel runs under Triton's interpreter on ``shm`` segments: the spin really polls a pad that
other processes store into. (The ``shm`` transport itself gates on the host, where the count is free to
read; these tests build the device barrier on it explicitly.) On GPUs the same tests run on nvshmem and
symm_mem buffers.

What must hold: (1) an open gate is a full barrier: a rank's stores before it are seen by every rank
after it, even when that rank comes late, and back to back, when a fast rank is already one barrier
ahead; (2) a closed gate costs nothing and changes nothing, on any rank (the power case: without the
wait the first check fails); (3) a rank that skips a closed barrier its peers never enqueue (the
diverged step) leaves the group in step for the next open one; (4) the count is compared with
``above`` as ``count > above``; (5) the head's fallback rounds through the kernel are exact and
survive a diverged step.
"""
import time

import pytest
import torch
import torch.distributed as dist
import triton
import triton.language as tl

import fsdist
from fsdist.tensor_parallel.transports import make_transport
from fsdist.tensor_parallel.transports.gated_barrier import GatedBarrier
from tp_helpers import ALL_TRANSPORTS, PEER_TRANSPORTS, gather_objects, grid, two_ranks_only

mpi = pytest.mark.mpi(min_size=2)
LATE = 0.5  # seconds the late rank waits before its stores: far longer than a barrier
# Where 4 ranks' part of the head tests (the last ones below) is covered:
HEAD_AT_TWO_RANKS = ("the device kernel in place of the host gate does not depend on the group size: barriers of "
                     "four ranks (one late, skipping or poisoned) are shown on the kernel by this file's first "
                     "tests, the head's fallback at 4 shards by test_filters_tp.py, a filter on one rank of four by "
                     "test_divergence.py::test_filters_on_one_rank_only")


@triton.jit
def _store_into_peers(table, value, slot, WORLD: tl.constexpr):
    """value into element ``slot`` of every rank's buffer (int64 each), through the peer table."""
    for p in tl.static_range(WORLD):
        peer = tl.load(table + p).to(tl.pointer_type(tl.int64))
        tl.store(peer + slot, value)


def _setup(ctx, name, slots=None):
    transport = make_transport(name, dist.group.WORLD, ctx.device)
    data = transport.alloc(slots or ctx.world_size, torch.int64)
    data.local.fill_(-1)
    gate = GatedBarrier(transport)  # its own barrier also covers data's fill
    return transport, data, gate


def _count(n, ctx):
    return torch.tensor([n], dtype=torch.int32, device=ctx.device)


def _flags(n, ctx, length=300):
    """A bool vector with n set entries, the last ones past the kernel's first 256-entry block."""
    f = torch.zeros(length, dtype=torch.bool)
    f[torch.linspace(0, length - 1, n).long()] = True if n else False
    assert int(f.sum()) == n
    return f.to(ctx.device)


def _sync(ctx):
    if ctx.device.type == "cuda":
        torch.cuda.synchronize(ctx.device)


def _open_rounds(ctx, name, rounds: int = 4, always: bool = False):
    """Back to back, no host synchronisation between rounds: in round r every rank stores r * 10 + its rank into
    slot (r, rank) of every buffer (rank r % world after LATE seconds), passes an open gated barrier and reads
    round r's slots of its own buffer. A fast rank is often already in the next barrier (its slot one epoch
    ahead) while a slow one still polls: the wait must take 'at least the epoch', not 'exactly'."""
    transport, data, gate = _setup(ctx, name, slots=rounds * ctx.world_size)
    _store_into_peers[(1,)](data.peer_ptrs, -1, 0, WORLD=ctx.world_size)  # compile both kernels before timing
    gate(_count(0, ctx), 0)
    transport.barrier()
    seen = []
    for r in range(rounds):
        if ctx.rank == r % ctx.world_size:
            _sync(ctx)
            time.sleep(LATE)
        _store_into_peers[(1,)](data.peer_ptrs, r * 10 + ctx.rank, r * ctx.world_size + ctx.rank, WORLD=ctx.world_size)
        if always:
            gate.open()  # the step barrier of Transport.device_barrier: no count
        else:
            gate(_count(1, ctx), 0)
        seen.append(data.local[r * ctx.world_size:(r + 1) * ctx.world_size].cpu().tolist())
    epoch = int(gate.epoch.item())
    transport.close()
    return seen, epoch


@mpi
@pytest.mark.parametrize("always", [False, True], ids=["gated-open", "always"])
@pytest.mark.parametrize("name", PEER_TRANSPORTS)
def test_open_gates_wait_for_late_ranks_back_to_back(dist_ctx, name, always):
    seen, epoch = _open_rounds(dist_ctx, name, always=always)
    everyone = gather_objects((seen, epoch))
    want = [[r * 10 + q for q in range(dist_ctx.world_size)] for r in range(4)]
    for rank, (got, ep) in enumerate(everyone):
        assert got == want, f"rank {rank} read {got}, want {want}"
        assert ep == 4, f"rank {rank} passed {ep} gated barriers, want 4"


@mpi
@pytest.mark.parametrize("name", PEER_TRANSPORTS)
def test_closed_gate_does_not_wait_so_the_check_above_can_fail(dist_ctx, name):
    """The power case of the test above, deterministic: every rank but the last stores, passes a closed gate and
    reads; only then (after a host barrier) does the last rank store. The others read its slot before it stored
    there (-1, then its previous round's value), so a barrier that did not wait is caught; no epoch moves."""
    ctx = dist_ctx
    late = ctx.world_size - 1
    transport, data, gate = _setup(ctx, name)
    seen = []
    for r in range(3):
        if ctx.rank != late:
            _store_into_peers[(1,)](data.peer_ptrs, r * 10 + ctx.rank, ctx.rank, WORLD=ctx.world_size)
            gate(_count(0, ctx), 0)
            seen.append(data.local.cpu().tolist())
        transport.barrier()
        if ctx.rank == late:
            gate(_count(0, ctx), 0)
            _store_into_peers[(1,)](data.peer_ptrs, r * 10 + ctx.rank, ctx.rank, WORLD=ctx.world_size)
            _sync(ctx)
        transport.barrier()
    epoch = int(gate.epoch.item())
    transport.close()
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
        gate(_flags(0, ctx), 0)  # the same with row flags counted in the kernel
        gate(_flags(3, ctx), 3)
    late = ctx.world_size - 1
    if ctx.rank == late:
        _sync(ctx)
        time.sleep(LATE)
    _store_into_peers[(1,)](data.peer_ptrs, 7, ctx.rank, WORLD=ctx.world_size)
    gate(_flags(4, ctx), 3)  # open: the fourth flag sits past the first 256 entries
    got = (data.local.cpu().tolist(), int(gate.epoch.item()))
    transport.close()
    everyone = gather_objects(got)
    for rank, (vals, ep) in enumerate(everyone):
        assert vals == [7] * ctx.world_size and ep == 1, f"rank {rank}: {vals}, epoch {ep}"


@mpi
@pytest.mark.parametrize("name", PEER_TRANSPORTS)
def test_a_poisoned_slot_is_reported_by_every_later_barrier(dist_ctx, name):
    """What a rank that timed out leaves behind (POISON in its slot of every pad, written here by hand: the
    interpreter has no device clock to time out with) makes every later barrier of every rank pass and report
    the timeout in both status words, so ranks whose epochs drifted apart cannot pass a barrier silently; before
    the poison the same barriers report nothing (the check's power)."""
    from fsdist.tensor_parallel.transports.gated_barrier import POISON

    ctx = dist_ctx
    transport, data, gate = _setup(ctx, name)
    status = torch.zeros(2, dtype=torch.int32, device=ctx.device)
    gate.attach_status(status, 8, 5.0)
    gate.open()
    gate(_flags(2, ctx), 1)
    clean = status.cpu().tolist()
    _sync(ctx)
    transport.barrier()
    if ctx.rank == ctx.world_size - 1:
        _store_into_peers[(1,)](gate.pad.peer_ptrs, POISON.value, ctx.rank, WORLD=ctx.world_size)
        _sync(ctx)
    transport.barrier()
    gate.open()
    after_open = status.cpu().tolist()
    status.zero_()
    gate(_flags(2, ctx), 1)
    after_gated = status.cpu().tolist()
    transport.close()
    everyone = gather_objects((clean, after_open, after_gated))
    for rank, (c, o, g) in enumerate(everyone):
        assert c == [0, 0], f"rank {rank}: a clean barrier reported {c}"
        assert o == [8, 8] and g == [8, 8], f"rank {rank}: after the poison, open {o}, gated {g}"


@mpi
@pytest.mark.parametrize("name", PEER_TRANSPORTS)
def test_bad_counts_are_refused(dist_ctx, name):
    transport, data, gate = _setup(dist_ctx, name)
    try:
        for bad in (torch.zeros(1, dtype=torch.int64, device=dist_ctx.device),
                    torch.zeros(2, dtype=torch.int32, device=dist_ctx.device),
                    torch.zeros(2, 3, dtype=torch.bool, device=dist_ctx.device),
                    torch.zeros(3, dtype=torch.float32, device=dist_ctx.device), 3,
                    torch.zeros(6, dtype=torch.bool, device=dist_ctx.device)[::2]):  # strided: the kernel reads densely
            with pytest.raises(ValueError, match="count must be one int32 or a contiguous 1-D bool tensor"):
                gate(bad, 0)
            with pytest.raises(ValueError, match="count must be one int32 or a contiguous 1-D bool tensor"):
                transport.gated_barrier(bad, 0)  # the transport's entry checks first, whatever path follows
    finally:
        transport.close()
    with pytest.raises(RuntimeError, match="pad was freed"):
        gate(_count(1, dist_ctx), 0)


@mpi
@two_ranks_only(HEAD_AT_TWO_RANKS)
@pytest.mark.parametrize("name", PEER_TRANSPORTS)
def test_the_head_with_device_gates_samples_exactly_and_survives_a_diverged_step(dist_ctx, name):
    """The head's fallback rounds through the device kernel (on CPU too: shm normally gates on the host, here the
    kernel is installed): filtered calls with fallback rows equal fsdist.sample on the full weight; a step with
    filters on the last rank only raises the mismatch on every rank instead of hanging; every rank has passed
    the same number of gated barriers."""
    from fsdist.tensor_parallel import TensorParallelMismatchError
    from tp_helpers import problem

    ctx, V, D, B = dist_ctx, 1000, 16, 24
    W, h = problem(V, D, B, torch.float32, seed=51, scale=3.0, device=ctx.device)
    head = fsdist.ShardedFlashLMHead(D, V, transport=name, params_dtype=torch.float32, device=ctx.device,
                                     max_batch_size=B)
    head.load_full_weight(W)
    if head.transport._gate is None:  # shm: install the device barrier (collective)
        head.transport._gate = GatedBarrier(head.transport)
    g = torch.Generator().manual_seed(0)
    kw = dict(temperature=(torch.rand(B, generator=g) + 0.4).to(ctx.device),
              top_k=torch.tensor([0, 5, 40, 0, 100, 0] * 4, dtype=torch.int32, device=ctx.device),
              top_p=torch.tensor([0.9, 1.0, 0.8, 1.0, 0.95, 0.5] * 4, device=ctx.device),
              seed=torch.arange(B, device=ctx.device) * 13 + 1, offset=4, top_logprobs=2)
    out = head(h, **kw)
    ref = fsdist.sample(h, W, vocab_size=V, **kw)
    exact = torch.equal(out.tokens, ref.tokens) and torch.equal(out.top_ids, ref.top_ids)
    fell_back = int(out.fallback.sum())
    plain = dict(seed=kw["seed"], offset=5)
    mine = dict(plain, top_k=5) if ctx.rank == ctx.world_size - 1 else plain
    try:
        head(h, **mine)
        head.check()
        outcome = "no error"
    except TensorParallelMismatchError:
        outcome = "mismatch"
    epoch = int(head.transport._gate.epoch.item())
    head.close()
    everyone = gather_objects((exact, fell_back, outcome, epoch))
    assert all(o[0] for o in everyone), f"tokens / top ids differ from fsdist.sample: {everyone}"
    assert all(o[1] > 0 for o in everyone), f"no row fell back (the gates never opened): {everyone}"
    assert all(o[2] == "mismatch" for o in everyone), everyone
    assert len({o[3] for o in everyone}) == 1 and everyone[0][3] > 0, f"gated barriers per rank: {everyone}"


@mpi
@two_ranks_only(HEAD_AT_TWO_RANKS)
@pytest.mark.parametrize("name", PEER_TRANSPORTS)
def test_the_head_with_device_step_barriers_samples_exactly(dist_ctx, name, monkeypatch):
    """FSDIST_DEVICE_BARRIER=1: every step barrier of the head (the exchange, the fallback's rounds) is the
    signal-pad barrier, with the head's status word attached for timeouts (on GPUs). Plain, logprob and filtered
    calls with fallback rows equal fsdist.sample on the full weight; every rank passes the same number of
    device barriers, at least one per call; the status stays clean."""
    from tp_helpers import problem

    ctx, V, D, B = dist_ctx, 1000, 16, 24
    W, h = problem(V, D, B, torch.float32, seed=53, scale=3.0, device=ctx.device)
    monkeypatch.setenv("FSDIST_DEVICE_BARRIER", "1")
    head = fsdist.ShardedFlashLMHead(D, V, transport=name, params_dtype=torch.float32, device=ctx.device,
                                     max_batch_size=B)
    monkeypatch.delenv("FSDIST_DEVICE_BARRIER")
    head.load_full_weight(W)
    installed = head.transport.device_barrier and head.transport._gate is not None
    attached = getattr(head.transport._gate, "_status", None) is head._reduction.monitor.status
    seeds = torch.arange(B, device=ctx.device) * 7 + 2
    calls = [dict(temperature=0.8, seed=seeds, offset=1),
             dict(temperature=torch.linspace(0.0, 1.5, B, device=ctx.device), seed=seeds, offset=2,
                  return_logprobs=True),
             dict(temperature=1.0, top_k=40, top_p=0.8, seed=seeds, offset=3, top_logprobs=2)]
    exact, fell_back = [], 0
    for kw in calls:
        out, ref = head(h, **kw), fsdist.sample(h, W, vocab_size=V, **kw)
        same = torch.equal(out.tokens, ref.tokens)
        if kw.get("return_logprobs"):
            same = same and torch.allclose(out.logprobs, ref.logprobs, atol=1e-5)
        if out.fallback is not None:
            fell_back += int(out.fallback.sum())
        exact.append(same)
    head.check()
    epoch = int(head.transport._gate.epoch.item()) if installed else -1
    head.close()
    everyone = gather_objects((installed, attached, exact, fell_back, epoch))
    for rank, (inst, att, ex, fb, ep) in enumerate(everyone):
        assert inst and att, f"rank {rank}: device barrier installed {inst}, status attached {att}"
        assert all(ex), f"rank {rank}: calls equal fsdist.sample: {ex}"
        assert fb > 0, f"rank {rank}: no row fell back (the fallback's barriers never opened)"
        assert ep >= len(calls) and ep == everyone[0][4], f"device barriers per rank: {[o[4] for o in everyone]}"


@mpi
@two_ranks_only(HEAD_AT_TWO_RANKS)
@pytest.mark.parametrize("name", PEER_TRANSPORTS)
def test_group_logmass_heads_take_the_device_step_barrier_too(dist_ctx, name, monkeypatch):
    """FSDIST_DEVICE_BARRIER=1 reaches reduction="group_logmass" as well: its step barrier runs on the kernel
    (the epoch advances per call), the status word is attached, and the tokens equal a head built without it."""
    from tp_helpers import problem

    ctx, V, D, B = dist_ctx, 1000, 16, 8
    W, h = problem(V, D, B, torch.float32, seed=54, device=ctx.device)
    heads = []
    for on in ("0", "1"):
        monkeypatch.setenv("FSDIST_DEVICE_BARRIER", on)
        heads.append(fsdist.ShardedFlashLMHead(D, V, transport=name, reduction="group_logmass",
                                               params_dtype=torch.float32, device=ctx.device, max_batch_size=B))
        heads[-1].load_full_weight(W)
    monkeypatch.delenv("FSDIST_DEVICE_BARRIER")
    kw = dict(temperature=0.9, seed=torch.arange(B, device=ctx.device) + 11, offset=2)
    same = [torch.equal(heads[0](h, **kw).tokens, heads[1](h, **kw).tokens)]
    gate = heads[1].transport._gate
    installed = heads[1].transport.device_barrier and gate is not None
    attached = installed and getattr(gate, "_status", None) is heads[1]._reduction.monitor.status
    before = int(gate.epoch.item()) if installed else -1
    heads[1](h, **kw)
    advanced = (int(gate.epoch.item()) - before) if installed else -1
    for head in heads:
        head.close()
    everyone = gather_objects((same, installed, attached, advanced))
    for rank, (sm, inst, att, adv) in enumerate(everyone):
        assert all(sm) and inst and att and adv >= 1, f"rank {rank}: same {sm}, installed {inst}, attached {att}, " \
                                                       f"barriers per call {adv}"


def test_attach_status_and_the_timeout_setting_are_checked(monkeypatch):
    """Single process: the status word and the timeout a device barrier reports into are validated, and
    FSDIST_PEER_TIMEOUT_S is read with a clear error."""
    from fsdist.tensor_parallel.transports import base

    gate = GatedBarrier.__new__(GatedBarrier)
    gate.pad = type("Pad", (), {"local": torch.zeros(3, dtype=torch.int64)})()
    for bad in (torch.zeros(2, dtype=torch.int64), torch.zeros(1, dtype=torch.int32)):
        with pytest.raises(ValueError, match=r"status must be int32 \[2\]"):
            gate.attach_status(bad, 8, 1.0)
    for bad in (0.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="timeout_s must be a finite number of seconds > 0"):
            gate.attach_status(torch.zeros(2, dtype=torch.int32), 8, bad)
    gate.attach_status(torch.zeros(2, dtype=torch.int32), 8, 2.5)
    assert gate._timeout_ns == 2_500_000_000 and gate._bit == 8
    monkeypatch.delenv("FSDIST_PEER_TIMEOUT_S", raising=False)
    assert base.peer_timeout_s() == base.DEFAULT_PEER_TIMEOUT_S
    monkeypatch.setenv("FSDIST_PEER_TIMEOUT_S", "12.5")
    assert base.peer_timeout_s() == 12.5
    for bad in ("soon", "0", "-3", "inf", "nan"):
        monkeypatch.setenv("FSDIST_PEER_TIMEOUT_S", bad)
        with pytest.raises(ValueError, match="FSDIST_PEER_TIMEOUT_S"):
            base.peer_timeout_s()



def test_the_device_barrier_is_on_by_default_on_gpus_only():
    """Transport.device_barrier's default: on for peer-store transports on a GPU (the step barrier with a timeout),
    off on CPU (no device clock there) and for transports without peer stores; FSDIST_DEVICE_BARRIER=0 (false,
    off, no, empty) turns it off, 1 (any other value) on, also on CPU."""
    from fsdist.tensor_parallel.transports.base import device_barrier_wanted

    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert device_barrier_wanted(True, cuda, {}) and not device_barrier_wanted(True, cpu, {})
    assert not device_barrier_wanted(False, cuda, {})
    assert not device_barrier_wanted(False, cuda, {"FSDIST_DEVICE_BARRIER": "1"})
    for off in ("0", "", "false", "Off", " no "):
        assert not device_barrier_wanted(True, cuda, {"FSDIST_DEVICE_BARRIER": off}), off
    for on in ("1", "true", "yes"):
        assert device_barrier_wanted(True, cpu, {"FSDIST_DEVICE_BARRIER": on}), on

@mpi
@grid("name", [(t,) for t in ALL_TRANSPORTS], lambda name: name == PEER_TRANSPORTS[0],
      "one rank of four failing inside the fallback runs on the peer-store transport, where the gated barriers are")
def test_a_local_error_inside_the_fallback_passes_the_barriers_and_is_caught_next_step(dist_ctx, name, monkeypatch):
    """The last rank's resolve launch fails (as out of memory on that rank alone would): it still passes every
    gated barrier of the call, so nobody waits and the epochs stay equal, then raises that error. Its next call
    takes part with an error header and refuses: the peers raise the mismatch there, nobody hangs."""
    import fsdist.tensor_parallel.candidates as cand
    from fsdist.tensor_parallel import TensorParallelMismatchError
    from tp_helpers import problem

    ctx, V, D, B = dist_ctx, 1000, 16, 24
    W, h = problem(V, D, B, torch.float32, seed=52, scale=3.0, device=ctx.device)
    head = fsdist.ShardedFlashLMHead(D, V, transport=name, params_dtype=torch.float32, device=ctx.device,
                                     max_batch_size=B)
    head.load_full_weight(W)
    if head.transport.peer_stores and head.transport._gate is None:
        head.transport._gate = GatedBarrier(head.transport)
    kw = dict(temperature=1.0, top_k=40, top_p=0.8, seed=torch.arange(B, device=ctx.device) + 3)
    if ctx.rank == ctx.world_size - 1:
        def broken(*a, **k):
            raise RuntimeError("CUDA out of memory (simulated)")
        monkeypatch.setattr(cand, "launch_resolve", broken)
    outcomes = []
    for step in range(2):
        try:
            out = head(h, **kw)
            head.check()
            outcomes.append(("ok", int(out.fallback.sum())))
        except TensorParallelMismatchError:
            outcomes.append(("mismatch", 0))
        except RuntimeError as e:
            outcomes.append(("local", str(e)))
        monkeypatch.undo()
    epoch = int(head.transport._gate.epoch.item()) if head.transport._gate is not None else 0
    head.close()
    everyone = gather_objects((outcomes, epoch))
    last = ctx.world_size - 1
    for rank, (got, ep) in enumerate(everyone):
        if rank == last:
            assert got[0] == ("local", "CUDA out of memory (simulated)"), got
            assert got[1][0] == "local" and "an earlier call failed on this rank" in got[1][1], got
        else:
            assert got[0][0] == "ok" and got[0][1] > 0, got  # rows fell back: the gates were open
            assert got[1][0] == "mismatch", (rank, got)
    assert len({ep for _, ep in everyone}) == 1, f"gated barriers passed, per rank: {everyone}"
