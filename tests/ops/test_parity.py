"""Device parity: stage 1 and stage 2 pick the half of a double buffer from a counter in memory.

The tensor-parallel head keeps its step counter on the device so that a CUDA graph
replay uses the buffer half of the step it replays (fsdist/tensor_parallel/step_buffers.py).
Here the kernels are driven directly, on a two-copy buffer laid out like the head's
(two shard blocks = two "ranks" written from two weight shards), with the counter at 0, 1, 2, 3
and -1: the candidates must land in copy ``counter & 1`` only, stage 2 must read that copy,
and the tokens must equal fsdist.sample on the full weight and the host-offset launch.
"""
import pytest
import torch

import fsdist
from fsdist.params import RowParams
from fsdist.ops.configs import TileConfig
from fsdist.ops.fused_sample import launch_fused
from fsdist.ops.layout import BufferPair, CandidateLayout
from fsdist.ops.merge_candidates import launch_merge
from fsdist.ops.parity import DeviceParity
from fsdist.ops.sample_logits import launch_chunked

V, VP, D, B, CAP = 1000, 1024, 40, 13, 16
CFG = TileConfig(16, 128, 64, num_warps=4, num_stages=1)  # block_k as fsdist.sample picks on CPU
SENT_F, SENT_I = 12345.0, -7


def problem(device, dtype=torch.float32):
    g = torch.Generator().manual_seed(5)
    W = torch.zeros(VP, D)
    W[:V] = torch.randn(V, D, generator=g) * (3.0 / D ** 0.5)
    h = torch.randn(B, D, generator=g)
    temp = torch.rand(B, generator=g) + 0.3
    temp[::4] = 0.0  # greedy rows too
    params = RowParams(temp.to(device), (torch.arange(B) * 7919 + 3).to(device), (torch.arange(B) + 2**35).to(device))
    return W.to(device, dtype), h.to(device, dtype), params


def two_copy_buffer(layout, device):
    f = torch.full((2 * layout.float_numel,), SENT_F, device=device)
    i = torch.full((2 * layout.int_numel,), SENT_I, dtype=torch.int32, device=device)
    return f, i


def copies(layout, f, i):
    """[2, shards, fields, tiles, cap] and [2, shards, tiles, cap] views of both copies."""
    return (f.view(2, layout.n_shards, layout.n_fields, layout.n_local, layout.batch_cap),
            i.view(2, layout.n_shards, layout.n_local, layout.batch_cap))


def stage1_both_shards(launch, W, h, params, layout, f, i, logprobs, parity, **kw):
    """What two TP ranks write: block r from shard r, global ids from vocab_start = r * 512."""
    rows = VP // 2
    for r in range(2):
        launch(h, W[r * rows:(r + 1) * rows].contiguous(), params, CFG, layout, BufferPair(f, i, parity=parity),
               vocab_size=V, vocab_start=r * rows, shard=r, logprobs=logprobs, **kw)


