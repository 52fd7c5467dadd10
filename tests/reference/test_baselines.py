"""The materialize-then-sample baselines the benchmarks time: right distribution per row.

CPU only (plain torch). Each distribution check draws N tokens per row from a batch whose
rows repeat a few logit vectors at different temperatures, then runs statcheck's
chi-squared and top-token tests against softmax(logits / T) of that row.
"""
import pytest
import torch

from fsdist.reference import (MATERIALIZED_SAMPLERS, gumbel_argmax_from_logits, matmul_gumbel_argmax,
                              matmul_multinomial, multinomial_from_logits, sample_from_logits, scale_logits)
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
