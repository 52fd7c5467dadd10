"""The ping-pong Hopper stage 1 (fsdist/ops/fused_sample_pp.py) against the warp-specialised kernel.

GPU (sm_90) only. ``launch_fused_pp`` must write ``launch_fused_ws``'s candidates bit for bit (plain calls): the same
logits (the same wgmmas in K order), the same noise (each column chunk's ids, after its trip through shared memory),
the same ties (the lowest column among equal scores: an all-zero row), -inf tiles on their first id, NaN / +inf
logits and bad temperatures poisoning their rows. ``test_the_comparison_can_fail``
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
    # poisoned rows (token -1) in each quarter of a batch tile, with row bit 3 clear and set (the epilogue's low and
    # high rows), and in the second batch tile
    for r in POISONED:
        if r < B:
            t[r] = (-1.0, float("nan"), float("inf"))[r % 3]
    t[39] = 1e30  # the largest temperature accepted: sampled
    return RowParams(t.cuda(), torch.randint(0, 2**62, (B,), generator=g).cuda(),
                     torch.randint(0, 2**40, (B,), generator=g).cuda())


POISONED = (17, 25, 38, 57, 70, 77, 100, 121, 169)  # bad temperatures (kind "rows")
INF_ROWS = (45, 99, 131)  # an inf in the hidden: +-inf logits (NaN where a weight entry is 0), the row poisoned
TIE_ROW, TIE_COLS = 78, (200, 230)  # (greedy in kinds "rows" and "greedy"; row bit 3 set, second half of the tile)


def _operands(B, D, V, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    w = torch.randn(V, D, generator=g, device="cuda").mul_(D ** -0.5).to(dtype)
    h = torch.randn(B, D, generator=g, device="cuda").to(dtype)
    h[1] = 0  # a greedy row (kind "rows") or a row of ties (greedy): every tile's winner is its first id
    for r in INF_ROWS:
        if r < B:
            h[r, 7] = float("inf")
    # a tie inside a tile: two equal weight rows along TIE_ROW's hidden, far above its other logits; the lower wins
    unit = (h[TIE_ROW].float() / h[TIE_ROW].float().norm()).to(dtype)
    for c in TIE_COLS:
        w[c] = unit
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
    (512, 5000, 128, 0, 300),      # the last three vocabulary tiles hold padding ids only (-inf tiles)
    (8192, 128256, 384, 0, 3),
])
@pytest.mark.parametrize("kind", ["rows", "scalar", "greedy"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("stages, shared", [(5, 8), (4, 8), (6, 8), (5, 4)], ids=["sh8", "sh8s4", "sh8s6", "sh4"])
def test_pp_writes_the_ws_kernels_candidates(D, V, B, vocab_start, pad, kind, dtype, stages, shared):
    from fsdist.ops.fused_sample_pp import launch_fused_pp
    from fsdist.ops.fused_sample_ws import launch_fused_ws
    if dtype == torch.float16 and D > 4096:
        pytest.skip("one fp16 shape is enough")
    if (stages, shared) != (5, 8) and (kind != "rows" or dtype != torch.bfloat16):
        pytest.skip("other stages and chunkings: one kind and dtype")
    h, w = _operands(B, D, V, dtype, D + V + B)
    params = _row_params(B, torch.Generator().manual_seed(D + V + B), kind)
    vocab_size = vocab_start + V - pad
    got = _launch(launch_fused_pp, h, w, params, vocab_size, vocab_start, stages=stages, shared_epilogue=shared)
    ref = _launch(launch_fused_ws, h, w, params, vocab_size, vocab_start, epilogue_warps=8)
    assert torch.equal(got[1], ref[1])
    assert torch.equal(got[0], ref[0])
    ids = got[1].view(-1, B)
    live = triton.cdiv(vocab_size - vocab_start, 128)  # the tiles that hold a real id (the rest: padding ids alone,
    for r in INF_ROWS:                                  # whose logits are all -inf, so an inf row is not poisoned)
        if r < B:
            assert (ids[:live, r] == -1).all()
    if kind == "rows":
        assert all((ids[:, r] == -1).all() for r in POISONED if r < B)
    if kind != "scalar":  # row 1: greedy over zero logits, so each tile's first id (its lowest column)
        first = vocab_start + 128 * torch.arange(ids.shape[0], device=ids.device, dtype=ids.dtype)
        assert torch.equal(ids[:, 1], first)
        assert ids[1, TIE_ROW] == vocab_start + TIE_COLS[0]


@hopper
@pytest.mark.parametrize("shared", [8, 4], ids=["sh8", "sh4"])
def test_pp_grid_cap_and_fan_out_buffer_offsets(shared):
    """Fewer programs than SMs (each walks more tiles: both consumers alternate many times), fanned out to two
    peers' buffers, into shard 1 of a two-shard layout: the same candidates as the ws kernel's in each, shard 0
    untouched."""
    from fsdist.ops.fused_sample_pp import launch_fused_pp
    from fsdist.ops.fused_sample_ws import launch_fused_ws
    B, D, V = 256, 1024, 40000
    h, w = _operands(B, D, V, torch.bfloat16, 11)
    params = _row_params(B, torch.Generator().manual_seed(11), "rows")
    layout = CandidateLayout(1, triton.cdiv(V, 128), B, n_shards=2)
    outs = []
    for fn, kw in ((launch_fused_pp, dict(grid_cap=7, shared_epilogue=shared, stages=4)),
                   (launch_fused_ws, dict(epilogue_warps=8))):
        # two local buffers stand in for two ranks' (the fan-out stores into each through the address table)
        bufs = [(torch.full((layout.float_numel,), 7.0, device="cuda"),
                 torch.full((layout.int_numel,), 7, dtype=torch.int32, device="cuda")) for _ in range(2)]
        table_f = torch.tensor([b[0].data_ptr() for b in bufs], dtype=torch.int64, device="cuda")
        table_i = torch.tensor([b[1].data_ptr() for b in bufs], dtype=torch.int64, device="cuda")
        fn(h, w, params, layout, BufferPair(table_f, table_i, npeers=2), vocab_size=2 * V, vocab_start=V, shard=1,
           **kw)
        torch.cuda.synchronize()
        outs.append([(f.nan_to_num(-1.0), i) for f, i in bufs])
    for peer in range(2):
        assert torch.equal(outs[0][peer][1], outs[1][peer][1]) and torch.equal(outs[0][peer][0], outs[1][peer][0])
        assert (outs[0][peer][1][:layout.stride_shard_i] == 7).all()
        assert (outs[0][peer][1][layout.stride_shard_i:] != 7).any()


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
    row = 101  # sampled at T = 1.7 (row 100 is poisoned: its seed moves nothing, as the v113 run found)
    assert row not in POISONED + INF_ROWS and params.temperature[row] == 1.7
    other.seed[row] += 1
    got = _launch(launch_fused_pp, h, w, other, V, 0)
    ref = _launch(launch_fused_ws, h, w, params, V, 0, epilogue_warps=8)
    assert not torch.equal(got[1], ref[1])
    ids, ref_ids = got[1].view(-1, B), ref[1].view(-1, B)
    assert torch.equal(ids[:, :row], ref_ids[:, :row]) and torch.equal(ids[:, row + 1:], ref_ids[:, row + 1:])
    assert (ids[:, row] != ref_ids[:, row]).float().mean() > 0.5


@hopper
@pytest.mark.parametrize("B", [256, 340])  # whole tiles; a last tile of 84 rows (> 64: padded, not a short tile)
def test_launch_fused_runs_pp_for_all_greedy_plain_calls(B, monkeypatch):
    """launch_fused takes the ping-pong kernel for an all-greedy plain call on the 128-row ws tile (configs.
    PP_GREEDY_MIN_BATCH), with the ws kernel's candidates; [B] temperatures (noise) keep the ws kernel."""
    from fsdist.ops import configs, fused_sample
    from fsdist.ops.configs import TileConfig

    monkeypatch.setattr(configs, "PP_GREEDY_ON", True)  # (the default since v112: the test holds it on either way)
    monkeypatch.setattr(fused_sample, "fast_memory", lambda device: False)  # (the rule's H100 case on any sm_90)
    calls = []
    real = fused_sample.launch_fused_pp
    monkeypatch.setattr(fused_sample, "launch_fused_pp", lambda *a, **k: (calls.append(k), real(*a, **k))[1])
    cfg = TileConfig(128, 128, 64, 8, 5, tma=True, ws=True)
    D, V = 1024, 30000
    h, w = _operands(B, D, V, torch.bfloat16, B)

    def run(params):
        layout = CandidateLayout(1, triton.cdiv(V, 128), B)
        dest = BufferPair.alloc(layout, h.device)
        dest.f.fill_(7.0)
        dest.i.fill_(7)
        fused_sample.launch_fused(h, w, params, cfg, layout, dest, vocab_size=V - 5)
        torch.cuda.synchronize()
        return dest.f.nan_to_num(-12345.0), dest.i

    got = run(RowParams(0.0, 0, 0))
    assert len(calls) == 1 and calls[0]["batch"] == B and calls[0]["shared_epilogue"] == 8
    monkeypatch.setattr(fused_sample, "pp_greedy_rule", lambda batch, fast: False)
    ref = run(RowParams(0.0, 0, 0))
    assert len(calls) == 1  # the ws kernel this time
    assert torch.equal(got[1], ref[1]) and torch.equal(got[0], ref[0])
    monkeypatch.setattr(fused_sample, "pp_greedy_rule", lambda batch, fast: True)
    run(RowParams(torch.zeros(B, device="cuda"), 0, 0))
    assert len(calls) == 1  # [B] temperatures: the ws kernel


