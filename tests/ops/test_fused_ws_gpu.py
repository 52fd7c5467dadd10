"""The warp-specialised Hopper stage 1 (fsdist/ops/fused_sample_ws.py) against the Triton fused kernel.

GPU (sm_90) only. The kernel must write the Triton kernel's candidates bit for bit with the same
128x128x64 (or 64x128x64) TMA tile, the tile sums of the logprob fields aside: same logits (the same
wgmma sequence in K order), same noise (keyed by the global id), same rounding of logit + T * Gumbel
(``epilogue.perturb``), the same processed logits (token bitmask, bias, penalties: processors.py) on
64-row tiles. The 10^6-draw chi-squared tests in test_sample_gpu.py run on it too (B = 8192 rows take
the 128-row tiles).
"""
import dataclasses

import pytest
import torch
import triton

import fsdist
from fsdist.ops import configs, fused_sample
from fsdist.ops.configs import TileConfig
from fsdist.ops.fused_sample import launch_fused
from fsdist.ops.fused_sample_ws import ws_supported
from fsdist.ops.layout import KEEP, BufferPair, CandidateLayout
from fsdist.ops.parity import DeviceParity
from fsdist.ops.step_check import call_flags
from fsdist.params import MAX_TEMPERATURE, RowParams
from fsdist.processing import prepare_processing
from fsdist.reference import bitmask_from_allowed

pytestmark = pytest.mark.gpu

hopper = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                            reason="the warp-specialised kernel needs an sm_90 GPU")


@pytest.fixture(autouse=True)
def _ws_kernel_for_greedy_calls(monkeypatch):
    """These tests check the ws kernel, so launch_fused keeps all-greedy calls of >= 256 rows on it too (an H100 runs
    them on the ping-pong kernel since v112: tests/ops/test_fused_pp_gpu.py checks that kernel and that dispatch)."""
    monkeypatch.setattr(configs, "PP_GREEDY_ON", False)


WS = TileConfig(128, 128, 64, 8, 5, tma=True, ws=True)
TRITON = TileConfig(128, 128, 64, 8, 5, tma=True)


def _row_params(B, g, kind):
    if kind == "scalar":
        return RowParams(0.8, 1234, 99)
    if kind == "greedy":
        return RowParams(0.0, 0, 0)
    t = torch.ones(B)
    t[1::7] = 0.0
    t[2::11] = 1.7
    t[3::13] = 0.3
    if B > 40:
        t[17] = -1.0  # poisoned rows: token -1
        t[33] = float("nan")
        t[37] = float("inf")  # above MAX_TEMPERATURE: poisoned too
        t[38] = 2e30
        t[39] = 1e30  # the largest temperature accepted: sampled
    return RowParams(t.cuda(), torch.randint(0, 2**62, (B,), generator=g).cuda(),
                     torch.randint(0, 2**40, (B,), generator=g).cuda())


def _operands(B, D, V, dtype, seed):
    """hidden [B, D] and weight [V, D] (logits of std ~1), drawn on the GPU from a seeded generator: the
    largest weight here is 4 GB in fp32, too much to draw on the host and copy over."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    w = torch.randn(V, D, generator=g, device="cuda").mul_(D ** -0.5).to(dtype)
    h = torch.randn(B, D, generator=g, device="cuda").to(dtype)
    return h, w


def _candidates(cfg, h, w, params, vocab_size, vocab_start=0):
    layout = CandidateLayout(1, triton.cdiv(w.shape[0], 128), h.shape[0])
    dest = BufferPair.alloc(layout, h.device)
    dest.f.fill_(7.0)
    dest.i.fill_(7)
    launch_fused(h, w, params, cfg, layout, dest, vocab_size=vocab_size, vocab_start=vocab_start)
    return dest.f.nan_to_num(-12345.0), dest.i


@pytest.fixture
def ws_calls(monkeypatch):
    """Records launches of the warp-specialised kernel, each as its batch tile (so a test knows it ran, not the
    fallback, and on which tile)."""
    calls = []
    real = fused_sample.launch_fused_ws

    def counted(*a, **k):
        calls.append(k.get("block_b", 128))
        return real(*a, **k)

    monkeypatch.setattr(fused_sample, "launch_fused_ws", counted)
    return calls


@hopper
@pytest.mark.parametrize("D, V, B, vocab_start", [
    (4096, 151936, 256, 0),   # real shape, two batch tiles
    (4096, 1000, 200, 0),     # vocabulary and batch both end inside a tile
    (96, 5000, 130, 256),     # K ends inside a stage (TMA zero-fills it); a shard-like vocabulary start
    (8192, 128256, 384, 0),
])
@pytest.mark.parametrize("kind", ["rows", "scalar", "greedy"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_ws_writes_the_triton_kernels_candidates(D, V, B, vocab_start, kind, dtype, ws_calls):
    if dtype == torch.float16 and D > 4096:
        pytest.skip("one fp16 shape is enough")
    h, w = _operands(B, D, V, dtype, D + V + B)
    params = _row_params(B, torch.Generator().manual_seed(D + V + B), kind)
    vocab_size = vocab_start + V - 3  # a few padding ids at the end never win
    got = _candidates(WS, h, w, params, vocab_size, vocab_start)
    assert len(ws_calls) == 1
    ref = _candidates(TRITON, h, w, params, vocab_size, vocab_start)
    assert len(ws_calls) == 1  # the plain config ran the Triton kernel
    assert torch.equal(got[1], ref[1])
    assert torch.equal(got[0], ref[0])
    if kind == "rows" and B > 40:
        assert (got[1].view(-1, B)[:, 17] == -1).all() and (got[1].view(-1, B)[:, 33] == -1).all()


# launch_fused_ws's hand-off variants for plain calls (v87 / v90): a buffer per column half, the chunked epilogue
HAND_OFFS = {"ab2": dict(acc_buffers=2), "c16": dict(epilogue_chunk=16), "c32": dict(epilogue_chunk=32),
             "c16ab2": dict(acc_buffers=2, epilogue_chunk=16), "c32ab2": dict(acc_buffers=2, epilogue_chunk=32),
             "s4": dict(stages=4),  # s4: the large-batch depth of configs.WS_LARGE_BATCH_STAGES
             # the noise in the instructions before v97 (benchmarks: the same bits, so the same candidates)
             "legacy": dict(noise_probe="legacy"), "legacy_philox": dict(noise_probe="legacy_philox")}


def _use_hand_off(monkeypatch, name):
    """Every launch_fused_ws call of launch_fused from here on takes the hand-off variant ``name`` ("" none)."""
    if name:
        real = fused_sample.launch_fused_ws
        monkeypatch.setattr(fused_sample, "launch_fused_ws", lambda *a, **k: real(*a, **{**k, **HAND_OFFS[name]}))


@hopper
@pytest.mark.parametrize("hand_off", sorted(HAND_OFFS))
@pytest.mark.parametrize("D, V, B, vocab_start, kind", [
    (4096, 151936, 256, 0, "rows"), (4096, 151936, 256, 0, "greedy"), (96, 5000, 130, 256, "rows"),
    (4096, 40000, 150, 0, "rows"),  # a short last tile (last_box_rows): half a tile's rows in boxes
    (4096, 1000, 200, 0, "scalar")])
def test_hand_off_variants_write_the_triton_kernels_candidates(hand_off, D, V, B, vocab_start, kind, ws_calls,
                                                                monkeypatch):
    """The two-buffer hand-off, the chunked epilogue (chunks of 16 / 32 columns walked in a rolled loop), 4 stages and
    the noise in the instructions before v97 (noise_probe "legacy" / "legacy_philox") write the Triton kernel's
    candidates bit for bit: the chunks' merge keeps ties on the lowest column, -inf tiles on their
    first id, poisoned rows at -1."""
    h, w = _operands(B, D, V, torch.bfloat16, D + V + B)
    params = _row_params(B, torch.Generator().manual_seed(D + V + B), kind)
    vocab_size = vocab_start + V - 3
    ref = _candidates(TRITON, h, w, params, vocab_size, vocab_start)
    _use_hand_off(monkeypatch, hand_off)
    got = _candidates(WS, h, w, params, vocab_size, vocab_start)
    assert len(ws_calls) == 1
    assert torch.equal(got[1], ref[1])
    assert torch.equal(got[0], ref[0])


@hopper
@pytest.mark.parametrize("D, V, B", [(4096, 151936, 256), (4096, 40000, 150), (96, 5000, 1024),
                                     (4096, 1000, 256)])  # (16 tiles: fewer programs than SMs)
def test_wait_probe_keeps_the_candidates_and_counts_every_tile(D, V, B, ws_calls, monkeypatch):
    """launch_fused_ws(wait_probe=) (benchmarks: cycle counts around the MMA warpgroup's, the load warp's and the
    epilogue's barrier waits) writes the Triton kernel's candidates bit for bit, and its counts add up: the programs'
    tiles sum to the launch's tiles (the first P rows, program p's tiles p, p + P, ...), every wait lies within its
    partition's total and is positive (each partition waits at least once a tile), every total is positive."""
    from fsdist.ops.fused_sample_ws import new_wait_probe

    h, w = _operands(B, D, V, torch.bfloat16, D + V + B)
    params = _row_params(B, torch.Generator().manual_seed(B), "rows")
    ref = _candidates(TRITON, h, w, params, V)
    probes = []
    real = fused_sample.launch_fused_ws

    def with_probe(*a, **k):
        probe = new_wait_probe(h.device)
        probes.append(probe)
        return real(*a, **k, wait_probe=probe)

    monkeypatch.setattr(fused_sample, "launch_fused_ws", with_probe)
    got = _candidates(WS, h, w, params, V)
    assert len(probes) == 1
    assert torch.equal(got[1], ref[1]) and torch.equal(got[0], ref[0])
    n_tiles = triton.cdiv(V, 128) * triton.cdiv(B, 128)
    probe = probes[0].cpu()
    P = int((probe[:, 0] != -1).sum())  # (the launch's programs: the first P rows; any others stay as filled)
    assert 0 < P <= min(n_tiles, probe.shape[0])
    assert (probe[P:] == -1).all()
    rows = probe[:P]
    assert rows[:, 3].tolist() == [len(range(p, n_tiles, P)) for p in range(P)]
    assert (rows[:, 9] >= rows[:, 8]).all()  # (the most any MMA thread waited for wgmmas: warp 0's at least)
    assert (rows[:, 9] <= rows[:, 0]).all()
    assert (rows[:, [0, 1, 2, 4, 5, 6, 7, 8]] > 0).all()
    assert (rows[:, 1] + rows[:, 2] + rows[:, 8] <= rows[:, 0]).all()
    assert (rows[:, 5] <= rows[:, 4]).all() and (rows[:, 7] <= rows[:, 6]).all()


