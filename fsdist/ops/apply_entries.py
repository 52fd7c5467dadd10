"""Bias and penalties applied in place to a materialized fp32 logits chunk (the chunked path).

The chunked path (``sample_logits.py``) has its logits in memory anyway: cuBLAS writes one
vocabulary chunk, the sampling pass reads it. There, visiting a row's sorted entries
(``prepare_processors``) from every [rows, BLOCK_V] tile costs a compare per element and
entry: at B = 256 with ~1,000 entries per row that made the sampling pass 6.5x slower on
an H200 (bench/processors_breakdown.py, 2026-11-23). This kernel instead works per
*entry*: the first entry of each run of equal ids (the list is sorted, so an id's entries
sit together, bias values in the order given) sums its run and rewrites that one logit
with ``processors.processed_logit``, the formula the tiles use; every other id keeps its
value, exactly as in a tile. Work is O(B x S), not O(B x V x entries per tile). The
bitmask stays in the tiles (it is dense: one word per 32 ids).
"""
import torch
import triton
import triton.language as tl

from ..processing import SENTINEL, LogitProcessing, has_entries
from .processors import processed_logit
from .utils import cdiv, next_pow2, pinned_products_ok

_SENTINEL = tl.constexpr(SENTINEL)


@triton.jit
def apply_entries_kernel(logits_ptr, stride_l, id_lo, n_cols, ent_ptr, val_ptr, ent_stride, S, B,
                         pen_ptr, pen_stride, BLOCK_R: tl.constexpr, BLOCK_S: tl.constexpr,
                         PINNED: tl.constexpr):
    """Rows [program_id(0) * BLOCK_R, + BLOCK_R), entry slots [program_id(1) * BLOCK_S, + BLOCK_S):
    each run head whose id lies in [id_lo, id_lo + n_cols) rewrites logits[row, id - id_lo]."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    live_r = rows < B
    slot = tl.program_id(1) * BLOCK_S + tl.arange(0, BLOCK_S)
    base = ent_ptr + rows[:, None].to(tl.int64) * ent_stride
    vbase = val_ptr + rows[:, None].to(tl.int64) * ent_stride
    here = live_r[:, None] & (slot < S)[None, :]
    e = tl.load(base + slot[None, :], mask=here, other=_SENTINEL)
    prev = tl.load(base + slot[None, :] - 1, mask=here & (slot > 0)[None, :], other=-1)
    ident = e >> 2
    head = (e != _SENTINEL) & ((prev >> 2) != ident) & (ident >= id_lo) & (ident < id_lo + n_cols)
    # Sum each head's run in list order: bias values as the tiles add them (starting at 0.0),
    # occurrences in the output counted, any prompt/output occurrence marks the id seen.
    bias = tl.zeros([BLOCK_R, BLOCK_S], tl.float32)
    count = tl.zeros([BLOCK_R, BLOCK_S], tl.int32)
    seen = tl.zeros([BLOCK_R, BLOCK_S], tl.int32)
    j = 0
    going = head
    while tl.max(tl.max(going.to(tl.int32), axis=1), axis=0) > 0:
        at = slot[None, :] + j
        inside = going & (at < S)
        ej = tl.load(base + at, mask=inside, other=_SENTINEL)
        going = inside & ((ej >> 2) == ident) & (ej != _SENTINEL)
        kind = ej & 3
        bias += tl.where(going & (kind == 0), tl.load(vbase + at, mask=going, other=0.0), 0.0)
        count += (going & (kind == 1)).to(tl.int32)
        seen = seen | (going & (kind != 0)).to(tl.int32)
        j += 1
    rep = tl.load(pen_ptr + rows, mask=live_r, other=1.0)[:, None]
    freq = tl.load(pen_ptr + pen_stride + rows, mask=live_r, other=0.0)[:, None]
    pres = tl.load(pen_ptr + 2 * pen_stride + rows, mask=live_r, other=0.0)[:, None]
    dst = logits_ptr + rows[:, None].to(tl.int64) * stride_l + (ident - id_lo)
    x = tl.load(dst, mask=head, other=0.0)
    tl.store(dst, processed_logit(x, bias, count, seen, rep, freq, pres, PINNED), mask=head)


def launch_apply_entries(logits: torch.Tensor, processing: LogitProcessing, id_lo: int) -> None:
    """Bias and penalties of ``processing`` into fp32 ``logits`` [B, n] in place, whose column c
    holds global id id_lo + c. No-op without entries."""
    if not has_entries(processing) or logits.shape[0] == 0 or logits.shape[1] == 0:
        return
    ent = processing.entries
    B, S = ent.shape
    if logits.shape[0] != B or logits.dtype != torch.float32 or logits.stride(1) != 1:
        raise ValueError(f"logits must be fp32 [{B}, n] with unit column stride, got {tuple(logits.shape)} "
                         f"{logits.dtype} strides {logits.stride()}")
    on_gpu = logits.device.type == "cuda"
    # GPU: a program per (row, 256 entries). Interpreter: a program's cost is mostly fixed (and
    # the run loop is Python), so whole rows and many of them per program.
    block_s = min(256 if on_gpu else 4096, max(16, next_pow2(S)))
    block_r = 1 if on_gpu else max(1, min(next_pow2(B), 16384 // block_s))
    apply_entries_kernel[(cdiv(B, block_r), cdiv(S, block_s))](
        logits, logits.stride(0), int(id_lo), logits.shape[1], ent, processing.values, ent.stride(0), S, B,
        processing.penalties, processing.penalties.stride(0), BLOCK_R=block_r, BLOCK_S=block_s,
        PINNED=pinned_products_ok(logits.device), num_warps=4 if block_s >= 128 else 1)


__all__ = ["apply_entries_kernel", "launch_apply_entries"]
