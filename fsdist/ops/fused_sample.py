"""Stage 1 of FlashSampling: the LM-head GEMM with a sampling epilogue (one kernel).

One program owns a (batch tile, vocabulary tile). It computes the logits tile
``hidden[BB, D] @ weight[BV, D]^T`` in fp32 registers, masks ids >= vocab_size, adds
T times Gumbel noise keyed by the global vocabulary id and keeps one (score, id)
candidate per row (``epilogue.py``). The [B, V] logits never leave the chip.

Where the candidates go is a ``layout.BufferPair``: this process's buffer, or a
table of every tensor-parallel peer's buffer (the epilogue then stores into all of
them). The kernel knows nothing about how those addresses were obtained. With TMA the
operands arrive as tensor descriptors (Hopper's bulk tensor copies) instead of
pointers; the arithmetic, hence every candidate, is the same.

At small batches one program per SM streams equal tiles, so without help every SM would finish
its tile, and run its epilogue, at the same moment while the memory idles. A config with
``stagger_us`` (the B <= 32 defaults) holds the odd programs of the first wave that long
(``utils.stagger_start``) where the grid has several waves (``configs.stagger_applies``): the
SMs then work in two groups apart in time, and one streams while the other computes
(docs/performance.md, v56). Timing only: the candidates are the same.
"""
from typing import Optional

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from ..params import RowParams
from ..processing import has_entries
from ..runtime import interpreting
from . import configs
from .configs import (PAD_HALF_TILE_ROWS, PAD_TILE_ROWS, WS_BOX_ROWS, WS_BOX_TILE_ROWS, WS_LAST_BOX_ROWS, TileConfig,
                      fast_memory, fit_num_stages, pdl_after_entry_offsets, pp_greedy_rule, stagger_applies,
                      triton_twin)
from .epilogue import (perturb, raw_sum, row_temperature, tile_draws_noise, tile_stats, tile_topk, write_candidates,
                       write_kept)
from .layout import KEEP, BufferPair, CandidateLayout
from .noise import gumbel_from_bits, vocab_bits_tile
from .pad_rows import pad_rows
from .parity import parity_args, parity_offsets
from .entry_offsets import HEAD as ENTRY_HEAD, launch_entry_offsets
from .fused_sample_pp import launch_fused_pp
from .fused_sample_ws import WS_BLOCK_B, WS_BLOCK_K, WS_BLOCK_V, last_tile_boxes, launch_fused_ws, ws_supported
from .processors import process_tile, processor_args, row_penalties, table_slice, tile_bitmask_words
from .step_check import call_flags, write_row_fingerprints, write_step_record, writes_header
from .utils import (cdiv, device_capability, fast_log_ok, load_row_param, pdl_args, pdl_prologue, row_param_args,
                    sm_count, stagger_start)


