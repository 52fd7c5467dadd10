"""Timing of device work, the one implementation the benchmarks and the demo share.

Conventions (see docs/benchmarks.md):

* :func:`time_calls`: per-call device-event timing in the style of
  ``triton.testing.do_bench``: warm-up calls, then for every timed call an optional
  ``before_call(i)`` hook and L2 flush (both outside the timed region), a start event,
  the call, an end event. The host queues every call before it synchronises once, so
  host launch cost stays hidden unless the call itself synchronises. One sample
  (microseconds) per call; :func:`median_us` is the usual summary.
* :class:`CapturedGraph` / :func:`time_graph`: calls captured once in a CUDA graph and
  replayed; one sample per replay, divided by the calls in the graph.
* :func:`time_interleaved` / :func:`paired_ratio`: several methods timed in turns, round by round, and two of them
  compared within each round (an A/B whose difference is smaller than the machine's drift between blocks).
* :class:`Stamp`: one point on the stream, for timing a stretch of calls (the
  tensor-parallel lock-step loop) or the pieces of a step.
* Input rotation: callers pass several argument sets (e.g. different hidden-state
  buffers); call ``i`` uses set ``i % n``, so no call finds its inputs in L2 from the
  previous one, and the flush removes whatever else the last call left there.

Without a GPU (the Triton interpreter) every function falls back to the host clock,
so smoke runs take the same code paths; those numbers only show that the code ran.
Needs nothing but torch.
"""
import statistics
import time
from typing import Callable, Dict, List, Optional, Sequence, Union

import torch


def default_device() -> torch.device:
    """The current CUDA device, or the CPU without a GPU."""
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def _on_cuda(device: Optional[torch.device]) -> bool:
    return (device if device is not None else default_device()).type == "cuda"


def synchronize(device: Optional[torch.device] = None) -> None:
    """Wait for the device's queued work (nothing to wait for on the CPU)."""
    if _on_cuda(device):
        torch.cuda.synchronize(device)


class L2Flusher:
    """Overwrites a buffer larger than L2 (twice its size, at least 256 MB) between timed calls.

    A no-op on the CPU. Allocate one per run and reuse it: the buffer stays allocated.
    """

    def __init__(self, device: Optional[torch.device] = None, nbytes: Optional[int] = None):
        device = torch.device(device) if device is not None else default_device()
        self.buf = None
        if device.type == "cuda":
            if nbytes is None:
                props = torch.cuda.get_device_properties(device)
                l2 = getattr(props, "L2_cache_size", 0) or (50 << 20)
                nbytes = max(256 << 20, 2 * l2)
            self.buf = torch.empty(nbytes, dtype=torch.int8, device=device)

    def __call__(self) -> None:
        if self.buf is not None:
            self.buf.zero_()


def time_calls(fn: Callable, arg_sets: Sequence[tuple] = ((),), *, warmup: int = 25, reps: int = 100,
               flush: Optional[Callable[[], None]] = None, before_call: Optional[Callable[[int], None]] = None,
               device: Optional[torch.device] = None) -> List[float]:
    """Microseconds of each of ``reps`` calls ``fn(*arg_sets[i % len(arg_sets)])`` (module docstring).

    flush: called before every timed call, outside the timed region (an :class:`L2Flusher`).
    before_call: ``before_call(i)`` before timed call i, outside the timed region (e.g. to
    advance a device-held offset tensor); not called during warm-up.
    """
    if reps < 1:
        raise ValueError(f"reps must be >= 1, got {reps}")
    n = len(arg_sets)
    if n == 0:
        raise ValueError("arg_sets must hold at least one argument tuple")
    for i in range(warmup):
        fn(*arg_sets[i % n])
    synchronize(device)
    if not _on_cuda(device):
        out = []
        for i in range(reps):
            if before_call is not None:
                before_call(i)
            t0 = time.perf_counter()
            fn(*arg_sets[i % n])
            out.append((time.perf_counter() - t0) * 1e6)
        return out
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        if before_call is not None:
            before_call(i)
        if flush is not None:
            flush()
        starts[i].record()
        fn(*arg_sets[i % n])
        ends[i].record()
    torch.cuda.synchronize(device)
    return [s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)]


def median_us(fn: Callable, arg_sets: Sequence[tuple] = ((),), *, warmup: int = 25, reps: int = 100,
              flush: Union[bool, Callable[[], None], None] = True, device: Optional[torch.device] = None) -> float:
    """Median of :func:`time_calls`, in microseconds.

    flush: True allocates an :class:`L2Flusher` for this measurement (pass one in to reuse
    its buffer across measurements), False / None times without flushing.
    """
    if flush is True:
        flush = L2Flusher(device)
    return statistics.median(time_calls(fn, arg_sets, warmup=warmup, reps=reps, flush=flush or None,
                                        device=device))


