"""ShardedFlashLMHead across ranks: TP invariance, padding, greedy rows, group-log-mass oracle.

Run with ``mpirun -n 2 python -m pytest --with-mpi tests/tensor_parallel`` (or -n 4).
Problems are tiny (D <= 64, V ~ 1000) because the kernels run under Triton's
interpreter on CPU; the same tests run on GPUs under NCCL.
"""
import pytest
import torch
import torch.distributed as dist

import fsdist
from tp_helpers import (ALL_TRANSPORTS, assert_same_on_all_ranks, grid, problem, reference_group_logmass,
                        scaled_logits64, tp_ranges)

mpi = pytest.mark.mpi(min_size=2)
REDUCTIONS = ["candidates", "group_logmass"]


def make_head(ctx, D, V, W=None, **kw):
    kw.setdefault("params_dtype", W.dtype if W is not None else torch.float32)
    head = fsdist.ShardedFlashLMHead(D, V, device=ctx.device, **kw)
    if W is not None:
        head.load_full_weight(W)
    return head


def row_params(B, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    temperature = (torch.rand(B, generator=g) * 1.5 + 0.3).to(device)
    seeds = torch.randint(0, 2**62, (B,), generator=g).to(device)
    offsets = torch.randint(0, 2**40, (B,), generator=g).to(device)
    return temperature, seeds, offsets


@mpi
@pytest.mark.parametrize("transport", ALL_TRANSPORTS)
def test_candidates_equal_single_device_sampler(dist_ctx, transport):
    """Same tokens as fsdist.sample on the full weight, bit for bit; padded vocabulary; tied weights."""
    V, D, B = 1000, 32, 24  # V pads to 1024: padding rows on the last rank(s)
    W, h = problem(V, D, B, torch.bfloat16, seed=1, scale=3.0, device=dist_ctx.device)
    head = make_head(dist_ctx, D, V, W, transport=transport)
    assert head.padded_vocab_size == 1024 and head.weight.shape == (1024 // dist_ctx.world_size, D)
    temperature, seeds, offsets = row_params(B, dist_ctx.device)
    for kwargs in [dict(temperature=1.0, seed=7, offset=3), dict(temperature=temperature, seed=seeds, offset=offsets)]:
        out = head(h, return_logprobs=True, **kwargs)
        ref = fsdist.sample(h, W, vocab_size=V, return_logprobs=True, **kwargs)
        assert torch.equal(out.tokens, ref.tokens)
        torch.testing.assert_close(out.logprobs, ref.logprobs, atol=1e-5, rtol=0)
        torch.testing.assert_close(out.logsumexp, ref.logsumexp, atol=1e-5, rtol=0)
        assert_same_on_all_ranks(out)
        no_lp = head(h, **kwargs)  # the 1-field layout, in the other parity buffer
        assert torch.equal(no_lp.tokens, ref.tokens) and no_lp.logprobs is None and no_lp.logsumexp is None
    # Tied embeddings: the caller's shard of another weight replaces head.weight for one call.
    W2, _ = problem(V, D, 1, torch.bfloat16, seed=2, scale=3.0, device=dist_ctx.device)
    Wp = torch.zeros(head.padded_vocab_size, D, dtype=torch.bfloat16, device=dist_ctx.device)
    Wp[:V] = W2
    shard = Wp[head.vocab_start:head.vocab_end].contiguous()
    out = head(h, seed=9, offset=4, weight=shard)
    assert torch.equal(out.tokens, fsdist.sample(h, W2, seed=9, offset=4, vocab_size=V).tokens)
    assert torch.equal(head(h, seed=9, offset=4).tokens, fsdist.sample(h, W, seed=9, offset=4, vocab_size=V).tokens)
    head.close()


@mpi
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_padding_rows_are_never_sampled(dist_ctx, reduction):
    """Padding rows whose logits would win by a mile if they were not masked."""
    V, D, B = 1000, 16, 64
    Wv, h = problem(V, D, B, torch.float32, seed=3, device=dist_ctx.device)
    h = h.abs()  # all hidden coordinates positive ...
    head = make_head(dist_ctx, D, V, reduction=reduction, transport="collective")
    Wp = torch.full((head.padded_vocab_size, D), 50.0, device=dist_ctx.device)  # ... padding logits huge
    Wp[:V] = Wv
    head.load_full_weight(Wp)  # a [V_padded, D] full weight: padding rows copied as they are
    pad = head.weight[head.partition.valid_rows:]
    assert pad.numel() == 0 or bool((pad == 50.0).all())
    temperature = torch.where(torch.arange(B, device=dist_ctx.device) % 2 == 0, 0.0, 2.0)
    out = head(h, temperature=temperature, seed=5, offset=1, return_logprobs=True)
    assert bool((out.tokens >= 0).all()) and bool((out.tokens < V).all())
    scaled, greedy = scaled_logits64(h, Wv, V, temperature)
    assert torch.equal(out.tokens.cpu()[greedy], scaled.argmax(1)[greedy])
    torch.testing.assert_close(out.logsumexp.cpu().double(), torch.logsumexp(scaled, 1), atol=1e-4, rtol=0)
    head.close()


@mpi
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_greedy_rows_mixed_with_sampled_rows(dist_ctx, reduction):
    V, D, B = 1000, 32, 32
    W, h = problem(V, D, B, torch.float32, seed=4, scale=4.0, device=dist_ctx.device)
    head = make_head(dist_ctx, D, V, W, reduction=reduction, transport="collective")
    temperature = torch.tensor([0.0, 0.7, 1.0, 0.0] * (B // 4), device=dist_ctx.device)
    seeds = torch.arange(B, dtype=torch.int64, device=dist_ctx.device) * 31 + 1
    out = head(h, temperature=temperature, seed=seeds, offset=17, return_logprobs=True)
    scaled, greedy = scaled_logits64(h, W, V, temperature)
    assert torch.equal(out.tokens.cpu()[greedy], scaled.argmax(1)[greedy])
    logp = torch.log_softmax(scaled, 1)
    torch.testing.assert_close(out.logprobs.cpu().double(), logp.gather(1, out.tokens.cpu()[:, None]).squeeze(1),
                               atol=1e-4, rtol=0)
    if reduction == "candidates":
        ref = fsdist.sample(h, W, temperature=temperature, seed=seeds, offset=17, vocab_size=V)
        assert torch.equal(out.tokens, ref.tokens)
    # all-greedy batch (no noise at all)
    out0 = head(h, temperature=0.0)
    assert torch.equal(out0.tokens.cpu(), scaled_logits64(h, W, V, 0.0)[0].argmax(1))
    head.close()


@mpi
@pytest.mark.parametrize("transport", ALL_TRANSPORTS)
def test_group_logmass_matches_float64_mirror(dist_ctx, transport):
    """Token for token against a float64 torch mirror of paper Alg. I.4 with fsdist's noise."""
    V, D, B = 1000, 32, 48
    W, h = problem(V, D, B, torch.float32, seed=5, scale=3.0, device=dist_ctx.device)
    head = make_head(dist_ctx, D, V, W, reduction="group_logmass", transport=transport)
    temperature, seeds, offsets = row_params(B, dist_ctx.device, seed=6)
    temperature[::5] = 0.0
    out = head(h, temperature=temperature, seed=seeds, offset=offsets, return_logprobs=True)
    ranges = tp_ranges(V, dist_ctx.world_size)
    tok, lp, lse, margin = reference_group_logmass(h, W, V, ranges, temperature, seeds, offsets)
    decided = margin > 1e-4  # rows not decided by fp32 rounding (all of them, in practice)
    assert decided.sum() >= B - 2
    assert torch.equal(out.tokens.cpu()[decided], tok[decided])
    torch.testing.assert_close(out.logprobs.cpu().double()[decided], lp[decided], atol=1e-4, rtol=0)
    torch.testing.assert_close(out.logsumexp.cpu().double(), lse, atol=1e-4, rtol=0)
    assert_same_on_all_ranks(out)
    head.close()


@mpi
@grid("reduction", [(r,) for r in REDUCTIONS], lambda reduction: reduction == "candidates",
      "reserve, empty batches and bad rows at 4 ranks run with candidates (tokens equal to one device at every batch "
      "size) and, with both reductions, in test_divergence.py::test_agreeing_ranks_never_see_a_mismatch")
def test_batch_sizes_reserve_empty_batch_and_nan_rows(dist_ctx, reduction):
    V, D = 1000, 16
    W, h = problem(V, D, 40, torch.float32, seed=7, device=dist_ctx.device)
    head = make_head(dist_ctx, D, V, W, reduction=reduction, transport=ALL_TRANSPORTS[-1], max_batch_size=10)
    assert head.max_batch_size == 16
    with pytest.raises(ValueError, match="exceeds the head's max_batch_size 16"):
        head(h[:40], seed=2)  # every rank raises alike and the group stays in step
    head.reserve(40)  # collective, every rank
    assert head.max_batch_size == 64
    for B in (3, 40, 0, 5):
        out = head(h[:B], seed=2, offset=B, return_logprobs=True)
        assert out.tokens.shape == (B,) and out.logprobs.shape == (B,)
        if reduction == "candidates" and B:
            assert torch.equal(out.tokens, fsdist.sample(h[:B], W, seed=2, offset=B, vocab_size=V).tokens)
        assert bool((out.tokens >= 0).all()) and bool((out.tokens < V).all())
    assert head.step == 5  # every call is a step, the refused and the empty one included
    head.check()
    bad = h[:6].clone()
    bad[2, 0] = float("nan")
    out = head(bad, seed=1, return_logprobs=True)
    assert out.tokens[2] == -1 and torch.isnan(out.logprobs[2]) and torch.isnan(out.logsumexp[2])
    keep = torch.arange(6, device=dist_ctx.device) != 2
    assert bool((out.tokens[keep] >= 0).all()) and not torch.isnan(out.logsumexp[keep]).any()
    head.close()


@mpi
def test_max_batch_size_preallocates(dist_ctx):
    V, D = 1000, 16
    W, h = problem(V, D, 20, torch.float32, seed=8, device=dist_ctx.device)
    head = make_head(dist_ctx, D, V, W, transport="collective", max_batch_size=100)
    assert head.max_batch_size == 128
    head(h, seed=3)
    assert head.max_batch_size == 128
    head.close()
    head = make_head(dist_ctx, D, V, W, transport="collective")
    assert head.max_batch_size == 256  # the default
    head.close()


@mpi
def test_explicit_tp_subgroups(dist_ctx):
    """Two independent TP groups of half the world each (or the whole world at -n 2)."""
    world, rank = dist_ctx.world_size, dist_ctx.rank
    if world % 2:
        pytest.skip("needs an even number of ranks")
    size = world // 2 if world >= 4 else world
    groups = [dist.new_group(list(range(s, s + size))) for s in range(0, world, size)]
    group = groups[rank // size]
    V, D, B = 1000, 16, 8
    W, h = problem(V, D, B, torch.float32, seed=9, device=dist_ctx.device)
    for transport in ALL_TRANSPORTS:
        head = make_head(dist_ctx, D, V, W, transport=transport, tp_group=group)
        assert head.tp_size == size and head.tp_rank == rank % size
        if transport == "nvshmem" and size != world:
            assert head.transport_name == "symm_mem"  # NVSHMEM spans the whole job (test_transports.py)
        out = head(h, seed=rank // size, offset=1)  # the groups sample independently
        assert torch.equal(out.tokens, fsdist.sample(h, W, seed=rank // size, offset=1, vocab_size=V).tokens)
        head.close()
    for g in groups:
        dist.destroy_process_group(g)


@mpi
def test_tp2_inside_world4_shares_shards_and_takes_sbh(dist_ctx, caplog):
    """DP x TP: TP groups of 2 inside the world (two groups at -n 4, the whole world at -n 2).
    Each head uses an existing shard Parameter as its weight (weight=, no copy of its own) and
    samples Megatron-shaped [s, b, D] hidden states: tokens [s, b] == fsdist.sample on the
    full weight; "auto" says what it picked, and why, on the fsdist logger."""
    world, rank = dist_ctx.world_size, dist_ctx.rank
    if world % 2:
        pytest.skip("needs an even number of ranks")
    groups = [dist.new_group([s, s + 1]) for s in range(0, world, 2)]
    group, tp_rank = groups[rank // 2], rank % 2
    V, D, s, b = 1000, 16, 3, 4  # V pads to 1024: 512 rows per rank, padding on rank 1
    W, h = problem(V, D, s * b, torch.float32, seed=21, scale=3.0, device=dist_ctx.device)
    Wp = torch.zeros(1024, D, device=dist_ctx.device)
    Wp[:V] = W
    shard = torch.nn.Parameter(Wp[tp_rank * 512:(tp_rank + 1) * 512].clone())
    temperature, seeds, offsets = row_params(s * b, dist_ctx.device, seed=rank // 2)  # groups differ
    for transport in ["auto"] + ALL_TRANSPORTS:
        with caplog.at_level("INFO", logger="fsdist"):
            head = fsdist.ShardedFlashLMHead(D, V, tp_group=group, transport=transport, weight=shard,
                                             params_dtype=torch.float32)
        assert head.weight is shard and not head.owns_weight
        assert list(head.parameters()) == [] and "weight" not in head.state_dict()
        if transport == "auto":
            assert any(f"transport auto -> {head.transport_name}" in r.getMessage() for r in caplog.records)
        out = head(h.reshape(s, b, D), temperature=temperature.reshape(s, b), seed=seeds, offset=offsets.reshape(s, b),
                   return_logprobs=True)
        ref = fsdist.sample(h, W, temperature=temperature, seed=seeds, offset=offsets, vocab_size=V,
                            return_logprobs=True)
        assert out.tokens.shape == (s, b) and out.logprobs.shape == (s, b)
        assert torch.equal(out.tokens.reshape(-1), ref.tokens)
        torch.testing.assert_close(out.logprobs.reshape(-1), ref.logprobs, atol=1e-5, rtol=0)
        assert_same_on_all_ranks(out, group)
        with torch.no_grad():  # the head reads the shared Parameter at every call: no stale copy
            shard.mul_(2.0)
        again = head(h.reshape(s, b, D), temperature=1.0, seed=seeds, offset=1)
        with torch.no_grad():
            shard.mul_(0.5)
        assert torch.equal(again.tokens.reshape(-1), fsdist.sample(h, W * 2, seed=seeds, offset=1, vocab_size=V).tokens)
        head.close()
    for g in groups:
        dist.destroy_process_group(g)


@mpi
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_chunked_stage1_path(dist_ctx, reduction):
    """path="chunked" (matmul logits per chunk, then the same epilogue) draws the same noise:
    tokens agree with the float64 oracles wherever fp32 rounding cannot decide."""
    from fsdist.reference import reference_gumbel

    V, D, B = 1000, 32, 24
    W, h = problem(V, D, B, torch.float32, seed=12, scale=3.0, device=dist_ctx.device)
    head = make_head(dist_ctx, D, V, W, reduction=reduction, transport=ALL_TRANSPORTS[-1])
    seeds = torch.arange(B, dtype=torch.int64, device=dist_ctx.device) * 3 + 1
    out = head(h, seed=seeds, offset=2, path="chunked", return_logprobs=True)
    if reduction == "candidates":
        tok, margin = reference_gumbel(h.cpu(), W.cpu(), seed=seeds.cpu(), offset=2, vocab_size=V)
    else:
        tok, _, _, margin = reference_group_logmass(h, W, V, tp_ranges(V, dist_ctx.world_size), 1.0, seeds, 2)
    decided = margin > 1e-4
    assert decided.sum() >= B - 2
    assert torch.equal(out.tokens.cpu()[decided], tok[decided])
    assert_same_on_all_ranks(out)
    head.close()
