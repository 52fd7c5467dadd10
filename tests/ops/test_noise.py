"""The RNG contract at its source: fsdist.ops.noise against its torch mirror."""
import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from scipy import stats

from fsdist.ops.noise import (STREAM_GROUP, STREAM_VOCAB, exponential_from_bits, gumbel, gumbel_from_bits, philox_bits,
                              vocab_bits, vocab_bits_tile)
from fsdist.reference import gumbel_noise, philox_uniform_bits, philox_words, vocab_gumbel, vocab_uniform_bits
from statcheck import P_MIN


@triton.jit
def _noise_probe(seed_ptr, off_ptr, id_ptr, bits_ptr, g_ptr, n, STREAM: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    seed = tl.load(seed_ptr + i, mask=m, other=0)
    off = tl.load(off_ptr + i, mask=m, other=0)
    vid = tl.load(id_ptr + i, mask=m, other=0).to(tl.int32)  # ids are int32 in the sampler
    tl.store(bits_ptr + i, philox_bits(seed, off, vid, STREAM).to(tl.int64), mask=m)
    tl.store(g_ptr + i, gumbel(seed, off, vid, STREAM), mask=m)


@triton.jit
def _vocab_probe(seed_ptr, off_ptr, id_ptr, bits_ptr, g_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    seed = tl.load(seed_ptr + i, mask=m, other=0)
    off = tl.load(off_ptr + i, mask=m, other=0)
    vid = tl.load(id_ptr + i, mask=m, other=0).to(tl.int32)
    bits = vocab_bits(seed, off, vid)
    tl.store(bits_ptr + i, bits.to(tl.int64), mask=m)
    tl.store(g_ptr + i, gumbel_from_bits(bits), mask=m)


@triton.jit
def _tile_probe(seed_ptr, off_ptr, bits_ptr, first_id, BB: tl.constexpr, BV: tl.constexpr):
    b = tl.arange(0, BB)
    seed = tl.load(seed_ptr + b)[:, None]
    off = tl.load(off_ptr + b)[:, None]
    bits = vocab_bits_tile(seed, off, first_id, BB, BV)
    tl.store(bits_ptr + b[:, None] * BV + tl.arange(0, BV)[None, :], bits.to(tl.int64))


@triton.jit
def _fast_probe(bits_ptr, g_ptr, n, FAST: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    r = tl.load(bits_ptr + i, mask=m, other=0).to(tl.uint32)
    tl.store(g_ptr + i, gumbel_from_bits(r, FAST), mask=m)


@pytest.mark.gpu
def test_fast_log_gumbel_close_to_accurate():
    """The lg2.approx path used on CUDA stays within 1e-5 of libdevice logs over the whole range."""
    bits = torch.cat([torch.randint(0, 2**32, (1 << 20,), dtype=torch.int64),
                      torch.tensor([0, 1, 2**31 - 1, 2**31, 2**32 - 2, 2**32 - 1])]).cuda()
    out = [torch.empty(bits.numel(), device="cuda") for _ in range(2)]
    for fast, o in zip((False, True), out):
        _fast_probe[(triton.cdiv(bits.numel(), 1024),)](bits, o, bits.numel(), FAST=fast, BLOCK=1024)
    assert torch.isfinite(out[1]).all()
    assert (out[0] - out[1]).abs().max() < 1e-5


@triton.jit
def _exp_probe(bits_ptr, e_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    r = tl.load(bits_ptr + i, mask=m, other=0).to(tl.uint32)
    tl.store(e_ptr + i, exponential_from_bits(r), mask=m)


def _run(seed, off, vid, device, stream=STREAM_VOCAB):
    n = seed.numel()
    bits = torch.empty(n, dtype=torch.int64, device=device)
    g = torch.empty(n, dtype=torch.float32, device=device)
    _noise_probe[(triton.cdiv(n, 1024),)](seed.to(device), off.to(device), vid.to(device), bits, g, n,
                                          STREAM=stream, BLOCK=1024)
    return bits.cpu(), g.cpu()


@pytest.mark.parametrize("stream", [STREAM_VOCAB, STREAM_GROUP])
def test_kernel_philox_matches_torch_mirror(device, stream):
    gen = torch.Generator().manual_seed(1)
    n = 4096
    # Extreme keys too: negative seeds, offsets past 2**32, ids near 2**31.
    seed = torch.randint(-(2**62), 2**62, (n,), generator=gen)
    seed[:3] = torch.tensor([0, -1, 2**63 - 1])
    off = torch.randint(0, 2**40, (n,), generator=gen)
    vid = torch.randint(0, 2**31 - 1, (n,), generator=gen)
    bits, g = _run(seed, off, vid, device, stream)
    torch.testing.assert_close(bits, philox_uniform_bits(seed, off, vid, stream), rtol=0, atol=0)
    torch.testing.assert_close(g.double(), gumbel_noise(seed, off, vid, stream), rtol=2e-6, atol=2e-6)


def test_vocab_noise_matches_torch_mirror(device):
    gen = torch.Generator().manual_seed(2)
    n = 4096
    seed = torch.randint(-(2**62), 2**62, (n,), generator=gen)
    off = torch.randint(0, 2**40, (n,), generator=gen)
    vid = torch.randint(0, 2**31 - 1, (n,), generator=gen)
    bits = torch.empty(n, dtype=torch.int64, device=device)
    g = torch.empty(n, dtype=torch.float32, device=device)
    _vocab_probe[(triton.cdiv(n, 1024),)](seed.to(device), off.to(device), vid.to(device), bits, g, n, BLOCK=1024)
    torch.testing.assert_close(bits.cpu(), vocab_uniform_bits(seed, off, vid), rtol=0, atol=0)
    torch.testing.assert_close(g.cpu().double(), vocab_gumbel(seed, off, vid), rtol=2e-6, atol=2e-6)
    # The four ids of a quad use four different words of one Philox evaluation.
    quad = vocab_uniform_bits(5, 9, torch.arange(8, 12))
    assert torch.equal(quad, torch.stack(philox_words(5, 9, 2, 0)))


@pytest.mark.parametrize("BB,BV,first", [(16, 64, 0), (4, 128, 4 * 12345), (2, 16, 2**30)])
def test_vocab_tile_noise_equals_per_id_noise(device, BB, BV, first):
    seed = torch.arange(BB, dtype=torch.int64) * 31 - 7
    off = torch.arange(BB, dtype=torch.int64) + 2**34
    bits = torch.empty(BB, BV, dtype=torch.int64, device=device)
    _tile_probe[(1,)](seed.to(device), off.to(device), bits, first, BB=BB, BV=BV)
    ids = first + torch.arange(BV)[None, :]
    torch.testing.assert_close(bits.cpu(), vocab_uniform_bits(seed[:, None], off[:, None], ids), rtol=0, atol=0)


def test_streams_differ(device):
    n = 256
    seed, off, vid = torch.zeros(n, dtype=torch.int64), torch.zeros(n, dtype=torch.int64), torch.arange(n)
    a, _ = _run(seed, off, vid, device, STREAM_VOCAB)
    b, _ = _run(seed, off, vid, device, STREAM_GROUP)
    assert (a != b).float().mean() > 0.99


def test_exponential_is_accurate_at_both_ends(device):
    # u -> 0 (E large) and u -> 1 (E tiny, where a naive -log(u) in fp32 returns 0).
    bits = torch.tensor([0, 1, 2**31 - 1, 2**31, 2**32 - 2**20, 2**32 - 2, 2**32 - 1], dtype=torch.int64)
    e = torch.empty(bits.numel(), dtype=torch.float32, device=device)
    _exp_probe[(1,)](bits.to(device), e, bits.numel(), BLOCK=16)
    u = (bits.double() + 0.5) / 2**32
    expect = -torch.log1p(-(2**32 - 1 - bits.double() + 0.5) / 2**32)
    expect = torch.where(u < 0.5, -torch.log(u), expect)
    assert torch.isfinite(e).all() and (e > 0).all()
    torch.testing.assert_close(e.cpu().double(), expect, rtol=1e-6, atol=0)


def test_gumbel_distribution(device):
    n = 200_000
    seed = torch.full((n,), 12345, dtype=torch.int64)
    off = torch.full((n,), 7, dtype=torch.int64)
    _, g = _run(seed, off, torch.arange(n), device)
    assert torch.isfinite(g).all()
    p = stats.kstest(g.double().numpy(), stats.gumbel_r.cdf).pvalue
    assert p > P_MIN, f"Gumbel noise fails KS test, p={p:.2e}"
    # Upper tail: P(g > 8) = 1 - exp(-exp(-8)) ~ 3.35e-4, i.e. ~67 of 200k.
    tail = int((g > 8).sum())
    assert stats.poisson.cdf(tail, n * -np.expm1(-np.exp(-8.0))) > P_MIN / 2
    assert stats.poisson.sf(tail - 1, n * -np.expm1(-np.exp(-8.0))) > P_MIN / 2
