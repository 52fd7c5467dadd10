"""configs.SKIP_FILTERED_NOISE: a filtered call's stage-1 tiles draw no noise where none of their rows reads it.

A row restricted by top-k or top-p gets its token from select_filtered's draw over its surviving kept logits (the
contract's noise drawn there, for those ids) or from the fallback, never from its tiles' noisy winners; a greedy row
scores its logit with or without the noise (epilogue.rows_draw_noise). So a tile of only such rows may skip the
noise: every output of the call must stay the same (tokens, logprobs, top-N, fallback flags), the tiles' fields
other than the winner stay the same bit for bit, and a tile holding a row that reads its winners (unfiltered, min-p
alone) must still draw. The power test shows that a rule dropping a reader's noise would fail the comparison.

CPU: the Triton kernel on 16-row tiles under the interpreter. GPU: the Triton kernel, and on sm_90 the
warp-specialised 64- and 128-row tiles.
"""
import pytest
import torch
import triton
import triton.language as tl

import fsdist
from fsdist.ops import configs, epilogue, fused_sample
from fsdist.ops.configs import TileConfig
from fsdist.ops.epilogue import rows_draw_noise
from fsdist.ops.fused_sample import launch_fused
from fsdist.ops.layout import BufferPair, CandidateLayout
from fsdist.params import RowParams

ON_GPU = torch.cuda.is_available()
DEVICE = torch.device("cuda" if ON_GPU else "cpu")
HOPPER = ON_GPU and torch.cuda.get_device_capability() == (9, 0)

if ON_GPU:
    CONFIGS = [TileConfig(32, 128, 64, 4, 3)] + ([TileConfig(64, 128, 64, 8, 5, tma=True, ws=True),
                                                  TileConfig(128, 128, 64, 8, 5, tma=True, ws=True)] if HOPPER else [])
else:
    CONFIGS = [TileConfig(16, 128, 32, num_stages=1)]
D, V = (256, 3000) if ON_GPU else (64, 1000)  # V: the last tile ends inside the vocabulary tile


def _operands(B, seed):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(B, D, generator=g)
    w = torch.randn(V, D, generator=g) * (1.5 / D ** 0.5)
    dtype = torch.bfloat16 if ON_GPU else torch.float32
    return h.to(DEVICE, dtype), w.to(DEVICE, dtype)


def _rows(block_b, seed):
    """Three batch tiles of per-row parameters. Tile 0 is "quiet": every row greedy, poisoned or restricted by top-k /
    top-p, so no row reads the noise; among them rows with bad values (top-p 0, top-k -1 beside a top-p, min-p 2: each
    returns -1), a NaN temperature (-1), top-k + min-p and top-p + min-p rows, a greedy row (and, in whole calls, a row
    of NaN logits: row 2). Tile 1 must draw: unfiltered rows and a min-p-only row (its proof from the winners reads
    their scores) among restricted ones. Tile 2 must draw: an unfiltered row, and a NaN top-p with top-k off (the rule
    keeps its noise; -1 all the same). (Several unfiltered rows: a sampled token may be the argmax, which a skipped
    noise would give too.)"""
    B = 3 * block_b
    g = torch.Generator().manual_seed(seed)
    temp = torch.rand(B, generator=g) * 0.8 + 0.5
    top_k = torch.zeros(B, dtype=torch.int32)
    top_p = torch.ones(B)
    min_p = torch.zeros(B)
    top_k[0::3] = 30
    top_p[1::3] = 0.8
    top_k[2::3] = 200
    top_p[2::3] = 0.95
    top_p[1] = 0.0  # tile 0: bad values, restricted all the same (-1)
    top_k[3], top_p[3] = -1, 0.9
    min_p[4] = 2.0
    temp[5] = 0.0  # greedy
    temp[6] = float("nan")  # poisoned
    min_p[7] = 0.05  # top-p + min-p
    min_p[9] = 0.1  # top-k + min-p
    for r in (4, 9, 12):  # tile 1: unfiltered rows ...
        top_k[block_b + r] = 0
        top_p[block_b + r] = 1.0
    top_k[block_b + 7] = 0  # ... and a min-p-only row
    top_p[block_b + 7] = 1.0
    min_p[block_b + 7] = 0.05
    top_k[2 * block_b + 4] = 0  # tile 2: an unfiltered row ...
    top_p[2 * block_b + 4] = 1.0
    top_k[2 * block_b + 1] = 0  # ... and a NaN top-p with top-k off
    top_p[2 * block_b + 1] = float("nan")
    return dict(temperature=temp.to(DEVICE), seed=torch.arange(B, device=DEVICE) * 7 + 1,
                offset=torch.full((B,), 3, device=DEVICE), top_k=top_k.to(DEVICE), top_p=top_p.to(DEVICE),
                min_p=min_p.to(DEVICE))


