"""Transports for the tensor-parallel candidate exchange, and how one is chosen.

=============  ==========================================================  ===========
name           how                                                         where
=============  ==========================================================  ===========
``nvshmem``    nvshmem4py symmetric tensors, kernel stores into peers      GPUs, 1 host
``symm_mem``   torch.distributed._symmetric_memory, same kernel path       GPUs, 1 host
``collective`` private buffers + all-gather (gloo, NCCL, ...)              anywhere
``shm``        host shared memory, kernel stores into peers (interpreter)  CPU tests
``auto``       nvshmem if every rank can use it, else symm_mem or          -
               collective (see :func:`decide`)
=============  ==========================================================  ===========

TP groups inside a larger job (DP x TP, e.g. 8 GPUs as TP=4 x DP=2): NVSHMEM's
allocations and ``barrier_all`` span every PE of the job, so ``nvshmem`` needs the TP group
to be the whole job. For a sub-group, a request for ``nvshmem`` (or ``auto``) becomes
``symm_mem`` when every rank of the group can use it (one ``fsdist`` log line says why),
else ``collective``.

Choosing is a two-step affair so that ranks never disagree: :func:`probe` looks at
this process only (no communication); the head all-gathers every rank's probe with
its config check, and :func:`resolve` turns the gathered list into one decision that
every rank computes identically. Only then is a transport constructed (its
allocations are collective, so a rank that could not build it must not be left
waiting for the others).
"""
import importlib
import logging
import socket
from typing import List, Tuple

import torch
import torch.distributed as dist

from .base import SymmetricBuffer, Transport

log = logging.getLogger("fsdist")

TRANSPORTS = ("auto", "nvshmem", "symm_mem", "collective", "shm")


def check_transport_name(name) -> str:
    if not isinstance(name, str):
        raise TypeError(f"transport must be a str, got {type(name).__name__}")
    if name not in TRANSPORTS:
        raise ValueError(f"unknown transport {name!r}; choose one of {', '.join(TRANSPORTS)}")
    return name


def _peer_access_ok(device: torch.device) -> Tuple[bool, str]:
    n = torch.cuda.device_count()
    me = device.index if device.index is not None else torch.cuda.current_device()
    if n < 2:
        return False, "only one GPU is visible to this process, peer access cannot be verified"
    bad = [j for j in range(n) if j != me and not torch.cuda.can_device_access_peer(me, j)]
    if bad:
        return False, f"GPU {me} has no peer access to GPU(s) {bad}"
    return True, ""


def probe(name: str, device: torch.device) -> dict:
    """What this process can do for transport `name` (no communication).

    Returns {"ok": bool, "why": str} plus, for "nvshmem" and "auto", the facts decide() needs
    ("symm_mem": whether symm_mem would work here, the fallback for TP sub-groups).
    """
    from ... import nvshmem_runtime
    from ...runtime import interpreting

    name = check_transport_name(name)
    device = torch.device(device)
    cuda = device.type == "cuda"
    if name == "collective":
        return {"ok": True, "why": ""}
    if name == "shm":
        ok = device.type == "cpu" and interpreting()
        return {"ok": ok, "why": "" if ok else "shm needs CPU tensors under TRITON_INTERPRET=1"}
    if name == "symm_mem":
        if not cuda:
            return {"ok": False, "why": f"symm_mem needs CUDA tensors (device is {device})"}
        try:
            importlib.import_module("torch.distributed._symmetric_memory")
        except Exception as e:
            return {"ok": False, "why": f"torch.distributed._symmetric_memory is unavailable: {e}"}
        return {"ok": True, "why": ""}
    symm = cuda and probe("symm_mem", device)["ok"]
    if name == "nvshmem":
        if not cuda:
            return {"ok": False, "why": f"nvshmem needs CUDA tensors (device is {device})", "symm_mem": False}
        if not nvshmem_runtime.importable():
            return {"ok": False, "why": "nvshmem4py is not importable (pip install nvshmem4py-cu13)", "symm_mem": symm}
        return {"ok": True, "why": "", "symm_mem": symm}
    # auto
    facts = {"ok": True, "why": "", "cuda": cuda, "host": socket.gethostname(), "nvshmem": False, "peer": False,
             "peer_why": "", "symm_mem": symm}
    if cuda:
        facts["nvshmem"] = nvshmem_runtime.importable()
        facts["peer"], facts["peer_why"] = _peer_access_ok(device)
    return facts


def _sub_group_fallback(probes: List[dict], group_size: int, world_size: int) -> Tuple[str, str]:
    why = (f"the tensor-parallel group ({group_size} ranks) is not the whole job ({world_size} ranks) and NVSHMEM's "
           "allocations and barrier_all span every PE")
    if all(p.get("symm_mem") for p in probes):
        return "symm_mem", why + "; symm_mem works on sub-groups"
    return "collective", why + "; symm_mem is unavailable on some rank"


def decide(name: str, probes: List[dict], group_size: int, world_size: int) -> Tuple[str, str]:
    """The transport, and why, from every rank's probe and the group and world sizes.

    A pure function (no communication), so every rank of the group decides the same. Raises
    ValueError if a requested transport is unavailable on some rank. ``nvshmem`` in a TP
    group smaller than the job falls back (see the module docstring)."""
    bad = [(r, p["why"]) for r, p in enumerate(probes) if not p["ok"]]
    if bad:
        raise ValueError(f"transport {name!r} is unavailable on rank(s) "
                         + "; ".join(f"{r}: {why}" for r, why in bad)
                         + " (transport='auto' picks what every rank has; 'collective' runs anywhere)")
    sub_group = group_size != world_size
    if name == "nvshmem" and sub_group:
        return _sub_group_fallback(probes, group_size, world_size)
    if name != "auto":
        return name, "requested"
    if not all(p["cuda"] for p in probes):
        return "collective", "not every rank is on a CUDA device"
    if len({p["host"] for p in probes}) > 1:
        return "collective", "ranks span several hosts"
    no_peer = [(r, p["peer_why"]) for r, p in enumerate(probes) if not p["peer"]]
    if no_peer:
        return "collective", "no GPU peer access: " + "; ".join(f"rank {r}: {w}" for r, w in no_peer)
    if sub_group:
        return _sub_group_fallback(probes, group_size, world_size)
    if not all(p["nvshmem"] for p in probes):
        return "collective", "nvshmem4py is not importable on every rank"
    return "nvshmem", "CUDA, nvshmem4py and GPU peer access on every rank of one host"


def resolve(name: str, probes: List[dict], group) -> Tuple[str, str]:
    """One transport name from every rank's probe; identical on every rank. Raises if unusable."""
    return decide(name, probes, dist.get_world_size(group), dist.get_world_size())


def make_transport(name: str, group, device: torch.device) -> Transport:
    """Construct a resolved (non-"auto") transport. Collective when it allocates: call on every rank."""
    name = check_transport_name(name)
    if name == "auto":
        raise ValueError("resolve 'auto' first (fsdist.tensor_parallel.transports.resolve)")
    if name == "collective":
        from .collective import CollectiveTransport as cls
    elif name == "shm":
        from .shm import ShmTransport as cls
    elif name == "nvshmem":
        from .nvshmem import NvshmemTransport as cls
    else:
        from .symm_mem import SymmMemTransport as cls
    return cls(group, device)


__all__ = ["TRANSPORTS", "Transport", "SymmetricBuffer", "check_transport_name", "probe", "decide", "resolve",
           "make_transport"]
