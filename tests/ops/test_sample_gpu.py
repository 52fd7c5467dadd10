"""GPU-only checks of fsdist.sample at real sizes (skipped without CUDA)."""
import math

import pytest
import torch

import fsdist
from fsdist.reference import materialize_logits, reference_gumbel
from statcheck import assert_samples_match

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_large_vocab_chi_squared_one_million_samples(dtype):
    """V = 151936 (Qwen), 1,048,576 draws: resolves a ~1% relative bias on the likeliest tokens."""
    V, D, rows, calls = 151936, 256, 8192, 128
    g = torch.Generator().manual_seed(2026)
    h = torch.randn(1, D, generator=g)
    w = torch.randn(V, D, generator=g) * (3.0 / math.sqrt(D))
    h, w = h.cuda().to(dtype), w.cuda().to(dtype)
    hidden = h.expand(rows, -1).contiguous()
    seeds = torch.arange(rows, device="cuda")
    tokens = torch.cat([fsdist.sample(hidden, w, temperature=1.0, seed=seeds, offset=step).tokens
                        for step in range(calls)])
    probs = torch.softmax(materialize_logits(h, w)[0], dim=-1)
    assert_samples_match(tokens, probs, f"V={V} {dtype} n={tokens.numel()}")


@pytest.mark.parametrize("path", ["fused", "chunked"])
@pytest.mark.parametrize("B", [1, 3, 17, 64, 100, 128, 256, 512])
def test_real_shape_tokens_match_reference(B, path):
    V, D = 151936, 4096
    g = torch.Generator().manual_seed(B)
    w = (torch.randn(V, D, generator=g) * (2.0 / math.sqrt(D))).cuda().bfloat16()
    h = torch.randn(B, D, generator=g).cuda().bfloat16()
    temp = torch.rand(B, generator=g) + 0.5
    temp[::4] = 0.0
    seeds, offsets = torch.arange(B) + 11, torch.arange(B) * 3
    out = fsdist.sample(h, w, temperature=temp.cuda(), seed=seeds.cuda(), offset=offsets.cuda(),
                        vocab_size=151000, return_logprobs=True, path=path)
    ref, margin = reference_gumbel(h, w, temperature=temp.cuda(), seed=seeds.cuda(), offset=offsets.cuda(),
                                   vocab_size=151000)
    clear = margin > 1e-2
    assert clear.float().mean() > 0.8
    assert torch.equal(out.tokens[clear], ref[clear])
    scaled = materialize_logits(h, w, 151000) / torch.where(temp == 0, 1.0, temp).cuda().double()[:, None]
    torch.testing.assert_close(out.logsumexp.double(), torch.logsumexp(scaled, -1), rtol=1e-5, atol=2e-4)


