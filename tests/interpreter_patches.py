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

Triton's own helpers (``tl.max``, ``tl.zeros``, ``tl.sum``, ``tl.argmax``, philox: triton.language.standard and
.random) see ``tl.core`` (standard's see ``tl`` too once the interpreter's rewrite has copied its globals in), which a
launch of an fsdist kernel (whose globals hold ``tl`` only) does not patch, so each of their calls went through
Triton's patch again: 20,824 of them in one processors chi-squared test, 44 s of its 162 s
under cProfile (2026-12-07). But a helper's patch is never restored: once Triton's path has patched a module for a
helper, its module-level builtins stay wrapped (the wrappers are not builtins, so a later patch finds nothing left
to wrap) and its other attributes stay set to the same stateless replacements. What a launch patches and restores
(the ``tl`` module, the tensor and dtype classes, ``reduce`` / ``associative_scan``) it patches again at its next
start. So inside a running launch a helper whose modules the launch or an earlier helper patch already covered skips
the patch too (``_patched_for_good``: only modules that helper patch found raw, i.e. no running launch covered; a
module a launch covers is unwrapped again by that launch's restore).
"""
import inspect
import os

# Per running launch (innermost last): the ids of the language modules its own patch covered, None until then.
_active = []
# The ids of the language modules a helper call has patched through Triton's own path (a patch never restored).
_patched_for_good = set()


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
        if _active and langs <= _active[-1] | _patched_for_good:  # a helper inside it: its modules patched already
            return None  # (the helper call site discards what _patch_lang returns)
        scope = patch_lang(fn)
        if _active:  # (a helper's patch, never restored; outside a launch nothing is skipped, so nothing recorded)
            # only the modules no running launch had patched: the helper's patch found those raw and wrapped them for
            # good; a module a running launch covers it found wrapped already, and that launch's restore unwraps it
            _patched_for_good.update(langs.difference(*(a for a in _active if a is not None)))
        return scope

    interp.GridExecutor.__call__ = launch
    interp._patch_lang = shortcut
    interp._fsdist_shortcut = True
    return True