READERS = (("tile 1", (4, 7, 9, 12)), ("tile 2", (1, 4)))  # rows that read the noise, by tile offset
BAD = (1, 2, 3, 4, 6)  # tile 0's rows that return -1 (2: NaN logits in whole calls)


def _ids(cfg):
    return f"{cfg.block_b}{'-ws' if cfg.ws else ''}"


@pytest.mark.parametrize("cfg", CONFIGS, ids=_ids)
def test_quiet_tiles_score_their_logits_and_every_other_field_stays(cfg):
    """launch_fused with skip_filtered_noise: tile 0's winners score the raw logits (field 0 = the tile max, field 2),
    where without the skip they carry the noise; tiles 1 and 2 (a reader of the noise in each) and every field but
    the winner's score, logit and id are bit for bit the same."""
    rows = _rows(cfg.block_b, 4)
    B = rows["seed"].shape[0]
    h, w = _operands(B, 11)
    params = RowParams(rows["temperature"], rows["seed"], rows["offset"], top_k=rows["top_k"], top_p=rows["top_p"],
                       min_p=rows["min_p"])
    layout = CandidateLayout(CandidateLayout.fields(True, extended=True), triton.cdiv(V, cfg.block_v), B,
                             n_ifields=5)
    got = {}
    for skip in (False, True):
        dest = BufferPair.alloc(layout, DEVICE)
        launch_fused(h, w, params, cfg, layout, dest, vocab_size=V, extended=True, raw_sums=False,
                     winner_logit=True, skip_filtered_noise=skip)
        got[skip] = (dest.f.view(layout.n_fields, -1, B).nan_to_num(-12345.0),
                     dest.i.view(layout.n_ifields, -1, B))
    (f0, i0), (f1, i1) = got[False], got[True]
    assert torch.equal(f0[2:], f1[2:]) and torch.equal(i0[1:], i1[1:]), "only the winner's fields may change"
    quiet, rest = slice(0, cfg.block_b), slice(cfg.block_b, B)
    assert torch.equal(f0[:2, :, rest], f1[:2, :, rest]) and torch.equal(i0[:, :, rest], i1[:, :, rest])
    live = torch.arange(cfg.block_b) != 6  # (row 6: a NaN temperature, poisoned: score NaN, id -1 either way)
    q1 = f1[:, :, quiet][:, :, live]
    assert torch.equal(q1[0], q1[2]), "a quiet tile's winner scores its logit: the tile max"
    assert torch.equal(q1[1], q1[2]), "... and its logit (field 1) is that max"
    q0 = f0[:, :, quiet][:, :, live]
    assert not torch.equal(q0[0], q0[2]), "with the noise the scores differ (not vacuous)"
    assert (f1[0, :, 6] == -12345.0).all() and (i1[0, :, 6] == -1).all()


def _spy(monkeypatch):
    seen = []
    real = fused_sample.launch_fused

    def spy(*a, **k):
        seen.append(k.get("skip_filtered_noise", False))
        return real(*a, **k)

    import fsdist.ops.plan as plan
    monkeypatch.setattr(plan, "launch_fused", spy)
    return seen


def _call(h, w, rows, cfg, **kw):
    return fsdist.sample(h, w, **rows, config=cfg, path="fused", **kw)