@hopper
@pytest.mark.parametrize("cfg", [WS, TRITON], ids=["ws", "triton-tma"])
@pytest.mark.parametrize("B", [130, 192])
def test_a_partial_last_tile_reads_a_padded_hidden(cfg, B, ws_calls, monkeypatch):
    """Past B = 128 a batch that leaves the last 128-row tile partly empty runs on a hidden zero-padded to whole
    tiles (configs.PAD_TILE_ROWS, docs/performance.md v35): the candidates are those of the unpadded launch, bit
    for bit, on both kernels; the warp-specialised one is handed the padded rows and the true batch."""
    h, w = _operands(B, 4096, 5000, torch.bfloat16, B)
    params = _row_params(B, torch.Generator().manual_seed(B), "rows")
    seen, made = [], []
    real, real_pad = fused_sample.launch_fused_ws, fused_sample.tile_operand

    def spy(hidden, *a, **k):
        seen.append((hidden.shape[0], k.get("batch")))
        return real(hidden, *a, **k)

    def pad_spy(x, block_b):
        out = real_pad(x, block_b)
        made.append(out.shape[0])
        return out

    monkeypatch.setattr(fused_sample, "launch_fused_ws", spy)
    monkeypatch.setattr(fused_sample, "tile_operand", pad_spy)
    # (the warp-specialised kernel would run these last tiles as half tiles: test_a_short_last_tile_... covers that)
    monkeypatch.setattr(fused_sample, "WS_LAST_BOX_ROWS", 0)
    got = _candidates(cfg, h, w, params, 4997)
    monkeypatch.setattr(fused_sample, "PAD_TILE_ROWS", 1 << 30)  # the unpadded launch
    monkeypatch.setattr(fused_sample, "PAD_HALF_TILE_ROWS", 1 << 30)
    ref = _candidates(cfg, h, w, params, 4997)
    assert made == [256, B]  # padded, then (PAD_TILE_ROWS patched) not
    if cfg.ws:
        assert seen == [(256, B), (B, B)]
    else:
        assert seen == []
    assert torch.equal(got[1], ref[1])
    assert torch.equal(got[0], ref[0])


@hopper
@pytest.mark.parametrize("extended", [False, True])
@pytest.mark.parametrize("B", [24, 40])
def test_a_partial_64_row_tile_reads_a_padded_hidden(B, extended, monkeypatch):
    """The warp-specialised 64-row tile too reads a hidden zero-padded to 64 rows when the batch leaves it at least
    half empty (configs.PAD_HALF_TILE_ROWS, docs/performance.md v65 / v68; B = 17-32 with bias / penalty entries
    take it): every field of the unpadded launch, bit for bit, plain and extended (kept logits, boundaries, sums).
    B = 40 (under half empty) is padded here by asking tile_operand for it (min_rows=1), as ws_probe --pad does."""
    V = 5000
    h, w = _operands(B, 4096, V, torch.bfloat16, B + 1)
    params = _row_params(B, torch.Generator().manual_seed(B), "rows")
    ws64 = TileConfig(64, 128, 64, 8, 5, tma=True, ws=True)
    layout = CandidateLayout(CandidateLayout.fields(extended, extended=extended), triton.cdiv(V, 128), B,
                             n_ifields=1 + KEEP if extended else 1)
    seen, made = [], []
    real, real_pad = fused_sample.launch_fused_ws, fused_sample.tile_operand

    def spy(hidden, *a, **k):
        seen.append((hidden.shape[0], k.get("batch")))
        return real(hidden, *a, **k)

    def pad_spy(x, block_b, min_rows=None):
        out = real_pad(x, block_b, min_rows=1 if pad else 1 << 30)
        made.append(out.shape[0])
        return out

    monkeypatch.setattr(fused_sample, "launch_fused_ws", spy)
    monkeypatch.setattr(fused_sample, "tile_operand", pad_spy)
    monkeypatch.setattr(fused_sample, "WS_BOX_ROWS", 0)  # (the default reads a one-tile batch in boxes: below)
    assert (real_pad(h, 64).shape[0] == 64) == (B <= 32)  # the default rule
    got = []
    for pad in (True, False):
        dest = BufferPair.alloc(layout, "cuda")
        dest.f.fill_(7.0)
        dest.i.fill_(7)
        launch_fused(h, w, params, ws64, layout, dest, vocab_size=V - 3, logprobs=extended, extended=extended)
        got.append((dest.f.nan_to_num(-12345.0), dest.i))
    assert made == [64, B] and seen == [(64, B), (B, B)]  # padded on the ws kernel, then (patched) not
    assert torch.equal(got[0][1], got[1][1])
    assert torch.equal(got[0][0], got[1][0])


def _spy_on_padded_launches(monkeypatch, option):
    """Make tile_operand pad every partial tile (the references below: whole tiles on a zero-padded hidden, whatever
    the padding rules say) and record (hidden rows, launch_fused_ws's ``option``) of each launch of the ws kernel."""
    seen = []
    real, real_pad = fused_sample.launch_fused_ws, fused_sample.tile_operand

    def spy(hidden, *a, **k):
        seen.append((hidden.shape[0], k.get(option)))
        return real(hidden, *a, **k)

    monkeypatch.setattr(fused_sample, "launch_fused_ws", spy)
    monkeypatch.setattr(fused_sample, "tile_operand", lambda x, b, min_rows=None: real_pad(x, b, min_rows=1))
    return seen


def _launch_into_fresh(h, w, params, cfg, layout, vocab_size, **kw):
    """launch_fused into buffers filled with 7s first; every field (NaN as -12345) and the ids."""
    dest = BufferPair.alloc(layout, "cuda")
    dest.f.fill_(7.0)
    dest.i.fill_(7)
    launch_fused(h, w, params, cfg, layout, dest, vocab_size=vocab_size, **kw)
    return dest.f.nan_to_num(-12345.0), dest.i


