"""ops/pad_rows.py: the hidden zero-padded to whole batch tiles in one launch (fused_sample.tile_operand)."""
import pytest
import torch

from fsdist.ops.pad_rows import PAD_BLOCK, pad_rows


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("B,rows,D", [(1, 64, 48), (37, 64, 64), (130, 256, 40), (64, 64, 24), (3, 8, PAD_BLOCK + 5)])
def test_pad_rows_copies_the_rows_and_zeroes_the_rest(device, dtype, B, rows, D):
    g = torch.Generator().manual_seed(B * 1000 + D)
    full = torch.randn(B, D + 7, generator=g).to(device=device, dtype=dtype)
    full[0, 3] = float("nan")  # special values come through bit for bit
    full[-1, 4] = float("-inf")
    full[-1, 5] = -0.0
    h = full[:, 3:3 + D]  # a strided view (row stride D + 7): the copy is contiguous
    # Best effort against a kernel that skips the pad rows: freed memory full of a nonzero value, which the caching
    # allocator (CUDA) hands out again for the copy; on a CPU a fresh block is typically zero already.
    del_me = torch.full((rows, D), 5.0, dtype=dtype, device=device)
    del del_me
    out = pad_rows(h, rows)
    assert out.shape == (rows, D) and out.is_contiguous() and out.dtype == dtype
    assert torch.equal(out[:B].view(torch.int16 if dtype != torch.float32 else torch.int32),
                       h.contiguous().view(torch.int16 if dtype != torch.float32 else torch.int32))
    assert not out[B:].any()


def test_pad_rows_names_its_bad_arguments(device):
    h = torch.zeros(5, 8, dtype=torch.bfloat16, device=device)
    with pytest.raises(ValueError, match="rows"):
        pad_rows(h, 4)
    with pytest.raises(ValueError, match="column stride"):
        pad_rows(h.t(), 16)
    assert pad_rows(h[:0], 0).shape == (0, 8)