# (one compile whatever the SM count, the delay or a scalar top-k, which Triton would specialise at 1 and 16 * n)
@triton.jit(do_not_specialize=["first_wave", "stagger_ns", "topk_val"])
def fused_sample_kernel(
    h_ptr, w_ptr,
    seed_ptr, seed_val, offset_ptr, offset_val, temp_ptr, temp_val,
    cand_f, cand_i,
    B, D, V_rows, vocab_size, vocab_start,
    stride_hb,
    buf_offset, buf_offset_i, stride_field, stride_slot,
    parity_ptr, parity_stride_f, parity_stride_i,
    hdr_off_i, flags, stride_ifield, xfp_ptr, xfp_val,
    bm_ptr, bm_stride, ent_ptr, val_ptr, ent_stride, ent_width, search_steps, pen_ptr, pen_stride,
    eoff_ptr, eoff_stride, head_ptr, head_val_ptr, head_stride,
    topk_ptr, topk_val, topp_ptr, topp_val,
    BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr, EVEN_V: tl.constexpr,
    SEED_PER_ROW: tl.constexpr, OFFSET_PER_ROW: tl.constexpr, TEMP_PER_ROW: tl.constexpr,
    NOISE: tl.constexpr, LOGPROBS: tl.constexpr,
    PEER_TABLE: tl.constexpr, NPEERS: tl.constexpr,
    DOT_PRECISION: tl.constexpr, DOT_UPCAST: tl.constexpr,
    FAST_LOG: tl.constexpr, DEVICE_PARITY: tl.constexpr, TMA: tl.constexpr = False, HEADER: tl.constexpr = False,
    EXTENDED: tl.constexpr = False, KEEP: tl.constexpr = 4, XFP_PER_ROW: tl.constexpr = False,
    BITMASK: tl.constexpr = False, SPARSE: tl.constexpr = False, ENTRY_HEAD: tl.constexpr = 4,
    BM_WORDS: tl.constexpr = False, WINNER_LOGIT: tl.constexpr = True, RAW_SUM: tl.constexpr = True,
    PINNED: tl.constexpr = False, SKIP_NOISE: tl.constexpr = False, TOPK_PER_ROW: tl.constexpr = False,
    TOPP_PER_ROW: tl.constexpr = False, first_wave=0, stagger_ns=0, STAGGER: tl.constexpr = False,
    PDL_WAIT: tl.constexpr = False, TRIGGER: tl.constexpr = False,
):
    # Stage 2, the next launch, may be a programmatic dependent (configs.pdl_stage2): it may launch once every
    # program of this grid has started, and it waits for this grid's end before it reads anything. (PDL_WAIT is
    # not a prologue here: the wait comes after the main loop, below.)
    pdl_prologue(False, TRIGGER)
    # Batch tiles vary fastest so programs sharing a weight tile run together and
    # the tile is read from HBM once, then from L2.
    pid_b = tl.program_id(0)
    pid_v = tl.program_id(1)
    # (one batch tile: the first wave is the first vocabulary tiles; TileConfig.stagger_us)
    stagger_start(pid_v, first_wave, stagger_ns, STAGGER)

    offs_b = pid_b * BLOCK_B + tl.arange(0, BLOCK_B)
    offs_v = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    offs_k = tl.arange(0, BLOCK_K)
    mask_b = offs_b < B
    mask_v = offs_v < V_rows

    if not TMA:
        h_ptrs = h_ptr + offs_b[:, None] * stride_hb + offs_k[None, :]
        w_ptrs = w_ptr + offs_v[:, None].to(tl.int64) * D + offs_k[None, :]
    # The tile's bias / penalty entries (where they start, how many) and the rows' penalties:
    # independent loads issued before the main loop, ready by the epilogue (processors.py).
    if not PDL_WAIT:
        e_start, e_count, e_head, e_head_val = table_slice(eoff_ptr, eoff_stride, head_ptr, head_val_ptr,
                                                           head_stride, offs_b, mask_b, pid_v, SPARSE, ENTRY_HEAD)
    rep, freq, pres = row_penalties(pen_ptr, pen_stride, offs_b, mask_b, SPARSE)
    # The tile's bitmask words, [BLOCK_B, BLOCK_V / 32], where the tile starts on a word.
    words = tile_bitmask_words(bm_ptr, bm_stride, offs_b, mask_b, vocab_start + pid_v * BLOCK_V, vocab_size, BLOCK_V,
                               BITMASK and BM_WORDS)
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

    if PDL_WAIT:
        # Launched as a programmatic dependent of entry_offsets_kernel (configs.pdl_after_entry_offsets): the main
        # loop above read only the hidden and the weight, which no launch still running writes; the entry table
        # is read once that kernel has finished and its writes are visible (griddepcontrol.wait).
        gdc_wait()
        e_start, e_count, e_head, e_head_val = table_slice(eoff_ptr, eoff_stride, head_ptr, head_val_ptr,
                                                           head_stride, offs_b, mask_b, pid_v, SPARSE, ENTRY_HEAD)
    # ---- epilogue: temperature, padding mask, noise, tile-local argmax ----
    temp = load_row_param(temp_ptr, temp_val, offs_b, mask_b, tl.float32, TEMP_PER_ROW)
    inv_t, noise_scale, _greedy, bad_temp = row_temperature(temp)
    gid = vocab_start + offs_v  # global vocabulary id
    valid = (gid < vocab_size) & mask_v
    logit = tl.where(valid[None, :], acc, float("-inf"))
    # A NaN or +inf logit leaves the row without a distribution: poison it (token -1).
    # -inf is a logit of probability 0 and is fine.
    bad_logit = tl.max(((logit != logit) | (logit == float("inf"))).to(tl.int32), axis=1) > 0
    if BITMASK or SPARSE:
        # Token bitmask, logit bias, penalties (processors.py): from here on "logit" is the
        # processed logit, which everything below (noise, statistics, kept logits) uses.
        logit = process_tile(logit, offs_b, mask_b, gid, valid, bm_ptr, bm_stride, ent_ptr, val_ptr, ent_stride,
                             e_start, e_count, e_head, e_head_val, tl.arange(0, ENTRY_HEAD), rep, freq, pres, words,
                             BITMASK, SPARSE, ENTRY_HEAD, BM_WORDS, PINNED)
    draw = NOISE
    if NOISE and SKIP_NOISE:
        # A filtered call (epilogue.rows_draw_noise): no noise where no row of the tile has a reader for it.
        draw = tile_draws_noise(noise_scale, topk_ptr, topk_val, topp_ptr, topp_val, offs_b, mask_b, vocab_size,
                                TOPK_PER_ROW, TOPP_PER_ROW)
    if draw:
        seed = load_row_param(seed_ptr, seed_val, offs_b, mask_b, tl.int64, SEED_PER_ROW)
        offset = load_row_param(offset_ptr, offset_val, offs_b, mask_b, tl.int64, OFFSET_PER_ROW)
        # Tiles start at multiples of BLOCK_V (and vocab_start at a multiple of 4), so the
        # tile's ids are whole Philox quads: one evaluation per 4 ids.
        bits = vocab_bits_tile(seed[:, None], offset[:, None], vocab_start + pid_v * BLOCK_V, BLOCK_B, BLOCK_V,
                               FAST_LOG)
        g = gumbel_from_bits(bits, FAST_LOG)
        score = perturb(logit, noise_scale[:, None], g, FAST_LOG)  # greedy rows: scale 0, the logit itself
    else:
        score = logit
    poisoned = bad_logit | bad_temp
    best = tl.argmax(score, axis=1)
    best_score = tl.where(poisoned, float("nan"), tl.max(score, axis=1))
    best_idx = tl.where(poisoned, -1, vocab_start + pid_v * BLOCK_V + best).to(tl.int32)

    if LOGPROBS:
        tmax, tsum = tile_stats(logit, valid[None, :], inv_t)
        if WINNER_LOGIT:
            is_best = tl.arange(0, BLOCK_V)[None, :] == best[:, None]
            best_logit = tl.max(tl.where(is_best, logit, float("-inf")), axis=1)
        else:  # field 1 only feeds the winner's logprob, which this call does not return
            best_logit = best_score
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
    if EXTENDED:
        # Filters / top-N logprobs: the tile's KEEP largest logits, their ids, the boundary
        # (largest logit not kept) and the raw log-sum-exp state (epilogue.py).
        kept, kept_cols, boundary = tile_topk(logit, tl.arange(0, BLOCK_V), KEEP)
        if RAW_SUM:
            rsum = raw_sum(logit, valid[None, :], tmax)
        else:  # only "raw" logprobs read it: NaN, so that a wrong reader shows
            rsum = tl.full([BLOCK_B], float("nan"), tl.float32)
        write_kept(cand_f, cand_i, dst, dst_i, stride_field, stride_ifield, rsum,
                   kept, vocab_start + pid_v * BLOCK_V + kept_cols, boundary, mask_b, KEEP, PEER_TABLE, NPEERS)
    if HEADER:
        # The call's header (step_check.py), written by the first vocabulary tile of each batch tile.
        if pid_v == 0:
            hseed = load_row_param(seed_ptr, seed_val, offs_b, mask_b, tl.int64, SEED_PER_ROW)
            hoffset = load_row_param(offset_ptr, offset_val, offs_b, mask_b, tl.int64, OFFSET_PER_ROW)
            xfp = load_row_param(xfp_ptr, xfp_val, offs_b, mask_b, tl.int64, XFP_PER_ROW)
            write_row_fingerprints(cand_i, buf_offset_i + hdr_off_i, offs_b, mask_b, hseed, hoffset ^ xfp, temp,
                                   PEER_TABLE, NPEERS)
            if pid_b == 0:
                write_step_record(cand_i, buf_offset_i + hdr_off_i + stride_slot, parity_ptr, B, flags, 0,
                                  PEER_TABLE, NPEERS)


