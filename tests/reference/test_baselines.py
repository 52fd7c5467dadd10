"""The materialize-then-sample baselines the benchmarks time: right distribution per row.

CPU only (plain torch). Each distribution check draws N tokens per row from a batch whose
rows repeat a few logit vectors at different temperatures, then runs statcheck's
chi-squared and top-token tests against softmax(logits / T) of that row, or, for the
filtered samplers (top-k / top-p, min-p), against ``fsdist.reference.filtered_distribution``
(float64); power checks show the same samples fail when a filter is ignored.
"""
import pytest
import torch

from fsdist.reference import (FILTERED_SAMPLERS, MATERIALIZED_SAMPLERS, compiled_sampler, filtered_distribution,
                              gumbel_argmax_from_logits, materialize_logits, matmul_gumbel_argmax, matmul_min_p,
                              matmul_multinomial, matmul_top_k_top_p, matmul_top_k_top_p_eager_scan,
                              min_p_from_logits, multinomial_from_logits, sample_from_logits,
                              scale_logits, top_k_top_p_filter, top_k_top_p_from_logits)
from statcheck import P_MIN, assert_samples_match, chi2_gof

N = 20_000  # draws per row
V = 60
TEMPS = [0.5, 1.0, 2.0]


def _logits(rows: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, V, generator=g, dtype=torch.float64) * 2.0


def _draw(which: str, logits: torch.Tensor, temperature, seed: int, **kw) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if which == "multinomial":
        return multinomial_from_logits(logits, temperature, generator=g, **kw)
    return gumbel_argmax_from_logits(logits, temperature, generator=g)


def _per_row_batch():
    """N copies of each of len(TEMPS) logit rows, with that row's temperature as a [B] tensor."""
    base = _logits(len(TEMPS))
    logits = base.repeat_interleave(N, dim=0).float()
    temps = torch.tensor(TEMPS, dtype=torch.float32).repeat_interleave(N)
    return base, logits, temps


@pytest.mark.parametrize("which", ["multinomial", "gumbel"])
@pytest.mark.parametrize("has_greedy", [None, False])
def test_per_row_temperatures_follow_softmax(which, has_greedy):
    base, logits, temps = _per_row_batch()
    kw = {"has_greedy": has_greedy} if which == "multinomial" else {}
    tokens = _draw(which, logits, temps, seed=1, **kw)
    assert tokens.dtype == torch.int64 and tokens.shape == (len(TEMPS) * N,)
    for r, T in enumerate(TEMPS):
        got = tokens[r * N:(r + 1) * N]
        assert_samples_match(got, torch.softmax(base[r] / T, dim=-1), f"{which} row {r} T={T}")


@pytest.mark.parametrize("which", ["multinomial", "gumbel"])
def test_scalar_temperature_follows_softmax(which):
    base = _logits(1, seed=5)
    T = 0.7
    tokens = _draw(which, base.float().expand(N, -1), T, seed=2)
    assert_samples_match(tokens, torch.softmax(base[0] / T, dim=-1), f"{which} T={T}")


@pytest.mark.parametrize("which", ["multinomial", "gumbel"])
def test_check_fails_when_temperature_is_ignored(which):
    """Power: the rows at T = 0.5 and 2 must fail a check against softmax(logits) at T = 1."""
    base, logits, temps = _per_row_batch()
    tokens = _draw(which, logits, temps, seed=3)
    for r, T in enumerate(TEMPS):
        if T == 1.0:
            continue
        p, stat, dof = chi2_gof(tokens[r * N:(r + 1) * N], torch.softmax(base[r], dim=-1))
        assert p < P_MIN, f"{which} row {r} (T={T}) is indistinguishable from T=1: chi2={stat:.1f} p={p:.2e}"


@pytest.mark.parametrize("which", ["multinomial", "gumbel"])
def test_greedy_rows_take_the_argmax(which):
    logits = _logits(64, seed=7).float()
    temps = torch.rand(64, generator=torch.Generator().manual_seed(8)) + 0.5
    temps[::4] = 0.0
    temps[1::8] = 5e-6  # below the greedy epsilon (1e-5) too
    greedy = temps < 1e-5
    for trial in range(5):
        tokens = _draw(which, logits, temps, seed=trial)
        assert torch.equal(tokens[greedy], logits.argmax(-1)[greedy])
    assert torch.equal(_draw(which, logits, 0.0, seed=0), logits.argmax(-1))
    # the sampled rows are not all argmax (the noise is there)
    many = _draw(which, logits.repeat(50, 1), temps.repeat(50), seed=9)
    assert bool((many.view(50, 64)[:, ~greedy] != logits.argmax(-1)[~greedy]).any())


