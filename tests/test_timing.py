"""fsdist.timing: call order, hooks and argument rotation (host clock on a CPU machine)."""
import time

import pytest
import torch

from fsdist import timing


def test_time_calls_warms_up_rotates_and_hooks():
    calls, hooks = [], []
    samples = timing.time_calls(lambda x: calls.append(x), [(0,), (1,), (2,)], warmup=2, reps=5,
                                before_call=hooks.append, device=torch.device("cpu"))
    assert len(samples) == 5 and all(s >= 0 for s in samples)
    # warm-up uses sets 0, 1; timed call i uses set i % 3 (the count restarts after warm-up)
    assert calls == [0, 1, 0, 1, 2, 0, 1]
    assert hooks == [0, 1, 2, 3, 4]


def test_host_clock_measures_the_call():
    samples = timing.time_calls(lambda: time.sleep(0.01), warmup=0, reps=3, device=torch.device("cpu"))
    assert all(9_000 <= s < 1_000_000 for s in samples), samples


def test_median_us_is_the_median():
    delays = iter([0.0, 0.05, 0.0, 0.01])  # the first is the warm-up call
    med = timing.median_us(lambda: time.sleep(next(delays)), warmup=1, reps=3, device=torch.device("cpu"))
    assert 9_000 <= med < 50_000, med  # the 10 ms call, not the 0 or 50 ms one


def test_flusher_and_stamp_on_cpu():
    flush = timing.L2Flusher(torch.device("cpu"))
    flush()  # a no-op without a GPU
    assert flush.buf is None
    a = timing.Stamp(torch.device("cpu"))
    time.sleep(0.005)
    b = timing.Stamp(torch.device("cpu"))
    assert 4_000 <= a.us_to(b) < 1_000_000


def test_bad_arguments():
    with pytest.raises(ValueError):
        timing.time_calls(lambda: None, reps=0, device=torch.device("cpu"))
    with pytest.raises(ValueError):
        timing.time_calls(lambda: None, [], reps=1, device=torch.device("cpu"))


@pytest.mark.gpu
def test_events_time_device_work():
    dev = torch.device("cuda")
    x = torch.randn(4096, 4096, device=dev)
    flush = timing.L2Flusher(dev)
    samples = timing.time_calls(lambda: x @ x, warmup=2, reps=5, flush=flush, device=dev)
    assert len(samples) == 5 and all(s > 0 for s in samples)


def test_interleaved_methods_take_turns_and_reverse_each_round():
    calls, seen = [], []
    timers = {name: (lambda name=name: calls.append(name) or 1.0) for name in "ABC"}
    out = timing.time_interleaved(timers, rounds=3, progress=lambda r, n: seen.append((r, n)))
    assert calls == list("ABCCBAABC")
    assert out == {name: [1.0, 1.0, 1.0] for name in "ABC"}
    assert seen == [(1, 3), (2, 3), (3, 3)]


class _DriftingMachine:
    """A machine that slows down 0.5% with every block it times (a warming GPU): a method's figure is its true cost
    times the machine's slowdown at that moment."""

    def __init__(self):
        self.blocks = 0

    def timer(self, cost):
        def run():
            self.blocks += 1
            return cost * (1.0 + 0.005 * self.blocks)
        return run


def test_interleaving_cancels_a_drift_that_blocks_would_report():
    # Two identical methods: timed as two blocks (all A, then all B) the drift passes for a 10% difference;
    # interleaved and compared round by round, they come out level.
    m = _DriftingMachine()
    a_block = [m.timer(100.0)() for _ in range(20)]
    b_block = [m.timer(100.0)() for _ in range(20)]
    assert timing.paired_ratio(b_block, a_block)["median"] > 1.09  # the problem (and this test's power)
    m = _DriftingMachine()
    out = timing.time_interleaved({"A": m.timer(100.0), "B": m.timer(100.0)}, rounds=20)
    r = timing.paired_ratio(out["B"], out["A"])
    assert abs(r["median"] - 1.0) < 0.003, r
    # A true 3% difference under the same drift is found, in every round.
    m = _DriftingMachine()
    out = timing.time_interleaved({"A": m.timer(100.0), "B": m.timer(103.0)}, rounds=20)
    r = timing.paired_ratio(out["B"], out["A"])
    assert abs(r["median"] - 1.03) < 0.004 and r["faster"] == 0 and r["rounds"] == 20, r


def test_paired_ratio_summary():
    r = timing.paired_ratio([90.0, 100.0, 110.0, 120.0, 95.0], [100.0] * 5)
    assert r == dict(median=1.0, p10=0.9, p90=1.2, faster=2, rounds=5)
    with pytest.raises(ValueError, match="equally long"):
        timing.paired_ratio([1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="equally long"):
        timing.paired_ratio([], [])
    with pytest.raises(ValueError, match="rounds"):
        timing.time_interleaved({"A": lambda: 1.0}, rounds=0)
    with pytest.raises(ValueError, match="at least one"):
        timing.time_interleaved({}, rounds=2)


def test_nearest_rank_is_a_sample():
    xs = [1.0, 2.0, 3.0, 4.0, 5.0]
    assert [timing.nearest_rank(xs, q) for q in (0.0, 0.1, 0.5, 0.9, 1.0)] == [1.0, 1.0, 3.0, 5.0, 5.0]
    assert timing.nearest_rank([7.0], 0.9) == 7.0