def tma_operands(hidden: torch.Tensor, weight: torch.Tensor, cfg: TileConfig):
    """(hidden, weight, TMA) kernel arguments: tensor descriptors when cfg.tma asks for them
    and the hardware and layouts allow (the candidates do not depend on it), else the tensors.
    The hidden's descriptor covers ``tile_operand(hidden, cfg.block_b)``: whole batch tiles."""
    if not (cfg.tma and _tma_capable(hidden.device) and hidden.shape[0] > 0):
        return hidden, weight, False
    elem = hidden.element_size()
    aligned = all(t.data_ptr() % 16 == 0 and t.stride(1) == 1 and (t.stride(0) * elem) % 16 == 0
                  for t in (hidden, weight))
    if not aligned or max(cfg.block_b, cfg.block_v, cfg.block_k) > 256:
        return hidden, weight, False
    from triton.tools.tensor_descriptor import TensorDescriptor

    return (TensorDescriptor.from_tensor(tile_operand(hidden, cfg.block_b), [cfg.block_b, cfg.block_k]),
            TensorDescriptor.from_tensor(weight, [cfg.block_v, cfg.block_k]), True)


def tile_operand(hidden: torch.Tensor, block_b: int, min_rows: int = None) -> torch.Tensor:
    """The hidden a TMA-fed kernel with batch tiles of ``block_b`` rows reads: ``hidden`` itself, or, where the batch
    leaves the last tile partly empty, a contiguous copy zero-padded to whole tiles (the kernels still sample only
    hidden's rows, so the candidates are the same). Which partial tiles are padded: those of at least
    configs.PAD_TILE_ROWS rows, and a batch of one tile of at least configs.PAD_HALF_TILE_ROWS rows left at least
    half empty (see both); with ``min_rows``, every partial tile of at least that many rows. Never where D x the
    element size is not a multiple of 16 bytes (the copy's rows could not feed TMA). Callers pass it only where the
    copy engine reads the hidden (tensor descriptors)."""
    B = hidden.shape[0]
    rest = B % block_b
    if rest == 0:
        return hidden
    if (hidden.shape[1] * hidden.element_size()) % 16:
        return hidden  # the contiguous copy's rows would not be 16-byte aligned for TMA: keep the hidden's own
    if min_rows is not None:
        pad = block_b >= min_rows
    else:  # (the half rule was measured on one-tile batches only, v65 / v68)
        pad = block_b >= PAD_TILE_ROWS or (block_b >= PAD_HALF_TILE_ROWS and B < block_b and 2 * rest <= block_b)
    # the pad rows' logits are computed, never sampled: zeros keep them finite
    return pad_rows(hidden, cdiv(B, block_b) * block_b) if pad else hidden


