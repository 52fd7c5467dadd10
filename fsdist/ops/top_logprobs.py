"""Top-N logprobs: the per-mode normaliser and the bookkeeping of one pick, shared by the two
kernels that find the N most likely ids: stage 2 (``select_filtered.py``, from the kept logits
of every tile) and the exact fallback (``fallback.py``, from a row's recomputed logits).

How each finds its t-th pick differs (the kept set is in registers; the fallback scans the
vocabulary once per pick). What a pick becomes does not: its logprob in the requested mode
(0 "scaled" log_softmax(l / T), 1 "raw" log_softmax(l), 2 "processed": the filtered,
renormalised distribution, -inf for an id the filters drop), written to column t; nor what fills the
columns of a row with fewer finite logits than N (``fill_free_ids``).
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


@triton.jit
def fill_free_ids(out_ids, n, vocab_size, TOP_N: tl.constexpr):
    """The ids of the columns past a row's last pick (-1 there: the row has fewer than TOP_N finite
    logits, e.g. a bitmask allows fewer ids): the row's other ids below vocab_size, whose logit and
    logprob are -inf, lowest id first, as equal values are listed (the reference's order; their values
    stay -inf). Columns past vocab_size ids keep -1. out_ids [rows, N_POW2] int64 with the picks first;
    n = arange(N_POW2). With c picks, ids [0, min(TOP_N, vocab_size)) hold at least min(TOP_N,
    vocab_size) - c others: the fill never looks past TOP_N."""
    cols = (n < TOP_N)[None, :]
    missing = (out_ids < 0) & cols
    if tl.max(tl.sum(missing.to(tl.int32), axis=1), axis=0) > 0:  # (rare: a call pays nothing else)
        taken = tl.sum((out_ids[:, None, :] == n[None, :, None]).to(tl.int32), axis=2) > 0  # [rows, id]
        free = ~taken & cols & (n < vocab_size)[None, :]
        rank = tl.cumsum(free.to(tl.int32), axis=1) - 1  # each free id's place among the free ids
        picks = tl.sum((~missing & cols).to(tl.int32), axis=1)
        want = n[None, :] - picks[:, None]  # column t takes the free id of rank t - picks
        hit = free[:, None, :] & (rank[:, None, :] == want[:, :, None])  # [rows, column, id]
        fill = tl.max(tl.where(hit, n[None, None, :], -1), axis=2)  # -1: no such id (past the vocabulary)
        out_ids = tl.where(missing, fill.to(tl.int64), out_ids)
    return out_ids
