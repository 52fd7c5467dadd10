"""Stage 1 of FlashSampling: LM-head GEMM with a sampling epilogue.

One program owns a (batch tile, vocabulary tile). It computes the logits tile
``hidden[BB, D] @ weight[BV, D]^T`` in fp32 registers, masks ids >= vocab_size,
adds T times Gumbel noise keyed by the global vocabulary id (argmax(logit + T g) is
argmax(logit / T + g), without the overflow of logit / T) and keeps one (score,
index) candidate per row. The [B, V] logits never leave the chip.

Candidates live in a struct-of-arrays buffer ``cand_f[group, field, tile, b]``
(fp32) and ``cand_i[group, tile, b]`` (int32 global id), batch innermost so one
program's stores are contiguous (see ``fsdist.ops.sampler.CandidateLayout``).
With tensor parallelism, group = rank: the host passes ``buf_offset`` pointing
at this rank's group, in the parity half of the buffer it is using. With
DEVICE_PARITY the half is read from a device counter instead (``parity_ptr``), so
a CUDA graph replay picks the half of the step it replays, not of the capture.
When PEER_TABLE is set, ``cand_f``/``cand_i`` are int64 tables of NPEERS base
addresses and the epilogue stores the candidates into every one of them; this is
how a rank writes straight into its peers' symmetric buffers. The kernel knows
nothing about how those addresses were obtained.

With TMA the operands arrive as tensor descriptors (Hopper's bulk tensor copies)
instead of pointers; the arithmetic, hence every candidate, is the same.
"""
import triton
import triton.language as tl

from .noise import gumbel_from_bits, vocab_bits_tile
from .parity import parity_offsets

# Fields of the fp32 candidate buffer. Only F_SCORE is written unless LOGPROBS. Logits are
# stored unscaled (not divided by T): logit / T overflows fp32 for tiny T or huge logits,
# while (logit - max) / T, which is all the log-sum-exp needs, does not.
F_SCORE = 0  # max over the tile of (logit + T * Gumbel); NaN marks a poisoned row
F_LOGIT = 1  # raw logit of that winner, for its log-probability
F_TMAX = 2  # max over the tile of the raw logit (online log-sum-exp state)
F_TSUM = 3  # sum over the tile of exp((logit - tile max) / T)
N_FIELDS_SAMPLE = 1
N_FIELDS_LOGPROBS = 4

# Temperatures below this are greedy (vLLM's epsilon): 1 / T stays far from fp32 overflow.
GREEDY_BELOW = tl.constexpr(1e-5)


@triton.jit
def _load_row_param(ptr, scalar, offs_b, mask_b, DTYPE: tl.constexpr, PER_ROW: tl.constexpr):
    if PER_ROW:
        return tl.load(ptr + offs_b, mask=mask_b, other=0).to(DTYPE)
    else:
        return tl.full(offs_b.shape, 0, DTYPE) + scalar


@triton.jit
def row_temperature(temp):
    """(inv_t, noise_scale, greedy, bad) of each row's temperature.

    The perturbed score is ``logit + T * Gumbel``: the same argmax as ``logit / T + Gumbel``
    for T > 0 (the paper's form), but it never overflows, and T = 0 makes it the logit itself.
    A negative or NaN temperature is ``bad``: the row is poisoned (token -1) rather than
    sampled wrongly; T < GREEDY_BELOW is greedy (noise scale 0, logprobs at T = 1).
    """
    bad = (temp < 0.0) | (temp != temp)
    greedy = (temp < GREEDY_BELOW) & ~bad
    off = greedy | bad
    return tl.where(off, 1.0, 1.0 / tl.where(off, 1.0, temp)), tl.where(off, 0.0, temp), greedy, bad


@triton.jit
def tile_stats(logit, valid, inv_t):
    """(max, sum of exp((logit - max) / T)) over axis 1 of raw logits; -inf / 0 where nothing is finite."""
    tmax = tl.max(logit, axis=1)
    safe = tl.where(tmax == float("-inf"), 0.0, tmax)
    live = valid & (logit > float("-inf"))
    tsum = tl.sum(tl.where(live, tl.exp((logit - safe[:, None]) * inv_t[:, None]), 0.0), axis=1)
    return tmax, tsum


