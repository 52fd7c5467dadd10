"""A single-GPU call's programmatic dependent launches (configs.PDL_STAGE2 / PDL_FALLBACK, sm_90+, v74;
PDL_SELECT_BESIDE_MERGE, v76).

* CPU: fsdist.sample asks for them exactly where the configs say (stage 1 lets stage 2 launch, stage 2 waits;
  select_filtered lets the fallback's first launch start, the fallback chains its launches; the merge lets
  select_filtered launch beside it, which waits late), and nowhere when they are off; the launchers turn them
  off on devices without griddepcontrol (a CPU, the interpreter).
* GPU: the chain gives the results of the launches in order, bit for bit (tokens, logprobs, top-N, fallback
  flags), in eager calls and CUDA-graph replays whose inputs change in place, with rows that do fall back (one
  and two fallback rounds) beside rows that do not. A dependent that read before its predecessor ended would
  see stale candidates, flags or pool rows.
"""
import math

import pytest
import torch

import fsdist
import fsdist.ops.configs as configs
import fsdist.sampling as sampling
from fsdist.ops.utils import pdl_args


def _record(monkeypatch, name, calls, drop, keep=()):
    """Wrap fsdist.sampling's ``name``: record its keyword arguments ``drop`` and call it without them, and those in
    ``keep`` (recorded too) with them."""
    original = getattr(sampling, name)

    def wrapper(*args, **kwargs):
        seen = {k: kwargs.pop(k) for k in drop if k in kwargs}
        seen.update({k: kwargs[k] for k in keep if k in kwargs})
        calls.append((name, seen))
        return original(*args, **kwargs)

    monkeypatch.setattr(sampling, name, wrapper)


@pytest.mark.skipif(torch.cuda.is_available(), reason="calls fsdist.sample on CPU tensors, under the interpreter")
@pytest.mark.parametrize("stage2,fallback", [(True, True), (False, False), (True, False), (False, True)])
def test_sample_asks_for_the_pdl_chain_where_configured(monkeypatch, stage2, fallback):
    """What each launch of a plain and a filtered call is asked for (the GPU decision forced on the CPU, the launches
    then run in order: the interpreter has no griddepcontrol)."""
    monkeypatch.setattr(sampling, "pdl_stage2", lambda device: stage2)
    monkeypatch.setattr(sampling, "pdl_fallback", lambda device: fallback)
    monkeypatch.setattr(sampling, "pdl_select_beside_merge", lambda device: False)
    calls = []
    _record(monkeypatch, "launch_stage1", calls, ["trigger"])
    _record(monkeypatch, "launch_merge", calls, ["pdl_wait"])
    _record(monkeypatch, "launch_select_filtered", calls, ["pdl_wait", "trigger"])
    _record(monkeypatch, "run_fallback", calls, ["pdl"])
    g = torch.Generator().manual_seed(5)
    w = torch.randn(300, 32, generator=g)
    h = torch.randn(3, 32, generator=g)
    # the folded merge (fsdist.sample under the interpreter) leaves no merge launch in a filtered call
    monkeypatch.setattr(sampling, "merge_folds", lambda layout, device: True)
    fsdist.sample(h, w, temperature=0.7, seed=3)
    assert calls == [("launch_stage1", {"trigger": stage2}), ("launch_merge", {"pdl_wait": stage2})]
    calls.clear()
    out = fsdist.sample(h, w, temperature=0.7, seed=3, top_k=5, top_p=0.9)
    assert calls == [("launch_stage1", {"trigger": stage2}),
                     ("launch_select_filtered", {"pdl_wait": stage2, "trigger": fallback}),
                     ("run_fallback", {"pdl": fallback})]
    assert bool((out.tokens >= 0).all())


