"""Group-log-mass reduction kernels (paper Algorithm I.4): choose the rank, then its sample.

Every tensor-parallel rank k has, per row, an exact local sample z_k from its shard,
its log-probability within the shard, and the shard's log-mass L_k = logsumexp(logits_k
/ T), kept as (M_k, log S_k) with M_k the shard's largest raw logit and S_k = sum
exp((logit - M_k) / T), so that L_k = M_k / T + log S_k never has to be formed (it
overflows fp32 for tiny T). Lemma D.2 of the paper: drawing the shard K with
P(K = k) = exp(L_k) / sum_j exp(L_j) and returning z_K is an exact sample of the full
softmax. K is drawn by Gumbel-max: argmax_k L_k + g_k = argmax_k M_k + T (log S_k + g_k)
(times T > 0), with noise ``gumbel(seed_b, offset_b, k, STREAM_GROUP)``: counter-based,
keyed by the rank and a stream of its own, so every rank draws the same K without
communicating, the draw is independent of the in-shard noise (stream STREAM_VOCAB) and
there is no host RNG (CUDA graph safe). Greedy rows (T < 1e-5) pick the shard with the
largest maximum logit M_k (T = 0 in the same formula); ties go to the lowest rank, i.e.
the lowest vocabulary id, like torch.argmax.

The exchange buffer holds, per step, fp32 [n_ranks, 3, batch_cap] (LOGPROB, MAX,
LOGSUM) and int32 [n_ranks, batch_cap] (token), batch innermost; a checked layout adds
two int32 slots per rank for the call's header (row fingerprints, step record; see
``step_check.py``), which the publish writes and the select verifies.
``group_publish_kernel`` writes this rank's values into its slot of every peer's
buffer (peer table) or of its own; ``group_select_kernel`` reads all ranks' slots and
writes the global token, the global log-sum-exp M / T + log S (M = max_k M_k, S = sum_k
S_k exp((M_k - M) / T)) and the token's global log-probability
``logprob_k + log S_k + (M_k - M) / T - log S``. Both kernels take an optional device
parity (``DEVICE_PARITY``, see ``fsdist.ops.parity``) that picks the half
of a double exchange buffer from a counter in device memory.

Rows that any rank poisoned (NaN or +inf logit, bad temperature: NaN values) return
token -1 with NaN lse and logprob. Ranks whose shard has no finite logit for the row
(padding only: M_k = -inf) carry no mass and are skipped; a row with no mass anywhere
returns -1. Nothing here knows about process groups.
"""
from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl

from ..params import RowParams
from .epilogue import row_temperature
from .layout import BufferPair
from .noise import STREAM_GROUP, gumbel
from .parity import parity_args, parity_offsets
from .step_check import (HeaderCheck, judge_headers, load_headers, write_row_fingerprints, write_step_record,
                         writers_block)
from .utils import cdiv, load_row_param, next_pow2, row_param_args

# fp32 fields per rank and row: 0 the log-probability of the rank's local sample within its
# shard, 1 the shard's largest raw logit M_k, 2 log S_k (S_k = sum exp((logit - M_k) / T)).
N_X_FIELDS = 3
# The rank-choice noise stream, handed to the kernel as a constexpr argument.
_STREAM_GROUP = int(getattr(STREAM_GROUP, "value", STREAM_GROUP))


@dataclass(frozen=True)
class ExchangeLayout:
    """One step's exchange buffer: fp32 [n_ranks, 3, batch_cap], int32 [n_ranks, 1 (+2), batch_cap]."""

    n_ranks: int
    batch_cap: int
    checked: bool = False  # two header slots per rank (step_check.py)

    @property
    def stride_field(self) -> int:
        return self.batch_cap

    @property
    def stride_rank(self) -> int:
        return N_X_FIELDS * self.batch_cap

    @property
    def stride_rank_i(self) -> int:
        return (3 if self.checked else 1) * self.batch_cap

    @property
    def fingerprint_slot(self) -> int:
        return self.batch_cap

    @property
    def record_slot(self) -> int:
        return 2 * self.batch_cap

    @property
    def float_numel(self) -> int:
        return self.n_ranks * self.stride_rank

    @property
    def int_numel(self) -> int:
        return self.n_ranks * self.stride_rank_i

    def alloc(self, device):
        return (torch.empty(self.float_numel, dtype=torch.float32, device=device),
                torch.empty(self.int_numel, dtype=torch.int32, device=device))


