"""Hidden states [..., D] in fsdist.sample (fsdist/rows.py): the outputs come back with the
leading shape, per-row parameters are [...] or flattened [N], tables [..., K] or [N, K].

Each case is compared with the same call on the flattened [N, D] rows, which the rest of the
suite tests against the float64 references. The tensor-parallel head's [s, b, h] case is in
tests/tensor_parallel/test_layers.py.
"""
import pytest
import torch

import fsdist

V, D = 300, 16


def _problem(lead, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(*lead, D, generator=g)
    w = torch.randn(V + 20, D, generator=g) * 2
    t = torch.rand(*lead, generator=g) + 0.5
    seeds = torch.randint(0, 2**40, lead, generator=g)
    return h, w, t, seeds


def _equal(a, b):
    for x, y in zip(a, b):
        assert (x is None) == (y is None)
        if x is not None:
            assert torch.equal(x.reshape(y.shape), y) if x.dtype != torch.float32 else \
                torch.allclose(x.reshape(y.shape), y, equal_nan=True)


def test_megatron_layout_matches_flat_rows():
    """[s, b, D] with [s, b] parameters (and [N] ones) == the flattened call, field by field."""
    lead = (3, 4)
    h, w, t, seeds = _problem(lead)
    N = 12
    kw = dict(offset=7, vocab_size=V, return_logprobs=True, top_logprobs=3)
    out = fsdist.sample(h, w, temperature=t, seed=seeds, top_k=torch.full(lead, 25), **kw)
    flat = fsdist.sample(h.reshape(N, D), w, temperature=t.reshape(N), seed=seeds.reshape(N), top_k=25, **kw)
    assert out.tokens.shape == lead and out.logprobs.shape == lead and out.logsumexp.shape == lead
    assert out.top_ids.shape == lead + (3,) and out.top_logprobs.shape == lead + (3,) and out.fallback.shape == lead
    _equal(out, flat)
    mixed = fsdist.sample(h, w, temperature=t.reshape(N), seed=seeds, top_k=25, **kw)  # [N] and [s, b] together
    _equal(mixed, flat)


def test_processors_take_leading_shape_or_flat_rows():
    lead = (2, 3)
    N = 6
    h, w, t, seeds = _problem(lead, seed=1)
    g = torch.Generator().manual_seed(5)
    mask = torch.randint(-2**31, 2**31 - 1, (*lead, (V + 31) // 32), generator=g, dtype=torch.int64).to(torch.int32)
    bias = fsdist.SparseLogits(torch.randint(0, V, (*lead, 2), generator=g), torch.randn(*lead, 2, generator=g) * 3)
    pen = fsdist.Penalties(repetition=torch.rand(*lead, generator=g) + 0.8, frequency=0.2, presence=0.1,
                           output_ids=torch.randint(-1, V, (*lead, 5), generator=g),
                           prompt_ids=torch.randint(-1, V, (*lead, 4), generator=g))
    out = fsdist.sample(h, w, temperature=t, seed=seeds, vocab_size=V, token_bitmask=mask, logit_bias=bias,
                        penalties=pen, return_logprobs=True)
    flat_pen = fsdist.Penalties(pen.repetition.reshape(N), 0.2, 0.1, pen.output_ids.reshape(N, 5),
                                pen.prompt_ids.reshape(N, 4))
    flat = fsdist.sample(h.reshape(N, D), w, temperature=t.reshape(N), seed=seeds.reshape(N), vocab_size=V,
                         token_bitmask=mask.reshape(N, -1), logit_bias=(bias.ids.reshape(N, 2), bias.values.reshape(N, 2)),
                         penalties=flat_pen, return_logprobs=True)
    _equal(out, flat)
    # flattened tables with [s, b, D] hidden states
    again = fsdist.sample(h, w, temperature=t, seed=seeds, vocab_size=V, token_bitmask=mask.reshape(N, -1),
                          logit_bias=bias, penalties=flat_pen, return_logprobs=True)
    _equal(again, flat)


def test_non_contiguous_and_empty_leading_shapes():
    h, w, t, seeds = _problem((3, 4), seed=2)
    a = fsdist.sample(h, w, temperature=t, seed=seeds, offset=1, vocab_size=V)
    b = fsdist.sample(h.transpose(0, 1), w, temperature=t.t(), seed=seeds.t().reshape(12), offset=1, vocab_size=V)
    assert torch.equal(b.tokens, a.tokens.t())
    empty = fsdist.sample(torch.zeros(0, 5, D), w, vocab_size=V, return_logprobs=True)
    assert empty.tokens.shape == (0, 5) and empty.logprobs.shape == (0, 5)
    one = fsdist.sample(h[:1, :1], w, seed=seeds[:1, :1], vocab_size=V)  # [1, 1, D]: Megatron's decode step at b=1
    assert one.tokens.shape == (1, 1)


@pytest.mark.parametrize("kwargs,match", [
    (dict(temperature=torch.ones(4, 3)), r"temperature tensor must have hidden's leading shape \[3, 4\] or the "
                                         r"flattened shape \[12\]"),
    (dict(seed=torch.zeros(3, 4, 1, dtype=torch.int64)), r"seed tensor must have hidden's leading shape"),
    (dict(token_bitmask=torch.zeros(4, 3, 10, dtype=torch.int32)), r"token_bitmask must have shape \[3, 4, K\]"),
    (dict(logit_bias=fsdist.SparseLogits(torch.zeros(2, 6, 1, dtype=torch.int64), torch.zeros(2, 6, 1))),
     r"logit_bias.ids must have shape"),
    (dict(penalties=fsdist.Penalties(repetition=torch.ones(12, 1))), r"penalties.repetition tensor must have"),
])
def test_shape_errors_name_both_shapes(kwargs, match):
    h, w, _, _ = _problem((3, 4), seed=3)
    with pytest.raises(ValueError, match=match):
        fsdist.sample(h, w, vocab_size=V, **kwargs)


def test_one_dimensional_hidden_is_refused():
    with pytest.raises(ValueError, match=r"hidden must be 2-D \[B, D\] or more, \[\.\.\., D\]"):
        fsdist.sample(torch.zeros(D), torch.zeros(V, D))
