"""Where kernels run: CUDA, or Triton's interpreter on a machine without a GPU.

Two things make the interpreter path fragile, and both are handled here, once, when
``fsdist`` is imported (:func:`setup`):

* **Import order.** Triton decides at *decoration* time whether an ``@triton.jit``
  function is compiled or interpreted. fsdist's own kernels are decorated after
  ``setup`` has set ``TRITON_INTERPRET=1``, but Triton's standard library
  (``tl.max``, ``tl.argmax``, ``tl.philox``, ...) was decorated when ``triton`` was first
  imported. If something imported triton before fsdist (``torch._dynamo``,
  megatron-core, ...), those are compiled-mode functions, and calling them from an
  interpreted kernel fails with "Cannot call @triton.jit'd outside of the scope of a
  kernel". We re-wrap them as interpreted functions; if that is not possible, the
  first call raises :class:`InterpreterSetupError` saying what to do.
* **NumPy >= 2.4.** Triton 3.6's interpreter turns a scalar kernel argument used as a
  Python index (``range(0, D, BLOCK_K)``) into ``int(array_of_shape_1)``, which NumPy
  2.4 rejects. We give the interpreter's tensors an ``__index__`` that reads the
  single element with ``.item()``.
"""
import os
import sys

_SETUP_ERROR = None  # set when the interpreter could not be made usable (see check_interpreter)


class InterpreterSetupError(RuntimeError):
    """Triton's interpreter is needed (no GPU) but could not be enabled in this process."""


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def default_device():
    import torch

    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def setup() -> None:
    """Choose CUDA or the interpreter (an explicit TRITON_INTERPRET wins) and patch the latter."""
    global _SETUP_ERROR
    triton_was_imported = "triton" in sys.modules
    if "TRITON_INTERPRET" not in os.environ:
        import torch

        if not torch.cuda.is_available():
            os.environ["TRITON_INTERPRET"] = "1"
    if not interpreting():
        return
    try:
        _patch_numpy_index()
        if triton_was_imported:
            _reinterpret_standard_library()
    except Exception as e:  # a Triton version whose internals differ: explain at the first call
        _SETUP_ERROR = f"{type(e).__name__}: {e}"


def check_interpreter() -> None:
    """Raise InterpreterSetupError if setup() could not make the interpreter usable."""
    if _SETUP_ERROR is not None:
        raise InterpreterSetupError(
            "fsdist runs its kernels under Triton's interpreter on this machine (no CUDA device), "
            f"but could not enable it in this process ({_SETUP_ERROR}). The interpreter must be "
            "chosen before triton is first imported: set TRITON_INTERPRET=1 in the environment, or "
            "import fsdist before anything that imports triton (torch._dynamo, megatron-core, ...).")


def _patch_numpy_index() -> None:
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor
    if getattr(original, "_fsdist_patched", False):
        return

    def patch_lang_tensor(tensor, scope):
        original(tensor, scope)
        # Scalars are 1-element arrays in the interpreter; int() of those fails on NumPy >= 2.4.
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patch_lang_tensor._fsdist_patched = True
    interpreter._patch_lang_tensor = patch_lang_tensor


def _reinterpret_standard_library() -> None:
    """Swap Triton's compiled-mode standard-library functions for interpreted ones, everywhere
    they are reachable from kernel code (the triton.language namespaces)."""
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    modules = [tl] + [m for name, m in sys.modules.items()
                      if name.startswith("triton.language") and m is not None]
    swapped = {}
    for module in modules:
        for name, value in list(vars(module).items()):
            if isinstance(value, JITFunction):
                if id(value) not in swapped:
                    swapped[id(value)] = InterpretedFunction(value.fn)
                setattr(module, name, swapped[id(value)])
    # A compiled-mode function left in these namespaces would fail inside every kernel.
    left = [f"{m.__name__}.{n}" for m in modules for n, v in vars(m).items() if isinstance(v, JITFunction)]
    if left:
        raise RuntimeError(f"could not re-wrap {left[:3]}")