# Kernels spell the field numbers out (0 logprob, 1 max, 2 log-sum): Triton's compiler
# rejects non-constexpr module globals inside @triton.jit code (the interpreter does not notice).
@triton.jit
def _publish_store(base_f, base_i, off_f, off_i, stride_field, rows, tok, lp, m, logs, mask):
    tl.store(base_f + off_f + rows, lp, mask=mask)  # field 0: logprob
    tl.store(base_f + off_f + stride_field + rows, m, mask=mask)  # field 1: M
    tl.store(base_f + off_f + 2 * stride_field + rows, logs, mask=mask)  # field 2: log S
    tl.store(base_i + off_i + rows, tok, mask=mask)


@triton.jit
def group_publish_kernel(tok_ptr, lp_ptr, stats_ptr, dst_f, dst_i, off_f, off_i, stride_field, B,
                         parity_ptr, parity_stride_f, parity_stride_i,
                         seed_ptr, seed_val, offset_ptr, offset_val, temp_ptr, temp_val, hdr_off_i, rec_off_i, flags,
                         BLOCK: tl.constexpr, PEER_TABLE: tl.constexpr, NPEERS: tl.constexpr,
                         DEVICE_PARITY: tl.constexpr, SEED_PER_ROW: tl.constexpr, OFFSET_PER_ROW: tl.constexpr,
                         TEMP_PER_ROW: tl.constexpr, HEADER: tl.constexpr):
    """Store (token, logprob, M, log S) of rows [0, B) at element offsets off_f / off_i, and with
    HEADER the call's header (row fingerprints at off_i + hdr_off_i, the step record at off_i + rec_off_i).
    stats_ptr: fp32 [2, B] = (M, log S) from stage 2's STATS output."""
    off_f, off_i = parity_offsets(off_f, off_i, parity_ptr, parity_stride_f, parity_stride_i, DEVICE_PARITY)
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = rows < B
    tok = tl.load(tok_ptr + rows, mask=mask, other=-1).to(tl.int32)
    lp = tl.load(lp_ptr + rows, mask=mask, other=0.0)
    m = tl.load(stats_ptr + rows, mask=mask, other=0.0)
    logs = tl.load(stats_ptr + B + rows, mask=mask, other=0.0)
    if PEER_TABLE:
        # Fan-out: the same values go to this rank's slot in every peer's buffer.
        for p in tl.static_range(NPEERS):
            base_f = tl.load(dst_f + p).to(tl.pointer_type(tl.float32))
            base_i = tl.load(dst_i + p).to(tl.pointer_type(tl.int32))
            _publish_store(base_f, base_i, off_f, off_i, stride_field, rows, tok, lp, m, logs, mask)
    else:
        _publish_store(dst_f, dst_i, off_f, off_i, stride_field, rows, tok, lp, m, logs, mask)
    if HEADER:
        seed = load_row_param(seed_ptr, seed_val, rows, mask, tl.int64, SEED_PER_ROW)
        offset = load_row_param(offset_ptr, offset_val, rows, mask, tl.int64, OFFSET_PER_ROW)
        temp = load_row_param(temp_ptr, temp_val, rows, mask, tl.float32, TEMP_PER_ROW)
        write_row_fingerprints(dst_i, off_i + hdr_off_i, rows, mask, seed, offset, temp, PEER_TABLE, NPEERS)
        if tl.program_id(0) == 0:
            write_step_record(dst_i, off_i + rec_off_i, parity_ptr, B, flags, 0, PEER_TABLE, NPEERS)