def _same(a, b):
    assert torch.equal(a.tokens, b.tokens)
    for x, y in ((a.fallback, b.fallback), (a.logprobs, b.logprobs), (a.logsumexp, b.logsumexp)):
        assert (x is None) == (y is None)
        if x is not None:
            assert torch.equal(x.nan_to_num(-1.0), y.nan_to_num(-1.0))
    if a.top_ids is not None:
        assert torch.equal(a.top_ids, b.top_ids)
        assert torch.equal(a.top_logprobs.nan_to_num(-1.0), b.top_logprobs.nan_to_num(-1.0))


MODES = [dict(return_logprobs=True, top_logprobs=3, logprobs_mode=m) for m in ("scaled", "raw", "processed")]


@pytest.mark.parametrize("cfg", CONFIGS, ids=_ids)
@pytest.mark.parametrize("extra", MODES + [dict()], ids=["scaled", "raw", "processed", "tokens"])
def test_sample_gives_the_same_outputs_with_the_skip(cfg, extra, monkeypatch):
    """fsdist.sample with and without configs.SKIP_FILTERED_NOISE: the same tokens, logprobs, logsumexp, top-N and
    fallback flags in every logprobs mode, on a tile that skips (with poisoned, bad-value and NaN-logit rows in it)
    and tiles that must draw; the calls asked for the skip (and only where the switch is on)."""
    rows = _rows(cfg.block_b, 5)
    B = rows["seed"].shape[0]
    h, w = _operands(B, 12)
    h[2] = float("nan")  # a row of NaN logits in the quiet tile: token -1 either way
    seen = _spy(monkeypatch)
    out = {}
    for on in (False, True):
        monkeypatch.setattr(configs, "SKIP_FILTERED_NOISE", on)
        out[on] = _call(h, w, rows, cfg, **extra)
    assert seen == [False, True]
    _same(out[False], out[True])
    t = out[True].tokens.cpu()
    bad = torch.zeros(B, dtype=torch.bool)
    bad[list(BAD) + [2 * cfg.block_b + 1]] = True
    assert (t[bad] == -1).all() and (t[~bad] >= 0).all(), t


@pytest.mark.parametrize("cfg", CONFIGS[-1:], ids=_ids)
def test_processors_with_filters_give_the_same_outputs(cfg, monkeypatch):
    """Token bitmask, logit bias and penalties with the filters (the processed logits are what every tile scores, with
    or without the noise): the same outputs with and without the skip; on a GPU the last config (the ws 128-row tile
    on sm_90; processors move such calls to its 64-row tile)."""
    rows = _rows(cfg.block_b, 6)
    B = rows["seed"].shape[0]
    h, w = _operands(B, 14)
    g = torch.Generator().manual_seed(3)
    words = (V + 31) // 32
    mask = torch.randint(-2**31, 2**31 - 1, (B, words), generator=g, dtype=torch.int64).to(torch.int32)
    mask[:, :4] = -1  # (every row keeps some ids)
    bias = fsdist.SparseLogits(torch.randint(0, V, (B, 6), generator=g), torch.randn(B, 6, generator=g) * 3)
    pen = fsdist.Penalties(repetition=1.3, frequency=0.4, presence=0.2,
                           output_ids=torch.randint(0, V, (B, 10), generator=g))
    kw = dict(token_bitmask=mask.to(DEVICE),
              logit_bias=fsdist.SparseLogits(bias.ids.to(DEVICE), bias.values.to(DEVICE)),
              penalties=pen._replace(output_ids=pen.output_ids.to(DEVICE)), return_logprobs=True, top_logprobs=2)
    out = {}
    for on in (False, True):
        monkeypatch.setattr(configs, "SKIP_FILTERED_NOISE", on)
        out[on] = _call(h, w, rows, cfg, **kw)
    _same(out[False], out[True])
    assert (out[True].tokens >= 0).sum() > B // 2


@pytest.mark.parametrize("cfg", CONFIGS, ids=_ids)
def test_scalar_filters_skip_every_tile_and_keep_the_tokens(cfg, monkeypatch):
    """A batch with one scalar top-p for every row (no row reads the noise: every tile skips) and a min-p-only call
    (which never asks for the skip: its proof from the winners reads the noise); both as without the switch."""
    B = 2 * cfg.block_b + 5
    h, w = _operands(B, 13)
    base = dict(temperature=torch.full((B,), 0.9, device=DEVICE), seed=torch.arange(B, device=DEVICE) + 100,
                offset=torch.full((B,), 9, device=DEVICE))
    seen = _spy(monkeypatch)
    for filt, asks in ((dict(top_p=0.9), True), (dict(top_k=40), True), (dict(min_p=0.05), False)):
        out = {}
        for on in (False, True):
            monkeypatch.setattr(configs, "SKIP_FILTERED_NOISE", on)
            out[on] = _call(h, w, dict(base, **filt), cfg, return_logprobs=True)
        assert seen[-2:] == [False, asks], filt
        _same(out[False], out[True])


