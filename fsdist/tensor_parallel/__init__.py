"""Tensor-parallel FlashSampling: the vocabulary is sharded across ranks, tokens are not.

Public pieces:

* :class:`ShardedFlashLMHead` (``layers.py``) -- the module; also ``fsdist.ShardedFlashLMHead``.
* :func:`vocab_partition` / :func:`pad_vocab_size` (``vocab.py``) -- padding and per-rank ranges.
* ``transports`` -- nvshmem / symm_mem / collective / shm exchange of small buffers.
* :class:`HeadTestSeam` (``testing.py``) -- the door tests and benchmarks use into a head.

See docs/tensor_parallel.md for the layout, the transports and how to launch.
"""
from .health import TensorParallelMismatchError
from .layers import REDUCTIONS, ShardedFlashLMHead
from .testing import HeadTestSeam
from .transports import TRANSPORTS
from .vocab import VocabPartition, pad_vocab_size, vocab_partition

__all__ = ["ShardedFlashLMHead", "TensorParallelMismatchError", "HeadTestSeam", "VocabPartition", "pad_vocab_size", "vocab_partition",
           "TRANSPORTS", "REDUCTIONS"]