@triton.jit
def _store_candidates(base_f, base_i, dst, dst_i, stride_field, score, idx, logit, tmax, tsum, mask_b,
                      LOGPROBS: tl.constexpr):
    tl.store(base_f + dst, score, mask=mask_b)
    tl.store(base_i + dst_i, idx, mask=mask_b)
    if LOGPROBS:
        tl.store(base_f + 1 * stride_field + dst, logit, mask=mask_b)
        tl.store(base_f + 2 * stride_field + dst, tmax, mask=mask_b)
        tl.store(base_f + 3 * stride_field + dst, tsum, mask=mask_b)


@triton.jit
def write_candidates(cand_f, cand_i, dst, dst_i, stride_field, score, idx, logit, tmax, tsum, mask_b,
                     LOGPROBS: tl.constexpr, PEER_TABLE: tl.constexpr, NPEERS: tl.constexpr):
    """Store one tile's candidates at element offsets dst / dst_i: into the local buffer, or
    with PEER_TABLE into every peer's (cand_f / cand_i are then tables of base addresses)."""
    if PEER_TABLE:
        # Fan-out: the same candidates go to this rank's slot in every peer's buffer.
        for p in tl.static_range(NPEERS):
            base_f = tl.load(cand_f + p).to(tl.pointer_type(tl.float32))
            base_i = tl.load(cand_i + p).to(tl.pointer_type(tl.int32))
            _store_candidates(base_f, base_i, dst, dst_i, stride_field, score, idx, logit, tmax, tsum, mask_b,
                              LOGPROBS)
    else:
        _store_candidates(cand_f, cand_i, dst, dst_i, stride_field, score, idx, logit, tmax, tsum, mask_b,
                          LOGPROBS)


