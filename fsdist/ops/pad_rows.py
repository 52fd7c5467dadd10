"""The hidden zero-padded to whole batch tiles, in one launch (``fused_sample.tile_operand``).

A TMA box of the hidden that reaches past its last row is filled with zeros by the copy engine, and
that fill made whole stage-1 calls far slower (docs/performance.md v35, v65): a kernel reading whole
tiles of a padded copy instead runs at the speed of a full batch. The copy is small ([tiles x rows, D],
a few hundred KB at decode sizes), so its cost is its launch: one kernel writes both the copied rows and
the zero rows (``torch``'s copy and fill would be two).
"""
import torch
import triton
import triton.language as tl

from .utils import cdiv

# Elements a program writes (a power of two): 64 rows x 4,096 columns of bf16 in 32 programs.
PAD_BLOCK = 8192


@triton.jit
def pad_rows_kernel(src_ptr, dst_ptr, B, D, stride_src, total, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    row = offs // D
    col = offs % D
    live = offs < total
    x = tl.load(src_ptr + row * stride_src + col, mask=live & (row < B), other=0.0)
    tl.store(dst_ptr + offs, x, mask=live)


def pad_rows(hidden: torch.Tensor, rows: int) -> torch.Tensor:
    """A contiguous [rows, D] copy of ``hidden`` [B, D] (B <= rows, unit column stride) whose rows past B are
    zeros. One launch; no host synchronisation."""
    B, D = hidden.shape
    if rows < B:
        raise ValueError(f"rows must be at least the hidden's {B} rows, got {rows}")
    if hidden.stride(1) != 1:
        raise ValueError("hidden must have unit column stride")
    out = hidden.new_empty(rows, D)
    total = rows * D
    if total:
        pad_rows_kernel[(cdiv(total, PAD_BLOCK),)](hidden, out, B, D, hidden.stride(0), total,
                                                   BLOCK=PAD_BLOCK, num_warps=8)
    return out
