"""Result type shared by the single-GPU sampler and the tensor-parallel head."""
from typing import NamedTuple, Optional

import torch


class SampleOutput(NamedTuple):
    """One sampled token per row.

    tokens:    int64 [B]; -1 for a row whose logits held a NaN, whose temperature was
               negative or NaN, or which had no id with a finite logit.
    logprobs:  fp32 [B] log-probability of the returned token under the distribution it
               was drawn from, log_softmax(logits / T) (T = 1 for greedy rows); NaN where
               the token is -1. None unless return_logprobs.
    logsumexp: fp32 [B] logsumexp(logits / T) over ids < vocab_size (T = 1 for greedy rows).
               None unless return_logprobs.
    """

    tokens: torch.Tensor
    logprobs: Optional[torch.Tensor] = None
    logsumexp: Optional[torch.Tensor] = None
