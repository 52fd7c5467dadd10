"""Stage 2 for filtered rows and top-N logprobs: exact thresholds from the kept logits (one kernel).

With filters (min-p, top-k, top-p) a row samples from the logits at or above one
threshold tau (vLLM V1's order):

    tau_S = max(l_max + T log(min_p), k-th largest logit)      (min-p, then top-k)
    tau_p = the smallest logit v in S = {l >= tau_S} whose strictly-larger mass in S,
            renormalised over S, is < top_p                    (top-p on the survivors)
    tau   = max(tau_S, tau_p);  token = argmax_{l_v >= tau} (l_v + T * Gumbel(v))

Stage 1 kept, for every (row, vocabulary tile), the tile's KEEP largest logits and the
*boundary* b: the largest logit it did not keep. Let U be the kept logits of a row and
B = max b. Everything at or above B's successor is in U, so the thresholds computed from
U alone are the true ones whenever they lie strictly above B (and, with top-p after
min-p / top-k, tau_S does too: then the renormaliser Z_S is a sum over U). Such a row is
*proven* and finished here; any other row is marked for the exact fallback
(``fallback.py``), which recomputes its logits. Adding the missing logits can only raise
each threshold, so a proof never needs more than U.

Thresholds are found by bisection on an order-preserving 32-bit key of the fp32 logits
(32 steps each): the k-th largest key, and the smallest key whose strictly-larger mass is
< top_p * Z_S. Both land on a logit that exists, so ties are handled exactly: every logit
equal to the threshold is kept (vLLM keeps all ties at the k-th value; for top-p this
keeps a whole tie group, which vLLM's sort may split). The sampling noise is recomputed
per kept id from the RNG contract (``noise.vocab_bits``), so the token is the one the
unfiltered argmax over the kept set would give: the same for any tile size, batch
position, path or tensor-parallel degree.

Top-N logprobs: the N largest logits (lower id first among equal ones) are read off U
when the N-th one lies above B; logprobs in the requested mode: "scaled"
log_softmax(logits / T), "raw" log_softmax(logits), "processed" the log-probability in
the filtered, renormalised distribution (-inf for ids the filters drop; greedy and
unfiltered rows: scaled). Masses are fp32 sums, like the float32 samplers of serving stacks.
"""
import torch
import triton
import triton.language as tl

from ..params import LOGPROBS_MODES, RowParams
from .epilogue import row_temperature
from .layout import KEEP, BufferPair, CandidateLayout
from .noise import gumbel_from_bits, vocab_bits
from .parity import parity_args, parity_offsets
from .utils import fast_log_ok, row_param_args

MODE_SCALED, MODE_RAW, MODE_PROCESSED = 0, 1, 2


@triton.jit
def order_key(v):
    """int64 key in [0, 2**32) ordered like the fp32 values (-0 folded into +0; NaN-free input)."""
    b = (v + 0.0).to(tl.int32, bitcast=True).to(tl.int64)
    return tl.where(b >= 0, b + 2147483648, 2147483647 - (b & 2147483647))


@triton.jit
def scalar_param(ptr, scalar, row, DTYPE: tl.constexpr, PER_ROW: tl.constexpr):
    if PER_ROW:
        return tl.load(ptr + row).to(DTYPE)
    else:
        return tl.full([], 0, DTYPE) + scalar


@triton.jit
def kth_largest_key(keys, live, k):
    """The key of the k-th largest live element (k >= 1, at most the live count)."""
    lo = tl.full([], 0, tl.int64)  # count(keys >= lo) >= k
    hi = tl.full([], 4294967296, tl.int64)  # count(keys >= hi) < k
    for _ in range(32):
        mid = (lo + hi) // 2
        n = tl.sum(tl.sum((live & (keys >= mid)).to(tl.int32), axis=1), axis=0)
        big = n >= k
        lo = tl.where(big, mid, lo)
        hi = tl.where(big, hi, mid)
    return lo


@triton.jit
def nucleus_key(keys, mass, live, target):
    """The smallest key x such that the mass of live elements with key > x is < target."""
    lo = tl.full([], -1, tl.int64)  # predicate false (or below every key)
    hi = tl.full([], 4294967295, tl.int64)  # predicate true: nothing lies above the largest key
    for _ in range(32):
        mid = (lo + hi) // 2
        above = tl.sum(tl.sum(tl.where(live & (keys > mid), mass, 0.0), axis=1), axis=0)
        ok = above < target
        hi = tl.where(ok, mid, hi)
        lo = tl.where(ok, lo, mid)
    return hi


