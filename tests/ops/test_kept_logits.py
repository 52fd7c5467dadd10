"""The extended stage-1 fields (``epilogue.tile_topk``) and stage 2's packed search (``select_filtered``).

* Every (row, tile) keeps its KEEP largest logits, largest first, the lowest id first among
  equal ones, and the boundary (the largest logit it did not keep): checked against torch
  on logits full of ties, signed zeros, -inf and padding, for the fused kernel (one-hot
  hidden, so it sees the same logits exactly) and the chunked path's pass.
* ``select_filtered`` searches only the kept logits above the boundary when a row has at
  most ``cap`` of them; the results (tokens, logprobs, top-N, fallback flags) must equal the
  search over all kept logits (cap=0), on peaked, flat and tied rows and every mode, and the
  packed branch must actually run (a row over the cap takes the full search).
Runs under Triton's interpreter on CPU and unchanged on CUDA.
"""
import pytest
import torch

import fsdist.ops.select_filtered as sf
from fsdist.ops.configs import TileConfig
from fsdist.ops.fused_sample import launch_fused
from fsdist.ops.layout import F_BOUNDARY, F_KEPT, KEEP, BufferPair, CandidateLayout
from fsdist.ops.merge_candidates import launch_merge
from fsdist.ops.sample_logits import launch_sample_logits
from fsdist.params import RowParams

BLOCK_V = 128
D = 64


