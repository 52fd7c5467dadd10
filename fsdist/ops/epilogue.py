"""The sampling epilogue every stage-1 kernel shares: temperature, tile statistics, stores.

A stage-1 kernel holds a [rows, ids] tile of raw logits in registers (the fused GEMM's
accumulator, or a chunk of cuBLAS output) and turns it into one candidate per row:

* ``row_temperature``: each row's 1/T, the noise scale T, greedy and bad flags.
  The perturbed score is ``logit + T * Gumbel``: the argmax of ``logit / T + Gumbel``
  for T > 0 (the paper's form), but it never overflows, and T = 0 gives the logit.
* ``tile_stats``: the online log-sum-exp state (max raw logit, sum of exp((logit -
  max) / T)), kept unscaled because logit / T overflows fp32 for tiny T or huge logits.
* ``write_candidates``: the stores, into the local buffer or, through a peer address
  table, into every tensor-parallel peer's buffer.

* ``rows_draw_noise``: which rows' noise anything reads. With ``skip_filtered_noise`` (fsdist.sample's filtered
  calls) a tile whose rows are all greedy or filtered by top-k / top-p draws none: their score is then the
  logit, and the winner's logit and id follow it (module ``select_filtered``: such a row's token is drawn there,
  over its surviving kept logits, or by the fallback; the merge's token and logprob for it are replaced, and its
  poison / dead tests, NaN and -inf scores, come out the same without the noise).
* ``tile_topk`` / ``write_kept``: with filters or top-N logprobs (an *extended* layout),
  the tile's KEEP largest raw logits with their global ids, and the *boundary*: the
  largest logit the tile did not keep. Stage 2 (``select_filtered.py``) proves a row's
  filtered set from these alone whenever every boundary lies below its threshold.

Candidate fields (fp32, see ``layout.py``): 0 score (the tile's best perturbed score; NaN
poisons the row), and with logprobs 1 the winner's raw logit, 2 the tile's max raw
logit, 3 the tile's sum of exp((logit - max) / T); extended: 4 the sum of exp(logit -
max) (for raw logprobs), 5 .. 5 + KEEP - 1 the kept logits (largest first), 5 + KEEP the
boundary. int32: 0 the winner's global id; extended: 1 .. KEEP the kept logits' ids.
"""
import triton
import triton.language as tl

from ..params import GREEDY_TEMPERATURE, MAX_TEMPERATURE
from .utils import load_row_param

# The host's bounds, as kernel constants: below GREEDY_BELOW a row is greedy (vLLM's epsilon);
# above HOTTEST (+inf included) it is poisoned.
GREEDY_BELOW = tl.constexpr(GREEDY_TEMPERATURE)
HOTTEST = tl.constexpr(MAX_TEMPERATURE)


@triton.jit
def row_temperature(temp):
    """(inv_t, noise_scale, greedy, bad) of each row's temperature.

    A negative, NaN or too large (> HOTTEST, +inf included) temperature is ``bad``: the row is
    poisoned (token -1) rather than sampled wrongly. T < GREEDY_BELOW is greedy: noise scale 0,
    logprobs at T = 1.
    """
    bad = ~((temp >= 0.0) & (temp <= HOTTEST))  # NaN fails both comparisons
    greedy = (temp < GREEDY_BELOW) & ~bad
    off = greedy | bad
    return tl.where(off, 1.0, 1.0 / tl.where(off, 1.0, temp)), tl.where(off, 0.0, temp), greedy, bad


@triton.jit
def filter_switches(top_k, top_p, vocab_size):
    """(use_k, use_p) per row: top-k restricts a row when 0 < k < vocab_size, top-p when p < 1 (NaN: off). The one
    definition select_filtered, the fallback and rows_draw_noise share: the noise rule is exact only if it agrees
    with the filters on which rows they restrict."""
    return (top_k > 0) & (top_k < vocab_size), top_p < 1.0


@triton.jit
def rows_draw_noise(noise_scale, top_k, top_p, vocab_size):
    """Rows whose stage-1 noise a filtered call reads (bool, per row): sampled rows (noise scale > 0) that
    neither top-k nor top-p restricts. A greedy or poisoned row (scale 0) scores its logit with or without
    the noise; a row with top-k or top-p on gets its token from select_filtered's draw over its surviving
    kept logits (with the contract's noise for those ids) or from the fallback, never from its tiles'
    winners, which only min-p rows' proof reads (select_filtered.winner_draw). The same tests as
    select_filtered's use_k / use_p (filter_switches); a NaN or out-of-range value keeps the noise (bad
    filter values return -1 there anyway)."""
    use_k, use_p = filter_switches(top_k, top_p, vocab_size)
    return (noise_scale > 0.0) & ~(use_k | use_p)


@triton.jit
def tile_draws_noise(noise_scale, topk_ptr, topk_val, topp_ptr, topp_val, offs, mask, vocab_size,
                     TOPK_PER_ROW: tl.constexpr, TOPP_PER_ROW: tl.constexpr):
    """Whether a tile of rows ``offs`` (``mask``: those < B) draws the noise in a call with skip_filtered_noise: one
    of its rows reads it (rows_draw_noise over the rows' top-k / top-p, each a scalar or per-row). A scalar, the
    same for the whole tile: both stage-1 kernels branch on it."""
    top_k = load_row_param(topk_ptr, topk_val, offs, mask, tl.int32, TOPK_PER_ROW)
    top_p = load_row_param(topp_ptr, topp_val, offs, mask, tl.float32, TOPP_PER_ROW)
    need = rows_draw_noise(noise_scale, top_k, top_p, vocab_size) & mask
    return tl.max(need.to(tl.int32), axis=0) > 0


