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

import fsdist
import fsdist.ops.select_filtered as sf
import fsdist.sampling as sampling
from fsdist import TileConfig
from fsdist.reference import filtered_distribution
from statcheck import assert_samples_match


def _cfg():
    if torch.cuda.is_available():
        return TileConfig(32, 128, 64, num_warps=4, num_stages=2)
    return TileConfig(64, 128, 32, num_stages=1)


def _head(logits, device):
    """(hidden, weight) whose fp32 product is ``logits`` [B, V] exactly: one-hot rows."""
    B = logits.shape[0]
    return torch.eye(B, device=device), logits.t().contiguous().to(device)


def _select_with(monkeypatch, **forced):
    """fsdist.sample with select_filtered's winner options forced (``winners=False``: every row U
    cannot prove takes the fallback)."""
    real = sf.launch_select_filtered
    monkeypatch.setattr(sampling, "launch_select_filtered", lambda *a, **k: real(*a, **{**k, **forced}))


def _without_winners(monkeypatch):
    _select_with(monkeypatch, winners=False)


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


@pytest.mark.parametrize("path,logprobs", [("fused", False), ("chunked", True)], ids=["fused", "chunked-logprobs"])
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
    _select_with(monkeypatch, winners_unchecked=True)
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
    cfg = _cfg() if torch.cuda.is_available() else TileConfig(512, 128, 16, num_stages=1)
    seeds = torch.arange(n, device=device) * 1_000_003 + 29
    kw = dict(temperature=T, min_p=min_p, offset=2, config=cfg)
    with monkeypatch.context() as m:
        _without_winners(m)
        assert bool(fsdist.sample(h[:64], w, seed=seeds[:64], **kw).fallback.all()), "U alone should prove none"
    out = fsdist.sample(h, w, seed=seeds, **kw)
    assert float(out.fallback.float().mean()) < 0.2, "meant to measure the winner path"
    assert bool((probs[out.tokens.cpu()] > 0).all()), "a filtered-out id was sampled"
    assert_samples_match(out.tokens, probs, label=f"min_p={min_p} T={T}, winners")
