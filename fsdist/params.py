"""Per-row sampling parameters as the kernels receive them.

Every parameter is either a Python scalar, the same for every row, or a ``[B]`` tensor
on the sampling device, one value per row. ``fsdist.validation.row_params`` builds a
:class:`RowParams` from user arguments (checking shapes, dtypes and devices, never the
values inside device tensors); the host launchers in ``fsdist.ops`` turn each field into
a (pointer, scalar, per-row flag) kernel argument triple.

The filters follow vLLM V1's order: logits / T -> min-p -> top-k -> top-p on the
renormalised survivors. Their "off" values: top_k 0 (or >= the vocabulary), top_p 1.0,
min_p 0.0. A greedy row (temperature < GREEDY_TEMPERATURE) ignores them.
"""
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Union

import torch

if TYPE_CHECKING:  # processing.py imports this module
    from .processing import LogitProcessing

# Temperatures below this are greedy, as in vLLM (its sampling epsilon). The kernels use
# this constant (fsdist.ops.epilogue.GREEDY_BELOW): 1 / T then stays far from overflow.
GREEDY_TEMPERATURE = 1e-5
# Temperatures above this (+inf included) are out of range, like negative or NaN ones. An infinite
# T (or one past ~1e37) makes T times a Gumbel sample (|g| < 25) leave the fp32 range, and an
# infinite score cannot pick a token; 1e30 keeps a wide margin below that. The kernels use this
# constant (fsdist.ops.epilogue.HOTTEST).
MAX_TEMPERATURE = 1e30

# The ``logprobs_mode`` values, in the order the kernels number them.
LOGPROBS_MODES = ("scaled", "raw", "processed")
MAX_TOP_LOGPROBS = 20


@dataclass(frozen=True)
class RowParams:
    """temperature (float or fp32 [B]), seed and offset (int or int64 [B]), and the filters
    top_k (int or int32 [B]), top_p and min_p (float or fp32 [B]) of each row."""

    temperature: Union[float, torch.Tensor]
    seed: Union[int, torch.Tensor]
    offset: Union[int, torch.Tensor]
    top_k: Union[int, torch.Tensor] = 0
    top_p: Union[float, torch.Tensor] = 1.0
    min_p: Union[float, torch.Tensor] = 0.0
    # Extra per-row bits (int or int64 [B]) folded into a tensor-parallel call's row
    # fingerprint (fsdist.ops.step_check), so ranks that disagree on a filter are caught.
    fingerprint: Union[int, torch.Tensor] = 0
    # Token bitmask, logit bias and penalties, applied in stage 1 (fsdist.processing).
    processing: Optional["LogitProcessing"] = None

    @property
    def all_greedy(self) -> bool:
        """True when no row needs noise (a scalar temperature below GREEDY_TEMPERATURE)."""
        return not isinstance(self.temperature, torch.Tensor) and self.temperature < GREEDY_TEMPERATURE

    @property
    def may_min_p(self) -> bool:
        """Whether some row may have min-p on (a [B] tensor counts as "may")."""
        return isinstance(self.min_p, torch.Tensor) or self.min_p > 0.0

    def may_top_k_or_p(self, vocab_size: int) -> bool:
        """Whether some row may have top-k or top-p on (per-row tensors count as "may")."""
        k, p = self.top_k, self.top_p
        return isinstance(k, torch.Tensor) or 0 < k < vocab_size or isinstance(p, torch.Tensor) or p < 1.0

    def filtered(self, vocab_size: int) -> bool:
        """Whether any row may have a filter on (per-row tensors count as "may": their values
        are checked on the device). False means the filter machinery can be skipped."""
        if self.all_greedy:
            return False
        return self.may_top_k_or_p(vocab_size) or self.may_min_p


__all__ = ["GREEDY_TEMPERATURE", "MAX_TEMPERATURE", "LOGPROBS_MODES", "MAX_TOP_LOGPROBS", "RowParams"]