@hopper
@pytest.mark.parametrize("extended", [False, True])
@pytest.mark.parametrize("B, block_b", [(1, 64), (17, 64), (24, 64), (32, 64), (48, 64), (63, 64), (96, 128)])
def test_a_partial_tile_in_boxes_writes_the_padded_launchs_candidates(B, block_b, extended, monkeypatch):
    """A batch of one partial tile read in boxes of configs.WS_BOX_ROWS rows, as many as it needs, the tile's other
    rows zeroed once in shared memory (launch_fused_ws's box_rows): every field of the launch on a zero-padded hidden,
    bit for bit, plain and extended; forced here on B = 63 and on the 128-row tile, which the default keeps on one box
    (fused_sample.ws_box_rows). B = 17 / 63 end inside a box (its last rows past the hidden's end); a box left unloaded,
    or a row's data from another box, would change that row's logits. V = 40,000: 313 vocabulary tiles, so each
    persistent program runs two or three of them on the same zeroed buffers."""
    if extended and block_b == 128:
        pytest.skip("kept logits run on the 64-row tile only")
    V = 40000
    h, w = _operands(B, 4096, V, torch.bfloat16, B + 7)
    params = _row_params(B, torch.Generator().manual_seed(B), "rows")
    cfg = TileConfig(block_b, 128, 64, 8, 5, tma=True, ws=True)
    layout = CandidateLayout(CandidateLayout.fields(extended, extended=extended), triton.cdiv(V, 128), B,
                             n_ifields=1 + KEEP if extended else 1)
    seen = _spy_on_padded_launches(monkeypatch, "box_rows")
    got, box = [], fused_sample.WS_BOX_ROWS
    assert box > 0
    for rows in (box, 0):
        monkeypatch.setattr(fused_sample, "ws_box_rows", lambda batch, block, rows=rows: rows)
        got.append(_launch_into_fresh(h, w, params, cfg, layout, V - 3, logprobs=extended, extended=extended))
    assert seen == [(B, box), (block_b, 0)]  # the hidden's own rows in boxes, then the padded copy
    assert torch.equal(got[0][1], got[1][1])
    assert torch.equal(got[0][0], got[1][0])


@hopper
@pytest.mark.parametrize("B", [129, 150, 192, 200, 257, 320])
def test_a_short_last_tile_writes_the_padded_launchs_candidates(B, monkeypatch):
    """A batch whose last 128-row tile holds at most 64 rows runs that tile as half a tile (launch_fused_ws's
    last_box_rows: its rows in boxes of configs.WS_LAST_BOX_ROWS, one 64-row wgmma a k-step): every candidate of the
    launch on a zero-padded hidden with whole tiles, bit for bit, [B] parameters with greedy, hot, cold and poisoned
    rows. B = 129 / 150 end inside a box (its last rows past the hidden's end); B = 200 (a last tile of 72 rows)
    keeps the whole tile. V = 40,000: 313 vocabulary tiles, so programs run short tiles after whole ones and the
    reverse (the rows a short tile leaves hold an earlier tile's data, or nothing, and must never reach a candidate)."""
    V = 40000
    h, w = _operands(B, 4096, V, torch.bfloat16, B + 11)
    params = _row_params(B, torch.Generator().manual_seed(B), "rows")
    params.temperature[B - 2] = float("nan")  # a poisoned row in the last tile too
    cfg = TileConfig(128, 128, 64, 8, 5, tma=True, ws=True)
    layout = CandidateLayout(1, triton.cdiv(V, 128), B)
    seen = _spy_on_padded_launches(monkeypatch, "last_box_rows")
    got, rows = [], fused_sample.WS_LAST_BOX_ROWS
    short = 0 < B % 128 <= 64
    for last in (rows, 0):
        monkeypatch.setattr(fused_sample, "WS_LAST_BOX_ROWS", last)
        got.append(_launch_into_fresh(h, w, params, cfg, layout, V - 3))
    padded = triton.cdiv(B, 128) * 128
    assert seen == ([(B, rows), (padded, 0)] if short else [(padded, 0), (padded, 0)])
    assert torch.equal(got[0][1], got[1][1])
    assert torch.equal(got[0][0], got[1][0])
    assert (got[0][1] == -1).any() and (got[0][1] >= 0).sum() > B  # poisoned rows and real candidates both


@hopper
def test_a_padded_partial_tile_writes_the_kept_logits_unchanged(monkeypatch):
    """Filtered calls past B = 64 run the Triton twin's 128-row tile with the extended epilogue (kept logits,
    boundaries, tile sums): with a partial last tile its padded launch writes every field of the unpadded one."""
    B, V = 80, 5000
    h, w = _operands(B, 4096, V, torch.bfloat16, 80)
    params = _row_params(B, torch.Generator().manual_seed(80), "rows")
    layout = CandidateLayout(CandidateLayout.fields(True, extended=True), triton.cdiv(V, 128), B, n_ifields=1 + KEEP)
    got = []
    for pad in (True, False):
        if not pad:
            monkeypatch.setattr(fused_sample, "PAD_TILE_ROWS", 1 << 30)
            monkeypatch.setattr(fused_sample, "PAD_HALF_TILE_ROWS", 1 << 30)
        dest = BufferPair.alloc(layout, "cuda")
        dest.f.fill_(7.0)
        dest.i.fill_(7)
        launch_fused(h, w, params, TRITON, layout, dest, vocab_size=V - 3, logprobs=True, extended=True)
        got.append((dest.f.nan_to_num(-12345.0), dest.i))
    assert torch.equal(got[0][1], got[1][1])
    assert torch.equal(got[0][0], got[1][0])


@hopper
def test_the_comparison_resolves_one_ulp():
    """Power of the bit-for-bit check above, in part: one ulp of temperature (a last-bit change of
    T * g, as the FMA contraction caught in the v17 probe made on ~2-20% of scores) is seen. It does
    not rebuild the unpinned kernel; the probe's first runs (bench/results/ws_probe_h100_*) are that."""
    g = torch.Generator().manual_seed(5)
    B, D, V = 128, 256, 4096
    w = (torch.randn(V, D, generator=g) * D ** -0.5).cuda().bfloat16()
    h = torch.randn(B, D, generator=g).cuda().bfloat16()
    ref = _candidates(WS, h, w, RowParams(0.8, 3, 4), V)
    other = _candidates(WS, h, w, RowParams(0.8 * (1 + 2 ** -23), 3, 4), V)  # T one ulp up
    assert not torch.equal(other[0], ref[0])


@hopper
def test_sample_uses_it_and_keeps_tokens(ws_calls):
    """fsdist.sample at B = 256 plans the warp-specialised tile; tokens equal the Triton kernel's,
    eager and replayed from a CUDA graph; a logprob call runs it too where configs.WS_FIELDS_FULL_TILE says (v118),
    else falls back to the Triton twin, with the same tokens either way."""
    g = torch.Generator().manual_seed(11)
    B, D, V = 256, 4096, 32000
    w = (torch.randn(V, D, generator=g) * D ** -0.5).cuda().bfloat16()
    h = torch.randn(B, D, generator=g).cuda().bfloat16()
    temp = (torch.rand(B, generator=g) + 0.5).cuda()
    seed = torch.arange(B, device="cuda")
    offset = torch.full((B,), 3, device="cuda")
    out = fsdist.sample(h, w, temperature=temp, seed=seed, offset=offset)
    assert len(ws_calls) == 1
    ref = fsdist.sample(h, w, temperature=temp, seed=seed, offset=offset, config=TRITON)
    assert torch.equal(out.tokens, ref.tokens)
    lp = fsdist.sample(h, w, temperature=temp, seed=seed, offset=offset, return_logprobs=True)
    assert len(ws_calls) == 1 + int(fused_sample.ws_takes_fields(128, True, False, True))
    assert torch.equal(lp.tokens, ref.tokens)
    ref_lp = fsdist.sample(h, w, temperature=temp, seed=seed, offset=offset, return_logprobs=True, config=TRITON)
    torch.testing.assert_close(lp.logprobs, ref_lp.logprobs, rtol=1e-5, atol=1e-5)

    static_h = h.clone()
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fsdist.sample(static_h, w, temperature=temp, seed=seed, offset=offset)
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph):
        captured = fsdist.sample(static_h, w, temperature=temp, seed=seed, offset=offset)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured.tokens, ref.tokens)


