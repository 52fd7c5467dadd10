"""GPU-only checks of the serving case: per-row [B] parameters, filters, top-N (skipped without CUDA).

* no host synchronisation on the sampling path: warm calls run under
  ``torch.cuda.set_sync_debug_mode("error")``, for fsdist.sample on both stage-1 paths (plain,
  filtered, top-N, logprob modes) and for a ShardedFlashLMHead in a one-rank group;
* filtered sampling at V = 151936 with >= 10**6 draws (chi-squared + top-token binomial);
* the extra memory of a filtered call stays O(B x tiles) plus the fixed fallback pool;
* a CUDA graph captured with filter tensors replays like eager calls;
* an all-greedy call on the ping-pong kernel (v112) neither synchronises nor breaks a CUDA graph.
"""
import math
import os
import socket

import pytest
import torch

import fsdist
from fsdist.reference import filtered_distribution
from statcheck import assert_samples_match

pytestmark = pytest.mark.gpu
V_REAL = 151936


def _serving_inputs(B, D=4096, V=V_REAL, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(V, D, generator=g) * (2.0 / math.sqrt(D))).cuda().bfloat16()
    h = torch.randn(B, D, generator=g).cuda().bfloat16()
    rows = torch.arange(B, device="cuda")
    params = dict(temperature=(0.6 + 0.4 * torch.rand(B, generator=g)).cuda(), seed=rows * 31 + 7,
                  offset=torch.full((B,), 3, device="cuda", dtype=torch.int64))
    filters = dict(top_k=torch.full((B,), 50, dtype=torch.int32, device="cuda"),
                   top_p=torch.full((B,), 0.9, device="cuda"), min_p=torch.full((B,), 0.02, device="cuda"))
    return h, w, params, filters


# B = 64: the warp-specialised 64-row tile (an sm_90 GPU); 16: the Triton kernel; 512: the 128-row ws tile;
# 80 / 192: 128-row tiles, the last partly empty (a zero-padded hidden, configs.PAD_TILE_ROWS; the dispatch's choice)
@pytest.mark.parametrize("B,path", [(16, "fused"), (64, "fused"), (80, None), (128, "chunked"), (192, "fused"),
                                    (512, "fused")])
def test_sample_never_synchronises(B, path):
    h, w, params, filters = _serving_inputs(B)
    calls = [dict(), dict(return_logprobs=True), dict(filters, return_logprobs=True, logprobs_mode="processed"),
             dict(filters, top_logprobs=5, return_logprobs=True, logprobs_mode="raw")]
    for kw in calls:  # warm: compile every kernel outside the checked region
        fsdist.sample(h, w, path=path, **params, **kw)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for kw in calls:
            fsdist.sample(h, w, path=path, **params, **kw)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("transport", ["collective", "symm_mem"])
def test_head_never_synchronises(transport):
    """A one-rank tensor-parallel group (NCCL): the head's forward, status monitor included;
    on a peer-store transport also with filters, top-N and every logit processor (the
    fallback runs a fixed number of rounds there; the collective transport reads the count
    of fallback rows, documented, so it is checked plain only)."""
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group already exists in this process")
    os.environ.update({"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"})
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1,
                            device_id=torch.device("cuda", torch.cuda.current_device()))
    try:
        D, V, B = 1024, 32000, 16
        g = torch.Generator().manual_seed(1)
        head = fsdist.ShardedFlashLMHead(D, V, transport=transport, device="cuda", max_batch_size=B)
        head.load_full_weight((torch.randn(V, D, generator=g) * 0.05).cuda().bfloat16())
        h = torch.randn(B, D, generator=g).cuda().bfloat16()
        rows = torch.arange(B, device="cuda")
        plain = dict(temperature=torch.full((B,), 0.8, device="cuda"), seed=rows + 5, offset=rows * 0 + 2,
                     return_logprobs=True)
        calls = [plain]
        if transport != "collective":
            allowed = torch.rand(B, V, generator=g) < 0.5
            words = fsdist.reference.bitmask_from_allowed(allowed).cuda()
            ids = torch.randint(0, V, (B, 40), generator=g).cuda()
            calls.append(dict(plain, top_k=torch.full((B,), 50, device="cuda"), top_p=torch.full((B,), 0.9, device="cuda"),
                              min_p=torch.full((B,), 0.02, device="cuda"), top_logprobs=5, token_bitmask=words,
                              logit_bias=fsdist.SparseLogits(ids[:, :20], torch.randn(B, 20, generator=g).cuda()),
                              penalties=fsdist.Penalties(torch.full((B,), 1.2, device="cuda"),
                                                         torch.full((B,), 0.3, device="cuda"),
                                                         torch.full((B,), 0.1, device="cuda"), ids[:, 20:], None)))
        for _ in range(3):
            for kw in calls:
                head(h, **kw)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            for _ in range(3):
                for kw in calls:
                    head(h, **kw)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        head.check()  # synchronises, outside the checked region: no mismatch happened
        head.close()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("name,filters,scale", [("top_k50+top_p0.9", dict(top_k=50, top_p=0.9), 3.0),
                                                ("min_p0.05", dict(min_p=0.05), 3.0),
                                                ("min_p0.05_flat", dict(min_p=0.05), 1.6)])
