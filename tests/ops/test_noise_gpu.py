"""The noise's PTX forms (fsdist/ops/noise.py, docs/performance.md v97) give the bits of the contract.

GPU (CUDA) only: the interpreter has no PTX. Since v97 a CUDA kernel draws the sampler's noise with one
``mul.wide.u32`` per Philox product (``noise._philox_wide``, where ``tl.philox`` asks for the product's
high and low halves separately) and with ``lg2.approx.ftz.f32`` and one fused multiply-add in the
uniform-to-Gumbel transform. Neither may change a bit:

* the transform is checked on **every** 32-bit input (2**32 of them, a fraction of a second on a GPU)
  against the instructions before v97 (``noise.LEGACY_PTX``), the exponential and the Gumbel variate both,
  bit for bit, and every Gumbel variate finite;
* the Philox words against ``tl.philox`` on 2**18 counters under each of 64 random keys (and the extreme ones),
  and against the torch mirror (``fsdist.reference``) on random (seed, offset, id) triples.

Each comparison can fail: the transform's count finds exactly three inputs planted with a one-bit change, and
7 Philox rounds against 10 differ on almost every counter in the same kernel.
"""
import pytest
import torch
import triton
import triton.language as tl

from fsdist.ops.noise import (LEGACY_PTX, STREAM_GROUP, STREAM_VOCAB, exponential_from_bits, gumbel_from_bits,
                              philox_words, vocab_bits, vocab_bits_tile)
from fsdist.reference import vocab_uniform_bits

pytestmark = pytest.mark.gpu

BLOCK = 1024
ITERS = 256  # inputs a program walks: BLOCK * ITERS


@triton.jit
def _transform_mismatches(count_ptr, start, n, FAST_A: tl.constexpr, FAST_B: tl.constexpr, BLOCK: tl.constexpr,
                          ITERS: tl.constexpr, PLANT: tl.constexpr = False):
    """count[0] += inputs r in [start, start + n) whose exponential or Gumbel variate differs in any bit between
    FAST_A and FAST_B; count[1] += those whose FAST_A Gumbel variate is not finite. PLANT (the check's power): the
    FAST_B side reads r ^ 2**12 for the three inputs 0, 2**31 and 2**32 - 1 (the ends of both halves; bit 12, since
    near 2**31 the uniform's 24-bit mantissa does not see the lowest bits)."""
    base = start + tl.program_id(0).to(tl.int64) * (BLOCK * ITERS)
    diff = tl.zeros([BLOCK], tl.int32)
    inf = tl.zeros([BLOCK], tl.int32)
    for it in range(ITERS):
        idx = base + it * BLOCK + tl.arange(0, BLOCK)
        m = idx < start + n
        r = (idx & 0xFFFFFFFF).to(tl.uint32)
        rb = r
        if PLANT:
            rb = tl.where((r == 0) | (r == 0x80000000) | (r == 0xFFFFFFFF), r ^ 0x1000, r)
        ea = exponential_from_bits(r, FAST_A).to(tl.int32, bitcast=True)
        eb = exponential_from_bits(rb, FAST_B).to(tl.int32, bitcast=True)
        ga = gumbel_from_bits(r, FAST_A)
        gb = gumbel_from_bits(rb, FAST_B)
        differ = (ea != eb) | (ga.to(tl.int32, bitcast=True) != gb.to(tl.int32, bitcast=True))
        diff += (differ & m).to(tl.int32)
        inf += ((tl.abs(ga) < float("inf")) == 0).to(tl.int32) * m.to(tl.int32)
    tl.atomic_add(count_ptr, tl.sum(diff, axis=0))
    tl.atomic_add(count_ptr + 1, tl.sum(inf, axis=0))


def _transform_counts(fast_a, fast_b, plant=False):
    n = 2**32
    count = torch.zeros(2, dtype=torch.int64, device="cuda")
    grid = (triton.cdiv(n, BLOCK * ITERS), )
    _transform_mismatches[grid](count, 0, n, FAST_A=fast_a, FAST_B=fast_b, BLOCK=BLOCK, ITERS=ITERS, PLANT=plant)
    return count.tolist()


def test_ptx_transform_keeps_every_bit_of_every_input():
    """All 2**32 inputs: the shipped PTX transform (lg2.approx.ftz, one fma) = the legacy one, bit for bit."""
    mismatches, not_finite = _transform_counts(True, LEGACY_PTX)
    assert mismatches == 0, f"{mismatches} of 2**32 inputs changed their noise bits"
    assert not_finite == 0, f"{not_finite} Gumbel variates are not finite"


def test_transform_check_can_fail():
    """The same exhaustive count finds exactly the three inputs planted with a one-bit change (the halves' ends)."""
    assert _transform_counts(True, LEGACY_PTX, plant=True) == [3, 0]


