"""Result type shared by the single-GPU sampler and the tensor-parallel head."""
from typing import NamedTuple, Optional

import torch


class SampleOutput(NamedTuple):
    """One sampled token per row.

    tokens:       int64 [B]; -1 for a row whose logits held a NaN or +inf, whose parameters
                  were out of range (a negative or NaN temperature, a bad filter value in a
                  tensor), or which had no id with a finite logit.
    logprobs:     fp32 [B] log-probability of the returned token in ``logprobs_mode``:
                  "scaled" log_softmax(logits / T) (T = 1 for greedy rows), "raw"
                  log_softmax(logits), "processed" the probability it was drawn with after
                  the filters; NaN where the token is -1. None unless return_logprobs.
    logsumexp:    fp32 [B] logsumexp(logits / T) over ids < vocab_size (T = 1 for greedy rows).
                  None unless return_logprobs.
    top_ids:      int64 [B, N] the N most likely ids (lower id first among equal logits),
                  -1 past the vocabulary. None unless top_logprobs = N > 0.
    top_logprobs: fp32 [B, N] their logprobs in ``logprobs_mode``. None unless N > 0.
    fallback:     bool [B]: rows the kept logits could not prove, resolved by the exact
                  fallback (same result, slower). None unless filters or top-N were asked for.
    """

    tokens: torch.Tensor
    logprobs: Optional[torch.Tensor] = None
    logsumexp: Optional[torch.Tensor] = None
    top_ids: Optional[torch.Tensor] = None
    top_logprobs: Optional[torch.Tensor] = None
    fallback: Optional[torch.Tensor] = None
