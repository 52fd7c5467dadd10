"""Transports for the tensor-parallel candidate exchange, and how one is chosen.

=============  ==========================================================  ===========
name           how                                                         where
=============  ==========================================================  ===========
``nvshmem``    nvshmem4py symmetric tensors, kernel stores into peers      GPUs, 1 host
``symm_mem``   torch.distributed._symmetric_memory, same kernel path       GPUs, 1 host
``collective`` private buffers + all-gather (gloo, NCCL, ...)              anywhere
``shm``        host shared memory, kernel stores into peers (interpreter)  CPU tests
``auto``       nvshmem if every rank can use it, else collective           -
=============  ==========================================================  ===========

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

    Returns {"ok": bool, "why": str} plus, for "auto", the facts resolve() needs.
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
    if name == "nvshmem":
        if not cuda:
            return {"ok": False, "why": f"nvshmem needs CUDA tensors (device is {device})"}
        if not nvshmem_runtime.importable():
            return {"ok": False, "why": "nvshmem4py is not importable (pip install nvshmem4py-cu13)"}
        return {"ok": True, "why": ""}
    # auto
    facts = {"ok": True, "why": "", "cuda": cuda, "host": socket.gethostname(), "nvshmem": False, "peer": False,
             "peer_why": ""}
    if cuda:
        facts["nvshmem"] = nvshmem_runtime.importable()
        facts["peer"], facts["peer_why"] = _peer_access_ok(device)
    return facts


def resolve(name: str, probes: List[dict], group) -> Tuple[str, str]:
    """One transport name from every rank's probe; identical on every rank. Raises if unusable."""
    bad = [(r, p["why"]) for r, p in enumerate(probes) if not p["ok"]]
    if bad:
        raise ValueError(f"transport {name!r} is unavailable on rank(s) "
                         + "; ".join(f"{r}: {why}" for r, why in bad))
    if name != "auto":
        return name, "requested"
    if not all(p["cuda"] for p in probes):
        return "collective", "not every rank is on a CUDA device"
    if len({p["host"] for p in probes}) > 1:
        return "collective", "ranks span several hosts"
    if not all(p["nvshmem"] for p in probes):
        return "collective", "nvshmem4py is not importable on every rank"
    no_peer = [(r, p["peer_why"]) for r, p in enumerate(probes) if not p["peer"]]
    if no_peer:
        return "collective", "no GPU peer access: " + "; ".join(f"rank {r}: {w}" for r, w in no_peer)
    if dist.get_world_size(group) != dist.get_world_size():
        return "collective", "the tensor-parallel group is not the whole job (nvshmem needs that)"
    return "nvshmem", "CUDA, nvshmem4py and GPU peer access on every rank of one host"


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


__all__ = ["TRANSPORTS", "Transport", "SymmetricBuffer", "check_transport_name", "probe", "resolve",
           "make_transport"]
