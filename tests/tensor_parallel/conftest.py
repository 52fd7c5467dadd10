"""Fixtures for the tensor-parallel tests.

Multi-rank tests take the session fixture ``dist_ctx``; it initialises torch.distributed
(gloo on CPU, NCCL on GPUs) through ``fsdist.distributed`` when the session runs under

* ``mpirun -n N python -m pytest --with-mpi tests/tensor_parallel`` (pytest-mpi), or
* ``launch/torchrun.sh N -m pytest tests/tensor_parallel`` / ``launch/mpirun.sh N -m pytest ...``
  (the launch scripts export RANK / WORLD_SIZE like torchrun),

and skips otherwise, so a plain single-process ``python -m pytest tests`` neither hangs
nor errors. The skip decision depends only on the launch, never on the rank, so ranks
never disagree about which tests run (a disagreement would hang a collective).
"""
import os
from datetime import timedelta

import pytest
import torch

ON_GPU = torch.cuda.is_available()


def launched_multi_rank() -> bool:
    """Started by torchrun or fsdist's launch scripts with more than one rank."""
    return "RANK" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1


def with_mpi(config) -> bool:
    try:
        return bool(config.getoption("with_mpi"))
    except ValueError:  # pytest-mpi not installed
        return False


@pytest.fixture(scope="session")
def dist_ctx(request):
    if not (with_mpi(request.config) or launched_multi_rank()):
        pytest.skip("multi-rank test: run `mpirun -n 2 python -m pytest --with-mpi tests/tensor_parallel` "
                    "or `launch/torchrun.sh 2 -m pytest tests/tensor_parallel`")
    from fsdist import distributed as fsd

    # A generous timeout turns a lost rank into an error instead of a hang.
    timeout = timedelta(seconds=int(os.environ.get("FSDIST_TEST_TIMEOUT", "300")))
    ctx = fsd.init_distributed(timeout=timeout)
    if ctx.world_size < 2:
        fsd.shutdown()
        pytest.skip("needs at least 2 ranks")
    yield ctx
    fsd.shutdown()


@pytest.fixture
def tp_device(dist_ctx):
    return dist_ctx.device
