"""Per-row sampling parameters as the kernels receive them.

Every parameter is either a Python scalar, the same for every row, or a ``[B]`` tensor
on the sampling device, one value per row. ``fsdist.validation.row_params`` builds a
:class:`RowParams` from user arguments (checking shapes, dtypes and devices, never the
values inside device tensors); the host launchers in ``fsdist.ops`` turn each field into
a (pointer, scalar, per-row flag) kernel argument triple.
"""
from dataclasses import dataclass
from typing import Union

import torch

# Temperatures below this are greedy, as in vLLM (its sampling epsilon). The kernels use
# the same constant (fsdist.ops.epilogue.GREEDY_BELOW): 1 / T then stays far from overflow.
GREEDY_TEMPERATURE = 1e-5


@dataclass(frozen=True)
class RowParams:
    """temperature (float or fp32 [B]), seed and offset (int or int64 [B]) of each row."""

    temperature: Union[float, torch.Tensor]
    seed: Union[int, torch.Tensor]
    offset: Union[int, torch.Tensor]

    @property
    def all_greedy(self) -> bool:
        """True when no row needs noise (a scalar temperature below GREEDY_TEMPERATURE)."""
        return not isinstance(self.temperature, torch.Tensor) and self.temperature < GREEDY_TEMPERATURE


__all__ = ["GREEDY_TEMPERATURE", "RowParams"]
