"""Stage 1 for large batches: cuBLAS logits per vocabulary chunk, then a sampling pass (one kernel).

For large batches fsdist lets cuBLAS compute the logits of one vocabulary chunk
(sized to stay in L2) and then runs this kernel over them. It writes exactly the
candidates the fused kernel's epilogue would write for the same logits (same
noise, same tiles, same layout), so both paths give the same token.

This pass is pure elementwise work (one Philox-4x32-10 per four ids, two logs per
id) over B x V elements: at B = 256 that is ~39 M Gumbel variates per call, so its
instruction count, not memory, sets its cost. Two things keep it lean:

* Lanes instead of a reshape. The RNG contract yields the noise of ids 4q .. 4q+3 as
  four separate words (``noise.vocab_quad_bits``). Rather than interleaving those words into a [rows, BLOCK_V]
  tile (a layout change that goes through shared memory), the kernel loads the
  logits tile contiguously and splits it in registers into four [rows, BLOCK_V / 4]
  lanes, ``lane j = ids 4q + j`` (faster than four strided loads), and pairs
  each lane with its own word. The argmax does not care about column order; the
  winning id is rebuilt as 4q + j.
* Cheap reductions. The four lanes are merged elementwise, then one float max
  that propagates NaN (it doubles as the poisoned-row check) and one integer min
  over the ids that reach it (ties go to the lowest id, as in the fused kernel).
"""
from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from ..params import RowParams
from .apply_entries import launch_apply_entries
from .configs import TileConfig, chunk_rows_for, chunk_workspace_bytes
from .epilogue import perturb, raw_sum, row_temperature, tile_topk, write_candidates, write_kept
from .layout import KEEP, BufferPair, CandidateLayout
from .noise import gumbel_from_bits, vocab_quad_bits
from .parity import parity_args, parity_offsets
from .processors import apply_processors, processor_args
from .step_check import call_flags, write_row_fingerprints, write_step_record, writes_header
from .utils import cdiv, fast_log_ok, load_row_param, next_pow2, row_param_args


