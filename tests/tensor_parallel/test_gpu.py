"""GPU-only tensor-parallel tests: real vocabulary sizes, NVSHMEM and symm_mem transports.

Skipped without CUDA (tests/conftest.py skips every ``gpu`` test) and without at least
two ranks (the ``dist_ctx`` fixture). Not marked ``mpi``, so they run under torchrun as
well as under mpirun::

    launch/torchrun.sh 2 -m pytest -q tests/tensor_parallel/test_gpu.py
    launch/torchrun.sh 4 -m pytest -q tests/tensor_parallel/test_gpu.py
    launch/mpirun.sh 4 -m pytest -q --with-mpi tests/tensor_parallel     # everything, on GPUs

nvshmem cases need nvshmem4py (``pip install --no-deps nvshmem4py_cu13-0.4.1-*.whl``)
and skip without it.
"""
import sys

import pytest
import torch

import fsdist
from fsdist.tensor_parallel import HeadTestSeam
from tp_helpers import P_MIN, chi2_pvalue, reference_group_logmass, scaled_logits64, tp_ranges

pytestmark = pytest.mark.gpu

V_REAL = 128256  # Llama-3 vocabulary


def _need(transport):
    from fsdist.nvshmem_runtime import importable as nvshmem_importable

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    if transport == "nvshmem" and not nvshmem_importable():
        pytest.skip("nvshmem4py is not installed")


def _weights(V, D, B, device, seed=0, scale=1.0):
    g = torch.Generator(device=device).manual_seed(seed)
    W = torch.randn(V, D, generator=g, device=device).to(torch.bfloat16)
    h = (torch.randn(B, D, generator=g, device=device) * (scale / D ** 0.5)).to(torch.bfloat16)
    return W, h


@pytest.mark.parametrize("B", [64, 80, 192, 256])
@pytest.mark.parametrize("transport", ["nvshmem", "symm_mem", "collective"])
def test_gpu_candidates_equal_single_gpu_at_real_shapes(dist_ctx, transport, B, monkeypatch):
    """The head's tokens and logprobs are fsdist.sample's on the full weight, with and without logprobs. B = 80 /
    192 leave the last 128-row tile partly empty: each shard's stage 1 (fused on an H100, configs.choose_path)
    reads a zero-padded hidden (fused_sample.tile_operand) with its peer fan-out on. On an sm_90 GPU the plain
    calls of a fused path run the warp-specialised kernel with the fan-out and the call's header (checked by a
    spy; the logprob calls past B = 64 run the Triton kernel)."""
    from fsdist.ops import configs, fused_sample
    from fsdist.ops.fused_sample_ws import HAVE_GLUON

    _need(transport)
    D = 4096
    ws_launches = []
    real = fused_sample.launch_fused_ws

    def spy(*a, **k):
        ws_launches.append(k.get("block_b"))
        return real(*a, **k)

    monkeypatch.setattr(fused_sample, "launch_fused_ws", spy)
    W, h = _weights(V_REAL, D, B, dist_ctx.device, seed=1, scale=3.0)
    head = fsdist.ShardedFlashLMHead(D, V_REAL, transport=transport, device=dist_ctx.device)
    head.load_full_weight(W)
    temperature = torch.where(torch.arange(B, device=dist_ctx.device) % 4 == 0, 0.0, 0.8)
    seeds = torch.arange(B, dtype=torch.int64, device=dist_ctx.device) * 7 + 3
    for step in range(4):
        out = head(h, temperature=temperature, seed=seeds, offset=step, return_logprobs=True)
        ref = fsdist.sample(h, W, temperature=temperature, seed=seeds, offset=step, vocab_size=V_REAL,
                            return_logprobs=True)
        assert torch.equal(out.tokens, ref.tokens)
        torch.testing.assert_close(out.logprobs, ref.logprobs, atol=1e-4, rtol=0)
        torch.testing.assert_close(out.logsumexp, ref.logsumexp, atol=1e-4, rtol=0)
        ws_launches.clear()
        plain = head(h, temperature=temperature, seed=seeds, offset=step)
        in_head = list(ws_launches)
        assert torch.equal(plain.tokens, fsdist.sample(h, W, temperature=temperature, seed=seeds, offset=step,
                                                       vocab_size=V_REAL).tokens)
        fused = configs.choose_path(B, D, "cuda", fast_memory=head._reduction.fast_memory) == "fused"
        if fused and HAVE_GLUON and torch.cuda.get_device_capability(dist_ctx.device) == (9, 0):
            assert in_head == [64 if B <= 64 else 128], in_head
    head.close()


