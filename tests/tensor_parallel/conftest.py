"""Fixtures for the tensor-parallel tests.

Multi-rank tests take the session fixture ``dist_ctx``; it initialises torch.distributed
(gloo on CPU, NCCL on GPUs) through ``fsdist.distributed`` when the session runs under

* ``mpirun -n N python -m pytest --with-mpi tests/tensor_parallel`` (pytest-mpi), or
* ``launch/torchrun.sh N -m pytest tests/tensor_parallel`` / ``launch/mpirun.sh N -m pytest ...``
  (the launch scripts export RANK / WORLD_SIZE like torchrun),

and skips otherwise, so a plain single-process ``python -m pytest tests`` neither hangs
nor errors. The skip decision depends only on the launch, never on the rank, so ranks
never disagree about which tests run (a disagreement would hang a collective).

Hard timeout: in a multi-rank session every test runs under a watchdog
(``faulthandler.dump_traceback_later``) that prints every thread's stack to the real
stderr and kills the process once the test has run for ``FSDIST_TEST_HARD_TIMEOUT``
seconds (default 240: longer than the slowest test, shorter than the gloo timeout
``FSDIST_TEST_TIMEOUT``, 300). A rank stuck in a collective that a peer skipped then fails
its test with a traceback that shows where it waits, instead of stalling CI; mpirun
sees the exit and takes the other ranks down. ``FSDIST_TEST_HARD_TIMEOUT=0`` turns it off.
"""
import faulthandler
import os
import sys
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


def multi_rank_session(config) -> bool:
    return with_mpi(config) or launched_multi_rank()


def hard_timeout_s() -> float:
    return float(os.environ.get("FSDIST_TEST_HARD_TIMEOUT", "240"))


@pytest.fixture(scope="session")
def _watchdog_stream(request):
    """A duplicate of the real stderr, taken with pytest's capture suspended: the watchdog's
    traceback must not go to a capture file that nobody reads once the process is killed."""
    capman = request.config.pluginmanager.getplugin("capturemanager")
    if capman is not None:
        with capman.global_and_fixture_disabled():
            sys.stderr.flush()
            fd = os.dup(2)
    else:
        fd = os.dup(2)
    stream = os.fdopen(fd, "w")
    yield stream
    stream.close()


@pytest.fixture(autouse=True)
def hard_timeout(request):
    """Kill a multi-rank test (with every thread's traceback) that runs past FSDIST_TEST_HARD_TIMEOUT."""
    seconds = hard_timeout_s()
    if not (multi_rank_session(request.config) and seconds > 0):
        yield
        return
    stream = request.getfixturevalue("_watchdog_stream")
    faulthandler.dump_traceback_later(seconds, exit=True, file=stream)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


@pytest.fixture(scope="session")
def dist_ctx(request):
    if not multi_rank_session(request.config):
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