@triton.jit
def perturb(logit, noise_scale, g, PINNED: tl.constexpr):
    """The perturbed score logit + T * Gumbel, rounded as the contract's mirror rounds it: the
    product, then the sum (never one fused multiply-add, which compilers form or not depending
    on the surrounding code: two kernels would then disagree in the last bit). PINNED (CUDA)
    issues the product as ``mul.rn.f32``, which no compiler contracts; the interpreter has no
    PTX and rounds each numpy operation on its own anyway."""
    return logit + rounded_mul(noise_scale, g, PINNED)


@triton.jit
def rounded_mul(a, b, PINNED: tl.constexpr):
    """fp32 a * b rounded on its own, so that no compiler fuses it into a multiply-add with the
    sum it feeds (a kernel that did would round once where another rounds twice). PINNED (CUDA):
    ``mul.rn.f32``, which nothing contracts; the interpreter rounds every numpy operation anyway."""
    if PINNED:
        a, b = tl.broadcast(a, b)  # inline asm takes operands of one shape
        return tl.inline_asm_elementwise("mul.rn.f32 $0, $1, $2;", "=r,r,r", [a, b], dtype=tl.float32,
                                         is_pure=True, pack=1)
    else:
        return a * b


@triton.jit
def tile_stats(logit, valid, inv_t):
    """(max, sum of exp((logit - max) / T)) over axis 1 of raw logits; -inf / 0 where nothing is finite."""
    tmax = tl.max(logit, axis=1)
    return tmax, scaled_sum(logit, valid, tmax, inv_t)


@triton.jit
def scaled_sum(logit, valid, tmax, inv_t):
    """sum over axis 1 of exp((logit - tmax) / T) for the valid, finite logits (tmax = -inf: a shift
    of 0). tile_stats' sum, for a kernel that takes the max over more than this tensor (the
    warp-specialised kernel's two column halves)."""
    safe = tl.where(tmax == float("-inf"), 0.0, tmax)
    live = valid & (logit > float("-inf"))
    return tl.sum(tl.where(live, tl.exp((logit - safe[:, None]) * inv_t[:, None]), 0.0), axis=1)


@triton.jit
def tile_topk(logit, cols, KEEP: tl.constexpr):
    """The KEEP largest values of each row of a [rows, cols] tile, largest first (lowest column
    first among equal values; -inf once a row runs out, each at the lowest column holding a -inf, which
    removing it does not change), their columns, and the boundary: the
    largest value not kept (-inf if none). A few row reductions per kept value."""
    BIG: tl.constexpr = 1 << 30
    slot = tl.arange(0, KEEP)[None, :]
    vals = tl.full([logit.shape[0], KEEP], float("-inf"), tl.float32)
    idx = tl.zeros([logit.shape[0], KEEP], tl.int32)
    x = logit
    for j in tl.static_range(KEEP):
        m = tl.max(x, axis=1)
        c = tl.min(tl.where(x == m[:, None], cols[None, :], BIG), axis=1)
        vals = tl.where(slot == j, m[:, None], vals)
        idx = tl.where(slot == j, c[:, None], idx)
        x = tl.where(cols[None, :] == c[:, None], float("-inf"), x)
    return vals, idx, tl.max(x, axis=1)


@triton.jit
def raw_sum(logit, valid, tmax):
    """sum over axis 1 of exp(logit - tmax): the raw (T = 1) log-sum-exp state next to tile_stats'."""
    safe = tl.where(tmax == float("-inf"), 0.0, tmax)
    live = valid & (logit > float("-inf"))
    return tl.sum(tl.where(live, tl.exp(logit - safe[:, None]), 0.0), axis=1)


@triton.jit
def _store_kept(base_f, base_i, dst, dst_i, stride_field, stride_ifield, rsum, kept, kept_ids, boundary, mask_b,
                KEEP: tl.constexpr):
    j = tl.arange(0, KEEP)[None, :]
    tl.store(base_f + 4 * stride_field + dst, rsum, mask=mask_b)
    tl.store(base_f + (5 + j) * stride_field + dst[:, None], kept, mask=mask_b[:, None])
    tl.store(base_f + (5 + KEEP) * stride_field + dst, boundary, mask=mask_b)
    tl.store(base_i + (1 + j) * stride_ifield + dst_i[:, None], kept_ids, mask=mask_b[:, None])


@triton.jit
def write_kept(cand_f, cand_i, dst, dst_i, stride_field, stride_ifield, rsum, kept, kept_ids, boundary, mask_b,
               KEEP: tl.constexpr, PEER_TABLE: tl.constexpr, NPEERS: tl.constexpr):
    """Store an extended layout's fields (raw sum, kept logits and ids, boundary) like write_candidates."""
    if PEER_TABLE:
        for p in tl.static_range(NPEERS):
            base_f = tl.load(cand_f + p).to(tl.pointer_type(tl.float32))
            base_i = tl.load(cand_i + p).to(tl.pointer_type(tl.int32))
            _store_kept(base_f, base_i, dst, dst_i, stride_field, stride_ifield, rsum, kept, kept_ids, boundary,
                        mask_b, KEEP)
    else:
        _store_kept(cand_f, cand_i, dst, dst_i, stride_field, stride_ifield, rsum, kept, kept_ids, boundary,
                    mask_b, KEEP)


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
