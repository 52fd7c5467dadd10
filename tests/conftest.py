"""Test setup: CUDA when there is a GPU, else Triton's interpreter on the CPU.

TRITON_INTERPRET must be set before triton is first imported, so this runs
before any test module imports fsdist.
"""
import glob
import os

# Without an NVIDIA device (the CPU suites, under Triton's interpreter): one BLAS thread, as scripts/test.sh sets. A
# multi-threaded numpy matmul (the interpreter's tl.dot) may add in another order, and the recorded golden logprobs
# (tests/test_golden.py, 1e-6) were taken with one thread. Set before numpy is loaded; a value already set wins; a GPU
# machine keeps its threads for the tests' CPU references.
if not glob.glob("/dev/nvidia[0-9]*"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from interpreter_patches import install as install_interpreter_shortcut  # noqa: E402
from sharding import parse_shard, shard_bounds  # noqa: E402

install_interpreter_shortcut()  # Triton's interpreter without its redundant re-patching (interpreter_patches.py)

ON_GPU = torch.cuda.is_available()


# FSDIST_TEST_EVERY_CASE=1: every multi-rank test at every world size (see the world_sizes marker).
EVERY_CASE = os.environ.get("FSDIST_TEST_EVERY_CASE", "0") == "1"


def launch_world_size() -> int:
    """The world size this session was launched with (1 without a launcher): read from the launcher's
    environment, as fsdist.distributed.init_distributed reads it, so every rank gets the same answer."""
    from fsdist.distributed import detect_launch

    return detect_launch().world_size


def world_sizes_skip(item, world: int):
    """The skip for a test marked ``world_sizes(*sizes, why=...)`` in a multi-rank session of another
    size, or None. The decision depends only on the launch (never on the rank): ranks that disagreed
    about which tests run would hang in a collective."""
    mark = item.get_closest_marker("world_sizes")
    if mark is None or world < 2 or world in mark.args or EVERY_CASE:
        return None
    sizes = " or ".join(str(n) for n in mark.args)
    return pytest.mark.skip(reason=f"{world} ranks add nothing here: {mark.kwargs['why']} (runs at {sizes} "
                                   "ranks; FSDIST_TEST_EVERY_CASE=1 runs it at every size)")


# The CPU suite's longest files, longest first (seconds of one CI core, 2026-12-06; test_lowering's sm_90 compiles
# take ~4-5 min on a cold Triton cache, as on a fresh CI machine, ~20 s warm). scripts/test.sh runs pytest-xdist with
# --dist loadfile --no-loadscope-reorder, which hands files to the workers in collection order: starting these first
# keeps one of them from being the last file a worker takes while the other worker idles.
LONGEST_FIRST = ("tests/ops/test_lowering.py", "tests/test_processors.py", "tests/ops/test_fused_sample.py",
                 "tests/ops/test_select_filtered.py", "tests/test_filters.py", "tests/ops/test_min_p_winners.py")


def longest_first(items):
    """items with LONGEST_FIRST's files first, in that order; every other file keeps its place after them (a stable
    sort: every xdist worker gets the same order, which xdist requires)."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


def pytest_addoption(parser):
    parser.addoption("--shard", default=None, metavar="I/N",
                     help="run only the I-th of N contiguous blocks of the selected tests (tests/sharding.py; "
                          "JOBS=N SPLIT=tests bash scripts/gpu_check.sh)")


class ShardPlugin:
    """--shard I/N's selection, as a plugin of its own (one module cannot hold two pytest_collection_modifyitems)."""

    def __init__(self, index: int, count: int):
        self.index, self.count = index, count

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config, items):
        # trylast: after every other selection (-k, -m, --deselect), so that the blocks split what would run.
        start, stop = shard_bounds(len(items), self.index, self.count)
        config.hook.pytest_deselected(items=items[:start] + items[stop:])
        items[:] = items[start:stop]


class InstantFailures:
    """FSDIST_INSTANT_FAILURES=1 (scripts/gpu_tests_parallel.sh sets it): each failure's traceback is written to
    the terminal as the test fails, not only in pytest's summary at the end, which a run cut by its timeout never
    reaches (tests/test_instant_failures.py)."""

    TAIL = 6000  # characters of each traceback kept (its end: the assertion or the error)

    def __init__(self, config):
        self.config = config

    @pytest.hookimpl(trylast=True)  # after pytest's own "FAILED [ nn%]" line, which the scripts' greps read
    def pytest_runtest_logreport(self, report):
        if not report.failed:
            return
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is None:
            return
        text = report.longreprtext
        cut = f"[... {len(text) - self.TAIL} characters cut ...]\n" if len(text) > self.TAIL else ""
        # (a failure in a fixture's setup or teardown is an ERROR in pytest's words)
        word = "FAILED" if report.when == "call" else "ERROR"
        reporter.write_line("")
        reporter.write_sep("-", f"{word} now: {report.nodeid} ({report.when})")
        reporter.write_line(cut + text[-self.TAIL:])
        reporter.flush()  # a log file is block-buffered: the traceback must be in it before a hang that follows


def pytest_configure(config):
    # Checked here, on the xdist controller too, so that a bad value is a usage error, not a worker's crash.
    shard = config.getoption("--shard", default=None)
    if shard is not None:
        try:
            index, count = parse_shard(shard)
        except ValueError as error:
            raise pytest.UsageError(str(error)) from None
        config.pluginmanager.register(ShardPlugin(index, count), "fsdist-shard")
    if os.environ.get("FSDIST_INSTANT_FAILURES", "0") == "1":
        config.pluginmanager.register(InstantFailures(config), "fsdist-instant-failures")


def pytest_collection_modifyitems(config, items):
    longest_first(items)
    gpu_skip = None if ON_GPU else pytest.mark.skip(reason="needs a CUDA GPU")
    world = None
    for item in items:
        if gpu_skip is not None and "gpu" in item.keywords:
            item.add_marker(gpu_skip)
        if item.get_closest_marker("world_sizes") is not None:
            world = launch_world_size() if world is None else world
            skip = world_sizes_skip(item, world)
            if skip is not None:
                item.add_marker(skip)


@pytest.fixture
def device():
    return torch.device("cuda") if ON_GPU else torch.device("cpu")
