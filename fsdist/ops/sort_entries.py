"""A stable sort of each row's processor entries, by rank, spread over many programs.

``prepare_processors`` builds each row's entries (``id * 4 + kind``) in slot order; the
tiles need them sorted. Its own sort, a bitonic network inside one program (``tl.sort``), is
dozens of dependent compare-exchange stages: ~7 µs for 1,000 entries on an H200 (32-bit keys, 16
warps), but 63 µs for 3,000 (2026-11-26, bench/prepare_probe.py). Here each entry's final
position is computed directly, as its rank:

    rank(i) = #{j : e_j < e_i} + #{j < i : e_j == e_i}

(the second term keeps equal entries in slot order: a stable sort, so repeated bias ids still
add up in the order given). A program takes BLOCK_I entries of one row and compares them with
the whole row, BLOCK_J at a time, then scatters each entry and its value to its rank. The
work is O(S^2) per row but fully parallel over (row, block) programs with no dependent
stages: where a call has little of it (``rank_sort_pays``: small batches of wide rows, up to
RANK_SORT_MAX entries) it beats the bitonic sort's latency; elsewhere the bitonic sort stays.
"""
import torch
import triton
import triton.language as tl

from .utils import cdiv, next_pow2

# When the rank sort is chosen over the preparation's in-kernel bitonic sort (one program a row, on a
# GPU). The bitonic sort's cost is latency, nearly flat in B but steep in the row's width; the rank
# sort's grows with B x S^2. Measured on an H200 (2026-11-26, bench/prepare_probe.py):
#   S <= 1,024 entries: the bitonic sort on 32-bit keys wins at every B (1,000 ids: 6.9 vs 7.1 µs at
#     B = 1, 7.3 vs 25 at B = 64): never by rank;
#   S of 2,049-4,096 (4,096 slots): bitonic 63 µs at any B <= 64, rank 15 / 147 µs at B = 1 / 64: by rank
#     up to B x S^2 = RANK_SORT_MAX_WORK (S = 3,000: B <= 22);
#   S of 1,025-2,048: not re-measured; the rule kept from 2026-11-23 (by rank up to B x S^2 = 40 << 20,
#     S = 2,000: B <= 10), measured then against a slower bitonic sort (64-bit keys, 4 warps).
RANK_SORT_MAX = 4096
RANK_SORT_MAX_WORK = 192 << 20  # S = 3,000: B <= 22
RANK_SORT_MAX_WORK_2048 = 40 << 20  # S = 2,000: B <= 10


def rank_sort_pays(batch: int, width: int) -> bool:
    """Whether rows of ``width`` entries in a batch of ``batch`` are sorted by rank (see above)."""
    if width <= 1024 or width > RANK_SORT_MAX:
        return False
    work = batch * width * width
    return work <= (RANK_SORT_MAX_WORK_2048 if width <= 2048 else RANK_SORT_MAX_WORK)


@triton.jit
def sort_entries_kernel(ent_in, val_in, ent_out, val_out, stride_in, stride_out, S,
                        BLOCK_I: tl.constexpr, BLOCK_J: tl.constexpr):
    row = tl.program_id(0)
    i = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)
    live = i < S
    src = ent_in + row.to(tl.int64) * stride_in
    # Unique keys (entry, slot) in one int64, so a rank is one comparison per pair; slots past
    # the row load as the largest key and never count. The comparisons add up elementwise and
    # are reduced once at the end (a reduction per block of j would cost more than the compares).
    k_i = (tl.load(src + i, mask=live, other=0).to(tl.int64) << 32) | i.to(tl.int64)
    below = tl.zeros([BLOCK_I, BLOCK_J], tl.int32)
    for j0 in range(0, S, BLOCK_J):
        j = j0 + tl.arange(0, BLOCK_J)
        k_j = (tl.load(src + j, mask=j < S, other=0).to(tl.int64) << 32) | j.to(tl.int64)
        k_j = tl.where(j < S, k_j, 0x7FFFFFFFFFFFFFFF)
        below += (k_j[None, :] < k_i[:, None]).to(tl.int32)
    rank = tl.sum(below, axis=1)
    e_i = (k_i >> 32).to(tl.int32)
    v_i = tl.load(val_in + row.to(tl.int64) * stride_in + i, mask=live, other=0.0)
    dst = row.to(tl.int64) * stride_out + rank
    tl.store(ent_out + dst, e_i, mask=live)
    tl.store(val_out + dst, v_i, mask=live)


def launch_sort_entries(entries: torch.Tensor, values: torch.Tensor):
    """(entries, values) with each row stably sorted by entry: int32 [B, S] and fp32 [B, S]
    (new tensors; the inputs are left as they were). S must be <= RANK_SORT_MAX."""
    B, S = entries.shape
    if S > RANK_SORT_MAX:
        raise ValueError(f"rank sort is for rows of at most {RANK_SORT_MAX} entries, got {S}")
    if entries.dtype != torch.int32 or values.shape != entries.shape:
        raise ValueError(f"entries must be int32 [B, S] with values of the same shape, got {entries.dtype} "
                         f"{tuple(entries.shape)} and {tuple(values.shape)}")
    out_e, out_v = torch.empty_like(entries), torch.empty_like(values)
    if B == 0 or S == 0:
        return out_e, out_v
    entries, values = entries.contiguous(), values.contiguous()
    on_gpu = entries.device.type == "cuda"
    # GPU: 64 entries a program (B = 1, S = 1,000: 16 programs, each ~64k comparisons).
    # Interpreter: a program's cost is mostly fixed, so whole rows.
    block_i = 64 if on_gpu else min(1024, next_pow2(S))
    block_j = 128 if on_gpu else min(1024, next_pow2(S))
    sort_entries_kernel[(B, cdiv(S, block_i))](
        entries, values, out_e, out_v, entries.stride(0), out_e.stride(0), S,
        BLOCK_I=block_i, BLOCK_J=block_j, num_warps=4)
    return out_e, out_v


__all__ = ["RANK_SORT_MAX", "RANK_SORT_MAX_WORK", "launch_sort_entries", "rank_sort_pays", "sort_entries_kernel"]
