"""select_filtered's min-p proof from the tiles' stage-1 winners (module docstring, "Min-p from the winners").

A min-p row whose threshold lies at or below the boundary used to go to the fallback. Its
threshold is exact anyway, so the tiles' winners may finish it: the token must be exactly the
one the fallback gives, and the draws must follow the filtered distribution.

The logits here are set directly: hidden state b is the one-hot e_b and the weight is the
logits' transpose, so ``hidden @ weight.T`` (fp32) is the chosen logits to the bit, and
``fsdist.sample`` runs its real stage 1, select_filtered and fallback on them. The winners are
turned off by calling select_filtered with ``winners=False`` (every unproven row then takes the fallback).
"""
import pytest
import torch
import triton
import triton.language as tl

import fsdist
from fsdist import TileConfig
from fsdist.ops.epilogue import perturb, row_temperature
from fsdist.ops.noise import gumbel_from_bits, vocab_bits
from fsdist.ops.utils import fast_log_ok
from fsdist.reference import filtered_distribution
from select_options import force_select_options
from statcheck import assert_samples_match


def _cfg():
    if torch.cuda.is_available():
        return TileConfig(32, 128, 64, num_warps=4, num_stages=2)
    return TileConfig(64, 128, 32, num_stages=1)


def _head(logits, device):
    """(hidden, weight) whose fp32 product is ``logits`` [B, V] exactly: one-hot rows."""
    B = logits.shape[0]
    return torch.eye(B, device=device), logits.t().contiguous().to(device)


def _without_winners(monkeypatch):
    force_select_options(monkeypatch, winners=False)


