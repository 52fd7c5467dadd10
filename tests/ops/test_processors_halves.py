"""The pieces the warp-specialised kernel's epilogue applies the processors with (fsdist/ops/processors.py),
under Triton's interpreter against the helpers the Triton kernels use:

* split_slices (one 3-key search for a tile's two column halves) gives searched_slice's (start, n) of each
  half, and slice_heads the first HEAD entries of a slice (SENTINEL / 0.0 past it);
* span_words + span_allowed (three words per row per 64 ids) give bitmask_allowed's per-id gather, for halves
  that start on a word, inside one, past the vocabulary and on padding rows.
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
def _slices_kernel(ent_ptr, val_ptr, out_ptr, head_ptr, hval_ptr, n_rows, width, stride, rounds, tile_lo,
                   HALF: tl.constexpr, HEAD: tl.constexpr, BLOCK_R: tl.constexpr):
    rows = tl.arange(0, BLOCK_R)
    mask_r = rows < n_rows
    probes = tl.arange(0, _PROBES) + 1
    s0, n0, s1, n1 = split_slices(ent_ptr, stride, width, rounds, rows, mask_r, tile_lo, probes, HALF)
    r0, m0 = searched_slice(ent_ptr, stride, width, rounds, rows, mask_r, tile_lo, probes, HALF, True)
    r1, m1 = searched_slice(ent_ptr, stride, width, rounds, rows, mask_r, tile_lo + HALF, probes, HALF, True)
    for k, v in enumerate((s0, n0, s1, n1, r0, m0, r1, m1)):
        tl.store(out_ptr + rows * 8 + k, v, mask=mask_r)
    hcol = tl.arange(0, HEAD)
    h, hv = slice_heads(ent_ptr, val_ptr, stride, rows, s1, n1, hcol)
    tl.store(head_ptr + rows[:, None] * HEAD + hcol[None, :], h, mask=mask_r[:, None])
    tl.store(hval_ptr + rows[:, None] * HEAD + hcol[None, :], hv, mask=mask_r[:, None])


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


def _slices(ent, vals, tile_lo):
    n_rows, width = ent.shape
    out = torch.full((n_rows, 8), -5, dtype=torch.int32)
    head = torch.full((n_rows, HEAD), -5, dtype=torch.int32)
    hval = torch.full((n_rows, HEAD), -5.0)
    _slices_kernel[(1,)](ent, vals, out, head, hval, n_rows, width, ent.stride(0), search_rounds(width), tile_lo,
                         HALF=HALF, HEAD=HEAD, BLOCK_R=triton.next_power_of_2(n_rows))
    return out, head, hval


@pytest.mark.parametrize("width", [1, 17, 300])
@pytest.mark.parametrize("tile_lo", [0, 64, 200])
def test_split_slices_are_the_halves_searched_slices(width, tile_lo):
    ent, vals = _entries(7, width, seed=width + tile_lo, tile_lo=tile_lo)
    out, head, hval = _slices(ent, vals, tile_lo)
    assert torch.equal(out[:, :4], out[:, 4:])
    for r in range(ent.shape[0]):  # and the slices hold exactly the half's ids
        ids = ent[r].long() >> 2
        s1, n1 = out[r, 2].item(), out[r, 3].item()
        want = ((ids >= tile_lo + HALF) & (ids < tile_lo + 2 * HALF) & (ent[r] != SENTINEL)).nonzero().flatten()
        assert n1 == want.numel() and (n1 == 0 or want[0].item() == s1)
        k = min(n1, HEAD)
        assert torch.equal(head[r, :k], ent[r, s1:s1 + k]) and torch.equal(hval[r, :k], vals[r, s1:s1 + k])
        assert (head[r, k:] == SENTINEL).all() and (hval[r, k:] == 0.0).all()
    # power: a slice one id off is another slice here
    shifted, _, _ = _slices(ent, vals, tile_lo + 1)
    assert not torch.equal(shifted[:, :4], out[:, :4])


@triton.jit
def _bits_kernel(bm_ptr, out_ptr, ref_ptr, n_rows, bm_stride, vocab_size, first_id, BLOCK_R: tl.constexpr):
    rows = tl.arange(0, BLOCK_R)
    mask_r = rows < n_rows
    gid = first_id + tl.arange(0, 64)
    ok = gid < vocab_size
    w0, w1, w2 = span_words(bm_ptr, bm_stride, rows, mask_r, first_id, vocab_size)
    got = span_allowed(w0, w1, w2, first_id, gid)
    ref = bitmask_allowed(bm_ptr, bm_stride, rows, mask_r, gid, ok)
    at = rows[:, None] * 64 + tl.arange(0, 64)[None, :]
    tl.store(out_ptr + at, got.to(tl.int8), mask=mask_r[:, None])
    tl.store(ref_ptr + at, ref.to(tl.int8), mask=mask_r[:, None])


@pytest.mark.parametrize("first_id", [0, 64, 100, 159, 190])
def test_span_words_give_the_per_id_gather(first_id):
    n_rows, vocab_size = 5, 200  # ids 200.. are past the vocabulary (read as allowed, as the gather does)
    g = torch.Generator().manual_seed(first_id)
    bm = torch.randint(-2**31, 2**31 - 1, (n_rows, 7), generator=g, dtype=torch.int64).to(torch.int32)
    got = torch.zeros(n_rows, 64, dtype=torch.int8)
    ref = torch.ones(n_rows, 64, dtype=torch.int8)
    _bits_kernel[(1,)](bm, got, ref, n_rows - 1, bm.stride(0), vocab_size, first_id, BLOCK_R=8)  # last row: padding
    ids = first_id + torch.arange(64)
    inside = ids < vocab_size
    assert torch.equal(got[:n_rows - 1, inside.nonzero().flatten()], ref[:n_rows - 1, inside.nonzero().flatten()])
    words = bm[:n_rows - 1, (ids[inside] // 32)]
    want = ((words >> (ids[inside] % 32)) & 1).to(torch.int8)
    assert torch.equal(got[:n_rows - 1][:, inside], want)
    # power: one flipped bit inside the span shows
    bm2 = bm.clone()
    bm2[0, first_id // 32] ^= 1 << (first_id % 32)
    got2 = torch.zeros_like(got)
    _bits_kernel[(1,)](bm2, got2, ref, n_rows - 1, bm.stride(0), vocab_size, first_id, BLOCK_R=8)
    assert not torch.equal(got2, got)