def ws_box_rows(batch: int, block_b: int) -> int:
    """The rows of the hidden's TMA boxes on the warp-specialised kernel (launch_fused_ws's box_rows) for ``batch`` rows
    on ``block_b``-row tiles: configs.WS_BOX_ROWS for a batch of one partial tile of at most WS_BOX_TILE_ROWS rows whose
    boxes cover at most three quarters of it (B <= 48 on the 64-row tile; v77c: at B = 56 seven boxes lost 0.2-1.2 µs
    to one 64-row box); else 0 (one box of the tile's rows, on tile_operand's hidden)."""
    if not WS_BOX_ROWS or block_b > WS_BOX_TILE_ROWS or batch >= block_b:
        return 0
    return WS_BOX_ROWS if 4 * cdiv(batch, WS_BOX_ROWS) * WS_BOX_ROWS <= 3 * block_b else 0


def ws_last_box_rows(batch: int, block_b: int) -> int:
    """The rows of the TMA boxes of a short last tile on the warp-specialised kernel (launch_fused_ws's last_box_rows):
    configs.WS_LAST_BOX_ROWS for a batch of more than one 128-row tile whose last tile holds at most 64 rows; else 0
    (the last tile whole, on tile_operand's hidden). Which last tiles are short is launch_fused_ws's rule
    (last_tile_boxes); this adds only that one-tile batches keep their tile whole."""
    if batch < block_b or not last_tile_boxes(batch, block_b, WS_LAST_BOX_ROWS)[1]:
        return 0
    return WS_LAST_BOX_ROWS