@pytest.mark.parametrize("cfg", CONFIGS, ids=_ids)
def test_the_every_call_probe_keeps_plain_and_min_p_calls(cfg, monkeypatch):
    """configs.SKIP_NOISE_EVERY_CALL (v125's probe): plain and min-p-only calls ask for the skip too; their tiles draw
    unless every row is greedy (tile 0 here: all greedy, so it scores its logits), and every output stays as
    without it. An all-greedy call never asks (it draws no noise anyway). (The shipped plain-call rule is off here, so
    that the calls without the probe do not ask either: test_the_plain_call_rule_keeps_the_outputs tests it.)"""
    monkeypatch.setattr(configs, "SKIP_NOISE_PLAIN_WIDE_TILE", False)
    B = 2 * cfg.block_b + 5
    h, w = _operands(B, 15)
    temp = torch.full((B,), 0.8)
    temp[:cfg.block_b] = 0.0  # tile 0: greedy rows only
    temp[cfg.block_b + 3] = 0.0  # a greedy row in a drawing tile
    base = dict(temperature=temp.to(DEVICE), seed=torch.arange(B, device=DEVICE) + 7,
                offset=torch.full((B,), 2, device=DEVICE))
    seen = _spy(monkeypatch)
    # (filters, outputs, asks: a [B] temperature of zeros asks, since the host cannot know it is all greedy without a
    # sync, and then every tile skips; a scalar 0 never asks)
    for filt, extra, asks in ((dict(), dict(), True), (dict(), dict(return_logprobs=True, top_logprobs=2), True),
                              (dict(min_p=0.05), dict(return_logprobs=True), True),
                              (dict(temperature=torch.zeros(B, device=DEVICE)), dict(), True),
                              (dict(temperature=0.0), dict(), False)):
        out = {}
        for on in (False, True):
            monkeypatch.setattr(configs, "SKIP_NOISE_EVERY_CALL", on)
            out[on] = _call(h, w, dict(base, **filt), cfg, **extra)
        assert seen[-2:] == [False, asks], filt
        _same(out[False], out[True])
        assert (out[True].tokens >= 0).all()


WS128 = TileConfig(128, 128, 64, 8, 5, tma=True, ws=True)


