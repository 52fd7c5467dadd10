"""Logit processors (token bitmask, logit bias, penalties) on the tensor-parallel head.

Each rank reads only its vocabulary range of the bitmask and applies only the bias and
penalty ids it owns; the tokens must still be exactly those of fsdist.sample on the full
weight (TP-invariance), for both reductions, every transport, with and without filters.
A rank handed a different bitmask, bias or penalty than its peers is caught by the row
fingerprint: the row is -1 and every rank raises.
"""
import pytest
import torch

import fsdist
from fsdist.reference import bitmask_from_allowed
from tp_helpers import (ALL_TRANSPORTS, PEER_TRANSPORTS, assert_same_on_all_ranks, gather_objects, grid, loaded_head,
                        mismatch_outcomes, problem, reference_group_logmass, tp_ranges, two_ranks_only)

mpi = pytest.mark.mpi(min_size=2)
V, D, B = 1000, 16, 12
FINGERPRINT_AT_TWO_RANKS = ("the processors' and filters' row fingerprint is each rank's own hash; a row mismatch on "
                            "one rank of four is caught in test_divergence.py (seeds, offsets, temperature)")


def processors(B, V, device, seed=0):
    """A bitmask (row 0 unconstrained, row 1 allows nothing), a bias whose ids straddle every
    shard boundary at TP 2 and 4 (with a duplicate and empty slots) and per-row penalties with
    repeated output ids; the same on every rank (explicit generator)."""
    g = torch.Generator().manual_seed(seed)
    allowed = torch.rand(B, V, generator=g) < 0.5
    allowed[0] = True
    allowed[1] = False
    bias_ids = torch.randint(0, V, (B, 8), generator=g)
    bias_ids[:, :4] = torch.tensor([0, 255, 256, 511])  # shard edges of 1000 ids cut into 2 or 4 (128-aligned)
    bias_ids[:, 4] = torch.tensor([512, 767, 768, 999]).repeat(B // 4 + 1)[:B]
    bias_ids[1::2, 5] = bias_ids[1::2, 4]
    bias_ids[::3, -1] = -1
    out_ids = torch.randint(0, V, (B, 10), generator=g)
    out_ids[:, 1] = out_ids[:, 0]
    out_ids[::4, -2:] = -1
    prompt_ids = torch.randint(-1, V, (B, 20), generator=g)
    pen = fsdist.Penalties((0.7 + torch.rand(B, generator=g)).to(device), (torch.rand(B, generator=g) - 0.3).to(device),
                           (torch.rand(B, generator=g) - 0.3).to(device), out_ids.to(device), prompt_ids.to(device))
    return dict(token_bitmask=bitmask_from_allowed(allowed).to(device),
                logit_bias=fsdist.SparseLogits(bias_ids.to(device), (torch.randn(B, 8, generator=g) * 3).to(device)),
                penalties=pen)


def temperatures(B, device):
    t = torch.rand(B, generator=torch.Generator().manual_seed(9)) + 0.5
    t[2::5] = 0.0  # greedy rows apply the processors too
    return t.to(device)


@mpi
@grid("transport,filtered", [(t, f) for f in (False, True) for t in ALL_TRANSPORTS],
      lambda transport, filtered: not filtered or transport == PEER_TRANSPORTS[0],
      "beyond 2 ranks the filtered case runs with the first peer transport, the plain one with each",
      ids=lambda case: f"{case[0]}-{'filtered' if case[1] else 'plain'}")
def test_processed_head_equals_sample_on_the_full_weight(dist_ctx, transport, filtered):
    dev = dist_ctx.device
    W, h = problem(V, D, B, torch.float32, seed=61, scale=3.0, device=dev)
    head = loaded_head(dist_ctx, W, transport, max_batch_size=B)
    kw = dict(processors(B, V, dev), temperature=temperatures(B, dev), seed=torch.arange(B, device=dev) * 7 + 3,
              offset=2, return_logprobs=True)
    if filtered:
        kw.update(top_k=torch.tensor([0, 5, 50] * (B // 3), device=dev),
                  top_p=torch.tensor([0.9, 1.0, 0.7] * (B // 3), device=dev), top_logprobs=3)
    out = head(h, **kw)
    ref = fsdist.sample(h, W, vocab_size=V, **kw)
    unprocessed = fsdist.sample(h, W, vocab_size=V, **{k: v for k, v in kw.items()
                                                       if k not in ("token_bitmask", "logit_bias", "penalties")})
    # the comparison can fail: a head that dropped the processors would differ in most rows
    assert int((unprocessed.tokens != ref.tokens).sum()) >= B // 2
    ok = torch.equal(out.tokens, ref.tokens) and (not filtered or torch.equal(out.top_ids, ref.top_ids))
    lp_err = float((out.logprobs - ref.logprobs).nan_to_num(0, 0, 0).abs().max())
    head.close()
    everyone = gather_objects((ok, lp_err, out.tokens.tolist()))
    assert all(o[0] for o in everyone), everyone
    assert all(o[1] < 1e-4 for o in everyone), everyone
    assert everyone[0][2][1] == -1, "a row whose mask allows nothing returns -1"
    assert_same_on_all_ranks(out)


@mpi
@pytest.mark.parametrize("transport", ALL_TRANSPORTS)
def test_group_logmass_applies_the_processors(dist_ctx, transport):
    """The other reduction (paper Alg. I.4: each rank samples its range, ranks are drawn by
    their log-mass) on the processed logits: equal to its float64 mirror run on them."""
    dev = dist_ctx.device
    W, h = problem(V, D, B, torch.float32, seed=62, scale=3.0, device=dev)
    head = loaded_head(dist_ctx, W, transport, reduction="group_logmass")
    kw = dict(processors(B, V, dev, seed=1), temperature=temperatures(B, dev), seed=torch.arange(B, device=dev) + 11,
              offset=5)
    out = head(h, **kw)
    procs = {k: kw[k] for k in ("token_bitmask", "logit_bias", "penalties")}
    tok, _, _, margin = reference_group_logmass(h, W, V, tp_ranges(V, dist_ctx.world_size), kw["temperature"],
                                                kw["seed"], kw["offset"], processors=procs)
    decided = margin > 1e-4  # NaN for the row that allows nothing
    head.close()
    got = out.tokens.cpu()
    everyone = gather_objects((torch.equal(got[decided], tok[decided]), int(decided.sum()), int(got[1])))
    assert all(o[0] for o in everyone), everyone
    assert everyone[0][1] >= B - 3, everyone
    assert everyone[0][2] == -1, "a row whose mask allows nothing returns -1"
    assert_same_on_all_ranks(out)


@mpi
@two_ranks_only("the plan is each rank's own, the same at any group size")
@pytest.mark.parametrize("reduction", ["candidates", "group_logmass"])
def test_the_head_plans_with_its_sparse_processors(dist_ctx, reduction, monkeypatch):
    """Both reductions tell the plan whether the call applies bias / penalty entries, as fsdist.sample does
    (choose_path sends such calls past one 128-row tile to the chunked path); a bitmask alone is not sparse."""
    import fsdist.tensor_parallel.reduction as red

    seen = []
    real = red.plan_sample

    def spy(**kw):
        seen.append(kw.get("sparse_processors"))
        return real(**kw)

    monkeypatch.setattr(red, "plan_sample", spy)
    dev = dist_ctx.device
    W, h = problem(V, D, B, torch.float32, seed=63, scale=3.0, device=dev)
    head = loaded_head(dist_ctx, W, "collective", reduction=reduction)
    procs = processors(B, V, dev, seed=2)
    kw = dict(temperature=temperatures(B, dev), seed=torch.arange(B, device=dev) + 5, offset=1)
    head(h, logit_bias=procs["logit_bias"], **kw)
    head(h, penalties=procs["penalties"], **kw)
    head(h, token_bitmask=procs["token_bitmask"], **kw)
    head(h, **kw)
    head.close()
    assert seen == [True, True, False, False], seen


@mpi
def test_the_group_agrees_on_the_memory_speed(dist_ctx, monkeypatch):
    """The stage-1 path depends on the GPU's memory speed (configs.fast_memory); ranks that would answer differently
    (mixed GPU kinds, a driver that does not say) get the group's answer, fast only if every rank is, so that they
    take the same path instead of failing the step check."""
    import fsdist.tensor_parallel.layers as layers

    W, _ = problem(V, D, B, torch.float32, seed=64, scale=3.0, device=dist_ctx.device)
    answers = []
    for mine in (lambda rank: rank == 0, lambda rank: True):
        monkeypatch.setattr(layers, "fast_memory", lambda device, mine=mine: mine(dist_ctx.rank))
        head = loaded_head(dist_ctx, W, "collective")
        answers.append(head._reduction.fast_memory)
        head.close()
    everyone = gather_objects(answers)
    assert all(a == [False, True] for a in everyone), everyone


@mpi
@two_ranks_only(FINGERPRINT_AT_TWO_RANKS)
@pytest.mark.parametrize("which", ["token_bitmask", "logit_bias", "penalties"])
def test_a_rank_with_other_processors_is_caught(dist_ctx, which):
    """The last rank flips one bit / one bias value / one output id of row 3 (in a range it
    does not even own, for the bitmask: every rank hashes the whole row)."""
    dev = dist_ctx.device
    W, h = problem(V, D, 6, torch.float32, seed=63, device=dev)
    head = loaded_head(dist_ctx, W, "collective")
    kw = processors(6, V, dev, seed=2)
    if dist_ctx.rank == dist_ctx.world_size - 1:
        if which == "token_bitmask":
            kw["token_bitmask"][3, 0] ^= 1 << 5  # id 5: owned by rank 0
        elif which == "logit_bias":
            kw["logit_bias"].values[3, 0] += 0.5
        else:
            kw["penalties"].output_ids[3, 0] = (kw["penalties"].output_ids[3, 0] + 1) % V
    everyone = mismatch_outcomes(head, lambda: head(h, seed=torch.arange(6, device=dev), **kw))
    assert all(o is True for o in everyone), everyone


@mpi
@two_ranks_only(FINGERPRINT_AT_TWO_RANKS)
@pytest.mark.parametrize("which", ["top_k", "top_p_rows"])
def test_a_rank_with_other_filters_beside_processors_is_caught(dist_ctx, which):
    """With bias, penalties and a bitmask on every rank alike, the last rank asks for another top-k (a scalar) or
    another top-p in row 3 (a [B] tensor): the filters' fingerprint, which the preparation kernel folds into the
    processors' (v73), still reaches the header, so the group reports the mismatch."""
    dev = dist_ctx.device
    B = 6
    W, h = problem(V, D, B, torch.float32, seed=64, device=dev)
    head = loaded_head(dist_ctx, W, "collective")
    kw = processors(B, V, dev, seed=3)
    last = dist_ctx.rank == dist_ctx.world_size - 1
    if which == "top_k":
        kw["top_k"] = 21 if last else 20
    else:
        top_p = torch.full((B,), 0.9, device=dev)
        if last:
            top_p[3] = 0.85
        kw["top_p"] = top_p
    everyone = mismatch_outcomes(head, lambda: head(h, seed=torch.arange(B, device=dev), **kw))
    assert all(o is True for o in everyone), everyone