@pytest.mark.parametrize("path", ["fused", "chunked"])
def test_no_logits_sized_allocation(path):
    from fsdist.ops.configs import chunk_workspace_bytes

    B, V, D = 1024, 151936, 4096
    logits_bytes = B * V * 4  # 594 MiB of fp32 logits: what a materializing sampler holds
    budget = chunk_workspace_bytes(torch.device("cuda"))
    assert budget <= logits_bytes / 4
    w = torch.randn(V, D, device="cuda", dtype=torch.bfloat16)
    h = torch.randn(B, D, device="cuda", dtype=torch.bfloat16)
    fsdist.sample(h, w, return_logprobs=True, path=path)  # compile outside the measured region
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fsdist.sample(h, w, return_logprobs=True, path=path)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    # Candidates: 4 fp32 fields + 1 int32 id per (tile of 128 ids, row), 23 MiB here. The
    # chunked path adds one fp32 chunk, capped at the workspace (L2 size) whatever B and V are.
    cap = 5 * 4 * -(-V // 128) * B + (budget if path == "chunked" else 0)
    assert extra < cap + 2**20, f"sample allocated {extra / 2**20:.1f} MiB"


@pytest.mark.parametrize("B", [32, 256])
def test_cuda_graph_replay_with_new_seeds_and_offsets(B):
    V, D = 32000, 1024
    w = torch.randn(V, D, device="cuda", dtype=torch.bfloat16) * 0.05
    h = torch.randn(B, D, device="cuda", dtype=torch.bfloat16)
    seeds = torch.zeros(B, dtype=torch.int64, device="cuda")
    offsets = torch.zeros(B, dtype=torch.int64, device="cuda")
    temp = torch.full((B,), 0.8, device="cuda")
    fsdist.sample(h, w, temperature=temp, seed=seeds, offset=offsets)  # warm up (compile)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fsdist.sample(h, w, temperature=temp, seed=seeds, offset=offsets)
    seen = []
    for step in range(4):
        seeds.copy_(torch.arange(B, device="cuda") + 100)
        offsets.fill_(step)
        graph.replay()
        eager = fsdist.sample(h, w, temperature=temp, seed=seeds, offset=offsets).tokens
        assert torch.equal(out.tokens, eager)
        seen.append(out.tokens.clone())
    assert not torch.equal(seen[0], seen[1])  # a new offset is a new draw


@pytest.mark.parametrize("extended", [False, True])
@pytest.mark.parametrize("B", [1, 16, 32])
def test_first_wave_stagger_leaves_the_candidates_bit_for_bit(B, extended):
    """The B <= 32 configs hold half the first wave (TileConfig.stagger_us, docs/performance.md v56) and pick their
    pipeline depth by GPU (v60): timing only. Stage 1's whole candidate buffer (winners, sums and, extended, the kept
    logits) with the stagger equals the one without, and the one with the other depth (4 <-> 5 stages), and the
    stagger really runs at this size (configs.stagger_applies)."""
    import dataclasses

    from fsdist.ops.configs import stagger_applies
    from fsdist.ops.layout import BufferPair
    from fsdist.ops.plan import launch_stage1, plan_sample
    from fsdist.ops.utils import sm_count
    from fsdist.params import RowParams

    V, D = 151936, 4096
    g = torch.Generator().manual_seed(56 + B)
    w = (torch.randn(V, D, generator=g) * (2.0 / math.sqrt(D))).cuda().bfloat16()
    h = torch.randn(B, D, generator=g).cuda().bfloat16()
    rows = torch.arange(B, device="cuda")
    kw = dict(top_k=torch.full((B,), 50, device="cuda", dtype=torch.int32),
              top_p=torch.full((B,), 0.9, device="cuda")) if extended else {}
    params = RowParams(torch.full((B,), 0.8, device="cuda"), rows + 1, rows * 0, **kw)
    # the 32-row tile as the plan picks it for this kind of call and GPU (a longer stagger for extended calls and 5
    # stages on fast memory, v60-v62), where it keeps that tile (extended calls at B = 17-32 take the ws 64-row
    # tile on an H200 since v74; the 32-row tile stays theirs elsewhere: D = 8192, slower memory, the TP shards)
    from fsdist.ops.configs import fast_memory, pick_config

    staggered = pick_config(B, D, "cuda", fast_memory=fast_memory(h.device), extended=extended)
    if not extended or B <= 16:
        assert staggered == plan_sample(batch=B, hidden_size=D, weight_rows=V, device=h.device, path="fused",
                                        extended=extended).config
    assert staggered.stagger_us > 0
    assert stagger_applies(staggered, h.device, 1, -(-V // staggered.block_v), sm_count(h.device))
    # and the other pipeline depth (4 <-> 5 stages: the 32-row tile's depth depends on the GPU's memory, v60)
    other_depth = dataclasses.replace(staggered, stagger_us=0, num_stages=5 if staggered.num_stages == 4 else 4)
    bufs = []
    for cfg in (staggered, dataclasses.replace(staggered, stagger_us=0), other_depth):
        plan = plan_sample(batch=B, hidden_size=D, weight_rows=V, device=h.device, config=cfg, path="fused",
                           extended=extended)
        dest = BufferPair.alloc(plan.layout, h.device)
        dest.f.fill_(float("nan"))
        dest.i.fill_(-7)
        launch_stage1(plan, h, w, params, dest, vocab_size=V)
        bufs.append((dest.f.clone(), dest.i.clone()))
    torch.cuda.synchronize()
    for f, i in bufs[1:]:
        assert torch.equal(bufs[0][0].nan_to_num(nan=1234.5), f.nan_to_num(nan=1234.5))
        assert torch.equal(bufs[0][1], i)
