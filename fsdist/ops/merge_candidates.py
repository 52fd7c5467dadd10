"""Stage 2 of FlashSampling: merge per-tile candidates into one token per row (one kernel).

The winner is the slot with the largest perturbed score (the argmax over tiles
equals the argmax over the whole row, so this is exact pathwise). Ties go to the
lowest slot, i.e. the lowest vocabulary id, matching ``torch.argmax``. With
LOGPROBS the per-tile (max logit, sum of exp((logit - max) / T)) pairs are merged
into the row's (max M, sum S); then log p(token) = (logit - M) / T - log S and
logsumexp(logits / T) = M / T + log S. Everything stays finite for any T >= 1e-5
except that last sum, which overflows to +-inf only when logits / T itself leaves
the fp32 range. STATS also writes (M, log S) per row (group-log-mass publishes them).

Slots are numbered shard * n_local + tile, shards being the tensor-parallel
ranks' blocks of the buffer (one shard on a single GPU); the slot order is the
vocabulary order, so "lowest slot" is "lowest id" across ranks too.

A program owns BLOCK_R rows and walks the slots in chunks of BLOCK_S, keeping a
running best and a running (max, sum) pair, so any number of slots fits in
registers; rows are innermost in the buffer, so every chunk load is coalesced.

With DEVICE_PARITY, ``(*parity_ptr & 1) * parity_stride_*`` is added to the buffer
offsets: the parity half of a double buffer is chosen on the device (CUDA graphs).

A row returns token -1 (and NaN log-probability) when any tile saw a NaN or +inf
logit or a bad temperature, or when no id had a finite score.
"""
from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from ..params import RowParams
from .epilogue import row_temperature
from .layout import BufferPair, CandidateLayout, slot_offset
from .parity import parity_args, parity_offsets
from .step_check import HeaderCheck, judge_headers, last_program_finishes_step, load_headers, writers_block
from .utils import cdiv, load_row_param, next_pow2, pdl_args, pdl_prologue, row_param_args


@triton.jit
def slot_winner(score, AXIS: tl.constexpr):
    """(best score, its index along AXIS (the lowest among equal scores), 1 where a score is NaN) of a
    chunk of per-slot scores (-inf where masked): one chunk's part of stage 2's argmax. select_filtered's
    folded merge takes a row's slots in one chunk along axis 1, this kernel in chunks along axis 0."""
    return (tl.max(score, axis=AXIS), tl.argmax(score, axis=AXIS),
            tl.max((score != score).to(tl.int32), axis=AXIS))


@triton.jit
def store_merged(cand_f, cand_i, buf_offset, buf_offset_i, tokens_ptr, logprob_ptr, lse_ptr, rows, mask_r,
                 best_slot, failed, poisoned, run_max, run_sum, log_raw, inv_t,
                 n_local, stride_shard, stride_shard_i, stride_field, stride_slot,
                 LOGPROBS: tl.constexpr, RAW: tl.constexpr):
    """Stage 2's outputs of each row from its winning slot and its log-sum-exp state: the token (-1 where
    ``failed``), and with LOGPROBS the logsumexp of logits / T (NaN where ``poisoned``) and the token's
    log-probability (NaN where failed): log_softmax(logits / T), or with RAW log_softmax(logits) from
    ``log_raw`` = log sum exp(logit - run_max). run_sum = sum exp((logit - run_max) / T) (0: no finite
    logit). Returns log run_sum (-inf without mass). One definition for the merge kernel and the merge
    select_filtered folds in (``MERGE``)."""
    shard = best_slot // n_local
    t = best_slot % n_local
    win = buf_offset + shard * stride_shard + t * stride_slot + rows
    idx = tl.load(cand_i + buf_offset_i + shard * stride_shard_i + t * stride_slot + rows, mask=mask_r, other=-1)
    tl.store(tokens_ptr + rows, tl.where(failed, -1, idx).to(tl.int64), mask=mask_r)
    # No finite logit anywhere: M = -inf, S = 0, log S = -inf, lse = -inf (no log(0) evaluated).
    log_sum = tl.where(run_sum > 0.0, tl.log(tl.where(run_sum > 0.0, run_sum, 1.0)), float("-inf"))
    if LOGPROBS:
        lse = tl.where(run_sum > 0.0, run_max * inv_t + log_sum, float("-inf"))
        logit = tl.load(cand_f + stride_field + win, mask=mask_r, other=0.0)
        tl.store(lse_ptr + rows, tl.where(poisoned, float("nan"), lse), mask=mask_r)
        if RAW:  # log_softmax(logits) of the token, whatever the temperature
            lp = (logit - run_max) - log_raw
        else:
            lp = (logit - run_max) * inv_t - log_sum
        tl.store(logprob_ptr + rows, tl.where(failed, float("nan"), lp), mask=mask_r)
    return log_sum