def _flat_rows(B, V, seed):
    """Gaussian logits whose min-p sets (min_p 0.05 at T = 0.6-1) hold ~100 ids: tiles with five or
    more survivors are common, so the kept logits alone prove few rows."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, V, generator=g) * 1.2


def _mixed_params(B, device, seed):
    g = torch.Generator().manual_seed(seed)
    temp = torch.rand(B, generator=g) * 0.4 + 0.6
    temp[5::11] = 0.0  # greedy rows
    min_p = torch.full((B,), 0.05)
    top_p = torch.ones(B)
    top_p[3::7] = 0.95  # min-p + top-p rows: the winners may not finish them (top-p needs the mass)
    top_k = torch.zeros(B, dtype=torch.int32)
    top_k[4::9] = 400  # min-p + top-k rows: neither
    min_p[6::13] = 0.0  # unfiltered rows
    return dict(temperature=temp.to(device), min_p=min_p.to(device), top_p=top_p.to(device),
                top_k=top_k.to(device), seed=torch.arange(B, device=device) * 7919 + 3, offset=5)


@pytest.mark.parametrize("path,logprobs", [("fused", False), ("chunked", False), ("chunked", True)],
                         ids=["fused", "chunked", "chunked-logprobs"])
def test_winners_give_the_fallbacks_tokens(device, monkeypatch, path, logprobs):
    B, V = 48, 4096 - 40  # 32 tiles, the last one part padding
    logits = _flat_rows(B, V, seed=1)
    h, w = _head(logits, device)
    p = _mixed_params(B, device, seed=2)
    kw = dict(vocab_size=V - 7, config=_cfg(), path=path, return_logprobs=logprobs, **p)
    with_w = fsdist.sample(h, w, **kw)
    with monkeypatch.context() as m:
        _without_winners(m)
        without = fsdist.sample(h, w, **kw)
    assert torch.equal(with_w.tokens, without.tokens)
    assert bool((with_w.tokens >= 0).all())
    assert not bool((with_w.fallback & ~without.fallback).any()), "the winners must only remove fallbacks"
    minp_only = (p["min_p"] > 0) & (p["top_p"] == 1.0) & (p["top_k"] == 0) & (p["temperature"] > 0)
    finished = without.fallback & ~with_w.fallback
    assert int(without.fallback[minp_only].sum()) >= 15, "meant to have many min-p rows U cannot prove"
    assert int(finished.sum()) >= 10, "the winners should finish most of them"
    assert not bool(finished[~minp_only].any()), "only min-p-only rows may be finished by the winners"
    if logprobs:
        torch.testing.assert_close(with_w.logprobs, without.logprobs, rtol=0, atol=1e-6)


def test_rows_whose_top_n_the_kept_logits_cannot_prove_still_fall_back(device, monkeypatch):
    """With top-N logprobs ("scaled"), a min-p row whose token the winners prove but whose N largest
    logits U cannot prove must still go to the fallback (which redoes both): the same tokens, top ids
    and top logprobs as with the winners off, on rows where exactly that happens."""
    B, V = 48, 4096 - 40
    logits = _flat_rows(B, V, seed=1)
    logits[::2, 384:424] += 2.5  # half the rows: their largest logits crowd tile 3 (top-N unproven)
    h, w = _head(logits, device)
    p = _mixed_params(B, device, seed=2)
    kw = dict(vocab_size=V - 7, config=_cfg(), path="fused", return_logprobs=True, **p)
    token_only = fsdist.sample(h, w, **kw)
    with_w = fsdist.sample(h, w, top_logprobs=20, **kw)
    with monkeypatch.context() as m:
        _without_winners(m)
        without = fsdist.sample(h, w, top_logprobs=20, **kw)
        before = fsdist.sample(h, w, **kw)
    won_token = before.fallback & ~token_only.fallback  # the winners prove these rows' tokens
    assert int((won_token & with_w.fallback).sum()) >= 3, "meant to have won tokens with an unproven top-N"
    assert torch.equal(with_w.tokens, without.tokens)
    assert torch.equal(with_w.top_ids, without.top_ids)
    torch.testing.assert_close(with_w.top_logprobs, without.top_logprobs, rtol=0, atol=1e-6)
    torch.testing.assert_close(with_w.logprobs, without.logprobs, rtol=0, atol=1e-6)


def test_stage1_winner_scores_are_the_noise_select_recomputes(device):
    """The proof compares stage 1's tile scores (field 0) with scores select_filtered recomputes for U's
    survivors, so the two must be the same bits: for every (row, tile), field 0 must equal
    ``perturb(field 1, T, Gumbel(seed, offset, winner id))`` computed by the same helpers select
    uses, on each stage-1 path (on an sm_90 GPU the fused call at B = 64 runs the warp-specialised
    kernel). Rows with a [B] temperature, one greedy."""
    from fsdist.ops.layout import BufferPair
    from fsdist.ops.plan import launch_stage1, plan_sample
    from fsdist.params import RowParams

    B, V = 64, 2048 - 5
    g = torch.Generator().manual_seed(4)
    h = torch.randn(B, 64, generator=g).to(device, torch.bfloat16)
    w = (torch.randn(V, 64, generator=g) * 0.3).to(device, torch.bfloat16)
    temp = torch.rand(B, generator=g) * 1.5 + 0.2
    temp[7] = 0.0
    params = RowParams(temp.to(device), torch.arange(B, device=device) * 5 + 1, torch.full((B,), 9, device=device),
                       min_p=0.05)
    for path in ("fused", "chunked"):
        plan = plan_sample(batch=B, hidden_size=64, weight_rows=V, device=device, path=path, extended=True,
                           dtype=h.dtype, raw_sums=False, winner_logits=True)
        bufs = BufferPair.alloc(plan.layout, device)
        launch_stage1(plan, h, w, params, bufs, vocab_size=V)
        n = plan.layout.n_local
        f = bufs.f.view(plan.layout.n_fields, n, B)
        ids = bufs.i.view(-1)[: n * B].view(n, B)
        got = torch.empty(n, B, dtype=torch.float32, device=device)
        _rescore[(1,)](f[1], ids, params.temperature, params.seed, params.offset, got, n * B, B,
                       BLOCK=triton.next_power_of_2(n * B), FAST_LOG=fast_log_ok(h.device))
        live = f[0] > float("-inf")
        assert bool(live.all())
        assert torch.equal(got[live], f[0][live]), f"{path}: {int((got != f[0]).sum())} scores differ"


@triton.jit
def _rescore(logit_ptr, id_ptr, temp_ptr, seed_ptr, offset_ptr, out_ptr, N, B, BLOCK: tl.constexpr,
             FAST_LOG: tl.constexpr):
    k = tl.arange(0, BLOCK)
    m = k < N
    row = k % B
    temp = tl.load(temp_ptr + row, mask=m, other=1.0)
    _inv_t, noise_scale, _greedy, _bad = row_temperature(temp)
    bits = vocab_bits(tl.load(seed_ptr + row, mask=m, other=0), tl.load(offset_ptr + row, mask=m, other=0),
                      tl.load(id_ptr + k, mask=m, other=0))
    score = perturb(tl.load(logit_ptr + k, mask=m, other=0.0), noise_scale, gumbel_from_bits(bits, FAST_LOG), FAST_LOG)
    tl.store(out_ptr + k, score, mask=m)


def _one_hot_tile_rows(B, V):
    """Rows whose survivors (min_p 0.5 at T = 1: logits >= -ln 2) all lie in tile 0, ten of them at
    0, beside 118 non-survivors just below the threshold that often win the tile: a proof that
    ignored such a tile's bound would miss the survivors U does not keep."""
    logits = torch.full((B, V), -12.0)
    logits[:, :128] = -0.8
    logits[:, torch.arange(10) * 12] = 0.0
    return logits


