"""Group-log-mass kernels against their float64 torch mirror (single process, no MPI).

The exchange buffer is filled by hand with per-rank (token, logprob, M, log S) values, as
if tp ranks had published them (M: the shard's max raw logit, S = sum exp((logit - M) / T),
so the shard's log-mass is L = M / T + log S); ``launch_group_select`` must then pick
the rank the mirror picks (Gumbel-max over the log-masses with ``gumbel_noise(seed,
offset, rank, stream=1)``; greedy rows: largest M, lowest rank on ties), and return
the global log-sum-exp and the token's global log-probability.
"""
import math

import numpy as np
import pytest
import torch
from scipy import stats

from fsdist.ops.group_select import ExchangeLayout, launch_group_publish, launch_group_select
from fsdist.ops.layout import BufferPair
from fsdist.ops.parity import DeviceParity
from fsdist.params import RowParams
from fsdist.reference import gumbel_noise
from statcheck import P_MIN

DEV = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def fill(layout, B, lp, m, logs, tok):
    """Exchange buffers holding [R, B] logprob / M / log S / token (float32 / int32)."""
    f, i = layout.alloc(DEV)
    f.fill_(float("nan"))
    i.fill_(-7)
    fv = f.view(layout.n_ranks, 3, layout.batch_cap)
    iv = i.view(layout.n_ranks, layout.batch_cap)
    fv[:, 0, :B] = lp.to(DEV)
    fv[:, 1, :B] = m.to(DEV)
    fv[:, 2, :B] = logs.to(DEV)
    iv[:, :B] = tok.to(DEV, torch.int32)
    return f, i


def mirror(lp, m, logs, tok, temperature, seed, offset):
    """float64 mirror of group_select: (tokens, logprobs, lse, margin of the rank choice)."""
    R, B = m.shape
    greedy = temperature < 1e-5
    inv_t = torch.where(greedy, 1.0, 1.0 / torch.where(greedy, 1.0, temperature)).double()
    L = m.double() * inv_t + logs.double()  # the shard's log-mass
    keys = []
    for k in range(R):
        g = gumbel_noise(seed, offset, torch.full((B,), k), stream=1)
        key = torch.where(greedy, m[k].double(), L[k] + g)
        keys.append(torch.where(m[k] > float("-inf"), key, torch.full_like(key, float("-inf"))))
    keys = torch.stack(keys)
    win = keys.argmax(0)
    poisoned = torch.isnan(m).any(0) | torch.isnan(logs).any(0)
    live = torch.where(torch.isnan(L), torch.full_like(L, float("-inf")), L)
    glse = torch.logsumexp(live, 0)
    toks = tok.gather(0, win[None]).squeeze(0).long()
    glp = (lp.double() + L).gather(0, win[None]).squeeze(0) - glse
    dead = poisoned | (keys.max(0).values == float("-inf"))
    toks = torch.where(dead, -1, toks)
    glse = torch.where(poisoned, float("nan"), glse)
    glp = torch.where(dead, float("nan"), glp)
    top2 = keys.topk(2, dim=0).values
    return toks, glp, glse, top2[0] - top2[1]


def random_values(R, B, g):
    """Plausible per-rank (logprob <= 0, M, log S >= 0, token)."""
    lp = -torch.rand(R, B, generator=g) * 4
    m = torch.randn(R, B, generator=g) * 2 + 3
    logs = torch.rand(R, B, generator=g) * 3
    tok = torch.randint(0, 100000, (R, B), generator=g)
    return lp, m, logs, tok