def test_filtered_chi_squared_one_million_samples(name, filters, scale):
    """("min_p0.05_flat": logits of spread ~1.6, ~1,000 survivors, 3 tiles of 128 ids with more survivors than
    the 4 kept: the kept logits alone prove no draw; the tiles' winners prove ~99% of them (a float64 model of
    the proof with torch's Gumbel noise: 1.3% fall back), select_filtered's min-p proof. At spread 1.2 the
    same model gives 46% (370 open tiles, the winner of one of them often outscores every survivor), and the
    H200 measured 44.8% (2026-11-26): that spread is the fallback's case, not the winners'.)"""
    V, D, rows, calls = V_REAL, 256, 8192, 128
    g = torch.Generator().manual_seed(2027)
    h1 = torch.randn(1, D, generator=g)
    w = torch.randn(V, D, generator=g) * (scale / math.sqrt(D))
    h1, w = h1.cuda().bfloat16(), w.cuda().bfloat16()
    hidden = h1.expand(rows, -1).contiguous()
    seeds = torch.arange(rows, device="cuda")
    outs = [fsdist.sample(hidden, w, temperature=1.0, seed=seeds, offset=step, **filters) for step in range(calls)]
    tokens = torch.cat([o.tokens for o in outs])
    fell_back = torch.cat([o.fallback for o in outs]).float().mean().item()
    logits = h1.double() @ w.double().T
    probs = filtered_distribution(logits.cpu(), temperature=1.0, **filters)[0]
    assert bool((probs[tokens.cpu()] > 0).all()), "a filtered-out id was sampled"
    assert_samples_match(tokens, probs, f"{name} V={V} n={tokens.numel()} fallback rate {fell_back:.4f}")
    if name.endswith("flat"):
        assert fell_back < 0.05, f"meant to measure the winner path (fallback rate {fell_back:.4f})"


def test_filtered_call_memory_is_bounded():
    from fsdist.ops.fallback import POOL_ROWS
    from fsdist.ops.layout import N_FIELDS_EXTENDED, KEEP

    B, V, D = 256, V_REAL, 4096
    h, w, params, filters = _serving_inputs(B, D, V)
    fsdist.sample(h, w, **params, **filters, top_logprobs=5, return_logprobs=True)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fsdist.sample(h, w, **params, **filters, top_logprobs=5, return_logprobs=True)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    from fsdist.ops.configs import chunk_workspace_bytes

    tiles = -(-V // 128)
    cap = ((N_FIELDS_EXTENDED + 1 + KEEP) * 4 * tiles * B + POOL_ROWS * V * 4
           + chunk_workspace_bytes(torch.device("cuda")))
    assert extra < cap + 4 * 2**20, f"a filtered call allocated {extra / 2**20:.1f} MiB (bound {cap / 2**20:.1f})"
    assert extra < B * V * 4 / 2, "no more than half of what materialized fp32 logits would take"


# 64: the warp-specialised 64-row tile on an sm_90 GPU; 80: on an sm_90 GPU that tile too, twice, the last one read
# past the hidden's end (v80 / v85), elsewhere a padded 128-row tile (the Triton twin); "80-128": that padded 128-row
# tile on every GPU (the 128-row config passed to the call)
@pytest.mark.parametrize("B, config", [(32, None), (64, None), (80, None), (80, "128x128x64w8s5t-ws")],
                         ids=["32", "64", "80", "80-128"])
def test_cuda_graph_with_filter_tensors(B, config):
    from fsdist.ops.configs import TileConfig

    D, V = 1024, 32000
    h, w, params, filters = _serving_inputs(B, D, V, seed=3)
    kw = dict(params, **filters, return_logprobs=True, top_logprobs=3,
              config=TileConfig.parse(config) if config else None)
    fsdist.sample(h, w, **kw)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fsdist.sample(h, w, **kw)
    for step in range(3):
        params["offset"].fill_(10 + step)
        filters["top_p"].fill_(0.5 + 0.2 * step)
        graph.replay()
        eager = fsdist.sample(h, w, **kw)
        assert torch.equal(out.tokens, eager.tokens) and torch.equal(out.top_ids, eager.top_ids)
        torch.testing.assert_close(out.logprobs, eager.logprobs, equal_nan=True)


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="the ping-pong kernel needs an sm_90 GPU")
def test_all_greedy_call_on_the_ping_pong_kernel_never_synchronises_and_graphs(monkeypatch):
    """An all-greedy call (scalar temperature 0) of >= configs.PP_GREEDY_MIN_BATCH rows runs the ping-pong kernel
    (v112): no host synchronisation, and a captured CUDA graph replays the eager tokens."""
    from fsdist.ops import configs, fused_sample

    monkeypatch.setattr(fused_sample, "fast_memory", lambda device: False)  # (the rule's H100 case on any sm_90)
    ran = []
    real = fused_sample.launch_fused_pp
    monkeypatch.setattr(fused_sample, "launch_fused_pp", lambda *a, **k: (ran.append(1), real(*a, **k))[1])
    B = configs.PP_GREEDY_MIN_BATCH
    h, w, _, _ = _serving_inputs(B, seed=5)  # (v112's D = 4096 shape)
    first = fsdist.sample(h, w, temperature=0.0, path="fused")
    torch.cuda.synchronize()
    assert ran, "the call did not take the ping-pong kernel"
    reference = (h.float() @ w.float().t()).argmax(-1)
    # bf16 products summed in another order may swap two near-equal logits: the float32 argmax agrees on most rows
    assert (first.tokens == reference).float().mean() > 0.99
    torch.cuda.set_sync_debug_mode("error")
    try:
        eager = fsdist.sample(h, w, temperature=0.0, path="fused")
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.equal(eager.tokens, first.tokens)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fsdist.sample(h, w, temperature=0.0, path="fused")
    h.copy_(h.roll(1, 0))  # new inputs in place: the replay must read them
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out.tokens, first.tokens.roll(1, 0))
    assert len(ran) == 3  # the eager, the sync-checked and the captured call all took the ping-pong kernel
