"""The logit processors inside a stage-1 tile: token bitmask, logit bias, penalties.

``apply_processors`` turns a [rows, ids] tile of raw logits, still in registers, into
processed logits (vLLM V1's order: bitmask, then bias, then penalties; see
``fsdist.processing`` for the inputs). Every stage-1 kernel (fused GEMM, chunked pass,
fallback materialization) calls it on the same logits with the same entries, so the
processed logits, hence the candidates and tokens, do not depend on the path, the tile
size or the tensor-parallel degree.

Bias and penalties come as a sorted list of entries per row (``id * 4 + kind``, built by
``prepare_processors``). A tile finds the slice of its own ids by searching both ends at once per
row (a 16-ary search: a few rounds of independent loads, where a binary search would wait
on log2(S) dependent ones; nothing per tile is precomputed, so any tiling, path or
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
from .prepare_processors import PROBES

_SENTINEL = tl.constexpr(SENTINEL)
_PROBES = tl.constexpr(PROBES)


@triton.jit
def _narrow(ent_ptr, row_base, key, lo, hi, k, PROBES: tl.constexpr):
    """One round for one key: the first position >= key lies in [lo, hi] (hi = width: none)."""
    span = hi - lo
    # probe k (1..PROBES) at lo + ceil(k * span / PROBES) - 1: probe PROBES is hi - 1
    q = lo[:, None] + (k[None, :] * span[:, None] + PROBES - 1) // PROBES - 1
    live = span[:, None] > 0
    e = tl.load(ent_ptr + row_base[:, None] + q, mask=live, other=0)
    below = tl.sum((live & (e < key)).to(tl.int32), axis=1)  # the entries are sorted: a prefix of probes
    q_below = tl.max(tl.where(k[None, :] == below[:, None], q, -1), axis=1)  # last probe < key
    q_above = tl.max(tl.where(k[None, :] == below[:, None] + 1, q, -1), axis=1)  # first probe >= key
    busy = span > 0
    lo = tl.where(busy & (below > 0), q_below + 1, lo)
    hi = tl.where(busy & (below < PROBES), q_above, hi)
    return lo, hi


@triton.jit
def lower_bounds(ent_ptr, row_base, width, key_a, key_b, mask_r, rounds, PROBES: tl.constexpr):
    """Per row: the first position in the row's sorted entries whose entry is >= key_a, and the
    same for key_b (width if none). A PROBES-ary search: each round loads PROBES entries per
    row and key, all independent, so a round costs one memory latency where a binary search
    pays one per halving (3 rounds instead of 11 dependent loads at 1,000 entries). rounds:
    ``prepare_processors.search_rounds(width)``."""
    k = tl.arange(0, PROBES) + 1
    lo_a = tl.zeros(row_base.shape, tl.int32)
    hi_a = tl.where(mask_r, width, 0)
    lo_b = lo_a
    hi_b = hi_a
    for _ in range(rounds):
        lo_a, hi_a = _narrow(ent_ptr, row_base, key_a, lo_a, hi_a, k, PROBES)
        lo_b, hi_b = _narrow(ent_ptr, row_base, key_b, lo_b, hi_b, k, PROBES)
    return lo_a, lo_b


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
        start, end = lower_bounds(ent_ptr, row_base, ent_width, tile_lo * 4, (tile_lo + x.shape[1]) * 4, mask_r,
                                  search_steps, _PROBES)
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
        x = processed_logit(x, bias, count, seen, rep, freq, pres)
    return x


@triton.jit
def processed_logit(x, bias, count, seen, rep, freq, pres):
    """Bias and penalties of one id, elementwise: x + bias, then the repetition penalty where
    the id was seen (prompt or output), then frequency x count and presence. The one formula
    every path uses (in-tile here, in place on a chunk in ``apply_entries``), so a processed
    logit does not depend on where it was computed. An id without entries (bias 0, count 0,
    not seen) keeps its value."""
    x = x + bias
    x = tl.where(seen != 0, tl.where(x > 0, x / rep, x * rep), x)
    return x - freq * count.to(tl.float32) - pres * (count > 0).to(tl.float32)


def processor_args(processing: Optional[LogitProcessing], dummy: torch.Tensor, sparse_in_tile: bool = True):
    """(runtime arguments, constexpr flags) of apply_processors; ((dummy, ...),
    BITMASK=False, SPARSE=False) without processors. The same for every launch of a call.
    sparse_in_tile=False: bias and penalties are already in the logits (``apply_entries``
    ran on them), only the bitmask is left to the tiles."""
    bm = processing.bitmask if processing is not None else None
    sparse = processing is not None and processing.entries is not None and sparse_in_tile
    args = [bm if bm is not None else dummy, bm.stride(0) if bm is not None else 0]
    if sparse:
        ent = processing.entries
        args += [ent, processing.values, ent.stride(0), ent.shape[1], processing.search_steps,
                 processing.penalties, processing.penalties.stride(0)]
    else:
        args += [dummy, dummy, 0, dummy, 0, dummy, 0]
    return args, {"BITMASK": bm is not None, "SPARSE": sparse}


__all__ = ["apply_processors", "lower_bounds", "processed_logit", "processor_args"]