@pytest.mark.parametrize("transport", ["nvshmem", "symm_mem", "collective"])
def test_gpu_group_logmass_matches_mirror(dist_ctx, transport):
    _need(transport)
    D, B = 256, 128
    W, h = _weights(V_REAL, D, B, dist_ctx.device, seed=2, scale=3.0)
    head = fsdist.ShardedFlashLMHead(D, V_REAL, transport=transport, reduction="group_logmass",
                                     device=dist_ctx.device)
    head.load_full_weight(W)
    seeds = torch.arange(B, dtype=torch.int64, device=dist_ctx.device) + 11
    out = head(h, temperature=1.0, seed=seeds, offset=5, return_logprobs=True)
    tok, lp, lse, margin = reference_group_logmass(h, W, V_REAL, tp_ranges(V_REAL, dist_ctx.world_size), 1.0,
                                                   seeds, 5)
    decided = margin > 1e-3
    assert decided.sum() >= B - 3
    assert torch.equal(out.tokens.cpu()[decided], tok[decided])
    torch.testing.assert_close(out.logsumexp.cpu().double(), lse, atol=2e-4, rtol=0)
    head.close()


@pytest.mark.parametrize("reduction", ["candidates", "group_logmass"])
@pytest.mark.parametrize("transport", ["nvshmem", "symm_mem"])
def test_gpu_chi_squared_real_vocab_1m_samples(dist_ctx, transport, reduction):
    """>= 1,048,576 samples of one hidden state at V = 128256; chi-squared p > P_MIN (1e-3)."""
    _need(transport)
    D, B, calls = 256, 8192, 128
    W, h1 = _weights(V_REAL, D, 1, dist_ctx.device, seed=3, scale=2.5)
    head = fsdist.ShardedFlashLMHead(D, V_REAL, transport=transport, reduction=reduction, device=dist_ctx.device,
                                     max_batch_size=B)
    head.load_full_weight(W)
    h = h1.expand(B, D).contiguous()
    seeds = torch.arange(B, dtype=torch.int64, device=dist_ctx.device) * 1_000_003 + 17
    counts = torch.zeros(V_REAL, dtype=torch.int64, device=dist_ctx.device)
    scaled, _ = scaled_logits64(h1, W, V_REAL, 1.0)
    logp = torch.log_softmax(scaled[0], 0)
    for c in range(calls):
        out = head(h, temperature=1.0, seed=seeds, offset=c, return_logprobs=(c == 0))
        assert bool((out.tokens >= 0).all()) and bool((out.tokens < V_REAL).all())
        counts += torch.bincount(out.tokens, minlength=V_REAL)
        if c == 0:
            torch.testing.assert_close(out.logprobs.cpu().double(), logp[out.tokens.cpu()], atol=2e-4, rtol=0)
    tokens = torch.repeat_interleave(torch.arange(V_REAL), counts.cpu())
    p, dof = chi2_pvalue(tokens, torch.softmax(scaled[0], 0))
    assert dof > 500
    assert p > P_MIN, f"chi-squared p = {p:.2e} ({dof} dof, {transport}, {reduction})"
    head.close()


def test_gpu_auto_prefers_nvshmem(dist_ctx):
    _need("nvshmem")
    head = fsdist.ShardedFlashLMHead(256, 1000, device=dist_ctx.device)
    if torch.cuda.device_count() >= 2:
        assert head.transport_name == "nvshmem"
    head.close()


