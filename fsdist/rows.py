"""Hidden states of shape ``[..., D]``: rows in, tokens out with the same leading shape.

The kernels see rows: ``hidden [N, D]`` with ``N = prod(leading shape)``. Models hand over
more than two dimensions (Megatron's decoder output is ``[s, b, h]``, transformers' is
``[b, s, h]``), so ``fsdist.sample`` and ``ShardedFlashLMHead.forward`` flatten the leading
dimensions on the way in and give every output its leading shape back on the way out:

* ``hidden [*lead, D]`` -> ``[N, D]`` (a view when the leading dimensions are contiguous
  with each other, as they are for Megatron's and transformers' outputs; else a copy of the
  small ``[N, D]`` input, never of anything vocabulary-sized);
* a per-row parameter (``temperature``, ``seed``, ``offset``, ``top_k``, ``top_p``,
  ``min_p``, and the per-row fields of ``Penalties``) is a scalar, a ``[*lead]`` tensor or
  the flattened ``[N]`` tensor (row ``i`` is ``hidden.reshape(N, D)[i]``: row-major order);
* a row-indexed table (``token_bitmask``, ``logit_bias.ids`` / ``.values``,
  ``penalties.output_ids`` / ``.prompt_ids``) is ``[*lead, K]`` or ``[N, K]``;
* ``SampleOutput``: ``tokens``, ``logprobs``, ``logsumexp``, ``fallback`` come back as
  ``[*lead]``, ``top_ids`` / ``top_logprobs`` as ``[*lead, n]``.

Reshapes only: no host synchronisation, nothing allocated per vocabulary id. For 2-D
hidden states everything here is the identity (and shape errors keep their ``[B]``
wording from ``fsdist.validation``).
"""
import math
from typing import Optional, Tuple

import torch

from .types import Penalties, SampleOutput, SparseLogits

_ROW_PARAMS = ("temperature", "seed", "offset", "top_k", "top_p", "min_p")


def flatten_hidden(hidden: torch.Tensor) -> Tuple[torch.Tensor, Tuple[int, ...]]:
    """(hidden as [N, D], the leading shape). Call after the type/rank checks of validation."""
    lead = tuple(hidden.shape[:-1])
    if len(lead) == 1:
        return hidden, lead
    return hidden.reshape(math.prod(lead), hidden.shape[-1]), lead


def _row(x, name: str, lead: Tuple[int, ...], n: int):
    if not isinstance(x, torch.Tensor) or len(lead) == 1 or x.dim() == 0:  # (0-d: every row's, validation)
        return x
    if tuple(x.shape) == lead:
        return x.reshape(n)
    if tuple(x.shape) == (n,):
        return x
    raise ValueError(f"{name} tensor must have hidden's leading shape {list(lead)} or the flattened shape "
                     f"[{n}] (one value per row), got {tuple(x.shape)}")


def _table(x, name: str, lead: Tuple[int, ...], n: int):
    if not isinstance(x, torch.Tensor) or len(lead) == 1 or x.dim() < 1:
        return x
    if tuple(x.shape[:-1]) == lead:
        return x.reshape(n, x.shape[-1])
    if x.dim() == 2 and x.shape[0] == n:
        return x
    raise ValueError(f"{name} must have shape [{', '.join(map(str, lead))}, K] (hidden's leading shape) or "
                     f"[{n}, K] (flattened rows), got {tuple(x.shape)}")


def flatten_row_args(lead: Tuple[int, ...], **params) -> dict:
    """The per-row parameters (by keyword) as scalars or [N] tensors."""
    if len(lead) == 1:  # (2-D hidden: every parameter as given, what _row returns for each)
        return params
    n = math.prod(lead)
    return {k: _row(v, k, lead, n) for k, v in params.items()}


def flatten_processors(lead: Tuple[int, ...], token_bitmask=None, logit_bias=None,
                       penalties: Optional[Penalties] = None):
    """(token_bitmask, logit_bias, penalties) with their row dimensions flattened to [N].

    Arguments of the wrong type pass through unchanged (``fsdist.processing`` names them)."""
    if len(lead) == 1:
        return token_bitmask, logit_bias, penalties
    n = math.prod(lead)
    token_bitmask = _table(token_bitmask, "token_bitmask", lead, n)
    if isinstance(logit_bias, tuple) and len(logit_bias) == 2:
        logit_bias = SparseLogits(_table(logit_bias[0], "logit_bias.ids", lead, n),
                                  _table(logit_bias[1], "logit_bias.values", lead, n))
    if isinstance(penalties, Penalties):
        penalties = Penalties(_row(penalties.repetition, "penalties.repetition", lead, n),
                              _row(penalties.frequency, "penalties.frequency", lead, n),
                              _row(penalties.presence, "penalties.presence", lead, n),
                              _table(penalties.output_ids, "penalties.output_ids", lead, n),
                              _table(penalties.prompt_ids, "penalties.prompt_ids", lead, n))
    return token_bitmask, logit_bias, penalties


def unflatten_output(out: SampleOutput, lead: Tuple[int, ...]) -> SampleOutput:
    """Every field of ``out`` with its row dimension reshaped to ``lead``."""
    if len(lead) == 1:
        return out

    def per_row(t):
        return None if t is None else t.reshape(lead)

    def per_row_n(t):
        return None if t is None else t.reshape(lead + (t.shape[-1],))

    return SampleOutput(per_row(out.tokens), per_row(out.logprobs), per_row(out.logsumexp),
                        per_row_n(out.top_ids), per_row_n(out.top_logprobs), per_row(out.fallback))


__all__ = ["flatten_hidden", "flatten_row_args", "flatten_processors", "unflatten_output"]
