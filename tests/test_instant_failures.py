"""FSDIST_INSTANT_FAILURES=1 (tests/conftest.py's InstantFailures; scripts/gpu_tests_parallel.sh sets it): a failing
test's traceback reaches the log as it fails, so that a run cut by its timeout still says why its tests failed."""
import os
import signal
import subprocess
import sys

import pytest

ON_PURPOSE = os.environ.get("FSDIST_FAIL_ON_PURPOSE") == "1"


@pytest.mark.skipif(not ON_PURPOSE, reason="run by the checks below, in a subprocess")
def test_fails_on_purpose():
    assert 1 + 1 == 3, "failing on purpose"


@pytest.mark.skipif(not ON_PURPOSE, reason="run by the checks below, in a subprocess")
def test_killed_on_purpose():
    os.kill(os.getpid(), signal.SIGKILL)  # as a timeout kills a run: pytest never reaches its summary


@pytest.fixture
def killed_in_teardown():
    yield
    os.kill(os.getpid(), signal.SIGKILL)  # right after the test's own report: nothing else is written before


@pytest.mark.skipif(not ON_PURPOSE, reason="run by the checks below, in a subprocess")
def test_fails_then_dies_on_purpose(killed_in_teardown):
    assert 2 + 2 == 5, "failing before a kill"


def _cut_run(instant: bool, select: str = "fails_on_purpose or killed_on_purpose") -> str:
    """This file's selected tests in a pytest subprocess that is killed during the last one: what it printed."""
    here = os.path.dirname(os.path.abspath(__file__))
    # (stdout a pipe, block-buffered as a log file is: the plugin must flush what it writes)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    env.update(FSDIST_FAIL_ON_PURPOSE="1", FSDIST_INSTANT_FAILURES="1" if instant else "0")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider",
                           os.path.join(here, "test_instant_failures.py"), "-k", select],
                          capture_output=True, text=True, cwd=os.path.dirname(here), env=env, timeout=120)
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    return proc.stdout


def test_a_cut_run_keeps_the_traceback():
    out = _cut_run(instant=True)
    assert "test_fails_on_purpose FAILED" in out, out[-3000:]
    assert "FAILED now: tests/test_instant_failures.py::test_fails_on_purpose (call)" in out, out[-3000:]
    assert "failing on purpose" in out and "assert (1 + 1) == 3" in out, out[-3000:]


def test_without_it_a_cut_run_loses_the_traceback():
    """Control: pytest alone prints tracebacks at the end, which the cut run never reaches."""
    out = _cut_run(instant=False)
    assert "test_fails_on_purpose FAILED" in out, out[-3000:]
    assert "FAILED now" not in out and "failing on purpose" not in out, out[-3000:]


def test_the_traceback_is_in_the_log_before_a_kill_that_follows_at_once():
    """The plugin flushes: a process killed in the failing test's own teardown (nothing written after the report)
    still leaves the traceback in its block-buffered output."""
    out = _cut_run(instant=True, select="dies_on_purpose")
    assert "FAILED now: tests/test_instant_failures.py::test_fails_then_dies_on_purpose (call)" in out, out[-3000:]
    assert "failing before a kill" in out, out[-3000:]