def test_matches_mirror_with_poison_empty_and_greedy_rows():
    R, B, cap = 5, 200, 256
    g = torch.Generator().manual_seed(1)
    lp, m, logs, tok = random_values(R, B, g)
    for field in (m, logs):
        field[4, :] = float("-inf")  # rank 4: a padding-only shard (no mass)
        field[:, 7] = float("-inf")  # row 7: no mass anywhere
        field[2, 11] = float("nan")  # row 11: rank 2 saw a NaN logit
    lp[4, :] = lp[:, 7] = lp[2, 11] = float("nan")
    tok[4, :] = tok[:, 7] = tok[2, 11] = -1
    temperature = torch.where(torch.arange(B) % 3 == 0, 0.0, 0.9)
    temperature[1::6] = 3e-6  # below the greedy threshold
    seed = torch.randint(0, 2**62, (B,), generator=g)
    offset = torch.randint(0, 2**40, (B,), generator=g)
    layout = ExchangeLayout(R, cap)
    f, i = fill(layout, B, lp, m, logs, tok)
    params = RowParams(temperature.to(DEV), seed.to(DEV), offset.to(DEV))
    tokens, glp, glse = launch_group_select(layout, BufferPair(f, i), B, params)
    ref_tok, ref_lp, ref_lse, margin = mirror(lp, m, logs, tok, temperature, seed, offset)
    decided = margin.abs() > 1e-4
    assert decided.sum() > B - 5
    assert torch.equal(tokens.cpu()[decided], ref_tok[decided])
    assert tokens[7] == -1 and tokens[11] == -1
    assert torch.isnan(glse[11]) and torch.isnan(glp[11]) and torch.isnan(glp[7])
    assert glse[7] == float("-inf")
    ok = ~torch.isnan(ref_lp) & decided
    torch.testing.assert_close(glp.cpu().double()[ok], ref_lp[ok], atol=1e-5, rtol=0)
    fin = torch.isfinite(ref_lse)
    torch.testing.assert_close(glse.cpu().double()[fin], ref_lse[fin], atol=1e-5, rtol=0)
    others = torch.ones(B, dtype=torch.bool)
    others[[7, 11]] = False
    assert (tokens.cpu()[others] >= 0).all()  # a dead shard (rank 4) does not poison rows


def test_greedy_ties_go_to_the_lowest_rank_and_scalars_work():
    R, B, cap = 4, 8, 16
    m = torch.full((R, B), 1.0)  # identical max-logit on every rank
    logs = torch.full((R, B), 1.0)
    lp = torch.full((R, B), -1.0)
    tok = torch.arange(R)[:, None].expand(R, B) * 1000
    layout = ExchangeLayout(R, cap)
    f, i = fill(layout, B, lp, m, logs, tok)
    tokens, glp, glse = launch_group_select(layout, BufferPair(f, i), B, RowParams(0.0, 5, 6))
    assert tokens.tolist() == [0] * B
    torch.testing.assert_close(glse.cpu(), torch.full((B,), 2.0 + math.log(R)))


def test_rank_choice_follows_softmax_of_log_masses():
    """K ~ softmax(L): chi-squared over 20,000 rows with the same L and distinct seeds."""
    R, B = 4, 20000
    L = torch.tensor([0.0, 1.0, -1.0, 0.5])  # log-masses at T = 0.5: M / T + log S
    T = 0.5
    m = torch.tensor([0.2, -0.3, 0.1, 0.0])[:, None].expand(R, B).contiguous()
    logs = (L[:, None] - m / T).contiguous()
    lp = torch.full((R, B), -0.5)
    tok = torch.arange(R)[:, None].expand(R, B).contiguous()
    layout = ExchangeLayout(R, B)
    f, i = fill(layout, B, lp, m, logs, tok)
    params = RowParams(T, torch.arange(B, dtype=torch.int64, device=DEV) * 7919 + 3, 11)
    tokens, _, _ = launch_group_select(layout, BufferPair(f, i), B, params)
    counts = np.bincount(tokens.cpu().numpy(), minlength=R)
    expected = torch.softmax(L.double(), 0).numpy() * B
    p = stats.chisquare(counts, expected).pvalue
    assert p > P_MIN, (counts, expected, p)


