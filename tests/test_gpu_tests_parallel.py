"""scripts/gpu_tests_parallel.sh's GPU memory summary, on CPU: a stand-in nvidia-smi on PATH answers the memory query
with three samples and then waits, as `nvidia-smi -l` does, until the script stops it after the groups."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_tests_parallel.sh"
GROUP = f"{ROOT / 'tests' / 'test_instant_failures.py'} -k fails_on_purpose"
SAMPLES = ["2026/12/08 01:00:00.000, 0, 1200, 81559",
           "2026/12/08 01:00:02.000, 0, 64000, 81559",  # the peak, in the middle: not the last sample
           "2026/12/08 01:00:04.000, 0, 3000, 81559"]


def _env(tmp_path, pack="1"):
    """The environment with the stand-in first on PATH; it writes its pid to tmp_path / "sampler.pid"."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nvidia-smi"
    lines = "".join(f"'{s}' " for s in SAMPLES)
    fake.write_text("#!/bin/sh\ncase \"$*\" in\n"
                    f"  *memory.used*) echo $$ > {tmp_path / 'sampler.pid'}; printf '%s\\n' {lines}; exec sleep 600;;\n"
                    "  *) echo 'Stand-in GPU, 0.0';;\nesac\n")
    fake.chmod(0o755)
    path = os.pathsep.join([str(bin_dir), os.path.dirname(sys.executable), os.environ["PATH"]])
    return dict(os.environ, PATH=path, OUT=str(tmp_path / "out"),
                TESTS_TIMEOUT="120", GPU_TESTS_PACK=pack)


def _run(tmp_path, *groups, pack="1"):
    done = subprocess.run(["bash", str(SCRIPT), *groups], env=_env(tmp_path, pack), capture_output=True, text=True,
                          timeout=240, cwd=ROOT)
    return done, tmp_path / "out"


def test_the_peak_of_the_memory_samples_is_printed_and_the_samples_removed(tmp_path):
    done, out = _run(tmp_path, GROUP)
    assert done.returncode == 0, done.stdout + done.stderr
    assert ("GPU memory used, peak of 3 samples (a GPU a line, every 2 s: a lower bound): 64000 of 81559 MiB "
            "(GPU 0, 2026/12/08 01:00:02.000)") in done.stdout
    assert not (out / "gpu_tests_memory.csv").exists()  # one file fewer for the device tool


def test_a_caller_that_packs_keeps_the_samples(tmp_path):
    done, out = _run(tmp_path, GROUP, pack="0")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (out / "gpu_tests_memory.csv").read_text().splitlines() == SAMPLES


def _alive(pid):
    """Running: a zombie (dead, not yet reaped by whatever adopted it) does not count."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def test_the_sampler_stops_when_the_script_is_terminated(tmp_path):
    """A caller's timeout sends TERM while the groups run: the sampler goes with the script, not on writing."""
    proc = subprocess.Popen(["bash", str(SCRIPT), GROUP], env=_env(tmp_path), cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    pid_file = tmp_path / "sampler.pid"
    deadline = time.monotonic() + 60
    while not (pid_file.exists() and pid_file.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        sampler = int(pid_file.read_text())
        time.sleep(0.5)  # (the traps are set before the sampler starts; this only lets the groups start too)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 143
    finally:
        proc.kill()
    for _ in range(100):
        if not _alive(sampler):
            return
        time.sleep(0.05)
    os.kill(sampler, signal.SIGKILL)
    raise AssertionError("the memory sampler outlived the script")
