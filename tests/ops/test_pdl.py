"""Programmatic dependent launch of the small kernels after stage 1 (fsdist.ops.utils.PDL).

On CPU: the switch is off wherever it cannot apply (no CUDA device, the interpreter). On an sm_90 GPU:
the same call with PDL on and off gives the same bits (tokens, logprobs, top-N, fallback flags), eager and
as a CUDA graph, on a batch whose flat rows go through the fallback's rounds (every PDL kernel runs).
"""
import math

import pytest
import torch

import fsdist
import fsdist.ops.utils as utils


def test_pdl_is_off_on_cpu_and_when_switched_off(monkeypatch):
    assert not utils.pdl_ok(torch.device("cpu"))
    monkeypatch.setattr(utils, "PDL", False)
    assert not utils.pdl_ok(torch.device("cuda", 0))  # decided before any CUDA query


def _call(h, w, params, **kw):
    return fsdist.sample(h, w, return_logprobs=True, top_logprobs=3, top_k=params["top_k"], top_p=params["top_p"],
                         temperature=params["temperature"], seed=params["seed"], offset=params["offset"], **kw)


def _bits(out):
    return [out.tokens, out.logprobs.view(torch.int32), out.top_ids, out.top_logprobs.view(torch.int32),
            out.fallback]


@pytest.mark.gpu
def test_pdl_gives_the_same_bits_eager_and_in_a_graph(monkeypatch):
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("needs an sm_90+ GPU")
    assert utils.pdl_ok(torch.device("cuda")), "PDL should be on for this GPU (FSDIST_PDL=0 set?)"
    B, D, V = 16, 512, 151936
    g = torch.Generator().manual_seed(5)
    w = (torch.randn(V, D, generator=g) * (2.0 / math.sqrt(D))).cuda().bfloat16()
    h = torch.randn(B, D, generator=g).cuda().bfloat16()
    h[::2] = 0  # flat rows: every logit 0, a nucleus of ~0.9 V that the kept logits cannot prove
    rows = torch.arange(B, device="cuda")
    params = dict(temperature=torch.full((B,), 0.8, device="cuda"), seed=rows * 7 + 1, offset=rows * 0 + 2,
                  top_k=torch.where(rows % 4 == 1, 20, 0).to(torch.int32), top_p=torch.full((B,), 0.9, device="cuda"))
    results = {}
    for on in (True, False):
        monkeypatch.setattr(utils, "PDL", on)
        eager = _call(h, w, params)
        static_h = h.clone()
        _call(static_h, w, params)  # compile before capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = _call(static_h, w, params)
        graph.replay()
        torch.cuda.synchronize()
        results[on] = (eager, captured)
    on_eager, on_graph = results[True]
    off_eager, off_graph = results[False]
    assert bool(on_eager.fallback[::2].all()), "the flat rows should have gone through the fallback"
    for a, b, c, d in zip(_bits(on_eager), _bits(on_graph), _bits(off_eager), _bits(off_graph)):
        assert torch.equal(a, c) and torch.equal(b, d) and torch.equal(a, b)