# ---- calls the warp-specialised kernel must leave to the Triton kernel -------------------------------------
EXCLUSIONS = ["logprobs", "extended", "processors", "hidden-misaligned", "hidden-row-stride", "weight-misaligned",
              "weight-row-stride", "fp32"]
# What the tensor-parallel heads add to a call, which the kernel runs too: the peer fan-out (two local buffers
# stand in for two ranks'), the device parity, a checked layout's header, a caller's header flags, all of them
# at once ("tp-head": the candidates head's stage 1; "-even": the step counter even, so the first copy), on the
# head's own layout (room for kept logits, capacity above the batch, two shards, this rank shard 1 at a vocabulary
# offset: "-shard"), on the 64-row tile with kept logits and logprobs ("-64-extended": a filtered TP call at
# B = 33-64), on the 128-row tile with them ("-128-extended": configs.WS_FIELDS_FULL_TILE on; B = 200) and with bias
# entries ("-bias": the 64-row tile past B = 64), and with a last batch tile of 22 rows run as half a tile ("-short":
# B = 150, launch_fused_ws's last_box_rows).
TP_CASES = ["peer-table", "parity", "checked", "flags", "tp-head", "tp-head-even", "tp-head-shard",
            "tp-head-64-extended", "tp-head-128-extended", "tp-head-bias", "tp-head-short"]
# The header flags the tp-head cases pass: not any launch's defaults, so that only a pass-through writes them.
TP_FLAGS = call_flags(True, True, extended=True, top_n=3, mode=1)


def _shifted(t):
    """A contiguous copy of t whose data starts 8 bytes past a 16-byte boundary (TMA wants 16)."""
    pad = 8 // t.element_size()
    out = torch.empty(t.numel() + pad, dtype=t.dtype, device=t.device)[pad:].view(t.shape)
    out.copy_(t)
    assert out.data_ptr() % 16 == 8
    return out


def _padded_rows(t, cols):
    """t's values in a column slice of a [rows, cols] tensor: row stride cols."""
    out = torch.zeros(t.shape[0], cols, dtype=t.dtype, device=t.device)[:, :t.shape[1]]
    out.copy_(t)
    return out


def _call_processing(B, vocab_size, bias):
    """A random token bitmask (80% allowed) and, with ``bias``, 30 bias entries per row."""
    gen = torch.Generator().manual_seed(1)
    allowed = torch.rand(B, vocab_size, generator=gen) < 0.8
    entries = None
    if bias:
        entries = fsdist.SparseLogits(torch.randint(0, vocab_size, (B, 30), generator=gen).cuda(),
                                      torch.randn(B, 30, generator=gen).cuda())
    return prepare_processing(token_bitmask=bitmask_from_allowed(allowed).cuda(), logit_bias=entries, batch=B,
                              vocab_size=vocab_size, device="cuda")


class _Call:
    """A launch_fused call that differs from a plain warp-specialised one (B = 200, two batch tiles, the last of 72
    rows; V = 1000, a partial last tile) by ``case`` alone; "plain" is the plain call. ("...-short": B = 150.)"""

    def __init__(self, case):
        B, D, V = 150 if case.endswith("-short") else 200, 256, 1000
        if case == "weight-row-stride":
            D = 100  # contiguous weight rows of 200 bytes
        self.h, self.w = _operands(B, D, V, torch.float32 if case == "fp32" else torch.bfloat16, 29)
        self.params = _row_params(B, torch.Generator().manual_seed(29), "rows")
        self.vocab_size = V - 3
        n_tiles = triton.cdiv(V, 128)
        self.layout = CandidateLayout(1, n_tiles, B)
        self.kw = {}
        tp_head = case.startswith("tp-head")
        self.parity = case in ("parity", "checked") or tp_head  # a checked layout needs the device step counter
        self.peers = case == "peer-table" or tp_head
        self.counter = 4 if case == "tp-head-even" else 5  # the step; odd picks the second copy
        if tp_head:
            extended = case.endswith("extended")
            self.layout = CandidateLayout(CandidateLayout.fields(extended, extended=extended), n_tiles, B,
                                          checked=True, n_ifields=1 + KEEP if extended else 1)
            self.kw = dict(flags=TP_FLAGS, logprobs=extended)
            if case == "tp-head-128-extended":  # (raw sums keep the 128-row tile's Triton twin: ws_takes_fields)
                self.kw["raw_sums"] = False
            if case == "tp-head-shard":
                self.layout = CandidateLayout(CandidateLayout.fields(False, extended=True), n_tiles, B + 56, 2,
                                              checked=True, n_ifields=1 + KEEP)
                self.vocab_size += 1024
                self.kw.update(shard=1, vocab_start=1024, extended=False)
            elif case == "tp-head-bias":
                self.params = dataclasses.replace(self.params, processing=_call_processing(B, self.vocab_size, True))
        elif case == "logprobs":
            self.layout = CandidateLayout(CandidateLayout.fields(True), n_tiles, B)
            self.kw = dict(logprobs=True)
        elif case == "extended":  # kept logits: launch_fused reads the choice off the layout
            self.layout = CandidateLayout(CandidateLayout.fields(False, extended=True), n_tiles, B,
                                          n_ifields=1 + KEEP)
        elif case in ("processors", "bias"):  # a bitmask alone; bias entries (and the bitmask)
            self.params = dataclasses.replace(self.params,
                                              processing=_call_processing(B, self.vocab_size, case == "bias"))
        elif case == "checked":
            self.layout = CandidateLayout(1, n_tiles, B, checked=True)
        elif case == "flags":  # a caller's header flags: launch_fused's own condition, not ws_supported's
            self.kw = dict(flags=call_flags(False, False))
        elif case == "hidden-misaligned":
            self.h = _shifted(self.h)
        elif case == "hidden-row-stride":
            self.h = _padded_rows(self.h, D + 4)  # 520-byte rows
        elif case == "weight-misaligned":
            self.w = _shifted(self.w)
        elif case == "weight-row-stride":
            self.h = _padded_rows(self.h, 104)  # the hidden's rows stay 16-byte multiples (208 bytes)

    def dest(self):
        """(the BufferPair to launch into, the buffers it writes), filled with a sentinel."""
        L = self.layout
        copies = 2 if self.parity else 1
        n_bufs = 2 if self.peers else 1  # two local buffers stand in for two ranks' (the epilogue stores into both)
        bufs = []
        for _ in range(n_bufs):
            bufs.append(torch.full((copies * L.float_numel,), 7.0, device="cuda"))
            bufs.append(torch.full((copies * L.int_numel,), 7, dtype=torch.int32, device="cuda"))
        parity = None
        if self.parity:  # the counter's parity picks the copy (5: the second)
            parity = DeviceParity(torch.tensor([self.counter], dtype=torch.int64, device="cuda"), L.float_numel,
                                  L.int_numel)
        if self.peers:
            table_f = torch.tensor([b.data_ptr() for b in bufs[0::2]], dtype=torch.int64, device="cuda")
            table_i = torch.tensor([b.data_ptr() for b in bufs[1::2]], dtype=torch.int64, device="cuda")
            return BufferPair(table_f, table_i, npeers=2, parity=parity), bufs
        return BufferPair(bufs[0], bufs[1], parity=parity), bufs

    def run(self, cfg):
        dest, bufs = self.dest()
        launch_fused(self.h, self.w, self.params, cfg, self.layout, dest, vocab_size=self.vocab_size, **self.kw)
        return [b.nan_to_num(-12345.0) if b.is_floating_point() else b for b in bufs]

    def supported(self):
        """Whether launch_fused runs this call on the ws 128-row tile (the kernel takes it, and the fields rule)."""
        logprobs = self.kw.get("logprobs", False)
        extended = self.kw.get("extended", self.layout.extended)
        return (fused_sample.ws_takes_fields(128, logprobs, extended, self.kw.get("raw_sums", True))
                and ws_supported(self.h, self.w, self.params, logprobs=logprobs, extended=extended))


