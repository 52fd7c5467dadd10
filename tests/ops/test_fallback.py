"""The exact fallback (``fsdist.ops.fallback``): its two ways of finishing a row agree, and the
cheap one recomputes only what a row needs.

select_filtered gives each row it cannot prove a need key: a lower bound on every threshold
the row needs, or 0. A row with a key has only the vocabulary tiles whose boundary reaches
the key recomputed, and is finished from those plus its kept logits; a row with 0 has its
whole logits row recomputed. Both must give the same tokens, logprobs and top-N (checked on
mixed filtered batches, every way the filters combine, with REFINE_CAP = 0 forcing the
whole-row way), the cheap way must write only the tiles it needs, and a lower bound set too
high must be caught by the same comparison (its power). Runs under Triton's interpreter on
CPU and unchanged on CUDA.
"""
import math

import pytest
import torch

import fsdist.ops.select_filtered as sf
from fsdist.ops.fallback import POOL_ROWS, POOL_ROWS_INTERPRETER, KeptLogits, PoolLayout, \
    launch_materialize, run_fallback
from fsdist.ops.layout import F_BOUNDARY, BufferPair
from fsdist.ops.merge_candidates import launch_merge
from fsdist.ops.plan import launch_stage1, plan_sample
from fsdist.params import RowParams
from fsdist.runtime import interpreting
from fsdist.ops.configs import TileConfig

B, D, V, TILE = 24, 32, 2048, 256  # 8 tiles of 256 ids, 4 kept each: many rows need the fallback


