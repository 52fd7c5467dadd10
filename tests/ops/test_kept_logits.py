"""The extended stage-1 fields (``epilogue.tile_topk``) that stage 2 proves filtered rows from.

Every (row, tile) keeps its KEEP largest logits, largest first, the lowest id first among
equal ones, and the boundary (the largest logit it did not keep): checked against torch's
stable sort on logits full of ties, signed zeros, -inf and padding ids, for the fused
kernel (one-hot hidden, so it sees the same logits exactly) and the chunked path's pass.
Runs under Triton's interpreter on CPU and unchanged on CUDA.
"""
import pytest
import torch

from fsdist.ops.configs import TileConfig
from fsdist.ops.fused_sample import launch_fused
from fsdist.ops.layout import F_BOUNDARY, F_KEPT, KEEP, BufferPair, CandidateLayout
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
    tiles = full.view(B, n_t, BLOCK_V)
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
    assert torch.equal(boundary, ref_boundary)  # torch.equal: -0.0 equals +0.0, as in the kernels


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


@pytest.mark.parametrize("stage1", ["fused", "pass"])
def test_raw_sums_and_the_winner_logit_are_left_out_only_where_asked(device, stage1):
    """raw_sums=False writes NaN into the raw-sum field and logprobs=False the winner's score into
    the winner-logit field, each independently of the other; every other field is as with both."""
    from fsdist.ops.layout import F_RAW_SUM

    B, V_rows = 5, 1000
    logits = torch.randn(B, V_rows, generator=torch.Generator().manual_seed(3)) * 2
    params = RowParams(torch.full((B,), 0.8, device=device), torch.arange(B, device=device), torch.zeros(
        B, dtype=torch.int64, device=device))
    layout = CandidateLayout(CandidateLayout.fields(True, extended=True), -(-V_rows // BLOCK_V), B, n_ifields=1 + KEEP)
    out = {}
    for logprobs in (True, False):
        for raw_sums in (True, False):
            f, i = layout.alloc(device)
            if stage1 == "fused":
                hidden = torch.zeros(B, D)
                hidden[torch.arange(B), torch.arange(B)] = 1.0
                weight = torch.zeros(V_rows, D)
                weight[:, :B] = logits.T
                cfg = TileConfig(block_b=16, block_v=BLOCK_V, block_k=64, num_warps=4, num_stages=1)
                launch_fused(hidden.to(device), weight.to(device), params, cfg, layout, BufferPair(f, i),
                             vocab_size=V_rows, extended=True, logprobs=logprobs, raw_sums=raw_sums)
            else:
                launch_sample_logits(logits.to(device), params, layout, BufferPair(f, i), block_v=BLOCK_V,
                                     tiles=(0, layout.n_local), V_rows=V_rows, vocab_size=V_rows,
                                     logprobs=logprobs, extended=True, raw_sums=raw_sums)
            out[logprobs, raw_sums] = (f.view(layout.n_fields, layout.n_local, layout.batch_cap)[:, :, :B].cpu(),
                                       i.view(layout.n_ifields, layout.n_local, layout.batch_cap)[:, :, :B].cpu())
    ref_f, ref_i = out[True, True]
    others = [k for k in range(layout.n_fields) if k not in (1, F_RAW_SUM)]
    for (logprobs, raw_sums), (f, i) in out.items():
        assert torch.equal(i, ref_i) and torch.equal(f[others], ref_f[others])
        assert bool(torch.isfinite(f[F_RAW_SUM]).all()) if raw_sums else bool(torch.isnan(f[F_RAW_SUM]).all())
        # field 1: the winner's raw logit with logprobs, else its perturbed score stands in
        assert torch.equal(f[1], ref_f[1] if logprobs else f[0])
    assert not torch.equal(ref_f[1], ref_f[0])  # the two differ, so the check above can fail
