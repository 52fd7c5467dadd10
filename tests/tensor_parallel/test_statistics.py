"""Distribution tests of both reductions across ranks.

Chi-squared goodness of fit of 20,480 samples per case against float64
softmax(logits / T), one hidden state repeated with a distinct seed per row. Bins with
an expected count below 5 are pooled; the test passes when p > P_MIN = 1e-3 (seeds are
fixed, so it is deterministic). Log-probabilities and log-sum-exps must match float64
log_softmax / logsumexp within 1e-4 absolute.

V = 300 pads to 512: with 4 ranks of 128 rows, rank 3 holds only padding (a shard with
no probability mass), rank 2 is partly padding. Beyond 2 ranks one of the four cases runs,
(group_logmass, collective): the reduction whose tokens are not those of one device, whose
merge weighs the shards by their log-mass (the padding-only shard's is -inf). The candidates
reduction's tokens at 4 shards, a padding-only one included, are checked bit for bit against
fsdist.sample on one device (test_candidates_with_a_padding_only_shard_equal_one_device below;
every transport in test_layers.py), whose distribution the single-process suite tests.
"""
import pytest
import torch

import fsdist
from tp_helpers import (ALL_TRANSPORTS, P_MIN, assert_same_on_all_ranks, chi2_pvalue, grid, loaded_head, problem,
                        scaled_logits64)

N_SAMPLES = 20480


@pytest.mark.mpi(min_size=2)
@grid("reduction,transport", [("candidates", "collective"), ("group_logmass", "collective"),
                              ("candidates", "peer"), ("group_logmass", "peer")],
      lambda reduction, transport: (reduction, transport) == ("group_logmass", "collective"),
      "one chi-squared test beyond 2 ranks (group_logmass, collective); candidates tokens at 4 shards are checked "
      "bit-equal to one device (test_candidates_with_a_padding_only_shard_equal_one_device, test_layers.py) and "
      "each transport at 4 ranks in test_layers.py and test_filters_tp.py")
def test_chi_squared_and_logprobs(dist_ctx, reduction, transport):
    from tp_helpers import PEER_TRANSPORTS

    if transport == "peer":
        transport = PEER_TRANSPORTS[0]
    V, D, T = 300, 16, 0.8
    W, h1 = problem(V, D, 1, torch.bfloat16, seed=11, scale=1.5, device=dist_ctx.device)
    # block_v = 128 (not the interpreter's default 512): tiles no wider than a shard keep
    # the interpreter's work, and the test's runtime, proportional to the shard.
    head = fsdist.ShardedFlashLMHead(D, V, transport=transport, reduction=reduction, params_dtype=torch.bfloat16,
                                     device=dist_ctx.device, block_v=128, max_batch_size=N_SAMPLES)
    head.load_full_weight(W)
    h = h1.expand(N_SAMPLES, D).contiguous()
    seeds = torch.arange(N_SAMPLES, dtype=torch.int64, device=dist_ctx.device) * 1_000_003 + 12345
    out = head(h, temperature=T, seed=seeds, offset=42, return_logprobs=True)
    scaled, _ = scaled_logits64(h1, W, V, T)
    probs = torch.softmax(scaled[0], 0)
    p, dof = chi2_pvalue(out.tokens, probs)
    assert dof > 20
    assert p > P_MIN, f"chi-squared p = {p:.2e} with {dof} dof ({reduction}, {transport})"
    # Power check: the same samples clearly reject a slightly different temperature.
    wrong = torch.softmax(scaled_logits64(h1, W, V, 0.9 * T)[0][0], 0)
    p_wrong, _ = chi2_pvalue(out.tokens, wrong)
    print(f"[rank {dist_ctx.rank}] {reduction}/{transport}: p = {p:.3g} ({dof} dof), wrong-T p = {p_wrong:.3g}")
    assert p_wrong < P_MIN
    logp = torch.log_softmax(scaled[0], 0)
    torch.testing.assert_close(out.logprobs.cpu().double(), logp[out.tokens.cpu()], atol=1e-4, rtol=0)
    torch.testing.assert_close(out.logsumexp.cpu().double(),
                               torch.logsumexp(scaled[0], 0).expand(N_SAMPLES), atol=1e-4, rtol=0)
    head.close()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("transport", ALL_TRANSPORTS)
def test_candidates_with_a_padding_only_shard_equal_one_device(dist_ctx, transport):
    """The statistical test's problem (V = 300: at 4 ranks rank 3 holds only padding) on the candidates reduction:
    tokens, logprobs and log-sum-exps of many rows with distinct seeds equal fsdist.sample's on the full weight."""
    V, D, B = 300, 16, 256
    W, h1 = problem(V, D, 1, torch.bfloat16, seed=11, scale=1.5, device=dist_ctx.device)
    head = loaded_head(dist_ctx, W, transport, block_v=128, max_batch_size=B)
    h = h1.expand(B, D).contiguous()
    kw = dict(temperature=0.8, seed=torch.arange(B, dtype=torch.int64, device=dist_ctx.device) * 1_000_003 + 12345,
              offset=42, return_logprobs=True)
    out = head(h, **kw)
    head.close()
    ref = fsdist.sample(h, W, vocab_size=V, **kw)
    assert torch.equal(out.tokens, ref.tokens)
    torch.testing.assert_close(out.logprobs, ref.logprobs, atol=1e-5, rtol=0)
    torch.testing.assert_close(out.logsumexp, ref.logsumexp, atol=1e-5, rtol=0)
    assert_same_on_all_ranks(out)
