"""Stage 2 of FlashSampling: reduce per-tile candidates to one token per row.

The winner is the slot with the largest perturbed score (the argmax over tiles
equals the argmax over the whole row, so this is exact pathwise). Ties go to the
lowest slot, i.e. the lowest vocabulary id, matching ``torch.argmax``. With
LOGPROBS the per-tile (max logit, sum of exp((logit - max) / T)) pairs are merged
into the row's (max M, sum S); then log p(token) = (logit - M) / T - log S and
logsumexp(logits / T) = M / T + log S. Everything stays finite for any T >= 1e-5
except that last sum, which overflows to +-inf only when logits / T itself leaves
the fp32 range. STATS also writes (M, log S) per row (group-log-mass publishes them).

Slots are numbered group * n_local + tile, groups being the tensor-parallel
ranks' blocks of the buffer (one group on a single GPU); the slot order is the
vocabulary order, so "lowest slot" is "lowest id" across ranks too.

A program owns BLOCK_R rows and walks the slots in chunks of BLOCK_S, keeping a
running best and a running (max, sum) pair, so any number of slots fits in
registers; rows are innermost in the buffer, so every chunk load is coalesced.

With DEVICE_PARITY, ``(*parity_ptr & 1) * parity_stride_*`` is added to the buffer
offsets: the parity half of a double buffer is chosen on the device (CUDA graphs).

A row returns token -1 (and NaN log-probability) when any tile saw a NaN logit or
a bad temperature, or when no id had a finite score.
"""
import triton
import triton.language as tl

from .fused_sample import _load_row_param, row_temperature
from .parity import parity_offsets


@triton.jit
def reduce_candidates_kernel(
    cand_f, cand_i, tokens_ptr, logprob_ptr, lse_ptr, stats_ptr,
    B, n_slots, n_local, buf_offset, buf_offset_i, stride_group, stride_group_i, stride_field, stride_slot,
    parity_ptr, parity_stride_f, parity_stride_i, temp_ptr, temp_val,
    BLOCK_R: tl.constexpr, BLOCK_S: tl.constexpr, LOGPROBS: tl.constexpr, DEVICE_PARITY: tl.constexpr,
    TEMP_PER_ROW: tl.constexpr, STATS: tl.constexpr,
):
    buf_offset, buf_offset_i = parity_offsets(buf_offset, buf_offset_i, parity_ptr, parity_stride_f,
                                              parity_stride_i, DEVICE_PARITY)
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    mask_r = rows < B
    if LOGPROBS:
        inv_t, _scale, _greedy, _bad = row_temperature(
            _load_row_param(temp_ptr, temp_val, rows, mask_r, tl.float32, TEMP_PER_ROW))
    best = tl.full([BLOCK_R], float("-inf"), tl.float32)
    best_slot = tl.zeros([BLOCK_R], tl.int32)
    poisoned = tl.zeros([BLOCK_R], tl.int32)
    run_max = tl.full([BLOCK_R], float("-inf"), tl.float32)
    run_sum = tl.zeros([BLOCK_R], tl.float32)
    for s0 in range(0, n_slots, BLOCK_S):
        slots = s0 + tl.arange(0, BLOCK_S)
        mask = (slots < n_slots)[:, None] & mask_r[None, :]
        # slot = group * n_local + tile; groups (ranks) are blocks of the buffer.
        offs = (buf_offset + (slots // n_local) * stride_group + (slots % n_local) * stride_slot)[:, None] \
            + rows[None, :]
        score = tl.load(cand_f + offs, mask=mask, other=float("-inf"))
        poisoned = poisoned | tl.max((score != score).to(tl.int32), axis=0)
        c_best = tl.max(score, axis=0)
        c_slot = s0 + tl.argmax(score, axis=0)
        # Strictly greater: an earlier chunk keeps ties (lowest vocabulary id wins).
        take = c_best > best
        best = tl.where(take, c_best, best)
        best_slot = tl.where(take, c_slot, best_slot)
        if LOGPROBS:
            tmax = tl.load(cand_f + stride_field * 2 + offs, mask=mask, other=float("-inf"))
            tsum = tl.load(cand_f + stride_field * 3 + offs, mask=mask, other=0.0)
            c_max = tl.max(tmax, axis=0)
            new_max = tl.maximum(run_max, c_max)
            # Tiles (and running state) with no valid id carry max = -inf and add nothing.
            safe = tl.where(new_max == float("-inf"), 0.0, new_max)
            c_sum = tl.sum(tl.where(tmax > float("-inf"), tsum * tl.exp((tmax - safe[None, :]) * inv_t[None, :]), 0.0),
                           axis=0)
            old = tl.where(run_max > float("-inf"), run_sum * tl.exp((run_max - safe) * inv_t), 0.0)
            run_sum = old + c_sum
            run_max = new_max
    failed = (poisoned > 0) | (best == float("-inf"))
    g = best_slot // n_local
    t = best_slot % n_local
    win = buf_offset + g * stride_group + t * stride_slot + rows
    idx = tl.load(cand_i + buf_offset_i + g * stride_group_i + t * stride_slot + rows, mask=mask_r, other=-1)
    tl.store(tokens_ptr + rows, tl.where(failed, -1, idx).to(tl.int64), mask=mask_r)
    if LOGPROBS:
        # No finite logit anywhere: M = -inf, S = 0, log S = -inf, lse = -inf (no log(0) evaluated).
        log_sum = tl.where(run_sum > 0.0, tl.log(tl.where(run_sum > 0.0, run_sum, 1.0)), float("-inf"))
        lse = tl.where(run_sum > 0.0, run_max * inv_t + log_sum, float("-inf"))
        logit = tl.load(cand_f + stride_field + win, mask=mask_r, other=0.0)
        tl.store(lse_ptr + rows, tl.where(poisoned > 0, float("nan"), lse), mask=mask_r)
        tl.store(logprob_ptr + rows, tl.where(failed, float("nan"), (logit - run_max) * inv_t - log_sum), mask=mask_r)
        if STATS:
            tl.store(stats_ptr + rows, tl.where(poisoned > 0, float("nan"), run_max), mask=mask_r)
            tl.store(stats_ptr + B + rows, tl.where(poisoned > 0, float("nan"), log_sum), mask=mask_r)
