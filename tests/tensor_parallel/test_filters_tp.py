"""Filters, logprob modes and top-N logprobs on the tensor-parallel head (candidates reduction).

Every rank must return exactly what fsdist.sample returns on the full weight: the same
tokens (proven rows and fallback rows alike: the fallback pools the rows' logits shard by
shard through the transport), the same logprobs and top-N. Ranks that disagree on a filter
are caught by the call header's row fingerprint.
"""
import dataclasses

import pytest
import torch

import fsdist
from tp_helpers import (ALL_TRANSPORTS, PEER_TRANSPORTS, assert_same_on_all_ranks, gather_objects, grid, loaded_head,
                        mismatch_outcomes, problem, two_ranks_only)

mpi = pytest.mark.mpi(min_size=2)
V, D, B = 1000, 16, 24


def row_filters(B, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    temp = torch.rand(B, generator=g) + 0.4
    temp[::6] = 0.0
    return dict(temperature=temp.to(device),
                top_k=torch.tensor([0, 5, 40, 0, 100, 0], dtype=torch.int32).repeat(B // 6 + 1)[:B].to(device),
                top_p=torch.tensor([0.9, 1.0, 0.8, 1.0, 0.95, 0.5]).repeat(B // 6 + 1)[:B].to(device),
                min_p=torch.tensor([0.0, 0.0, 0.05, 0.1, 0.0, 0.0]).repeat(B // 6 + 1)[:B].to(device))


MODES = ["scaled", "raw", "processed"]


@mpi
@grid("transport,mode", [(t, m) for m in MODES for t in ALL_TRANSPORTS],
      lambda transport, mode: (ALL_TRANSPORTS.index(transport) + MODES.index(mode)) % 2 == 0,
      "the logprob modes do not depend on the group size: beyond 2 ranks each mode runs with one transport and each "
      "transport with a mode")
def test_filtered_head_equals_sample_on_the_full_weight(dist_ctx, transport, mode):
    dev = dist_ctx.device
    W, h = problem(V, D, B, torch.float32, seed=51, scale=3.0, device=dev)
    head = loaded_head(dist_ctx, W, transport, max_batch_size=B)
    kw = dict(row_filters(B, dev), seed=torch.arange(B, device=dev) * 13 + 1, offset=4, return_logprobs=True,
              top_logprobs=3, logprobs_mode=mode)
    out = head(h, **kw)
    ref = fsdist.sample(h, W, vocab_size=V, **kw)
    fell_back = int(out.fallback.sum())
    # Which rows fall back depends on how the vocabulary is cut (each rank's tiles keep their
    # own few best logits), so the fallback set may differ from TP=1; the tokens may not.
    ok = torch.equal(out.tokens, ref.tokens) and torch.equal(out.top_ids, ref.top_ids)
    lp_err = float((out.logprobs - ref.logprobs).abs().max())
    top_err = float((out.top_logprobs - ref.top_logprobs).nan_to_num(0, 0, 0).abs().max())
    head.close()
    everyone = gather_objects((ok, lp_err, top_err, fell_back))
    assert all(o[0] for o in everyone), everyone
    assert all(o[1] < 1e-4 and o[2] < 1e-4 for o in everyone), everyone
    assert_same_on_all_ranks(out)
    assert everyone[0][3] > 0, "a 512-id tile keeps 4 logits: some rows must have used the fallback"


@mpi
def test_group_logmass_refuses_filters_on_every_rank(dist_ctx):
    dev = dist_ctx.device
    W, h = problem(V, D, 4, torch.float32, seed=52, device=dev)
    head = loaded_head(dist_ctx, W, "collective", reduction="group_logmass")
    outcomes = []
    for kw in (dict(top_k=5), dict(top_logprobs=2), dict(return_logprobs=True, logprobs_mode="raw")):
        try:
            head(h, seed=1, **kw)
            outcomes.append("ok")
        except ValueError as e:
            outcomes.append("candidates" in str(e))
    plain = head(h, seed=1)  # the group is still in step
    head.close()
    everyone = gather_objects((outcomes, plain.tokens.tolist()))
    assert all(o[0] == [True, True, True] for o in everyone), everyone
    assert all(o[1] == everyone[0][1] for o in everyone)


@mpi
@two_ranks_only("the filters' row fingerprint is each rank's own hash; a row mismatch on one rank of four is "
                "caught in test_divergence.py (seeds, offsets, temperature)")
@pytest.mark.parametrize("transport", ALL_TRANSPORTS)
def test_a_rank_with_another_filter_is_caught(dist_ctx, transport):
    """One rank asks for top_p 0.8 in row 2 where the others ask 0.9: that row's fingerprint
    differs, the row is -1 everywhere and every rank raises."""
    dev = dist_ctx.device
    W, h = problem(V, D, 6, torch.float32, seed=53, device=dev)
    head = loaded_head(dist_ctx, W, transport)
    top_p = torch.full((6,), 0.9, device=dev)
    if dist_ctx.rank == dist_ctx.world_size - 1:
        top_p[2] = 0.8
    everyone = mismatch_outcomes(head, lambda: head(h, seed=torch.arange(6, device=dev), top_p=top_p))
    assert all(o is True for o in everyone), everyone


@mpi
@grid("transport", [(t,) for t in ALL_TRANSPORTS], lambda transport: transport == PEER_TRANSPORTS[0],
      "the winners of four shards' tiles finish the min-p rows on the peer-store transport; both transports carry "
      "4 shards' candidates in test_filtered_head_equals_sample_on_the_full_weight")
def test_min_p_rows_finished_from_the_winners_as_on_one_device(dist_ctx, transport, monkeypatch):
    """select_filtered's min-p proof from the tiles' winners on the head: flat min-p-only rows that the
    kept logits cannot prove are finished from the winners of every rank's tiles (fewer fallback rows
    than with the proof off), with fsdist.sample's tokens and logprobs on the full weight."""
    from select_options import force_select_options

    dev = dist_ctx.device
    W, h = problem(V, D, B, torch.float32, seed=52, scale=1.0, device=dev)
    head = loaded_head(dist_ctx, W, transport, max_batch_size=B)
    g = torch.Generator().manual_seed(3)
    # tokens only (the winners' logits are then written for min-p alone), and with logprobs
    kw = dict(temperature=(torch.rand(B, generator=g) * 0.5 + 0.75).to(dev), min_p=0.05,
              seed=torch.arange(B, device=dev) * 17 + 2, offset=6)
    out = head(h, **kw)
    out_lp = head(h, return_logprobs=True, **kw)
    with monkeypatch.context() as m:
        force_select_options(m, winners=False)
        before = head(h, **kw)
    head.close()
    ref = fsdist.sample(h, W, vocab_size=V, return_logprobs=True, **kw)
    ok = all(torch.equal(o.tokens, ref.tokens) for o in (out, out_lp, before))
    lp_err = float((out_lp.logprobs - ref.logprobs).abs().max())
    everyone = gather_objects((ok, lp_err, int(out.fallback.sum()), int(before.fallback.sum())))
    assert all(o[0] and o[1] < 1e-4 for o in everyone), everyone
    assert_same_on_all_ranks(out)
    n_after, n_before = everyone[0][2], everyone[0][3]
    assert n_before >= B // 2 and n_after < n_before, (n_after, n_before)


@mpi
@grid("transport", [(t,) for t in ALL_TRANSPORTS], lambda transport: False,
      "each rank's tiles decide the skip from their own rows, whatever the group's size: 2 ranks run it on every "
      "transport (CI's time; FSDIST_TEST_EVERY_CASE=1 runs it at every size)")
def test_the_noise_skip_keeps_the_heads_outputs(dist_ctx, transport, monkeypatch):
    """configs.SKIP_NOISE_TP: each rank's stage 1 asks for the skip (plan.asks_noise_skip) and a tile whose rows are
    all greedy or restricted by top-k / top-p draws no noise. The first batch tile here is such a tile, the second
    holds unfiltered and min-p-only rows (which read their tiles' winners). Every output (tokens, fallback flags,
    logprobs, top-N) is the same with and without the skip on every rank, and the tokens are fsdist.sample's on the
    full weight."""
    from fsdist.ops import configs
    from fsdist.ops import plan as fs_plan

    dev = dist_ctx.device
    n, quiet = 64, 32  # (two 32-row tiles: one quiet, one with readers)
    W, h = problem(V, D, n, torch.float32, seed=53, scale=3.0, device=dev)
    g = torch.Generator().manual_seed(4)
    temp = torch.rand(n, generator=g) + 0.4
    top_k = torch.zeros(n, dtype=torch.int32)
    top_p = torch.ones(n)
    min_p = torch.zeros(n)
    top_k[0:quiet:2] = 20
    top_p[1:quiet:2] = 0.85
    min_p[3:quiet:8] = 0.05  # (with a top-p: still restricted)
    temp[0:quiet:7] = 0.0
    top_k[quiet::3] = 10  # the second tile: restricted, unfiltered and min-p-only rows
    min_p[quiet + 1::3] = 0.1
    # (the rows as rows_draw_noise reads them: none of the first tile's reads its noise, some of the second's do)
    reads = (temp > 0) & ~(((top_k > 0) & (top_k < V)) | (top_p < 1.0))
    assert not reads[:quiet].any() and reads[quiet:].any()
    kw = dict(temperature=temp.to(dev), top_k=top_k.to(dev), top_p=top_p.to(dev), min_p=min_p.to(dev),
              seed=torch.arange(n, device=dev) * 7 + 3, offset=5, return_logprobs=True, top_logprobs=2)
    seen = []
    real = fs_plan.launch_fused

    def spy(*a, **k):
        # (32-row tiles, which divide the quiet rows: on CPU the head plans one tile over its whole capacity, which
        # would mix them with the others)
        seen.append(bool(k.get("skip_filtered_noise", False)))
        return real(*a[:3], dataclasses.replace(a[3], block_b=32), *a[4:], **k)

    monkeypatch.setattr(fs_plan, "launch_fused", spy)
    head = loaded_head(dist_ctx, W, transport, max_batch_size=n)
    outs = {}
    for on in (False, True):
        monkeypatch.setattr(configs, "SKIP_NOISE_TP", on)
        outs[on] = head(h, **kw)
    head.close()
    monkeypatch.setattr(fs_plan, "launch_fused", real)
    ref = fsdist.sample(h, W, vocab_size=V, **kw)
    a, b = outs[False], outs[True]
    same = (torch.equal(a.tokens, b.tokens) and torch.equal(a.fallback, b.fallback)
            and torch.equal(a.logprobs.nan_to_num(-1.0), b.logprobs.nan_to_num(-1.0))
            and torch.equal(a.top_ids, b.top_ids)
            and torch.equal(a.top_logprobs.nan_to_num(-1.0), b.top_logprobs.nan_to_num(-1.0)))
    everyone = gather_objects((seen, same, torch.equal(b.tokens, ref.tokens), int((b.tokens >= 0).sum())))
    assert all(o[0] == [False, True] for o in everyone), everyone
    assert all(o[1] and o[2] for o in everyone), everyone
    assert all(o[3] == n for o in everyone), everyone
    assert_same_on_all_ranks(b)
