"""The exact fallback for filtered rows the kept logits cannot prove (two kernels per round).

``select_filtered`` flags such rows on the device and gives each a *need key*: a lower
bound on every threshold the row needs (its min-p threshold, its k-th and N-th largest and,
when nothing restricts top-p's renormaliser, its nucleus key, all taken over the kept logits
U: the logits U lacks can only raise them), or 0 when U bounds nothing. Every kernel of a
round lists its rows from the flags itself (``round_rows``: the r-th flagged row in row order,
so every tensor-parallel rank derives the same list from the same flags; no listing launch).
The rows are then finished here, without the host ever learning how many there are (no
synchronisation):

* ``materialize_kernel`` recomputes, for up to POOL_ROWS listed rows per *round*, the
  vocabulary tiles each row needs into a fixed workspace [POOL_ROWS, V] (the only [rows, V]
  tensor fsdist ever holds, only in filtered calls): with a need key L, the tiles whose
  boundary (largest logit stage 1 did not keep) reaches L, since every logit at or above L
  is in U or in such a tile; with key 0, every tile;
* ``resolve_kernel`` finishes each pooled row: with a need key L, select_filtered's own
  thresholds (``finish_rows``) over U's logits at or above L from the other tiles plus the
  recomputed tiles' (at most REFINE_CAP logits: select_filtered gives key 0 to a row that
  would gather more), with the boundary just below L, so the row is proven; with key 0, the
  same thresholds by bisection over the whole recomputed row. Then the token (argmax of
  logit + T * Gumbel over the kept ids, with the contract's noise), its logprob and the
  top-N logprobs.

The host launches ceil(B / POOL_ROWS) rounds; a round whose slots are past the count
exits at once (a few microseconds when nothing falls back). A row finished from its tiles
costs tens of microseconds; a whole row costs a second pass over the weight and a few dozen
passes over the row (milliseconds), and is meant to be rare: ``bench/fallback_rate.py``
reports how often rows fall back, ``bench/fallback_probe.py`` which way and at what cost.
"""
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..params import LOGPROBS_MODES, RowParams
from .epilogue import filter_switches, perturb, row_temperature
from .layout import F_BOUNDARY, KEEP, BufferPair, CandidateLayout, store_fan_out
from .noise import gumbel_from_bits, vocab_bits
from .parity import parity_args, parity_offsets
from .processors import apply_processors, processor_args
from .select_filtered import REFINE_CAP, finish_rows, kept_logits, order_key, row_slot_stats, tile_reaches
from .top_logprobs import fill_free_ids, place_pick, top_n_normaliser
from .utils import (cdiv, fast_log_ok, flagged_count, load_row_param, next_pow2, pdl_args, pdl_prologue, row_param_args,
                    sm_count)

# Rows resolved per round on a GPU: one round covers B <= 64, so a decode batch pays two empty
# launches when nothing falls back (a fp32 pool of 64 x 151936 = 39 MB at V = 151936, only in filtered calls).
POOL_ROWS = 64
POOL_ROWS_INTERPRETER = 256  # under the interpreter: fewer, bigger rounds


# Flags scanned per step by the kernels that list a round's rows (a [slots, SCAN] match per step).
SCAN = 128


@triton.jit
def round_rows(flags_ptr, B, ranks, SCAN: tl.constexpr):
    """The batch rows of the flagged rows with these ranks (int32 [n]; rank r = the r-th flagged row
    in increasing row order, so every tensor-parallel rank lists the same rows from the same flags),
    0 where no such row exists. Each kernel of a round derives its rows itself: no listing launch."""
    rows = tl.zeros(ranks.shape, tl.int32)
    total = tl.zeros([], tl.int32)
    for start in range(0, B, SCAN):
        offs = start + tl.arange(0, SCAN)
        f = tl.load(flags_ptr + offs, mask=offs < B, other=0).to(tl.int32)
        rank = total + tl.cumsum(f, axis=0) - f
        hit = (f != 0)[None, :] & (rank[None, :] == ranks[:, None])
        rows += tl.sum(tl.where(hit, offs[None, :], 0), axis=1)
        total += tl.sum(f, axis=0)
    return rows