def test_sample_from_logits_hands_scaled_logits_to_draw():
    logits = _logits(4, seed=11).to(torch.bfloat16)
    temps = torch.tensor([0.5, 0.0, 2.0, 1.0])
    seen = {}

    def draw(scaled):
        seen["scaled"] = scaled
        return torch.zeros(scaled.shape[0], dtype=torch.int64)

    tokens = sample_from_logits(logits, temps, draw, dtype=None)
    assert seen["scaled"].dtype == torch.bfloat16  # dtype=None keeps the logits' dtype
    want, greedy = scale_logits(logits, temps)
    assert torch.equal(seen["scaled"], want) and greedy.tolist() == [False, True, False, False]
    assert tokens.tolist() == [0, int(logits[1].float().argmax()), 0, 0]
    sample_from_logits(logits, temps, draw)
    assert seen["scaled"].dtype == torch.float32
    assert torch.allclose(seen["scaled"][2], logits[2].float() / 2.0)


@pytest.mark.parametrize("weight_dtype", [torch.bfloat16, torch.float64])
def test_materialize_logits_converts_the_weight_in_blocks(monkeypatch, weight_dtype):
    """A block of 7 vocabulary rows at a time (the last one ragged: 30 = 4 x 7 + 2) gives the whole product; the
    products of bf16 values and their 16-term sums are exact in float64, so any order of the sums gives the same
    bits."""
    from fsdist.reference import baselines

    g = torch.Generator().manual_seed(3)
    h = torch.randn(5, 16, generator=g).to(torch.bfloat16)
    w = torch.randn(30, 16, generator=g).to(weight_dtype)
    monkeypatch.setattr(baselines, "MATERIALIZE_BLOCK_BYTES", 7 * 16 * 8)
    want = h.double() @ w.double().T
    assert torch.equal(materialize_logits(h, w), want)
    masked = materialize_logits(h, w, vocab_size=26)
    assert torch.equal(masked[:, :26], want[:, :26]) and bool((masked[:, 26:] == float("-inf")).all())
    assert materialize_logits(h, w, dtype=torch.float32).dtype == torch.float32


def test_reference_gumbel_in_blocks_is_the_one_pass_argmax(monkeypatch):
    """Blocks of 7 vocabulary ids (30 = 4 x 7 + 2, the mask from id 26 inside the fourth block) give the one-pass
    argmax and margin bit for bit (exact float64 logits, as above); row 2's best logit is on a masked id. Row 1 is
    greedy and its best logit is on ids 3 and 17, equal rows of the weight in different blocks: the lower id wins, as
    argmax has it."""
    from fsdist.reference import baselines
    from fsdist.reference.noise import vocab_gumbel

    g = torch.Generator().manual_seed(5)
    w = torch.randn(30, 16, generator=g)
    w[3] *= 3
    w[17] = w[3]
    w[28] *= 3
    w = w.to(torch.bfloat16)
    h = torch.randn(5, 16, generator=g).to(torch.bfloat16)
    h[1], h[2] = w[3], w[28]  # row 2's best logit is on a masked id
    temps = torch.tensor([0.7, 0.0, 1.3, 1.0, 0.0])
    seeds, offsets = torch.arange(5) + 40, torch.arange(5) * 3
    scaled, greedy = scale_logits(materialize_logits(h, w, 26), temps)
    score = torch.where(greedy[:, None], scaled, scaled + vocab_gumbel(seeds[:, None], offsets[:, None],
                                                                       torch.arange(30)[None, :]))
    top2 = score.topk(2, dim=-1).values
    monkeypatch.setattr(baselines, "REFERENCE_BLOCK_BYTES", 8 * 5 * 7)
    tokens, margin = baselines.reference_gumbel(h, w, temperature=temps, seed=seeds, offset=offsets, vocab_size=26)
    assert tokens[1] == 3 and score.argmax(-1)[1] == 3 and margin[1] == 0
    assert (h[2].double() @ w.double().T).argmax() == 28 and tokens[2] < 26
    assert torch.equal(tokens, score.argmax(-1)) and torch.equal(margin, top2[:, 0] - top2[:, 1])