@hopper
@pytest.mark.parametrize("shared", [8, 4], ids=["sh8", "sh4"])
def test_wait_probe_changes_no_candidate_and_fills_its_fields(shared):
    """launch_fused_pp(wait_probe=) (v116): the same candidates; every program that ran stores its consumers' four
    fields each, the waits within the totals; rows of no program stay -1; a probe of the wrong shape is refused by
    name."""
    from fsdist.ops.fused_sample_pp import PP_WAIT_FIELDS, launch_fused_pp, new_pp_wait_probe
    B, D, V = 256, 1024, 30000  # 470 tiles: every consumer of the 100 programs gets some (else its tail is 0)
    h, w = _operands(B, D, V, torch.bfloat16, 21)
    params = _row_params(B, torch.Generator().manual_seed(21), "rows")
    plain = _launch(launch_fused_pp, h, w, params, V, 0, shared_epilogue=shared)
    probe = new_pp_wait_probe(h.device)
    probed = _launch(launch_fused_pp, h, w, params, V, 0, shared_epilogue=shared, wait_probe=probe, grid_cap=100)
    assert torch.equal(plain[0], probed[0]) and torch.equal(plain[1], probed[1])
    rows = probe.cpu()
    assert (rows[100:] == -1).all()
    ran = rows[:100]
    for r in range(2):
        total, operands, turn, tail = (ran[:, 4 * r + i] for i in range(4))
        assert (total > 0).all() and (operands >= 0).all() and (turn >= 0).all() and (tail > 0).all()
        assert (operands + turn + tail <= total).all()
    with pytest.raises(ValueError, match="wait_probe"):
        _launch(launch_fused_pp, h, w, params, V, 0, wait_probe=probe[:, :PP_WAIT_FIELDS.value - 1].contiguous())