def _tied_logits(B, V_rows, seed=0):
    """Logits on a coarse grid (many exact ties inside a tile), with -0.0 / +0.0, -inf ids and a
    row whose tiles are all -inf but one id."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-6, 7, (B, V_rows), generator=g).float() * 0.5
    x[x == 0] = torch.where(torch.rand((x == 0).sum(), generator=g) < 0.5, -0.0, 0.0)
    x[torch.rand(B, V_rows, generator=g) < 0.1] = float("-inf")
    x[1] = float("-inf")
    x[1, 300] = 2.0
    return x


def _reference(logits, vocab_size, vocab_start):
    """(kept values [B, tiles, KEEP], kept ids, boundary [B, tiles]) by a stable sort per tile."""
    B, V_rows = logits.shape
    n_t = -(-V_rows // BLOCK_V)
    full = torch.full((B, n_t * BLOCK_V), float("-inf"))
    full[:, :V_rows] = logits
    gid = vocab_start + torch.arange(n_t * BLOCK_V)
    full[:, gid >= vocab_size] = float("-inf")
    tiles = full.view(B, n_t, BLOCK_V) + 0.0  # + 0.0: -0.0 reads as +0.0, as the kernel keeps it
    order = torch.sort(-tiles, dim=2, stable=True).indices  # largest first, lowest column on ties
    vals = torch.gather(tiles, 2, order)
    ids = vocab_start + torch.arange(n_t)[None, :, None] * BLOCK_V + order
    return vals[..., :KEEP], ids[..., :KEEP], vals[..., KEEP]


def _kept_fields(f, i, layout, B):
    f = f.view(layout.n_fields, layout.n_local, layout.batch_cap)[:, :, :B].cpu()
    i = i.view(layout.n_ifields, layout.n_local, layout.batch_cap)[:, :, :B].cpu()
    vals = f[F_KEPT:F_KEPT + KEEP].permute(2, 1, 0)
    ids = i[1:1 + KEEP].permute(2, 1, 0).long()
    return vals, ids, f[F_BOUNDARY].T


@pytest.mark.parametrize("stage1", ["fused", "pass"])
def test_kept_logits_and_boundary_match_a_stable_sort(device, stage1):
    B, V_rows, vocab_start = 5, 1000, 4
    vocab_size = vocab_start + 990  # padding ids inside the last tile
    logits = _tied_logits(B, V_rows)
    params = RowParams(torch.full((B,), 0.8, device=device), torch.arange(B, device=device), torch.zeros(
        B, dtype=torch.int64, device=device))
    layout = CandidateLayout(CandidateLayout.fields(True, extended=True), -(-V_rows // BLOCK_V), B, n_ifields=1 + KEEP)
    f, i = layout.alloc(device)
    f.fill_(123.0)
    i.fill_(-7)
    if stage1 == "fused":
        # One-hot hidden rows: the kernel's dot products reproduce the logits exactly (fp32).
        hidden = torch.zeros(B, D)
        hidden[torch.arange(B), torch.arange(B)] = 1.0
        weight = torch.zeros(V_rows, D)
        weight[:, :B] = logits.T
        weight = torch.where(torch.isinf(weight), torch.zeros_like(weight), weight)
        cfg = TileConfig(block_b=16, block_v=BLOCK_V, block_k=64, num_warps=4, num_stages=1)
        launch_fused(hidden.to(device), weight.to(device), params, cfg, layout, BufferPair(f, i),
                     vocab_size=vocab_size, vocab_start=vocab_start, extended=True)
        logits = torch.where(torch.isinf(logits), torch.zeros_like(logits), logits)  # -inf is not a weight
    else:
        launch_sample_logits(logits.to(device), params, layout, BufferPair(f, i), block_v=BLOCK_V,
                             tiles=(0, layout.n_local), V_rows=V_rows, vocab_size=vocab_size, vocab_start=vocab_start,
                             logprobs=True, extended=True)
    vals, ids, boundary = _kept_fields(f, i, layout, B)
    ref_vals, ref_ids, ref_boundary = _reference(logits, vocab_size, vocab_start)
    assert torch.equal(vals, ref_vals)
    live = ref_vals > float("-inf")  # ids of -inf kept values are not read by stage 2
    assert torch.equal(ids[live], ref_ids[live])
    assert torch.equal(boundary, ref_boundary)
    # Signed zeros come back as +0.0 (the order key folds them; they compare equal anyway).
    assert not torch.signbit(vals[vals == 0]).any()


def test_the_kept_logits_check_can_fail(device):
    """Power: on the same logits, a highest-column-first tie rule keeps other ids, so the
    comparison above would catch a kernel that broke ties the wrong way."""
    B, V_rows = 5, 1000
    logits = _tied_logits(B, V_rows)
    ref_vals, ref_ids, _ = _reference(logits, V_rows, 0)
    n_t = ref_ids.shape[1]
    full = torch.full((B, n_t * BLOCK_V), float("-inf"))
    full[:, :V_rows] = logits
    tiles = full.view(B, n_t, BLOCK_V).flip(2) + 0.0
    order = torch.sort(-tiles, dim=2, stable=True).indices[..., :KEEP]
    wrong_ids = torch.arange(n_t)[None, :, None] * BLOCK_V + (BLOCK_V - 1 - order)
    live = ref_vals > float("-inf")
    assert not torch.equal(ref_ids[live], wrong_ids[live])


def _select(layout, buffers, B, params, cap, **kw):
    tokens, lp, _ = launch_merge(layout, buffers, B, params, logprobs=True)
    top_n = kw.get("top_n", 0)
    top_ids = torch.full((B, top_n), -5, dtype=torch.int64, device=tokens.device)
    top_lp = torch.full((B, top_n), -5.0, device=tokens.device)
    fb = sf.launch_select_filtered(layout, buffers, B, params, tokens=tokens, logprobs=lp, top_ids=top_ids,
                                   top_lp=top_lp, cap=cap, **kw)
    return tokens.cpu(), lp.cpu(), top_ids.cpu(), top_lp.cpu(), fb.cpu()


def _stage1(device, logits, params):
    B, V_rows = logits.shape
    layout = CandidateLayout(CandidateLayout.fields(True, extended=True), -(-V_rows // BLOCK_V), B, n_ifields=1 + KEEP)
    buffers = BufferPair.alloc(layout, device)
    launch_sample_logits(logits.to(device), params, layout, buffers, block_v=BLOCK_V, tiles=(0, layout.n_local),
                         V_rows=V_rows, vocab_size=V_rows, logprobs=True, extended=True)
    return layout, buffers


@pytest.mark.parametrize("mode", ["scaled", "raw", "processed"])
def test_packed_search_equals_the_full_search(device, mode):
    B, V_rows = 24, 2048
    g = torch.Generator().manual_seed(7)
    scale = torch.tensor([4.0, 2.0, 0.5, 0.05])[torch.arange(B) % 4]  # peaked .. nearly flat rows
    logits = torch.randn(B, V_rows, generator=g) * scale[:, None]
    logits[5] = torch.round(logits[5])  # ties
    logits[6, :100] = 3.0  # a tie group at the top
    temps = torch.rand(B, generator=g) + 0.3
    temps[7] = 0.0  # greedy
    top_k = torch.tensor([0, 5, 50, 1, 2000, 3])[torch.arange(B) % 6].int()
    top_p = torch.tensor([0.9, 1.0, 0.5, 0.95, 0.3])[torch.arange(B) % 5]
    min_p = torch.tensor([0.0, 0.05, 0.0, 0.2])[torch.arange(B) % 4]
    params = RowParams(temps.to(device), torch.arange(B, device=device) + 11, torch.full((B,), 3, device=device),
                       top_k=top_k.to(device), top_p=top_p.to(device), min_p=min_p.to(device))
    layout, buffers = _stage1(device, logits, params)
    kw = dict(vocab_size=V_rows, top_n=5, mode=mode)
    full = _select(layout, buffers, B, params, 0, **kw)
    packed = _select(layout, buffers, B, params, 256, **kw)
    assert torch.equal(full[4], packed[4])  # the same rows proven
    assert torch.equal(full[0], packed[0])  # the same tokens (-1 where the fallback will write)
    done = full[4] == 0  # what the fallback rewrites may differ: only finished rows are compared
    assert torch.equal(full[2][done], packed[2][done])
    # Logprobs: the normalisers sum the same masses in another order (fp32 rounding only).
    torch.testing.assert_close(packed[1][done], full[1][done], rtol=1e-6, atol=1e-6, equal_nan=True)
    torch.testing.assert_close(packed[3][done], full[3][done], rtol=1e-6, atol=1e-6, equal_nan=True)
    assert (full[4] == 0).sum() >= B // 2  # most rows are proven: the comparison is not vacuous
    assert (full[4] == 1).any()  # and the flat rows fall back in both


def test_packed_search_over_the_cap_takes_the_full_search(device, monkeypatch):
    """A row with more kept logits above the boundary than the cap: the kernel must search all of
    U for the batch (the results still equal cap=0); a tiny cap forces it here."""
    B, V_rows = 4, 2048
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(B, V_rows, generator=g) * 3.0
    params = RowParams(torch.full((B,), 0.7, device=device), torch.arange(B, device=device),
                       torch.zeros(B, dtype=torch.int64, device=device), top_k=torch.full((B,), 3, device=device,
                                                                                              dtype=torch.int32))
    layout, buffers = _stage1(device, logits, params)
    full = _select(layout, buffers, B, params, 0, vocab_size=V_rows)
    for cap in (1, 2, 256):
        got = _select(layout, buffers, B, params, cap, vocab_size=V_rows)
        assert torch.equal(got[0], full[0]) and torch.equal(got[4], full[4])
    assert (full[4] == 0).all() and (full[0] >= 0).all()


def test_bad_cap_is_refused(device):
    layout = CandidateLayout(CandidateLayout.fields(True, extended=True), 2, 1, n_ifields=1 + KEEP)
    buffers = BufferPair.alloc(layout, device)
    params = RowParams(1.0, 0, 0, top_k=3)
    tokens = torch.zeros(1, dtype=torch.int64, device=device)
    with pytest.raises(ValueError, match="cap"):
        sf.launch_select_filtered(layout, buffers, 1, params, vocab_size=200, tokens=tokens, cap=3)