@triton.jit
def group_select_kernel(
    ex_f, ex_i, base_f, base_i, stride_rank, stride_field, stride_rank_i, n_ranks,
    seed_ptr, seed_val, offset_ptr, offset_val, temp_ptr, temp_val,
    tokens_ptr, logprob_ptr, lse_ptr, B,
    parity_ptr, parity_stride_f, parity_stride_i,
    me, status_ptr, fp_slot, rec_slot,
    BLOCK_R: tl.constexpr, SEED_PER_ROW: tl.constexpr, OFFSET_PER_ROW: tl.constexpr,
    TEMP_PER_ROW: tl.constexpr, NOISE: tl.constexpr, STREAM: tl.constexpr, DEVICE_PARITY: tl.constexpr,
    CHECK: tl.constexpr = False, NW: tl.constexpr = 2,
):
    base_f, base_i = parity_offsets(base_f, base_i, parity_ptr, parity_stride_f, parity_stride_i, DEVICE_PARITY)
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    mask = rows < B
    if CHECK:  # the headers' loads first, judged after the loop over the ranks (their latency overlaps)
        records, prints, sticky = load_headers(ex_i, base_i, n_ranks, stride_rank_i, fp_slot, rec_slot, rows, mask,
                                               status_ptr, NW)
    temp = load_row_param(temp_ptr, temp_val, rows, mask, tl.float32, TEMP_PER_ROW)
    inv_t, noise_scale, _greedy, _bad = row_temperature(temp)
    if NOISE:
        seed = load_row_param(seed_ptr, seed_val, rows, mask, tl.int64, SEED_PER_ROW)
        offset = load_row_param(offset_ptr, offset_val, rows, mask, tl.int64, OFFSET_PER_ROW)
    best_key = tl.full([BLOCK_R], float("-inf"), tl.float32)
    best_tok = tl.full([BLOCK_R], -1, tl.int32)
    best_rel = tl.zeros([BLOCK_R], tl.float32)  # logprob_k + log S_k of the chosen rank
    best_m = tl.zeros([BLOCK_R], tl.float32)
    poisoned = tl.zeros([BLOCK_R], tl.int32)
    run_max = tl.full([BLOCK_R], float("-inf"), tl.float32)
    run_sum = tl.zeros([BLOCK_R], tl.float32)
    for k in range(0, n_ranks):
        slot = base_f + k * stride_rank + rows
        lp_k = tl.load(ex_f + slot, mask=mask, other=0.0)  # field 0: logprob
        m_k = tl.load(ex_f + slot + stride_field, mask=mask, other=float("-inf"))  # field 1: M
        logs_k = tl.load(ex_f + slot + 2 * stride_field, mask=mask, other=float("-inf"))  # field 2: log S
        tok_k = tl.load(ex_i + base_i + k * stride_rank_i + rows, mask=mask, other=-1)
        poisoned = poisoned | ((m_k != m_k) | (logs_k != logs_k)).to(tl.int32)
        alive = m_k > float("-inf")  # False for NaN too
        if NOISE:
            g = gumbel(seed, offset, tl.zeros([BLOCK_R], tl.int32) + k, STREAM)
            key = m_k + noise_scale * (logs_k + g)  # greedy rows: scale 0, the shard's max logit
        else:
            key = m_k
        key = tl.where(alive, key, float("-inf"))
        # Strictly greater: the lowest rank keeps ties (lowest vocabulary id).
        take = key > best_key
        best_key = tl.where(take, key, best_key)
        best_tok = tl.where(take, tok_k, best_tok)
        best_rel = tl.where(take, lp_k + logs_k, best_rel)
        best_m = tl.where(take, m_k, best_m)
        # Online (max, sum) of the live ranks' masses S_k exp(M_k / T).
        new_max = tl.maximum(run_max, tl.where(alive, m_k, float("-inf")))
        safe = tl.where(new_max == float("-inf"), 0.0, new_max)
        run_sum = tl.where(run_max > float("-inf"), run_sum * tl.exp((run_max - safe) * inv_t), 0.0) \
            + tl.where(alive, tl.exp(logs_k + (m_k - safe) * inv_t), 0.0)
        run_max = new_max
    if CHECK:
        # Every rank's header must match this rank's (step_check.py); a mismatch poisons rows.
        mismatch = judge_headers(records, prints, sticky, me, n_ranks, mask, status_ptr, NW)
        poisoned = poisoned | mismatch.to(tl.int32)
    bad = poisoned > 0
    failed = bad | (best_key == float("-inf"))
    # No live rank: log S = -inf and lse = -inf (log of an empty sum), without evaluating log(0).
    live = run_sum > 0.0
    log_sum = tl.where(live, tl.log(tl.where(live, run_sum, 1.0)), float("-inf"))
    lse = tl.where(live, run_max * inv_t + log_sum, float("-inf"))
    lp = best_rel + (best_m - run_max) * inv_t - log_sum
    tl.store(tokens_ptr + rows, tl.where(failed, -1, best_tok).to(tl.int64), mask=mask)
    tl.store(lse_ptr + rows, tl.where(bad, float("nan"), lse), mask=mask)
    tl.store(logprob_ptr + rows, tl.where(failed, float("nan"), lp), mask=mask)


def _block_rows(batch: int, device: torch.device) -> int:
    if device.type == "cpu":  # interpreter: few, large programs
        return min(1024, max(16, next_pow2(batch)))
    return 128


