"""The tiles' entry search (fsdist.ops.processors.lower_bounds, 16-ary): for every row and both
keys, the first position whose entry is >= the key, exactly torch.searchsorted(side="left"),
on widths around the probe count's powers, duplicates, keys below / above / between all
entries, SENTINEL padding and masked rows; and the round count bound (search_rounds)."""
import pytest
import torch
import triton
import triton.language as tl

from fsdist.ops.prepare_processors import PROBES, SENTINEL, search_rounds
from fsdist.ops.processors import lower_bounds

_PROBES = tl.constexpr(PROBES)


@triton.jit
def _search_kernel(ent_ptr, keys_ptr, out_ptr, n_rows, width, stride, rounds, BLOCK_R: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    mask_r = rows < n_rows
    ka = tl.load(keys_ptr)
    kb = tl.load(keys_ptr + 1)
    a, b = lower_bounds(ent_ptr, rows.to(tl.int64) * stride, width, ka, kb, mask_r, rounds, _PROBES)
    tl.store(out_ptr + rows * 2, a, mask=mask_r)
    tl.store(out_ptr + rows * 2 + 1, b, mask=mask_r)


def _search(ent: torch.Tensor, ka: int, kb: int, rounds=None) -> torch.Tensor:
    rows, width = ent.shape
    out = torch.full((rows, 2), -5, dtype=torch.int32)
    keys = torch.tensor([ka, kb], dtype=torch.int64)
    _search_kernel[(triton.cdiv(rows, 8),)](ent, keys, out, rows, width, ent.stride(0),
                                            search_rounds(width) if rounds is None else rounds, BLOCK_R=8)
    return out


def _rows(width: int, n_rows: int, seed: int) -> torch.Tensor:
    """Sorted rows of entries (id * 4 + kind style, with repeats), some padded with SENTINEL."""
    g = torch.Generator().manual_seed(seed)
    ent = torch.randint(0, 4 * 300, (n_rows, width), generator=g, dtype=torch.int64)
    ent[0, : width // 2] = 40  # a run of duplicates
    for r in range(1, n_rows, 3):
        ent[r, width - width // 3:] = SENTINEL  # a row with fewer entries
    return torch.sort(ent, dim=1).values


@pytest.mark.parametrize("width", [1, 2, 15, 16, 17, 255, 256, 257, 1000, 1024, 4097])
def test_lower_bounds_equal_searchsorted(width):
    ent = _rows(width, 11, seed=width)
    for ka, kb in [(0, 4 * 300 + 7), (40, 41), (39, 40), (512, 900), (-3, SENTINEL), (SENTINEL + 1, 1)]:
        got = _search(ent, ka, kb)
        for col, key in ((0, ka), (1, kb)):
            want = torch.searchsorted(ent, torch.full((ent.shape[0], 1), key, dtype=torch.int64), side="left")
            assert torch.equal(got[:, col].long(), want.squeeze(1)), (width, key, got[:, col], want.squeeze(1))


def test_too_few_rounds_is_caught():
    """Power: one round short of search_rounds leaves some position unsettled."""
    width = 1000
    ent = torch.arange(width, dtype=torch.int64).view(1, width).repeat(4, 1) * 4
    keys = [(k, k + 4) for k in range(0, 4 * width, 4 * 37)]
    short = [_search(ent, ka, kb, rounds=search_rounds(width) - 1) for ka, kb in keys]
    want = [torch.tensor([[ka // 4, kb // 4]] * 4, dtype=torch.int32).clamp(max=width) for ka, kb in keys]
    assert any(not torch.equal(s, w) for s, w in zip(short, want))
    full = [_search(ent, ka, kb) for ka, kb in keys]
    assert all(torch.equal(s, w) for s, w in zip(full, want))


def test_search_rounds():
    assert search_rounds(0) == 0 and search_rounds(1) == 1 and search_rounds(16) == 1
    assert search_rounds(17) == 2 and search_rounds(1024) == 3 and search_rounds(4096) == 3
    assert search_rounds(4097) == 3 and search_rounds(65536) == 4  # 11 and 16 halvings for a binary search
