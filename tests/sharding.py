"""``pytest --shard I/N``: run only the I-th of N contiguous blocks of the collected tests.

For GPU runs (`JOBS=N SPLIT=tests bash scripts/gpu_check.sh`), which split the whole suite over parallel pytest
processes on one GPU: their time goes to Triton's compiles on the host, one kernel at a time a process. Blocks are
contiguous in collection order so that a file's tests, which compile the same kernels, mostly stay in one process;
the N blocks cover every test exactly once.
"""


def parse_shard(text: str) -> tuple:
    """(index, count) from "I/N"; a ValueError naming the option when it is not 0 <= I < N."""
    try:
        index, count = (int(part) for part in text.split("/"))
    except ValueError:
        raise ValueError(f"--shard must be I/N with integers, e.g. 0/4; got {text!r}") from None
    if count < 1 or not 0 <= index < count:
        raise ValueError(f"--shard I/N needs N >= 1 and 0 <= I < N; got {text!r}")
    return index, count


def shard_bounds(n_items: int, index: int, count: int) -> tuple:
    """[start, stop) of block ``index`` of ``count`` over n_items: sizes differ by at most one."""
    return n_items * index // count, n_items * (index + 1) // count