@triton.jit
def select_filtered_kernel(
    cand_f, cand_i, base_f, base_i, parity_ptr, parity_stride_f, parity_stride_i,
    n_slots, n_local, stride_shard, stride_shard_i, stride_field, stride_ifield, stride_slot,
    seed_ptr, seed_val, offset_ptr, offset_val, temp_ptr, temp_val,
    topk_ptr, topk_val, topp_ptr, topp_val, minp_ptr, minp_val,
    vocab_size,
    tokens_ptr, logprob_ptr, top_ids_ptr, top_lp_ptr, fallback_ptr, fb_count_ptr, fb_rows_ptr,
    SEED_PER_ROW: tl.constexpr, OFFSET_PER_ROW: tl.constexpr, TEMP_PER_ROW: tl.constexpr,
    TOPK_PER_ROW: tl.constexpr, TOPP_PER_ROW: tl.constexpr, MINP_PER_ROW: tl.constexpr,
    BLOCK_S: tl.constexpr, KEEP: tl.constexpr, TOP_N: tl.constexpr, TOP_N_POW2: tl.constexpr,
    MODE: tl.constexpr, LOGPROBS: tl.constexpr, FAST_LOG: tl.constexpr, DEVICE_PARITY: tl.constexpr,
):
    row = tl.program_id(0)
    base_f, base_i = parity_offsets(base_f, base_i, parity_ptr, parity_stride_f, parity_stride_i, DEVICE_PARITY)
    # Stage 2 (merge_candidates) ran first and wrote -1 for rows without a valid token
    # (NaN / +inf logits, bad temperature, no finite logit, a tensor-parallel mismatch).
    dead = tl.load(tokens_ptr + row) < 0
    temp = scalar_param(temp_ptr, temp_val, row, tl.float32, TEMP_PER_ROW)
    inv_t, noise_scale, greedy, _bad = row_temperature(temp)
    top_k = scalar_param(topk_ptr, topk_val, row, tl.int32, TOPK_PER_ROW)
    top_p = scalar_param(topp_ptr, topp_val, row, tl.float32, TOPP_PER_ROW)
    min_p = scalar_param(minp_ptr, minp_val, row, tl.float32, MINP_PER_ROW)
    # Values a tensor may hold but the API forbids: the row returns -1 (no sync to raise).
    bad_filter = (top_k < 0) | ~((top_p > 0.0) & (top_p <= 1.0)) | ~((min_p >= 0.0) & (min_p <= 1.0))
    use_k = (top_k > 0) & (top_k < vocab_size)
    use_p = top_p < 1.0
    use_minp = min_p > 0.0
    filtered = ~greedy & (use_k | use_p | use_minp) & ~bad_filter & ~dead
    if bad_filter & ~dead:
        tl.store(tokens_ptr + row, -1)
        if LOGPROBS:
            tl.store(logprob_ptr + row, float("nan"))
    if TOP_N > 0:
        active = n_slots > 0  # every row: its top-N logprobs
    else:
        active = filtered
    if active:
        _select_row(cand_f, cand_i, base_f, base_i, row, n_slots, n_local, stride_shard, stride_shard_i, stride_field,
                    stride_ifield, stride_slot, seed_ptr, seed_val, offset_ptr, offset_val, temp, inv_t, noise_scale,
                    top_k, top_p, min_p, use_k, use_p, use_minp, filtered, dead | bad_filter,
                    tokens_ptr, logprob_ptr, top_ids_ptr, top_lp_ptr, fallback_ptr, fb_count_ptr, fb_rows_ptr,
                    SEED_PER_ROW, OFFSET_PER_ROW, BLOCK_S, KEEP, TOP_N, TOP_N_POW2, MODE, LOGPROBS, FAST_LOG)