# B (the flag count) is never specialised: Triton compiles B = 1 as a constant, and the flag scan
# then took resolve_kernel's compile for sm_90 from ~4 s to ~45 s (one kernel per batch size 1).
@triton.jit(do_not_specialize=["B", "round_start"])
def materialize_kernel(h_ptr, w_ptr, pool_ptr, flags_ptr, B, round_start,
                       D, V_rows, vocab_size, vocab_start, stride_hb, shard_base, shard_cols,
                       bm_ptr, bm_stride, ent_ptr, val_ptr, ent_stride, ent_width, search_steps, pen_ptr, pen_stride,
                       cand_f, cand_base, parity_ptr, parity_stride_f, cand_stride_slot, need_key_ptr,
                       POOL: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr,
                       DOT_PRECISION: tl.constexpr, DOT_UPCAST: tl.constexpr,
                       PEER_TABLE: tl.constexpr = False, NPEERS: tl.constexpr = 1,
                       BITMASK: tl.constexpr = False, SPARSE: tl.constexpr = False, PINNED: tl.constexpr = False,
                       DEVICE_PARITY: tl.constexpr = False, SCAN: tl.constexpr = 128,
                       PDL_WAIT: tl.constexpr = False, TRIGGER: tl.constexpr = False):
    """Logits of this round's listed rows for the weight's vocabulary tiles (stage 1's tile: BLOCK_V
    ids; program p takes tiles p, p + programs, ...), into the pool's block of this shard: pool[shard, slot, column]
    (through a peer table: every peer's pool). Only where a row needs the tile: its need key
    is 0 (the whole row), or the tile's boundary in the candidate buffer (at ``cand_base``:
    this shard's boundary field) reaches the key. Padding ids are not written (nothing reads them)."""
    # (configs.pdl_fallback: a dependent of select_filtered waits for its flags here; resolve may launch)
    pdl_prologue(PDL_WAIT, TRIGGER)
    n = flagged_count(flags_ptr, B, SCAN)
    if round_start < n:  # a round past the count (most calls) stops here
        slots = round_start + tl.arange(0, POOL)
        active = slots < n
        rows = round_rows(flags_ptr, B, slots, SCAN)
        key = tl.load(need_key_ptr + rows, mask=active, other=0)
        cand_base, _unused = parity_offsets(cand_base, 0, parity_ptr, parity_stride_f, 0, DEVICE_PARITY)
        # A persistent grid (launch_materialize): an empty round is one short wave, not one
        # program per tile (1,187 at V = 151936).
        for pid_v in range(tl.program_id(0), tl.cdiv(V_rows, BLOCK_V), tl.num_programs(0)):
            bnd = tl.load(cand_f + cand_base + pid_v * cand_stride_slot + rows, mask=active, other=float("-inf"))
            _materialize_tile(h_ptr, w_ptr, pool_ptr, rows, active & ((key == 0) | tile_reaches(bnd, key)), pid_v,
                              D, V_rows, vocab_size, vocab_start, stride_hb, shard_base, shard_cols,
                              bm_ptr, bm_stride, ent_ptr, val_ptr, ent_stride, ent_width, search_steps, pen_ptr,
                              pen_stride, POOL, BLOCK_V, BLOCK_K, DOT_PRECISION, DOT_UPCAST, PEER_TABLE, NPEERS,
                              BITMASK, SPARSE, PINNED)


@triton.jit
def _materialize_tile(h_ptr, w_ptr, pool_ptr, rows, active, pid_v, D, V_rows, vocab_size, vocab_start, stride_hb,
                      shard_base, shard_cols, bm_ptr, bm_stride, ent_ptr, val_ptr, ent_stride, ent_width,
                      search_steps, pen_ptr, pen_stride, POOL: tl.constexpr, BLOCK_V: tl.constexpr,
                      BLOCK_K: tl.constexpr, DOT_PRECISION: tl.constexpr, DOT_UPCAST: tl.constexpr,
                      PEER_TABLE: tl.constexpr, NPEERS: tl.constexpr, BITMASK: tl.constexpr, SPARSE: tl.constexpr,
                      PINNED: tl.constexpr):
    """Tile pid_v's logits of the pooled rows ``active`` picks, into the pool (materialize_kernel)."""
    if tl.max(active.to(tl.int32), axis=0) > 0:
        offs_v = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
        offs_k = tl.arange(0, BLOCK_K)
        mask_v = offs_v < V_rows
        acc = tl.zeros([POOL, BLOCK_V], dtype=tl.float32)
        for k in range(0, D, BLOCK_K):
            mk = (k + offs_k) < D
            h = tl.load(h_ptr + rows[:, None].to(tl.int64) * stride_hb + (k + offs_k)[None, :],
                        mask=active[:, None] & mk[None, :], other=0.0)
            w = tl.load(w_ptr + offs_v[:, None].to(tl.int64) * D + (k + offs_k)[None, :],
                        mask=mask_v[:, None] & mk[None, :], other=0.0)
            if DOT_UPCAST:
                h = h.to(tl.float32)
                w = w.to(tl.float32)
            acc = tl.dot(h, tl.trans(w), acc, input_precision=DOT_PRECISION)
        ok = mask_v & ((vocab_start + offs_v) < vocab_size)
        if BITMASK or SPARSE:  # the same processed logits stage 1 saw (processors.py)
            acc = apply_processors(tl.where(ok[None, :], acc, float("-inf")), rows, active, vocab_start + offs_v, ok,
                                   vocab_start + pid_v * BLOCK_V, bm_ptr, bm_stride, ent_ptr, val_ptr, ent_stride,
                                   ent_width, search_steps, pen_ptr, pen_stride, BITMASK, SPARSE, PINNED)
        off = shard_base + tl.arange(0, POOL)[:, None].to(tl.int64) * shard_cols + offs_v[None, :]
        store_fan_out(pool_ptr, off, acc, active[:, None] & ok[None, :], tl.float32, PEER_TABLE, NPEERS)