@triton.jit
def merge_candidates_kernel(
    cand_f, cand_i, tokens_ptr, logprob_ptr, lse_ptr, stats_ptr,
    B, n_slots, n_local, buf_offset, buf_offset_i, stride_shard, stride_shard_i, stride_field, stride_slot,
    parity_ptr, parity_stride_f, parity_stride_i, temp_ptr, temp_val,
    me, status_ptr, fp_slot, rec_slot, ticket_ptr,
    BLOCK_R: tl.constexpr, BLOCK_S: tl.constexpr, LOGPROBS: tl.constexpr, DEVICE_PARITY: tl.constexpr,
    TEMP_PER_ROW: tl.constexpr, STATS: tl.constexpr, CHECK: tl.constexpr = False, RAW: tl.constexpr = False,
    END_STEP: tl.constexpr = False, NW: tl.constexpr = 2, ONE_SHARD: tl.constexpr = False,
    PDL_WAIT: tl.constexpr = False, TRIGGER: tl.constexpr = False,
):
    pdl_prologue(PDL_WAIT, TRIGGER)  # (a programmatic dependent of stage 1: configs.pdl_stage2)
    buf_offset, buf_offset_i = parity_offsets(buf_offset, buf_offset_i, parity_ptr, parity_stride_f,
                                              parity_stride_i, DEVICE_PARITY)
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    mask_r = rows < B
    if CHECK:
        # The headers' loads go first and are judged after the loop: their latency hides behind the slots'.
        records, prints, sticky = load_headers(cand_i, buf_offset_i, n_slots // n_local, stride_shard_i, fp_slot,
                                               rec_slot, rows, mask_r, status_ptr, NW)
    if END_STEP:
        step = tl.load(parity_ptr)  # only the end of a step moves the counter: the last program stores step + 1
    if LOGPROBS:
        inv_t, _scale, _greedy, _bad = row_temperature(
            load_row_param(temp_ptr, temp_val, rows, mask_r, tl.float32, TEMP_PER_ROW))
    best = tl.full([BLOCK_R], float("-inf"), tl.float32)
    best_slot = tl.zeros([BLOCK_R], tl.int32)
    poisoned = tl.zeros([BLOCK_R], tl.int32)
    run_max = tl.full([BLOCK_R], float("-inf"), tl.float32)
    run_sum = tl.zeros([BLOCK_R], tl.float32)
    run_raw = tl.zeros([BLOCK_R], tl.float32)  # sum of exp(logit - max): raw logprobs (extended layouts)
    for s0 in range(0, n_slots, BLOCK_S):
        slots = s0 + tl.arange(0, BLOCK_S)
        mask = (slots < n_slots)[:, None] & mask_r[None, :]
        # slot = shard * n_local + tile; shards (ranks) are blocks of the buffer.
        offs = (buf_offset + slot_offset(slots, n_local, stride_shard, stride_slot, ONE_SHARD))[:, None] + rows[None, :]
        score = tl.load(cand_f + offs, mask=mask, other=float("-inf"))
        c_best, c_slot, c_nan = slot_winner(score, 0)
        poisoned = poisoned | c_nan
        c_slot += s0
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
            if RAW:
                rsum = tl.load(cand_f + stride_field * 4 + offs, mask=mask, other=0.0)
                run_raw = tl.where(run_max > float("-inf"), run_raw * tl.exp(run_max - safe), 0.0) \
                    + tl.sum(tl.where(tmax > float("-inf"), rsum * tl.exp(tmax - safe[None, :]), 0.0), axis=0)
            run_max = new_max
    if CHECK:
        # Every shard's header must match this rank's (step_check.py); a mismatch poisons rows.
        mismatch = judge_headers(records, prints, sticky, me, n_slots // n_local, mask_r, status_ptr, NW)
        poisoned = poisoned | mismatch.to(tl.int32)
    failed = (poisoned > 0) | (best == float("-inf"))
    if LOGPROBS:
        inv_t_out = inv_t
    else:
        inv_t_out = tl.full([BLOCK_R], 1.0, tl.float32)
    log_sum = store_merged(cand_f, cand_i, buf_offset, buf_offset_i, tokens_ptr, logprob_ptr, lse_ptr, rows, mask_r,
                           best_slot, failed, poisoned > 0, run_max, run_sum,
                           tl.log(tl.where(run_raw > 0.0, run_raw, 1.0)), inv_t_out, n_local, stride_shard,
                           stride_shard_i, stride_field, stride_slot, LOGPROBS, RAW)
    if LOGPROBS:
        if STATS:
            tl.store(stats_ptr + rows, tl.where(poisoned > 0, float("nan"), run_max), mask=mask_r)
            tl.store(stats_ptr + B + rows, tl.where(poisoned > 0, float("nan"), log_sum), mask=mask_r)
    if END_STEP:
        # This merge is the step's last reader of the buffer copy: its last program ends the step
        # (the counter, read above by every program, moves on; the findings join the sticky word),
        # which saves the separate end_step launch of a plain tensor-parallel call.
        last_program_finishes_step(ticket_ptr, parity_ptr, step, status_ptr)


def launch_merge(layout: CandidateLayout, src: BufferPair, batch: int, params: RowParams, *,
                 logprobs: bool = False, stats: bool = False, blocks: Optional[Tuple[int, int]] = None,
                 check: Optional[HeaderCheck] = None, raw: bool = False,
                 end_step: Optional[torch.Tensor] = None, pdl_wait: bool = False, trigger: bool = False):
    """Stage 2 over the local buffers ``src``: (tokens int64 [B], logprobs fp32 [B] or None,
    logsumexp fp32 [B] or None), plus, with ``stats``, fp32 [2, B] = (max raw logit M, log S)
    per row, S = sum exp((logit - M) / T) (the group-log-mass reduction publishes them).

    params: the rows' parameters (the temperature scales the log-sum-exp). blocks: (rows
    per program, slots per chunk) override, for tests. raw: logprobs of log_softmax(logits)
    instead of log_softmax(logits / T) (needs an extended layout). check: a checked layout's header
    check (step_check.py): rows whose shards' headers disagree with shard ``check.me``'s
    return -1 and the check's status word records why. end_step: a ticket (``step_check.new_ticket``):
    this merge is the step's last reader, and its last program ends the step (``step_check.finish_step``:
    the device counter ``src.parity`` advances, the check's findings join its sticky word) instead of a
    separate ``launch_end_step``. Needs ``check`` and a device counter. pdl_wait: launched as a programmatic
    dependent of the launch before it (configs.pdl_stage2), which it waits for at its first instruction. trigger:
    the caller's next launch is a programmatic dependent of this one and may launch now (select_filtered beside the
    merge, configs.pdl_select_beside_merge).
    """
    if src.peer_table:
        raise ValueError("stage 2 reads this process's buffers, not a peer table")
    if layout.checked != (check is not None):
        raise ValueError("a checked layout needs a HeaderCheck, and only a checked layout takes one")
    if raw and not layout.extended:
        raise ValueError("raw logprobs need an extended candidate layout")
    if end_step is not None and (check is None or src.parity is None or batch == 0):
        raise ValueError("a merge ends the step only with a header check, a device counter and rows to merge")
    device = src.f.device
    stats = stats and logprobs
    tokens = torch.empty(batch, dtype=torch.int64, device=device)
    lp = torch.empty(batch, dtype=torch.float32, device=device) if logprobs else tokens
    lse = torch.empty(batch, dtype=torch.float32, device=device) if logprobs else tokens
    st = torch.empty(2, batch, dtype=torch.float32, device=device) if stats else tokens
    if batch:
        if device.type == "cpu":  # interpreter: few, large programs
            block_r = min(128, max(16, next_pow2(batch)))
            block_s = min(next_pow2(layout.n_slots), 2048)
        else:
            # Latency bound: many programs of a few rows each, one pass over <= 1024 slots,
            # so a decode batch spreads over SMs instead of looping in one program.
            block_r, block_s = (2 if batch <= 64 else 4), min(next_pow2(layout.n_slots), 1024)
        block_r, block_s = blocks or (block_r, block_s)
        par_p, par_f, par_i, par_on = parity_args(src.parity, src.i)
        temp_p, temp_v, temp_row = row_param_args(params.temperature, src.i)
        merge_candidates_kernel[(cdiv(batch, block_r),)](
            src.f, src.i, tokens, lp, lse, st,
            batch, layout.n_slots, layout.n_local, src.base_f, src.base_i, layout.stride_shard,
            layout.stride_shard_i, layout.stride_field, layout.stride_slot, par_p, par_f, par_i,
            temp_p, float(temp_v),
            check.me if check else 0, check.status if check else src.i,
            layout.fingerprint_slot, layout.record_slot, end_step if end_step is not None else src.i,
            BLOCK_R=block_r, BLOCK_S=block_s, LOGPROBS=logprobs, DEVICE_PARITY=par_on,
            TEMP_PER_ROW=temp_row, STATS=stats, CHECK=check is not None, RAW=raw and logprobs,
            END_STEP=end_step is not None, NW=writers_block(layout.n_shards), ONE_SHARD=layout.n_shards == 1,
            num_warps=4, **pdl_args(device, wait=pdl_wait, trigger=trigger),
        )
    out = (tokens, (lp if logprobs else None), (lse if logprobs else None))
    return out + (st,) if stats else out
