"""The ping-pong Hopper stage 1 (fsdist/ops/fused_sample_pp.py) against the warp-specialised kernel.

GPU (sm_90) only. ``launch_fused_pp`` must write ``launch_fused_ws``'s candidates bit for bit (plain calls): the same
logits (the same wgmmas in K order), the same noise (its neighbour lanes swap the halves of each Philox quad: a wrong
swap moves half the ids' noise), the same ties (the lowest column among equal scores: an all-zero row), -inf tiles
on their first id, NaN / +inf logits and bad temperatures poisoning their rows. ``test_the_comparison_can_fail``
shows the check notices a change of one row's seed.
"""
import pytest
import torch
import triton

from fsdist.ops.layout import BufferPair, CandidateLayout
from fsdist.params import RowParams

pytestmark = pytest.mark.gpu

hopper = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                            reason="the ping-pong kernel needs an sm_90 GPU")


def _row_params(B, g, kind):
    if kind == "scalar":
        return RowParams(0.8, 1234, 99)
    if kind == "greedy":
        return RowParams(0.0, 0, 0)
    t = torch.ones(B)
    t[1::7] = 0.0
    t[2::11] = 1.7
    t[3::13] = 0.3
    t[17] = -1.0  # poisoned rows: token -1
    t[33] = float("nan")
    t[37] = float("inf")
    t[39] = 1e30  # the largest temperature accepted: sampled
    return RowParams(t.cuda(), torch.randint(0, 2**62, (B,), generator=g).cuda(),
                     torch.randint(0, 2**40, (B,), generator=g).cuda())