def _problem(device, scale=2.5, seed=5):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(B, D, generator=g)
    w = torch.randn(V, D, generator=g) * (scale / math.sqrt(D))
    temp = torch.rand(B, generator=g) * 0.6 + 0.6
    temp[5] = 0.0  # greedy: never listed
    top_k = torch.tensor([0, 30, 0, 12, 60, 0], dtype=torch.int32).repeat(B // 6)
    top_p = torch.tensor([0.9, 1.0, 1.0, 0.8, 0.95, 1.0]).repeat(B // 6)
    min_p = torch.tensor([0.0, 0.0, 0.02, 0.05, 0.0, 0.0]).repeat(B // 6)
    params = RowParams(temp.to(device), (torch.arange(B) * 31 + 7).to(device), torch.full((B,), 4).to(device),
                       top_k=top_k.to(device), top_p=top_p.to(device), min_p=min_p.to(device))
    # bf16 on a GPU, as served (fp32 operands would run tf32 dots, whose ~1e-3 logit error
    # differs between stage 1 and the fallback's recomputation); fp32 under the interpreter.
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    return h.to(device, dtype), w.to(device, dtype), params


def _config(device):
    if device.type == "cuda":
        return TileConfig(16, TILE, 32, num_warps=4, num_stages=2)
    return TileConfig(32, TILE, 32, num_stages=1)


def _stage2(device, h, w, params, top_n, mode):
    """Stage 1, merge and select_filtered as fsdist.sample runs them: (plan, buffers, outputs, flags, kept)."""
    plan = plan_sample(batch=B, hidden_size=D, weight_rows=V, device=device, logprobs=True, config=_config(device),
                       path="fused", extended=True, dtype=h.dtype)
    buffers = BufferPair.alloc(plan.layout, device)
    launch_stage1(plan, h, w, params, buffers, vocab_size=V)
    tokens, lp, _ = launch_merge(plan.layout, buffers, B, params, logprobs=True)
    top_ids = torch.full((B, top_n), -5, dtype=torch.int64, device=device)
    top_lp = torch.full((B, top_n), -5.0, device=device)
    kept = KeptLogits(plan.layout, buffers, TILE, torch.full((B,), -9, dtype=torch.int64, device=device))
    flags = sf.launch_select_filtered(plan.layout, buffers, B, params, vocab_size=V, tokens=tokens, logprobs=lp,
                                      top_n=top_n, mode=mode, top_ids=top_ids, top_lp=top_lp, tile_v=TILE,
                                      need_key=kept.need_key)
    return plan, buffers, (tokens, lp, top_ids, top_lp), flags, kept


def _finish(h, w, params, out, flags, kept, top_n, mode):
    tokens, lp, top_ids, top_lp = out
    run_fallback(h, w, params, vocab_size=V, flags=flags, tokens=tokens, kept=kept,
                 logprobs=lp, top_n=top_n, mode=mode, top_ids=top_ids, top_lp=top_lp)
    return [x.cpu() for x in out]


def _run(device, top_n, mode, refine_cap=None, doctor=None):
    h, w, params = _problem(device)
    old = sf.REFINE_CAP
    try:
        if refine_cap is not None:
            sf.REFINE_CAP = refine_cap
        _plan, _buffers, out, flags, kept = _stage2(device, h, w, params, top_n, mode)
    finally:
        sf.REFINE_CAP = old
    listed = flags.bool()
    if doctor is not None:
        doctor(kept.need_key, listed, h, w)
    keys = kept.need_key.cpu()[listed.cpu()]
    return _finish(h, w, params, out, flags, kept, top_n, mode), listed.cpu(), keys


def _assert_same(a, b):
    assert torch.equal(a[0], b[0])  # tokens
    assert torch.equal(a[2], b[2])  # top-N ids
    # logprobs: the normalisers sum the same masses in another order (fp32 rounding only)
    # and, on a GPU, the kept logits of stage 1 against the same logits recomputed by another
    # kernel (another summation order)
    torch.testing.assert_close(a[1], b[1], rtol=1e-4, atol=1e-4, equal_nan=True)
    torch.testing.assert_close(a[3], b[3], rtol=1e-4, atol=1e-4, equal_nan=True)


@pytest.mark.parametrize("mode", ["scaled", "processed"])
def test_recomputing_the_needed_tiles_equals_recomputing_the_row(device, mode):
    tiles, listed, keys = _run(device, 3, mode)
    whole, listed0, keys0 = _run(device, 3, mode, refine_cap=0)
    assert torch.equal(listed, listed0)
    assert int(listed.sum()) >= B // 3, "meant to exercise the fallback"
    # Both ways in one round: rows from their needed tiles, and rows whose kept logits bound
    # nothing (a nucleus holding more mass than U, top-k beyond U's size) from the whole row.
    assert int((keys > 0).sum()) >= 3 and bool((keys == 0).any())
    assert bool((keys0 == 0).all()), "REFINE_CAP = 0 must recompute whole rows"
    _assert_same(tiles, whole)
    assert bool((tiles[0][listed] >= 0).all())


def _order_key(v):
    b = (v.float() + 0.0).view(torch.int32).to(torch.int64)
    return torch.where(b >= 0, b + 2 ** 31, 2 ** 31 - 1 - (b & (2 ** 31 - 1)))


def test_a_lower_bound_set_too_high_is_caught(device):
    """Power: a need key above a row's thresholds (here its largest logit) hides logits the row
    needs; the comparison with the whole-row fallback must then fail."""
    def too_high(need_key, listed, h, w):
        top = (h.double() @ w.double().T).max(dim=1).values
        need_key.copy_(torch.where(listed, _order_key(top).to(need_key.device), need_key))

    whole, _, _ = _run(device, 3, "scaled", refine_cap=0)
    wrong, _, _ = _run(device, 3, "scaled", doctor=too_high)
    with pytest.raises(AssertionError):
        _assert_same(wrong, whole)


@pytest.mark.parametrize("programs", [None, 3], ids=["default-grid", "3-programs"])
def test_only_the_needed_tiles_are_recomputed(device, programs):
    """The pool receives exactly the (row, tile) pairs whose boundary reaches the row's need key,
    and fewer than all of them; also when a few programs walk all the tiles (the GPU's persistent
    grid; under the interpreter the default is a program per tile)."""
    h, w, params = _problem(device)
    plan, buffers, _out, flags, kept = _stage2(device, h, w, params, 0, "scaled")
    rows = POOL_ROWS if device.type == "cuda" else POOL_ROWS_INTERPRETER
    pool = PoolLayout(rows, V)
    dest = torch.full((pool.numel,), float("nan"), device=device)
    launch_materialize(h, w, pool, dest, flags=flags, start=0, vocab_size=V, kept=kept, programs=programs)
    listed = torch.nonzero(flags.cpu()).flatten()  # the pool's slots hold the flagged rows in row order
    n = listed.numel()
    assert 0 < n <= rows
    lay = plan.layout
    bnd = buffers.f[F_BOUNDARY * lay.stride_field:(F_BOUNDARY + 1) * lay.stride_field].view(lay.n_local, -1)
    bnd = bnd[:, :B].t().cpu()[listed]  # [listed rows, tiles]
    key = kept.need_key.cpu()[listed]
    want = (key[:, None] == 0) | ((bnd > float("-inf")) & (_order_key(bnd) >= key[:, None]))
    written = ~torch.isnan(dest.view(rows, V)[:n].cpu().view(n, lay.n_local, TILE)).all(dim=2)
    assert torch.equal(written, want)
    assert 0 < int(want.sum()) < want.numel(), "some tiles needed, not all"
    # and the recomputed tiles hold the logits
    ref = (h.double() @ w.double().T).cpu()[listed].view(n, lay.n_local, TILE)
    got = dest.view(rows, V)[:n].cpu().view(n, lay.n_local, TILE)
    torch.testing.assert_close(got[written].double(), ref[written], atol=1e-3, rtol=1e-3)


def _extended_fields(logits, layout, buffers):
    """Write the extended candidate fields select_filtered and resolve read (tile max and scaled sum at
    T = 1, the 4 kept logits with their ids, the boundary) straight from known logits [1, V]: what
    stage 1 writes, without running its epilogue over a thousand tiles under the interpreter."""
    from fsdist.ops.layout import KEEP
    n_local = layout.n_local
    tiles = torch.full((n_local * 128,), float("-inf"))
    tiles[:logits.shape[1]] = logits[0]
    tiles = tiles.view(n_local, 128)
    top = tiles.topk(KEEP + 1, dim=1)
    tmax = top.values[:, 0]
    f = buffers.f.view(layout.n_fields, n_local)
    f.fill_(float("nan"))
    f[2] = tmax
    f[3] = torch.exp(tiles - tmax[:, None]).sum(dim=1)
    f[5:5 + KEEP] = top.values[:, :KEEP].T
    f[F_BOUNDARY] = top.values[:, KEEP]
    i = buffers.i.view(-1)[: layout.n_ifields * n_local].view(layout.n_ifields, n_local)
    i[1:1 + KEEP] = (top.indices[:, :KEEP] + torch.arange(n_local)[:, None] * 128).T.int()


@pytest.mark.skipif(not interpreting(), reason="the interpreter's program sizes: CPU tensors under TRITON_INTERPRET=1")
def test_resolve_at_a_real_vocabulary_size_under_the_interpreter():
    """V = 133000 in 128-id tiles (1,040 tiles: 8,192 lanes of kept logits): the interpreter's resolve
    once put all 256 pooled rows in one program, a [256, 8192] tensor over Triton's 2**20 elements
    (InterpreterError). A min-p row whose survivors crowd one tile, finished from that tile: the
    float64 mirror's token."""
    from filter_mirror import filtered_mirror
    from fsdist.ops.fallback import launch_resolve
    from fsdist.ops.layout import KEEP, CandidateLayout

    Vbig = 133000
    logits = torch.full((1, Vbig), -10.0)
    logits[0, 1000:1006] = 0.0  # six survivors of min-p 0.5 in tile 7: U keeps four of them
    params = RowParams(1.0, 3, 1, min_p=0.5)
    layout = CandidateLayout(CandidateLayout.fields(True, extended=True), -(-Vbig // 128), 1, n_ifields=1 + KEEP)
    buffers = BufferPair.alloc(layout, logits.device)
    _extended_fields(logits, layout, buffers)
    tokens = torch.zeros(1, dtype=torch.int64)  # stage 2 found a valid token (the row is not dead)
    kept = KeptLogits(layout, buffers, 128, torch.empty(1, dtype=torch.int64))
    flags = sf.launch_select_filtered(layout, buffers, 1, params, vocab_size=Vbig, tokens=tokens, tile_v=128,
                                      need_key=kept.need_key)
    assert bool(flags[0]) and int(kept.need_key[0]) > 0, "meant to take the refined fallback"
    pool = PoolLayout(POOL_ROWS_INTERPRETER, Vbig)
    buf = torch.full((pool.numel,), float("nan"))
    buf[:Vbig] = logits[0]  # pooled row 0: what materialize recomputes
    launch_resolve(pool, buf, params, flags=flags, start=0, vocab_size=Vbig, tokens=tokens, kept=kept)
    ref, _margin, _ = filtered_mirror(torch.ones(1, 1), logits.t().contiguous(), seed=3, offset=1, min_p=0.5)
    assert int(tokens[0]) == int(ref[0]) and 1000 <= int(tokens[0]) < 1006