@pytest.mark.parametrize("name", sorted(MATERIALIZED_SAMPLERS))
def test_matmul_samplers(name):
    g = torch.Generator().manual_seed(12)
    hidden_row = torch.randn(1, 16, generator=g)
    weight = torch.randn(V, 16, generator=g) * 0.5
    T = torch.full((N,), 0.8)
    torch.manual_seed(13)  # the eager samplers draw from torch's default generator
    tokens = MATERIALIZED_SAMPLERS[name](hidden_row.expand(N, -1), weight, T, has_greedy=False)
    logits = hidden_row.double() @ weight.double().T
    assert_samples_match(tokens, torch.softmax(logits[0] / 0.8, dim=-1), name)
    assert MATERIALIZED_SAMPLERS[name] in (matmul_multinomial, matmul_gumbel_argmax)


# --------------------------------------------------------------------------- filtered baselines
# Rows of (temperature, top_k, top_p): each one's filters remove part of the distribution
# (asserted below, so the power checks are meaningful); V = 60 random logits, no ties.
TOPK_TOPP_ROWS = [(0.7, 10, 0.8), (1.0, 0, 0.9), (1.5, 20, 1.0), (0.5, 5, 0.95), (1.2, 30, 0.7)]
MINP_ROWS = [(1.0, 0.05), (0.7, 0.1), (1.5, 0.02), (2.0, 0.2)]


def _filtered_batch(rows, seed):
    """N copies of one logit row per parameter tuple, with [B] tensors for every parameter."""
    base = _logits(len(rows), seed=seed)
    logits = base.repeat_interleave(N, dim=0).float()
    cols = list(zip(*rows))
    return base, logits, [torch.tensor(c).repeat_interleave(N) for c in cols]


def _reference(base_row, **params):
    return filtered_distribution(base_row[None, :], **params)[0]


def test_top_k_top_p_sampler_follows_filtered_distribution():
    base, logits, (temps, ks, ps) = _filtered_batch(TOPK_TOPP_ROWS, seed=21)
    temps, ks, ps = temps.float(), ks.to(torch.int32), ps.float()
    tokens = top_k_top_p_from_logits(logits, temps, ks, ps, has_greedy=False,
                                     generator=torch.Generator().manual_seed(22))
    assert tokens.dtype == torch.int64 and tokens.shape == (len(TOPK_TOPP_ROWS) * N,)
    for r, (T, k, p) in enumerate(TOPK_TOPP_ROWS):
        got = tokens[r * N:(r + 1) * N]
        want = _reference(base[r], temperature=T, top_k=k, top_p=p)
        assert bool((want[got] > 0).all()), f"row {r}: a sampled id lies outside the kept set"
        assert_samples_match(got, want, f"top-k/top-p row {r} T={T} k={k} p={p}")


def test_top_k_top_p_check_fails_when_top_p_is_ignored():
    """Power: against the distribution with top-p off (top-k alone), the rows where top-p
    removes ids must fail the chi-squared check."""
    base, logits, (temps, ks, ps) = _filtered_batch(TOPK_TOPP_ROWS, seed=21)
    tokens = top_k_top_p_from_logits(logits, temps.float(), ks, ps.float(),
                                     generator=torch.Generator().manual_seed(23))
    checked = 0
    for r, (T, k, p) in enumerate(TOPK_TOPP_ROWS):
        if p >= 1.0:
            continue
        with_p = _reference(base[r], temperature=T, top_k=k, top_p=p)
        without_p = _reference(base[r], temperature=T, top_k=k)
        assert int((with_p > 0).sum()) < int((without_p > 0).sum()), f"row {r}: top-p removes nothing"
        pv, stat, dof = chi2_gof(tokens[r * N:(r + 1) * N], without_p)
        assert pv < P_MIN, f"row {r} (top_p={p}) is indistinguishable from top-p off: chi2={stat:.1f} p={pv:.2e}"
        checked += 1
    assert checked >= 3