@triton.jit
def _nan_max(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _lane_scores(x, valid, noise_scale, bits, NOISE: tl.constexpr, FAST_LOG: tl.constexpr):
    """(masked raw logits, perturbed scores logit + T * Gumbel) of one lane."""
    logit = tl.where(valid, x, float("-inf"))
    if NOISE:
        score = perturb(logit, noise_scale[:, None], gumbel_from_bits(bits, FAST_LOG), FAST_LOG)
    else:
        score = logit
    return logit, score


@triton.jit
def _lane_sum(s, valid, tmax_safe, inv_t):
    live = valid & (s > float("-inf"))
    return tl.sum(tl.where(live, tl.exp((s - tmax_safe[:, None]) * inv_t[:, None]), 0.0), axis=1)


@triton.jit
def sample_logits_kernel(
    logits_ptr, stride_lb, tile_base, tile_end,
    seed_ptr, seed_val, offset_ptr, offset_val, temp_ptr, temp_val,
    cand_f, cand_i,
    B, V_rows, vocab_size, vocab_start,
    buf_offset, buf_offset_i, stride_field, stride_slot,
    parity_ptr, parity_stride_f, parity_stride_i,
    hdr_off_i, flags, stride_ifield, xfp_ptr, xfp_val,
    bm_ptr, bm_stride, ent_ptr, val_ptr, ent_stride, ent_width, search_steps, pen_ptr, pen_stride,
    BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr, TILES: tl.constexpr,
    SEED_PER_ROW: tl.constexpr, OFFSET_PER_ROW: tl.constexpr, TEMP_PER_ROW: tl.constexpr,
    NOISE: tl.constexpr, LOGPROBS: tl.constexpr,
    PEER_TABLE: tl.constexpr, NPEERS: tl.constexpr, FAST_LOG: tl.constexpr,
    DEVICE_PARITY: tl.constexpr, HEADER: tl.constexpr = False, EXTENDED: tl.constexpr = False,
    KEEP: tl.constexpr = 4, XFP_PER_ROW: tl.constexpr = False,
    BITMASK: tl.constexpr = False, SPARSE: tl.constexpr = False, PINNED: tl.constexpr = False,
    WINNER_LOGIT: tl.constexpr = True, RAW_SUM: tl.constexpr = True,
):
    """Candidates of vocabulary tiles [tile_base, tile_end) from a logits chunk whose column 0
    is weight row tile_base * BLOCK_V. A program covers BLOCK_B rows and TILES tiles."""
    Q: tl.constexpr = BLOCK_V // 4
    BIG: tl.constexpr = 1 << 30
    pid_b = tl.program_id(0)
    offs_b = pid_b * BLOCK_B + tl.arange(0, BLOCK_B)
    mask_b = offs_b < B
    q = tl.arange(0, Q)

    # Row parameters: loaded once, shared by the program's tiles.
    temp = load_row_param(temp_ptr, temp_val, offs_b, mask_b, tl.float32, TEMP_PER_ROW)
    inv_t, noise_scale, _greedy, bad_temp = row_temperature(temp)
    seed = load_row_param(seed_ptr, seed_val, offs_b, mask_b, tl.int64, SEED_PER_ROW)
    offset = load_row_param(offset_ptr, offset_val, offs_b, mask_b, tl.int64, OFFSET_PER_ROW)
    row_ptr = logits_ptr + offs_b[:, None].to(tl.int64) * stride_lb
    buf_offset, buf_offset_i = parity_offsets(buf_offset, buf_offset_i, parity_ptr, parity_stride_f,
                                              parity_stride_i, DEVICE_PARITY)

    for t in tl.static_range(TILES):
        pid_v = tile_base + tl.program_id(1) * TILES + t
        if pid_v < tile_end:
            local = pid_v * BLOCK_V + 4 * q  # weight row of lane 0
            gid = vocab_start + local  # global id of lane 0
            v0 = (local < V_rows) & (gid < vocab_size)
            v1 = (local + 1 < V_rows) & (gid + 1 < vocab_size)
            v2 = (local + 2 < V_rows) & (gid + 2 < vocab_size)
            v3 = (local + 3 < V_rows) & (gid + 3 < vocab_size)
            # One contiguous (vectorised) load of the tile, then the lanes peeled off in registers.
            cols = (pid_v - tile_base) * BLOCK_V + tl.arange(0, BLOCK_V)
            inb = (pid_v * BLOCK_V + tl.arange(0, BLOCK_V)) < V_rows
            tile = tl.load(row_ptr + cols[None, :], mask=mask_b[:, None] & inb[None, :], other=0.0)
            if BITMASK or SPARSE:
                # Processors (processors.py) on the tile in natural column order, before the
                # lanes split. A NaN / +inf raw logit still poisons the row even where the
                # bitmask then hides it, as in the fused kernel.
                tcol = tl.arange(0, BLOCK_V)
                tgid = vocab_start + pid_v * BLOCK_V + tcol
                tok_ = ((pid_v * BLOCK_V + tcol) < V_rows) & (tgid < vocab_size)
                raw = tl.where(tok_[None, :], tile, float("-inf"))
                raw_bad = tl.max(((raw != raw) | (raw == float("inf"))).to(tl.int32), axis=1) > 0
                tile = apply_processors(raw, offs_b, mask_b, tgid, tok_, vocab_start + pid_v * BLOCK_V, bm_ptr,
                                        bm_stride, ent_ptr, val_ptr, ent_stride, ent_width, search_steps, pen_ptr,
                                        pen_stride, BITMASK, SPARSE, PINNED)
            else:
                raw_bad = bad_temp & False
            xe, xo = tl.split(tl.reshape(tile, [BLOCK_B, Q, 2, 2]))  # lanes (0, 2) and (1, 3)
            x0, x2 = tl.split(xe)
            x1, x3 = tl.split(xo)
            if NOISE:
                r0, r1, r2, r3 = vocab_quad_bits(seed[:, None], offset[:, None], (gid >> 2)[None, :], 10, FAST_LOG)
            else:
                r0 = 0
                r1 = 0
                r2 = 0
                r3 = 0
            s0, c0 = _lane_scores(x0, v0[None, :], noise_scale, r0, NOISE, FAST_LOG)
            s1, c1 = _lane_scores(x1, v1[None, :], noise_scale, r1, NOISE, FAST_LOG)
            s2, c2 = _lane_scores(x2, v2[None, :], noise_scale, r2, NOISE, FAST_LOG)
            s3, c3 = _lane_scores(x3, v3[None, :], noise_scale, r3, NOISE, FAST_LOG)

            # Lanes are merged elementwise first, so each row needs only one float and one
            # integer reduction. The max propagates NaN: a NaN logit makes m NaN, which
            # poisons the row (its noise is finite, so only the logit can be NaN); so does
            # a +inf logit (m = +inf).
            m = tl.reduce(_nan_max(_nan_max(c0, c1), _nan_max(c2, c3)), 1, _nan_max)
            mm = m[:, None]
            lane = tl.where(c0 == mm, 0, tl.where(c1 == mm, 1, tl.where(c2 == mm, 2, tl.where(c3 == mm, 3, BIG))))
            best = tl.min(lane + (4 * q)[None, :], axis=1)  # the lowest id that reaches m
            lane0 = (4 * q)[None, :]
            poisoned = (m != m) | (m == float("inf")) | bad_temp | raw_bad
            best_score = tl.where(poisoned, float("nan"), m)
            best_idx = tl.where(poisoned, -1, vocab_start + pid_v * BLOCK_V + best).to(tl.int32)

            if LOGPROBS:
                tmax = tl.maximum(tl.maximum(tl.max(s0, axis=1), tl.max(s1, axis=1)),
                                  tl.maximum(tl.max(s2, axis=1), tl.max(s3, axis=1)))
                safe = tl.where(tmax == float("-inf"), 0.0, tmax)
                tsum = (_lane_sum(s0, v0[None, :], safe, inv_t) + _lane_sum(s1, v1[None, :], safe, inv_t)
                        + _lane_sum(s2, v2[None, :], safe, inv_t) + _lane_sum(s3, v3[None, :], safe, inv_t))
                b2 = best[:, None]
                best_logit = best_score  # field 1 only feeds the winner's logprob (WINNER_LOGIT)
                if WINNER_LOGIT:
                    best_logit = tl.maximum(
                        tl.maximum(tl.max(tl.where(lane0 == b2, s0, float("-inf")), axis=1),
                                   tl.max(tl.where(lane0 + 1 == b2, s1, float("-inf")), axis=1)),
                        tl.maximum(tl.max(tl.where(lane0 + 2 == b2, s2, float("-inf")), axis=1),
                                   tl.max(tl.where(lane0 + 3 == b2, s3, float("-inf")), axis=1)))
            else:
                tmax = best_score
                tsum = best_score
                best_logit = best_score

            dst = buf_offset + pid_v * stride_slot + offs_b
            dst_i = buf_offset_i + pid_v * stride_slot + offs_b
            write_candidates(cand_f, cand_i, dst, dst_i, stride_field, best_score, best_idx, best_logit, tmax, tsum,
                             mask_b, LOGPROBS, PEER_TABLE, NPEERS)
            if EXTENDED:
                # The kept logits, from the tile in its natural column order (epilogue.py).
                col = tl.arange(0, BLOCK_V)
                ok = ((pid_v * BLOCK_V + col) < V_rows) & ((vocab_start + pid_v * BLOCK_V + col) < vocab_size)
                full = tl.where(ok[None, :], tile, float("-inf"))
                kept, kept_cols, boundary = tile_topk(full, col, KEEP)
                rsum = tl.full([BLOCK_B], float("nan"), tl.float32)  # only "raw" logprobs read it (RAW_SUM)
                if RAW_SUM:
                    rsum = raw_sum(full, ok[None, :], tmax)
                write_kept(cand_f, cand_i, dst, dst_i, stride_field, stride_ifield, rsum,
                           kept, vocab_start + pid_v * BLOCK_V + kept_cols, boundary, mask_b, KEEP, PEER_TABLE, NPEERS)

    if HEADER:
        # The call's header (step_check.py), written by the programs that own vocabulary tile 0.
        if (tile_base == 0) & (tl.program_id(1) == 0):
            xfp = load_row_param(xfp_ptr, xfp_val, offs_b, mask_b, tl.int64, XFP_PER_ROW)
            write_row_fingerprints(cand_i, buf_offset_i + hdr_off_i, offs_b, mask_b, seed, offset ^ xfp, temp,
                                   PEER_TABLE, NPEERS)
            if pid_b == 0:
                write_step_record(cand_i, buf_offset_i + hdr_off_i + stride_slot, parity_ptr, B, flags, 0,
                                  PEER_TABLE, NPEERS)

def launch_sample_logits(logits: torch.Tensor, params: RowParams, layout: CandidateLayout, dest: BufferPair, *,
                         block_v: int, tiles: Tuple[int, int], V_rows: int, vocab_size: int, vocab_start: int = 0,
                         shard: int = 0, logprobs: bool = False, block_b: Optional[int] = None,
                         tiles_per_program: int = 2, num_warps: Optional[int] = None,
                         extended: Optional[bool] = None, flags: Optional[int] = None,
                         sparse_in_tile: bool = True, raw_sums: bool = True, winner_logit: bool = False) -> None:
    """The sampling pass over fp32 ``logits`` [B, n] (column 0 = weight row tiles[0] * block_v):
    candidates of vocabulary tiles [tiles[0], tiles[1]) into block ``shard`` of ``dest``.
    sparse_in_tile=False: the logits already hold the call's bias and penalties
    (``apply_entries``); the tiles apply only its bitmask. The winner's logit (field 1) is written
    with ``logprobs`` or ``winner_logit``, as launch_fused's."""
    B = logits.shape[0]
    if B == 0 or tiles[1] <= tiles[0]:
        return
    header = writes_header(layout, dest)
    extended = layout.extended if extended is None else extended
    if extended and not layout.extended:
        raise ValueError("kept logits need an extended candidate layout")
    dummy = dest.i
    seed_p, seed_v, seed_row = row_param_args(params.seed, dummy)
    off_p, off_v, off_row = row_param_args(params.offset, dummy)
    temp_p, temp_v, temp_row = row_param_args(params.temperature, dummy)
    xfp_p, xfp_v, xfp_row = row_param_args(params.fingerprint, dummy)
    par_p, par_f, par_i, par_on = parity_args(dest.parity, dummy)
    on_gpu = logits.device.type == "cuda"
    if block_b is None:
        # GPU (bench/epilogue_bench.py, H100 and H200): 16-row blocks while that still fills
        # the SMs, 32 rows on 8 warps past B = 128. Interpreter: few, big programs.
        block_b = (16 if B <= 128 else 32) if on_gpu else max(16, min(256, next_pow2(B)))
    if num_warps is None:
        num_warps = 8 if block_b >= 32 and on_gpu else 4
    grid = (cdiv(B, block_b), cdiv(tiles[1] - tiles[0], tiles_per_program))
    proc_args, proc_flags = processor_args(params.processing, dummy, sparse_in_tile)
    sample_logits_kernel[grid](
        logits, logits.stride(0), tiles[0], tiles[1],
        seed_p, seed_v, off_p, off_v, temp_p, float(temp_v),
        dest.f, dest.i,
        B, V_rows, vocab_size, vocab_start,
        dest.base_f + shard * layout.stride_shard, dest.base_i + shard * layout.stride_shard_i,
        layout.stride_field, layout.stride_slot,
        par_p, par_f, par_i,
        layout.fingerprint_slot, call_flags(logprobs, chunked=True) if flags is None else flags,
        layout.stride_ifield, xfp_p, xfp_v,
        *proc_args,
        BLOCK_B=block_b, BLOCK_V=block_v, TILES=tiles_per_program,
        SEED_PER_ROW=seed_row, OFFSET_PER_ROW=off_row, TEMP_PER_ROW=temp_row,
        NOISE=not params.all_greedy, LOGPROBS=logprobs or extended,
        PEER_TABLE=dest.peer_table, NPEERS=dest.npeers or 1,
        FAST_LOG=fast_log_ok(logits.device),
        DEVICE_PARITY=par_on, HEADER=header, EXTENDED=extended, KEEP=KEEP, XFP_PER_ROW=xfp_row,
        WINNER_LOGIT=logprobs or winner_logit, RAW_SUM=raw_sums, **proc_flags, num_warps=num_warps,
    )


def chunk_logits(hidden: torch.Tensor, weight_rows: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """fp32 logits hidden @ weight_rows.T into `out` ([B, n] contiguous), through cuBLAS on CUDA."""
    if hidden.device.type == "cuda":
        if hidden.dtype == torch.float32:
            return torch.mm(hidden, weight_rows.T, out=out)
        return torch.mm(hidden, weight_rows.T, torch.float32, out=out)
    return torch.mm(hidden.float(), weight_rows.float().T, out=out)


def launch_chunked(hidden: torch.Tensor, weight: torch.Tensor, params: RowParams, cfg: TileConfig,
                   layout: CandidateLayout, dest: BufferPair, *, vocab_size: int, vocab_start: int = 0,
                   shard: int = 0, logprobs: bool = False, chunk_rows: Optional[int] = None,
                   extended: Optional[bool] = None, flags: Optional[int] = None, raw_sums: bool = True,
                   winner_logit: bool = False) -> None:
    """Stage 1 for large batches: cuBLAS writes fp32 logits per vocabulary chunk, then
    sample_logits_kernel turns them into candidates.

    Writes the candidates launch_fused would (same noise, same tiles, same layout); the
    logits differ only by fp32 accumulation order, so tokens agree except on near-exact
    ties. Extra memory is one fp32 chunk of at most configs.chunk_workspace_bytes (the
    L2 size by default) or of chunk_rows rows: O(L2), never O(B x V). Bias and penalties
    are applied to each chunk in place by one small per-entry kernel (``apply_entries``)
    before the sampling pass; the bitmask inside it.
    """
    layout.check_fit(hidden.shape[0], weight.shape[0], cfg.block_v, shard, vocab_start)
    B, V_rows = hidden.shape[0], weight.shape[0]
    rows = chunk_rows or chunk_rows_for(B, V_rows, cfg.block_v, chunk_workspace_bytes(hidden.device))
    if rows % cfg.block_v:
        raise ValueError(f"chunk_rows ({rows}) must be a multiple of block_v ({cfg.block_v})")
    buf = torch.empty(B * min(rows, V_rows), dtype=torch.float32, device=hidden.device)
    for r0 in range(0, V_rows, rows):
        r1 = min(r0 + rows, V_rows)
        logits = chunk_logits(hidden, weight[r0:r1], buf[: B * (r1 - r0)].view(B, r1 - r0))
        launch_apply_entries(logits, params.processing, vocab_start + r0)
        launch_sample_logits(logits, params, layout, dest, block_v=cfg.block_v,
                             tiles=(r0 // cfg.block_v, cdiv(r1, cfg.block_v)), V_rows=V_rows,
                             vocab_size=vocab_size, vocab_start=vocab_start, shard=shard, logprobs=logprobs,
                             extended=extended, flags=flags, sparse_in_tile=False, raw_sums=raw_sums,
                             winner_logit=winner_logit)
