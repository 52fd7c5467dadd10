"""scripts/gpu_tests_parallel.sh's GPU memory summary, on CPU: a stand-in nvidia-smi on PATH answers the memory query
with three samples and then waits, as `nvidia-smi -l` does, until the script stops it after the groups."""
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ["2026/12/08 01:00:00.000, 0, 1200, 81559",
           "2026/12/08 01:00:02.000, 0, 64000, 81559",  # the peak, in the middle: not the last sample
           "2026/12/08 01:00:04.000, 0, 3000, 81559"]


def _run(tmp_path, *groups, pack="1"):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nvidia-smi"
    lines = "".join(f"'{s}' " for s in SAMPLES)
    fake.write_text("#!/bin/sh\ncase \"$*\" in\n"
                    f"  *memory.used*) printf '%s\\n' {lines}; exec sleep 600;;\n"
                    "  *) echo 'Stand-in GPU, 0.0';;\nesac\n")
    fake.chmod(0o755)
    out = tmp_path / "out"
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", OUT=str(out), TESTS_TIMEOUT="120",
               GPU_TESTS_PACK=pack)
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_tests_parallel.sh"), *groups], env=env,
                          capture_output=True, text=True, timeout=240, cwd=ROOT)
    return done, out


def test_the_peak_of_the_memory_samples_is_printed_and_the_samples_removed(tmp_path):
    group = f"{ROOT / 'tests' / 'test_instant_failures.py'} -k fails_on_purpose"
    done, out = _run(tmp_path, group)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "GPU memory used, peak of 3 samples: 64000 of 81559 MiB (GPU 0, 2026/12/08 01:00:02.000)" in done.stdout
    assert not (out / "gpu_tests_memory.csv").exists()  # one file fewer for the device tool


def test_a_caller_that_packs_keeps_the_samples(tmp_path):
    group = f"{ROOT / 'tests' / 'test_instant_failures.py'} -k fails_on_purpose"
    done, out = _run(tmp_path, group, pack="0")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (out / "gpu_tests_memory.csv").read_text().splitlines() == SAMPLES
