"""The logit processors inside a stage-1 tile: token bitmask, logit bias, penalties.

``apply_processors`` turns a [rows, ids] tile of raw logits, still in registers, into
processed logits (vLLM V1's order: bitmask, then bias, then penalties; see
``fsdist.processing`` for the inputs). Every stage-1 kernel (fused GEMM, chunked pass,
fallback materialization) calls it on the same logits with the same entries, so the
processed logits, hence the candidates and tokens, do not depend on the path, the tile
size or the tensor-parallel degree.

Bias and penalties come as a sorted list of entries per row (``id * 4 + kind``, built by
``prepare_processors``). A tile finds the slice of its own ids by two binary searches per
row (about log2(S) loads each: nothing per tile is precomputed, so any tiling, path or
vocabulary range reads the same list), then loops over those entries only (usually zero
or one per row), accumulating, per (row, id), the bias sum, the occurrences in the output
and whether the id was seen in the prompt or the output. Then, per element:

    x = x + bias;  x = x / r if x > 0 else x * r  (seen ids);  x -= f * count + p * [count > 0]

A disallowed id is -inf before and after (-inf plus, times or minus a finite number).
"""
from typing import Optional

import torch
import triton
import triton.language as tl

from ..processing import SENTINEL, LogitProcessing

_SENTINEL = tl.constexpr(SENTINEL)


@triton.jit
def lower_bound(ent_ptr, row_base, width, key, mask_r, steps):
    """Per row: the first position in the row's sorted entries whose entry is >= key (width
    if none). steps >= bit_length(width) halvings settle every row."""
    lo = tl.zeros(row_base.shape, tl.int32)
    hi = tl.where(mask_r, width, 0)
    for _ in range(steps):
        open_ = lo < hi
        mid = (lo + hi) // 2
        e = tl.load(ent_ptr + row_base + mid, mask=open_, other=0)
        right = open_ & (e < key)
        lo = tl.where(right, mid + 1, lo)
        hi = tl.where(open_ & ~right, mid, hi)
    return lo


@triton.jit
def apply_processors(x, rows, mask_r, gid, ok, tile_lo,
                     bm_ptr, bm_stride, ent_ptr, val_ptr, ent_stride, ent_width, search_steps, pen_ptr, pen_stride,
                     BITMASK: tl.constexpr, SPARSE: tl.constexpr):
    """Processed logits of a tile. x: fp32 [R, C] raw logits of global ids gid [C] for rows
    [R] (mask_r: real rows; ok: ids < vocab_size inside the weight); the tile's ids are
    tile_lo .. tile_lo + C - 1 (gid may hold them in another order)."""
    if BITMASK:
        word = tl.load(bm_ptr + rows[:, None].to(tl.int64) * bm_stride + (gid // 32)[None, :],
                       mask=mask_r[:, None] & ok[None, :], other=-1)
        allowed = ((word >> (gid % 32)[None, :]) & 1) != 0
        x = tl.where(allowed, x, float("-inf"))
    if SPARSE:
        row_base = rows.to(tl.int64) * ent_stride
        start = lower_bound(ent_ptr, row_base, ent_width, tile_lo * 4, mask_r, search_steps)
        end = lower_bound(ent_ptr, row_base, ent_width, (tile_lo + x.shape[1]) * 4, mask_r, search_steps)
        n = tl.where(mask_r, end - start, 0)
        bias = tl.zeros(x.shape, tl.float32)
        count = tl.zeros(x.shape, tl.int32)
        seen = tl.zeros(x.shape, tl.int32)
        row_ent = row_base + start
        for j in range(0, tl.max(n, axis=0)):
            live = j < n
            e = tl.load(ent_ptr + row_ent + j, mask=live, other=_SENTINEL)
            v = tl.load(val_ptr + row_ent + j, mask=live, other=0.0)
            hit = gid[None, :] == (e >> 2)[:, None]
            kind = (e & 3)[:, None]
            bias += tl.where(hit & (kind == 0), v[:, None], 0.0)
            count += (hit & (kind == 1)).to(tl.int32)
            seen = seen | (hit & (kind != 0)).to(tl.int32)
        rep = tl.load(pen_ptr + rows, mask=mask_r, other=1.0)[:, None]
        freq = tl.load(pen_ptr + pen_stride + rows, mask=mask_r, other=0.0)[:, None]
        pres = tl.load(pen_ptr + 2 * pen_stride + rows, mask=mask_r, other=0.0)[:, None]
        x = x + bias
        x = tl.where(seen != 0, tl.where(x > 0, x / rep, x * rep), x)
        x = x - freq * count.to(tl.float32) - pres * (count > 0).to(tl.float32)
    return x


def processor_args(processing: Optional[LogitProcessing], dummy: torch.Tensor):
    """(runtime arguments, constexpr flags) of apply_processors; ((dummy, ...),
    BITMASK=False, SPARSE=False) without processors. The same for every launch of a call."""
    bm = processing.bitmask if processing is not None else None
    sparse = processing is not None and processing.entries is not None
    args = [bm if bm is not None else dummy, bm.stride(0) if bm is not None else 0]
    if sparse:
        ent = processing.entries
        args += [ent, processing.values, ent.stride(0), ent.shape[1], processing.search_steps,
                 processing.penalties, processing.penalties.stride(0)]
    else:
        args += [dummy, dummy, 0, dummy, 0, dummy, 0]
    return args, {"BITMASK": bm is not None, "SPARSE": sparse}


__all__ = ["apply_processors", "processor_args"]