def launch_group_publish(tokens: torch.Tensor, logprobs: torch.Tensor, stats: torch.Tensor,
                         layout: ExchangeLayout, dest: BufferPair, *, rank: int,
                         params: Optional[RowParams] = None, flags: int = 0) -> None:
    """Write rows [0, B) of (tokens, logprobs, stats = (M, log S)) into slot ``rank`` of the
    exchange buffer ``dest`` (through its peer table into every peer's, if it has one).
    A checked layout also gets the call's header: needs ``params`` and ``dest.parity``."""
    B = tokens.shape[0]
    if B > layout.batch_cap:
        raise ValueError(f"batch {B} exceeds the exchange buffer's capacity {layout.batch_cap}")
    if not 0 <= rank < layout.n_ranks:
        raise ValueError(f"rank {rank} outside the exchange layout's {layout.n_ranks} ranks")
    if B == 0:
        return
    if layout.checked and (params is None or dest.parity is None):
        raise ValueError("a checked exchange layout needs params and the caller's device step counter")
    block = _block_rows(B, tokens.device)
    par_p, par_f, par_i, par_on = parity_args(dest.parity, dest.i)
    p = params or RowParams(1.0, 0, 0)
    seed_p, seed_v, seed_row = row_param_args(p.seed, dest.i)
    off_p, off_v, off_row = row_param_args(p.offset, dest.i)
    temp_p, temp_v, temp_row = row_param_args(p.temperature, dest.i)
    group_publish_kernel[(cdiv(B, block),)](
        tokens, logprobs, stats, dest.f, dest.i,
        dest.base_f + rank * layout.stride_rank, dest.base_i + rank * layout.stride_rank_i, layout.stride_field, B,
        par_p, par_f, par_i,
        seed_p, seed_v, off_p, off_v, temp_p, float(temp_v), layout.fingerprint_slot, layout.record_slot, flags,
        BLOCK=block, PEER_TABLE=dest.peer_table, NPEERS=dest.npeers or 1, DEVICE_PARITY=par_on,
        SEED_PER_ROW=seed_row, OFFSET_PER_ROW=off_row, TEMP_PER_ROW=temp_row, HEADER=layout.checked, num_warps=4,
    )


def launch_group_select(layout: ExchangeLayout, src: BufferPair, batch: int, params: RowParams,
                        check: Optional[HeaderCheck] = None):
    """Pick each row's rank from the local exchange buffer ``src``; returns (tokens int64 [B],
    logprobs fp32 [B], logsumexp fp32 [B]). check: a checked layout's header check."""
    if src.peer_table:
        raise ValueError("group select reads this process's buffers, not a peer table")
    if layout.checked != (check is not None):
        raise ValueError("a checked layout needs a HeaderCheck, and only a checked layout takes one")
    device = src.f.device
    tokens = torch.empty(batch, dtype=torch.int64, device=device)
    lp = torch.empty(batch, dtype=torch.float32, device=device)
    lse = torch.empty(batch, dtype=torch.float32, device=device)
    if batch > layout.batch_cap:
        raise ValueError(f"batch {batch} exceeds the exchange buffer's capacity {layout.batch_cap}")
    if batch:
        dummy = src.i
        seed_p, seed_v, seed_row = row_param_args(params.seed, dummy)
        off_p, off_v, off_row = row_param_args(params.offset, dummy)
        temp_p, temp_v, temp_row = row_param_args(params.temperature, dummy)
        block = _block_rows(batch, device)
        par_p, par_f, par_i, par_on = parity_args(src.parity, dummy)
        group_select_kernel[(cdiv(batch, block),)](
            src.f, src.i, src.base_f, src.base_i, layout.stride_rank, layout.stride_field, layout.stride_rank_i,
            layout.n_ranks,
            seed_p, seed_v, off_p, off_v, temp_p, float(temp_v),
            tokens, lp, lse, batch,
            par_p, par_f, par_i,
            check.me if check else 0, check.status if check else dummy, layout.fingerprint_slot, layout.record_slot,
            BLOCK_R=block, SEED_PER_ROW=seed_row, OFFSET_PER_ROW=off_row, TEMP_PER_ROW=temp_row,
            NOISE=not params.all_greedy, STREAM=_STREAM_GROUP, DEVICE_PARITY=par_on, CHECK=check is not None,
            NW=writers_block(layout.n_ranks), num_warps=4,
        )
    return tokens, lp, lse
