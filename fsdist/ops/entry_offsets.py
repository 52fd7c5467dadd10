"""Where each vocabulary tile's entries start in a row's sorted list: one small launch per call.

``prepare_processors`` gives each row a sorted list of bias / penalty entries (``id * 4 +
kind``). A stage-1 tile needs the slice of its own ids. Searching the list from the tile
costs a few dependent memory round trips in the epilogue, where the fused GEMM has nothing
else to do while it waits (one or two programs per SM: the epilogue is not overlapped).
This kernel answers every (row, tile) of one launch up front:

    offsets[r, t] = first position in row r whose entry is >= (first_id + t * tile) * 4

so tile t's entries are positions offsets[r, t] .. offsets[r, t + 1] - 1, two independent
loads that the kernel issues before its main loop (``processors.table_slice``). The table is
[B, n_tiles + 1] int32, and each tile's first HEAD entries are copied beside it: O(B x tiles),
never O(B x V). It depends on the launch's tiling and
vocabulary start only through ``first_id`` and ``tile``, so a tensor-parallel rank builds
the one for its own range; the slices, hence the processed logits, are the search's.
"""
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .prepare_processors import PROBES, SENTINEL, search_rounds
from .processors import lower_bound
from .utils import cdiv, next_pow2, pdl_prologue

_PROBES = tl.constexpr(PROBES)
_SENTINEL = tl.constexpr(SENTINEL)


# Entries of each (row, tile) copied beside the offsets: a tile loads them with the offsets
# before its main loop, so the usual tile (none to a few entries per row) waits on no load in
# its epilogue; only entries past these are read from the list there.
HEAD = 4
_HEAD = tl.constexpr(HEAD)


@triton.jit
def entry_offsets_kernel(ent_ptr, val_ptr, ent_stride, width, rounds, out_ptr, out_stride, head_ptr, head_val_ptr,
                         head_stride, B, n_tiles, first_id, tile, BLOCK: tl.constexpr, TRIGGER: tl.constexpr = False):
    # The next launch (the fused kernel, a programmatic dependent) may start its main loop now; it waits for
    # this kernel's end before it reads the table (fused_sample.py, PDL_WAIT).
    pdl_prologue(False, TRIGGER)
    # One lane per (row, bound), rows after one another: any batch fills the programs.
    lane = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    row = lane // (n_tiles + 1)
    t = lane % (n_tiles + 1)
    live = row < B
    row_base = row * ent_stride
    # int64 keys clamped to SENTINEL: a bound past the last id sits after every real entry
    # and before the padding, whatever the vocabulary size.
    key = tl.minimum((first_id + t * tile) * 4, _SENTINEL)
    pos = lower_bound(ent_ptr, row_base, width, key, live, rounds, _PROBES)
    tl.store(out_ptr + row * out_stride + t, pos, mask=live)
    # The first HEAD entries of each tile (SENTINEL / 0.0 past its slice): those after pos whose
    # id is still below the next bound (the list is sorted), without a second search.
    is_tile = live & (t < n_tiles)
    h = tl.arange(0, _HEAD)
    at = pos[:, None] + h[None, :]
    e = tl.load(ent_ptr + row_base[:, None] + at, mask=is_tile[:, None] & (at < width), other=_SENTINEL)
    inside = e < tl.minimum(key + tile * 4, _SENTINEL)[:, None]
    e = tl.where(inside, e, _SENTINEL)
    v = tl.load(val_ptr + row_base[:, None] + at, mask=inside, other=0.0)
    dst = row[:, None] * head_stride + t[:, None] * _HEAD + h[None, :]
    tl.store(head_ptr + dst, e, mask=is_tile[:, None])
    tl.store(head_val_ptr + dst, v, mask=is_tile[:, None])


class EntryOffsets(NamedTuple):
    """The tiles' view of a call's entries for one launch (see the module docstring).

    offsets:     int32 [B, n_tiles + 1]; tile t's entries are offsets[:, t] .. offsets[:, t + 1] - 1.
    head:        int32 [B, n_tiles, HEAD], each tile's first HEAD entries (SENTINEL past its slice).
    head_values: fp32 [B, n_tiles, HEAD], their values (0.0 past the slice).
    """

    offsets: torch.Tensor
    head: torch.Tensor
    head_values: torch.Tensor


def launch_entry_offsets(entries: torch.Tensor, values: torch.Tensor, first_id: int, tile: int,
                         n_tiles: int, trigger: bool = False) -> EntryOffsets:
    """The offsets and heads of every (row, tile) of a launch whose tile t holds ids first_id +
    t * tile .. + tile - 1, from ``entries`` (int32 [B, S], each row sorted, SENTINEL-padded) and
    their ``values`` (fp32 [B, S]). offsets[r, t] = the first position of row r whose entry is >=
    (first_id + t * tile) * 4. trigger (sm_90+): let the next launch, a programmatic dependent, start before this
    kernel ends (``configs.pdl_after_entry_offsets``)."""
    if entries.dtype != torch.int32 or entries.dim() != 2:
        raise ValueError(f"entries must be int32 [B, S], got {entries.dtype} {tuple(entries.shape)}")
    if values.shape != entries.shape or values.dtype != torch.float32:
        raise ValueError(f"values must be fp32 {tuple(entries.shape)}, got {values.dtype} {tuple(values.shape)}")
    if tile <= 0 or n_tiles < 0 or first_id < 0:
        raise ValueError(f"need tile > 0, n_tiles >= 0 and first_id >= 0, got {tile}, {n_tiles}, {first_id}")
    B, S = entries.shape
    dev = entries.device
    out = EntryOffsets(torch.empty(B, n_tiles + 1, dtype=torch.int32, device=dev),
                       torch.empty(B, n_tiles, HEAD, dtype=torch.int32, device=dev),
                       torch.empty(B, n_tiles, HEAD, dtype=torch.float32, device=dev))
    if B == 0:
        return out
    if S == 0:
        out.offsets.zero_()
        out.head.fill_(SENTINEL)
        out.head_values.zero_()
        return out
    entries, values = entries.contiguous(), values.contiguous()
    lanes = B * (n_tiles + 1)
    # GPU: 128 (row, bound) lanes a program (B = 1 at V = 151936: 10 programs). Interpreter: a
    # program's cost is mostly fixed, so few, wide ones.
    block = 128 if dev.type == "cuda" else min(1 << 16, next_pow2(lanes))
    entry_offsets_kernel[(cdiv(lanes, block),)](
        entries, values, entries.stride(0), S, search_rounds(S), out.offsets, out.offsets.stride(0), out.head,
        out.head_values, out.head.stride(0), B, n_tiles, int(first_id), int(tile), BLOCK=block, TRIGGER=bool(trigger),
        num_warps=4)
    return out


__all__ = ["HEAD", "EntryOffsets", "entry_offsets_kernel", "launch_entry_offsets"]