@pytest.mark.skipif(torch.cuda.is_available(), reason="calls fsdist.sample on CPU tensors, under the interpreter")
@pytest.mark.parametrize("stage2", [False, True])
def test_sample_runs_select_beside_the_merge_where_configured(monkeypatch, stage2):
    """configs.pdl_select_beside_merge (v76): a filtered call launches the merge unfolded, letting select_filtered
    launch at once (``trigger``; with PDL_STAGE2 the merge, not select_filtered, waits for stage 1), and
    select_filtered reads the merge's verdict late (``late``). Under the interpreter the launches run in order: the
    outputs are the folded call's (tokens, flags and top-N bit for bit; logprobs up to fp32 summation order)."""
    monkeypatch.setattr(sampling, "pdl_stage2", lambda device: stage2)
    monkeypatch.setattr(sampling, "pdl_fallback", lambda device: True)
    monkeypatch.setattr(sampling, "merge_folds", lambda layout, device: True)
    g = torch.Generator().manual_seed(6)
    w = torch.randn(300, 32, generator=g)
    h = torch.randn(5, 32, generator=g)
    h[2, 0] = float("nan")  # a row the merge fails: -1 from its verdict, read late
    kw = dict(temperature=torch.tensor([0.7, 0.0, 0.9, 1.1, 0.8]), seed=torch.arange(5) + 3,
              top_k=torch.tensor([5, 5, 0, 0, 3], dtype=torch.int32), top_p=torch.tensor([0.9, 0.9, 1.0, 0.0, 0.8]),
              return_logprobs=True, top_logprobs=2)
    folded = fsdist.sample(h, w, **kw)
    monkeypatch.setattr(sampling, "pdl_select_beside_merge", lambda device: True)
    calls = []
    _record(monkeypatch, "launch_stage1", calls, ["trigger"])
    _record(monkeypatch, "launch_merge", calls, ["pdl_wait", "trigger"])
    # (late and merge reach the launcher: the call really runs select_filtered reading the verdict late)
    _record(monkeypatch, "launch_select_filtered", calls, ["pdl_wait", "trigger"], keep=["late", "merge"])
    beside = fsdist.sample(h, w, **kw)
    assert [c[0] for c in calls] == ["launch_stage1", "launch_merge", "launch_select_filtered"]
    assert calls[1][1] == {"pdl_wait": stage2, "trigger": True}
    assert calls[2][1] == {"pdl_wait": False, "trigger": True, "late": True, "merge": False}
    assert torch.equal(beside.tokens, folded.tokens) and torch.equal(beside.fallback, folded.fallback)
    assert torch.equal(beside.top_ids, folded.top_ids)
    assert beside.tokens[2] == -1 and beside.tokens[3] == -1 and bool((beside.tokens[[0, 1, 4]] >= 0).all())
    torch.testing.assert_close(beside.logprobs, folded.logprobs, rtol=1e-6, atol=1e-6, equal_nan=True)
    torch.testing.assert_close(beside.top_logprobs, folded.top_logprobs, rtol=1e-6, atol=1e-6, equal_nan=True)


def test_pdl_args_off_without_griddepcontrol(monkeypatch):
    """The launchers' switches: both off on a CPU and under the interpreter, on where asked on an sm_90 GPU."""
    off = dict(PDL_WAIT=False, TRIGGER=False)
    assert pdl_args(torch.device("cpu"), wait=True, trigger=True) == off
    assert pdl_args(torch.device("cpu"), trigger=True, late=True) == dict(off, PDL_LATE=False)
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (9, 0))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert pdl_args(torch.device("cuda", 0), wait=True, trigger=True) == off
    if torch.version.hip is None:
        monkeypatch.setenv("TRITON_INTERPRET", "0")
        assert pdl_args(torch.device("cuda", 0), wait=True, trigger=False) == dict(PDL_WAIT=True, TRIGGER=False,
                                                                                  launch_pdl=True)
        assert pdl_args(torch.device("cuda", 0), trigger=True) == dict(PDL_WAIT=False, TRIGGER=True)
        # a late wait (select_filtered beside the merge): its switch, and the programmatic launch it needs
        assert pdl_args(torch.device("cuda", 0), trigger=True, late=True) == dict(PDL_WAIT=False, TRIGGER=True,
                                                                                 PDL_LATE=True, launch_pdl=True)
        monkeypatch.setattr(torch.version, "cuda", "12.2")  # no PDL launch in graph capture before CUDA 12.3
        assert pdl_args(torch.device("cuda", 0), wait=True, trigger=True) == off
        monkeypatch.setattr(torch.version, "cuda", "12.8")
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (8, 0))
        assert pdl_args(torch.device("cuda", 0), wait=True, trigger=True) == off


def test_pdl_switches_follow_the_configs(monkeypatch):
    """Each switch on: only on an sm_90 GPU; off: nowhere. (Shipped: PDL_FALLBACK on, PDL_STAGE2 off, v74;
    PDL_SELECT_BESIDE_MERGE on, v76.)"""
    assert configs.PDL_FALLBACK and not configs.PDL_STAGE2 and configs.PDL_SELECT_BESIDE_MERGE
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (9, 0))
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    dev = torch.device("cuda", 0)
    for flag, fn in (("PDL_STAGE2", configs.pdl_stage2), ("PDL_FALLBACK", configs.pdl_fallback),
                     ("PDL_SELECT_BESIDE_MERGE", configs.pdl_select_beside_merge)):
        monkeypatch.setattr(configs, flag, True)
        assert not fn(torch.device("cpu"))
        if torch.version.hip is None:
            assert fn(dev)
        monkeypatch.setattr(configs, flag, False)
        assert not fn(dev)