def _operands(B, D, V, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    w = torch.randn(V, D, generator=g, device="cuda").mul_(D ** -0.5).to(dtype)
    h = torch.randn(B, D, generator=g, device="cuda").to(dtype)
    h[1] = 0  # a greedy row (kind "rows") or a row of ties (greedy): every tile's winner is its first id
    h[45, 7] = float("inf")  # +-inf logits, and NaN where a weight entry is 0: the row is poisoned
    return h, w


def _launch(fn, h, w, params, vocab_size, vocab_start, **kw):
    layout = CandidateLayout(1, triton.cdiv(w.shape[0], 128), h.shape[0])
    dest = BufferPair.alloc(layout, h.device)
    dest.f.fill_(7.0)
    dest.i.fill_(7)
    fn(h, w, params, layout, dest, vocab_size=vocab_size, vocab_start=vocab_start, **kw)
    torch.cuda.synchronize()
    return dest.f.nan_to_num(-12345.0), dest.i


@hopper
@pytest.mark.parametrize("D, V, B, vocab_start, pad", [
    (4096, 151936, 256, 0, 3),     # real shape, two batch tiles
    (4096, 1000, 200, 0, 3),       # vocabulary and batch both end inside a tile
    (96, 5000, 130, 256, 3),       # K ends inside a stage (TMA zero-fills it); a shard-like vocabulary start
    (512, 5000, 128, 0, 300),      # the last two vocabulary tiles hold padding ids only (-inf tiles)
    (8192, 128256, 384, 0, 3),
])
@pytest.mark.parametrize("kind", ["rows", "scalar", "greedy"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("stages, lookahead", [(5, 1), (4, 1), (5, 0), (5, 2)])
def test_pp_writes_the_ws_kernels_candidates(D, V, B, vocab_start, pad, kind, dtype, stages, lookahead):
    from fsdist.ops.fused_sample_pp import launch_fused_pp
    from fsdist.ops.fused_sample_ws import launch_fused_ws
    if dtype == torch.float16 and D > 4096:
        pytest.skip("one fp16 shape is enough")
    if (stages, lookahead) != (5, 1) and (kind != "rows" or dtype != torch.bfloat16):
        pytest.skip("other stages and lookaheads: one kind and dtype")
    h, w = _operands(B, D, V, dtype, D + V + B)
    params = _row_params(B, torch.Generator().manual_seed(D + V + B), kind)
    vocab_size = vocab_start + V - pad
    got = _launch(launch_fused_pp, h, w, params, vocab_size, vocab_start, stages=stages, lookahead=lookahead)
    ref = _launch(launch_fused_ws, h, w, params, vocab_size, vocab_start, epilogue_warps=8)
    assert torch.equal(got[1], ref[1])
    assert torch.equal(got[0], ref[0])
    ids = got[1].view(-1, B)
    assert (ids[:-3, 45] == -1).all()  # the inf row (but in tiles of padding ids alone, whose logits are all -inf)
    if kind == "rows":
        assert (ids[:, 17] == -1).all() and (ids[:, 33] == -1).all() and (ids[:, 37] == -1).all()
    if kind != "scalar":  # row 1: greedy over zero logits, so each tile's first id (its lowest column)
        first = vocab_start + 128 * torch.arange(ids.shape[0], device=ids.device, dtype=ids.dtype)
        assert torch.equal(ids[:, 1], first)


@hopper
def test_pp_grid_cap_and_fan_out_buffer_offsets():
    """Fewer programs than SMs (each walks more tiles: both consumers alternate many times), into shard 1 of a
    two-shard buffer: the same candidates as the ws kernel's there, shard 0 untouched."""
    from fsdist.ops.fused_sample_pp import launch_fused_pp
    from fsdist.ops.fused_sample_ws import launch_fused_ws
    B, D, V = 256, 1024, 40000
    h, w = _operands(B, D, V, torch.bfloat16, 11)
    params = _row_params(B, torch.Generator().manual_seed(11), "rows")
    layout = CandidateLayout(1, triton.cdiv(V, 128), B, n_shards=2)
    outs = []
    for fn, kw in ((launch_fused_pp, dict(grid_cap=7)), (launch_fused_ws, dict(epilogue_warps=8))):
        dest = BufferPair.alloc(layout, h.device)
        dest.f.fill_(7.0)
        dest.i.fill_(7)
        fn(h, w, params, layout, dest, vocab_size=2 * V, vocab_start=V, shard=1, **kw)
        torch.cuda.synchronize()
        outs.append((dest.f.nan_to_num(-1.0), dest.i))
    assert torch.equal(outs[0][1], outs[1][1]) and torch.equal(outs[0][0], outs[1][0])
    assert (outs[0][1][:layout.stride_shard_i] == 7).all()


@hopper
def test_pp_on_a_padded_hidden_samples_its_batch_rows():
    """batch=: a hidden zero-padded to whole tiles (as launch_fused's tile_operand) gives the unpadded call's
    candidates for the batch's rows, and nothing for the pad rows."""
    from fsdist.ops.fused_sample_pp import launch_fused_pp
    from fsdist.ops.fused_sample_ws import launch_fused_ws
    B, D, V = 200, 512, 9000
    h, w = _operands(B, D, V, torch.bfloat16, 3)
    padded = torch.cat([h, h.new_zeros(256 - B, D)])
    params = _row_params(B, torch.Generator().manual_seed(3), "rows")
    got = _launch(launch_fused_pp, padded, w, params, V, 0, batch=B)
    layout = CandidateLayout(1, triton.cdiv(V, 128), B)
    ref = BufferPair.alloc(layout, h.device)
    ref.f.fill_(7.0)
    ref.i.fill_(7)
    launch_fused_ws(h, w, params, layout, ref, vocab_size=V, epilogue_warps=8)
    torch.cuda.synchronize()
    ids = got[1].view(-1, 256)
    assert torch.equal(ids[:, :B], ref.i.view(-1, B)) and (ids[:, B:] == 7).all()
    assert torch.equal(got[0].view(-1, 256)[:, :B], ref.f.nan_to_num(-12345.0).view(-1, B))


@hopper
def test_the_comparison_can_fail():
    """The check above notices one row's other seed (its candidates move in most tiles)."""
    from fsdist.ops.fused_sample_pp import launch_fused_pp
    from fsdist.ops.fused_sample_ws import launch_fused_ws
    B, D, V = 256, 512, 20000
    h, w = _operands(B, D, V, torch.bfloat16, 5)
    params = _row_params(B, torch.Generator().manual_seed(5), "rows")
    other = RowParams(params.temperature, params.seed.clone(), params.offset)
    other.seed[100] += 1
    got = _launch(launch_fused_pp, h, w, other, V, 0)
    ref = _launch(launch_fused_ws, h, w, params, V, 0, epilogue_warps=8)
    assert not torch.equal(got[1], ref[1])
    ids, ref_ids = got[1].view(-1, B), ref[1].view(-1, B)
    assert torch.equal(ids[:, :100], ref_ids[:, :100])
    assert (ids[:, 100] != ref_ids[:, 100]).float().mean() > 0.5
