"""StepMonitor: the host learns the device status word without synchronising, and never
touches an event while a CUDA graph is being captured (the GPU run of 2026-11-23 found
``Event.query`` inside ``forward`` invalidating every capture of the head)."""
import torch

from fsdist.tensor_parallel.health import StepMonitor


class FakeEvent:
    """Stands in for torch.cuda.Event: query() is illegal while 'capturing', like CUDA's."""

    def __init__(self, capturing):
        self.capturing = capturing
        self.queries = 0

    def query(self):
        if self.capturing[0]:
            raise RuntimeError("operation not permitted when stream is capturing")
        self.queries += 1
        return True


def _monitor_with_pending_copy(capturing, word=4):
    m = StepMonitor(torch.device("cpu"), where="rank 0 of 2")
    m._cuda = True  # take the GPU branch with CPU stand-ins
    m._slots = torch.tensor([word, 0], dtype=torch.int32)
    ev = FakeEvent(capturing)
    m._events = [ev, None]
    m._next = 1  # copy 0 is the older one
    return m, ev


def test_poll_looks_at_no_event_while_capturing(monkeypatch):
    capturing = [True]
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    m, ev = _monitor_with_pending_copy(capturing)
    assert m.poll() == 0 and ev.queries == 0  # nothing looked at, nothing lost
    capturing[0] = False
    assert m.poll() == 4 and ev.queries == 1  # the next eager call folds the copy in
    assert m._events == [None, None]


def test_poll_folds_landed_copies_when_not_capturing(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    m, ev = _monitor_with_pending_copy([False], word=2)
    assert m.poll() == 2 and ev.queries == 1