@triton.jit
def _philox_mismatches(count_ptr, seed_ptr, off_ptr, cbase_ptr, STREAM: tl.constexpr, ROUNDS_A: tl.constexpr,
                       PTX_A: tl.constexpr, ROUNDS_B: tl.constexpr, PTX_B: tl.constexpr, BLOCK: tl.constexpr,
                       ITERS: tl.constexpr):
    """count[0] += counters whose four Philox words differ between (ROUNDS_A, PTX_A) and (ROUNDS_B, PTX_B), under
    program p's key (seed[p], offset[p]), counters cbase[p] + [0, BLOCK * ITERS)."""
    p = tl.program_id(0)
    seed = tl.load(seed_ptr + p)
    off = tl.load(off_ptr + p)
    cbase = tl.load(cbase_ptr + p)
    diff = tl.zeros([BLOCK], tl.int32)
    for it in range(ITERS):
        c = cbase + it * BLOCK + tl.arange(0, BLOCK)
        a0, a1, a2, a3 = philox_words(seed, off, c, STREAM, ROUNDS_A, PTX_A)
        b0, b1, b2, b3 = philox_words(seed, off, c, STREAM, ROUNDS_B, PTX_B)
        diff += ((a0 != b0) | (a1 != b1) | (a2 != b2) | (a3 != b3)).to(tl.int32)
    tl.atomic_add(count_ptr, tl.sum(diff, axis=0))


def _philox_count(stream, rounds_a, ptx_a, rounds_b, ptx_b, programs=64):
    g = torch.Generator().manual_seed(97)
    seed = torch.randint(-(2**62), 2**62, (programs, ), generator=g)
    seed[:4] = torch.tensor([0, -1, 2**63 - 1, -(2**63)])
    off = torch.randint(0, 2**62, (programs, ), generator=g)
    off[:4] = torch.tensor([0, 2**32 - 1, 2**32, 2**62 - 1])
    # counters reach 2**31 - 1 (the largest id) and wrap through negative int32 (their uint32 bits past 2**31)
    cbase = torch.randint(-(2**31), 2**31 - BLOCK * ITERS, (programs, ), generator=g, dtype=torch.int64)
    cbase[:2] = torch.tensor([0, 2**31 - BLOCK * ITERS])
    count = torch.zeros(1, dtype=torch.int64, device="cuda")
    _philox_mismatches[(programs, )](count, seed.cuda(), off.cuda(), cbase.to(torch.int32).cuda(), STREAM=stream,
                                     ROUNDS_A=rounds_a, PTX_A=ptx_a, ROUNDS_B=rounds_b, PTX_B=ptx_b, BLOCK=BLOCK,
                                     ITERS=ITERS)
    return count.item()


@pytest.mark.parametrize("stream", [STREAM_VOCAB, STREAM_GROUP])
def test_ptx_philox_words_equal_tl_philox(stream):
    """2**18 counters under each of 64 keys (2**24 in all; the extreme seeds and offsets among them): the same four
    words."""
    assert _philox_count(stream, 10, True, 10, False) == 0


def test_philox_check_can_fail():
    """7 rounds against 10 differ on (almost) every counter in the same comparison."""
    assert _philox_count(STREAM_VOCAB, 7, True, 10, False, programs=4) > 4 * BLOCK * ITERS * 0.99


@triton.jit
def _vocab_ptx_probe(seed_ptr, off_ptr, id_ptr, bits_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    seed = tl.load(seed_ptr + i, mask=m, other=0)
    off = tl.load(off_ptr + i, mask=m, other=0)
    vid = tl.load(id_ptr + i, mask=m, other=0).to(tl.int32)
    tl.store(bits_ptr + i, vocab_bits(seed, off, vid, True).to(tl.int64), mask=m)


@triton.jit
def _tile_ptx_probe(seed_ptr, off_ptr, bits_ptr, first_id, BB: tl.constexpr, BV: tl.constexpr):
    b = tl.arange(0, BB)
    seed = tl.load(seed_ptr + b)[:, None]
    off = tl.load(off_ptr + b)[:, None]
    bits = vocab_bits_tile(seed, off, first_id, BB, BV, True)
    tl.store(bits_ptr + b[:, None] * BV + tl.arange(0, BV)[None, :], bits.to(tl.int64))


def test_ptx_vocab_bits_match_torch_mirror():
    """The PTX Philox path against fsdist.reference's mirror: per id and as a tile of whole quads."""
    g = torch.Generator().manual_seed(971)
    n = 1 << 16
    seed = torch.randint(-(2**62), 2**62, (n, ), generator=g)
    seed[:3] = torch.tensor([0, -1, 2**63 - 1])
    off = torch.randint(0, 2**40, (n, ), generator=g)
    vid = torch.randint(0, 2**31 - 1, (n, ), generator=g)
    bits = torch.empty(n, dtype=torch.int64, device="cuda")
    _vocab_ptx_probe[(triton.cdiv(n, 1024), )](seed.cuda(), off.cuda(), vid.cuda(), bits, n, BLOCK=1024)
    assert torch.equal(bits.cpu(), vocab_uniform_bits(seed, off, vid))
    BB, BV, first = 16, 128, 4 * 37987
    tile = torch.empty(BB, BV, dtype=torch.int64, device="cuda")
    _tile_ptx_probe[(1, )](seed[:BB].cuda(), off[:BB].cuda(), tile, first, BB=BB, BV=BV)
    ids = first + torch.arange(BV)[None, :]
    assert torch.equal(tile.cpu(), vocab_uniform_bits(seed[:BB, None], off[:BB, None], ids))
