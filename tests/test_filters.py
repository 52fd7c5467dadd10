"""fsdist.sample with top-k / top-p / min-p, logprob modes and top-N logprobs.

Exactness is checked three ways, on both stage-1 paths and on tile sizes that make the
kept logits prove most rows (block_v 64) or few (block_v 512, so the fallback runs):

* pathwise: every token equals the float64 mirror (the reference's kept set, fsdist's
  noise; ``filter_mirror.py``) wherever the perturbed-score margin exceeds fp32 rounding;
* in distribution: chi-squared + top-token binomial tests (``statcheck``) of 20,000 draws
  against ``fsdist.reference.filtered_distribution`` for each filter and combinations,
  with a power check that the same tests reject a 1% shift of mass;
* logprobs and top-N against ``fsdist.reference.reference_logprobs`` / ``reference_top_logprobs``.
"""
import math

import pytest
import torch

import fsdist
from filter_mirror import filtered_mirror
from fsdist import TileConfig
from fsdist.reference import filtered_distribution, reference_logprobs, reference_top_logprobs
from statcheck import assert_samples_match, chi2_gof, top_tokens_pvalue, P_MIN


def problem(B, D, V, seed=0, scale=3.0, dtype=torch.float32, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(B, D, generator=g)
    w = torch.randn(V, D, generator=g) * (scale / math.sqrt(D))
    return h.to(device, dtype), w.to(device, dtype)


def cfg(block_v, block_b=16):
    """A tile config with the given vocabulary tile (it decides how many rows the kept logits
    prove). Under the interpreter big batch tiles save Python overhead; a GPU wants small ones."""
    if torch.cuda.is_available():
        return TileConfig(min(block_b, 32), block_v, 64, num_warps=4, num_stages=2)
    return TileConfig(block_b, block_v, 32, num_stages=1)


def mixed_params(B, device, seed=3):
    """Per-row filters cycling through every combination, some rows unfiltered or greedy."""
    g = torch.Generator().manual_seed(seed)
    temp = torch.rand(B, generator=g) + 0.4
    temp[::7] = 0.0
    top_k = torch.tensor([0, 5, 50, 0, 20, 0, 1], dtype=torch.int32).repeat(B // 7 + 1)[:B]
    top_p = torch.tensor([0.9, 1.0, 0.8, 1.0, 0.95, 1.0, 1.0]).repeat(B // 7 + 1)[:B]
    min_p = torch.tensor([0.0, 0.0, 0.05, 0.1, 0.02, 0.0, 0.0]).repeat(B // 7 + 1)[:B]
    return {k: v.to(device) for k, v in dict(temperature=temp, top_k=top_k, top_p=top_p, min_p=min_p).items()}


def reference_kwargs(p, vocab_size):
    return dict(temperature=p["temperature"].cpu().double(), top_k=p["top_k"].cpu().long(),
                top_p=p["top_p"].cpu().double(), min_p=p["min_p"].cpu().double(), vocab_size=vocab_size)


# --------------------------------------------------------------------------- pathwise


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("block_v", [64, 512], ids=["proven", "fallback"])
@pytest.mark.parametrize("path", ["fused", "chunked"])
def test_tokens_match_the_float64_mirror(device, path, block_v, dtype):
    B, D, V = 35, 32, 1000
    h, w = problem(B, D, V, seed=11, dtype=dtype, device=device)
    p = mixed_params(B, device)
    seed = torch.arange(B, device=device) * 7919 + 5
    out = fsdist.sample(h, w, seed=seed, offset=9, vocab_size=V - 3, config=cfg(block_v), path=path, **p)
    ref, margin, _ = filtered_mirror(h, w, vocab_size=V - 3, seed=seed, offset=9, **p)
    decided = margin > 1e-3
    assert int(decided.sum()) >= B - 2
    assert torch.equal(out.tokens.cpu()[decided], ref[decided])
    assert out.fallback is not None and out.fallback.dtype == torch.bool
    if block_v == 512:
        assert bool(out.fallback.any()), "the fallback should have run (two 512-id tiles keep 8 logits)"


def test_fallback_is_exact_on_flat_rows(device):
    """Nearly flat logits: the nucleus spans most of the vocabulary, the kept logits cannot
    prove it, every such row falls back -- and still matches the mirror token for token."""
    B, D, V = 20, 32, 1000
    h, w = problem(B, D, V, seed=12, scale=0.05, device=device)
    seed = torch.arange(B, device=device) + 100
    out = fsdist.sample(h, w, seed=seed, offset=1, top_p=0.9, config=cfg(64))
    ref, margin, _ = filtered_mirror(h, w, seed=seed, offset=1, top_p=0.9)
    assert bool(out.fallback.all())
    decided = margin > 1e-4
    assert torch.equal(out.tokens.cpu()[decided], ref[decided])


def test_mixed_batch_unfiltered_and_greedy_rows_are_unchanged(device):
    """Rows with no filter give fsdist.sample's plain token, greedy rows the argmax, whatever
    the other rows of the batch ask for."""
    B, D, V = 21, 32, 1000
    h, w = problem(B, D, V, seed=13, device=device)
    p = mixed_params(B, device)
    seed = torch.arange(B, device=device) * 3 + 1
    out = fsdist.sample(h, w, seed=seed, offset=2, config=cfg(64), **p)
    plain = fsdist.sample(h, w, temperature=p["temperature"], seed=seed, offset=2, config=cfg(64))
    off = (p["top_k"] == 0) & (p["top_p"] == 1.0) & (p["min_p"] == 0.0)
    assert bool(off.any()) and torch.equal(out.tokens[off], plain.tokens[off])
    greedy = p["temperature"] == 0
    argmax = (h.double() @ w.double().T).argmax(-1)
    assert torch.equal(out.tokens[greedy].cpu(), argmax[greedy].cpu())


def test_same_token_whatever_tile_size_path_or_batch_position(device):
    B, D, V = 14, 32, 1000
    h, w = problem(B, D, V, seed=14, device=device)
    p = mixed_params(B, device, seed=4)
    seed = torch.arange(B, device=device) + 7
    outs = [fsdist.sample(h, w, seed=seed, offset=5, config=cfg(bv), path=path, **p).tokens
            for bv in (64, 128, 512) for path in ("fused", "chunked")]
    assert all(torch.equal(o, outs[0]) for o in outs[1:])
    perm = torch.randperm(B, generator=torch.Generator().manual_seed(1)).to(device)
    shuffled = fsdist.sample(h[perm], w, seed=seed[perm], offset=5, config=cfg(64),
                             **{k: v[perm] for k, v in p.items()}).tokens
    assert torch.equal(shuffled, outs[0][perm])


# --------------------------------------------------------------------------- distribution

N_DRAWS = 20000
CASES = {
    "top_k": dict(top_k=20),
    "top_p": dict(top_p=0.8),
    "min_p": dict(min_p=0.05),
    "top_k+top_p": dict(top_k=20, top_p=0.9),
    "min_p+top_p": dict(min_p=0.02, top_p=0.9),
    "all_three": dict(top_k=40, top_p=0.85, min_p=0.01),
}


def one_row(device, T, filters, V=1000, seed=21):
    """One hidden state whose logits have entropy ~1.5-2.5 nats at T = 0.6-0.75, and its filtered
    distribution (float64). Peaked enough that the kept logits prove it with 128-id tiles, so the
    fast path is what is measured (test_chi_squared_on_the_fallback_path covers the fallback)."""
    h1, w = problem(1, 32, V, seed=seed, scale=3.0, device=device)
    probs = filtered_distribution(h1.cpu().double() @ w.cpu().double().T, temperature=T, **filters)[0]
    return h1, w, probs


def one_row_draws(device, T, filters, V=1000, seed=21, block_v=128, n=N_DRAWS):
    h1, w, probs = one_row(device, T, filters, V, seed)
    h = h1.expand(n, -1).contiguous()
    seeds = torch.arange(n, device=device) * 1_000_003 + 17
    # Big batch tiles: under the interpreter every program costs Python overhead. The largest tile Triton allows
    # (2**20 elements: 8192 rows of 128 ids, as test_processors.py's draws); a GPU's stays at most 32 rows (cfg).
    out = fsdist.sample(h, w, temperature=T, seed=seeds, offset=4, config=cfg(block_v, block_b=(1 << 20) // block_v),
                        **filters)
    return out, probs


@pytest.mark.parametrize("case,T", [(case, (0.6, 0.75)[i % 2]) for i, case in enumerate(CASES)],
                         ids=[f"{case}-T{(0.6, 0.75)[i % 2]}" for i, case in enumerate(CASES)])
def test_chi_squared_per_filter(device, case, T):
    out, probs = one_row_draws(device, T, CASES[case])
    assert float(out.fallback.float().mean()) < 0.5, "meant to measure the fast path"
    assert bool((probs[out.tokens.cpu()] > 0).all()), "a filtered-out id was sampled"
    assert_samples_match(out.tokens, probs, label=f"{case} T={T}")


def test_chi_squared_on_the_fallback_path(device):
    """Tiles of 512 ids keep 8 logits of the 1000: top-p 0.8 at T = 1 (a nucleus of ~50 ids)
    cannot be proven, every draw is resolved by the fallback, and the draws still follow the
    filtered distribution. (Fewer draws than above under the interpreter: every row here is
    recomputed; the fallback is checked token by token in test_tokens_match_the_float64_mirror.)"""
    n = N_DRAWS if torch.cuda.is_available() else 4000
    out, probs = one_row_draws(device, 1.0, dict(top_p=0.8), block_v=512, n=n)
    assert bool(out.fallback.all())
    assert_samples_match(out.tokens, probs, label="fallback top_p=0.8")


def test_the_statistics_can_fail():
    """Power: the same checks reject draws from a distribution with 1% of its mass moved
    between two kept ids (here: keeping one id too many at the top-p boundary is the same
    size of error)."""
    _, _, probs = one_row(torch.device("cpu"), 0.75, dict(top_p=0.8))
    kept = (probs > 0).nonzero().flatten()
    shifted = probs.clone()
    a, b = kept[probs[kept].argmax()], kept[probs[kept].argmin()]
    shifted[a] -= 0.01
    shifted[b] += 0.01
    g = torch.Generator().manual_seed(5)
    draws = torch.multinomial(shifted, N_DRAWS, replacement=True, generator=g)
    p_chi2, _, _ = chi2_gof(draws, probs)
    assert min(p_chi2, top_tokens_pvalue(draws, probs)) < P_MIN


# --------------------------------------------------------------------------- logprobs


@pytest.mark.parametrize("mode", ["scaled", "raw", "processed"])
@pytest.mark.parametrize("block_v", [64, 512], ids=["proven", "fallback"])
def test_logprobs_and_top_n_match_the_reference(device, mode, block_v):
    B, D, V = 28, 32, 1000
    h, w = problem(B, D, V, seed=15, device=device)
    p = mixed_params(B, device, seed=6)
    seed = torch.arange(B, device=device) + 3
    out = fsdist.sample(h, w, seed=seed, offset=2, vocab_size=V - 3, config=cfg(block_v), return_logprobs=True,
                        top_logprobs=5, logprobs_mode=mode, **p)
    logits = h.cpu().double() @ w.cpu().double().T
    kw = reference_kwargs(p, V - 3)
    torch.testing.assert_close(out.logprobs.cpu().double(), reference_logprobs(logits, out.tokens.cpu(), mode=mode, **kw),
                               atol=2e-5, rtol=0)
    ids, vals = reference_top_logprobs(logits, 5, mode=mode, **kw)
    assert torch.equal(out.top_ids.cpu(), ids)
    got = out.top_logprobs.cpu().double()
    assert torch.equal(torch.isinf(got), torch.isinf(vals))
    fin = torch.isfinite(vals)
    torch.testing.assert_close(got[fin], vals[fin], atol=2e-5, rtol=0)


@pytest.mark.parametrize("block_v", [64, 512], ids=["proven", "fallback"])
def test_raw_top_n_without_token_logprobs(device, block_v):
    """"raw" top-N logprobs with return_logprobs=False still get the tiles' raw sums (stage 1
    writes them for raw top-N too, plan.raw_sums_needed): the values match the reference."""
    B, D, V = 12, 32, 1000
    h, w = problem(B, D, V, seed=17, device=device)
    p = mixed_params(B, device, seed=8)
    out = fsdist.sample(h, w, seed=torch.arange(B, device=device), offset=1, vocab_size=V, config=cfg(block_v),
                        top_logprobs=4, logprobs_mode="raw", **p)
    assert out.logprobs is None
    ids, vals = reference_top_logprobs(h.cpu().double() @ w.cpu().double().T, 4, mode="raw",
                                       **reference_kwargs(p, V))
    assert torch.equal(out.top_ids.cpu(), ids)
    got = out.top_logprobs.cpu().double()
    assert bool(torch.isfinite(got).all())
    torch.testing.assert_close(got, vals, atol=2e-5, rtol=0)


def test_top_n_without_filters_and_beyond_the_vocabulary(device):
    h, w = problem(3, 16, 40, seed=16, device=device)
    out = fsdist.sample(h, w, seed=1, top_logprobs=20, vocab_size=12, config=cfg(64))
    assert out.top_ids.shape == (3, 20) and out.fallback is not None
    ids, vals = reference_top_logprobs(h.cpu().double() @ w.cpu().double().T, 12, vocab_size=12)
    assert torch.equal(out.top_ids[:, :12].cpu(), ids)
    assert bool((out.top_ids[:, 12:] == -1).all()) and bool(torch.isneginf(out.top_logprobs[:, 12:]).all())


# --------------------------------------------------------------------------- off, bad values


def test_no_filter_costs_nothing_extra(device):
    h, w = problem(4, 16, 300, device=device)
    out = fsdist.sample(h, w, seed=1, top_k=0, top_p=1.0, min_p=0.0)
    assert out.fallback is None and out.top_ids is None
    same = fsdist.sample(h, w, seed=1, top_k=300)  # k >= vocabulary: off
    assert torch.equal(out.tokens, same.tokens) and same.fallback is None


@pytest.mark.parametrize("kwargs,exc,match", [
    (dict(top_p=0.0), ValueError, "top_p must be in"),
    (dict(top_p=1.5), ValueError, "top_p must be in"),
    (dict(min_p=-0.1), ValueError, "min_p must be in"),
    (dict(min_p=float("nan")), ValueError, "min_p must be in"),
    (dict(top_k=-1), ValueError, "top_k must be >= 0"),
    (dict(top_k=2.5), TypeError, "top_k must be an int"),
    (dict(top_k=torch.zeros(3, dtype=torch.int32)), ValueError, "top_k tensor must have shape"),
    (dict(top_p=torch.ones(4, dtype=torch.int32)), TypeError, "top_p tensor must be floating point"),
    (dict(min_p=torch.zeros(4, device="meta")), ValueError, "min_p is on meta"),
    (dict(top_logprobs=21), ValueError, "top_logprobs must be in"),
    (dict(logprobs_mode="logits"), ValueError, "logprobs_mode must be one of"),
], ids=["top_p-0", "top_p-1.5", "min_p-neg", "min_p-nan", "top_k-neg", "top_k-float", "top_k-shape",
        "top_p-int", "min_p-device", "top_logprobs-21", "mode"])
def test_bad_arguments_name_the_argument(device, kwargs, exc, match):
    h, w = problem(4, 16, 300, device=device)
    # tensors on the test's device, so that each case trips only its own check (the meta one
    # stays where it is: it is the device case)
    kwargs = {k: v.to(device) if isinstance(v, torch.Tensor) and v.device.type != "meta" else v
              for k, v in kwargs.items()}
    with pytest.raises(exc, match=match):
        fsdist.sample(h, w, **kwargs)


def test_bad_values_in_device_tensors_poison_only_their_rows(device):
    """No synchronisation to raise: out-of-range filter values in a tensor give that row -1
    (check=True raises instead, naming the argument and the rows)."""
    h, w = problem(4, 16, 300, device=device)
    top_p = torch.tensor([0.9, 0.0, 1.5, 0.9], device=device)
    min_p = torch.tensor([0.0, 0.0, 0.0, -1.0], device=device)
    out = fsdist.sample(h, w, seed=2, top_p=top_p, min_p=min_p, return_logprobs=True, config=cfg(64))
    assert out.tokens.tolist()[1:] == [-1, -1, -1] and int(out.tokens[0]) >= 0
    assert bool(torch.isnan(out.logprobs[1:]).all())
    with pytest.raises(ValueError, match=r"top_p must be in \(0, 1\] in every row \(bad rows: \[1, 2\]\)"):
        fsdist.sample(h, w, top_p=top_p, check=True)


def test_top_k_past_int32_is_off_and_negative_stays_bad(device):
    """An int64 top_k tensor past int32 means off (as a scalar does), not a wrapped k; a negative one
    below int32 stays a bad row (-1), whatever the narrowing to the kernels' int32 would make of it."""
    h, w = problem(4, 16, 300, device=device)
    off = fsdist.sample(h, w, seed=5, config=cfg(64)).tokens
    big = torch.tensor([2**31, 2**32 + 1, 2**62, 7], dtype=torch.int64, device=device)
    out = fsdist.sample(h, w, seed=5, top_k=big, config=cfg(64), check=True).tokens
    assert torch.equal(out[:3], off[:3]), (out, off)
    neg = torch.tensor([-2**33, 0, -2**31 - 1, 0], dtype=torch.int64, device=device)
    out = fsdist.sample(h, w, seed=5, top_k=neg, config=cfg(64)).tokens
    assert out.tolist()[0] == -1 and out.tolist()[2] == -1 and torch.equal(out[1::2], off[1::2])
    with pytest.raises(ValueError, match="top_k must be >= 0"):
        fsdist.sample(h, w, top_k=neg, check=True)


def test_greedy_is_decided_in_the_temperatures_own_dtype(device):
    """9.9999999e-6 is below 1e-5 in float64 (greedy: docs/semantics.md) although it rounds to
    float32(1e-5): a Python float or a float64 tensor of it gives the greedy row, logprobs and
    logsumexp of T = 0 (filters ignored), while float32(1e-5) itself samples."""
    h, w = problem(4, 16, 300, device=device)
    t = 9.9999999e-6
    assert t < 1e-5 and float(torch.tensor(t, dtype=torch.float32)) == float(torch.tensor(1e-5, dtype=torch.float32))
    kw = dict(seed=3, top_k=5, return_logprobs=True, config=cfg(64))
    ref = fsdist.sample(h, w, temperature=0.0, **kw)
    for temp in (t, torch.full((4,), t, dtype=torch.float64, device=device)):
        out = fsdist.sample(h, w, temperature=temp, **kw)
        assert torch.equal(out.tokens, ref.tokens), temp
        torch.testing.assert_close(out.logprobs, ref.logprobs)
        torch.testing.assert_close(out.logsumexp, ref.logsumexp)
    hot = fsdist.sample(h, w, temperature=torch.full((4,), 1e-5, device=device), **kw)
    assert not torch.allclose(hot.logsumexp, ref.logsumexp)  # sampled at T = 1e-5: logsumexp of l / T


def test_greedy_rows_ignore_bad_filter_values_whatever_the_temperature_type(device):
    """A greedy row ignores its filters, forbidden values included, both when a scalar 0 skips
    the filter kernels and when a [B] temperature tensor runs them; sampled rows still get -1."""
    h, w = problem(4, 16, 300, device=device)
    top_p = torch.tensor([5.0, 0.0, 0.9, 0.9], device=device)
    greedy = fsdist.sample(h, w, temperature=0.0, config=cfg(64)).tokens
    scalar = fsdist.sample(h, w, temperature=0.0, top_p=top_p, config=cfg(64)).tokens
    tensor = fsdist.sample(h, w, temperature=torch.zeros(4, device=device), top_p=top_p, config=cfg(64)).tokens
    assert torch.equal(scalar, greedy) and torch.equal(tensor, greedy)
    mixed = fsdist.sample(h, w, temperature=torch.tensor([0.0, 0.8, 0.8, 0.0], device=device), top_p=top_p,
                          seed=3, config=cfg(64)).tokens
    assert int(mixed[0]) == int(greedy[0]) and int(mixed[1]) == -1 and int(mixed[2]) >= 0