def test_publish_fans_out_through_a_peer_table():
    """The PEER_TABLE path, with three host tensors standing in for three ranks' buffers."""
    R, B, cap = 3, 10, 16
    layout = ExchangeLayout(R, cap)
    peers = [layout.alloc(DEV) for _ in range(R)]
    for f, i in peers:
        f.zero_()
        i.zero_()
    table_f = torch.tensor([f.data_ptr() for f, _ in peers], dtype=torch.int64, device=DEV)
    table_i = torch.tensor([i.data_ptr() for _, i in peers], dtype=torch.int64, device=DEV)
    tok = torch.arange(B, dtype=torch.int64, device=DEV) + 100
    lp = -torch.arange(B, dtype=torch.float32, device=DEV)
    st = torch.stack([torch.arange(B, dtype=torch.float32, device=DEV) * 0.5, torch.ones(B, device=DEV)])
    launch_group_publish(tok, lp, st, layout, BufferPair(table_f, table_i, npeers=R), rank=1)
    for f, i in peers:
        fv, iv = f.view(R, 3, cap), i.view(R, cap)
        assert torch.equal(iv[1, :B].long(), tok) and torch.equal(fv[1, 0, :B], lp)
        assert torch.equal(fv[1, 1, :B], st[0]) and torch.equal(fv[1, 2, :B], st[1])
        assert not iv[0].any() and not iv[2].any() and not iv[1, B:].any()  # nothing else touched
    # without a table: only the local buffer, at an offset (the parity half of a double buffer)
    f, i = ExchangeLayout(R, cap).alloc(DEV)
    f2, i2 = torch.zeros(2 * f.numel(), device=DEV), torch.zeros(2 * i.numel(), dtype=torch.int32, device=DEV)
    launch_group_publish(tok, lp, st, layout, BufferPair(f2, i2, base_f=f.numel(), base_i=i.numel()), rank=2)
    assert torch.equal(i2[i.numel():].view(R, cap)[2, :B].long(), tok)
    assert not i2[:i.numel()].any()


@pytest.mark.parametrize("counter_value", [0, 1, 6, 7])
def test_device_parity_picks_the_exchange_copy(counter_value):
    """Publish and select read the copy from a device counter (the TP head's CUDA-graph path):
    publishes land in copy counter & 1 only, and select on it equals select at the host offset."""
    R, B, cap = 3, 10, 16
    layout = ExchangeLayout(R, cap)
    g = torch.Generator().manual_seed(counter_value)
    f2 = torch.full((2 * layout.float_numel,), float("nan"), device=DEV)
    i2 = torch.full((2 * layout.int_numel,), -7, dtype=torch.int32, device=DEV)
    counter = torch.tensor([counter_value], dtype=torch.int64, device=DEV)
    parity = DeviceParity(counter, layout.float_numel, layout.int_numel)
    lp, m, logs, tok = random_values(R, B, g)
    for r in range(R):  # as the R ranks would, each into its own slot
        st = torch.stack([m[r], logs[r]]).to(DEV)
        launch_group_publish(tok[r].to(DEV), lp[r].to(DEV), st, layout, BufferPair(f2, i2, parity=parity), rank=r)
    k = counter_value & 1
    fv, iv = f2.view(2, R, 3, cap), i2.view(2, R, cap)
    assert torch.equal(iv[k, :, :B].cpu().long(), tok) and torch.equal(fv[k, :, 1, :B].cpu(), m)
    assert bool((iv[1 - k] == -7).all()) and bool(fv[1 - k].isnan().all()), "the other copy was touched"
    params = RowParams(1.0, torch.arange(B, dtype=torch.int64, device=DEV) + 5, 3)
    got = launch_group_select(layout, BufferPair(f2, i2, parity=parity), B, params)
    host = launch_group_select(layout, BufferPair(f2, i2, base_f=k * layout.float_numel, base_i=k * layout.int_numel),
                               B, params)
    want = mirror(lp, m, logs, tok, torch.ones(B), params.seed.cpu(), torch.full((B,), 3))[0]
    assert all(torch.equal(a, b) for a, b in zip(got, host))
    assert torch.equal(got[0].cpu(), want)
    assert int(counter.item()) == counter_value


def test_capacity_is_checked():
    layout = ExchangeLayout(2, 16)
    f, i = layout.alloc(DEV)
    with pytest.raises(ValueError, match="capacity"):
        launch_group_select(layout, BufferPair(f, i), 17, RowParams(1.0, 0, 0))