def test_a_proof_without_the_bound_would_be_caught(device, monkeypatch):
    """Power: with the open tiles' bound dropped (winners_unchecked), tokens differ from the
    fallback's on these rows; with it, they are equal."""
    B, V = 64, 1024
    logits = _one_hot_tile_rows(B, V)
    h, w = _head(logits, device)
    kw = dict(temperature=1.0, min_p=0.5, seed=torch.arange(B, device=device) + 40, offset=1, config=_cfg())
    with monkeypatch.context() as m:
        _without_winners(m)
        exact = fsdist.sample(h, w, **kw)
    checked = fsdist.sample(h, w, **kw)
    assert torch.equal(checked.tokens, exact.tokens)
    force_select_options(monkeypatch, winners_unchecked=True)
    wrong = fsdist.sample(h, w, **kw)
    assert int((wrong.tokens != exact.tokens).sum()) >= 5


def test_chi_squared_on_the_winner_path(device, monkeypatch):
    """One row whose min-p set (~50 ids, five or more in most tiles) the kept logits never prove:
    20,000 draws, nearly all finished by the winners, follow the filtered distribution."""
    V, n = 1024, 20000
    g = torch.Generator().manual_seed(9)
    row = torch.full((V,), -9.0) + torch.randn(V, generator=g) * 0.5
    top = torch.randperm(V, generator=g)[:56]
    row[top] = torch.randn(56, generator=g) * 0.6  # ~7 per tile near the top
    T, min_p = 0.8, 0.1
    probs = filtered_distribution(row[None].double(), temperature=T, min_p=min_p)[0]
    h = torch.zeros(n, 1, device=device)
    h[:, 0] = 1.0
    w = row[:, None].contiguous().to(device)
    cfg = _cfg() if torch.cuda.is_available() else TileConfig(8192, 128, 16, num_stages=1)
    seeds = torch.arange(n, device=device) * 1_000_003 + 29
    kw = dict(temperature=T, min_p=min_p, offset=2, config=cfg)
    with monkeypatch.context() as m:
        _without_winners(m)
        assert bool(fsdist.sample(h[:64], w, seed=seeds[:64], **kw).fallback.all()), "U alone should prove none"
    out = fsdist.sample(h, w, seed=seeds, **kw)
    assert float(out.fallback.float().mean()) < 0.2, "meant to measure the winner path"
    assert bool((probs[out.tokens.cpu()] > 0).all()), "a filtered-out id was sampled"
    assert_samples_match(out.tokens, probs, label=f"min_p={min_p} T={T}, winners")
