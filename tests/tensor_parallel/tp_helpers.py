"""Shared helpers for the tensor-parallel tests: problems, oracles, statistics, rank checks."""

import numpy as np
import pytest
import torch
import torch.distributed as dist
from scipy import stats

from fsdist.reference import gumbel_noise, materialize_logits, process_logits, vocab_gumbel

# Statistical threshold of every goodness-of-fit test here. Seeds are fixed, so each test is
# deterministic; a correct sampler fails a given check with probability 1e-3 over seed choices.
P_MIN = 1e-3

ON_GPU = torch.cuda.is_available()


def _peer_transports():
    """Transports whose kernels store straight into peers' buffers, on this platform."""
    if not ON_GPU:
        return ["shm"]
    from fsdist.nvshmem_runtime import importable as nvshmem_importable

    return (["nvshmem"] if nvshmem_importable() else []) + ["symm_mem"]


PEER_TRANSPORTS = _peer_transports()
ALL_TRANSPORTS = ["collective"] + PEER_TRANSPORTS

def two_ranks_only(why: str):
    """Mark a test (or one case of a grid) that a multi-rank session runs at 2 ranks only: ``why`` says where the
    larger group's part of it is covered (the skip reason beyond 2 ranks). CI runs the suite at 2 and 4 ranks on
    two cores, where a 4-rank case costs ~2x its 2-rank run: 4 ranks run only what depends on the group size.
    FSDIST_TEST_EVERY_CASE=1 runs everything at every size (tests/conftest.py, the world_sizes marker)."""
    return pytest.mark.world_sizes(2, why=why)


def grid(argnames: str, cases, keep_beyond_two, why: str, ids=None):
    """pytest.mark.parametrize over ``cases`` (tuples of argnames' values), where each case for which
    ``keep_beyond_two(*case)`` is false runs at 2 ranks only (two_ranks_only(why)): for grids whose axes do not
    depend on the group size, 2 ranks take every case and larger groups a subset chosen so that it still has each
    value of each axis. ``ids(case)`` names a case ('-'.join of its values by default)."""
    params = [pytest.param(*case, id=ids(case) if ids else "-".join(str(v) for v in case),
                           marks=() if keep_beyond_two(*case) else (two_ranks_only(why),)) for case in cases]
    return pytest.mark.parametrize(argnames, params)


def problem(V: int, D: int, B: int, dtype=torch.float32, seed: int = 0, scale: float = 1.0, device="cpu"):
    """(W [V, D], hidden [B, D]): the same on every rank (explicit generator)."""
    g = torch.Generator().manual_seed(seed)
    W = torch.randn(V, D, generator=g)
    h = torch.randn(B, D, generator=g) * (scale / D ** 0.5)
    return W.to(device=device, dtype=dtype), h.to(device=device, dtype=dtype)


def loaded_head(dist_ctx, W, transport="collective", **kw):
    """A ShardedFlashLMHead on this rank's device holding its shard of the full weight W [V, D]
    (fp32 unless params_dtype says otherwise); kw go to the constructor."""
    import fsdist

    kw.setdefault("params_dtype", W.dtype)
    head = fsdist.ShardedFlashLMHead(W.shape[1], W.shape[0], transport=transport, device=dist_ctx.device, **kw)
    head.load_full_weight(W)
    return head


def mismatch_outcomes(head, call, phrase="per-row parameters"):
    """Run ``call`` (a forward of ``head`` that some rank made differently), then head.check()
    (on a GPU the forward raises a call or two later); close the head. Every rank's outcome:
    True if it raised TensorParallelMismatchError naming ``phrase``, else what happened."""
    from fsdist.tensor_parallel import TensorParallelMismatchError

    try:
        call()
        head.check()
        outcome = "no error"
    except TensorParallelMismatchError as e:
        outcome = phrase in str(e)
    head.close()
    return gather_objects(outcome)


def scaled_logits64(hidden, W, V, temperature, processors=None):
    """float64 logits / T (T = 1 for greedy rows), ids >= V at -inf; and the greedy mask.
    ``processors``: an optional dict of token_bitmask / logit_bias / penalties, applied to
    the raw logits first (vLLM's order), as fsdist.reference.process_logits does."""
    logits = materialize_logits(hidden.cpu(), W.cpu(), V)
    if processors:
        logits = _processed(logits, V, processors)
    B = logits.shape[0]
    t = temperature if isinstance(temperature, torch.Tensor) else torch.full((B,), float(temperature))
    t = t.cpu().double()
    greedy = t < 1e-5  # vLLM's epsilon, as in the kernels
    return logits / torch.where(greedy, torch.ones_like(t), t)[:, None], greedy


