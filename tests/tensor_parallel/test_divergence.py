"""Ranks that diverge: token -1 and an error on every rank, never a hang, a gloo abort or a wrong token.

Every forward is one step on every rank (fsdist/tensor_parallel/reduction.py): a rank with
bad arguments, an empty batch or a batch over capacity still publishes a call header, and
each rank's merge compares every rank's header with its own (fsdist/ops/step_check.py).
So in each test below every rank makes one call per step, whatever it was given, and then

* the rank whose own arguments are bad raises its ValueError / TypeError;
* every other rank raises TensorParallelMismatchError in the same call (on CPU; on a GPU a
  call or two later, or from head.check()), in ``describe_status``'s words for the bits;
* the tokens the step produced (seen through the HeadTestSeam, since forward raised) are -1
  where check_headers says so and the reference token elsewhere, never another token;
* the status is sticky: the next call, good on every rank, raises everywhere with tokens -1;
* close() works on every rank.

Each test's docstring says what the same divergence did before the fix, as observed on
commit 9b8cf5b with mpirun -n 2 on CPU (gloo timeout 15 s): a gloo abort (SIGABRT of the
whole job), a hang until the gloo timeout, or silently wrong tokens. Outcomes are gathered
from every rank before any assert, so a failing assert never leaves a peer in a collective.
"""
import functools
import os
import re
from datetime import timedelta
from typing import Callable, Optional, Tuple

import pytest
import torch
import torch.distributed as dist

import fsdist
from fsdist.ops.step_check import STATUS_PEER_ERROR, STATUS_RECORD_MISMATCH, STATUS_ROW_MISMATCH, describe_status
from fsdist.tensor_parallel import HeadTestSeam, TensorParallelMismatchError, transports
from fsdist.tensor_parallel.vocab import vocab_partition
from tp_helpers import (ALL_TRANSPORTS, ON_GPU, PEER_TRANSPORTS, gather_objects, grid, problem,
                        reference_group_logmass, tp_ranges)

mpi = pytest.mark.mpi(min_size=2)
REDUCTIONS = ["candidates", "group_logmass"]
# Beyond 2 ranks: every rank's merge compares every rank's header with its own (fsdist/ops/step_check.py),
# whatever the transport carried and whichever reduction merges; what 4 ranks add is one rank of four
# diverging while three agree. So each divergence runs once beyond 2 ranks, on one (reduction, transport),
# chosen so that each status kind (record, row, peer error) meets every reduction and transport.
BEYOND_TWO = ("one rank of four diverging runs on one (reduction, transport) of this grid, and each status kind "
              "with every reduction and transport across this file; the full grid runs at 2 ranks")

# Small: the kernels run under Triton's interpreter. V pads to 512: one or two 128-id tiles per rank.
V, D, B, CAP, BLOCK_V = 500, 16, 8, 16, 128
MISMATCH = TensorParallelMismatchError.__name__
RECORD, PEER_ERROR, ROW = STATUS_RECORD_MISMATCH, STATUS_PEER_ERROR, STATUS_ROW_MISMATCH


def with_both(*keep):
    """Every (reduction, transport) at 2 ranks; beyond, only those in ``keep``."""
    cases = [(r, t) for t in ALL_TRANSPORTS for r in REDUCTIONS]
    cases = grid("reduction,transport", cases, lambda r, t: (r, "collective" if t == "collective" else "peer") in keep,
                 BEYOND_TWO)
    return lambda fn: mpi(cases(fn))


C_COL, C_PEER, G_COL, G_PEER = [(r, t) for r in REDUCTIONS for t in ("collective", "peer")]


# ---- helpers -------------------------------------------------------------------------------
def good_rows(device, batch=B, seed=12):
    """Per-row (temperature, seed, offset) tensors every rank passes when it behaves."""
    g = torch.Generator().manual_seed(seed)
    return dict(temperature=(torch.rand(batch, generator=g) * 0.8 + 0.6).to(device),
                seed=torch.randint(0, 2**62, (batch,), generator=g).to(device),
                offset=torch.randint(0, 2**40, (batch,), generator=g).to(device))