@triton.jit
def _select_row(cand_f, cand_i, base_f, base_i, row, n_slots, n_local, stride_shard, stride_shard_i, stride_field,
                stride_ifield, stride_slot, seed_ptr, seed_val, offset_ptr, offset_val, temp, inv_t, noise_scale,
                top_k, top_p, min_p, use_k, use_p, use_minp, filtered, row_bad,
                tokens_ptr, logprob_ptr, top_ids_ptr, top_lp_ptr, fallback_ptr, fb_count_ptr, fb_rows_ptr,
                SEED_PER_ROW: tl.constexpr, OFFSET_PER_ROW: tl.constexpr, BLOCK_S: tl.constexpr,
                KEEP: tl.constexpr, TOP_N: tl.constexpr, TOP_N_POW2: tl.constexpr, MODE: tl.constexpr,
                LOGPROBS: tl.constexpr, FAST_LOG: tl.constexpr):
    # ---- the row's kept logits U [slots, KEEP], their ids, boundaries and stats ----
    s = tl.arange(0, BLOCK_S)
    ms = s < n_slots
    slot_f = base_f + (s // n_local) * stride_shard + (s % n_local) * stride_slot + row
    slot_i = base_i + (s // n_local) * stride_shard_i + (s % n_local) * stride_slot + row
    j = tl.arange(0, KEEP)[None, :]
    vals = tl.load(cand_f + slot_f[:, None] + (5 + j) * stride_field, mask=ms[:, None], other=float("-inf"))
    ids = tl.load(cand_i + slot_i[:, None] + (1 + j) * stride_ifield, mask=ms[:, None], other=-1)
    bound = tl.max(tl.load(cand_f + slot_f + (5 + KEEP) * stride_field, mask=ms, other=float("-inf")), axis=0)
    tmax = tl.load(cand_f + slot_f + 2 * stride_field, mask=ms, other=float("-inf"))
    tsum = tl.load(cand_f + slot_f + 3 * stride_field, mask=ms, other=0.0)
    m = tl.max(tmax, axis=0)  # the row's largest logit (finite: dead rows left above)
    msafe = tl.where(m == float("-inf"), 0.0, m)
    live = vals > float("-inf")
    keys = order_key(vals)
    mass = tl.where(live, tl.exp((vals - msafe) * inv_t), 0.0)  # exp((l - max) / T)
    z_full = tl.sum(tl.where(tmax > float("-inf"), tsum * tl.exp((tmax - msafe) * inv_t), 0.0), axis=0)
    bkey = order_key(bound)
    complete = bound == float("-inf")  # every logit of the row is in U

    # ---- thresholds (vLLM's order), and whether U proves them ----
    key_s = tl.full([], 0, tl.int64)  # tau_S: min-p, then top-k
    if use_minp:
        key_s = tl.maximum(key_s, order_key(m + temp * tl.log(tl.where(use_minp, min_p, 1.0))))
    n_live = tl.sum(tl.sum(live.to(tl.int32), axis=1), axis=0)
    if use_k:
        key_s = tl.maximum(key_s, kth_largest_key(keys, live, tl.minimum(top_k, n_live)))
    in_s = live & (keys >= key_s)
    z_s = tl.where(key_s > 0, tl.sum(tl.sum(tl.where(in_s, mass, 0.0), axis=1), axis=0), z_full)
    key_t = key_s
    if use_p:
        key_t = tl.maximum(key_t, nucleus_key(keys, mass, in_s, top_p * z_s))
    # key 0 lies below every real logit's key: "no min-p / top-k threshold". With top-k alone
    # the k-th largest of U is the true one as soon as it lies above B.
    proven = complete | ((key_t > bkey) & (~use_p | (key_s == 0) | (key_s > bkey)))

    if filtered:
        if proven:
            kept = live & (keys >= key_t)
            g = gumbel_from_bits(vocab_bits(scalar_param(seed_ptr, seed_val, row, tl.int64, SEED_PER_ROW),
                                            scalar_param(offset_ptr, offset_val, row, tl.int64, OFFSET_PER_ROW),
                                            ids), FAST_LOG)
            score = tl.where(kept, vals + noise_scale * g, float("-inf"))
            best = tl.max(tl.max(score, axis=1), axis=0)
            tok = tl.min(tl.min(tl.where(kept & (score == best), ids, 2147483647), axis=1), axis=0)
            tl.store(tokens_ptr + row, tok.to(tl.int64))
            if LOGPROBS:
                l_tok = tl.max(tl.max(tl.where(kept & (ids == tok), vals, float("-inf")), axis=1), axis=0)
                if MODE == 1:
                    rsum = tl.load(cand_f + slot_f + 4 * stride_field, mask=ms, other=0.0)
                    z_raw = tl.sum(tl.where(tmax > float("-inf"), rsum * tl.exp(tmax - msafe), 0.0), axis=0)
                    lp = (l_tok - msafe) - tl.log(z_raw)
                elif MODE == 2:
                    lp = (l_tok - msafe) * inv_t - tl.log(tl.sum(tl.sum(tl.where(kept, mass, 0.0), axis=1), axis=0))
                else:
                    lp = (l_tok - msafe) * inv_t - tl.log(z_full)
                tl.store(logprob_ptr + row, lp)
        else:
            tl.store(tokens_ptr + row, -1)  # the fallback writes it
            if LOGPROBS:
                tl.store(logprob_ptr + row, float("nan"))

    # ---- top-N logprobs (every row) ----
    topn_ok = n_slots >= 0
    if TOP_N > 0:
        n = tl.arange(0, TOP_N_POW2)
        out_ids = tl.full([TOP_N_POW2], -1, tl.int64)
        out_lp = tl.full([TOP_N_POW2], float("-inf"), tl.float32)
        alive = live
        last_key = tl.full([], 4294967296, tl.int64)
        if MODE == 1:
            rsum2 = tl.load(cand_f + slot_f + 4 * stride_field, mask=ms, other=0.0)
            log_z = tl.log(tl.sum(tl.where(tmax > float("-inf"), rsum2 * tl.exp(tmax - msafe), 0.0), axis=0))
            scale = 1.0
        else:
            log_z = tl.log(z_full)
            scale = inv_t
        if MODE == 2:
            if filtered:
                log_z = tl.log(tl.sum(tl.sum(tl.where(live & (keys >= key_t), mass, 0.0), axis=1), axis=0))
        for t in tl.static_range(TOP_N):
            kmax = tl.max(tl.max(tl.where(alive, keys, -1), axis=1), axis=0)
            pick = alive & (keys == kmax)
            idsel = tl.min(tl.min(tl.where(pick, ids, 2147483647), axis=1), axis=0)
            vsel = tl.max(tl.max(tl.where(pick & (ids == idsel), vals, float("-inf")), axis=1), axis=0)
            have = kmax >= 0
            lpv = (vsel - msafe) * scale - log_z
            if MODE == 2:
                if filtered:
                    lpv = tl.where(kmax >= key_t, lpv, float("-inf"))
            out_ids = tl.where(n == t, tl.where(have, idsel, -1).to(tl.int64), out_ids)
            out_lp = tl.where(n == t, tl.where(have, lpv, float("-inf")), out_lp)
            last_key = tl.where(have, kmax, last_key)
            alive = alive & ~(pick & (ids == idsel))
        topn_ok = (last_key > bkey) | complete
        out_ids = tl.where(row_bad, -1, out_ids)
        out_lp = tl.where(row_bad, float("nan"), out_lp)
        if topn_ok | row_bad:
            tl.store(top_ids_ptr + row * TOP_N + n, out_ids, mask=n < TOP_N)
            tl.store(top_lp_ptr + row * TOP_N + n, out_lp, mask=n < TOP_N)
        topn_ok = topn_ok | row_bad

    need = (filtered & ~proven) | ~topn_ok
    tl.store(fallback_ptr + row, need.to(tl.int8))
    if need:
        # A slot in the fallback's work list (order does not matter: rows are independent).
        tl.store(fb_rows_ptr + tl.atomic_add(fb_count_ptr, 1), row)


def launch_select_filtered(layout: CandidateLayout, src: BufferPair, batch: int, params: RowParams, *,
                           vocab_size: int, tokens: torch.Tensor, logprobs=None, top_n: int = 0,
                           mode: str = "scaled", top_ids=None, top_lp=None):
    """Finish filtered rows and top-N logprobs from an extended candidate buffer ``src``, after
    launch_merge wrote ``tokens`` (and ``logprobs``) for every row.

    Overwrites the tokens / logprobs of filtered rows it proves, fills ``top_ids`` /
    ``top_lp`` [B, top_n], and returns (fallback int8 [B], fallback_count int32 [1],
    fallback_rows int32 [B]): the rows the fallback must finish, as a flag per row and a
    compact list (its first fallback_count entries).
    """
    if not layout.extended:
        raise ValueError("filters and top-N logprobs need an extended candidate layout (layout.fields(extended=True))")
    device = src.f.device
    fallback = torch.zeros(batch, dtype=torch.int8, device=device)
    fb_count = torch.zeros(1, dtype=torch.int32, device=device)
    fb_rows = torch.empty(max(batch, 1), dtype=torch.int32, device=device)
    if batch == 0:
        return fallback, fb_count, fb_rows
    dummy = src.i
    args = []
    flags = {}
    for name, x in (("SEED", params.seed), ("OFFSET", params.offset), ("TEMP", params.temperature),
                    ("TOPK", params.top_k), ("TOPP", params.top_p), ("MINP", params.min_p)):
        p, v, per_row = row_param_args(x, dummy)
        args += [p, float(v) if name in ("TEMP", "TOPP", "MINP") else v]
        flags[f"{name}_PER_ROW"] = per_row
    par_p, par_f, par_i, par_on = parity_args(src.parity, dummy)
    on_gpu = device.type == "cuda"
    select_filtered_kernel[(batch,)](
        src.f, src.i, src.base_f, src.base_i, par_p, par_f, par_i,
        layout.n_slots, layout.n_local, layout.stride_shard, layout.stride_shard_i, layout.stride_field,
        layout.stride_ifield, layout.stride_slot,
        *args, vocab_size,
        tokens, logprobs if logprobs is not None else dummy,
        top_ids if top_ids is not None else dummy, top_lp if top_lp is not None else dummy,
        fallback, fb_count, fb_rows,
        **flags,
        BLOCK_S=triton.next_power_of_2(layout.n_slots), KEEP=KEEP, TOP_N=top_n,
        TOP_N_POW2=triton.next_power_of_2(max(top_n, 1)), MODE=LOGPROBS_MODES.index(mode),
        LOGPROBS=logprobs is not None, FAST_LOG=fast_log_ok(device), DEVICE_PARITY=par_on,
        num_warps=16 if on_gpu else 4,
    )
    return fallback, fb_count, fb_rows