@pytest.mark.parametrize("B", [configs.SKIP_NOISE_PLAIN_MIN_BATCH + 5, 96])
def test_the_plain_call_rule_keeps_the_outputs(B, monkeypatch):
    """The shipped rule (configs.SKIP_NOISE_PLAIN_WIDE_TILE, v125): a plain sampled call of at least
    SKIP_NOISE_PLAIN_MIN_BATCH rows on the 128-row ws tile asks for the skip; its first tile (greedy rows and rows
    whose temperature is NaN, negative or too hot: all poisoned or scoring their logit) draws no noise, the others
    draw (a greedy row among them), the last one is partial; the tokens are the same as with the rule off, eager and
    with logprobs off only (a logprob call does not ask). At B = 96 (one tile) it does not ask. On sm_90 the ws
    kernel runs it; elsewhere its Triton twin (the plan's device check stood in for)."""
    import fsdist.ops.plan as fs_plan

    monkeypatch.setattr(fs_plan, "ws_device", lambda device, dtype=None: True)
    h, w = _operands(B, 16)
    temp = torch.full((B,), 0.9)
    temp[:min(128, B // 2)] = 0.0  # (the first tile, or at B = 96 the tile's first half)
    temp[[5, 6, 7]] = torch.tensor([float("nan"), -1.0, 1e31])
    temp[B - 3] = 0.0
    kw = dict(temperature=temp.to(DEVICE), seed=torch.arange(B, device=DEVICE) * 3 + 1,
              offset=torch.full((B,), 4, device=DEVICE))
    seen = _spy(monkeypatch)
    out = {}
    for on in (False, True):
        monkeypatch.setattr(configs, "SKIP_NOISE_PLAIN_WIDE_TILE", on)
        out[on] = _call(h, w, kw, WS128)
    asks = B >= configs.SKIP_NOISE_PLAIN_MIN_BATCH
    assert seen == [False, asks]
    _same(out[False], out[True])
    t = out[True].tokens.cpu()
    assert (t[[5, 6, 7]] == -1).all() and (t[8:] >= 0).all(), t


def test_which_calls_ask_for_the_skip(monkeypatch):
    """plan.asks_noise_skip, the host's side of the rule: filtered calls with top-k / top-p possibly on ask on any
    tile; plain calls (no filter, logprobs or processors) ask only on the ws 128-row tile
    (configs.SKIP_NOISE_PLAIN_WIDE_TILE, v125); min-p-only, all-greedy and chunked calls never; the switches off:
    nothing asks but the probe's every-call switch, which needs SKIP_FILTERED_NOISE too."""
    from fsdist.ops import plan as fs_plan
    from fsdist.ops.plan import asks_noise_skip, plan_sample
    from fsdist.processing import LogitProcessing

    ws128, ws64 = WS128, TileConfig(64, 128, 64, 8, 5, tma=True, ws=True)
    tri, tri128 = TileConfig(16, 128, 32, num_stages=1), TileConfig(128, 128, 64, 8, 5, tma=True)
    Vx = 1000

    def plan(cfg, path="fused", dtype=torch.bfloat16, **kw):
        return plan_sample(batch=300, hidden_size=64, weight_rows=Vx, device=torch.device("cpu"), config=cfg,
                           path=path, dtype=dtype, **kw)

    t = torch.full((300,), 0.7)
    plain, greedy = RowParams(t, 1, 0), RowParams(0.0, 1, 0)
    topk, minp = RowParams(t, 1, 0, top_k=torch.full((300,), 5)), RowParams(t, 1, 0, min_p=0.1)
    bitmask = LogitProcessing(bitmask=torch.full((300, 32), -1, dtype=torch.int32), entries=None, values=None,
                              penalties=None, bad_rows=None)
    procd = RowParams(t, 1, 0, processing=bitmask)

    def asks(p, params, filtered=None, batch=300):
        return asks_noise_skip(p, params, batch=batch, filtered=params.filtered(Vx) if filtered is None else filtered,
                               vocab_size=Vx)

    # (a device where the ws kernel runs for bf16 / fp16, as an H100 / H200 is; fp32 runs the Triton twin: the plan
    # asks at each call, so the stand-in reaches plan.ws_kernel)
    monkeypatch.setattr(fs_plan, "ws_device", lambda device, dtype=None: dtype in (torch.bfloat16, torch.float16))

    for cfg in (ws128, ws64, tri, tri128):
        assert asks(plan(cfg, extended=True), topk), cfg
        assert asks(plan(cfg, extended=True), topk, batch=4), cfg
        assert not asks(plan(cfg, extended=True, winner_logits=True), minp), cfg
        assert asks(plan(cfg), plain) == (cfg is ws128), cfg
        assert not asks(plan(cfg), greedy)
    lo = configs.SKIP_NOISE_PLAIN_MIN_BATCH
    assert asks(plan(ws128), plain, batch=lo) and not asks(plan(ws128), plain, batch=lo - 1)
    assert not asks(plan(ws128), plain, batch=96)  # (v125: one 128-row tile, 2.2% slower with the skip)
    assert not asks(plan(ws128, dtype=torch.float32), plain)  # (its Triton twin runs: not asked)
    assert not asks(plan(ws128, logprobs=True), plain)
    assert not asks(plan(ws128, extended=True), plain)  # (top-N logprobs: an extended plain call)
    assert not asks(plan(ws128), procd)
    assert not asks(plan(tri, path="chunked", extended=True), topk)
    monkeypatch.setattr(configs, "SKIP_NOISE_PLAIN_WIDE_TILE", False)
    assert not asks(plan(ws128), plain) and asks(plan(ws128, extended=True), topk)
    monkeypatch.setattr(configs, "SKIP_NOISE_EVERY_CALL", True)
    assert asks(plan(tri), plain) and asks(plan(tri, extended=True, winner_logits=True), minp)
    assert not asks(plan(tri), greedy)
    monkeypatch.setattr(configs, "SKIP_FILTERED_NOISE", False)
    assert not asks(plan(ws128, extended=True), topk) and not asks(plan(tri), plain)


@triton.jit
def _nobody_reads(noise_scale, top_k, top_p, vocab_size):
    return noise_scale != noise_scale  # False for every row with a temperature: drops every reader's noise too


@pytest.mark.skipif(ON_GPU, reason="swapping a @triton.jit helper does not recompile a cached GPU kernel")
def test_a_rule_that_dropped_a_readers_noise_would_be_caught(monkeypatch):
    """Power: with a rule under which no row reads the noise, the tiles holding an unfiltered or min-p-only row skip
    it too, and their tokens change: the comparison above can fail."""
    cfg = CONFIGS[0]
    rows = _rows(cfg.block_b, 5)
    B = rows["seed"].shape[0]
    h, w = _operands(B, 12)
    monkeypatch.setattr(configs, "SKIP_FILTERED_NOISE", True)
    monkeypatch.setattr(configs, "SKIP_NOISE_EVERY_CALL", True)
    plain = dict(temperature=torch.full((B,), 0.8), seed=torch.arange(B) + 7, offset=torch.full((B,), 2))
    ref, ref_plain = _call(h, w, rows, cfg), _call(h, w, plain, cfg)
    monkeypatch.setattr(epilogue, "rows_draw_noise", _nobody_reads)  # (tile_draws_noise's, both kernels' rule)
    bad, bad_plain = _call(h, w, rows, cfg), _call(h, w, plain, cfg)
    changed = (ref.tokens != bad.tokens).nonzero().flatten().tolist()
    readers = {cfg.block_b * (1 + t) + r for t, (_name, offs) in enumerate(READERS) for r in offs}
    assert changed and set(changed) <= readers, changed
    # (v125's probe: a plain call's rows all read the noise, so such a rule changes many of its tokens)
    assert (ref_plain.tokens != bad_plain.tokens).sum() > B // 4


def test_the_rule_matches_select_filtereds_tests():
    """rows_draw_noise on the values at the edges of select_filtered's use_k / use_p: top-k 0 and >= the vocabulary
    are off, top-p 1.0 is off, NaN keeps the noise, a greedy or poisoned row (scale 0) never reads it."""
    @triton.jit
    def kernel(scale_ptr, k_ptr, p_ptr, out_ptr, vocab_size, N: tl.constexpr):
        i = tl.arange(0, N)
        from_rule = rows_draw_noise(tl.load(scale_ptr + i), tl.load(k_ptr + i), tl.load(p_ptr + i), vocab_size)
        tl.store(out_ptr + i, from_rule.to(tl.int32))

    cases = [  # (noise scale, top_k, top_p, reads the noise)
        (1.0, 0, 1.0, True), (1.0, 50, 1.0, False), (1.0, 100, 1.0, True), (1.0, 99, 1.0, False),
        (1.0, 0, 0.9, False), (1.0, 0, float("nan"), True), (0.0, 0, 1.0, False), (0.5, -1, 1.0, True),
        (1.0, 0, 0.0, False), (1e30, 0, 1.0, True), (1.0, 100, 0.999, False), (0.0, 5, 0.5, False),
        (1.0, 0, 1.5, True), (2.0, 2**30, 1.0, True), (1.0, 1, 1.0, False), (0.3, 0, 1.0, True)]
    s = torch.tensor([c[0] for c in cases], device=DEVICE)
    k = torch.tensor([c[1] for c in cases], dtype=torch.int32, device=DEVICE)
    p = torch.tensor([c[2] for c in cases], device=DEVICE)
    out = torch.empty(len(cases), dtype=torch.int32, device=DEVICE)
    kernel[(1,)](s, k, p, out, 100, N=len(cases))
    assert out.bool().cpu().tolist() == [c[3] for c in cases]
