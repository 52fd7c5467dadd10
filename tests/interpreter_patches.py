"""Test-time speed-up of Triton's interpreter (TRITON_INTERPRET=1, the CPU test suites): no behaviour changes.

Triton 3.6's interpreter patches ``triton.language`` (every builtin of tl, tl.core, tl.math and tl.tensor,
found with ``inspect.getmembers``) when a kernel launch starts, and restores it when the launch ends. It also
patches again at *every* call of a ``@triton.jit`` helper inside the kernel (``InterpretedFunction.__call__``),
into a scope it never restores: the same modules, with the same interpreter builder, already patched by the
launch. fsdist's kernels call helpers in their inner loops (noise, keys, packs), so that repeated patching is a
good part of a kernel's interpreted time: 30 s of 106 s of a chi-squared test under cProfile; without the
profiler, a 2,000-row fsdist.sample runs 35% faster with the shortcut, a 20,000-row one ~10%.

``install()`` makes a helper call skip it while a launch is running whose patch covers every triton.language
module the helper's globals see (tl, tl.core), and otherwise calls Triton's own. The helper runs with the very
same patched modules either way. It installs only where the interpreter has the structure described above
(checked on the source of the two call sites), so another Triton version runs unchanged.
"""
import inspect
import os

# Per running launch (innermost last): the ids of the language modules its own patch covered, None until then.
_active = []


def install() -> bool:
    """Install the shortcut if TRITON_INTERPRET=1 and the interpreter is the expected one; True if installed.
    FSDIST_TEST_PLAIN_INTERPRETER=1 leaves Triton's interpreter as it is."""
    if os.environ.get("TRITON_INTERPRET") != "1" or os.environ.get("FSDIST_TEST_PLAIN_INTERPRETER") == "1":
        return False
    try:
        import triton.language as tl
        from triton.runtime import interpreter as interp

        launch_src = inspect.getsource(interp.GridExecutor.__call__)
        helper_src = inspect.getsource(interp.InterpretedFunction.__call__)
    except (ImportError, AttributeError, OSError, TypeError):
        return False
    if getattr(interp, "_fsdist_shortcut", False):
        return True
    if "patch_scope = _patch_lang(self.fn)" not in launch_src or "patch_scope.restore()" not in launch_src \
            or "_patch_lang(self.fn)" not in helper_src:
        return False
    patch_lang, launch_call = interp._patch_lang, interp.GridExecutor.__call__

    def langs_of(fn):
        return {id(v) for v in fn.__globals__.values() if v is tl or v is tl.core}

    def launch(self, *args, **kwargs):
        _active.append(None)
        try:
            return launch_call(self, *args, **kwargs)
        finally:
            _active.pop()

    def shortcut(fn):
        langs = langs_of(fn)
        if _active and _active[-1] is None:  # the launch's own patch (restored when the launch ends)
            _active[-1] = langs
            return patch_lang(fn)
        if _active and langs <= _active[-1]:  # a helper inside it: the same modules, patched already
            return None  # (the helper call site discards what _patch_lang returns)
        return patch_lang(fn)

    interp.GridExecutor.__call__ = launch
    interp._patch_lang = shortcut
    interp._fsdist_shortcut = True
    return True
