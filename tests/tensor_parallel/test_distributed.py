"""fsdist.distributed's launcher detection, and the launch scripts end to end (CPU, gloo).

The end-to-end runs start their own mpirun / torchrun, so they only run in a plain
single-process session (not inside an MPI or torchrun launch).
"""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import launched_multi_rank, with_mpi
from fsdist.distributed import SAFE_ENV, apply_safe_env, detect_launch

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("env,expected", [
    ({}, (0, 1, 0, 1, "single")),
    ({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}, (3, 8, 1, 2, "torchrun")),
    ({"RANK": "1", "WORLD_SIZE": "2"}, (1, 2, 1, 2, "torchrun")),
    ({"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "6", "OMPI_COMM_WORLD_LOCAL_RANK": "2",
      "OMPI_COMM_WORLD_LOCAL_SIZE": "3"}, (5, 6, 2, 3, "openmpi")),
    ({"PMI_RANK": "1", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "4"}, (1, 4, 1, 4, "mpich")),
    ({"SLURM_PROCID": "7", "SLURM_NTASKS": "8", "SLURM_LOCALID": "3", "SLURM_NTASKS_PER_NODE": "4(x2)"},
     (7, 8, 3, 4, "slurm")),
    # torchrun-style variables win (fsdist's mpirun.sh exports them on top of MPI's)
    ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "PMI_RANK": "0", "PMI_SIZE": "2"}, (0, 2, 0, 2, "torchrun")),
])
def test_detect_launch(env, expected):
    info = detect_launch(env)
    assert (info.rank, info.world_size, info.local_rank, info.local_world_size, info.launcher) == expected


@pytest.mark.parametrize("env", [{"RANK": "2", "WORLD_SIZE": "2"}, {"PMI_RANK": "x", "PMI_SIZE": "2"}])
def test_detect_launch_rejects_inconsistent_env(env):
    with pytest.raises(RuntimeError):
        detect_launch(env)


def test_safe_env_is_forced():
    env = {"NCCL_NVLS_ENABLE": "1"}
    apply_safe_env(env)
    assert env == SAFE_ENV
    assert all(os.environ[k] == v for k, v in SAFE_ENV.items())  # importing fsdist.distributed set them


@pytest.fixture
def outside_launch(request):
    if with_mpi(request.config) or launched_multi_rank():
        pytest.skip("starts its own launcher; run it from a plain single-process session")


def _shm_segments():
    return {p.name for p in Path("/dev/shm").glob("fsdist_*")} if Path("/dev/shm").is_dir() else set()


def _orphaned(names):
    """Segments (named fsdist_<owner pid>_<hex>) whose owner has exited. Segments of live
    processes belong to another session running side by side and are not ours to judge."""
    orphans = set()
    for name in names:
        try:
            pid = int(name.split("_")[1])
            os.kill(pid, 0)
        except ProcessLookupError:
            orphans.add(name)
        except (ValueError, IndexError, PermissionError):
            continue
    return orphans


@pytest.mark.parametrize("launcher,tool,extra", [
    ("mpirun.sh", "mpirun", []),
    ("torchrun.sh", None, ["--reduction", "group_logmass", "--transport", "shm"]),
    ("mpirun.sh", "mpirun", ["--transport", "shm", "--no-close"]),  # segments unlinked at exit anyway
])
def test_launch_script_runs_two_ranks(outside_launch, launcher, tool, extra):
    if tool and shutil.which(tool) is None:
        pytest.skip(f"{tool} is not installed")
    if "shm" in extra and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        pytest.skip("the shm transport needs the interpreter (CPU)")
    env = dict(os.environ, PYTHON=sys.executable)
    env.pop("MASTER_PORT", None)
    before = _shm_segments()
    proc = subprocess.run(["bash", str(ROOT / "launch" / launcher), "2", str(ROOT / "launch" / "smoke_test.py"),
                           *extra], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    # ranks share the pipe, so lines may interleave: look for the markers, not for lines
    ranks = re.findall(r"OK rank (\d+)/2 ", proc.stdout)
    assert proc.returncode == 0 and sorted(ranks) == ["0", "1"], proc.stdout[-3000:] + proc.stderr[-3000:]
    assert not _orphaned(_shm_segments() - before), "shared-memory segments left behind"
    assert "leaked shared_memory" not in proc.stderr


def test_launch_script_usage_errors():
    for launcher in ("mpirun.sh", "torchrun.sh"):
        proc = subprocess.run(["bash", str(ROOT / "launch" / launcher), "x", "a.py"], capture_output=True, text=True,
                              timeout=30)
        assert proc.returncode == 2 and "positive integer" in proc.stderr
        proc = subprocess.run(["bash", str(ROOT / "launch" / launcher)], capture_output=True, text=True, timeout=30)
        assert proc.returncode == 2 and "usage" in proc.stderr


def test_single_process_without_launcher(outside_launch):
    """No launcher at all: a one-rank group, and the head still equals fsdist.sample."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "OMPI_", "SLURM_", "MPI_LOCAL")) and k not in ("RANK", "WORLD_SIZE",
                                                                                       "MASTER_ADDR", "MASTER_PORT")}
    proc = subprocess.run([sys.executable, str(ROOT / "launch" / "smoke_test.py"), "--transport", "collective"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0 and "OK rank 0/1 " in proc.stdout and "launcher single" in proc.stdout, \
        proc.stdout[-2000:] + proc.stderr[-2000:]