class Stamp:
    """A point in time on the current stream: a recorded CUDA event, or the host clock on the CPU."""

    def __init__(self, device: Optional[torch.device] = None):
        self.cuda = _on_cuda(device)
        if self.cuda:
            self.event = torch.cuda.Event(enable_timing=True)
            self.event.record()
        else:
            self.t = time.perf_counter()

    def us_to(self, later: "Stamp") -> float:
        """Microseconds from this stamp to ``later`` (synchronise before reading CUDA stamps)."""
        if self.cuda:
            return self.event.elapsed_time(later.event) * 1e3
        return (later.t - self.t) * 1e6


class CapturedGraph:
    """``calls`` calls of fn over the rotating argument sets, captured once in a CUDA graph.

    fn is warmed up on a side stream first (workspaces, lazy initialisation, JIT), as
    capture requires; ``outputs`` holds each captured call's result. CUDA only.
    """

    def __init__(self, fn: Callable, arg_sets: Sequence[tuple], calls: int, warmup: int = 3):
        self.calls = calls
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for i in range(max(warmup, 1)):
                fn(*arg_sets[i % len(arg_sets)])
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.outputs = [fn(*arg_sets[i % len(arg_sets)]) for i in range(calls)]
        torch.cuda.synchronize()

    def replay(self) -> None:
        self.graph.replay()


def time_graph(graph: CapturedGraph, *, warmup: int, reps: int, flush: Optional[Callable[[], None]] = None,
               before_replay: Optional[Callable[[int], None]] = None) -> List[float]:
    """Microseconds per call (replay time / calls in the graph), one sample per replay.

    before_replay(i) runs before warm-up and timed replays alike, outside the timed region.
    """
    for i in range(warmup):
        if before_replay is not None:
            before_replay(i)
        graph.replay()
    per_replay = time_calls(graph.replay, warmup=0, reps=reps, flush=flush, before_call=before_replay,
                            device=torch.device("cuda", torch.cuda.current_device()))
    return [t / graph.calls for t in per_replay]


def time_interleaved(timers: Dict[str, Callable[[], float]], *, rounds: int,
                     progress: Optional[Callable[[int, int], None]] = None) -> Dict[str, List[float]]:
    """One sample per method per round, the methods taking turns: {name: [``rounds`` samples]}.

    timers: {name: a callable that times one short block of that method and returns its figure, e.g.
    ``lambda: statistics.median(time_graph(g, warmup=1, reps=5, flush=flush))``}. Timing each method as one long
    block lets the machine's drift between blocks (clocks, temperature: 2-5% on the lent H100s, v126) pass for a
    difference between methods; taking turns puts every method under the same drift, and the order reverses each
    round (A B C, C B A, ...) so that no method always runs first or right after another. Compare two methods with
    :func:`paired_ratio`, round by round. progress(round, rounds): called after each round.
    """
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    if not timers:
        raise ValueError("timers must name at least one method")
    names = list(timers)
    out = {name: [] for name in names}
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            out[name].append(float(timers[name]()))
        if progress is not None:
            progress(r + 1, rounds)
    return out


def paired_ratio(on: Sequence[float], off: Sequence[float]) -> dict:
    """``on`` over ``off`` round by round (samples of :func:`time_interleaved`, the same rounds): the median ratio,
    its 10th and 90th percentiles, the rounds where ``on`` was faster, and the rounds compared. A ratio of medians
    would let a round-to-round drift in; the ratio within a round does not."""
    if len(on) != len(off) or not on:
        raise ValueError(f"paired_ratio wants two equally long, non-empty sample lists, got {len(on)} and {len(off)}")
    ratios = sorted(a / b for a, b in zip(on, off))
    return dict(median=statistics.median(ratios), p10=nearest_rank(ratios, 0.1), p90=nearest_rank(ratios, 0.9),
                faster=sum(r < 1.0 for r in ratios), rounds=len(ratios))


def nearest_rank(sorted_xs: Sequence[float], q: float) -> float:
    """The q-quantile (0 <= q <= 1) of a sorted, non-empty sequence by nearest rank: no interpolation, so it is one
    of the samples (the convention of every percentile the benchmarks report)."""
    n = len(sorted_xs)
    return sorted_xs[min(n - 1, max(0, int(round(q * (n - 1)))))]


__all__ = ["CapturedGraph", "L2Flusher", "Stamp", "default_device", "median_us", "nearest_rank", "paired_ratio",
           "synchronize", "time_calls", "time_graph", "time_interleaved"]
