"""How a transport is chosen (fsdist.tensor_parallel.transports.decide): a pure function of
every rank's probe and the group and world sizes, so it runs without torch.distributed.

The case that matters for real jobs is DP x TP (e.g. 8 GPUs as TP=4 x DP=2): NVSHMEM spans the
whole job, so a TP sub-group asking for ``nvshmem`` (or ``auto``) gets ``symm_mem`` when every
rank can use it, else ``collective``, with the reason. The multi-rank side (TP groups of 2
inside a world of 4) is in test_layers.py (gloo) and test_gpu.py (GPUs).
"""
import pytest

from fsdist.tensor_parallel.transports import decide


def gpu_probe(nvshmem=True, symm_mem=True, peer=True, host="h0"):
    return {"ok": True, "why": "", "cuda": True, "host": host, "nvshmem": nvshmem, "peer": peer,
            "peer_why": "" if peer else "GPU 0 has no peer access to GPU(s) [1]", "symm_mem": symm_mem}


def nvshmem_probe(symm_mem=True):
    return {"ok": True, "why": "", "symm_mem": symm_mem}


def cpu_probe():
    return {"ok": True, "why": "", "cuda": False, "host": "h0", "nvshmem": False, "peer": False, "peer_why": "",
            "symm_mem": False}


def test_whole_job_keeps_nvshmem():
    assert decide("nvshmem", [nvshmem_probe()] * 4, 4, 4) == ("nvshmem", "requested")
    assert decide("auto", [gpu_probe()] * 4, 4, 4)[0] == "nvshmem"


@pytest.mark.parametrize("name,probe", [("nvshmem", nvshmem_probe), ("auto", gpu_probe)])
def test_tp_sub_group_falls_back_to_symm_mem_and_says_why(name, probe):
    got, why = decide(name, [probe()] * 2, 2, 4)
    assert got == "symm_mem"
    assert "tensor-parallel group (2 ranks) is not the whole job (4 ranks)" in why and "symm_mem" in why


@pytest.mark.parametrize("name,probe", [("nvshmem", nvshmem_probe), ("auto", gpu_probe)])
def test_tp_sub_group_without_symm_mem_falls_back_to_collective(name, probe):
    got, why = decide(name, [probe(), probe(symm_mem=False)], 2, 8)
    assert got == "collective" and "symm_mem is unavailable" in why


def test_auto_keeps_its_other_reasons():
    assert decide("auto", [cpu_probe()] * 2, 2, 4)[0] == "collective"  # CPU: gloo
    assert decide("auto", [gpu_probe(host="a"), gpu_probe(host="b")], 2, 4)[0] == "collective"
    assert decide("auto", [gpu_probe(), gpu_probe(peer=False)], 2, 4)[0] == "collective"
    assert decide("auto", [gpu_probe(nvshmem=False)] * 2, 2, 2) == (
        "collective", "nvshmem4py is not importable on every rank")
    # nvshmem4py missing does not matter in a sub-group: symm_mem needs no nvshmem4py
    assert decide("auto", [gpu_probe(nvshmem=False)] * 2, 2, 4)[0] == "symm_mem"


def test_unavailable_request_is_an_error_before_any_fallback():
    bad = {"ok": False, "why": "nvshmem needs CUDA tensors (device is cpu)", "symm_mem": False}
    with pytest.raises(ValueError, match=r"transport 'nvshmem' is unavailable on rank\(s\) 1: nvshmem needs CUDA.*"
                                         r"'collective' runs anywhere"):
        decide("nvshmem", [nvshmem_probe(), bad], 2, 4)


@pytest.mark.parametrize("name", ["symm_mem", "collective", "shm"])
def test_other_requests_are_kept_in_sub_groups(name):
    assert decide(name, [{"ok": True, "why": ""}] * 2, 2, 4) == (name, "requested")
