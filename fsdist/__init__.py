"""fsdist: exact LLM token sampling fused into the LM-head matmul (FlashSampling),
on one GPU and across a tensor-parallel group.

``fsdist.sample`` (``sampling.py``) samples on one device; ``fsdist.ShardedFlashLMHead``
(``tensor_parallel/``) is the vocabulary-parallel head. Everything is imported on first
use, so ``import fsdist.env`` (the no-multicast switches) costs no torch import.
"""
import importlib

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
    "sample": "fsdist.sampling",
    "SampleOutput": "fsdist.types",
    "SparseLogits": "fsdist.types",
    "Penalties": "fsdist.types",
    "TileConfig": "fsdist.ops.configs",
    "RowParams": "fsdist.params",
    "ShardedFlashLMHead": "fsdist.tensor_parallel.layers",
    "TensorParallelMismatchError": "fsdist.tensor_parallel.health",
}
__all__ = list(_EXPORTS) + ["__version__"]


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'fsdist' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
