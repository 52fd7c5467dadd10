"""fsdist: exact LLM token sampling fused into the LM-head matmul (FlashSampling),
on one GPU and across a tensor-parallel group."""
from . import _runtime

# Without a GPU the kernels run under Triton's interpreter, which must be chosen
# before the first kernel is defined. An explicit TRITON_INTERPRET wins.
_runtime.setup()

from .ops.configs import TileConfig  # noqa: E402
from .sampling import sample  # noqa: E402
from .types import SampleOutput  # noqa: E402

__version__ = "0.1.0"
__all__ = ["sample", "SampleOutput", "TileConfig", "ShardedFlashLMHead", "__version__"]


def __getattr__(name):
    # The tensor-parallel head pulls in torch.distributed; load it on first use.
    if name == "ShardedFlashLMHead":
        from .tensor_parallel.layers import ShardedFlashLMHead

        return ShardedFlashLMHead
    raise AttributeError(f"module 'fsdist' has no attribute {name!r}")