@pytest.mark.parametrize("transport", ["nvshmem", "auto"])
def test_gpu_tp2_inside_world4_falls_back_to_symm_mem(dist_ctx, transport, caplog):
    """DP x TP on one host: two TP groups of 2 in a world of 4. NVSHMEM spans the whole job, so
    nvshmem (and auto) become symm_mem, with one fsdist log line saying why; each group samples
    [s, b, D] hidden states from a shared shard and returns fsdist.sample's tokens on the full weight."""
    import logging

    import torch.distributed as dist

    _need(transport)
    if dist_ctx.world_size != 4 or torch.cuda.device_count() < 4:
        pytest.skip("needs 4 ranks on 4 GPUs of one host (launch/torchrun.sh 4 ...)")
    groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    rank, dev = dist_ctx.rank, dist_ctx.device
    D, V, s, b = 1024, 32000, 2, 8
    W, h = _weights(V, D, s * b, dev, seed=6, scale=3.0)
    shard = torch.nn.Parameter(W.view(2, V // 2, D)[rank % 2].clone())  # 32000 = 2 x 16000: no padding
    with caplog.at_level(logging.INFO, logger="fsdist"):
        head = fsdist.ShardedFlashLMHead(D, V, tp_group=groups[rank // 2], transport=transport, weight=shard,
                                         vocab_size_is_true=True, make_vocab_size_divisible_by=16000)
    assert head.transport_name == "symm_mem" and head.weight is shard
    assert any("is not the whole job" in r.getMessage() for r in caplog.records)
    seeds = torch.arange(s * b, dtype=torch.int64, device=dev) * 5 + 1000 * (rank // 2)
    temperature = torch.where(torch.arange(s * b, device=dev) % 4 == 0, 0.0, 0.9)
    for step in range(3):
        out = head(h.view(s, b, D), temperature=temperature.view(s, b), seed=seeds, offset=step, return_logprobs=True)
        ref = fsdist.sample(h, W, temperature=temperature, seed=seeds, offset=step, vocab_size=V, return_logprobs=True)
        assert out.tokens.shape == (s, b) and torch.equal(out.tokens.view(-1), ref.tokens)
        torch.testing.assert_close(out.logprobs.view(-1), ref.logprobs, atol=1e-4, rtol=0)
    head.check()
    head.close()
    for g in groups:
        dist.destroy_process_group(g)


def _graph_problem(dist_ctx, transport, reduction, B=16, D=1024, V=32000):
    """A captured head, a fresh head for eager references (same weight), device-tensor inputs."""
    dev = dist_ctx.device
    W, h = _weights(V, D, B, dev, seed=4, scale=3.0)
    kw = dict(transport=transport, reduction=reduction, device=dev, max_batch_size=B)
    seam = HeadTestSeam()
    head, fresh = fsdist.ShardedFlashLMHead(D, V, test_seam=seam, **kw), fsdist.ShardedFlashLMHead(D, V, **kw)
    head.load_full_weight(W)
    fresh.load_full_weight(W)
    rows = torch.arange(B, device=dev)
    inputs = dict(temperature=torch.where(rows % 3 == 0, 0.0, 0.9), seed=rows * 7 + 1,
                  offset=torch.zeros(B, dtype=torch.int64, device=dev))
    return head, seam, fresh, h, inputs


def _same(a, b):
    return (torch.equal(a.tokens, b.tokens) and torch.equal(a.logprobs, b.logprobs)
            and torch.equal(a.logsumexp, b.logsumexp))


@pytest.mark.parametrize("reduction", ["candidates", "group_logmass"])
@pytest.mark.parametrize("transport", ["nvshmem", "symm_mem", "collective"])
def test_gpu_cuda_graph_replays_alternate_the_exchange_buffers(dist_ctx, transport, reduction):
    """Capture one forward, replay it with new offsets written in place: each replay equals an
    eager forward on a fresh head, and consecutive replays use alternating buffer copies
    (read from the device counter and from the buffers themselves)."""
    import torch.distributed as dist

    _need(transport)
    head, seam, fresh, h, inp = _graph_problem(dist_ctx, transport, reduction)
    B = h.shape[0]
    dev = h.device

    def agree(ok: bool, what: str) -> None:
        # Every check is decided together: a check failing on one rank alone would send that
        # rank on to the next test while its peer waits in this one's barrier (a hang).
        flags = torch.zeros(dist_ctx.world_size, dtype=torch.int32, device=dev)
        flags[dist_ctx.rank] = 0 if ok else 1
        dist.all_reduce(flags)
        bad = flags.nonzero().flatten().tolist()
        if bad:
            print(f"rank {dist_ctx.rank}: check failed: {what}: rank(s) {bad}", file=sys.stderr, flush=True)
        assert not bad, f"{what}: failed on rank(s) {bad}"

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up: Triton compiles, NCCL communicators, first barrier
        for _ in range(2):
            head(h, return_logprobs=True, **inp)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = head(h, return_logprobs=True, **inp)
    agree(int(head.step_counter.item()) == 2, "capturing ran nothing")
    bufs = seam.step_buffers()
    world = dist_ctx.world_size
    parities = []
    for r in range(6):
        inp["offset"].copy_(torch.arange(B, device=dev) + 1000 * r)
        for k in range(bufs.num_buffers):
            bufs.copy(k)[1].fill_(-7)
        torch.cuda.synchronize()
        dist.barrier()  # every rank has filled its buffers before anyone replays
        before = int(head.step_counter.item())
        graph.replay()
        torch.cuda.synchronize()
        dist.barrier()  # every rank's stores of this replay have landed
        agree(int(head.step_counter.item()) == before + 1, f"replay {r} advanced the device counter")
        k = before & 1 if bufs.num_buffers == 2 else 0
        parities.append(k)
        # Each rank's block of the copy in use holds something of this replay (its header at
        # least; a plain call leaves the kept-logit id fields alone), the other copy nothing.
        written = bufs.copy(k)[1].view(world, -1)
        agree(bool((written != -7).any(dim=1).all()), f"replay {r}: every rank wrote into copy {k}")
        if bufs.num_buffers == 2:
            agree(bool((bufs.copy(1 - k)[1] == -7).all()), f"replay {r}: copy {1 - k} untouched")
        ref = fresh(h, return_logprobs=True, **inp)
        agree(_same(out, ref), f"replay {r} equals an eager forward (tokens differ in "
              f"{int((out.tokens != ref.tokens).sum())} rows: {out.tokens.tolist()} vs {ref.tokens.tolist()}; "
              f"max |logprob diff| {float((out.logprobs - ref.logprobs).abs().max()):.3g}, "
              f"max |lse diff| {float((out.logsumexp - ref.logsumexp).abs().max()):.3g})")
    if bufs.num_buffers == 2:
        agree(parities == [0, 1, 0, 1, 0, 1], f"parities {parities}")
    # Back to back, no host sync, eager calls interleaved: replays and eager steps share the counter.
    got, want = [], []
    for r in range(6):
        inp["offset"].fill_(5000 + r)
        if r % 3 == 2:
            got.append(head(h, return_logprobs=True, **inp).tokens)
        else:
            graph.replay()
            got.append(out.tokens.clone())
    for r in range(6):
        inp["offset"].fill_(5000 + r)
        want.append(fresh(h, return_logprobs=True, **inp).tokens)
    agree(all(torch.equal(a, b) for a, b in zip(got, want)), "replays interleaved with eager calls")
    agree(int(head.step_counter.item()) == 2 + 6 + 6 and head.step == 2 + 1 + 2, "step counts")
    del graph
    torch.cuda.synchronize()
    head.close()
    fresh.close()


def test_gpu_graph_capture_does_not_grow_buffers(dist_ctx):
    """The exchange capacity is fixed (max_batch_size); growing it with reserve() is a
    collective allocation: refused while capturing, and after a capture (the graph points
    into the current buffers). A batch over the capacity is refused, graph or not."""
    dev = dist_ctx.device
    W, h = _weights(1000, 256, 40, dev, seed=5)
    head = fsdist.ShardedFlashLMHead(256, 1000, transport="collective", device=dev, max_batch_size=16)
    head.load_full_weight(W)
    head(h[:8])
    torch.cuda.synchronize()
    with pytest.raises(ValueError, match="max_batch_size"):
        head(h)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="during CUDA-graph capture"):
        with torch.cuda.graph(graph):
            head.reserve(40)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        head(h[:8])
    with pytest.raises(RuntimeError, match="graph was captured"):
        head.reserve(40)
    graph.replay()
    torch.cuda.synchronize()
    head.close()


@pytest.mark.parametrize("B", [24, 130])
@pytest.mark.parametrize("transport", ["nvshmem", "symm_mem"])
def test_gpu_filtered_calls_with_fallback_rows_replay_in_a_cuda_graph(dist_ctx, transport, B):
    """The fallback's rounds on peer stores (their barriers gated on the device count of flagged rows,
    transports/gated_barrier.py) are captured with the rest of a filtered call: every replay, with new seeds
    written in place, equals fsdist.sample on the full weight, and some replays resolve rows in the fallback
    (so the gated barriers opened inside the graph, not only skipped). B = 130: three fallback rounds of 64
    rows, the later ones gated on counts above 64 and 128; every rank passes the same number of gated barriers."""
    import torch.distributed as dist

    _need(transport)
    dev = dist_ctx.device
    V, D = 1000, 64
    W, h = _weights(V, D, B, dev, seed=9, scale=3.0)
    head = fsdist.ShardedFlashLMHead(D, V, transport=transport, device=dev, max_batch_size=B)
    head.load_full_weight(W)
    temp = torch.linspace(0.5, 1.5, B, device=dev)
    temp[::6] = 0.0
    def cycle(values, dtype=torch.float32):
        return torch.tensor(values * (B // len(values) + 1), dtype=dtype, device=dev)[:B]

    inp = dict(temperature=temp, top_k=cycle([0, 5, 40, 0, 100, 0], torch.int32),
               top_p=cycle([0.9, 1.0, 0.8, 1.0, 0.95, 0.5]), min_p=cycle([0.0, 0.0, 0.05, 0.1, 0.0, 0.0]),
               seed=torch.arange(B, device=dev) * 7 + 3, offset=torch.zeros(B, dtype=torch.int64, device=dev),
               top_logprobs=3)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            head(h, **inp)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = head(h, **inp)
    bad, fell_back = [], 0
    for r in range(6):
        inp["seed"].copy_(torch.arange(B, device=dev) * 7 + 3 + 1000 * r)
        torch.cuda.synchronize()
        dist.barrier()
        graph.replay()
        torch.cuda.synchronize()
        ref = fsdist.sample(h, W, vocab_size=V, **inp)
        fell_back += int(out.fallback.sum())
        if not (torch.equal(out.tokens, ref.tokens) and torch.equal(out.top_ids, ref.top_ids)):
            bad.append(r)
    head.check()
    epoch = int(head.transport._gate.epoch.item())
    head.close()
    everyone = [None] * dist_ctx.world_size
    dist.all_gather_object(everyone, (bad, fell_back, epoch))
    assert all(not b for b, _, _ in everyone), f"replays whose tokens or top ids differ, per rank: {everyone}"
    assert all(n > 0 for _, n, _ in everyone), f"no row fell back, per rank: {everyone}"
    assert len({e for _, _, e in everyone}) == 1 and everyone[0][2] > 0, f"gated barriers passed, per rank: {everyone}"


@pytest.mark.parametrize("transport", ["nvshmem", "symm_mem"])
def test_gpu_device_step_barriers_equal_the_library_barriers_and_time_out_on_a_skipped_call(dist_ctx, transport,
                                                                                            monkeypatch):
    """The device barrier (fsdist's signal-pad step barriers, the GPU default; a 2 s timeout here): plain, filtered
    and graph-replayed calls give the tokens of a head with the library's barriers (FSDIST_DEVICE_BARRIER=0);
    then the last rank skips a
    call. Before (and with the library's barriers): its peers waited in the step's device barrier forever.
    Now they give up after the timeout, their call returns, and check() raises the mismatch naming the
    timeout on them. The skipper's next call has the very parameters of the call it skipped (only the hidden
    states differ), so no header check can tell: it must raise from the peers' poisoned barrier slots (without
    them its barrier passed on the peers' earlier arrival and its tokens were silently wrong)."""
    import time

    import torch.distributed as dist
    from fsdist.tensor_parallel import TensorParallelMismatchError

    _need(transport)
    dev = dist_ctx.device
    V, D, B = 5000, 128, 24
    W, h = _weights(V, D, B, dev, seed=11, scale=3.0)
    seeds = torch.arange(B, device=dev) * 5 + 1
    heads = {}
    for devbar in (False, True):
        monkeypatch.setenv("FSDIST_DEVICE_BARRIER", "1" if devbar else "0")  # on by default on GPUs
        if devbar:
            monkeypatch.setenv("FSDIST_PEER_TIMEOUT_S", "2")
        heads[devbar] = fsdist.ShardedFlashLMHead(D, V, transport=transport, device=dev, max_batch_size=B)
        monkeypatch.delenv("FSDIST_DEVICE_BARRIER", raising=False)
        monkeypatch.delenv("FSDIST_PEER_TIMEOUT_S", raising=False)
        heads[devbar].load_full_weight(W)
    calls = [dict(temperature=0.8, seed=seeds, offset=1), dict(temperature=1.0, top_k=40, top_p=0.8, seed=seeds,
                                                               offset=2, top_logprobs=2)]
    same = [bool(torch.equal(heads[False](h, **kw).tokens, heads[True](h, **kw).tokens)) for kw in calls]
    temp = torch.full((B,), 0.9, device=dev)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = heads[True](h, temperature=temp, seed=seeds, offset=3)
    graph.replay()
    ref = heads[False](h, temperature=temp, seed=seeds, offset=3)
    same.append(bool(torch.equal(out.tokens, ref.tokens)))
    heads[True].check()
    torch.cuda.synchronize()
    dist.barrier()
    # the last rank skips one call; the others must come back (after ~2 s) and report it
    skipper = dist_ctx.world_size - 1
    t0 = time.perf_counter()
    outcome = "skipped"
    if dist_ctx.rank != skipper:
        try:
            heads[True](h, temperature=0.8, seed=seeds, offset=4)
            heads[True].check()
            outcome = "no error"
        except TensorParallelMismatchError as e:
            outcome = "timeout" if "did not reach" in str(e) else f"other mismatch: {e}"
    waited = time.perf_counter() - t0
    dist.barrier()
    try:  # the same parameters as the skipped call, other hidden states: the poisoned slots must tell
        heads[True](h.flip(0), temperature=0.8, seed=seeds, offset=4)
        heads[True].check()
        after = "no error"
    except TensorParallelMismatchError as e:
        after = "timeout" if "did not reach" in str(e) else f"other mismatch: {e}"
    torch.cuda.synchronize()
    for head in heads.values():
        head.close()
    everyone = [None] * dist_ctx.world_size
    dist.all_gather_object(everyone, dict(same=same, outcome=outcome, waited=waited, after=after))
    for r, o in enumerate(everyone):
        assert all(o["same"]), (r, o)
        assert o["after"] == "timeout", (r, o)
        if r != skipper:
            assert o["outcome"] == "timeout" and 1.5 < o["waited"] < 60, (r, o)
