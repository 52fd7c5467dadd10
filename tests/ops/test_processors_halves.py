"""The pieces the warp-specialised kernel's epilogue applies the processors with (fsdist/ops/processors.py),
under Triton's interpreter against the helpers the Triton kernels use:

* split_slices (one 3-key search for a tile's two column halves) gives searched_slice's (start, n) of each
  half, and slice_heads the first HEAD entries of a slice (SENTINEL / 0.0 past it);
* span_words + span_allowed (three words per row per 64 ids) give bitmask_allowed's per-id gather for every id
  of the vocabulary, for halves that start on a word, inside one, that run past the vocabulary, and on padding
  rows.
Power: a half off by one id, and a bit flipped in a word, are seen.
"""
import pytest
import torch
import triton
import triton.language as tl

from fsdist.ops.prepare_processors import PROBES, SENTINEL, search_rounds
from fsdist.ops.processors import bitmask_allowed, searched_slice, slice_heads, span_allowed, span_words, split_slices

_PROBES = tl.constexpr(PROBES)
HALF = 64
HEAD = 4


@triton.jit
def _slices_kernel(ent_ptr, val_ptr, out_ptr, head_ptr, hval_ptr, n_rows, n_live, width, stride, rounds, tile_lo,
                   HALF: tl.constexpr, HEAD: tl.constexpr, BLOCK_R: tl.constexpr):
    rows = tl.arange(0, BLOCK_R)
    stored = rows < n_rows
    mask_r = rows < n_live  # rows n_live .. n_rows - 1: padding rows of the batch tile
    probes = tl.arange(0, _PROBES) + 1
    s0, n0, s1, n1 = split_slices(ent_ptr, stride, width, rounds, rows, mask_r, tile_lo, probes, HALF)
    r0, m0 = searched_slice(ent_ptr, stride, width, rounds, rows, mask_r, tile_lo, probes, HALF, True)
    r1, m1 = searched_slice(ent_ptr, stride, width, rounds, rows, mask_r, tile_lo + HALF, probes, HALF, True)
    tl.store(out_ptr + rows * 8 + 0, s0, mask=stored)
    tl.store(out_ptr + rows * 8 + 1, n0, mask=stored)
    tl.store(out_ptr + rows * 8 + 2, s1, mask=stored)
    tl.store(out_ptr + rows * 8 + 3, n1, mask=stored)
    tl.store(out_ptr + rows * 8 + 4, r0, mask=stored)
    tl.store(out_ptr + rows * 8 + 5, m0, mask=stored)
    tl.store(out_ptr + rows * 8 + 6, r1, mask=stored)
    tl.store(out_ptr + rows * 8 + 7, m1, mask=stored)
    hcol = tl.arange(0, HEAD)
    at = rows[:, None] * (2 * HEAD) + hcol[None, :]
    h0, hv0 = slice_heads(ent_ptr, val_ptr, stride, rows, s0, n0, hcol)
    h1, hv1 = slice_heads(ent_ptr, val_ptr, stride, rows, s1, n1, hcol)
    tl.store(head_ptr + at, h0, mask=stored[:, None])
    tl.store(hval_ptr + at, hv0, mask=stored[:, None])
    tl.store(head_ptr + at + HEAD, h1, mask=stored[:, None])
    tl.store(hval_ptr + at + HEAD, hv1, mask=stored[:, None])