def rows_of(kw, index):
    """The same call's per-row tensors for the rows ``index`` (a slice or an index tensor)."""
    return {k: (v[index] if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}


def reference(reduction, tp, W, h, temperature=1.0, seed=0, offset=0):
    """(tokens, rows the reference decides reliably) of a healthy step with these arguments:
    fsdist.sample on the full weight for "candidates" (bit for bit), the float64 mirror of
    paper Alg. I.4 for "group_logmass" (rows decided by fp32 rounding are left out)."""
    if reduction == "candidates":
        out = fsdist.sample(h, W, temperature=temperature, seed=seed, offset=offset, vocab_size=V)
        return out.tokens.cpu().tolist(), [True] * h.shape[0]
    tok, _, _, margin = reference_group_logmass(h, W, V, tp_ranges(V, tp), temperature, seed, offset)
    return tok.tolist(), (margin > 1e-4).tolist()


@functools.lru_cache(maxsize=None)
def divergence_problem(reduction, tp, batch, device):
    """(W, h, good rows, reference tokens, reliable rows) shared by the divergence tests (read only)."""
    W, h = problem(V, D, batch, torch.float32, seed=11, scale=3.0, device=device)
    kw = good_rows(device, batch)
    return (W, h, kw) + reference(reduction, tp, W, h, **kw)


class Head:
    """A small head whose reduction's step outputs are kept (through its HeadTestSeam), so a test
    sees the tokens a step produced even when forward raised right after it."""

    def __init__(self, ctx, transport, reduction, W, vocab_size=V, **kw):
        kw.setdefault("max_batch_size", CAP)
        self.seam = HeadTestSeam()
        self.head = fsdist.ShardedFlashLMHead(D, vocab_size, transport=transport, reduction=reduction,
                                              params_dtype=torch.float32, device=ctx.device, block_v=BLOCK_V,
                                              test_seam=self.seam, **kw)
        self.head.load_full_weight(W)
        self.tokens = None
        run = self.seam.reduction.run

        def keep_tokens(*args, **kwargs):
            out = run(*args, **kwargs)
            self.tokens = out[0].cpu().tolist()
            return out

        self.seam.reduction.run = keep_tokens

    def call(self, *args, **kwargs) -> dict:
        """One forward: the exception it raised (type name and message) and the tokens of its step
        (None when the step had no rows to merge: a local error or an empty batch)."""
        self.tokens = None
        try:
            self.head(*args, **kwargs)
            error, message = None, ""
        except Exception as e:  # recorded, asserted after the gather
            error, message = type(e).__name__, str(e)
        return {"error": error, "message": message, "tokens": self.tokens}

    def check(self) -> Optional[str]:
        try:
            self.head.check()
            return None
        except Exception as e:
            return f"{type(e).__name__}: {e}"

    def close(self) -> Optional[str]:
        try:
            self.head.close()
            return None
        except Exception as e:
            return f"{type(e).__name__}: {e}"


def outcome_of(fn) -> Optional[str]:
    """'Type: message' of what fn() raised, or None."""
    try:
        fn()
        return None
    except Exception as e:
        return f"{type(e).__name__}: {e}"


def diverged(bits: int) -> str:
    """What TensorParallelMismatchError says for these status bits (and nothing else)."""
    return f"the tensor-parallel ranks diverged: {describe_status(bits)}."


def tokens_ok(tokens, ref, reliable, bad_rows) -> bool:
    """-1 exactly on bad_rows (all rows if None) and the reference token elsewhere. On a GPU the
    other rows may be -1 too: the merge's programs may see the status word that another program
    of the same step set (see test_temperature_differs_in_one_row_of_a_large_batch)."""
    for i, t in enumerate(tokens):
        bad = bad_rows is None or i in bad_rows
        if bad and t != -1:
            return False
        if not bad and t != ref[i] and reliable[i] and not (ON_GPU and t == -1):
            return False
    return True


def run_divergence(ctx, transport, reduction, *, rank: str, change: Callable, bits: int,
                   local_error: Optional[Tuple[str, str]] = None, bad_rows=None, batch: int = B,
                   common: Optional[dict] = None):
    """One step where rank ``rank`` ("first" or "last") calls with ``change(h, kw)`` instead of
    (h, kw) (kw with ``common``'s arguments on every rank); then a good step everywhere, close,
    and a call on the closed head. Asserts the contract on every rank's gathered outcomes (see
    the module docstring)."""
    W, h, kw, ref, reliable = divergence_problem(reduction, ctx.world_size, batch, ctx.device)
    diverging = 0 if rank == "first" else ctx.world_size - 1
    head = Head(ctx, transport, reduction, W, max_batch_size=max(CAP, batch))
    step_kw = dict(kw, **(common or {}))
    mine = change(h, dict(step_kw)) if ctx.rank == diverging else (h, step_kw)
    step = head.call(mine[0], **mine[1])
    checked = head.check()
    after = head.call(h, **kw)
    closed = head.close()
    reuse = head.call(h, **kw)
    everyone = gather_objects(dict(step=step, checked=checked, after=after, closed=closed, reuse=reuse,
                                   rows=mine[0].shape[0]))

    for r, o in enumerate(everyone):
        step, where = o["step"], f"rank {r}: {o}"
        if r == diverging and local_error is not None:
            assert step["error"] == local_error[0] and re.search(local_error[1], step["message"]), where
            assert step["tokens"] is None, where
        elif step["error"] is None:
            # Allowed on a GPU only (the status word reaches the host a call or two later); its tokens
            # are checked below (a rank that called with no rows has none), and head.check() must raise.
            assert ON_GPU and (step["tokens"] is not None or o["rows"] == 0), where
        else:
            assert step["error"] == MISMATCH and diverged(bits) in step["message"], where
        if r != diverging:  # an agreeing rank merged the step: its tokens are what check_headers left
            assert step["tokens"] is not None and len(step["tokens"]) == batch, where
        if step["tokens"] is not None:
            assert tokens_ok(step["tokens"], ref, reliable, bad_rows), where
        assert o["checked"] is not None and o["checked"].startswith(MISMATCH), where
        assert diverged(bits) in o["checked"], where
        # Sticky: a good call on every rank still raises, after taking part in its step.
        assert o["after"]["error"] == MISMATCH and o["after"]["tokens"] == [-1] * batch, where
        assert o["closed"] is None, where
        assert o["reuse"]["error"] == "RuntimeError" and "closed" in o["reuse"]["message"], where
    assert [o["after"]["message"] for o in everyone] == [
        everyone[0]["after"]["message"].replace("rank 0 of", f"rank {r} of") for r in range(len(everyone))]


# ---- construction --------------------------------------------------------------------------
@mpi
@pytest.mark.parametrize("transport", ALL_TRANSPORTS)
@pytest.mark.parametrize("divisible_by", [1, 2])
def test_vocab_ranges_off_philox_quads_are_rejected_at_construction(dist_ctx, transport, divisible_by):
    """Before: the head was built, then the first forward raised on the ranks whose range starts off a
    quad only (vocab_start % 4), and the others hung in the exchange (or gloo aborted)."""
    V1, tp = 1001, dist_ctx.world_size
    parts = [vocab_partition(V1, tp, r, divisible_by) for r in range(tp)]
    off_quads = any(p.start % 4 or p.rows % 4 for p in parts)  # every rank's rows at tp = 2; none for 2 at tp = 4
    W, h = problem(V1, D, B, torch.float32, seed=13, device=dist_ctx.device)
    heads = []
    built = outcome_of(lambda: heads.append(Head(dist_ctx, transport, "candidates", W, vocab_size=V1,
                                                 make_vocab_size_divisible_by=divisible_by)))
    tokens = None
    if heads:  # only where every range is on quads: then the head must be exact
        tokens = heads[0].call(h, seed=5, offset=6)["tokens"]
        heads[0].close()
    everyone = gather_objects(dict(built=built, tokens=tokens))
    for r, o in enumerate(everyone):
        if off_quads:
            assert o["built"] is not None and o["built"].startswith("ValueError"), (r, o)
            assert f"invalid arguments on {tp} rank(s)" in o["built"], (r, o)
            assert "make_vocab_size_divisible_by must be a multiple of 4 with tensor parallelism" in o["built"]
            assert f"got {divisible_by} with tp_size {tp}" in o["built"], (r, o)
            assert re.search(r"rank \d's range \[\d+, \d+\) of the padded \d+ ids does not", o["built"]), (r, o)
        else:
            want = fsdist.sample(h, W, seed=5, offset=6, vocab_size=V1).tokens.tolist()
            assert o["built"] is None and o["tokens"] == want, (r, o)


def still_in_step(ctx) -> Optional[str]:
    """A collective head and one step: the ranks still make the same collectives after an error."""
    W, h = problem(V, D, 4, torch.float32, seed=31, device=ctx.device)
    head = Head(ctx, "collective", "candidates", W)
    got = head.call(h, seed=1)
    head.close()
    want = fsdist.sample(h, W, seed=1, vocab_size=V).tokens.tolist()
    return None if got == {"error": None, "message": "", "tokens": want} else f"{got} != {want}"


@mpi
@pytest.mark.parametrize("transport", ALL_TRANSPORTS)
@pytest.mark.parametrize("case", ["cuda-device-on-first-rank", "probe-raises-on-rank-1"])
def test_non_value_error_on_one_rank_at_construction(dist_ctx, monkeypatch, transport, case):
    """Before: the failing rank raised alone (AssertionError / RuntimeError) and the others hung in the
    agreement gather until the gloo timeout."""
    r = dist_ctx.rank
    kw = dict(transport=transport, params_dtype=torch.float32, device=dist_ctx.device)
    if case == "cuda-device-on-first-rank":
        bad, kinds = 0, "AssertionError|RuntimeError|AcceleratorError"  # torch >= 2.9: AcceleratorError
        if r == bad:  # no CUDA here; on a GPU machine, a GPU that does not exist
            kw["device"] = f"cuda:{torch.cuda.device_count()}" if ON_GPU else "cuda"
    else:
        bad, kinds = 1, "RuntimeError"

        def probe(*args, **kwargs):
            raise RuntimeError("transport probe failed on purpose")

        if r == bad:
            monkeypatch.setattr(transports, "probe", probe)
    built = outcome_of(lambda: fsdist.ShardedFlashLMHead(D, V, **kw))
    monkeypatch.undo()
    healthy = still_in_step(dist_ctx)
    everyone = gather_objects(dict(built=built, healthy=healthy))
    for o in everyone:
        want = rf"ValueError: ShardedFlashLMHead: invalid arguments on 1 rank\(s\): rank {bad}: ({kinds}): "
        assert o["built"] is not None and re.match(want, o["built"]), o
        assert o["healthy"] is None, o


cpu_only_hang = pytest.mark.skipif(ON_GPU, reason="the hang is bounded by a gloo group timeout (CPU only)")


def short_timeout_group(ctx, seconds=2):
    """The whole world as a new group whose collectives give up after `seconds`: a test of a hang that
    is still there (xfail) waits that long instead of the session's gloo timeout."""
    return dist.new_group(list(range(ctx.world_size)), timeout=timedelta(seconds=seconds))


@mpi
@cpu_only_hang
def test_wrong_test_seam_type_on_one_rank(dist_ctx):
    """A local error (test_seam is not a HeadTestSeam) reaches every rank as a ValueError. (It used to
    fail while building the gathered dict, on its rank alone, leaving the others in the gather.)"""
    group = short_timeout_group(dist_ctx)
    bad = dist_ctx.world_size - 1
    seam = "not a seam" if dist_ctx.rank == bad else None
    built = outcome_of(lambda: fsdist.ShardedFlashLMHead(D, V, tp_group=group, transport="collective",
                                                         params_dtype=torch.float32, device=dist_ctx.device,
                                                         test_seam=seam))
    healthy = still_in_step(dist_ctx)
    everyone = gather_objects(dict(built=built, healthy=healthy))
    assert all(o["healthy"] is None for o in everyone), everyone
    for o in everyone:
        assert o["built"] is not None and o["built"].startswith("ValueError") and f"rank {bad}: TypeError: test_seam" \
            in o["built"], everyone


@mpi
@cpu_only_hang
@pytest.mark.parametrize("transport", ["collective", "shm"])
def test_exchange_buffer_allocation_fails_on_one_rank(dist_ctx, monkeypatch, transport):
    """Out of (shared or GPU) memory on one rank while allocating the exchange buffers: every rank raises
    ValueError naming it (the allocation's local part is agreed on before its collective part)."""
    group = short_timeout_group(dist_ctx)
    bad = dist_ctx.world_size - 1
    if dist_ctx.rank == bad:
        def no_memory(self, numel, dtype):
            raise MemoryError(f"no memory for {numel} exchange elements (simulated)")

        cls = {"collective": "collective.CollectiveTransport", "shm": "shm.ShmTransport"}[transport]
        monkeypatch.setattr(f"fsdist.tensor_parallel.transports.{cls}._reserve", no_memory)
    head = None

    def build():
        nonlocal head
        head = fsdist.ShardedFlashLMHead(D, V, tp_group=group, transport=transport, params_dtype=torch.float32,
                                         device=dist_ctx.device)

    built = outcome_of(build)
    monkeypatch.undo()
    if head is not None and transport == "collective":
        head.close()  # a collective head frees its buffers without communicating
    healthy = still_in_step(dist_ctx)
    everyone = gather_objects(dict(built=built, healthy=healthy))
    assert all(o["healthy"] is None for o in everyone), everyone
    for o in everyone:
        assert o["built"] is not None and o["built"].startswith("ValueError") and f"rank {bad}: MemoryError" \
            in o["built"], everyone


RESERVE_CASES = ["sizes-differ", "bad-value-on-one-rank", "allocation-fails-on-one-rank"]
# Every transport the parametrisations can name (shm on CPU; nvshmem and symm_mem on GPUs): a name missing here
# failed on the bad rank alone, before any collective, and left its peer waiting in reserve's agreement.
TRANSPORT_CLASSES = {"collective": "collective.CollectiveTransport", "shm": "shm.ShmTransport",
                     "nvshmem": "nvshmem.NvshmemTransport", "symm_mem": "symm_mem.SymmMemTransport"}


@mpi
@pytest.mark.parametrize("transport", ALL_TRANSPORTS)
@pytest.mark.parametrize("case", RESERVE_CASES)
def test_reserve_that_fails_anywhere_fails_everywhere(dist_ctx, monkeypatch, transport, case):
    """head.reserve agrees first: sizes that differ between ranks, or a bad one on one rank, raise ValueError on
    every rank with the buffers untouched; an allocation that fails on one rank raises RuntimeError on every rank
    and the head keeps its capacity. Either way the next call samples the reference tokens and close() works.
    Before: the others grew alone (a hang until the gloo timeout on shm, a gloo abort on collective), and a
    failed allocation left a head whose calls and close() raised AttributeError."""
    W, h, kw, ref, reliable = divergence_problem("candidates", dist_ctx.world_size, B, dist_ctx.device)
    head = Head(dist_ctx, transport, "candidates", W)
    bad = dist_ctx.world_size - 1
    size = 200
    if case == "sizes-differ" and dist_ctx.rank == bad:
        size = 100
    elif case == "bad-value-on-one-rank" and dist_ctx.rank == bad:
        size = 0
    elif case == "allocation-fails-on-one-rank" and dist_ctx.rank == bad:
        cls = TRANSPORT_CLASSES[transport]
        real = getattr(transports, cls.split(".")[0]).__dict__[cls.split(".")[1]]._reserve
        failed = []

        def no_memory(self, numel, dtype):
            if not failed:  # the grown buffers' first allocation (the old capacity's allocate again)
                failed.append(numel)
                raise MemoryError(f"no memory for {numel} exchange elements (simulated)")
            return real(self, numel, dtype)

        monkeypatch.setattr(f"fsdist.tensor_parallel.transports.{cls}._reserve", no_memory)
    reserved = outcome_of(lambda: head.head.reserve(size))
    monkeypatch.undo()
    capacity = head.head.max_batch_size
    step = head.call(h, **kw)
    closed = head.close()
    everyone = gather_objects(dict(reserved=reserved, capacity=capacity, step=step, closed=closed))
    want = {"sizes-differ": r"ValueError: ShardedFlashLMHead.reserve: configuration differs across tensor-parallel "
                            rf"ranks: batch_size \(rank 0='200', .*rank {bad}='100'\)\. reserve is collective: every "
                            r"rank must pass the same batch_size",
            "bad-value-on-one-rank": rf"ValueError: ShardedFlashLMHead.reserve: invalid arguments on 1 rank\(s\): "
                                     rf"rank {bad}: ValueError: batch_size",
            "allocation-fails-on-one-rank": rf"RuntimeError: reserve\(200\) could not allocate the exchange buffers "
                                            rf".*rank {bad}: MemoryError.*it keeps max_batch_size {CAP}"}[case]
    for o in everyone:
        assert o["reserved"] is not None and re.search(want, o["reserved"]), everyone
        assert o["capacity"] == CAP and o["closed"] is None, everyone
        assert o["step"]["error"] is None and o["step"]["tokens"] == ref, everyone


@mpi
def test_reserve_while_capturing_decides_locally(dist_ctx, monkeypatch):
    """Inside a CUDA-graph capture, reserve cannot agree with its peers (a host collective would break the
    capture): growing raises RuntimeError at once and a batch that fits is a no-op, neither communicating.
    Before: the agreement ran first, inside the capture (on 2xH200 the graph test failed on every rank).
    Capture is stood in for by the reduction's ``capturing`` (no graph on CPU); gather raises if reached."""
    from fsdist.tensor_parallel import agreement, reduction

    W, h, kw, ref, reliable = divergence_problem("candidates", dist_ctx.world_size, B, dist_ctx.device)
    head = Head(dist_ctx, "collective", "candidates", W)

    def no_collective(*args, **kw):
        raise AssertionError("reserve communicated while capturing")

    monkeypatch.setattr(reduction.Reduction, "capturing", lambda self: True)
    monkeypatch.setattr(agreement, "gather", no_collective)
    grown = outcome_of(lambda: head.head.reserve(CAP + 100))
    fits = outcome_of(lambda: head.head.reserve(CAP))
    bad = outcome_of(lambda: head.head.reserve(0))
    monkeypatch.undo()
    capacity = head.head.max_batch_size
    step = head.call(h, **kw)
    closed = head.close()
    everyone = gather_objects(dict(grown=grown, fits=fits, bad=bad, capacity=capacity, step=step, closed=closed))
    for o in everyone:
        assert o["grown"] is not None and o["grown"].startswith("RuntimeError") and "during CUDA-graph capture" \
            in o["grown"], everyone
        assert o["fits"] is None and o["bad"] is not None and o["bad"].startswith("ValueError"), everyone
        assert o["capacity"] == CAP and o["closed"] is None, everyone
        assert o["step"]["error"] is None and o["step"]["tokens"] == ref, everyone


@mpi
def test_reserve_after_a_capture_on_one_rank_is_refused_everywhere(dist_ctx):
    """A rank that captured a graph on its buffers cannot grow them: reserve raises RuntimeError on every rank
    (agreed, naming that rank), nothing changes, and the next call samples the reference tokens."""
    W, h, kw, ref, reliable = divergence_problem("candidates", dist_ctx.world_size, B, dist_ctx.device)
    head = Head(dist_ctx, "collective", "candidates", W)
    bad = dist_ctx.world_size - 1
    head.head._reduction.captured = dist_ctx.rank == bad  # what a capture on this rank leaves behind
    reserved = outcome_of(lambda: head.head.reserve(CAP + 100))
    capacity = head.head.max_batch_size
    step = head.call(h, **kw)
    closed = head.close()
    everyone = gather_objects(dict(reserved=reserved, capacity=capacity, step=step, closed=closed))
    for o in everyone:
        assert o["reserved"] is not None and re.search(rf"^RuntimeError: .*refused on 1 rank\(s\): rank {bad}: "
                                                       r"reserve\(\d+\) after a CUDA graph was captured",
                                                       o["reserved"]), everyone
        assert o["capacity"] == CAP and o["closed"] is None, everyone
        assert o["step"]["error"] is None and o["step"]["tokens"] == ref, everyone


# ---- an input error on one rank ----------------------------------------------------------------
def bad_temperature(h, kw):
    return h, dict(kw, temperature=-1.0)


def bad_hidden_size(h, kw):
    return torch.cat([h, h[:, :1]], dim=1), kw


def bad_seed_shape(h, kw):
    return h, dict(kw, seed=kw["seed"][:-1])


def bad_seed_dtype(h, kw):
    return h, dict(kw, seed=kw["seed"].to(torch.int32))


INPUT_ERRORS = {
    "negative-temperature": (bad_temperature, ("ValueError", r"temperature must be in \[0, 1e\+30\]")),
    "hidden-size": (bad_hidden_size, ("ValueError", rf"D={D + 1} but the weight expects D={D}")),
    "seed-shape": (bad_seed_shape, ("ValueError", rf"seed tensor must have shape \[{B}\]")),
    "seed-dtype": (bad_seed_dtype, ("TypeError", r"seed tensor must be int64")),
}


PEER = PEER_TRANSPORTS[0]
# The local-error path (skip_step) does not depend on which check failed: every transport and
# reduction with one error, and each other error with one (transport, reduction).
INPUT_ERROR_CASES = [("negative-temperature", t, r) for t in ALL_TRANSPORTS for r in REDUCTIONS] + [
    ("hidden-size", "collective", "group_logmass"), ("seed-shape", PEER, "candidates"),
    ("seed-dtype", PEER, "group_logmass")]


@mpi
@grid("error,transport,reduction", INPUT_ERROR_CASES,
      lambda error, transport, reduction: (error, transport, reduction) in [
          ("negative-temperature", "collective", "candidates"), ("negative-temperature", PEER, "group_logmass")],
      BEYOND_TWO)
def test_input_error_on_one_rank(dist_ctx, error, transport, reduction):
    """Before: the bad rank raised before the exchange: gloo SIGABRT (collective) or a hang until the
    gloo timeout (shm)."""
    change, local_error = INPUT_ERRORS[error]
    run_divergence(dist_ctx, transport, reduction, rank="first", change=change, bits=RECORD | PEER_ERROR,
                   local_error=local_error)


# ---- divergent calls ---------------------------------------------------------------------------
@with_both(C_COL)
def test_batch_size_differs(dist_ctx, transport, reduction):
    """Before: silently wrong tokens (rows of different batches merged with each other)."""
    run_divergence(dist_ctx, transport, reduction, rank="first", bits=RECORD,
                   change=lambda h, kw: (h[3:], rows_of(kw, slice(3, None))))


@with_both(G_PEER)
def test_empty_batch_on_one_rank(dist_ctx, transport, reduction):
    """Before: the empty rank skipped the exchange: gloo SIGABRT (collective) or a hang until the gloo timeout (shm)."""
    run_divergence(dist_ctx, transport, reduction, rank="first", bits=RECORD,
                   change=lambda h, kw: (h[:0], rows_of(kw, slice(0, 0))))


@with_both(G_COL)
def test_batch_over_capacity_on_one_rank(dist_ctx, transport, reduction):
    """Before: that rank grew its buffers alone: gloo SIGABRT (collective) or a hang until the gloo timeout (shm)."""
    idx = torch.arange(CAP + 1) % B
    run_divergence(dist_ctx, transport, reduction, rank="first", bits=RECORD | PEER_ERROR,
                   change=lambda h, kw: (h[idx.to(h.device)], rows_of(kw, idx.to(h.device))),
                   local_error=("ValueError", rf"batch {CAP + 1} exceeds the head's max_batch_size {CAP}"))


@with_both(G_COL)
def test_return_logprobs_differs(dist_ctx, transport, reduction):
    """Before: gloo SIGABRT (collective: blocks of different sizes) or silently wrong, rank-dependent tokens (shm)."""
    run_divergence(dist_ctx, transport, reduction, rank="last", bits=RECORD,
                   change=lambda h, kw: (h, dict(kw, return_logprobs=True)))


@with_both(C_PEER)
def test_stage1_path_differs(dist_ctx, transport, reduction):
    """Before: not noticed (harmless here: both paths write the same candidates up to fp32 rounding)."""
    run_divergence(dist_ctx, transport, reduction, rank="first", bits=RECORD,
                   change=lambda h, kw: (h, dict(kw, path="chunked")))


@with_both(G_PEER)
def test_seeds_differ(dist_ctx, transport, reduction):
    """Before: silently wrong tokens (group_logmass: different tokens on different ranks)."""
    run_divergence(dist_ctx, transport, reduction, rank="last", bits=ROW,
                   change=lambda h, kw: (h, dict(kw, seed=kw["seed"] + 1)))


@with_both(C_COL)
def test_offsets_differ_in_two_rows(dist_ctx, transport, reduction):
    """Before: silently wrong tokens in those rows (group_logmass: different tokens on different ranks)."""
    def change(h, kw):
        offset = kw["offset"].clone()
        offset[[2, 5]] += 1
        return h, dict(kw, offset=offset)

    run_divergence(dist_ctx, transport, reduction, rank="last", bits=ROW, change=change, bad_rows=(2, 5))


@with_both(G_COL)
def test_temperature_differs_in_one_row(dist_ctx, transport, reduction):
    """Before: that row silently merged greedy and sampled candidates (group_logmass: ranks disagreed on it)."""
    def change(h, kw):
        temperature = kw["temperature"].clone()
        temperature[3] = 0.0
        return h, dict(kw, temperature=temperature)

    run_divergence(dist_ctx, transport, reduction, rank="last", bits=ROW, change=change, bad_rows=(3,))


@mpi
@pytest.mark.skipif(ON_GPU, reason="deterministic only under the interpreter, which runs programs in order")
def test_temperature_differs_in_one_row_of_a_large_batch(dist_ctx):
    """As above with 130 rows (two merge programs on CPU): only row 3 is -1. (Rows 128 and 129 used to come
    back -1 too: the merge read the status word an earlier program of the same step had just set.)"""
    def change(h, kw):
        temperature = kw["temperature"].clone()
        temperature[3] = 0.0
        return h, dict(kw, temperature=temperature)

    run_divergence(dist_ctx, "collective", "candidates", rank="last", bits=ROW, change=change, bad_rows=(3,),
                   batch=130)


# Filters and top-N on some ranks only (candidates: group_logmass refuses them with a local error, the case
# above). Those ranks run the exact fallback's rounds, whose exchanges are barriers with peer stores.
FILTER_DIVERGENCES = {
    "top-k-on-one-rank": lambda h, kw: (h, dict(kw, top_k=5, top_p=0.9)),
    "top-n-on-one-rank": lambda h, kw: (h, dict(kw, top_logprobs=3)),
    "top-k-tensor-against-scalar-0": lambda h, kw: (h, dict(kw, top_k=torch.zeros(B, dtype=torch.int32,
                                                                                  device=h.device))),
}


@mpi
@grid("case,transport", [(c, t) for t in ALL_TRANSPORTS for c in FILTER_DIVERGENCES],
      lambda case, transport: case == "top-k-on-one-rank",
      "one rank of four entering the fallback's rounds alone runs with top-k, on every transport; the other filter "
      "cases differ only in the header word that records them")
def test_filters_on_one_rank_only(dist_ctx, transport, case):
    """Before (shm): the filtered rank entered the fallback's barriers alone: its next collective paired with a
    peer's other call, and close() or a new head hung until the gloo timeout, which closed the group."""
    run_divergence(dist_ctx, transport, "candidates", rank="last", bits=RECORD, change=FILTER_DIVERGENCES[case])


@mpi
@pytest.mark.parametrize("transport", ALL_TRANSPORTS)
def test_local_error_in_a_filtered_call(dist_ctx, transport):
    """Every rank asks for top-p and top-N; the first has a bad temperature (a local error: it publishes a
    header alone). Before (shm): the others ran the fallback's rounds alone, as above."""
    run_divergence(dist_ctx, transport, "candidates", rank="first", bits=RECORD | PEER_ERROR,
                   change=bad_temperature, local_error=INPUT_ERRORS["negative-temperature"][1],
                   common=dict(top_p=0.9, top_logprobs=2))


@with_both(C_PEER)
def test_one_rank_calls_forward_once_more(dist_ctx, transport, reduction):
    """Before: silently wrong tokens from the extra call on (each step merged another step's candidates)."""
    ctx = dist_ctx
    W, h, kw, ref, reliable = divergence_problem(reduction, ctx.world_size, B, ctx.device)
    calls = [dict(kw, offset=kw["offset"] + i) for i in range(3)]
    head = Head(ctx, transport, reduction, W)
    outcomes = [head.call(h, **calls[0])]  # in step: the reference tokens
    if ctx.rank == 0:
        outcomes.append(head.call(h, **calls[0]))  # a retry of the same call: one step more on rank 0
        outcomes.append(head.call(h, **calls[1]))
    else:
        outcomes.append(head.call(h, **calls[1]))
        outcomes.append(head.call(h, **calls[2]))  # the others catch up, so the test can gather
    checked = head.check()
    closed = head.close()
    everyone = gather_objects(dict(outcomes=outcomes, checked=checked, closed=closed))
    for r, o in enumerate(everyone):
        first, paired, sticky = o["outcomes"]
        assert first["error"] is None and tokens_ok(first["tokens"], ref, reliable, bad_rows=()), (r, first)
        # Step 1 pairs rank 0's retry with the others' next call: every row's offset differs.
        assert paired["error"] == MISMATCH or (ON_GPU and paired["error"] is None), (r, paired)
        assert paired["tokens"] == [-1] * B, (r, paired)
        assert sticky["error"] == MISMATCH and sticky["tokens"] == [-1] * B, (r, sticky)
        assert o["checked"] is not None and diverged(ROW) in o["checked"], (r, o["checked"])
        assert o["closed"] is None, (r, o["closed"])


# ---- no false positives ------------------------------------------------------------------------
@with_both(C_COL, G_PEER)
def test_agreeing_ranks_never_see_a_mismatch(dist_ctx, transport, reduction):
    """Per-row parameters with greedy and NaN-temperature rows, empty batches, the same bad calls on every
    rank, reserve on every rank, scalar and chunked calls: never a TensorParallelMismatchError."""
    ctx, tp = dist_ctx, dist_ctx.world_size
    big = 24
    W, h = problem(V, D, big, torch.float32, seed=17, scale=3.0, device=ctx.device)
    kw = good_rows(ctx.device, B, seed=18)
    kw["temperature"][1] = 0.0  # greedy
    kw["temperature"][6] = 3e-6  # greedy too (below vLLM's epsilon)
    kw["temperature"][4] = float("nan")  # token -1 by design: a bad row, not a mismatch
    head = Head(ctx, transport, reduction, W)
    hb = h[:B]
    plan = [  # (hidden, kwargs, expected exception type or None)
        (hb, dict(kw, return_logprobs=True), None),
        (hb[:0], dict(seed=3), None),
        (hb[:0], dict(rows_of(kw, slice(0, 0)), return_logprobs=True), None),
        (hb, dict(kw, temperature=-1.0), "ValueError"),  # the same bad call everywhere
        (h[:CAP + 1], dict(seed=4), "ValueError"),  # over capacity everywhere
        (torch.cat([hb, hb[:, :1]], dim=1), kw, "ValueError"),
        (hb, dict(kw, offset=kw["offset"] + 1), None),
        (hb, dict(temperature=0.0, seed=5, offset=6, path="chunked"), None),  # scalar greedy: no noise at all
        ("reserve", big, None),
        (h, dict(seed=7, offset=8), None),  # a batch the reserve made room for
    ]
    outcomes, forwards = [], 0
    for hidden, args, _ in plan:
        if isinstance(hidden, str):
            outcomes.append({"error": outcome_of(lambda: head.head.reserve(args)), "tokens": None})
            continue
        outcomes.append(head.call(hidden, **args))
        forwards += 1
    checked = head.check()
    steps, capacity = head.head.step, head.head.max_batch_size
    closed = head.close()
    everyone = gather_objects(dict(outcomes=outcomes, checked=checked, steps=steps, capacity=capacity,
                                   closed=closed))
    for r, o in enumerate(everyone):
        assert o["checked"] is None and o["closed"] is None, (r, o)
        assert o["steps"] == forwards and o["capacity"] == 32, (r, o)
        for k, ((hidden, args, error), got) in enumerate(zip(plan, o["outcomes"])):
            assert got["error"] == error, (r, args, got)
            assert got["tokens"] == everyone[0]["outcomes"][k]["tokens"], (r, k, got)
            if got["tokens"] is None or error is not None:
                continue
            args = {k: v for k, v in args.items() if k in ("temperature", "seed", "offset")}
            ref, reliable = reference(reduction, tp, W, hidden, **args)
            if isinstance(args.get("temperature"), torch.Tensor):
                nan = torch.isnan(args["temperature"]).cpu().tolist()
                ref = [-1 if n else t for t, n in zip(ref, nan)]
                reliable = [True if n else ok for ok, n in zip(reliable, nan)]
            assert tokens_ok(got["tokens"], ref, reliable, bad_rows=()), (r, args, got, ref)
    assert everyone[0]["outcomes"][0]["tokens"][4] == -1


@mpi
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_the_check_can_fire_for_every_status_bit(dist_ctx, reduction):
    """The power of the check: each STATUS_* bit is reachable and named, and only the bits that apply are:
    a record mismatch alone (return_logprobs), with a peer error (an input error), a row mismatch alone
    (one row's seed). Before: no check at all."""
    W, h = problem(V, D, B, torch.float32, seed=19, device=dist_ctx.device)
    kw = good_rows(dist_ctx.device)
    last = dist_ctx.rank == dist_ctx.world_size - 1
    one_row = kw["seed"].clone()
    one_row[0] += 1
    cases = {RECORD: dict(kw, return_logprobs=last), RECORD | PEER_ERROR: dict(kw, temperature=-1.0 if last else 1.0),
             ROW: dict(kw, seed=one_row if last else kw["seed"])}
    seen = {}
    for bits, args in cases.items():
        head = Head(dist_ctx, "collective", reduction, W)
        head.call(h, **args)
        seen[bits] = head.check()
        head.close()
    everyone = gather_objects(seen)
    for o in everyone:
        for bits, message in o.items():
            assert message is not None and message.startswith(MISMATCH) and diverged(bits) in message, (bits, o)
    assert len({o[b] for o in everyone for b in cases}) == len(cases) * dist_ctx.world_size  # "rank r of n"


# ---- the hard timeout (tests/tensor_parallel/conftest.py) --------------------------------------
@mpi
@pytest.mark.skipif(os.environ.get("FSDIST_TEST_HANG_DEMO") != "1",
                    reason="deliberately hangs; run by hand with FSDIST_TEST_HANG_DEMO=1 and a small "
                           "FSDIST_TEST_HARD_TIMEOUT to see the watchdog kill it with a traceback")
def test_hang_demo_is_killed_by_the_hard_timeout(dist_ctx):
    """Rank 0 waits in a barrier the others skip (they wait in another group's barrier that rank 0 never
    enters): a real deadlock, which the conftest's watchdog must end within FSDIST_TEST_HARD_TIMEOUT."""
    other = dist.new_group(list(range(dist_ctx.world_size)))
    if dist_ctx.rank == 0:
        dist.barrier()
    else:
        dist.barrier(group=other)
    pytest.fail("unreachable: the ranks wait in different barriers")
