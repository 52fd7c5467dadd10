"""ops/pad_rows.py: the hidden zero-padded to whole batch tiles in one launch (fused_sample.tile_operand)."""
import pytest
import torch

from fsdist.ops.pad_rows import PAD_BLOCK, pad_rows


@pytest.mark.parametrize("B,rows,D", [(1, 64, 48), (37, 64, 64), (130, 256, 40), (64, 64, 24), (3, 8, PAD_BLOCK + 5)])
def test_pad_rows_copies_the_rows_and_zeroes_the_rest(device, B, rows, D):
    g = torch.Generator().manual_seed(B * 1000 + D)
    full = torch.randn(B, D + 7, generator=g).to(device=device, dtype=torch.bfloat16)
    h = full[:, 3:3 + D]  # a strided view (row stride D + 7): the copy is contiguous
    # the buffer torch hands out may hold old data: poison the allocator's next block first
    torch.full((rows, D), 5.0, dtype=torch.bfloat16, device=device)
    out = pad_rows(h, rows)
    assert out.shape == (rows, D) and out.is_contiguous() and out.dtype == h.dtype
    assert torch.equal(out[:B], h)
    assert not out[B:].any()
    # the power of the check: a wrong copy or a stale pad row is seen
    bad = out.clone()
    bad[-1, -1] = 1.0 if rows > B else bad[-1, -1] + 1.0
    assert not (torch.equal(bad[:B], h) and not bad[B:].any())


def test_pad_rows_names_its_bad_arguments(device):
    h = torch.zeros(5, 8, dtype=torch.bfloat16, device=device)
    with pytest.raises(ValueError, match="rows"):
        pad_rows(h, 4)
    with pytest.raises(ValueError, match="column stride"):
        pad_rows(h.t(), 16)
    assert pad_rows(h[:0], 0).shape == (0, 8)
