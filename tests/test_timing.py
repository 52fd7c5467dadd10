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
