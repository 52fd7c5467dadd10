"""Counter-based Gumbel noise: the single definition of fsdist's RNG contract.

The uniform for (row b, vocabulary id v) is Philox-4x32-10 keyed by the row's
64-bit seed, with counter (v, offset_lo, offset_hi, stream). Nothing here depends
on tile sizes, the batch position of the row or the tensor-parallel rank, so every
kernel that calls :func:`gumbel` with a *global* vocabulary id draws the same
noise. ``fsdist.reference.philox_uniform_bits`` mirrors this bit for bit in torch.

Precision matters at the top of the Gumbel distribution: the winning score sits
where ``u`` is within ~1/V of 1, and a 24-bit uniform would put a V/2**24 ~ 1%
chance of an exact tie on the winner for V ~ 150k (ties go to the lowest index:
a measurable bias). So we keep all 32 bits and evaluate ``E = -log(u)`` from
``1 - u`` when ``u`` is close to 1, where ``1 - u`` is exact in fp32.
"""
import triton
import triton.language as tl

# Streams separate independent uses of the same (seed, offset) key.
# (tl.constexpr so that kernels may read them as globals.)
STREAM_VOCAB = tl.constexpr(0)  # per-vocabulary-id noise of the sampler
STREAM_GROUP = tl.constexpr(1)  # per-rank noise of the group-log-mass reduction


@triton.jit
def philox_bits(seed, offset, counter, stream: tl.constexpr):
    """One 32-bit Philox output for key `seed` (int64) and counter (counter, offset, stream)."""
    off = offset.to(tl.uint64, bitcast=True)
    off_lo = (off & 0xFFFFFFFF).to(tl.uint32)
    off_hi = (off >> 32).to(tl.uint32)
    c0 = counter.to(tl.uint32, bitcast=True)
    # Broadcast every word to the counter's shape so the rounds stay elementwise.
    zero = tl.zeros_like(c0)
    r0, _r1, _r2, _r3 = tl.philox(seed.to(tl.int64), c0, off_lo + zero, off_hi + zero, zero + stream)
    return r0


@triton.jit
def exponential_from_bits(r):
    """E = -log(u) for u = (r + 0.5) / 2**32, accurate also when u is within 2**-32 of 1."""
    u = (r.to(tl.float32) + 0.5) * 2.3283064365386963e-10
    # 1 - u, exact: (~r + 0.5) / 2**32.
    x = ((r ^ 0xFFFFFFFF).to(tl.float32) + 0.5) * 2.3283064365386963e-10
    upper = r >= 0x80000000
    # -log(1 - x) by its series where 1 - x would round away the information.
    series = x * (1.0 + x * (0.5 + x * (0.3333333333 + x * (0.25 + x * (0.2 + x * 0.1666666667)))))
    logged = -tl.log(tl.where(upper, 1.0 - x, u))
    return tl.where(upper & (x < 0.03125), series, logged)


@triton.jit
def gumbel(seed, offset, vocab_id, stream: tl.constexpr):
    """Standard Gumbel noise for (seed, offset, vocab_id); finite for every input."""
    return -tl.log(exponential_from_bits(philox_bits(seed, offset, vocab_id, stream)))
