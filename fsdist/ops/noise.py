"""Counter-based Gumbel noise: the single definition of fsdist's RNG contract.

The uniform for (row b, vocabulary id v) is word ``v & 3`` of Philox-4x32-10 keyed by
the row's 64-bit seed, with counter (v >> 2, offset_lo, offset_hi, STREAM_VOCAB): one
Philox evaluation feeds four consecutive ids, a quarter of the integer work of one
call per id (the epilogue's largest cost once B grows). Nothing here depends on tile
sizes, the batch position of the row or the tensor-parallel rank, so every kernel
that asks for a *global* vocabulary id draws the same noise. Other uses (the
group-log-mass rank choice) take word 0 at their own counter and stream through
:func:`gumbel`. ``fsdist.reference`` mirrors both bit for bit in torch.

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
def _mul_wide(x, FIRST: tl.constexpr):
    """(high, low) 32 bits of the 64-bit product of x and Philox's first (0xD2511F53) or second (0xCD9E8D57)
    multiplier, as one PTX mul.wide.u32 (mov.b64 {lo, hi}: the low half is the first element)."""
    ASM: tl.constexpr = ("{ .reg .b64 t; mul.wide.u32 t, $2, 0xD2511F53; mov.b64 {$1, $0}, t; }" if FIRST else
                         "{ .reg .b64 t; mul.wide.u32 t, $2, 0xCD9E8D57; mov.b64 {$1, $0}, t; }")
    return tl.inline_asm_elementwise(ASM, "=r,=r,r", [x], dtype=(tl.uint32, tl.uint32), is_pure=True, pack=1)


@triton.jit
def _philox_wide(c0, c1, c2, c3, k0, k1, ROUNDS: tl.constexpr):
    """tl.philox's rounds (Philox-4x32, Salmon et al. 2011) on uint32 words, each multiply one PTX mul.wide.u32.

    The same words as tl.philox bit for bit (the same integer products, only their instructions differ):
    tl.philox asks for the high and the low half of each product separately, which ptxas issues as two
    multiplies (IMAD.HI + IMAD), where one IMAD.WIDE gives both: ~5 of the noise's ~43 instructions per id
    (docs/performance.md v97-v98: with the .ftz logs 0-7% faster stage 1 at B = 256, level at B = 1024)."""
    for _ in tl.static_range(ROUNDS):
        hi_b, lo_b = _mul_wide(c2, False)
        hi_a, lo_a = _mul_wide(c0, True)
        c0 = hi_b ^ c1 ^ k0
        c2 = hi_a ^ c3 ^ k1
        c1 = lo_b
        c3 = lo_a
        k0 = k0 + 0x9E3779B9
        k1 = k1 + 0xBB67AE85
    return c0, c1, c2, c3


@triton.jit
def philox_words(seed, offset, counter, stream: tl.constexpr, ROUNDS: tl.constexpr = 10, PTX: tl.constexpr = False):
    """The four 32-bit Philox outputs for key `seed` (int64) and counter (counter, offset, stream).

    PTX (CUDA only): each round's multiplies as PTX mul.wide (_philox_wide), the same words; else tl.philox
    (the interpreter has no PTX). ROUNDS other than 10 is not the contract: benchmarks only (what a cheaper
    generator would save)."""
    off = offset.to(tl.uint64, bitcast=True)
    off_lo = (off & 0xFFFFFFFF).to(tl.uint32)
    off_hi = (off >> 32).to(tl.uint32)
    c0 = counter.to(tl.uint32, bitcast=True)
    # Broadcast every word to one shape so the rounds stay elementwise. (x * 0 folds away; unlike
    # tl.zeros_like it also compiles in Gluon, whose tensors carry explicit layouts.)
    zero = c0 * 0 + off_lo * 0
    if PTX:
        key = seed.to(tl.int64).to(tl.uint64, bitcast=True)
        k0 = (key & 0xFFFFFFFF).to(tl.uint32) + zero
        k1 = (key >> 32).to(tl.uint32) + zero
        return _philox_wide(c0 + zero, off_lo + zero, off_hi + zero, zero + stream, k0, k1, ROUNDS)
    else:
        return tl.philox(seed.to(tl.int64), c0 + zero, off_lo + zero, off_hi + zero, zero + stream, ROUNDS)


@triton.jit
def philox_bits(seed, offset, counter, stream: tl.constexpr):
    """Word 0 of Philox for (seed; counter, offset, stream)."""
    r0, _r1, _r2, _r3 = philox_words(seed, offset, counter, stream)
    return r0


@triton.jit
def vocab_quad_bits(seed, offset, quad, ROUNDS: tl.constexpr = 10, PTX: tl.constexpr = False):
    """The sampler's bits of the four ids 4 * quad + j, as four words (lane j = word j).

    The contract's quad-to-lane mapping lives here: id v draws word v & 3 of the Philox
    evaluation at counter v >> 2. Kernels that keep the four lanes apart (the chunked
    path's pass) use this; the others use vocab_bits / vocab_bits_tile. ROUNDS: philox_words'."""
    return philox_words(seed, offset, quad, STREAM_VOCAB, ROUNDS, PTX)


@triton.jit
def vocab_bits(seed, offset, vocab_id, PTX: tl.constexpr = False):
    """The sampler's 32 random bits for arbitrary (broadcastable) ids: word id & 3 of counter id >> 2.
    PTX: philox_words'."""
    r0, r1, r2, r3 = vocab_quad_bits(seed, offset, vocab_id >> 2, 10, PTX)
    lane = vocab_id & 3
    return tl.where(lane == 0, r0, tl.where(lane == 1, r1, tl.where(lane == 2, r2, r3)))


@triton.jit
def vocab_bits_tile(seed, offset, first_id, BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr, PTX: tl.constexpr = False):
    """vocab_bits for ids first_id + [0, BLOCK_V) of BLOCK_B rows, one Philox per 4 ids.

    seed, offset: [BLOCK_B, 1]; first_id must be a multiple of 4. Returns [BLOCK_B, BLOCK_V].
    """
    quad = (first_id >> 2) + tl.arange(0, BLOCK_V // 4)
    r0, r1, r2, r3 = vocab_quad_bits(seed, offset, quad[None, :], 10, PTX)
    # join(join(r0, r2), join(r1, r3))[b, q, i, j] = r_(2i + j): flattening (q, i, j)
    # gives column 4q + 2i + j, the id whose lane is 2i + j.
    return tl.reshape(tl.join(tl.join(r0, r2), tl.join(r1, r3)), [BLOCK_B, BLOCK_V])


# fast_log / exponential_from_bits / gumbel_from_bits's FAST: 0 (False) tl.log (the interpreter has no PTX),
# 1 (True) the shipped PTX, or LEGACY_PTX, the instructions before v97 (benchmarks: their cost beside the shipped ones).
# Both PTX forms give the same bits for every 32-bit input (tests/ops/test_noise_gpu.py checks all 2**32).
LEGACY_PTX = tl.constexpr(2)


@triton.jit
def fast_log(x, FAST: tl.constexpr):
    """Natural log; FAST uses the GPU's lg2.approx (one MUFU op, |error| < 2**-22 in log2).

    That error is below the fp32 rounding of a perturbed score (|score| ~ 10-20 has an
    ulp of 1e-6), so it cannot move the argmax measurably; the 1M-sample chi-squared in
    tests/ops/test_sample_gpu.py runs with it. The interpreter has no PTX: it keeps tl.log.
    FAST takes ``.ftz``: without it ptxas wraps each MUFU in a subnormal fix-up (a compare, a
    scaling multiply and an add: 6 of the noise's ~43 instructions per id); with it a subnormal
    input would flush to zero, and the noise never passes one (every input is >= 2**-33).
    """
    if FAST:
        ASM: tl.constexpr = "lg2.approx.f32 $0, $1;" if FAST == LEGACY_PTX else "lg2.approx.ftz.f32 $0, $1;"
        lg2 = tl.inline_asm_elementwise(ASM, "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1)
        return lg2 * 0.6931471805599453
    else:
        return tl.log(x)


@triton.jit
def exponential_from_bits(r, FAST: tl.constexpr = False):
    """E = -log(u) for u = (r + 0.5) / 2**32, accurate also when u is within 2**-32 of 1."""
    upper = r >= 0x80000000
    # Lower half: f = u. Upper half: f = 1 - u = (~r + 0.5) / 2**32, exact in fp32 where
    # u itself would round to 1. One int-to-float conversion serves both (conversions
    # run at a quarter of the FMA rate, and this is per (row, id) work).
    x = tl.where(upper, r ^ 0xFFFFFFFF, r).to(tl.float32)
    if FAST == LEGACY_PTX:
        f = (x + 0.5) * 2.3283064365386963e-10
    else:
        # x * 2**-32 + 2**-33 in one fused multiply-add: the same bits as (x + 0.5) * 2**-32 (scaling by a power of
        # two is exact, so one rounding of the exact sum is the rounding of x + 0.5, scaled), one instruction fewer
        f = tl.fma(x, 2.3283064365386963e-10, 1.1641532182693481e-10)
    # -log(1 - f) by its series where 1 - f would round away the information.
    series = f * (1.0 + f * (0.5 + f * (0.3333333333 + f * (0.25 + f * (0.2 + f * 0.1666666667)))))
    logged = -fast_log(tl.where(upper, 1.0 - f, f), FAST)
    return tl.where(upper & (f < 0.03125), series, logged)


@triton.jit
def gumbel_from_bits(bits, FAST: tl.constexpr = False):
    """Standard Gumbel variate from 32 uniform bits; finite for every input. FAST: fast_log's."""
    return -fast_log(exponential_from_bits(bits, FAST), FAST)


@triton.jit
def gumbel(seed, offset, counter, stream: tl.constexpr):
    """Gumbel noise from word 0 of Philox at (counter, offset, stream); used outside the vocabulary."""
    return gumbel_from_bits(philox_bits(seed, offset, counter, stream))
