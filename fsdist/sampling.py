"""fsdist.sample: exact sampling fused into the LM-head matmul, on one device."""
from typing import Optional, Union

import torch
import triton

from . import _validation as V
from .ops.configs import TileConfig, pick_config
from .ops.sampler import CandidateLayout, launch_reduce, stage1_launcher
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
    """
    V.check_hidden(hidden)
    V.check_weight(weight, hidden)
    V.check_device_runnable(hidden.device)
    vocab_size = V.check_vocab_size(vocab_size, weight.shape[0])
    B, D = hidden.shape
    params = V.row_params(temperature, seed, offset, B, hidden.device)
    if check:
        V.check_row_values(params)
    if hidden.stride(1) != 1:
        hidden = hidden.contiguous()
    cfg = config or pick_config(B, D, hidden.device.type)
    launch = stage1_launcher(path, B, D, hidden.device.type)
    layout = CandidateLayout(CandidateLayout.fields(return_logprobs),
                             triton.cdiv(weight.shape[0], cfg.block_v), max(B, 1))
    cand_f, cand_i = layout.alloc(hidden.device)
    if B:
        launch(hidden, weight, params, cfg, layout, cand_f, cand_i, vocab_size=vocab_size, logprobs=return_logprobs)
    return SampleOutput(*launch_reduce(layout, cand_f, cand_i, B, params=params, logprobs=return_logprobs))