@pytest.mark.parametrize("logprobs", [False, True])
@pytest.mark.parametrize("counter_value", [0, 1, 2, 3, -1])
def test_device_parity_selects_the_half_for_stage1_and_stage2(device, counter_value, logprobs):
    W, h, params = problem(device)
    layout = CandidateLayout(CandidateLayout.fields(logprobs), VP // 2 // CFG.block_v, CAP, n_shards=2)
    counter = torch.tensor([counter_value], dtype=torch.int64, device=device)
    parity = DeviceParity(counter, layout.float_numel, layout.int_numel)
    f, i = two_copy_buffer(layout, device)
    stage1_both_shards(launch_fused, W, h, params, layout, f, i, logprobs, parity=parity)

    cf, ci = copies(layout, f, i)
    k = counter_value & 1
    assert bool((ci[k, :, :, :B] != SENT_I).all()), "the counter's copy was not fully written"
    assert bool((cf[k, :, :, :, :B] != SENT_F).all())
    assert bool((ci[1 - k] == SENT_I).all()) and bool((cf[1 - k] == SENT_F).all()), "the other copy was touched"
    assert bool((ci[k, :, :, B:] == SENT_I).all()), "rows past the batch were touched"

    # Stage 2 through the counter == stage 2 at the host offset of that copy == fsdist.sample.
    got = launch_merge(layout, BufferPair(f, i, parity=parity), B, params, logprobs=logprobs)
    host = launch_merge(layout, BufferPair(f, i, base_f=k * layout.float_numel, base_i=k * layout.int_numel), B, params, logprobs=logprobs)
    ref = fsdist.sample(h, W, temperature=params.temperature, seed=params.seed, offset=params.offset,
                        vocab_size=V, return_logprobs=logprobs)
    assert torch.equal(got[0], ref.tokens) and torch.equal(host[0], ref.tokens)
    if logprobs:
        assert torch.equal(got[1], host[1]) and torch.equal(got[2], host[2])
        torch.testing.assert_close(got[1], ref.logprobs, atol=1e-5, rtol=0)
        torch.testing.assert_close(got[2], ref.logsumexp, atol=1e-5, rtol=0)
    assert int(counter.item()) == counter_value, "kernels must only read the counter"


def test_device_parity_reads_the_counter_at_launch(device):
    """Two steps into the two copies with different offsets, then each copy reduced on its own:
    the counter, not an argument, decided where each step went."""
    W, h, params = problem(device)
    layout = CandidateLayout(1, VP // 2 // CFG.block_v, CAP, n_shards=2)
    counter = torch.zeros(1, dtype=torch.int64, device=device)
    parity = DeviceParity(counter, layout.float_numel, layout.int_numel)
    f, i = two_copy_buffer(layout, device)
    steps = [RowParams(params.temperature, params.seed, params.offset + s) for s in range(2)]
    for p in steps:
        stage1_both_shards(launch_fused, W, h, p, layout, f, i, False, parity=parity)
        counter.add_(1)  # what the head does after stage 2
    for s, p in enumerate(steps):
        ref = fsdist.sample(h, W, temperature=p.temperature, seed=p.seed, offset=p.offset, vocab_size=V).tokens
        counter.fill_(s)
        assert torch.equal(launch_merge(layout, BufferPair(f, i, parity=parity), B, RowParams(1.0, 0, 0))[0], ref)
    assert not torch.equal(launch_merge(layout, BufferPair(f, i, base_f=0, base_i=0), B, RowParams(1.0, 0, 0))[0],
                           launch_merge(layout, BufferPair(f, i, base_f=layout.float_numel, base_i=layout.int_numel), B, RowParams(1.0, 0, 0))[0])


def test_device_parity_chunked_stage1(device):
    """The chunked stage 1 (several chunks) honours the parity like the fused one."""
    W, h, params = problem(device)
    layout = CandidateLayout(CandidateLayout.fields(True), VP // 2 // CFG.block_v, CAP, n_shards=2)
    counter = torch.ones(1, dtype=torch.int64, device=device)
    parity = DeviceParity(counter, layout.float_numel, layout.int_numel)
    f, i = two_copy_buffer(layout, device)
    stage1_both_shards(launch_chunked, W, h, params, layout, f, i, True, parity=parity, chunk_rows=256)
    cf, ci = copies(layout, f, i)
    assert bool((ci[0] == SENT_I).all()) and bool((cf[0] == SENT_F).all())
    assert bool((ci[1, :, :, :B] != SENT_I).all())
    got = launch_merge(layout, BufferPair(f, i, parity=parity), B, params, logprobs=True)
    ref = fsdist.sample(h, W, temperature=params.temperature, seed=params.seed, offset=params.offset, vocab_size=V,
                        return_logprobs=True)
    assert torch.equal(got[0], ref.tokens)


def test_device_parity_with_zero_stride_is_a_single_copy(device):
    """Strides 0 (one copy, as the collective transport and the race test's knob use): copy 0 always."""
    W, h, params = problem(device)
    layout = CandidateLayout(1, VP // 2 // CFG.block_v, CAP, n_shards=2)
    parity = DeviceParity(torch.ones(1, dtype=torch.int64, device=device), 0, 0)
    f, i = two_copy_buffer(layout, device)
    stage1_both_shards(launch_fused, W, h, params, layout, f, i, False, parity=parity)
    cf, ci = copies(layout, f, i)
    assert bool((ci[1] == SENT_I).all()) and bool((ci[0, :, :, :B] != SENT_I).all())
    ref = fsdist.sample(h, W, temperature=params.temperature, seed=params.seed, offset=params.offset, vocab_size=V)
    assert torch.equal(launch_merge(layout, BufferPair(f, i, parity=parity), B, RowParams(1.0, 0, 0))[0], ref.tokens)
