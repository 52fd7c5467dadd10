"""The call header at its source: fingerprints, step records and the checks the merges make.

Single process. The headers are written by hand (or by the real writers: stage 1, the
group-log-mass publish, the step-record kernel) into checked buffers laid out as the
tensor-parallel head lays them out, as if several ranks had published into them; then
``launch_merge`` / ``launch_group_select`` / ``launch_verify_step`` must poison exactly the
rows the header check (``load_headers`` / ``judge_headers``) promises and set exactly the STATUS_* bits that
say why.
"""
import pytest
import torch
import triton
import triton.language as tl

from fsdist.ops.group_select import ExchangeLayout, launch_group_publish, launch_group_select
from fsdist.ops.layout import BufferPair, CandidateLayout
from fsdist.ops.merge_candidates import launch_merge
from fsdist.ops.parity import DeviceParity
from fsdist.ops.plan import launch_stage1, plan_sample
from fsdist.ops.step_check import (ERROR_INPUT, FLAG_CHUNKED, FLAG_LOGPROBS, RECORD_WORDS, STATUS_PEER_ERROR,
                                   STATUS_RECORD_MISMATCH, STATUS_ROW_MISMATCH, STREAM_CHECK, HeaderCheck,
                                   call_flags, describe_status, filter_fingerprint, launch_step_record, processor_fingerprint, launch_verify_step, new_status,
                                   new_ticket, write_row_fingerprints, writes_header)
from fsdist.params import RowParams
from fsdist.reference import philox_uniform_bits

DEV = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
M32 = 0xFFFFFFFF


# ---- the fingerprint ---------------------------------------------------------------------
@triton.jit
def _fingerprint_probe(seed_ptr, off_ptr, temp_ptr, out_ptr, n, BLOCK: tl.constexpr):
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = rows < n
    seed = tl.load(seed_ptr + rows, mask=m, other=0)
    off = tl.load(off_ptr + rows, mask=m, other=0)
    temp = tl.load(temp_ptr + rows, mask=m, other=0.0)
    write_row_fingerprints(out_ptr, 0, rows, m, seed, off, temp, False, 1)


def fingerprints(seed, offset, temperature):
    """What the kernels' row_fingerprint gives for int64 / int64 / fp32 rows."""
    n = seed.numel()
    out = torch.full((n,), 7, dtype=torch.int32, device=DEV)
    _fingerprint_probe[(triton.cdiv(n, 64),)](seed.to(DEV), offset.to(DEV), temperature.to(DEV, torch.float32),
                                              out, n, BLOCK=64)
    return out.cpu()


def mirror_fingerprints(seed, offset, temperature):
    """Word 0 of Philox keyed by the seed at counter (temperature bits, offset, STREAM_CHECK), as int32."""
    bits = temperature.to(torch.float32).view(torch.int32).long() & M32
    word = philox_uniform_bits(seed.long(), offset.long(), bits, stream=STREAM_CHECK)
    return torch.where(word >= 2**31, word - 2**32, word).to(torch.int32)


