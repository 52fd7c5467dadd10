"""Argument and result types shared by the single-GPU sampler, the tensor-parallel head and
the float64 reference (``fsdist.reference``): the logit bias, the penalties, the output."""
from typing import NamedTuple, Optional, Union

import torch

Row = Union[float, int, torch.Tensor]
"""A per-row sampling parameter: one number for every row, or a [B] tensor."""


class SparseLogits(NamedTuple):
    """A few (id, value) pairs per row: the logit bias (``logit_bias=``).

    ids:    int64 [B, K]; -1 marks an empty slot. An id listed twice in a row gets both values.
    values: floating [B, K] (fp32 in the kernels); added to the raw logits of those ids,
            after the token bitmask and before the penalties.

    Example: ban nothing, favour id 42 by +2 in row 0 only::

        fsdist.SparseLogits(torch.tensor([[42], [-1]]), torch.tensor([[2.0], [0.0]]))
    """

    ids: torch.Tensor
    values: torch.Tensor


class Penalties(NamedTuple):
    """OpenAI/vLLM-style penalties (``penalties=``), applied after the logit bias.

    repetition: > 0, number or [B]; 1 = off. For ids in prompt U output a positive logit
                is divided by it, a zero or negative one multiplied by it.
    frequency:  number or [B]; 0 = off. Subtracted once per occurrence in output_ids.
    presence:   number or [B]; 0 = off. Subtracted once if the id occurs in output_ids.
    output_ids: int64 [B, L], -1-padded, or None: the tokens generated so far; repeats count.
    prompt_ids: int64 [B, P], -1-padded, or None; only the repetition penalty reads it.
    """

    repetition: Row = 1.0
    frequency: Row = 0.0
    presence: Row = 0.0
    output_ids: Optional[torch.Tensor] = None
    prompt_ids: Optional[torch.Tensor] = None


class SampleOutput(NamedTuple):
    """One sampled token per row.

    tokens:       int64 [B]; -1 for a row whose logits held a NaN or +inf, whose parameters
                  were out of range (a negative, NaN or > 1e30 temperature, a bad filter value in a
                  tensor; a bias or penalty id outside [-1, vocab_size), a non-finite bias or penalty,
                  a repetition penalty <= 0), or which had no id with a finite logit (a bitmask that
                  allows nothing).
    logprobs:     fp32 [B] log-probability of the returned token in ``logprobs_mode``:
                  "scaled" log_softmax(logits / T) (T = 1 for greedy rows), "raw"
                  log_softmax(logits), "processed" the probability it was drawn with after
                  the filters; NaN where the token is -1. None unless return_logprobs.
    logsumexp:    fp32 [B] logsumexp(logits / T) over ids < vocab_size, of the processed logits
                  (bitmask, bias and penalties applied; T = 1 for greedy rows); -inf where the
                  bitmask allows nothing, NaN for the other rows whose token is -1. None unless
                  return_logprobs.
    top_ids:      int64 [B, N] the N most likely ids, lower id first among equal values; a row with
                  fewer than N allowed ids lists the forbidden ones after them (logprob -inf), lowest
                  id first, as vLLM's lists hold real ids; -1 past the vocabulary (N > vocab_size)
                  and where the token is -1. None unless top_logprobs = N > 0.
    top_logprobs: fp32 [B, N] their logprobs in ``logprobs_mode`` (NaN where the token is -1).
                  None unless N > 0.
    fallback:     bool [B]: rows the kept logits could not prove, resolved by the exact
                  fallback (same result, slower). None when N = 0 and no row can be filtered (no
                  filter asked for, or a scalar greedy temperature).
    """

    tokens: torch.Tensor
    logprobs: Optional[torch.Tensor] = None
    logsumexp: Optional[torch.Tensor] = None
    top_ids: Optional[torch.Tensor] = None
    top_logprobs: Optional[torch.Tensor] = None
    fallback: Optional[torch.Tensor] = None