def _processed(logits, V, processors):
    def cpu(x):
        if isinstance(x, tuple):
            return type(x)(*(cpu(v) for v in x))
        return x.cpu() if isinstance(x, torch.Tensor) else x

    processed = process_logits(logits, vocab_size=V, **{k: cpu(v) for k, v in processors.items()})
    return torch.cat([processed, logits[:, processed.shape[1]:]], dim=1)  # padding columns stay -inf


def _rows(x, B):
    return (x if isinstance(x, torch.Tensor) else torch.full((B,), x, dtype=torch.int64)).cpu()


def reference_group_logmass(hidden, W, V, tp_ranges, temperature=1.0, seed=0, offset=0, processors=None):
    """float64 torch mirror of reduction="group_logmass" (paper Alg. I.4 with fsdist's noise).

    Returns (tokens, logprobs, lse) and the smallest decision margin per row (local
    argmax gap within the winning shard and the shard-choice gap), so callers can
    skip rows whose outcome is decided by fp32 rounding.
    """
    scaled, greedy = scaled_logits64(hidden, W, V, temperature, processors)
    B, Vp = scaled.shape
    seeds, offsets = _rows(seed, B)[:, None], _rows(offset, B)[:, None]
    ids = torch.arange(Vp)[None, :]
    score = torch.where(greedy[:, None], scaled, scaled + vocab_gumbel(seeds, offsets, ids))
    keys, toks, lses, logits_at, local_margin = [], [], [], [], []
    for k, (s, e) in enumerate(tp_ranges):
        blk = score[:, s:e]
        top = blk.topk(min(2, e - s), dim=1).values
        local_margin.append(top[:, 0] - top[:, 1] if top.shape[1] > 1 else torch.full((B,), float("inf")))
        tok = blk.argmax(dim=1) + s
        lse = torch.logsumexp(scaled[:, s:e], dim=1)
        logit = scaled.gather(1, tok[:, None]).squeeze(1)
        g = gumbel_noise(seeds.squeeze(1), offsets.squeeze(1), torch.full((B,), k), stream=1)
        key = torch.where(greedy, logit, lse + g)
        key = torch.where(lse > float("-inf"), key, torch.full_like(key, float("-inf")))
        keys.append(key), toks.append(tok), lses.append(lse), logits_at.append(logit)
    keys, toks, lses = torch.stack(keys, 1), torch.stack(toks, 1), torch.stack(lses, 1)
    logits_at, local_margin = torch.stack(logits_at, 1), torch.stack(local_margin, 1)
    win = keys.argmax(dim=1)
    tokens = toks.gather(1, win[:, None]).squeeze(1)
    lse = torch.logsumexp(lses, dim=1)
    lp = logits_at.gather(1, win[:, None]).squeeze(1) - lse
    top2 = keys.topk(min(2, keys.shape[1]), dim=1).values
    choice_margin = top2[:, 0] - top2[:, 1] if top2.shape[1] > 1 else torch.full((B,), float("inf"))
    margin = torch.minimum(choice_margin, local_margin.gather(1, win[:, None]).squeeze(1))
    return tokens, lp, lse, margin


def chi2_pvalue(tokens: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0):
    """Chi-squared goodness of fit of sampled ids against float64 probabilities.

    Bins with expected count < min_expected are pooled into one bin (kept only if its
    expected count reaches min_expected). Returns (p_value, degrees of freedom).
    """
    tokens = tokens.cpu().long()
    probs = probs.cpu().double()
    n = tokens.numel()
    assert int(tokens.min()) >= 0 and int(tokens.max()) < probs.numel(), "sampled id out of range"
    observed = torch.bincount(tokens, minlength=probs.numel()).double()
    expected = probs * n
    big = expected >= min_expected
    obs, exp = observed[big].tolist(), expected[big].tolist()
    pooled_obs, pooled_exp = observed[~big].sum().item(), expected[~big].sum().item()
    if pooled_exp >= min_expected:
        obs.append(pooled_obs)
        exp.append(pooled_exp)
    else:
        assert pooled_obs <= 3 * max(pooled_exp, 1.0) + 10, f"{pooled_obs} samples where {pooled_exp:.2f} expected"
    obs, exp = np.array(obs), np.array(exp)
    exp *= obs.sum() / exp.sum()
    return float(stats.chisquare(obs, exp).pvalue), len(obs) - 1


def gather_objects(obj, group=None):
    out = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out


def assert_same_on_all_ranks(out, group=None):
    """Every rank returned the same SampleOutput (bitwise, NaNs included)."""
    mine = [None if t is None else t.cpu().numpy().tobytes() for t in out]
    everyone = gather_objects(mine, group)
    assert all(x == everyone[0] for x in everyone), "ranks returned different results"


def tp_ranges(V, tp, divisible_by=128):
    from fsdist.tensor_parallel.vocab import vocab_partition

    return [vocab_partition(V, tp, r, divisible_by).range_of(r) for r in range(tp)]
