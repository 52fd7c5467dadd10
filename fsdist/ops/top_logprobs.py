"""Top-N logprobs: the per-mode normaliser and the bookkeeping of one pick, shared by the two
kernels that find the N most likely ids: stage 2 (``select_filtered.py``, from the kept logits
of every tile) and the exact fallback (``fallback.py``, from a row's recomputed logits).

How each finds its t-th pick differs (the kept set is in registers; the fallback scans the
vocabulary once per pick). What a pick becomes does not: its logprob in the requested mode
(0 "scaled" log_softmax(l / T), 1 "raw" log_softmax(l), 2 "processed": the filtered,
renormalised distribution, -inf for an id the filters drop), written to column t.
"""
import triton
import triton.language as tl


@triton.jit
def top_n_normaliser(log_z_raw, log_z_full, log_z_kept, filtered, inv_t, MODE: tl.constexpr):
    """(log Z, scale) with which a logit l of the row becomes (l - m) * scale - log Z.
    log_z_raw: log sum exp(l - m); log_z_full: the same of (l - m) / T; log_z_kept: over the
    ids the filters keep (used for filtered rows in MODE 2). All [rows]."""
    if MODE == 1:
        log_z = log_z_raw
        scale = tl.full(inv_t.shape, 1.0, tl.float32)
    else:
        log_z = log_z_full
        scale = inv_t
    if MODE == 2:
        log_z = tl.where(filtered, log_z_kept, log_z)
    return log_z, scale


@triton.jit
def place_pick(out_ids, out_lp, n, t, have, idsel, vsel, m, scale, log_z, filtered, kmax, key_t,
               MODE: tl.constexpr):
    """Write pick t (id idsel, logit vsel, order key kmax; ``have`` false = no such id: -1 and
    -inf) into column t of out_ids / out_lp [rows, N_POW2]. In MODE 2 a filtered row's pick
    below the threshold key key_t gets -inf (the filters drop it)."""
    lpv = (vsel - m) * scale - log_z
    if MODE == 2:
        lpv = tl.where(filtered & (kmax < key_t), float("-inf"), lpv)
    col = n[None, :] == t
    out_ids = tl.where(col, tl.where(have, idsel, -1).to(tl.int64)[:, None], out_ids)
    out_lp = tl.where(col, tl.where(have, lpv, float("-inf"))[:, None], out_lp)
    return out_ids, out_lp