def _entries(n_rows, width, seed, tile_lo):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 400, (n_rows, width), generator=g)
    ids[0, :8] = 127  # a run on the halves' edge (tile_lo = 64: the first half is 64..127)
    ids[1, :10] = 128
    ids[3, 0] = tile_lo + HALF  # the second half's first id: the power check's shifted tile misses it
    kinds = torch.randint(0, 3, (n_rows, width), generator=g)
    ent = ids * 4 + kinds
    ent[2, width // 2:] = SENTINEL
    ent = torch.sort(ent, dim=1).values.to(torch.int32)
    return ent, torch.randn(n_rows, width, generator=g)


def _slices(ent, vals, tile_lo, device, n_live=None):
    """(start_0, n_0, start_1, n_1 of split_slices, then searched_slice's four) [rows, 8] and the two halves'
    heads and head values [rows, 2, HEAD], on the CPU; rows from n_live on are masked (padding)."""
    n_rows, width = ent.shape
    out = torch.full((n_rows, 8), -5, dtype=torch.int32, device=device)
    head = torch.full((n_rows, 2, HEAD), -5, dtype=torch.int32, device=device)
    hval = torch.full((n_rows, 2, HEAD), -5.0, device=device)
    _slices_kernel[(1,)](ent.to(device), vals.to(device), out, head, hval, n_rows,
                         n_rows if n_live is None else n_live, width, ent.stride(0), search_rounds(width), tile_lo,
                         HALF=HALF, HEAD=HEAD, BLOCK_R=triton.next_power_of_2(n_rows))
    return out.cpu(), head.cpu(), hval.cpu()


@pytest.mark.parametrize("width", [1, 17, 300])
@pytest.mark.parametrize("tile_lo", [0, 64, 200])
def test_split_slices_are_the_halves_searched_slices(width, tile_lo, device):
    ent, vals = _entries(7, width, seed=width + tile_lo, tile_lo=tile_lo)
    out, head, hval = _slices(ent, vals, tile_lo, device)
    assert torch.equal(out[:, :4], out[:, 4:])
    for r in range(ent.shape[0]):  # and the slices hold exactly the half's ids, the heads its first HEAD
        ids = ent[r].long() >> 2
        for half in (0, 1):
            s, n = out[r, 2 * half].item(), out[r, 2 * half + 1].item()
            lo = tile_lo + half * HALF
            want = ((ids >= lo) & (ids < lo + HALF) & (ent[r] != SENTINEL)).nonzero().flatten()
            assert n == want.numel() and (n == 0 or want[0].item() == s)
            k = min(n, HEAD)
            hh, hv = head[r, half], hval[r, half]
            assert torch.equal(hh[:k], ent[r, s:s + k]) and torch.equal(hv[:k], vals[r, s:s + k])
            assert (hh[k:] == SENTINEL).all() and (hv[k:] == 0.0).all()
    # padding rows: empty slices, SENTINEL heads
    masked, mhead, _ = _slices(ent, vals, tile_lo, device, n_live=4)
    assert torch.equal(masked[:4], out[:4])
    assert (masked[4:, [1, 3, 5, 7]] == 0).all() and (mhead[4:] == SENTINEL).all()
    # power: a slice one id off is another slice here
    shifted, _, _ = _slices(ent, vals, tile_lo + 1, device)
    assert not torch.equal(shifted[:, :4], out[:, :4])


@triton.jit
def _bits_kernel(bm_ptr, out_ptr, ref_ptr, n_rows, n_live, bm_stride, vocab_size, first_id, BLOCK_R: tl.constexpr):
    rows = tl.arange(0, BLOCK_R)
    stored = rows < n_rows
    mask_r = rows < n_live  # the rest: padding rows, which read every id as allowed
    gid = first_id + tl.arange(0, 64)
    ok = gid < vocab_size
    w0, w1, w2 = span_words(bm_ptr, bm_stride, rows, mask_r, first_id, vocab_size)
    got = span_allowed(w0, w1, w2, first_id, gid)
    ref = bitmask_allowed(bm_ptr, bm_stride, rows, mask_r, gid, ok)
    at = rows[:, None] * 64 + tl.arange(0, 64)[None, :]
    tl.store(out_ptr + at, got.to(tl.int8), mask=stored[:, None])
    tl.store(ref_ptr + at, ref.to(tl.int8), mask=stored[:, None])


def _bits(bm, n_live, vocab_size, first_id, device):
    got = torch.full((bm.shape[0], 64), 7, dtype=torch.int8, device=device)
    ref = torch.full((bm.shape[0], 64), 7, dtype=torch.int8, device=device)
    _bits_kernel[(1,)](bm.to(device), got, ref, bm.shape[0], n_live, bm.stride(0), vocab_size, first_id, BLOCK_R=8)
    return got.cpu(), ref.cpu()


@pytest.mark.parametrize("first_id", [0, 64, 100, 159, 190])
def test_span_words_give_the_per_id_gather(first_id, device):
    n_rows, vocab_size = 5, 200  # ids 200.. are past the vocabulary (read as allowed, as the gather does)
    g = torch.Generator().manual_seed(first_id)
    bm = torch.randint(-2**31, 2**31 - 1, (n_rows, 7), generator=g, dtype=torch.int64).to(torch.int32)
    got, ref = _bits(bm, n_rows - 1, vocab_size, first_id, device)  # the last row: padding
    ids = first_id + torch.arange(64)
    inside = ids < vocab_size
    # the gather's answer for every id of the vocabulary, padding rows included (all allowed); ids past it
    # may read the bits of a word the vocabulary ends in (the kernels mask those ids to -inf before)
    assert torch.equal(got[:, inside], ref[:, inside]) and (got[n_rows - 1] == 1).all()
    words = bm[:n_rows - 1, (ids[inside] // 32)]
    want = ((words >> (ids[inside] % 32)) & 1).to(torch.int8)
    assert torch.equal(got[:n_rows - 1][:, inside], want)
    # power: one flipped bit inside the span shows
    bm2 = bm.clone()
    bm2[0, first_id // 32] ^= 1 << (first_id % 32)
    got2, _ = _bits(bm2, n_rows - 1, vocab_size, first_id, device)
    assert not torch.equal(got2, got)