def _inputs(B, seed, flat_every):
    """Serving rows ([B] parameters) at V = 151936; every ``flat_every``-th row's hidden scaled down so that its
    top-p nucleus is far larger than the kept logits: those rows fall back."""
    g = torch.Generator().manual_seed(seed)
    D, V = 4096, 151936
    w = (torch.randn(V, D, generator=g) * (2.0 / math.sqrt(D))).cuda().bfloat16()
    h = torch.randn(B, D, generator=g)
    h[::flat_every] *= 0.15
    rows = torch.arange(B, device="cuda")
    params = dict(temperature=(0.6 + 0.4 * torch.rand(B, generator=g)).cuda(), seed=rows * 31 + 7,
                  offset=torch.full((B,), 3, device="cuda", dtype=torch.int64))
    return h.cuda().bfloat16(), w, params


def _same(a, b, what):
    for name in ("tokens", "logprobs", "top_ids", "top_logprobs", "fallback"):
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None), f"{what}: {name}"
        if x is not None:
            x, y = (x.view(torch.int32), y.view(torch.int32)) if x.dtype == torch.float32 else (x, y)
            assert torch.equal(x, y), f"{what}: {name} differ"


@pytest.mark.gpu
@pytest.mark.parametrize("B", [1, 16, 32, 64, 80])
def test_pdl_chain_is_bit_for_bit(monkeypatch, B):
    """PDL on against PDL off: plain, top-p with top-N logprobs, top-k + top-p, min-p; eager and 12 graph replays whose
    offsets and hidden change in place. B = 80: two fallback rounds (POOL_ROWS = 64), all rows but a few flat.
    On: every switch (stage 2 behind stage 1, the fallback's chain, select_filtered beside the merge, v76); off: the
    launches in order with the merge unfolded (the same kernels; the folded merge sums logprobs in another order),
    and the folded call's tokens, flags and top-N too."""
    if not configs.pdl_supported(torch.device("cuda")):
        pytest.skip("programmatic dependent launch needs compute capability 9.0+")
    h, w, params = _inputs(B, seed=700 + B, flat_every=1 if B == 80 else 3)
    if B == 80:
        h[1::9] *= 6.0  # a few peaked rows the kept logits prove
    cases = {"plain": dict(return_logprobs=True),
             # top-p alone: a flat row's nucleus is far more than the kept logits (top-k 50 would bound it)
             "top_p": dict(top_p=torch.full((B,), 0.95, device="cuda"), top_logprobs=3, return_logprobs=True,
                           logprobs_mode="processed"),
             "top_k+top_p": dict(top_k=torch.full((B,), 50, dtype=torch.int32, device="cuda"),
                                 top_p=torch.full((B,), 0.9, device="cuda"), return_logprobs=True),
             "min_p": dict(min_p=torch.full((B,), 0.05, device="cuda"), return_logprobs=True)}
    fell = 0
    for name, kw in cases.items():
        def run(pdl, fold=False):
            monkeypatch.setattr(configs, "PDL_STAGE2", pdl)
            monkeypatch.setattr(configs, "PDL_FALLBACK", pdl)
            monkeypatch.setattr(configs, "PDL_SELECT_BESIDE_MERGE", pdl)
            monkeypatch.setattr(sampling, "merge_folds", lambda layout, device: fold)
            return fsdist.sample(h, w, **params, **kw)

        in_order, chained, folded = run(False), run(True), run(False, fold=True)
        _same(chained, in_order, f"{name} eager")
        for field in ("tokens", "top_ids", "fallback"):
            assert torch.equal(getattr(chained, field), getattr(folded, field)) if getattr(folded, field) is not None \
                else getattr(chained, field) is None, f"{name}: {field} differ from the folded call's"
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = run(True)
        for step in range(12):
            params["offset"].fill_(20 + step)
            h[step % B].mul_(-1.0)
            graph.replay()
            _same(captured, run(False), f"{name} replay {step}")
        if captured.fallback is not None:
            fell += int(captured.fallback.sum())
            if B == 80 and name == "top_p":
                assert int(captured.fallback.sum()) > 64, "meant to run two fallback rounds"
    if B > 1:
        assert fell > 0, "no row fell back: the fallback's chain was not exercised"
