"""The environment switches that keep NVLink multicast (NVLS) off, in one place.

NVLink multicast can take a shared host's GPUs down, so NCCL, torch's symmetric
memory and NVSHMEM must never use it. Every fsdist entry point that may start one of
them (``fsdist.distributed``, the tensor-parallel head, the bench scripts) calls
:func:`apply_safe_env` first; the shell launchers in ``launch/`` export the same
values. The variables are read when a communicator or symmetric heap is created, not
when torch is imported, so calling this any time before that is enough.

This module imports nothing but the standard library.
"""
import logging
import os
from typing import MutableMapping, Optional

log = logging.getLogger("fsdist")

SAFE_ENV = {"NVSHMEM_DISABLE_NVLS": "1", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NCCL_NVLS_ENABLE": "0"}


def apply_safe_env(environ: Optional[MutableMapping[str, str]] = None) -> None:
    """Force the no-multicast switches into ``environ`` (default ``os.environ``); idempotent.

    A value the environment already set to something else is overridden, with a warning:
    multicast stays off whatever the caller asked for.
    """
    environ = os.environ if environ is None else environ
    for key, value in SAFE_ENV.items():
        old = environ.get(key)
        if old is not None and old != value:
            log.warning("fsdist: overriding %s=%s with %s (NVLink multicast stays off)", key, old, value)
        environ[key] = value


__all__ = ["SAFE_ENV", "apply_safe_env"]