def some_rows(n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    s = torch.randint(-2**63, 2**63 - 1, (n,), generator=g, dtype=torch.int64)
    o = torch.randint(-2**63, 2**63 - 1, (n,), generator=g, dtype=torch.int64)
    t = torch.rand(n, generator=g) * 2
    t[:6] = torch.tensor([0.0, -0.0, 1e-6, 1.0, float("nan"), float("inf")])
    s[:3] = torch.tensor([0, 1, -1])
    o[:3] = torch.tensor([0, 2**32, -1])
    return s, o, t


def test_fingerprint_matches_its_torch_mirror():
    s, o, t = some_rows()
    got = fingerprints(s, o, t)
    assert torch.equal(got, mirror_fingerprints(s, o, t))
    assert got.unique().numel() == got.numel(), "distinct rows should have distinct fingerprints"


def mirror_filter_fingerprint(top_k, top_p, min_p, B):
    """The filter fingerprint as int64 torch ops (what step_check computed before its kernel)."""
    def bits(x, is_int):
        x = x if isinstance(x, torch.Tensor) else torch.full((B,), x, dtype=torch.int64 if is_int else torch.float32)
        return x.cpu().to(torch.int64) if is_int else x.cpu().to(torch.float32).view(torch.int32).to(torch.int64)

    return (bits(top_k, True) * 0x9E3779B1 + bits(top_p, False) * 0x85EBCA77 + bits(min_p, False) * 0xC2B2AE3D) | 1


@pytest.mark.parametrize("B", [1, 130])
@pytest.mark.parametrize("which", ["all", "top_k", "top_p", "min_p", "k_and_p"])
def test_filter_fingerprint_kernel_matches_its_mirror_and_the_scalar_path(B, which):
    """The one-launch filter fingerprint equals the int64 torch formula for per-row tensors (any mix with
    scalars, B past one 128-row block), and a rank passing scalars gets the same bits as a rank passing the
    same values as [B] tensors. Distinct rows get distinct fingerprints; one changed filter value changes
    exactly its row's (the check's power)."""
    g = torch.Generator().manual_seed(B)
    k = torch.randint(0, 200000, (B,), generator=g, dtype=torch.int32)
    p = torch.rand(B, generator=g).clamp_min(1e-3)
    m = torch.rand(B, generator=g) * 0.5
    if B > 2:
        k[:3], p[:3], m[:3] = torch.tensor([0, 1, 151936]), torch.tensor([1.0, 0.9, 1e-7]), torch.tensor([0.0, 1.0, 0.05])
    scal = dict(top_k=50, top_p=0.9, min_p=0.05)
    args = dict(top_k=k.to(DEV), top_p=p.to(DEV), min_p=m.to(DEV))
    keep = {"all": "top_k top_p min_p", "k_and_p": "top_k top_p"}.get(which, which).split()
    call = {n: (args[n] if n in keep else scal[n]) for n in args}
    got = filter_fingerprint(**call)
    assert got.dtype == torch.int64 and got.shape == (B,) and got.device.type == DEV.type
    assert torch.equal(got.cpu(), mirror_filter_fingerprint(*call.values(), B))
    if which == "all":
        assert got.unique().numel() == B, "distinct rows should have distinct fingerprints"
        r = B - 1
        for name, bumped in (("top_k", k[r] + 1), ("top_p", torch.nextafter(p[r], torch.tensor(2.0))),
                             ("min_p", torch.nextafter(m[r], torch.tensor(2.0)))):
            changed = dict(call)
            changed[name] = call[name].clone()
            changed[name][r] = bumped.item()
            diff = (filter_fingerprint(**changed) != got).nonzero().flatten().tolist()
            assert diff == [r], (name, diff)
    # a scalar rank and a [B] rank with the same values agree
    same = {n: torch.full((B,), v, dtype=torch.int32 if n == "top_k" else torch.float32, device=DEV)
            for n, v in scal.items()}
    assert (filter_fingerprint(**same).cpu() == filter_fingerprint(**scal)).all()
    assert filter_fingerprint(0, 1.0, 0.0) == 0


def mirror_processor_fingerprint(bitmask, entries, values, penalties, bad_rows):
    """The processor fingerprint as int64 torch ops (what LogitProcessing.row_fingerprint computed before its
    kernel)."""
    fp = 0
    if bad_rows is not None:
        fp = bad_rows.cpu().to(torch.int64)
    if bitmask is not None:
        fp = fp * 1000003 + bitmask.cpu().sum(dim=1, dtype=torch.int64)
    if entries is not None:
        fp = fp * 1000033 + entries.cpu().sum(dim=1, dtype=torch.int64)
        fp = fp * 1000037 + values.cpu().view(torch.int32).sum(dim=1, dtype=torch.int64)
    if penalties is not None:
        rep, freq, pres = penalties.cpu().view(torch.int32).to(torch.int64).unbind(0)
        fp = fp * 1000039 + rep + freq * 7919 + pres * 104729
    return fp


@pytest.mark.parametrize("parts", ["all", "bitmask", "entries", "penalties", "bad+bitmask", "bitmask+penalties"])
@pytest.mark.parametrize("xor", ["none", "int", "tensor"])
def test_processor_fingerprint_kernel_matches_its_mirror(parts, xor):
    """The one-launch processor fingerprint equals the int64 torch formula (rows past one 1,024-word block, a
    non-contiguous bitmask view, negative words, bias values' float bits), XOR the filters' fingerprint (an int
    or [B]); nothing present gives the xor back; one changed word changes exactly its row (the check's power)."""
    g = torch.Generator().manual_seed(len(parts) * 7 + len(xor))
    B, W, S = 5, 2100, 37
    full = torch.randint(-2**31, 2**31 - 1, (B, W + 3), generator=g, dtype=torch.int64).to(torch.int32)
    have = set({"all": "bad bitmask entries penalties"}.get(parts, parts.replace("+", " ")).split())
    bitmask = full[:, 1:W + 1] if "bitmask" in have else None  # a view with a row stride of W + 3
    entries = torch.randint(0, 2**29, (B, S), generator=g, dtype=torch.int32) if "entries" in have else None
    values = torch.randn(B, S, generator=g) if "entries" in have else None
    penalties = torch.rand(3, B, generator=g) * 2 if "penalties" in have else None
    bad = torch.tensor([False, True, False, False, True]) if "bad" in have else None
    x = {"none": 0, "int": 0x1234567890AB, "tensor": torch.randint(-2**62, 2**62, (B,), generator=g)}[xor]
    dev = [t.to(DEV) if t is not None else None for t in (bitmask, entries, values, penalties, bad)]
    xd = x.to(DEV) if isinstance(x, torch.Tensor) else x
    got = processor_fingerprint(*dev, xd)
    want = mirror_processor_fingerprint(bitmask, entries, values, penalties, bad) ^ x
    assert torch.equal(got.cpu(), want)
    if bitmask is not None:
        changed = dev[0].clone()
        changed[3, W - 1] ^= 1 << 7
        diff = (processor_fingerprint(changed, *dev[1:], xd) != got).nonzero().flatten().tolist()
        assert diff == [3], diff
    assert processor_fingerprint(None, None, None, None, None, xd) is xd


def test_fingerprints_read_strided_views_and_one_element_filters_like_dense_rows():
    """The kernels read rows at unit stride: strided views (every other row, a transposed penalty table, a strided
    bad-row or xor vector) and a one-element filter tensor (standing for every row) give the dense rows' bits."""
    k = torch.arange(12, dtype=torch.int32, device=DEV)[::2]
    assert torch.equal(filter_fingerprint(k, 0.9, 0.0), filter_fingerprint(k.contiguous(), 0.9, 0.0))
    p4 = torch.full((4,), 0.9, device=DEV)
    assert torch.equal(filter_fingerprint(torch.tensor(50, dtype=torch.int32, device=DEV), p4, 0.0),
                       filter_fingerprint(torch.full((4,), 50, dtype=torch.int32, device=DEV), p4, 0.0))
    g = torch.Generator().manual_seed(3)
    pen = torch.rand(4, 3, generator=g).to(DEV).t()  # [3, 4] with stride (1, 3)
    bad = torch.tensor([True, False, False, True, True, False, False, False], device=DEV)[::2]
    xor = torch.arange(8, device=DEV)[::2]
    got = processor_fingerprint(None, None, None, pen, bad, xor)
    assert torch.equal(got.cpu(), mirror_processor_fingerprint(None, None, None, pen.contiguous(), bad.contiguous())
                       ^ xor.cpu().contiguous())


@pytest.mark.parametrize("what", ["seed", "offset", "temperature"])
def test_fingerprint_changes_with_every_bit_of_its_inputs(what):
    """Flipping any single bit of seed, offset or temperature changes every row's fingerprint."""
    s, o, t = some_rows(32, seed=1)
    base = fingerprints(s, o, t)
    nbits = 32 if what == "temperature" else 64
    for bit in range(nbits):
        s2, o2, t2 = s.clone(), o.clone(), t.clone()
        if what == "seed":
            s2 ^= torch.tensor(1, dtype=torch.int64) << bit
        elif what == "offset":
            o2 ^= torch.tensor(1, dtype=torch.int64) << bit
        else:
            t2 = (t.view(torch.int32) ^ torch.tensor(1, dtype=torch.int32) << bit).view(torch.float32)
        flipped = fingerprints(s2, o2, t2)
        assert bool((flipped != base).all()), f"{what} bit {bit}: rows {(flipped == base).nonzero().flatten().tolist()}"


def test_fingerprint_depends_on_nothing_else():
    """Not on the row's position, its neighbours, or the launch: a pure function of (seed, offset, T bits)."""
    s, o, t = some_rows(100, seed=2)
    base = fingerprints(s, o, t)
    assert torch.equal(fingerprints(s, o, t), base)  # again
    perm = torch.randperm(100, generator=torch.Generator().manual_seed(3))
    assert torch.equal(fingerprints(s[perm], o[perm], t[perm]), base[perm])  # other rows, other programs
    assert torch.equal(fingerprints(s[:5], o[:5], t[:5]), base[:5])  # other batch size
    # -0.0 and 0.0 (both greedy) are different bits, hence different fingerprints; NaN is one value.
    assert base[0] != base[1]
    assert fingerprints(s[4:5], o[4:5], torch.tensor([float("nan")])) == base[4]


# ---- the writers: stage 1, the step record, the group publish ------------------------------
def int_view(layout: CandidateLayout, i: torch.Tensor):
    """[n_shards, n_local + 2, batch_cap] view of a checked candidate layout's int32 buffer."""
    return i.view(layout.n_shards, layout.n_local + 2, layout.batch_cap)


@pytest.mark.parametrize("path", ["fused", "chunked"])
@pytest.mark.parametrize("logprobs", [False, True])
@pytest.mark.parametrize("per_row", [False, True])
def test_stage1_writes_the_header(path, logprobs, per_row):
    """Stage 1 into a checked layout writes the rows' fingerprints and (step, B, flags, 0) into its
    shard's header slots, in the copy the device counter picks; the other shards and copy stay untouched."""
    D, rows, block_v, B, cap, shards, shard = 16, 256, 128, 5, 16, 3, 1
    plan = plan_sample(batch=B, hidden_size=D, weight_rows=rows, device=DEV, logprobs=logprobs, path=path,
                       block_v=block_v, n_shards=shards, batch_cap=cap, n_fields=4, checked=True)
    layout = plan.layout
    assert layout.checked and layout.n_local == 2
    g = torch.Generator().manual_seed(4)
    hidden = torch.randn(B, D, generator=g).to(DEV)
    weight = torch.randn(rows, D, generator=g).to(DEV)
    s = torch.randint(0, 2**62, (B,), generator=g)
    o = torch.randint(0, 2**40, (B,), generator=g)
    t = torch.rand(B, generator=g) + 0.5
    if per_row:
        params = RowParams(t.to(DEV), s.to(DEV), o.to(DEV))
    else:
        params = RowParams(float(t[0]), int(s[0]), int(o[0]))
        s, o, t = s[:1].expand(B), o[:1].expand(B), t[:1].expand(B)
    counter = torch.tensor([2**31 + 2**33 + 13], dtype=torch.int64, device=DEV)  # odd: copy 1, step 13
    f = torch.zeros(2 * layout.float_numel, device=DEV)
    i = torch.full((2 * layout.int_numel,), -7, dtype=torch.int32, device=DEV)
    dest = BufferPair(f, i, parity=DeviceParity(counter, layout.float_numel, layout.int_numel))
    launch_stage1(plan, hidden, weight, params, dest, vocab_size=shards * rows, vocab_start=shard * rows, shard=shard)
    copies = i.view(2, -1).cpu()
    assert bool((copies[0] == -7).all()), "copy 0 was written with the counter odd"
    view = int_view(layout, copies[1])
    assert torch.equal(view[shard, layout.n_local, :B], mirror_fingerprints(s, o, t))
    flags = (FLAG_LOGPROBS if logprobs else 0) | (FLAG_CHUNKED if path == "chunked" else 0)
    assert call_flags(logprobs, path == "chunked") == flags
    assert view[shard, layout.n_local + 1, :RECORD_WORDS].tolist() == [13, B, flags, 0]
    others = [k for k in range(shards) if k != shard]
    assert bool((view[others] == -7).all()), "another shard's block was written"


def test_step_record_through_a_peer_table():
    """launch_step_record stores (step, batch, flags, error) at the same offset of every peer's buffer
    (host tensors stand in for three ranks' buffers), in the copy the counter picks; without a table only
    locally; without a device counter it refuses."""
    n, cap, R = 40, 16, 3
    peers = [torch.zeros(2 * n, dtype=torch.int32, device=DEV) for _ in range(R)]
    table = torch.tensor([p.data_ptr() for p in peers], dtype=torch.int64, device=DEV)
    dummy_f = torch.zeros(2 * R, dtype=torch.int64, device=DEV)  # the fp32 side is never touched
    counter = torch.tensor([2**40 + 7], dtype=torch.int64, device=DEV)  # odd: copy 1; step = low 31 bits
    parity = DeviceParity(counter, 0, n)
    launch_step_record(BufferPair(dummy_f, table, npeers=R, parity=parity), cap + 3, 0, FLAG_LOGPROBS, 0)
    for p in peers:
        assert p[n + cap + 3:n + cap + 3 + RECORD_WORDS].tolist() == [7, 0, FLAG_LOGPROBS, 0]
        assert int(p.count_nonzero()) == 2  # step and flags, nothing else
    # local buffer, copy 0, an error record
    local = torch.zeros(2 * n, dtype=torch.int32, device=DEV)
    counter.fill_(2**31 + 4)
    launch_step_record(BufferPair(dummy_f, local, parity=parity), 2, -1, 0, ERROR_INPUT)
    assert local[2:2 + RECORD_WORDS].tolist() == [4, -1, 0, ERROR_INPUT]
    assert int(local.count_nonzero()) == 3
    with pytest.raises(ValueError, match="step counter"):
        launch_step_record(BufferPair(dummy_f, local), 0, 1, 0, 0)


def test_writes_header_asks_for_the_step_counter():
    """writes_header: a checked layout writes the call's header and needs the device step counter (the step
    word comes from it); an unchecked layout writes none, with or without a counter."""
    checked = CandidateLayout(1, 2, 4, checked=True)
    plain = CandidateLayout(1, 2, 4)
    counter = DeviceParity(torch.zeros(1, dtype=torch.int64, device=DEV), 0, 0)
    f, i = checked.alloc(DEV)
    assert writes_header(checked, BufferPair(f, i, parity=counter)) is True
    assert writes_header(plain, BufferPair(f, i)) is False
    assert writes_header(plain, BufferPair(f, i, parity=counter)) is False
    with pytest.raises(ValueError, match="device step counter"):
        writes_header(checked, BufferPair(f, i))


# ---- merging candidates: the header check inside launch_merge ---------------------------------
class Candidates:
    """A checked candidate buffer of R shards with distinct scores and ids, and agreeing headers."""

    def __init__(self, R=3, n_local=2, cap=16, B=6, seed=0, step=9, flags=0):
        self.layout = CandidateLayout(CandidateLayout.fields(False), n_local, cap, R, checked=True)
        self.B = B
        g = torch.Generator().manual_seed(seed)
        f, i = self.layout.alloc(DEV)
        self.f, self.i = f, i
        scores = torch.randn(R * n_local, cap, generator=g)
        f.view(R, n_local, cap).copy_(scores.view(R, n_local, cap))
        iv = int_view(self.layout, i)
        ids = (torch.arange(R * n_local) * 1000)[:, None] + torch.arange(cap)[None, :]
        iv[:, :n_local] = ids.view(R, n_local, cap).to(DEV, torch.int32)
        fp = torch.randint(-2**31, 2**31 - 1, (cap,), generator=g, dtype=torch.int64).to(torch.int32)
        iv[:, n_local] = fp.to(DEV)
        iv[:, n_local + 1] = 0
        iv[:, n_local + 1, :RECORD_WORDS] = torch.tensor([step, B, flags, 0], dtype=torch.int32, device=DEV)
        # what an unchecked merge returns: the id of the best slot
        best = scores[:, :B].argmax(0)
        self.expected = ids[best, torch.arange(B)]

    @property
    def iv(self):
        return int_view(self.layout, self.i)

    def record(self, shard):
        return self.iv[shard, self.layout.n_local + 1, :RECORD_WORDS]

    def fingerprints(self, shard):
        return self.iv[shard, self.layout.n_local]

    def merge(self, me=0, status=None, blocks=None):
        status = new_status(DEV) if status is None else status
        tokens, _, _ = launch_merge(self.layout, BufferPair(self.f, self.i), self.B, RowParams(1.0, 0, 0),
                                    check=HeaderCheck(me, status), blocks=blocks)
        return tokens.cpu(), int((status[0] | status[1]).item())


@pytest.mark.parametrize("me", [0, 1, 2])
def test_merge_with_agreeing_headers_sets_nothing(me):
    c = Candidates()
    tokens, status = c.merge(me)
    assert status == 0 and describe_status(status) == "no mismatch"
    assert torch.equal(tokens, c.expected)
    # fingerprints and records past the batch are not compared
    c.fingerprints(2)[c.B:] += 1
    c.iv[1, c.layout.n_local + 1, RECORD_WORDS:] += 1
    tokens, status = c.merge(me)
    assert status == 0 and torch.equal(tokens, c.expected)


@pytest.mark.parametrize("word", [0, 1, 2], ids=["step", "batch", "flags"])
@pytest.mark.parametrize("me", [0, 2])
def test_record_mismatch_poisons_every_row(word, me):
    c = Candidates()
    c.record(1)[word] += 1
    tokens, status = c.merge(me)
    assert status == STATUS_RECORD_MISMATCH
    assert tokens.tolist() == [-1] * c.B


@pytest.mark.parametrize("me", [0, 1])
def test_peer_error_record(me):
    """A writer that published an error record (its local error) poisons the step for everyone else."""
    c = Candidates()
    c.record(1).copy_(torch.tensor([9, -1, 0, ERROR_INPUT], dtype=torch.int32))
    tokens, status = c.merge(me)
    assert status == STATUS_RECORD_MISMATCH | STATUS_PEER_ERROR
    assert tokens.tolist() == [-1] * c.B
    assert "reported an error" in describe_status(status) and "different calls" in describe_status(status)


def test_identical_error_records_set_nothing():
    """Writers that all report the same error made the same (bad) call: no mismatch."""
    c = Candidates()
    for k in range(3):
        c.record(k).copy_(torch.tensor([9, -1, 0, ERROR_INPUT], dtype=torch.int32))
    assert c.merge(0)[1] == 0


@pytest.mark.parametrize("row", [0, 3, 5])
@pytest.mark.parametrize("me", [0, 1])
def test_fingerprint_mismatch_poisons_exactly_that_row(row, me):
    c = Candidates()
    c.fingerprints(2)[row] ^= 1 << 20
    tokens, status = c.merge(me)
    assert status == STATUS_ROW_MISMATCH
    want = c.expected.clone()
    want[row] = -1
    assert torch.equal(tokens, want)


def test_record_mismatch_outranks_row_mismatch():
    """With differing records the fingerprints mean nothing: every row -1, only the record bit."""
    c = Candidates()
    c.fingerprints(1)[2] += 1
    c.record(2)[1] = c.B + 1
    tokens, status = c.merge(1)
    assert status == STATUS_RECORD_MISMATCH and tokens.tolist() == [-1] * c.B


@pytest.mark.parametrize("R", [1, 2, 3, 5])
def test_random_headers_against_a_python_reference(R):
    """The merge's header check (load_headers before its loop, judge_headers after) on random disagreements,
    any number of writers (a power of two or not: the [NW, ...] loads mask the writers past R) and any ``me``:
    status bits and poisoned rows equal a plain Python reading of the rules. Over the cases every outcome
    occurs (nothing, a row mismatch, a record mismatch, a peer error), so a check that ignored one kind of
    disagreement would fail here."""
    g = torch.Generator().manual_seed(100 + R)
    seen = set()
    for case in range(24):
        c = Candidates(R=R, seed=case)
        kind = case % 4
        for _ in range(int(torch.randint(1, 3, (1,), generator=g))):
            k = int(torch.randint(0, R, (1,), generator=g))
            if kind == 1:  # a row's fingerprint
                c.fingerprints(k)[int(torch.randint(0, c.B, (1,), generator=g))] ^= 1 << 7
            elif kind == 2:  # a record word (step, batch or flags)
                c.record(k)[int(torch.randint(0, 3, (1,), generator=g))] += 1
            elif kind == 3:  # a writer's error
                c.record(k)[3] = ERROR_INPUT
        me = int(torch.randint(0, R, (1,), generator=g))
        tokens, status = c.merge(me)
        recs = [c.record(k).tolist() for k in range(R)]
        fps = [c.fingerprints(k)[:c.B].tolist() for k in range(R)]
        differ = any(r != recs[me] for r in recs)
        err = any(r[3] != 0 for r in recs)
        bad_rows = [] if differ else [b for b in range(c.B) if any(f[b] != fps[me][b] for f in fps)]
        want_status = ((STATUS_RECORD_MISMATCH if differ else 0) | (STATUS_PEER_ERROR if differ and err else 0)
                       | (STATUS_ROW_MISMATCH if bad_rows else 0))
        want = c.expected.clone()
        if differ:
            want[:] = -1
        want[bad_rows] = -1
        assert status == want_status, (case, me, recs)
        assert torch.equal(tokens, want), (case, me)
        seen.add(want_status)
    if R > 1:
        assert {0, STATUS_ROW_MISMATCH, STATUS_RECORD_MISMATCH,
                STATUS_RECORD_MISMATCH | STATUS_PEER_ERROR} <= seen, seen


@pytest.mark.parametrize("bit", [STATUS_RECORD_MISMATCH, STATUS_PEER_ERROR, STATUS_ROW_MISMATCH])
def test_a_set_status_word_poisons_later_merges(bit):
    c = Candidates()
    status = torch.tensor([bit, 0], dtype=torch.int32, device=DEV)
    tokens, after = c.merge(0, status)
    assert tokens.tolist() == [-1] * c.B and after == bit  # agreeing headers add nothing


@pytest.mark.skipif(DEV.type == "cuda", reason="deterministic only under the interpreter, which runs programs in order")
def test_row_mismatch_poisons_only_its_row_whatever_the_program_grid():
    """Two rows per program (the GPU's merge grid): a fingerprint mismatch in row 0 must poison row 0
    only, as with one program. (It once poisoned rows 2..5 too: the merge read the status word that
    earlier programs of the same launch had just set. Findings now go to word 1 until the step ends.)"""
    c = Candidates()
    c.fingerprints(2)[0] ^= 1
    one_program, _ = c.merge(0)
    grid_of_three, status = c.merge(0, blocks=(2, 8))
    want = c.expected.clone()
    want[0] = -1
    assert torch.equal(one_program, want)
    assert status == STATUS_ROW_MISMATCH
    assert torch.equal(grid_of_three, want)


def test_merge_checks_the_copy_the_counter_picks():
    """With a device parity the headers are read from the copy the counter picks, like the candidates."""
    a, b = Candidates(seed=1), Candidates(seed=1)
    b.record(1)[0] += 5  # copy 1 is stale for shard 1
    f = torch.cat([a.f, b.f])
    i = torch.cat([a.i, b.i])
    counter = torch.zeros(1, dtype=torch.int64, device=DEV)
    src = BufferPair(f, i, parity=DeviceParity(counter, a.layout.float_numel, a.layout.int_numel))
    for value, want_status in [(0, 0), (1, STATUS_RECORD_MISMATCH), (2, 0)]:
        counter.fill_(value)
        status = new_status(DEV)
        tokens, _, _ = launch_merge(a.layout, src, a.B, RowParams(1.0, 0, 0), check=HeaderCheck(0, status))
        assert int((status[0] | status[1]).item()) == want_status
        assert torch.equal(tokens.cpu(), a.expected if want_status == 0 else torch.full((a.B,), -1))


def test_launch_merge_refuses_a_check_on_an_unchecked_layout():
    c = Candidates()
    unchecked = CandidateLayout(1, 2, 16, 3)
    with pytest.raises(ValueError, match="checked layout"):
        launch_merge(unchecked, BufferPair(c.f, c.i), c.B, RowParams(1.0, 0, 0), check=HeaderCheck(0, new_status(DEV)))
    with pytest.raises(ValueError, match="checked layout"):
        launch_merge(c.layout, BufferPair(c.f, c.i), c.B, RowParams(1.0, 0, 0))


# ---- verifying a step without rows (a local error, an empty batch) -------------------------
class Records:
    """Only the step records of R writers, laid out like a checked candidate buffer."""

    def __init__(self, R=3, records=None):
        self.layout = CandidateLayout(1, 2, 16, R, checked=True)
        _, self.i = self.layout.alloc(DEV)
        self.i.fill_(123)  # garbage everywhere else, fingerprints included
        iv = int_view(self.layout, self.i)
        for k, rec in enumerate(records):
            iv[k, self.layout.n_local + 1, :RECORD_WORDS] = torch.tensor(rec, dtype=torch.int32)

    def verify(self, me, status=None, parity=None):
        status = new_status(DEV) if status is None else status
        launch_verify_step(BufferPair(self.i.float(), self.i, parity=parity), me, self.layout.n_shards,
                           self.layout.stride_shard_i, self.layout.record_slot, status)
        return int((status[0] | status[1]).item())


@pytest.mark.parametrize("records,bits", [
    ([[4, 0, 0, 0]] * 3, 0),  # an empty batch everywhere
    ([[4, -1, 0, ERROR_INPUT]] * 3, 0),  # the same bad call everywhere
    ([[4, 0, 0, 0], [4, 0, 0, 0], [4, 0, FLAG_LOGPROBS, 0]], STATUS_RECORD_MISMATCH),
    ([[4, 0, 0, 0], [4, 5, 0, 0], [4, 0, 0, 0]], STATUS_RECORD_MISMATCH),
    ([[4, 0, 0, 0], [4, 0, 0, 0], [3, 0, 0, 0]], STATUS_RECORD_MISMATCH),
    ([[4, 0, 0, 0], [4, -1, 0, ERROR_INPUT], [4, 0, 0, 0]], STATUS_RECORD_MISMATCH | STATUS_PEER_ERROR),
], ids=["empty", "same-error", "flags", "batch", "step", "peer-error"])
@pytest.mark.parametrize("me", [0, 1, 2])
def test_verify_step_sees_record_mismatches(records, bits, me):
    assert Records(records=records).verify(me) == bits


def test_verify_step_reads_the_copy_the_counter_picks_and_keeps_bits():
    r = Records(records=[[4, 0, 0, 0]] * 3)
    two = torch.cat([r.i, r.i.clone()])
    iv = int_view(r.layout, two[r.layout.int_numel:])
    iv[1, r.layout.n_local + 1, 0] = 5  # copy 1: writer 1 is a step ahead
    counter = torch.zeros(1, dtype=torch.int64, device=DEV)
    parity = DeviceParity(counter, 0, r.layout.int_numel)
    r.i = two
    assert r.verify(0, parity=parity) == 0
    counter.fill_(3)
    assert r.verify(0, parity=parity) == STATUS_RECORD_MISMATCH
    counter.fill_(2)
    sticky = torch.tensor([STATUS_ROW_MISMATCH, 0], dtype=torch.int32, device=DEV)
    assert r.verify(0, sticky, parity=parity) == STATUS_ROW_MISMATCH  # ORed into, never cleared


# ---- group select: check_headers inside launch_group_select ---------------------------------
def publish_all(R, B, cap, params_per_rank, flags_per_rank, counter, seed=0):
    """R ranks' published records (via the real publish kernel) in one checked exchange buffer."""
    layout = ExchangeLayout(R, cap, checked=True)
    g = torch.Generator().manual_seed(seed)
    f = torch.zeros(2 * layout.float_numel, device=DEV)
    i = torch.zeros(2 * layout.int_numel, dtype=torch.int32, device=DEV)
    parity = DeviceParity(counter, layout.float_numel, layout.int_numel)
    for r in range(R):
        tok = torch.randint(0, 1000, (B,), generator=g).to(DEV) + 1000 * r
        lp = (-torch.rand(B, generator=g)).to(DEV)
        st = torch.stack([torch.randn(B, generator=g), torch.rand(B, generator=g)]).to(DEV)
        launch_group_publish(tok, lp, st, layout, BufferPair(f, i, parity=parity), rank=r,
                             params=params_per_rank[r], flags=flags_per_rank[r])
    return layout, BufferPair(f, i, parity=parity)


def group_rows(B, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(B, generator=g).to(DEV) + 0.5, torch.randint(0, 2**62, (B,), generator=g).to(DEV),
            torch.randint(0, 2**40, (B,), generator=g).to(DEV))


@pytest.mark.parametrize("case", ["agree", "seed-row", "offset-row", "temperature-row", "flags", "scalar-seed"])
def test_group_select_checks_headers(case):
    R, B, cap = 3, 7, 16
    t, s, o = group_rows(B)
    params = [RowParams(t, s, o) for _ in range(R)]
    flags = [FLAG_LOGPROBS] * R
    bad_row = 4
    if case == "seed-row":
        s2 = s.clone()
        s2[bad_row] += 1
        params[2] = RowParams(t, s2, o)
    elif case == "offset-row":
        o2 = o.clone()
        o2[bad_row] ^= 1 << 35
        params[1] = RowParams(t, s, o2)
    elif case == "temperature-row":
        t2 = t.clone()
        t2[bad_row] = torch.nextafter(t2[bad_row], torch.tensor(2.0, device=DEV))
        params[0] = RowParams(t2, s, o)
    elif case == "flags":
        flags[1] = 0
    elif case == "scalar-seed":
        params = [RowParams(1.0, 5 + (r == 2), 3) for r in range(R)]
    counter = torch.tensor([5], dtype=torch.int64, device=DEV)
    layout, src = publish_all(R, B, cap, params, flags, counter)
    # The same values published with agreeing headers: what every rank would pick.
    _, agreeing = publish_all(R, B, cap, [params[0]] * R, [FLAG_LOGPROBS] * R, counter)
    status = new_status(DEV)
    plain = launch_group_select(layout, agreeing, B, params[0], check=HeaderCheck(0, status))[0].cpu()
    assert int((status[0] | status[1]).item()) == 0 and bool((plain >= 0).all())
    keep = torch.arange(B) != bad_row
    for me in range(R):
        status = new_status(DEV)
        tokens = launch_group_select(layout, src, B, params[me], check=HeaderCheck(me, status))[0].cpu()
        bits = int((status[0] | status[1]).item())
        if case == "agree":
            assert bits == 0 and torch.equal(tokens, plain)
        elif case in ("flags", "scalar-seed"):
            assert bits == (STATUS_RECORD_MISMATCH if case == "flags" else STATUS_ROW_MISMATCH)
            assert tokens.tolist() == [-1] * B
        else:  # exactly the row whose parameters differ; the others as if nothing happened
            assert bits == STATUS_ROW_MISMATCH
            assert tokens[bad_row] == -1 and torch.equal(tokens[keep], plain[keep])


def test_group_select_with_a_set_status_word_and_the_unchecked_layout():
    R, B, cap = 2, 5, 16
    t, s, o = group_rows(B, seed=3)
    counter = torch.tensor([0], dtype=torch.int64, device=DEV)
    layout, src = publish_all(R, B, cap, [RowParams(t, s, o)] * R, [0] * R, counter)
    status = torch.tensor([STATUS_PEER_ERROR | STATUS_RECORD_MISMATCH, 0], dtype=torch.int32, device=DEV)
    tokens = launch_group_select(layout, src, B, RowParams(t, s, o), check=HeaderCheck(1, status))[0]
    assert tokens.tolist() == [-1] * B and int((status[0] | status[1]).item()) == 3
    with pytest.raises(ValueError, match="checked layout"):
        launch_group_select(layout, src, B, RowParams(t, s, o))
    with pytest.raises(ValueError, match="needs params"):
        launch_group_publish(torch.zeros(B, dtype=torch.int64, device=DEV), torch.zeros(B, device=DEV),
                             torch.zeros(2, B, device=DEV), layout, BufferPair(src.f, src.i), rank=0)


@pytest.mark.parametrize("blocks", [None, (1, 4)], ids=["one-program", "a-program-per-row"])
def test_a_merge_that_ends_the_step(blocks):
    """With a ticket the merge's last program does end_step's work: the device counter advances by exactly
    one per merge however many programs ran, the step's findings join the sticky word and word 1 is cleared,
    and the ticket is back at zero for the next step."""
    c = Candidates()
    counter = torch.tensor([41], dtype=torch.int64, device=DEV)
    ticket, status = new_ticket(DEV), new_status(DEV)
    pair = BufferPair(c.f, c.i, parity=DeviceParity(counter, 0, 0))

    def merge():
        return launch_merge(c.layout, pair, c.B, RowParams(1.0, 0, 0), check=HeaderCheck(0, status), blocks=blocks,
                            end_step=ticket)[0].cpu()

    assert torch.equal(merge(), c.expected)
    assert (int(counter.item()), int(ticket.item()), status.tolist()) == (42, 0, [0, 0])
    c.record(1)[1] += 1  # a batch mismatch: this step's finding must reach the sticky word
    assert merge().tolist() == [-1] * c.B
    assert (int(counter.item()), int(ticket.item()), status.tolist()) == (43, 0, [STATUS_RECORD_MISMATCH, 0])
    with pytest.raises(ValueError, match="ends the step only with a header check"):  # no rows: no last program
        launch_merge(c.layout, pair, 0, RowParams(1.0, 0, 0), check=HeaderCheck(0, status), end_step=ticket)
    with pytest.raises(ValueError, match="ends the step only with a header check"):
        launch_merge(c.layout, BufferPair(c.f, c.i), c.B, RowParams(1.0, 0, 0), check=HeaderCheck(0, status),
                     end_step=ticket)
