"""Vocabulary padding and per-rank ranges (single process, no MPI)."""
import pytest

from fsdist.tensor_parallel.vocab import pad_vocab_size, vocab_partition


@pytest.mark.parametrize("V,tp,div,expected", [
    (1000, 1, 128, 1024), (1000, 2, 128, 1024), (1000, 4, 128, 1024), (1000, 8, 128, 1024),
    (1024, 4, 128, 1024), (1025, 4, 128, 1536), (128256, 8, 128, 129024), (151936, 4, 128, 152064),
    (50257, 2, 64, 50304), (7, 3, 1, 9), (1, 1, 1, 1),
])
def test_pad_vocab_size(V, tp, div, expected):
    Vp = pad_vocab_size(V, tp, div)
    assert Vp == expected
    assert Vp >= V and Vp % (div * tp) == 0 and Vp - V < div * tp


@pytest.mark.parametrize("V,tp,div", [(1000, 2, 128), (1000, 4, 128), (300, 4, 128), (128256, 8, 128), (10, 3, 1)])
def test_ranges_tile_the_padded_vocabulary(V, tp, div):
    parts = [vocab_partition(V, tp, r, div) for r in range(tp)]
    Vp = parts[0].padded_vocab_size
    assert parts[0].start == 0 and parts[-1].end == Vp
    for a, b in zip(parts, parts[1:]):
        assert a.end == b.start  # contiguous, in rank order
    assert all(p.rows == Vp // tp for p in parts)
    assert all(p.rows % div == 0 for p in parts)
    assert sum(p.valid_rows for p in parts) == V
    for p in parts:
        assert p.range_of(p.rank) == (p.start, p.end)
        assert 0 <= p.valid_rows <= p.rows


def test_padding_only_rank():
    # V=300 padded to 512 over 4 ranks of 128 rows: rank 3 holds only padding.
    parts = [vocab_partition(300, 4, r) for r in range(4)]
    assert [p.valid_rows for p in parts] == [128, 128, 44, 0]


@pytest.mark.parametrize("kwargs,exc", [
    (dict(vocab_size=0, tp_size=2, rank=0), ValueError),
    (dict(vocab_size=100, tp_size=0, rank=0), ValueError),
    (dict(vocab_size=100, tp_size=2, rank=2), ValueError),
    (dict(vocab_size=100, tp_size=2, rank=-1), ValueError),
    (dict(vocab_size=100.0, tp_size=2, rank=0), TypeError),
    (dict(vocab_size=100, tp_size=2, rank=0, make_vocab_size_divisible_by=0), ValueError),
])
def test_bad_arguments(kwargs, exc):
    with pytest.raises(exc):
        vocab_partition(**kwargs)
