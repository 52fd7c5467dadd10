"""fsdist.sample: exact sampling fused into the LM-head matmul, on one device.

One call: validate the arguments (``validation``), plan the launch (``ops.plan``), run
stage 1 into a fresh candidate buffer, merge (``ops.merge_candidates``).
"""
from typing import Optional, Union

import torch

from . import validation
from .ops.configs import TileConfig
from .ops.layout import BufferPair
from .ops.merge_candidates import launch_merge
from .ops.plan import launch_stage1, plan_sample
from .types import SampleOutput


def sample(hidden: torch.Tensor, weight: torch.Tensor, *,
           temperature: Union[float, torch.Tensor] = 1.0,
           seed: Union[int, torch.Tensor] = 0,
           offset: Union[int, torch.Tensor] = 0,
           vocab_size: Optional[int] = None,
           return_logprobs: bool = False,
           config: Optional[TileConfig] = None,
           path: Optional[str] = None,
           check: bool = False) -> SampleOutput:
    """Draw one token per row from softmax(hidden @ weight.T / T) without materializing logits.

    hidden: [B, D]; weight: [V, D] (nn.Linear layout, contiguous); same dtype, bf16/fp16/fp32.
    temperature: real number or [B] float tensor; below 1e-5 (vLLM's epsilon) the row is
        greedy (argmax). A negative or NaN value in a tensor makes that row return -1.
    seed, offset: int or [B] int64 tensors. The noise for (row, vocabulary id v) is a pure
        function of (seed, offset, v), so the same pair gives the same token whatever the
        tile sizes or the row's batch position; use a new offset (e.g. the decode step) for
        a fresh draw.
    vocab_size: true vocabulary size; ids >= vocab_size (padding rows of weight) are never sampled.
    return_logprobs: also return log_softmax(logits / T)[token] and logsumexp(logits / T).
    config: override the tile configuration (benchmarks and tests).
    path: "fused" (logits tiles computed in the kernel), "chunked" (cuBLAS fp32 logits per
        L2-sized vocabulary chunk, then a sampling pass with the same noise: faster from
        B = 65 on a GPU), or None to choose by batch size (see ops/configs.choose_path).
        Both draw the same noise, so they return the same tokens up to near-exact ties.
    check: also validate the values inside per-row tensors and raise ValueError on a bad
        one (this synchronises with the device; off by default, bad rows then return -1).

    Example::

        out = fsdist.sample(hidden, weight, temperature=torch.full((B,), 0.7, device="cuda"),
                            seed=seeds, offset=step, return_logprobs=True)
        out.tokens      # int64 [B]
    """
    validation.check_hidden(hidden)
    validation.check_weight(weight, hidden)
    validation.check_device_runnable(hidden.device)
    vocab_size = validation.check_vocab_size(vocab_size, weight.shape[0])
    B, D = hidden.shape
    params = validation.row_params(temperature, seed, offset, B, hidden.device)
    if check:
        validation.check_row_values(params)
    if hidden.stride(1) != 1:
        hidden = hidden.contiguous()
    plan = plan_sample(batch=B, hidden_size=D, weight_rows=weight.shape[0], device=hidden.device,
                       logprobs=return_logprobs, config=config, path=path)
    buffers = BufferPair.alloc(plan.layout, hidden.device)
    launch_stage1(plan, hidden, weight, params, buffers, vocab_size=vocab_size)
    return SampleOutput(*launch_merge(plan.layout, buffers, B, params, logprobs=return_logprobs))