@hopper
def test_bias_past_64_rows_takes_the_64_row_ws_tile(ws_calls):
    """A call with bias entries (and a bitmask) whose config is the 128-row ws tile (B = 200) runs the
    warp-specialised kernel on 64-row tiles (its 128-row epilogue would spill; v26b) and writes the Triton
    kernel's candidates bit for bit; a bitmask alone stays on the Triton kernel (an exclusion below)."""
    call = _Call("bias")
    assert not call.supported()  # the 128-row tile itself does not take them ...
    assert ws_supported(call.h, call.w, call.params, block_b=64)  # ... the 64-row does
    got = call.run(WS)
    assert ws_calls == [64]
    ref = call.run(TRITON)
    assert ws_calls == [64]
    for a, b in zip(got, ref):
        assert torch.equal(a, b)


@hopper
@pytest.mark.parametrize("case", TP_CASES)
def test_tensor_parallel_calls_write_the_triton_kernels_buffers(case, ws_calls, monkeypatch):
    """The tensor-parallel heads' stage 1 on the ws kernel: every buffer written (both peers' copies, in the
    copy the device counter picks, the call's header: row fingerprints and step record with the caller's
    flags; kept logits and logprob fields on the 64- and 128-row tiles) is the Triton kernel's with the same tile, bit
    for bit (the two tile sums within a few ulp, as in _fields_as_the_triton_tile), and
    the buffers the counter does not pick, or past the rows, keep their sentinel."""
    monkeypatch.setattr(configs, "WS_FIELDS_FULL_TILE", case == "tp-head-128-extended")
    call = _Call(case)
    ws_cfg, triton_cfg, rows = (WS64, TRITON64, 64) if case.endswith("64-extended") else (WS, TRITON, 128)
    if case == "tp-head-bias":
        rows = 64  # launch_fused sends bias entries to the 64-row ws tile (its 128-row epilogue would spill)
    logprobs = call.kw.get("logprobs", False)
    extended = call.kw.get("extended", call.layout.extended)
    assert ws_supported(call.h, call.w, call.params, logprobs=logprobs,
                        extended=extended, block_b=rows)
    got = call.run(ws_cfg)
    assert ws_calls == [rows]
    ref = call.run(triton_cfg)
    assert ws_calls == [rows]
    assert len(got) == len(ref) == (4 if call.peers else 2)
    L = call.layout
    for n, (a, b) in enumerate(zip(got, ref)):
        if n % 2 == 1 or not L.extended:
            assert torch.equal(a, b), n
            continue
        # fp32 buffer with kept logits: fields 3 and 4 (the tile sums) add the column halves' partial sums
        copies = a.view(-1, L.float_numel)
        for c in range(copies.shape[0]):
            fa = copies[c].view(L.n_fields, -1)
            fb = b.view(-1, L.float_numel)[c].view(L.n_fields, -1)
            exact = [k for k in range(L.n_fields) if k not in (3, 4)]
            assert torch.equal(fa[exact], fb[exact]), (n, c)
            torch.testing.assert_close(fa[3:5], fb[3:5], rtol=2e-6, atol=0.0)
    copy = call.counter & 1
    for n in range(len(got) // 2):  # each peer's copy
        if call.parity:  # the copy the counter does not pick is untouched, the other written
            f = got[2 * n].view(2, -1)
            assert (f[1 - copy] == 7.0).all() and not (f[copy] == 7.0).all()
        if L.checked:  # the header: (step, batch, the caller's flags or the launch's own, no error)
            i = got[2 * n + 1].view(2, -1)[copy] if call.parity else got[2 * n + 1]
            at = call.kw.get("shard", 0) * L.stride_shard_i + L.record_slot
            flags = call.kw.get("flags", call_flags(logprobs, False))
            assert i[at: at + 4].tolist() == [call.counter, call.h.shape[0], flags, 0]
            fp = i[at - L.batch_cap: at - L.batch_cap + call.h.shape[0]]  # the row fingerprints
            assert not (fp == 7).all()


@hopper
@pytest.mark.parametrize("case", ["plain"] + EXCLUSIONS)
def test_calls_it_cannot_take_run_the_triton_kernel(case, ws_calls, monkeypatch):
    """With the ws tile, every call ws_supported (or, for logprob / kept-logit fields, ws_takes_fields) excludes runs
    the Triton kernel: the warp-specialised launcher is never reached, and every buffer written (kept logits, logprob
    fields) is the Triton kernel's with the plain tile. "plain", the same call without the exclusion, must launch
    it: a case that launches nothing shows its exclusion, not a setup the kernel would refuse anyway. With
    configs.WS_FIELDS_FULL_TILE off (on since v118, whose tests run these fields on the 128-row tile), so that
    "logprobs" stays an exclusion; "extended" is one either way (raw sums)."""
    monkeypatch.setattr(configs, "WS_FIELDS_FULL_TILE", False)
    call = _Call(case)
    assert call.supported() == (case == "plain")
    got = call.run(WS)
    assert len(ws_calls) == int(case == "plain")
    ref = call.run(TRITON)
    assert len(ws_calls) == int(case == "plain")
    assert len(got) == len(ref)
    for a, b in zip(got, ref):
        assert torch.equal(a, b)
    if case == "plain":  # an empty batch is not taken either (checked here only: nothing to launch)
        assert not ws_supported(call.h[:0], call.w, call.params)


@hopper
@pytest.mark.parametrize("cfg", [WS, TRITON], ids=["ws", "triton"])
def test_a_checked_layout_without_the_step_counter_is_refused(cfg):
    """A checked layout needs the device step counter on both kernels: the call raises before its launch,
    and the buffers keep their sentinel."""
    call = _Call("checked")
    dest = BufferPair.alloc(call.layout, "cuda")
    dest.f.fill_(7.0)
    dest.i.fill_(7)
    with pytest.raises(ValueError, match="device step counter"):
        launch_fused(call.h, call.w, call.params, cfg, call.layout, dest, vocab_size=call.vocab_size)
    torch.cuda.synchronize()
    assert (dest.f == 7.0).all() and (dest.i == 7).all()


# ---- ties, NaN and +inf logits ------------------------------------------------------------------------------
# Ids given identical weight rows, per 128-id tile: both halves of tile 0, one half of tile 2, the left and
# the right half of tile 5 (the halves' merge), the right half of tile 7 with its last valid id.
TIES = [(10, 50, 100), (300, 301), (700, 764), (970, 971, 996)]
# A padding id (>= vocab_size) in tile 7 whose logit is above the tie's: it must never win.
PADDING_ID = 998


@hopper
@pytest.mark.parametrize("hand_off", [""] + sorted(HAND_OFFS))
@pytest.mark.parametrize("kind", ["rows", "scalar", "greedy"])
def test_ties_nan_and_inf_logits_as_the_triton_kernel(kind, hand_off, ws_calls, monkeypatch):
    """Equal logits in a tile and NaN / +inf logits, bit for bit as the Triton kernel: a tie goes to the
    lowest id (the column halves merged as tl.argmax would), a tile of -inf logits to its first id with
    score -inf, and a (row, tile) with a NaN or +inf logit is poisoned: score NaN, id -1, exactly where the
    logits computed here (IEEE products in fp64) have one, or where the row's temperature is bad."""
    B, D, V = 200, 128, 1000
    vocab_size, n_tiles = V - 3, triton.cdiv(V, 128)
    h, w = _operands(B, D, V, torch.bfloat16, 41)
    w[:, :4] = 0.0
    h[:, 0] = 8.0
    for ids in TIES:  # logit 16 + the same rest: the tile's maximum, tied
        w[list(ids)] = w[ids[0]].clone()
        w[list(ids), 0] = 2.0
    w[PADDING_ID] = w[TIES[-1][0]].clone()
    w[PADDING_ID, 0] = 3.0  # logit 24: the largest of its tile, were padding not masked
    w[200, 1] = float("inf")  # id 200 (tile 1): +inf, -inf or 0 * inf = NaN as h[:, 1] is 1, -1 or 0
    h[:, 1] = torch.tensor([1.0, -1.0, 0.0], device="cuda").repeat(B)[:B].to(h.dtype)
    w[384:512, 2] = float("-inf")  # tile 3: every logit -inf where h[:, 2] = 1 ...
    h[:, 2] = 1.0
    h[9, 2] = -1.0  # ... +inf for row 9
    h[11, 2] = 0.0  # ... NaN for row 11
    w[600, 3] = float("nan")  # id 600 (tile 4): NaN for every row
    h[5, 7] = float("nan")  # row 5: NaN everywhere
    params = _row_params(B, torch.Generator().manual_seed(41), kind)

    exact = (h.double()[:, None, :] * w.double()[None]).sum(-1)
    bad = torch.zeros(B, n_tiles * 128, dtype=torch.bool, device="cuda")
    bad[:, :vocab_size] = (exact.isnan() | (exact == float("inf")))[:, :vocab_size]
    t = params.temperature
    t = t if isinstance(t, torch.Tensor) else torch.full((B,), t, device="cuda")
    poisoned = bad.view(B, n_tiles, 128).any(-1).T | (~((t >= 0) & (t <= MAX_TEMPERATURE)))[None, :]  # [tile, row]
    assert poisoned[1].any() and not poisoned[1].all() and poisoned[3, 9] and poisoned[3, 11] and poisoned[4].all()

    _use_hand_off(monkeypatch, hand_off)  # (and the hand-off variants, v87 / v90)
    got = _candidates(WS, h, w, params, vocab_size)
    assert len(ws_calls) == 1
    ref = _candidates(TRITON, h, w, params, vocab_size)
    assert torch.equal(got[1], ref[1])
    assert torch.equal(got[0], ref[0])
    score, idx = got[0].view(n_tiles, B), got[1].view(n_tiles, B)
    assert torch.equal(idx == -1, poisoned)
    assert torch.equal(score == -12345.0, poisoned)  # NaN scores (the helper maps NaN to -12345)
    greedy = t == 0
    assert greedy.any() == (kind != "scalar")
    for ids in TIES:
        tile = ids[0] // 128
        rows = greedy & ~poisoned[tile]
        assert kind == "scalar" or rows.any()
        assert (idx[tile][rows] == ids[0]).all(), ids
    assert vocab_size <= PADDING_ID < V and not (idx == PADDING_ID).any()
    flat = ~poisoned[3]
    assert flat.sum() > B // 2
    assert (idx[3][flat] == 384).all() and (score[3][flat] == torch.finfo(torch.float32).min).all()


# ---- the 64-row tile: logprobs and kept logits ----------------------------------------------------------------
WS64 = TileConfig(64, 128, 64, 8, 5, tma=True, ws=True)
TRITON64 = TileConfig(64, 128, 64, 8, 5, tma=True)


def _fields_as_the_triton_tile(h, w, params, layout, vocab_size, vocab_start, ws_calls, cfgs=None, **kw):
    """Launch the 64-row tile (or ``cfgs``: the ws config, then its Triton twin) on the ws kernel and on the Triton
    kernel (launch_fused keyword arguments kw) and check that the ws kernel ran and wrote every field of the Triton
    kernel's bit for bit, the two tile sums (fields 3 and 4: the column halves' partial sums added) within a few ulp;
    the ws fields (NaN as -12345, [fields, tiles, B]) and ids ([ifields, tiles, B])."""
    B = h.shape[0]
    got = []
    for cfg in cfgs or (WS64, TRITON64):
        dest = BufferPair.alloc(layout, h.device)
        dest.f.fill_(7.0)
        dest.i.fill_(7)
        launch_fused(h, w, params, cfg, layout, dest, vocab_size=vocab_size, vocab_start=vocab_start, **kw)
        got.append((dest.f.view(layout.n_fields, -1, B).nan_to_num(-12345.0), dest.i.view(layout.n_ifields, -1, B)))
    assert ws_calls == [(cfgs or (WS64,))[0].block_b]
    (fw, iw), (ft, it) = got
    assert torch.equal(iw, it)
    sums = [3] + ([4] if layout.extended else [])
    exact = [k for k in range(layout.n_fields) if k not in sums]
    assert torch.equal(fw[exact], ft[exact])
    for k in sums:
        torch.testing.assert_close(fw[k], ft[k], rtol=2e-6, atol=0.0)
    return fw, iw


@hopper
@pytest.mark.parametrize("kind", ["rows", "scalar", "greedy"])
@pytest.mark.parametrize("case", ["logprobs", "extended", "extended_lean", "extended_winners"])
@pytest.mark.parametrize("vocab_start", [0, 5120])  # 5120: a tensor-parallel shard (group-log-mass head)
@pytest.mark.parametrize("rows, B", [(64, 100), (128, 200), (128, 150)])
def test_ws_tiles_write_the_triton_kernels_fields(kind, case, vocab_start, rows, B, ws_calls, monkeypatch):
    """The warp-specialised kernel also writes the logprob fields (the winner's logit, the tile's max and scaled
    sum) and the extended ones (raw sum, the 4 kept logits and their ids, the boundary): every field bit for bit as
    the Triton kernel with the same tile, except the two sums, which add the column halves' partial sums (a few
    ulp; on the 128-row tile each half's sum is shifted by its own max, then rescaled: configs.WS_FIELDS_FULL_TILE,
    on here). Ragged batches (64-row tile: B = 100, two tiles, the second part empty; 128-row tile: B = 200, the
    last tile of 72 rows on a padded hidden, and B = 150, a last tile of 22 rows run as half a tile), a tie
    across the column halves as every row's tile maximum (ids 3 and 70), one inside a half (130, 131), a
    tile of -inf logits for every row (tile 2), a last tile with two valid ids and a padding id whose logit
    is the largest of its tile, bad-temperature rows. ("extended_winners": kept logits and the winners'
    logits without logprobs, as a min-p call writes them for select_filtered.) On the 128-row tile raw sums
    ("extended") keep the Triton twin in launch_fused (their epilogue spills): run here on the ws kernel anyway."""
    monkeypatch.setattr(configs, "WS_FIELDS_FULL_TILE", True)
    D, V = 256, 3000
    vocab_size = vocab_start + 2946  # the last tile (local ids 2944-2999) has two valid ids
    h, w = _operands(B, D, V, torch.bfloat16, 77)
    w[:, :4] = 0.0
    h[:, 0] = 8.0
    for ids in ((3, 70), (130, 131), (2944, 2947)):  # logit 16 + the same rest: tied maxima (2947: padding)
        w[list(ids)] = w[ids[0]].clone()
        w[list(ids), 0] = 2.0
    w[2947, 0] = 3.0  # padding: logit 24, never kept, never the boundary
    w[256:384, 2] = float("-inf")  # tile 2: every logit -inf (h[:, 2] = 1)
    h[:, 2] = 1.0
    params = _row_params(B, torch.Generator().manual_seed(5), kind)
    extended = case != "logprobs"
    layout = CandidateLayout(CandidateLayout.fields(True, extended), triton.cdiv(V, 128), B,
                             n_ifields=1 + KEEP if extended else 1)
    kw = dict(logprobs=case == "logprobs", extended=extended, raw_sums=case == "extended",
              winner_logit=case == "extended_winners")
    if rows == 128 and case == "extended":  # (the kernel's raw sums: launch_fused leaves them to the twin)
        assert not fused_sample.ws_takes_fields(128, False, True, True)
        monkeypatch.setattr(fused_sample, "ws_takes_fields", lambda *a: True)
    fw, iw = _fields_as_the_triton_tile(h, w, params, layout, vocab_size, vocab_start, ws_calls,
                                        cfgs=(WS64, TRITON64) if rows == 64 else (WS, TRITON), **kw)
    if case == "extended_winners" and kind != "greedy":
        assert not torch.equal(fw[1], fw[0]), "field 1 must hold the winners' logits, not their scores"
    if extended:
        kept = iw[1:] - vocab_start
        assert ((kept[0, 0] == 3) & (kept[1, 0] == 70)).all(), "the tie across the halves: lower id first"
        assert ((kept[0, 1] == 130) & (kept[1, 1] == 131)).all()
        lowest = torch.finfo(torch.float32).min  # -inf after nan_to_num
        assert (fw[5:10, 2] == lowest).all(), "tile 2 holds only -inf logits"
        # an all -inf tile keeps -inf at its first id in every slot (removing a -inf leaves a -inf), as tile_topk
        assert (kept[:, 2] == 256).all()
        finite = fw[5:9] > lowest
        assert not (finite & (kept >= vocab_size - vocab_start)).any(), "a padding id was kept with a logit"
        assert finite[:2, 23].all() and not finite[2:, 23].any() and (fw[9, 23] == lowest).all()  # 2 valid ids
        assert (kept[0, 23] == 2944).all() and (kept[1, 23] == 2945).all()
        assert (fw[5] >= fw[8]).all() and (fw[8] >= fw[9]).all()


@hopper
@pytest.mark.parametrize("rows, B", [(64, 100), (128, 200)])
@pytest.mark.parametrize("case", ["logprobs", "extended", "extended_lean"])
def test_nan_logits_in_the_fields_as_the_triton_tile(rows, B, case, ws_calls, monkeypatch):
    """A row whose logits are all NaN (a NaN hidden row) and a column half whose logits are NaN for every row (64
    weight rows of NaN in tile 10): such (row, tile) cells are poisoned (id -1); their tile sums are still the
    Triton kernel's (0 or finite where it writes them: on the 128-row tile a half's NaN max must not reach the
    rescaled sum), and every field of every other cell is too, bit for bit (the sums within a few ulp)."""
    monkeypatch.setattr(configs, "WS_FIELDS_FULL_TILE", True)
    if rows == 128 and case == "extended":  # (raw sums: launch_fused leaves them to the twin; run them anyway)
        monkeypatch.setattr(fused_sample, "ws_takes_fields", lambda *a: True)
    D, V = 256, 3000
    h, w = _operands(B, D, V, torch.bfloat16, 83)
    h[5] = float("nan")
    w[1280:1344] = float("nan")
    params = _row_params(B, torch.Generator().manual_seed(13), "rows")
    extended = case != "logprobs"
    layout = CandidateLayout(CandidateLayout.fields(True, extended), triton.cdiv(V, 128), B,
                             n_ifields=1 + KEEP if extended else 1)
    got = []
    for cfg in ((WS64, TRITON64) if rows == 64 else (WS, TRITON)):
        dest = BufferPair.alloc(layout, h.device)
        dest.f.fill_(7.0)
        dest.i.fill_(7)
        launch_fused(h, w, params, cfg, layout, dest, vocab_size=V - 3, logprobs=case == "logprobs",
                     extended=extended, raw_sums=case == "extended")
        got.append((dest.f.view(layout.n_fields, -1, B).nan_to_num(-12345.0), dest.i.view(layout.n_ifields, -1, B)))
    assert ws_calls == [rows]
    (fw, iw), (ft, it) = got
    assert torch.equal(iw[0], it[0])
    poisoned = it[0] == -1
    t = params.temperature
    expected = torch.zeros_like(poisoned)
    expected[:, 5] = True
    expected[10] = True
    expected[:, ~((t >= 0) & (t <= MAX_TEMPERATURE))] = True  # the bad-temperature rows
    assert torch.equal(poisoned, expected), "row 5, tile 10 and the bad-temperature rows, nothing else"
    sums = [3] + ([4] if case == "extended" else [])
    for k in range(layout.n_fields):
        a, b = (fw[k], ft[k]) if k in sums else (fw[k][~poisoned], ft[k][~poisoned])
        if k in sums:
            torch.testing.assert_close(a, b, rtol=2e-6, atol=0.0)
        else:
            assert torch.equal(a, b), k
    for k in range(1, layout.n_ifields):
        assert torch.equal(iw[k][~poisoned], it[k][~poisoned]), k
    finite = torch.arange(B, device="cuda") != 5
    assert (fw[3, 10][finite] > 0).all(), "tile 10's finite half adds to its sum (NaN maps to -12345)"
    assert (fw[3, :, 5] == 0).all(), "a NaN row sums nothing"


@hopper
def test_filtered_calls_on_the_64_row_tile(ws_calls):
    """fsdist.sample with top-k + top-p, min-p and top-N logprobs on the 64-row warp-specialised tile: the
    same tokens, fallback flags and top-N ids as the Triton kernel's tile, logprobs within fp32 rounding."""
    B, D, V = 64, 512, 20_000
    h, w = _operands(B, D, V, torch.bfloat16, 78)
    g = torch.Generator().manual_seed(6)
    rows = dict(temperature=(torch.rand(B, generator=g) + 0.3).cuda(), seed=torch.arange(B).cuda() * 3 + 1,
                offset=torch.full((B,), 5).cuda())
    for filt in (dict(top_k=torch.full((B,), 40, dtype=torch.int32).cuda(), top_p=torch.full((B,), 0.9).cuda()),
                 dict(min_p=torch.full((B,), 0.05).cuda()), dict(top_k=20)):
        outs = [fsdist.sample(h, w, **rows, **filt, return_logprobs=True, top_logprobs=5, config=cfg)
                for cfg in (WS64, TRITON64)]
        assert torch.equal(outs[0].tokens, outs[1].tokens)
        assert torch.equal(outs[0].fallback, outs[1].fallback)
        assert torch.equal(outs[0].top_ids, outs[1].top_ids)
        torch.testing.assert_close(outs[0].logprobs, outs[1].logprobs, rtol=1e-5, atol=1e-5)
    assert len(ws_calls) == 3


@hopper
@pytest.mark.parametrize("B", [96, 256])
def test_filtered_calls_past_64_rows_take_the_ws_tiles(B, ws_calls):
    """v80 / v85: past one 64-row tile a filtered / top-N call at D <= 4096 takes the warp-specialised 64-row tile by
    default on an H100 and an H200 alike (B = 96: a partial last tile read past the hidden's end, which TMA fills with
    zeros), and from configs.FIELDS_FULL_TILE_MIN_BATCH rows its 128-row tile where configs.WS_FIELDS_FULL_TILE says
    (v118; B = 256); either gives what the 128-row Triton tile gives: tokens, fallback flags, top-N ids, logprobs
    within fp32 rounding."""
    tile = 128 if configs.WS_FIELDS_FULL_TILE and B >= configs.FIELDS_FULL_TILE_MIN_BATCH else 64
    D, V = 512, 20_000
    h, w = _operands(B, D, V, torch.bfloat16, 80)
    g = torch.Generator().manual_seed(8)
    rows = dict(temperature=(torch.rand(B, generator=g) + 0.3).cuda(), seed=torch.arange(B).cuda() * 5 + 2,
                offset=torch.full((B,), 7).cuda())
    for filt in (dict(top_k=torch.full((B,), 40, dtype=torch.int32).cuda(), top_p=torch.full((B,), 0.9).cuda()),
                 dict(min_p=torch.full((B,), 0.05).cuda())):
        kw = dict(rows, **filt, return_logprobs=True, top_logprobs=3, path="fused")
        ws_calls.clear()
        got = fsdist.sample(h, w, **kw)
        assert ws_calls == [tile], ws_calls  # the default config: one launch of the ws tile
        ref = fsdist.sample(h, w, **kw, config=TRITON)
        assert torch.equal(got.tokens, ref.tokens)
        assert torch.equal(got.fallback, ref.fallback)
        assert torch.equal(got.top_ids, ref.top_ids)
        torch.testing.assert_close(got.logprobs, ref.logprobs, rtol=1e-5, atol=1e-5)


@hopper
@pytest.mark.parametrize("B", [150, 200, 256])
@pytest.mark.parametrize("D", [512, 8192])
def test_filtered_calls_on_the_128_row_ws_tile(B, D, ws_calls, monkeypatch):
    """configs.WS_FIELDS_FULL_TILE: filtered / top-N calls on the warp-specialised 128-row tile (B = 150: a last tile
    of 22 rows run as half a tile; 200: a last tile of 72 rows on a padded hidden; D = 8192: the shape whose default
    config is that tile) give what the 128-row Triton tile gives: tokens, fallback flags, top-N ids, logprobs within
    fp32 rounding; "raw" logprobs (raw sums) keep the Triton twin."""
    monkeypatch.setattr(configs, "WS_FIELDS_FULL_TILE", True)
    V = 20_000
    h, w = _operands(B, D, V, torch.bfloat16, 81)
    g = torch.Generator().manual_seed(9)
    rows = dict(temperature=(torch.rand(B, generator=g) + 0.3).cuda(), seed=torch.arange(B).cuda() * 7 + 3,
                offset=torch.full((B,), 11).cuda())
    for filt in (dict(top_k=torch.full((B,), 40, dtype=torch.int32).cuda(), top_p=torch.full((B,), 0.9).cuda()),
                 dict(min_p=torch.full((B,), 0.05).cuda()), dict(top_k=20, logprobs_mode="raw")):
        kw = dict(rows, **filt, return_logprobs=True, top_logprobs=3, path="fused")
        ws_calls.clear()
        got = fsdist.sample(h, w, **kw, config=WS)
        assert ws_calls == ([] if filt.get("logprobs_mode") == "raw" else [128]), ws_calls
        ref = fsdist.sample(h, w, **kw, config=TRITON)
        assert torch.equal(got.tokens, ref.tokens)
        assert torch.equal(got.fallback, ref.fallback)
        assert torch.equal(got.top_ids, ref.top_ids)
        torch.testing.assert_close(got.logprobs, ref.logprobs, rtol=1e-5, atol=1e-5)


# ---- the 64-row tile: token bitmask, logit bias and penalties ---------------------------------------------------
def _processing(B, vocab_start, vocab_size, which, seed):
    """A call's processors on global ids [vocab_start, vocab_size): a random bitmask (80% allowed; row 3 allows
    nothing but ids 2944 / 2945 of the shard, the last tile's two valid ids), bias entries (row 0: 300 ids in
    tiles 0-1, so a half's slice runs far past any head; runs of one id; ids on the column halves' and the
    tiles' edges) and penalties with repeated output ids."""
    g = torch.Generator().manual_seed(seed)
    lo, hi = vocab_start, vocab_size
    kw = {}
    if which in ("bitmask", "both"):
        allowed = torch.rand(B, vocab_size, generator=g) < 0.8
        allowed[:, :vocab_start] = False
        allowed[3] = False
        allowed[3, lo + 2944:lo + 2946] = True
        kw["token_bitmask"] = bitmask_from_allowed(allowed).cuda()
    if which in ("sparse", "both"):
        ids = torch.randint(lo, hi, (B, 320), generator=g)
        ids[0, :300] = lo + torch.randperm(256, generator=g).repeat(2)[:300]  # 300 entries in tiles 0-1
        ids[:, 300] = lo + 63  # the last id of a column half ...
        ids[:, 301] = lo + 64  # ... the first of the next
        ids[:, 302] = lo + 127
        ids[:, 303] = lo + 128
        ids[:, 304:306] = lo + 200  # one id twice: both values, in order
        ids[5, 310:] = -1
        vals = torch.randn(B, 320, generator=g) * 2
        out = torch.randint(lo, hi, (B, 40), generator=g)
        out[:, 1:6] = lo + 64  # five occurrences of one id
        prompt = torch.randint(lo, hi, (B, 30), generator=g)
        kw["logit_bias"] = fsdist.SparseLogits(ids.cuda(), vals.cuda())
        kw["penalties"] = fsdist.Penalties(torch.linspace(1.1, 1.6, B).cuda(), torch.linspace(0.0, 0.5, B).cuda(),
                                           torch.linspace(-0.3, 0.3, B).cuda(), out.cuda(), prompt.cuda())
    return prepare_processing(**kw, batch=B, vocab_size=vocab_size, device="cuda")


@hopper
@pytest.mark.parametrize("kind", ["rows", "greedy"])
@pytest.mark.parametrize("which", ["bitmask", "sparse", "both"])
@pytest.mark.parametrize("case", ["plain", "extended"])
@pytest.mark.parametrize("vocab_start", [0, 5120, 5004])  # 5004: a shard that starts inside a bitmask word
@pytest.mark.parametrize("B", [100, 24])  # 24: one tile, at least half empty: a zero-padded hidden (v68)
def test_64_row_tile_with_processors(kind, which, case, vocab_start, B, ws_calls):
    """Token bitmask, logit bias and penalties on the 64-row warp-specialised tile: the epilogue gathers the
    bitmask and searches each row's entries per column half (no entry-offset table), so the processed logits,
    hence every field, must be the Triton kernel's (its head entries and word loads) bit for bit, the two
    tile sums within a few ulp. Ragged batches (B = 100; B = 24, the padded hidden of calls with entries at B = 17-32),
    a row whose mask allows two ids."""
    D, V = 256, 3000
    vocab_size = vocab_start + 2946
    h, w = _operands(B, D, V, torch.bfloat16, 79)
    params = dataclasses.replace(_row_params(B, torch.Generator().manual_seed(7), kind),
                                 processing=_processing(B, vocab_start, vocab_size, which, 8))
    extended = case == "extended"
    layout = CandidateLayout(CandidateLayout.fields(True, extended), triton.cdiv(V, 128), B,
                             n_ifields=1 + KEEP if extended else 1)
    fw, iw = _fields_as_the_triton_tile(h, w, params, layout, vocab_size, vocab_start, ws_calls,
                                        logprobs=not extended, extended=extended)
    if which != "sparse":  # row 3: only the last tile has an allowed id
        first_ids = torch.arange(23, device="cuda", dtype=torch.int32) * 128  # a tile of -inf: its first id
        assert torch.equal(iw[0, :23, 3] - vocab_start, first_ids)
        assert (fw[0, :23, 3] == torch.finfo(torch.float32).min).all()
        assert (iw[0, 23, 3] - vocab_start).item() in (2944, 2945)
    # power: the same call without the processors writes other candidates
    dest = BufferPair.alloc(layout, h.device)
    launch_fused(h, w, dataclasses.replace(params, processing=None), WS64, layout, dest, vocab_size=vocab_size,
                 vocab_start=vocab_start, logprobs=not extended, extended=extended)
    assert not torch.equal(dest.i.view(layout.n_ifields, -1, B), iw)


@hopper
def test_processed_calls_on_the_64_row_tile(ws_calls):
    """fsdist.sample with the bitmask, bias and penalties (alone and with top-k + top-p) at B = 64 plans the
    warp-specialised tile: same tokens, fallback flags and logprobs as the Triton kernel's tile, eager and as
    a CUDA-graph replay with every input on the device."""
    B, D, V = 64, 512, 20_000
    h, w = _operands(B, D, V, torch.bfloat16, 80)
    g = torch.Generator().manual_seed(9)
    rows = dict(temperature=(torch.rand(B, generator=g) + 0.3).cuda(), seed=torch.arange(B).cuda() * 3 + 1,
                offset=torch.full((B,), 5).cuda())
    allowed = torch.rand(B, V, generator=g) < 0.5
    proc = dict(token_bitmask=bitmask_from_allowed(allowed).cuda(),
                logit_bias=fsdist.SparseLogits(torch.randint(0, V, (B, 500), generator=g).cuda(),
                                               (torch.randn(B, 500, generator=g) * 3).cuda()),
                penalties=fsdist.Penalties(torch.full((B,), 1.3).cuda(), torch.full((B,), 0.2).cuda(),
                                           torch.full((B,), 0.1).cuda(),
                                           torch.randint(0, V, (B, 300), generator=g).cuda(),
                                           torch.randint(0, V, (B, 200), generator=g).cuda()))
    filt = dict(top_k=torch.full((B,), 40, dtype=torch.int32).cuda(), top_p=torch.full((B,), 0.9).cuda())
    for extra in ({}, filt):
        outs = [fsdist.sample(h, w, **rows, **proc, **extra, return_logprobs=True, config=cfg)
                for cfg in (WS64, TRITON64)]
        assert torch.equal(outs[0].tokens, outs[1].tokens)
        if extra:
            assert torch.equal(outs[0].fallback, outs[1].fallback)
        torch.testing.assert_close(outs[0].logprobs, outs[1].logprobs, rtol=1e-5, atol=1e-5)
    assert len(ws_calls) == 2
    # the default plan at B = 64 takes the ws tile, and a graph replay gives the same tokens
    ref = fsdist.sample(h, w, **rows, **proc, **filt, config=TRITON64)
    static_h = h.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fsdist.sample(static_h, w, **rows, **proc, **filt)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = fsdist.sample(static_h, w, **rows, **proc, **filt)
    graph.replay()
    torch.cuda.synchronize()
    assert len(ws_calls) == 4
    assert torch.equal(captured.tokens, ref.tokens)