@triton.jit
def fused_sample_kernel(
    h_ptr, w_ptr,
    seed_ptr, seed_val, offset_ptr, offset_val, temp_ptr, temp_val,
    cand_f, cand_i,
    B, D, V_rows, vocab_size, vocab_start,
    stride_hb,
    buf_offset, buf_offset_i, stride_field, stride_slot,
    parity_ptr, parity_stride_f, parity_stride_i,
    BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr, EVEN_V: tl.constexpr,
    SEED_PER_ROW: tl.constexpr, OFFSET_PER_ROW: tl.constexpr, TEMP_PER_ROW: tl.constexpr,
    NOISE: tl.constexpr, LOGPROBS: tl.constexpr,
    PEER_TABLE: tl.constexpr, NPEERS: tl.constexpr,
    DOT_PRECISION: tl.constexpr, DOT_UPCAST: tl.constexpr,
    FAST_LOG: tl.constexpr, DEVICE_PARITY: tl.constexpr, TMA: tl.constexpr = False,
):
    # Batch tiles vary fastest so programs sharing a weight tile run together and
    # the tile is read from HBM once, then from L2.
    pid_b = tl.program_id(0)
    pid_v = tl.program_id(1)

    offs_b = pid_b * BLOCK_B + tl.arange(0, BLOCK_B)
    offs_v = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    offs_k = tl.arange(0, BLOCK_K)
    mask_b = offs_b < B
    mask_v = offs_v < V_rows

    if not TMA:
        h_ptrs = h_ptr + offs_b[:, None] * stride_hb + offs_k[None, :]
        w_ptrs = w_ptr + offs_v[:, None].to(tl.int64) * D + offs_k[None, :]
    acc = tl.zeros([BLOCK_B, BLOCK_V], dtype=tl.float32)
    for k in range(0, D, BLOCK_K):
        if TMA:
            # h_ptr / w_ptr are tensor descriptors: the copy engine fetches whole tiles and
            # zero-fills rows and columns past the tensor, so no masks and no address math
            # in the loop (fewer registers and issue slots left to the epilogue).
            h = h_ptr.load([pid_b * BLOCK_B, k])
            w = w_ptr.load([pid_v * BLOCK_V, k])
        elif EVEN_K:
            h = tl.load(h_ptrs, mask=mask_b[:, None], other=0.0)
            if EVEN_V:
                w = tl.load(w_ptrs)
            else:
                w = tl.load(w_ptrs, mask=mask_v[:, None], other=0.0)
        else:
            mask_k = (k + offs_k) < D
            h = tl.load(h_ptrs, mask=mask_b[:, None] & mask_k[None, :], other=0.0)
            w = tl.load(w_ptrs, mask=mask_v[:, None] & mask_k[None, :], other=0.0)
        if DOT_UPCAST:
            # Triton 3.6's interpreter multiplies bf16 as raw uint16 bits; fp32 operands
            # give the same products (bf16 x bf16 is exact in fp32) and fp32 accumulation.
            h = h.to(tl.float32)
            w = w.to(tl.float32)
        acc = tl.dot(h, tl.trans(w), acc, input_precision=DOT_PRECISION)
        if not TMA:
            h_ptrs += BLOCK_K
            w_ptrs += BLOCK_K

    # ---- epilogue: temperature, padding mask, noise, tile-local argmax ----
    temp = _load_row_param(temp_ptr, temp_val, offs_b, mask_b, tl.float32, TEMP_PER_ROW)
    inv_t, noise_scale, greedy, bad_temp = row_temperature(temp)
    gid = vocab_start + offs_v  # global vocabulary id
    valid = (gid < vocab_size) & mask_v
    logit = tl.where(valid[None, :], acc, float("-inf"))
    # A NaN or +inf logit leaves the row without a distribution: poison it (token -1).
    # -inf is a logit of probability 0 and is fine.
    bad_logit = tl.max(((logit != logit) | (logit == float("inf"))).to(tl.int32), axis=1) > 0
    if NOISE:
        seed = _load_row_param(seed_ptr, seed_val, offs_b, mask_b, tl.int64, SEED_PER_ROW)
        offset = _load_row_param(offset_ptr, offset_val, offs_b, mask_b, tl.int64, OFFSET_PER_ROW)
        # Tiles start at multiples of BLOCK_V (and vocab_start at a multiple of 4), so the
        # tile's ids are whole Philox quads: one evaluation per 4 ids.
        bits = vocab_bits_tile(seed[:, None], offset[:, None], vocab_start + pid_v * BLOCK_V, BLOCK_B, BLOCK_V)
        g = gumbel_from_bits(bits, FAST_LOG)
        score = logit + noise_scale[:, None] * g  # greedy rows: scale 0, the logit itself
    else:
        score = logit
    poisoned = bad_logit | bad_temp
    best = tl.argmax(score, axis=1)
    best_score = tl.where(poisoned, float("nan"), tl.max(score, axis=1))
    best_idx = tl.where(poisoned, -1, vocab_start + pid_v * BLOCK_V + best).to(tl.int32)

    if LOGPROBS:
        tmax, tsum = tile_stats(logit, valid[None, :], inv_t)
        is_best = tl.arange(0, BLOCK_V)[None, :] == best[:, None]
        best_logit = tl.max(tl.where(is_best, logit, float("-inf")), axis=1)
    else:
        tmax = best_score
        tsum = best_score
        best_logit = best_score

    buf_offset, buf_offset_i = parity_offsets(buf_offset, buf_offset_i, parity_ptr, parity_stride_f,
                                              parity_stride_i, DEVICE_PARITY)
    dst = buf_offset + pid_v * stride_slot + offs_b
    dst_i = buf_offset_i + pid_v * stride_slot + offs_b
    write_candidates(cand_f, cand_i, dst, dst_i, stride_field, best_score, best_idx, best_logit, tmax, tsum, mask_b,
                     LOGPROBS, PEER_TABLE, NPEERS)
