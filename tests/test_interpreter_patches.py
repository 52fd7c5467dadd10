"""tests/interpreter_patches.py: the interpreter's shortcut keeps results and saves the repeated patching."""
import os

import pytest
import torch
import triton
import triton.language as tl

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" or torch.cuda.is_available(),
                                reason="the shortcut is for Triton's interpreter (the CPU suite)")


@triton.jit
def _helper(row):
    # a helper of ours calling Triton's own (tl.max, tl.sum: triton.language.standard, which sees tl.core)
    return tl.max(row, axis=0) + 0.0 * tl.sum(row, axis=0)


@triton.jit
def _row_max_kernel(x_ptr, out_ptr, N: tl.constexpr, R: tl.constexpr):
    offs = tl.arange(0, N)
    acc = tl.zeros([N], dtype=tl.float32)
    for r in range(R):
        row = tl.load(x_ptr + r * N + offs)
        acc += row
        tl.store(out_ptr + r, _helper(row) + 0.0 * tl.max(acc, axis=0))


def test_the_shortcut_keeps_results_and_patches_once_per_launch(monkeypatch):
    from triton.runtime import interpreter as interp

    if not getattr(interp, "_fsdist_shortcut", False):
        pytest.skip("the shortcut is not installed (FSDIST_TEST_PLAIN_INTERPRETER=1 or another Triton)")
    N, R = 16, 12
    x = torch.randn(R, N, generator=torch.Generator().manual_seed(3))
    out = torch.empty(R)
    _row_max_kernel[(1,)](x, out, N=N, R=R)  # (a first launch: Triton's own helpers patched once for good)
    assert torch.equal(out, x.max(dim=1).values)
    calls = []
    real = interp._patch_builtin
    monkeypatch.setattr(interp, "_patch_builtin", lambda *a, **k: calls.append(1) or real(*a, **k))
    out2 = torch.empty(R)
    _row_max_kernel[(1,)](x, out2, N=N, R=R)
    assert torch.equal(out2, out)
    # the launch's own patch only (tl, tl.tensor, tl.math, the descriptor base: 4 scans); without the shortcut each
    # of the 12 x 4 helper calls (_helper, tl.max twice, tl.sum) would patch again, 3-4 scans each
    assert 0 < len(calls) <= 4, len(calls)


_CORE_ONLY = """
import triton
import triton.language.core as tl  # (this module's kernel sees tl.core only)
from triton.language import standard


@triton.jit
def core_only_kernel(x_ptr, out_ptr, N: tl.constexpr):
    row = tl.load(x_ptr + tl.arange(0, N))
    tl.store(out_ptr, standard.max(row, 0) + 0.0 * standard.max(row, 0))
"""

_PLAIN = """
import triton
import triton.language as tl


@triton.jit
def plain_kernel(x_ptr, out_ptr, N: tl.constexpr):
    acc = tl.zeros([N], dtype=tl.float32) + tl.load(x_ptr + tl.arange(0, N))
    tl.store(out_ptr, tl.max(acc, axis=0))
"""

_RUN = """
import sys, torch
import interpreter_patches
assert interpreter_patches.install()
import core_only, plain
x = torch.arange(16, dtype=torch.float32)
for order in (("core", "plain"), ("plain", "core", "plain")):
    for name in order:
        out = torch.empty(1)
        (core_only.core_only_kernel if name == "core" else plain.plain_kernel)[(1,)](x, out, N=16)
        assert float(out) == 15.0, (name, float(out))
print("OK")
"""


def test_a_launch_that_covers_tl_core_only_leaves_nothing_unpatched(tmp_path):
    """A kernel whose module sees tl.core only, then a plain one, in a fresh process (earlier launches in this one
    would hide it): the modules that launch covered are restored at its end, so they must not count as patched for
    good, or the plain kernel's tl.zeros would run unpatched and fail."""
    import subprocess
    import sys

    (tmp_path / "core_only.py").write_text(_CORE_ONLY)
    (tmp_path / "plain.py").write_text(_PLAIN)
    env = dict(os.environ, TRITON_INTERPRET="1",
               PYTHONPATH=os.pathsep.join([str(tmp_path), os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")]))
    env.pop("FSDIST_TEST_PLAIN_INTERPRETER", None)
    proc = subprocess.run([sys.executable, "-c", _RUN], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]