def ws_takes_fields(block_b: int, logprobs: bool, extended: bool, raw_sums: bool) -> bool:
    """Whether launch_fused runs a call with these fields on the warp-specialised ``block_b``-row tile (if the
    kernel takes the call at all: ws_supported): plain calls and the 64-row tile always; logprobs and kept logits on
    the 128-row tile where configs.WS_FIELDS_FULL_TILE says, and without raw sums ("raw" logprobs: that epilogue's
    sm_90 code has 73-75 spill stores, against 13-16 without them); else the Triton twin."""
    if block_b == 64 or not (logprobs or extended):
        return True
    return configs.WS_FIELDS_FULL_TILE and not (extended and raw_sums)


def _tma_capable(device: torch.device) -> bool:
    if device.type == "cpu":
        return interpreting()  # Triton's interpreter emulates descriptor loads (tests)
    return device.type == "cuda" and torch.version.hip is None and device_capability(device)[0] >= 9


def launch_fused(hidden: torch.Tensor, weight: torch.Tensor, params: RowParams, cfg: TileConfig,
                 layout: CandidateLayout, dest: BufferPair, *, vocab_size: int, vocab_start: int = 0,
                 shard: int = 0, logprobs: bool = False, extended: Optional[bool] = None,
                 flags: Optional[int] = None, raw_sums: bool = True, winner_logit: bool = False,
                 trigger: bool = False, skip_filtered_noise: bool = False) -> None:
    """Write the candidates of every (row, vocabulary tile) of ``hidden @ weight.T`` into block
    ``shard`` of ``dest``. weight holds global vocabulary ids [vocab_start, vocab_start + rows);
    ids >= vocab_size are padding and never win. raw_sums=False leaves an extended layout's raw
    (T = 1) sums out (NaN): only "raw" logprobs read them; the winner's logit (field 1) is written
    only with ``logprobs`` or ``winner_logit`` (select_filtered's min-p proof). trigger: the caller's next launch
    is a programmatic dependent that waits for this one's end before any memory access (configs.pdl_stage2); the
    Triton kernel then lets it launch early (the warp-specialised kernel does not: it ends as usual).
    skip_filtered_noise: a tile none of whose rows needs the noise (epilogue.rows_draw_noise: greedy rows and rows
    with top-k or top-p on) draws none and scores each id by its logit; only for calls whose filtered rows get their
    token from select_filtered or the fallback (fsdist.sample's filtered calls), never where a row's noisy tile
    winners are read (unfiltered rows and min-p alone keep the noise, as does every tile holding one)."""
    n_vtiles = layout.check_fit(hidden.shape[0], weight.shape[0], cfg.block_v, shard, vocab_start)
    header = writes_header(layout, dest)  # (raises for a checked layout without the step counter: before any launch)
    extended = layout.extended if extended is None else extended
    if extended and not layout.extended:
        raise ValueError("kept logits need an extended candidate layout")
    # Bias / penalty entries past one 64-row tile: the warp-specialised kernel's 64-row tile, whose epilogue walks
    # them beside the next tile's wgmmas (its 128-row tile spills there; the Triton twin waits for them: v26b).
    # A bitmask alone stays on the Triton twin, which loads its words before the main loop (v26c: 17% faster).
    ws_rows = 64 if cfg.block_b == WS_BLOCK_B and has_entries(params.processing) else cfg.block_b
    B, D = hidden.shape
    if (cfg.ws and _ws_tile(cfg) and ws_takes_fields(ws_rows, logprobs, extended, raw_sums)
            and ws_supported(hidden, weight, params, logprobs=logprobs, extended=extended, block_v=cfg.block_v,
                             block_b=ws_rows)):
        # The same tile on the warp-specialised Hopper kernel (fused_sample_ws.py): same candidates
        # (the tile sums up to their summation order). A partial last tile may read a padded hidden (tile_operand),
        # or run as half a tile (ws_last_box_rows).
        box = ws_box_rows(B, ws_rows)
        last = 0 if box else ws_last_box_rows(B, ws_rows)
        # (a call moved to the 64-row tile runs that tile's 5 stages, not a 128-row config's large-batch depth)
        stages = cfg.num_stages if ws_rows == cfg.block_b else 5
        if ws_rows == WS_BLOCK_B and not (box or last) and _pp_greedy(B, params, layout, dest, logprobs, extended,
                                                                       header, hidden.device):
            # an all-greedy plain call: the ping-pong kernel (configs.PP_GREEDY_MIN_BATCH), same candidates
            launch_fused_pp(tile_operand(hidden, ws_rows), weight, params, layout, dest, vocab_size=vocab_size,
                            vocab_start=vocab_start, shard=shard, shared_epilogue=8, batch=B)
            return
        launch_fused_ws(hidden if box or last else tile_operand(hidden, ws_rows), weight, params, layout, dest,
                        vocab_size=vocab_size, vocab_start=vocab_start, shard=shard, stages=stages,
                        epilogue_warps=8 if cfg.num_warps >= 8 else 4, block_b=ws_rows, logprobs=logprobs,
                        extended=extended, raw_sums=raw_sums, winner_logit=winner_logit, batch=B, flags=flags,
                        box_rows=box, last_box_rows=last, skip_filtered_noise=skip_filtered_noise)
        return
    cfg = triton_twin(cfg, D)  # what the Triton kernel runs of a config meant for the warp-specialised one
    V_rows = weight.shape[0]
    dummy = dest.i  # any tensor: ignored by the kernel when a parameter is a scalar
    seed_p, seed_v, seed_row = row_param_args(params.seed, dummy)
    off_p, off_v, off_row = row_param_args(params.offset, dummy)
    temp_p, temp_v, temp_row = row_param_args(params.temperature, dummy)
    xfp_p, xfp_v, xfp_row = row_param_args(params.fingerprint, dummy)
    topk_p, topk_v, topk_row = row_param_args(params.top_k, dummy)
    topp_p, topp_v, topp_row = row_param_args(params.top_p, dummy)
    par_p, par_f, par_i, par_on = parity_args(dest.parity, dummy)
    # (with descriptors, a partial last tile may read a padded copy, tile_operand; B stays hidden's rows)
    h_arg, w_arg, tma = tma_operands(hidden, weight, cfg)
    proc_args, proc_flags = processor_args(params.processing, dummy)
    if proc_flags["SPARSE"]:
        proc = params.processing
        pdl = pdl_after_entry_offsets(hidden.device)
        eoff = launch_entry_offsets(proc.entries, proc.values, vocab_start, cfg.block_v, n_vtiles, trigger=pdl)
        eoff_args = (eoff.offsets, eoff.offsets.stride(0), eoff.head, eoff.head_values, eoff.head.stride(0))
    else:
        eoff_args, pdl = (dummy, 0, dummy, dummy, 0), False
    # The first-wave stagger where it pays (configs.stagger_applies: NVIDIA GPU, one batch tile, several waves).
    sms = sm_count(hidden.device) if hidden.device.type == "cuda" else 0
    stagger = stagger_applies(cfg, hidden.device, cdiv(B, cfg.block_b), n_vtiles, sms)
    fused_sample_kernel[(cdiv(B, cfg.block_b), n_vtiles)](
        h_arg, w_arg,
        seed_p, seed_v, off_p, off_v, temp_p, float(temp_v),
        dest.f, dest.i,
        B, D, V_rows, vocab_size, vocab_start,
        hidden.stride(0),
        dest.base_f + shard * layout.stride_shard, dest.base_i + shard * layout.stride_shard_i,
        layout.stride_field, layout.stride_slot,
        par_p, par_f, par_i,
        layout.fingerprint_slot, call_flags(logprobs, chunked=False) if flags is None else flags,
        layout.stride_ifield, xfp_p, xfp_v,
        *proc_args, *eoff_args, topk_p, int(topk_v), topp_p, float(topp_v),
        BLOCK_B=cfg.block_b, BLOCK_V=cfg.block_v, BLOCK_K=cfg.block_k,
        EVEN_K=D % cfg.block_k == 0, EVEN_V=V_rows % cfg.block_v == 0,
        SEED_PER_ROW=seed_row, OFFSET_PER_ROW=off_row, TEMP_PER_ROW=temp_row,
        NOISE=not params.all_greedy, LOGPROBS=logprobs or extended,
        PEER_TABLE=dest.peer_table, NPEERS=dest.npeers or 1,
        DOT_PRECISION="ieee" if hidden.dtype == torch.float32 else "tf32",
        DOT_UPCAST=hidden.dtype == torch.bfloat16 and hidden.device.type == "cpu",
        FAST_LOG=fast_log_ok(hidden.device),
        DEVICE_PARITY=par_on, TMA=tma, HEADER=header, EXTENDED=extended, KEEP=KEEP,
        XFP_PER_ROW=xfp_row, **proc_flags, ENTRY_HEAD=ENTRY_HEAD, WINNER_LOGIT=logprobs or winner_logit,
        RAW_SUM=raw_sums, SKIP_NOISE=bool(skip_filtered_noise), TOPK_PER_ROW=topk_row, TOPP_PER_ROW=topp_row,
        # the bitmask's words loaded before the main loop where every tile starts on a word
        BM_WORDS=vocab_start % 32 == 0 and cfg.block_v % 32 == 0,
        first_wave=sms if stagger else 0, stagger_ns=1000 * cfg.stagger_us if stagger else 0,
        STAGGER=stagger, **pdl_args(hidden.device, wait=pdl, trigger=trigger),
        num_warps=cfg.num_warps, num_stages=fit_num_stages(cfg, hidden.element_size(), hidden.device),
        **({"maxnreg": cfg.max_regs} if cfg.max_regs and hidden.device.type == "cuda" else {}),
    )


def _pp_greedy(batch: int, params: RowParams, layout: CandidateLayout, dest: BufferPair, logprobs: bool,
               extended: bool, header: bool, device: torch.device) -> bool:
    """Whether a call on the ws 128-row tile runs fused_sample_pp instead: all greedy (a scalar temperature 0), plain
    (no logprobs, kept logits, processors, call header or device parity) and configs.pp_greedy_rule's batch / GPU."""
    return (configs.PP_GREEDY_ON and params.all_greedy and not (logprobs or extended or header)
            and params.processing is None and layout.n_fields == 1 and dest.parity is None
            and pp_greedy_rule(batch, fast_memory(device)))  # (the device asked last: only where all else holds)


def _ws_tile(cfg: TileConfig) -> bool:
    """The tiles the warp-specialised kernel runs (128 or 64 x 128 x 64, TMA)."""
    return (cfg.tma and cfg.block_b in (WS_BLOCK_B, 64) and (cfg.block_v, cfg.block_k) == (WS_BLOCK_V, WS_BLOCK_K)
            and cfg.max_regs is None and 3 <= cfg.num_stages <= 5)  # 6 x 32 KB + 32 KB: at the limit

