"""Materialize-then-sample baselines: what serving stacks do today, and the test oracles.

``reference_sample`` materializes logits = hidden @ W.T, then softmax and multinomial.
``reference_gumbel`` materializes the logits too but draws fsdist's own counter-based
noise (``fsdist.reference.noise``), so tests can check the fused kernel token by token.
"""
from typing import Optional, Union

import torch

from ..types import SampleOutput
from .noise import vocab_gumbel


def _as_rows(x, batch: int, dtype, device) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.to(device=device, dtype=dtype)
    return torch.full((batch,), x, dtype=dtype, device=device)


def materialize_logits(hidden: torch.Tensor, weight: torch.Tensor, vocab_size: Optional[int] = None,
                       dtype=torch.float64) -> torch.Tensor:
    """[B, V] logits in `dtype`, ids >= vocab_size set to -inf."""
    logits = hidden.to(dtype) @ weight.to(dtype).T
    if vocab_size is not None and vocab_size < logits.shape[1]:
        logits[:, vocab_size:] = float("-inf")
    return logits


GREEDY_TEMPERATURE = 1e-5  # below it a row is greedy (vLLM's epsilon), as in the kernels


def _scaled(logits: torch.Tensor, temperature) -> torch.Tensor:
    """(logits / T with T = 1 for greedy rows, greedy mask)."""
    t = _as_rows(temperature, logits.shape[0], logits.dtype, logits.device)
    greedy = t < GREEDY_TEMPERATURE
    return logits / torch.where(greedy, torch.ones_like(t), t)[:, None], greedy


def reference_sample(hidden: torch.Tensor, weight: torch.Tensor, *,
                     temperature: Union[float, torch.Tensor] = 1.0, vocab_size: Optional[int] = None,
                     generator: Optional[torch.Generator] = None, return_logprobs: bool = False,
                     logits_dtype=torch.float32) -> SampleOutput:
    """Materialize logits, softmax, multinomial; greedy rows take the argmax."""
    scaled, greedy = _scaled(materialize_logits(hidden, weight, vocab_size, logits_dtype), temperature)
    probs = torch.softmax(scaled, dim=-1)
    tokens = torch.multinomial(probs, 1, generator=generator).squeeze(1)
    tokens = torch.where(greedy, scaled.argmax(dim=-1), tokens)
    if not return_logprobs:
        return SampleOutput(tokens)
    logp = torch.log_softmax(scaled, dim=-1)
    return SampleOutput(tokens, logp.gather(1, tokens[:, None]).squeeze(1).float(),
                        torch.logsumexp(scaled, dim=-1).float())


def reference_gumbel(hidden: torch.Tensor, weight: torch.Tensor, *,
                     temperature: Union[float, torch.Tensor] = 1.0, seed=0, offset=0,
                     vocab_size: Optional[int] = None):
    """argmax(logits / T + fsdist's noise) in float64; returns (tokens, margin).

    margin is the gap between the best and second-best perturbed score: rows with a
    margin far above fp32 rounding must match the fused kernel exactly.
    """
    logits = materialize_logits(hidden, weight, vocab_size)
    B, V = logits.shape
    scaled, greedy = _scaled(logits, temperature)
    ids = torch.arange(V, device=logits.device)[None, :]
    seeds = _as_rows(seed, B, torch.int64, logits.device)[:, None]
    offsets = _as_rows(offset, B, torch.int64, logits.device)[:, None]
    noise = vocab_gumbel(seeds, offsets, ids)
    score = torch.where(greedy[:, None], scaled, scaled + noise)
    top2 = score.topk(2, dim=-1).values if V > 1 else torch.cat([score, score - float("inf")], -1)
    return score.argmax(dim=-1), top2[:, 0] - top2[:, 1]
