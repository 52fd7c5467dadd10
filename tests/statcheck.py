"""Statistical checks shared by the test suites.

Each check returns a p-value computed with scipy; tests assert p > P_MIN. With
fixed seeds the tests are deterministic; P_MIN = 1e-3 keeps the chance that a
correct sampler fails a given check (for the seed we happened to fix) at 0.1%,
while 20,000+ samples resolve a 1% absolute shift of probability mass on a token
of probability >= 0.1 at more than 3 standard deviations.
"""
import numpy as np
import torch
from scipy import stats

P_MIN = 1e-3


def chi2_gof(tokens: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0):
    """Chi-squared goodness of fit of sampled ids against float64 probabilities.

    Categories whose expected count is below min_expected are pooled into one bin
    (and that pool is dropped if it is still too small), so the test stays valid
    for long-tailed vocabularies. Returns (p_value, statistic, degrees of freedom).
    """
    tokens = tokens.detach().cpu().long()
    probs = probs.detach().cpu().double()
    n = tokens.numel()
    if bool((tokens < 0).any()) or bool((tokens >= probs.numel()).any()):
        raise AssertionError("sampled ids out of range")
    observed = torch.bincount(tokens, minlength=probs.numel()).double()
    expected = probs * n
    big = expected >= min_expected
    obs = observed[big].tolist()
    exp = expected[big].tolist()
    tail_obs, tail_exp = observed[~big].sum().item(), expected[~big].sum().item()
    if tail_exp >= min_expected:
        obs.append(tail_obs)
        exp.append(tail_exp)
    elif tail_obs > 3 * max(tail_exp, 1.0) + 10:
        raise AssertionError(f"{tail_obs} samples fell where {tail_exp:.2f} were expected")
    obs, exp = np.array(obs), np.array(exp)
    exp = exp * obs.sum() / exp.sum()  # renormalize after dropping a tiny tail
    stat, p = stats.chisquare(obs, exp)
    return p, stat, len(obs) - 1


def pairs_independence(a: torch.Tensor, b: torch.Tensor, n_bins: int = 8):
    """Chi-squared test of independence between two draws per row.

    Ids are coarsened into n_bins quantile bins of `a` so the table is dense; reused
    noise makes the draws identical and the table diagonal.
    """
    a, b = a.cpu().long().numpy(), b.cpu().long().numpy()
    edges = np.unique(np.quantile(np.concatenate([a, b]), np.linspace(0, 1, n_bins + 1)[1:-1]))
    ia, ib = np.searchsorted(edges, a, side="right"), np.searchsorted(edges, b, side="right")
    k = len(edges) + 1
    table = np.zeros((k, k))
    np.add.at(table, (ia, ib), 1)
    table = table[table.sum(1) > 0][:, table.sum(0) > 0]
    return stats.chi2_contingency(table)[1]


def top_tokens_pvalue(tokens: torch.Tensor, probs: torch.Tensor, k: int = 10) -> float:
    """Bonferroni-corrected two-sided binomial test on each of the k likeliest ids.

    A global chi-squared spreads its power over hundreds of bins; a bias that moves
    mass between a few likely tokens shows up far more clearly here.
    """
    tokens = tokens.detach().cpu().long()
    probs = probs.detach().cpu().double()
    n = tokens.numel()
    top = probs.argsort(descending=True)[:k]
    counts = torch.bincount(tokens, minlength=probs.numel())[top]
    p = min(stats.binomtest(int(c), n, float(q)).pvalue for c, q in zip(counts, probs[top]))
    return min(1.0, p * k)


def chi2_two_sample(a: torch.Tensor, b: torch.Tensor, n_ids: int, min_count: int = 10):
    """Two-sample chi-squared test that two samplers draw ids from the same distribution.

    a, b: the ids each drew (any numbers of draws). Ids seen fewer than min_count times in
    both samples together are pooled into one bin (dropped if the pool is still below
    min_count), so no expected cell count is small. Returns (p_value, statistic, dof).
    """
    ca = torch.bincount(a.detach().cpu().long(), minlength=n_ids).double()
    cb = torch.bincount(b.detach().cpu().long(), minlength=n_ids).double()
    big = (ca + cb) >= min_count
    rows = [ca[big].tolist(), cb[big].tolist()]
    pool_a, pool_b = ca[~big].sum().item(), cb[~big].sum().item()
    if pool_a + pool_b >= min_count:
        rows[0].append(pool_a)
        rows[1].append(pool_b)
    table = np.array(rows)
    if table.shape[1] < 2:  # one id only: the samples agree trivially
        return 1.0, 0.0, 0
    stat, p, dof, _ = stats.chi2_contingency(table, correction=False)
    return p, stat, dof


def assert_samples_match(tokens: torch.Tensor, probs: torch.Tensor, label: str = ""):
    """Both checks above must pass at P_MIN."""
    p_chi2, stat, dof = chi2_gof(tokens, probs)
    p_top = top_tokens_pvalue(tokens, probs)
    assert p_chi2 > P_MIN and p_top > P_MIN, (
        f"{label}: chi2={stat:.1f} dof={dof} p={p_chi2:.2e}; top-token binomial p={p_top:.2e}")
