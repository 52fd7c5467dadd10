"""Stage 2's packed search (``select_filtered``): searching only each row's kept logits above the
boundary must give exactly what the search over all kept logits gives.

Both searches run on the same extended candidate buffer (written by the chunked path's pass
from known logits): tokens, proofs (fallback flags), logprobs and top-N must match on
peaked, flat and tied rows, every logprobs mode, greedy and unfiltered rows. The ``searched``
instrumentation shows which branch ran, so the comparison is never between two full
searches. Runs under Triton's interpreter on CPU and unchanged on CUDA.
"""
import pytest
import torch
import triton
import triton.language as tl

import fsdist.ops.select_filtered as sf
from fsdist.ops.layout import KEEP, BufferPair, CandidateLayout
from fsdist.ops.merge_candidates import launch_merge
from fsdist.ops.sample_logits import launch_sample_logits
from fsdist.params import RowParams

BLOCK_V = 128


def _stage1(device, logits, params):
    B, V_rows = logits.shape
    layout = CandidateLayout(CandidateLayout.fields(True, extended=True), -(-V_rows // BLOCK_V), B, n_ifields=1 + KEEP)
    buffers = BufferPair.alloc(layout, device)
    launch_sample_logits(logits.to(device), params, layout, buffers, block_v=BLOCK_V, tiles=(0, layout.n_local),
                         V_rows=V_rows, vocab_size=V_rows, logprobs=True, extended=True)
    return layout, buffers


def _select(layout, buffers, B, params, cap, **kw):
    tokens, lp, _ = launch_merge(layout, buffers, B, params, logprobs=True)
    top_n = kw.get("top_n", 0)
    top_ids = torch.full((B, top_n), -5, dtype=torch.int64, device=tokens.device)
    top_lp = torch.full((B, top_n), -5.0, device=tokens.device)
    searched = torch.full((B,), -7, dtype=torch.int32, device=tokens.device)
    fb = sf.launch_select_filtered(layout, buffers, B, params, tokens=tokens, logprobs=lp, top_ids=top_ids,
                                   top_lp=top_lp, cap=cap, searched=searched, **kw)
    return tokens.cpu(), lp.cpu(), top_ids.cpu(), top_lp.cpu(), fb.cpu(), searched.cpu()


def _assert_same_outcome(full, packed):
    assert torch.equal(full[4], packed[4])  # the same rows proven
    assert torch.equal(full[0], packed[0])  # the same tokens (-1 where the fallback will write)
    done = full[4] == 0  # what the fallback rewrites may differ: only finished rows are compared
    assert torch.equal(full[2][done], packed[2][done])
    # Logprobs: the normalisers sum the same masses in another order (fp32 rounding only).
    torch.testing.assert_close(packed[1][done], full[1][done], rtol=1e-6, atol=1e-6, equal_nan=True)
    torch.testing.assert_close(packed[3][done], full[3][done], rtol=1e-6, atol=1e-6, equal_nan=True)


def _mixed_rows(device, B, V_rows, scale_set, seed):
    g = torch.Generator().manual_seed(seed)
    scale = torch.tensor(scale_set)[torch.arange(B) % len(scale_set)]
    logits = torch.randn(B, V_rows, generator=g) * scale[:, None]
    logits[1] = torch.round(logits[1])  # ties
    logits[2, :100] = logits[2].max() + 1.0  # a tie group at the top
    temps = torch.rand(B, generator=g) + 0.3
    temps[3] = 0.0  # greedy
    top_k = torch.tensor([0, 5, 50, 1, 2000, 3])[torch.arange(B) % 6].int()
    top_p = torch.tensor([0.9, 1.0, 0.5, 0.95, 0.3])[torch.arange(B) % 5]
    min_p = torch.tensor([0.0, 0.05, 0.0, 0.2])[torch.arange(B) % 4]
    top_k[4], top_p[4], min_p[4] = 0, 1.0, 0.0  # an unfiltered row (top-N only)
    params = RowParams(temps.to(device), torch.arange(B, device=device) + 11, torch.full((B,), 3, device=device),
                       top_k=top_k.to(device), top_p=top_p.to(device), min_p=min_p.to(device))
    return logits, params


@pytest.mark.parametrize("mode", ["scaled", "raw", "processed"])
def test_packed_search_equals_the_full_search(device, mode):
    B, V_rows = 12, 8192
    logits, params = _mixed_rows(device, B, V_rows, [6.0, 4.0, 2.0], seed=7)
    layout, buffers = _stage1(device, logits, params)
    kw = dict(vocab_size=V_rows, top_n=5, mode=mode)
    full = _select(layout, buffers, B, params, 0, **kw)
    packed = _select(layout, buffers, B, params, sf.SEARCH_CAP, **kw)
    assert (full[5] == -1).all()  # cap 0: every row searched all of U
    assert (packed[5] >= 0).all() and (packed[5] < layout.n_slots * KEEP // 2).all()  # the packed branch ran
    _assert_same_outcome(full, packed)
    assert (full[4] == 0).sum() >= B // 2  # most rows are proven: the comparison is not vacuous


def test_flat_rows_fall_back_alike(device):
    """Nearly flat rows: many kept logits above the boundary, nuclei the kept logits cannot prove."""
    B, V_rows = 8, 8192
    logits, params = _mixed_rows(device, B, V_rows, [0.05, 0.5], seed=5)
    layout, buffers = _stage1(device, logits, params)
    full = _select(layout, buffers, B, params, 0, vocab_size=V_rows, top_n=3)
    packed = _select(layout, buffers, B, params, sf.SEARCH_CAP, vocab_size=V_rows, top_n=3)
    _assert_same_outcome(full, packed)
    assert (full[4] == 1).any()  # some flat rows fall back in both


def test_a_row_over_the_cap_takes_the_full_search(device):
    """A program whose rows have more kept logits above the boundary than the cap searches all of U
    (tiny caps force it); the results still equal cap=0."""
    B, V_rows = 4, 2048
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(B, V_rows, generator=g) * 3.0
    params = RowParams(torch.full((B,), 0.7, device=device), torch.arange(B, device=device),
                       torch.zeros(B, dtype=torch.int64, device=device),
                       top_k=torch.full((B,), 3, device=device, dtype=torch.int32))
    layout, buffers = _stage1(device, logits, params)
    full = _select(layout, buffers, B, params, 0, vocab_size=V_rows)
    for cap in (1, 2, sf.SEARCH_CAP):
        got = _select(layout, buffers, B, params, cap, vocab_size=V_rows)
        assert torch.equal(got[0], full[0]) and torch.equal(got[4], full[4])
        if cap == 1:
            assert (got[5] == -1).all()  # every row has more than one kept logit above B
    assert (full[4] == 0).all() and (full[0] >= 0).all()


def test_a_wrong_pack_would_be_caught(device):
    """Power: dropping the largest kept logit of every row (what a scatter one slot off would do)
    changes tokens or top-N, so the equality checks above can fail."""
    B, V_rows = 12, 8192
    logits, params = _mixed_rows(device, B, V_rows, [6.0, 4.0, 2.0], seed=7)
    layout, buffers = _stage1(device, logits, params)
    kw = dict(vocab_size=V_rows, top_n=5)
    ref = _select(layout, buffers, B, params, sf.SEARCH_CAP, **kw)
    cut = logits.clone()
    cut[torch.arange(B), cut.argmax(dim=1)] = float("-inf")
    layout, buffers = _stage1(device, cut, params)
    wrong = _select(layout, buffers, B, params, sf.SEARCH_CAP, **kw)
    with pytest.raises(AssertionError):
        _assert_same_outcome(ref, wrong)


def test_bad_cap_and_searched_are_refused(device):
    layout = CandidateLayout(CandidateLayout.fields(True, extended=True), 2, 1, n_ifields=1 + KEEP)
    buffers = BufferPair.alloc(layout, device)
    params = RowParams(1.0, 0, 0, top_k=3)
    tokens = torch.zeros(1, dtype=torch.int64, device=device)
    with pytest.raises(ValueError, match="cap"):
        sf.launch_select_filtered(layout, buffers, 1, params, vocab_size=200, tokens=tokens, cap=3)
    with pytest.raises(ValueError, match="searched"):
        sf.launch_select_filtered(layout, buffers, 1, params, vocab_size=200, tokens=tokens,
                                  searched=torch.zeros(1, dtype=torch.int64, device=device))


@triton.jit
def _search_kernel(vals_ptr, k_ptr, target_ptr, kth_ptr, nuc_ptr, N: tl.constexpr, R: tl.constexpr):
    r = tl.arange(0, R)
    c = tl.arange(0, N)
    vals = tl.load(vals_ptr + r[:, None] * N + c[None, :])
    live = vals > float("-inf")
    skeys = (sf.order_key(vals) - 2147483648).to(tl.int32)
    mass = tl.where(live, tl.exp(vals - tl.max(vals, axis=1)[:, None]), 0.0)
    tl.store(kth_ptr + r, sf.kth_largest_key(skeys, live, tl.load(k_ptr + r)))
    tl.store(nuc_ptr + r, sf.nucleus_key(skeys, mass, live, tl.load(target_ptr + r), tl.full([R], -1, tl.int64)))


def _order_key(v):
    b = (v + 0.0).view(torch.int32).to(torch.int64)
    return torch.where(b >= 0, b + 2 ** 31, 2 ** 31 - 1 - (b & (2 ** 31 - 1)))


def test_threshold_searches_match_a_sort(device):
    """kth_largest_key / nucleus_key (the bisections) against a sort: the k-th largest key,
    and the smallest key whose strictly-larger mass is below the target (ties, -inf, a target
    below the largest mass so the answer is the top key, and one above everything)."""
    R, N = 8, 64
    g = torch.Generator().manual_seed(11)
    vals = torch.randn(R, N, generator=g) * 2
    vals[1] = torch.round(vals[1])  # ties
    vals[2, 10:] = float("-inf")
    vals[3] = -vals[3].abs()  # negative keys only
    k = torch.tensor([1, 5, 10, 64, 3, 17, 2, 33], dtype=torch.int32)
    mass = torch.exp(vals - vals.max(dim=1, keepdim=True).values)
    frac = torch.tensor([0.9, 0.5, 0.99, 0.3, 1e-3, 0.7, 1.0, 0.95])
    target = (mass.sum(dim=1) * frac).float()
    kth = torch.empty(R, dtype=torch.int64, device=device)
    nuc = torch.empty(R, dtype=torch.int64, device=device)
    _search_kernel[(1,)](vals.to(device), k.to(device), target.to(device), kth, nuc, N=N, R=R)
    keys = _order_key(vals)
    ref_kth = keys.sort(dim=1, descending=True).values[torch.arange(R), k.long() - 1]
    assert torch.equal(kth.cpu(), ref_kth)
    # The defining property, in float64: the mass strictly above the answer is below the target,
    # and one key lower it is not (the mass above x only changes at keys, so this pins it down).
    for r in range(R):
        live = vals[r] > float("-inf")
        above = lambda x: float(mass[r][live & (keys[r] > x)].double().sum())  # noqa: E731
        got = int(nuc[r])
        assert above(got) < float(target[r]) and (got == 0 or above(got - 1) >= float(target[r])), (r, got)
