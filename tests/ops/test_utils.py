"""Host helpers of fsdist/ops/utils.py."""
import torch
import triton

from fsdist.ops import utils
from fsdist.ops.utils import cdiv, next_pow2


def test_host_integer_helpers_equal_tritons():
    """cdiv / next_pow2 (host code calls them instead of triton.cdiv / triton.next_power_of_2, constexpr functions
    that cost ~2-3 µs a host call in Triton 3.6) give Triton's results, zero and negative arguments included."""
    values = list(range(-70, 300)) + [2**k + d for k in range(4, 40) for d in (-1, 0, 1)]
    for n in values:
        assert next_pow2(n) == triton.next_power_of_2(n), n
        for b in (1, 2, 3, 16, 100, 128, 512):
            assert cdiv(n, b) == triton.cdiv(n, b), (n, b)


def test_device_capability_is_asked_once_per_device_and_query(monkeypatch):
    """The capability cache (a sample call asks several times a call): one query per device index, and a stand-in
    installed in torch.cuda.get_device_capability's place (as the PDL tests do) is asked anew, not served the
    answer cached for the function before it."""
    asked = []

    def h200(index=None):
        asked.append(index)
        return (9, 0)

    monkeypatch.setattr(torch.cuda, "get_device_capability", h200)
    assert utils.device_capability(torch.device("cuda", 0)) == (9, 0)
    assert utils.device_capability(0) == (9, 0) and utils.device_capability(torch.device("cuda", 0)) == (9, 0)
    assert asked == [0]
    assert utils.device_capability(torch.device("cuda", 1)) == (9, 0) and asked == [0, 1]
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (8, 0))
    assert utils.device_capability(torch.device("cuda", 0)) == (8, 0)


def test_pdl_supported_follows_every_switch_between_calls(monkeypatch):
    """pdl_supported's cached pieces (the capability, the parsed CUDA version) still follow a changed torch.version,
    capability or TRITON_INTERPRET from one call to the next; pdl_args does not ask the device when no switch is
    asked (all off whatever it would say)."""
    dev = torch.device("cuda", 0)
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (9, 0))
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert utils.pdl_supported(dev)
    monkeypatch.setattr(torch.version, "cuda", "12.2")
    assert not utils.pdl_supported(dev)
    monkeypatch.setattr(torch.version, "cuda", "12.10")
    assert utils.pdl_supported(dev)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not utils.pdl_supported(dev)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (8, 0))
    assert not utils.pdl_supported(dev)

    def refuse(index=None):
        raise AssertionError("asked the device")

    monkeypatch.setattr(torch.cuda, "get_device_capability", refuse)
    assert utils.pdl_args(dev) == dict(PDL_WAIT=False, TRIGGER=False)
    assert utils.pdl_args(dev, late=False) == dict(PDL_WAIT=False, TRIGGER=False)