@triton.jit
def _pool_load(pool_ptr, slots, offs, V, shard_cols, POOL: tl.constexpr):
    """Logits [rows, BLOCK] of global ids ``offs`` of pool slots ``slots`` (-inf past V); the pool
    is rank-major [n_shards, POOL, shard_cols]."""
    addr = ((offs // shard_cols).to(tl.int64) * (POOL * shard_cols) + offs % shard_cols)[None, :] \
        + slots[:, None] * shard_cols
    return tl.load(pool_ptr + addr, mask=(offs < V)[None, :], other=float("-inf"))


# The chunk loops below accumulate elementwise ([rows, BLOCK]) and reduce once after the
# loop: Triton 3.6's TritonGPUOptimizeThreadLocality pass fails on `acc += reduce(chunk)`.
@triton.jit
def _count_ge(pool_ptr, slots, shard_cols, V, x, BLOCK: tl.constexpr, POOL: tl.constexpr):
    """Per row, how many logits have key >= x[row]."""
    n = tl.zeros([x.shape[0], BLOCK], tl.int32)
    for c in range(0, V, BLOCK):
        offs = c + tl.arange(0, BLOCK)
        v = _pool_load(pool_ptr, slots, offs, V, shard_cols, POOL)
        n += ((v > float("-inf")) & (order_key(v) >= x[:, None])).to(tl.int32)
    return tl.sum(n, axis=1)


@triton.jit
def _mass_where(pool_ptr, slots, shard_cols, V, m, inv_t, lo_key, gt_key, BLOCK: tl.constexpr, POOL: tl.constexpr):
    """Per row, the sum of exp((l - m) / T) over logits with key >= lo_key and key > gt_key."""
    z = tl.zeros([m.shape[0], BLOCK], tl.float32)
    for c in range(0, V, BLOCK):
        offs = c + tl.arange(0, BLOCK)
        v = _pool_load(pool_ptr, slots, offs, V, shard_cols, POOL)
        k = order_key(v)
        sel = (v > float("-inf")) & (k >= lo_key[:, None]) & (k > gt_key[:, None])
        z += tl.where(sel, tl.exp((v - m[:, None]) * inv_t[:, None]), 0.0)
    return tl.sum(z, axis=1)


@triton.jit
def _row_filters(row, mask, temp_ptr, temp_val, topk_ptr, topk_val, topp_ptr, topp_val, minp_ptr, minp_val, V,
                 TEMP_PER_ROW: tl.constexpr, TOPK_PER_ROW: tl.constexpr, TOPP_PER_ROW: tl.constexpr,
                 MINP_PER_ROW: tl.constexpr):
    """A pooled row's temperature and filters, as select_filtered read them (listed rows are
    never bad): (temp, inv_t, noise_scale, top_k, top_p, min_p, use_k, use_p, use_minp, filtered)."""
    temp = load_row_param(temp_ptr, temp_val, row, mask, tl.float32, TEMP_PER_ROW)
    inv_t, noise_scale, greedy, _bad = row_temperature(temp)
    top_k = load_row_param(topk_ptr, topk_val, row, mask, tl.int32, TOPK_PER_ROW)
    top_p = load_row_param(topp_ptr, topp_val, row, mask, tl.float32, TOPP_PER_ROW)
    min_p = load_row_param(minp_ptr, minp_val, row, mask, tl.float32, MINP_PER_ROW)
    use_k, use_p = filter_switches(top_k, top_p, V)
    use_minp = min_p > 0.0
    filtered = ~greedy & (use_k | use_p | use_minp) & mask
    return temp, inv_t, noise_scale, top_k, top_p, min_p, use_k, use_p, use_minp, filtered


@triton.jit
def _resolve_refined_row(ps, row, pool_ptr, shard_cols, n_flagged, round_start, V,
                         cand_f, cand_i, base_f, base_i, n_slots, n_local, stride_shard, stride_shard_i, stride_field,
                         stride_ifield, stride_slot, need_key_ptr, scratch_f, scratch_i, scratch_t,
                         seed_ptr, seed_val, offset_ptr, offset_val, temp_ptr, temp_val,
                         topk_ptr, topk_val, topp_ptr, topp_val, minp_ptr, minp_val,
                         tokens_ptr, logprob_ptr, top_ids_ptr, top_lp_ptr,
                         SEED_PER_ROW: tl.constexpr, OFFSET_PER_ROW: tl.constexpr, TEMP_PER_ROW: tl.constexpr,
                         TOPK_PER_ROW: tl.constexpr, TOPP_PER_ROW: tl.constexpr, MINP_PER_ROW: tl.constexpr,
                         TOP_N: tl.constexpr, TOP_N_POW2: tl.constexpr, MODE: tl.constexpr, LOGPROBS: tl.constexpr,
                         FAST_LOG: tl.constexpr, POOL: tl.constexpr, KEEP: tl.constexpr, BLOCK_U: tl.constexpr,
                         TILE_V: tl.constexpr, RCAP: tl.constexpr):
    """Finish pool slots ``ps`` ([n]; ``row``: their batch rows, [n]) whose row has a need key
    L > 0: gather every logit at or above L (U's kept logits from tiles that do not reach L,
    the recomputed tiles that do), then run select_filtered's thresholds over them with the
    boundary just below L. Everything a threshold looks at is there, so the row is proven
    (module docstring)."""
    live = (round_start + ps < n_flagged) & (ps < POOL)
    lkey = tl.load(need_key_ptr + row, mask=live, other=0)
    go = live & (lkey > 0)
    if tl.max(go.to(tl.int32), axis=0) > 0:
        temp, inv_t, noise_scale, top_k, top_p, min_p, use_k, use_p, use_minp, filtered = _row_filters(
            row, go, temp_ptr, temp_val, topk_ptr, topk_val, topp_ptr, topp_val, minp_ptr, minp_val, V,
            TEMP_PER_ROW, TOPK_PER_ROW, TOPP_PER_ROW, MINP_PER_ROW)
        BLOCK_S: tl.constexpr = BLOCK_U // KEEP
        bnd, _b, m, msafe, z_full, log_z_raw = row_slot_stats(
            cand_f, base_f, row, go, n_slots, n_local, stride_shard, stride_field, stride_slot, inv_t,
            BLOCK_S, KEEP, MODE)
        reach = tile_reaches(bnd, lkey[:, None])  # [1, BLOCK_S]: the recomputed tiles
        sbase = ps.to(tl.int64) * RCAP
        # U's kept logits at or above L, from the tiles that were not recomputed
        vals, ids_at, bnd_at, lanes = kept_logits(cand_f, cand_i, base_f, base_i, row, go, n_slots, n_local,
                                                  stride_shard, stride_shard_i, stride_field, stride_ifield,
                                                  stride_slot, BLOCK_U, KEEP)
        redone = tile_reaches(tl.load(bnd_at, mask=lanes, other=float("-inf")), lkey[:, None])
        take = lanes & (vals > float("-inf")) & (order_key(vals) >= lkey[:, None]) & ~redone
        pos = tl.cumsum(take.to(tl.int32), axis=1) - 1
        tl.store(scratch_f + sbase[:, None] + pos, vals, mask=take)
        tl.store(scratch_i + sbase[:, None] + pos, tl.load(ids_at, mask=take, other=-1), mask=take)
        n1 = tl.sum(take.to(tl.int32), axis=1)
        # the list of recomputed tiles (at most RCAP // TILE_V: select_filtered checked the fit)
        NEED_CAP: tl.constexpr = RCAP // TILE_V
        sl = tl.arange(0, BLOCK_S)
        tpos = tl.cumsum(reach.to(tl.int32), axis=1) - 1
        tbase = ps.to(tl.int64) * NEED_CAP
        tl.store(scratch_t + tbase[:, None] + tpos, sl[None, :], mask=reach)
        n_t = tl.sum(reach.to(tl.int32), axis=1)
        tl.debug_barrier()  # the tile list is read back by other threads
        e = tl.arange(0, NEED_CAP * TILE_V)
        ti = e // TILE_V
        has = ti[None, :] < n_t[:, None]
        tslot = tl.load(scratch_t + tbase[:, None] + ti[None, :], mask=has, other=0)
        local = (tslot % n_local) * TILE_V + (e % TILE_V)[None, :]  # id inside its shard
        gid = (tslot // n_local) * shard_cols + local
        ok = has & (local < shard_cols) & (gid < V)
        v = tl.load(pool_ptr + (tslot // n_local).to(tl.int64) * (POOL * shard_cols) + ps[:, None] * shard_cols
                    + local, mask=ok, other=float("-inf"))
        take2 = ok & (v > float("-inf")) & (order_key(v) >= lkey[:, None])
        pos2 = n1[:, None] + tl.cumsum(take2.to(tl.int32), axis=1) - 1
        tl.store(scratch_f + sbase[:, None] + pos2, v, mask=take2)
        tl.store(scratch_i + sbase[:, None] + pos2, gid, mask=take2)
        n_all = n1 + tl.sum(take2.to(tl.int32), axis=1)
        tl.debug_barrier()  # the packed logits are read back by other threads
        c = tl.arange(0, RCAP)
        cm = go[:, None] & (c[None, :] < n_all[:, None])
        below = lkey - 1
        no = lkey < 0  # all False: no row here is bad, none complete
        vals2 = tl.load(scratch_f + sbase[:, None] + c[None, :], mask=cm, other=float("-inf"))
        _need, _lower, _small, _pending, _topn_ok, _key_minp, _tok, _l_tok, _best = finish_rows(vals2,
                    tl.load(scratch_i + sbase[:, None] + c[None, :], mask=cm, other=-1),
                    row, go, go, filtered, no, below, no, m, msafe, z_full, log_z_raw,
                    inv_t, noise_scale, temp, top_k, top_p, min_p, use_k, use_p, use_minp, below, V,
                    seed_ptr, seed_val, offset_ptr, offset_val, tokens_ptr, logprob_ptr, top_ids_ptr, top_lp_ptr,
                    scratch_f, scratch_i, sbase, SEED_PER_ROW, OFFSET_PER_ROW, TOP_N, TOP_N_POW2, MODE, LOGPROBS,
                    FAST_LOG, 0)


@triton.jit(do_not_specialize=["B", "round_start"])
def resolve_kernel(pool_ptr, shard_cols, flags_ptr, B, round_start, V,
                   seed_ptr, seed_val, offset_ptr, offset_val, temp_ptr, temp_val,
                   topk_ptr, topk_val, topp_ptr, topp_val, minp_ptr, minp_val,
                   tokens_ptr, logprob_ptr, top_ids_ptr, top_lp_ptr,
                   cand_f, cand_i, base_f, base_i, parity_ptr, parity_stride_f, parity_stride_i,
                   n_slots, n_local, stride_shard, stride_shard_i, stride_field, stride_ifield, stride_slot,
                   need_key_ptr, scratch_f, scratch_i, scratch_t,
                   SEED_PER_ROW: tl.constexpr, OFFSET_PER_ROW: tl.constexpr, TEMP_PER_ROW: tl.constexpr,
                   TOPK_PER_ROW: tl.constexpr, TOPP_PER_ROW: tl.constexpr, MINP_PER_ROW: tl.constexpr,
                   BLOCK: tl.constexpr, TOP_N: tl.constexpr, TOP_N_POW2: tl.constexpr, MODE: tl.constexpr,
                   LOGPROBS: tl.constexpr, FAST_LOG: tl.constexpr, POOL: tl.constexpr, BLOCK_R: tl.constexpr,
                   KEEP: tl.constexpr = 4, BLOCK_U: tl.constexpr = 16, TILE_V: tl.constexpr = 128,
                   RCAP: tl.constexpr = 4096, DEVICE_PARITY: tl.constexpr = False, SCAN: tl.constexpr = 128,
                   PDL_WAIT: tl.constexpr = False, TRIGGER: tl.constexpr = False):
    """BLOCK_R pooled rows per program. A row with need key 0: the thresholds of select_filtered
    over every logit of its recomputed row; any other: over its logits at or above the key
    (_resolve_refined_row)."""
    # (configs.pdl_fallback: a dependent of materialize waits for the pool here; the next round's may launch)
    pdl_prologue(PDL_WAIT, TRIGGER)
    base_f, base_i = parity_offsets(base_f, base_i, parity_ptr, parity_stride_f, parity_stride_i, DEVICE_PARITY)
    n_flagged = flagged_count(flags_ptr, B, SCAN)
    if round_start < n_flagged:  # a round past the count (most calls) stops here
        ps = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)  # pool slots
        live_r = (round_start + ps < n_flagged) & (ps < POOL)
        # The program's rows, listed once (one scan of the flags), and finished together: a GPU program
        # holds one pooled row; under the interpreter one program holds them all, and a Python-level
        # loop over rows cost ~0.1 s per row in interpreter overhead.
        row = round_rows(flags_ptr, B, round_start + ps, SCAN)
        _resolve_refined_row(
            ps, row, pool_ptr, shard_cols, n_flagged,
            round_start, V, cand_f, cand_i, base_f, base_i, n_slots, n_local, stride_shard, stride_shard_i,
            stride_field, stride_ifield, stride_slot, need_key_ptr, scratch_f, scratch_i, scratch_t,
            seed_ptr, seed_val, offset_ptr, offset_val, temp_ptr, temp_val, topk_ptr, topk_val, topp_ptr, topp_val,
            minp_ptr, minp_val, tokens_ptr, logprob_ptr, top_ids_ptr, top_lp_ptr,
            SEED_PER_ROW, OFFSET_PER_ROW, TEMP_PER_ROW, TOPK_PER_ROW, TOPP_PER_ROW, MINP_PER_ROW,
            TOP_N, TOP_N_POW2, MODE, LOGPROBS, FAST_LOG, POOL, KEEP, BLOCK_U, TILE_V, RCAP)
        live_r = live_r & (tl.load(need_key_ptr + row, mask=live_r, other=1) == 0)  # the whole row recomputed
        if tl.max(live_r.to(tl.int32), axis=0) > 0:
            slots = ps.to(tl.int64)
            temp, inv_t, noise_scale, top_k, top_p, min_p, use_k, use_p, use_minp, filtered = _row_filters(
                row, live_r, temp_ptr, temp_val, topk_ptr, topk_val, topp_ptr, topp_val, minp_ptr, minp_val, V,
                TEMP_PER_ROW, TOPK_PER_ROW, TOPP_PER_ROW, MINP_PER_ROW)

            # the rows' max and normalisers
            m2 = tl.full([BLOCK_R, BLOCK], float("-inf"), tl.float32)
            for c in range(0, V, BLOCK):
                offs = c + tl.arange(0, BLOCK)
                m2 = tl.maximum(m2, _pool_load(pool_ptr, slots, offs, V, shard_cols, POOL))
            m = tl.max(m2, axis=1)
            m = tl.where(m == float("-inf"), 0.0, m)
            zero = tl.zeros([BLOCK_R], tl.int64)
            z_full = _mass_where(pool_ptr, slots, shard_cols, V, m, inv_t, zero, zero - 1, BLOCK, POOL)
            n_live = _count_ge(pool_ptr, slots, shard_cols, V, zero, BLOCK, POOL)

            # thresholds: exactly select_filtered's, over every logit of the rows
            key_minp = tl.where(use_minp, order_key(m + temp * tl.log(tl.where(use_minp, min_p, 1.0))), 0)
            kk = tl.maximum(tl.minimum(top_k, n_live), 1)
            lo = tl.zeros([BLOCK_R], tl.int64)
            hi = tl.full([BLOCK_R], 4294967296, tl.int64)
            for _ in range(32):
                mid = (lo + hi) // 2
                big = _count_ge(pool_ptr, slots, shard_cols, V, mid, BLOCK, POOL) >= kk
                lo = tl.where(big, mid, lo)
                hi = tl.where(big, hi, mid)
            key_s = tl.where(use_k, tl.maximum(key_minp, lo), key_minp)
            z_s = tl.where(key_s > 0,
                           _mass_where(pool_ptr, slots, shard_cols, V, m, inv_t, key_s, zero - 1, BLOCK, POOL),
                           z_full)
            lo2 = tl.full([BLOCK_R], -1, tl.int64)
            hi2 = tl.full([BLOCK_R], 4294967295, tl.int64)
            for _ in range(32):
                mid = (lo2 + hi2) // 2
                ok = _mass_where(pool_ptr, slots, shard_cols, V, m, inv_t, key_s, mid, BLOCK, POOL) < top_p * z_s
                hi2 = tl.where(ok, mid, hi2)
                lo2 = tl.where(ok, lo2, mid)
            key_t = tl.where(use_p, tl.maximum(key_s, hi2), key_s)

            # the token (filtered rows): argmax over the kept ids of logit + T * Gumbel
            seed = load_row_param(seed_ptr, seed_val, row, live_r, tl.int64, SEED_PER_ROW)
            offset = load_row_param(offset_ptr, offset_val, row, live_r, tl.int64, OFFSET_PER_ROW)
            # per column position: the best perturbed score so far, its id and logit (an earlier,
            # lower-id chunk keeps ties), then one reduction over positions (lowest id on ties)
            best2 = tl.full([BLOCK_R, BLOCK], float("-inf"), tl.float32)
            id2 = tl.full([BLOCK_R, BLOCK], 2147483647, tl.int32)
            lv2 = tl.full([BLOCK_R, BLOCK], float("-inf"), tl.float32)
            zk2 = tl.zeros([BLOCK_R, BLOCK], tl.float32)
            zr2 = tl.zeros([BLOCK_R, BLOCK], tl.float32)
            for c in range(0, V, BLOCK):
                offs = c + tl.arange(0, BLOCK)
                v = _pool_load(pool_ptr, slots, offs, V, shard_cols, POOL)
                kept = (v > float("-inf")) & (order_key(v) >= key_t[:, None])
                g = gumbel_from_bits(vocab_bits(seed[:, None], offset[:, None], offs[None, :], FAST_LOG), FAST_LOG)
                score = tl.where(kept, perturb(v, noise_scale[:, None], g, FAST_LOG), float("-inf"))
                take = score > best2
                best2 = tl.where(take, score, best2)
                id2 = tl.where(take, offs[None, :], id2)
                lv2 = tl.where(take, v, lv2)
                zk2 += tl.where(kept, tl.exp((v - m[:, None]) * inv_t[:, None]), 0.0)
                zr2 += tl.where(v > float("-inf"), tl.exp(v - m[:, None]), 0.0)
            best = tl.max(best2, axis=1)
            tok = tl.min(tl.where(best2 == best[:, None], id2, 2147483647), axis=1)
            l_tok = tl.max(tl.where(id2 == tok[:, None], lv2, float("-inf")), axis=1)
            z_kept = tl.sum(zk2, axis=1)
            z_raw = tl.sum(zr2, axis=1)
            tl.store(tokens_ptr + row, tok.to(tl.int64), mask=filtered)
            if LOGPROBS:
                if MODE == 1:
                    lp = (l_tok - m) - tl.log(z_raw)
                elif MODE == 2:
                    lp = (l_tok - m) * inv_t - tl.log(z_kept)
                else:
                    lp = (l_tok - m) * inv_t - tl.log(z_full)
                tl.store(logprob_ptr + row, lp, mask=filtered)

            if TOP_N > 0:
                log_z, scale = top_n_normaliser(tl.log(z_raw), tl.log(z_full), tl.log(z_kept), filtered, inv_t, MODE)
                n = tl.arange(0, TOP_N_POW2)
                out_ids = tl.full([BLOCK_R, TOP_N_POW2], -1, tl.int64)
                out_lp = tl.full([BLOCK_R, TOP_N_POW2], float("-inf"), tl.float32)
                # the previous pick as (key, id): the next is the largest after it in (key desc, id asc)
                prev_key = tl.full([BLOCK_R], 4294967296, tl.int64)
                prev_id = tl.full([BLOCK_R], -1, tl.int32)
                for t in tl.static_range(TOP_N):
                    # per column position: the largest (key, -id) after the previous pick
                    k2 = tl.full([BLOCK_R, BLOCK], -1, tl.int64)
                    i2 = tl.full([BLOCK_R, BLOCK], 2147483647, tl.int32)
                    v2 = tl.full([BLOCK_R, BLOCK], float("-inf"), tl.float32)
                    for c in range(0, V, BLOCK):
                        offs = c + tl.arange(0, BLOCK)
                        v = _pool_load(pool_ptr, slots, offs, V, shard_cols, POOL)
                        k = order_key(v)
                        later = (k == prev_key[:, None]) & (offs[None, :] > prev_id[:, None])
                        after = (v > float("-inf")) & ((k < prev_key[:, None]) | later)
                        better = after & (k > k2)  # same position: a later chunk has a larger id, so only > wins
                        k2 = tl.where(better, k, k2)
                        i2 = tl.where(better, offs[None, :], i2)
                        v2 = tl.where(better, v, v2)
                    kmax = tl.max(k2, axis=1)
                    idsel = tl.min(tl.where(k2 == kmax[:, None], i2, 2147483647), axis=1)
                    vsel = tl.max(tl.where(i2 == idsel[:, None], v2, float("-inf")), axis=1)
                    have = kmax >= 0
                    out_ids, out_lp = place_pick(out_ids, out_lp, n, t, have, idsel, vsel, m, scale, log_z, filtered,
                                                 kmax, key_t, MODE)
                    prev_key = tl.where(have, kmax, prev_key)
                    prev_id = tl.where(have, idsel, prev_id)
                out_ids = fill_free_ids(out_ids, n, V, TOP_N)
                wr = live_r[:, None] & (n < TOP_N)[None, :]
                tl.store(top_ids_ptr + row[:, None] * TOP_N + n[None, :], out_ids, mask=wr)
                tl.store(top_lp_ptr + row[:, None] * TOP_N + n[None, :], out_lp, mask=wr)


@dataclass(frozen=True)
class PoolLayout:
    """The fallback pool, rank-major: fp32 [n_shards, rows, shard_cols]; shard s holds the logits of
    global ids [s * shard_cols, (s + 1) * shard_cols) of each of ``rows`` pooled rows."""

    rows: int
    shard_cols: int
    n_shards: int = 1

    @property
    def stride_shard(self) -> int:
        return self.rows * self.shard_cols

    @property
    def numel(self) -> int:
        return self.n_shards * self.stride_shard


def _params_args(params: RowParams, dummy: torch.Tensor):
    args, flags = [], {}
    for name, x in (("SEED", params.seed), ("OFFSET", params.offset), ("TEMP", params.temperature),
                    ("TOPK", params.top_k), ("TOPP", params.top_p), ("MINP", params.min_p)):
        p, v, per_row = row_param_args(x, dummy)
        args += [p, float(v) if name in ("TEMP", "TOPP", "MINP") else v]
        flags[f"{name}_PER_ROW"] = per_row
    return args, flags


@dataclass(frozen=True)
class KeptLogits:
    """What stage 2 leaves the fallback: the extended candidate buffer ``src`` in ``layout`` (as
    select_filtered read it), stage 1's vocabulary tile ``tile_v`` (one slot's width), and
    select_filtered's need keys (int64 [B]: 0 = recompute the whole row, else a key at or
    below everything the row needs: recompute only the tiles whose boundary reaches it)."""

    layout: CandidateLayout
    src: BufferPair
    tile_v: int
    need_key: torch.Tensor

    def boundary_args(self, shard: int):
        """materialize_kernel's view of shard ``shard``'s boundary field."""
        lay, src = self.layout, self.src
        par_p, par_f, _par_i, par_on = parity_args(src.parity, self.need_key)
        base = src.base_f + shard * lay.stride_shard + F_BOUNDARY * lay.stride_field
        return (src.f, base, par_p, par_f, lay.stride_slot, self.need_key), par_on

    def buffer_args(self):
        """resolve_kernel's view of the whole candidate buffer."""
        lay, src = self.layout, self.src
        par_p, par_f, par_i, par_on = parity_args(src.parity, self.need_key)
        return (src.f, src.i, src.base_f, src.base_i, par_p, par_f, par_i, lay.n_slots, lay.n_local,
                lay.stride_shard, lay.stride_shard_i, lay.stride_field, lay.stride_ifield, lay.stride_slot,
                self.need_key), par_on


def launch_materialize(hidden: torch.Tensor, weight: torch.Tensor, pool: PoolLayout, dest: torch.Tensor, *,
                       flags: torch.Tensor, start: int, vocab_size: int, kept: KeptLogits, vocab_start: int = 0,
                       shard: int = 0, npeers=None, block_k: int = 64,
                       processing=None, programs: int = None, pdl_wait: bool = False,
                       trigger: bool = False) -> None:
    """Recompute the (processed) logits of the flagged rows ranked [start, start + pool.rows) (flags:
    select_filtered's bool [B]) of this weight
    (global ids from vocab_start) into shard ``shard`` of the pool ``dest`` (an int64 peer table
    when npeers is set): the tiles each row needs (``kept``). processing: the call's
    LogitProcessing, or None. programs: how many programs walk the tiles (default: two per SM on a
    GPU, one per tile under the interpreter; tests set a few to exercise the walk). pdl_wait: launched as a
    programmatic dependent of the launch before it, which it waits for at its first instruction; trigger: the
    caller's next launch is such a dependent (configs.pdl_fallback)."""
    D = hidden.shape[1]
    on_gpu = hidden.device.type == "cuda"
    n_tiles = cdiv(weight.shape[0], kept.tile_v)
    if n_tiles != kept.layout.n_local:
        raise ValueError(f"{weight.shape[0]} weight rows in tiles of {kept.tile_v} are not the candidate "
                         f"layout's {kept.layout.n_local} tiles")
    proc_args, proc_flags = processor_args(processing, kept.need_key)
    bnd_args, par_on = kept.boundary_args(shard)
    # GPU: two programs per SM walk the tiles (materialize is 251 registers on 4 warps: two fit);
    # interpreter: a program per tile, as many as before.
    if programs is None:
        programs = min(n_tiles, 2 * sm_count(hidden.device)) if on_gpu else n_tiles
    elif programs < 1:
        raise ValueError(f"programs must be >= 1, got {programs}")
    materialize_kernel[(programs,)](
        hidden, weight, dest, flags, flags.shape[0], start, D, weight.shape[0], vocab_size, vocab_start,
        hidden.stride(0),
        shard * pool.stride_shard, pool.shard_cols, *proc_args, *bnd_args,
        POOL=pool.rows, BLOCK_V=kept.tile_v, BLOCK_K=max(16, min(block_k, next_pow2(D))),
        DOT_PRECISION="ieee" if hidden.dtype == torch.float32 else "tf32",
        DOT_UPCAST=hidden.dtype == torch.bfloat16 and not on_gpu, PEER_TABLE=npeers is not None,
        NPEERS=npeers or 1, **proc_flags, DEVICE_PARITY=par_on, SCAN=SCAN, num_warps=4 if kept.tile_v <= 128 else 8,
        num_stages=2 if on_gpu else 1, **pdl_args(hidden.device, wait=pdl_wait, trigger=trigger))


def launch_resolve(pool: PoolLayout, src: torch.Tensor, params: RowParams, *, flags: torch.Tensor, start: int,
                   vocab_size: int, tokens: torch.Tensor, kept: KeptLogits,
                   logprobs=None, top_n: int = 0, mode: str = "scaled", top_ids=None, top_lp=None,
                   pdl_wait: bool = False, trigger: bool = False) -> None:
    """Resolve the pooled rows of the flagged rows ranked [start, start + pool.rows) from the pool ``src``
    (every tile a row needs recomputed) and the kept logits. pdl_wait: launched as a programmatic dependent of the
    launch before it (materialize's, where nothing comes between them), which it waits for first; trigger: the
    caller's next launch is such a dependent (the next round's materialize)."""
    device = src.device
    on_gpu = device.type == "cuda"
    args, pflags = _params_args(params, kept.need_key)
    buf_args, par_on = kept.buffer_args()
    # per pooled row: the gathered logits (fp32 values, int32 ids) and the list of recomputed tiles
    # Lanes per gathered row: REFINE_CAP, or fewer where every tile and all of U fit in fewer (a
    # small vocabulary: the same rows fit, in less work per row; select_filtered's REFINE_CAP test
    # can then never reject one).
    rcap = min(REFINE_CAP, next_pow2(kept.layout.n_slots * (kept.tile_v + KEEP)))
    scratch_f = torch.empty(pool.rows * rcap, dtype=torch.float32, device=device)
    scratch_i = torch.empty(pool.rows * rcap, dtype=torch.int32, device=device)
    scratch_t = torch.empty(pool.rows * max(1, rcap // kept.tile_v), dtype=torch.int32, device=device)
    # At least 512 lanes: Triton 3.6 fails to compile this kernel for sm_90 with 16 warps over
    # [1, 64] kept-logit tensors (TritonGPURemoveLayoutConversions); the extra lanes are masked.
    block_u = max(512, next_pow2(kept.layout.n_slots * KEEP))
    block = 8192 if on_gpu else 1024
    # GPU: a pooled row per program. Interpreter: as many as fit Triton's 2**20-element tensors
    # ([rows, lanes] with the widest of U's lanes, the gathered logits and a pass's step): all 256
    # pooled rows up to ~1,000 tiles, fewer past that (V = 151936 in 128-id tiles: 128 a program).
    block_r = 1 if on_gpu else min(pool.rows, max(1, 2**20 // max(block_u, rcap, block)))
    # A whole-row pass over the pool is latency-bound (one program per row): 8,192 logits per
    # step halves the steps of 4,096 (no spills at 16 warps, sm_90).
    resolve_kernel[(cdiv(pool.rows, block_r),)](
        src, pool.shard_cols, flags, flags.shape[0], start, vocab_size, *args,
        tokens, logprobs if logprobs is not None else tokens,
        top_ids if top_ids is not None else tokens, top_lp if top_lp is not None else tokens,
        *buf_args, scratch_f, scratch_i, scratch_t,
        **pflags, BLOCK=block, TOP_N=top_n, TOP_N_POW2=next_pow2(max(top_n, 1)),
        MODE=LOGPROBS_MODES.index(mode), LOGPROBS=logprobs is not None, FAST_LOG=fast_log_ok(device),
        POOL=pool.rows, BLOCK_R=block_r, KEEP=KEEP, BLOCK_U=block_u,
        TILE_V=kept.tile_v, RCAP=rcap, DEVICE_PARITY=par_on, SCAN=SCAN, num_warps=16 if on_gpu else 4,
        **pdl_args(device, wait=pdl_wait, trigger=trigger))


def run_fallback(hidden: torch.Tensor, weight: torch.Tensor, params: RowParams, *, vocab_size: int,
                 flags: torch.Tensor, tokens: torch.Tensor, kept: KeptLogits,
                 logprobs=None, top_n: int = 0, mode: str = "scaled", top_ids=None, top_lp=None,
                 block_k: int = 64, pdl: bool = False) -> None:
    """Resolve the flagged rows (select_filtered's bool [B]) exactly on one device (see the module docstring). Launches
    ceil(B / POOL_ROWS) rounds of (materialize, resolve), each a no-op once its slots are past
    the device count. pdl: every launch is a programmatic dependent of the one before it (configs.pdl_fallback;
    the caller launched select_filtered with ``trigger``), each waiting for it at its first instruction."""
    B = hidden.shape[0]
    if B == 0:
        return
    rows = POOL_ROWS if hidden.device.type == "cuda" else POOL_ROWS_INTERPRETER
    pool = PoolLayout(rows, weight.shape[0])
    buf = torch.empty(pool.numel, dtype=torch.float32, device=hidden.device)
    # A GPU runs every round (the empty ones exit at once: the host never reads the count). On a
    # CPU device the count is host memory already, so only the rounds with rows are launched.
    rows_to_cover = B if hidden.device.type == "cuda" else int(flags.sum())
    for start in range(0, rows_to_cover, rows):
        launch_materialize(hidden, weight, pool, buf, flags=flags, start=start,
                           vocab_size=vocab_size, kept=kept, block_k=block_k, processing=params.processing,
                           pdl_wait=pdl, trigger=pdl)
        last = start + rows >= rows_to_cover
        launch_resolve(pool, buf, params, flags=flags, start=start, vocab_size=vocab_size,
                       tokens=tokens, kept=kept, logprobs=logprobs, top_n=top_n, mode=mode, top_ids=top_ids,
                       top_lp=top_lp, pdl_wait=pdl, trigger=pdl and not last)
