"""Vocabulary padding and per-rank vocabulary ranges, in one helper (Megatron style).

The vocabulary is padded up to a multiple of ``make_vocab_size_divisible_by * tp`` so
that every rank owns the same number of rows, and that number is itself a multiple of
``make_vocab_size_divisible_by`` (nice GEMM shapes). Rank r owns the contiguous rows
``[r * Vp / tp, (r + 1) * Vp / tp)`` of the padded [Vp, D] weight. Rows with a global id
>= vocab_size are padding: they exist in memory but the sampling kernel masks them, so
they are never sampled and add nothing to the log-sum-exp.

Every other part of the tensor-parallel code gets these numbers from
:func:`vocab_partition`, so there is exactly one place that decides who owns what.
"""
from dataclasses import dataclass


def _positive_int(x, name: str) -> int:
    if isinstance(x, bool) or not isinstance(x, int):
        raise TypeError(f"{name} must be an int, got {type(x).__name__}")
    if x < 1:
        raise ValueError(f"{name} must be >= 1, got {x}")
    return x


def pad_vocab_size(vocab_size: int, tp_size: int, make_vocab_size_divisible_by: int = 128) -> int:
    """Smallest multiple of ``make_vocab_size_divisible_by * tp_size`` that is >= vocab_size."""
    vocab_size = _positive_int(vocab_size, "vocab_size")
    tp_size = _positive_int(tp_size, "tp_size")
    multiple = _positive_int(make_vocab_size_divisible_by, "make_vocab_size_divisible_by") * tp_size
    return -(-vocab_size // multiple) * multiple


@dataclass(frozen=True)
class VocabPartition:
    """Which rows of the (padded) vocabulary one rank owns.

    vocab_size:        true vocabulary size V; ids >= V are padding.
    padded_vocab_size: Vp, a multiple of make_vocab_size_divisible_by * tp_size.
    tp_size, rank:     the tensor-parallel group size and this rank's index in it.
    start, end:        this rank's global id range [start, end), end - start = Vp / tp.
    """

    vocab_size: int
    padded_vocab_size: int
    tp_size: int
    rank: int
    start: int
    end: int

    @property
    def rows(self) -> int:
        """Rows of this rank's weight shard (padding rows included)."""
        return self.end - self.start

    @property
    def valid_rows(self) -> int:
        """Rows of this rank's shard that are real vocabulary entries (may be 0)."""
        return max(0, min(self.end, self.vocab_size) - self.start)

    def range_of(self, rank: int):
        """Global id range [start, end) of any rank of the group."""
        if not 0 <= rank < self.tp_size:
            raise ValueError(f"rank {rank} is outside the tensor-parallel group of size {self.tp_size}")
        return rank * self.rows, (rank + 1) * self.rows


def vocab_partition(vocab_size: int, tp_size: int, rank: int,
                    make_vocab_size_divisible_by: int = 128) -> VocabPartition:
    """Pad the vocabulary and give rank ``rank`` of ``tp_size`` its contiguous range."""
    padded = pad_vocab_size(vocab_size, tp_size, make_vocab_size_divisible_by)
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < tp_size:
        raise ValueError(f"rank must be an int in [0, {tp_size}), got {rank!r}")
    per_rank = padded // tp_size
    return VocabPartition(vocab_size, padded, tp_size, rank, rank * per_rank, (rank + 1) * per_rank)