def test_top_k_alone_and_off_values():
    """Scalar filters; top_k = 0 and top_p = 1 are off (plain softmax); top_k >= V is off."""
    base = _logits(1, seed=31)
    for k, p in ((7, 1.0), (0, 1.0), (V, 1.0), (2 * V, 1.0)):
        tokens = top_k_top_p_from_logits(base.float().expand(N, -1), 0.9, k, p,
                                         generator=torch.Generator().manual_seed(32 + k))
        want = _reference(base[0], temperature=0.9, top_k=k, top_p=p)
        if k in (0, V, 2 * V):
            assert torch.allclose(want, torch.softmax(base[0] / 0.9, dim=-1))
        assert_samples_match(tokens, want, f"top_k={k} top_p={p}")


def test_top_k_keeps_ties_at_the_kth_value():
    logits = torch.tensor([[3.0, 1.0, 2.0, 2.0, 0.0, 2.0]])
    out = top_k_top_p_filter(logits, torch.tensor([2]), torch.tensor([1.0]))
    assert torch.isfinite(out[0]).tolist() == [True, False, True, True, False, True]
    assert torch.equal(out[0, [0, 2, 3, 5]], logits[0, [0, 2, 3, 5]])


def test_min_p_sampler_follows_filtered_distribution():
    base, logits, (temps, mps) = _filtered_batch(MINP_ROWS, seed=41)
    tokens = min_p_from_logits(logits, temps.float(), mps.float(), has_greedy=False,
                               generator=torch.Generator().manual_seed(42))
    for r, (T, mp) in enumerate(MINP_ROWS):
        got = tokens[r * N:(r + 1) * N]
        want = _reference(base[r], temperature=T, min_p=mp)
        assert bool((want[got] > 0).all()), f"row {r}: a sampled id lies outside the kept set"
        assert_samples_match(got, want, f"min-p row {r} T={T} min_p={mp}")


def test_min_p_check_fails_when_min_p_is_ignored():
    base, logits, (temps, mps) = _filtered_batch(MINP_ROWS, seed=41)
    tokens = min_p_from_logits(logits, temps.float(), mps.float(), generator=torch.Generator().manual_seed(43))
    for r, (T, mp) in enumerate(MINP_ROWS):
        without = _reference(base[r], temperature=T)
        assert int((_reference(base[r], temperature=T, min_p=mp) > 0).sum()) < V, f"row {r}: min-p removes nothing"
        pv, stat, dof = chi2_gof(tokens[r * N:(r + 1) * N], without)
        assert pv < P_MIN, f"row {r} (min_p={mp}) is indistinguishable from min-p off: chi2={stat:.1f} p={pv:.2e}"


@pytest.mark.parametrize("which", ["top_k_top_p", "min_p"])
def test_filtered_greedy_rows_take_the_argmax(which):
    logits = _logits(64, seed=51).float()
    temps = torch.rand(64, generator=torch.Generator().manual_seed(52)) + 0.5
    temps[::4] = 0.0
    greedy = temps < 1e-5
    for trial in range(3):
        g = torch.Generator().manual_seed(trial)
        if which == "top_k_top_p":
            tokens = top_k_top_p_from_logits(logits, temps, torch.full((64,), 3), torch.full((64,), 0.5), generator=g)
        else:
            tokens = min_p_from_logits(logits, temps, torch.full((64,), 0.3), generator=g)
        assert torch.equal(tokens[greedy], logits.argmax(-1)[greedy])


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # importing torch.compile's machinery
@pytest.mark.parametrize("name", sorted(FILTERED_SAMPLERS))
def test_filtered_matmul_samplers(name):
    g = torch.Generator().manual_seed(61)
    hidden_row = torch.randn(1, 16, generator=g)
    weight = torch.randn(V, 16, generator=g) * 0.8
    T = torch.full((N,), 0.8)
    params = {"top_k": torch.full((N,), 12, dtype=torch.int32), "top_p": torch.full((N,), 0.85)} \
        if name.startswith("top_k_top_p") else {"min_p": torch.full((N,), 0.05)}
    torch.manual_seed(62)  # the samplers draw from torch's default generator
    tokens = FILTERED_SAMPLERS[name](hidden_row.expand(N, -1), weight, T, has_greedy=False, **params)
    logits = hidden_row.double() @ weight.double().T
    want = _reference(logits[0], temperature=0.8, **{k: (v[0].item()) for k, v in params.items()})
    assert_samples_match(tokens, want, name)
    assert FILTERED_SAMPLERS[name] in (matmul_top_k_top_p, matmul_top_k_top_p_eager_scan, matmul_min_p)
    assert callable(compiled_sampler(name))  # compiles lazily, on the first call
