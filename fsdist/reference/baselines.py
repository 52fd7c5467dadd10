"""Materialize-then-sample baselines: what serving stacks do today, and the test oracles.

Test oracles:

* ``reference_sample`` materializes logits = hidden @ W.T (float32 by default), then
  softmax and multinomial, and can return logprobs.
* ``reference_gumbel`` materializes the logits too but draws fsdist's own counter-based
  noise (``fsdist.reference.noise``) in float64, so tests can check the fused kernel
  token by token.

Benchmark baselines (``bench/kernel_bench.py``, ``bench/tp_sweep.py``,
``bench/epilogue_bench.py``, ``fsdist.demo``): the sampling step a serving stack runs
after a cuBLAS LM-head matmul, written plainly so that ``torch.compile`` can fuse it.

* ``multinomial_from_logits``: fp32 logits / T, softmax, ``torch.multinomial``.
* ``gumbel_argmax_from_logits``: argmax of fp32 logits + T * Gumbel noise from
  ``torch.rand``. For T > 0 that is the argmax of logits / T + Gumbel (the usual form);
  written like fsdist's score it needs no division and no branch for greedy rows.
* ``sample_from_logits``: the temperature and greedy handling around any draw function
  (e.g. a FlashInfer sampler), as ``multinomial_from_logits`` uses it.
* ``matmul_multinomial`` / ``matmul_gumbel_argmax``: ``F.linear(hidden, weight)`` (cuBLAS
  on a GPU) followed by the above; ``MATERIALIZED_SAMPLERS`` names them and
  ``compiled_sampler`` returns their ``torch.compile``d form.

Temperature, everywhere here: a real number for the whole batch or a ``[B]`` tensor, one
per row (the serving case). Rows with T below ``GREEDY_TEMPERATURE`` (1e-5, vLLM's
epsilon, as in fsdist's kernels) take the argmax. Values are not checked (a negative
or NaN temperature gives undefined tokens, not fsdist's -1).
"""
from typing import Callable, Dict, Optional, Tuple, Union

import torch
import torch.nn.functional as F

from ..params import GREEDY_TEMPERATURE
from ..types import SampleOutput
from .noise import vocab_gumbel

Temperature = Union[float, torch.Tensor]


def _as_rows(x, batch: int, dtype, device) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.to(device=device, dtype=dtype)
    return torch.full((batch,), x, dtype=dtype, device=device)


def _cast(x: torch.Tensor, dtype) -> torch.Tensor:
    return x if dtype is None or x.dtype == dtype else x.to(dtype)


def materialize_logits(hidden: torch.Tensor, weight: torch.Tensor, vocab_size: Optional[int] = None,
                       dtype=torch.float64) -> torch.Tensor:
    """[B, V] logits in `dtype`, ids >= vocab_size set to -inf."""
    logits = hidden.to(dtype) @ weight.to(dtype).T
    if vocab_size is not None and vocab_size < logits.shape[1]:
        logits[:, vocab_size:] = float("-inf")
    return logits


def scale_logits(logits: torch.Tensor, temperature: Temperature, *,
                 dtype: Optional[torch.dtype] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """(logits / T per row, greedy mask [B]); greedy rows (T < GREEDY_TEMPERATURE) are divided by 1.

    dtype: compute in this dtype (None: the logits' own); the temperatures are cast to it.
    """
    x = _cast(logits, dtype)
    t = _as_rows(temperature, x.shape[0], x.dtype, x.device)
    greedy = t < GREEDY_TEMPERATURE
    return x / torch.where(greedy, torch.ones_like(t), t)[:, None], greedy


def sample_from_logits(logits: torch.Tensor, temperature: Temperature, draw: Callable[[torch.Tensor], torch.Tensor],
                       *, has_greedy: Optional[bool] = None, dtype: Optional[torch.dtype] = torch.float32
                       ) -> torch.Tensor:
    """Tokens int64 [B]: ``draw(logits / T)`` (in `dtype`), the argmax on greedy rows.

    draw: scaled logits [B, V] -> tokens [B] (e.g. softmax + multinomial, or a FlashInfer
    sampler). has_greedy: whether a [B] temperature tensor may hold greedy rows. None or
    True adds the argmax fallback (one more pass over the logits, unless compiled into the
    softmax's); False skips it, the way a serving stack that knows its batch has no greedy
    request (vLLM's ``all_random``) does. With a real-number temperature the host knows
    and this is ignored.
    """
    if not isinstance(temperature, torch.Tensor):
        t = float(temperature)
        if t < GREEDY_TEMPERATURE:
            return logits.argmax(dim=-1)
        return draw(_cast(logits, dtype) / t)
    if has_greedy is False:
        x = _cast(logits, dtype)
        return draw(x / temperature.to(device=x.device, dtype=x.dtype)[:, None])
    scaled, greedy = scale_logits(logits, temperature, dtype=dtype)
    return torch.where(greedy, scaled.argmax(dim=-1), draw(scaled))


def multinomial_from_logits(logits: torch.Tensor, temperature: Temperature = 1.0, *,
                            has_greedy: Optional[bool] = None,
                            generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """Tokens int64 [B]: softmax(fp32 logits / T) then ``torch.multinomial`` (argmax on greedy rows).

    ``torch.multinomial`` checks its input on the host: eager calls synchronise and cannot
    be captured in a CUDA graph.
    """
    def draw(scaled):
        return torch.multinomial(torch.softmax(scaled, dim=-1), 1, generator=generator).squeeze(1)

    return sample_from_logits(logits, temperature, draw, has_greedy=has_greedy)


def gumbel_argmax_from_logits(logits: torch.Tensor, temperature: Temperature = 1.0, *,
                              generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """Tokens int64 [B]: argmax(fp32 logits + T * Gumbel), i.e. argmax(logits / T + Gumbel) for
    T > 0 and the argmax of the logits for greedy rows (their noise scale is 0)."""
    x = logits.float()
    if not isinstance(temperature, torch.Tensor) and float(temperature) < GREEDY_TEMPERATURE:
        return x.argmax(dim=-1)
    if generator is None:
        u = torch.rand_like(x)
    else:
        u = torch.rand(x.shape, generator=generator, device=x.device, dtype=x.dtype)
    gumbel = -torch.log(-torch.log(u.clamp_min(1e-20)))
    if isinstance(temperature, torch.Tensor):
        t = temperature.to(device=x.device, dtype=x.dtype)
        scale = torch.where(t < GREEDY_TEMPERATURE, torch.zeros_like(t), t)[:, None]
    else:
        scale = float(temperature)
    return torch.argmax(x + scale * gumbel, dim=-1)


def matmul_multinomial(hidden: torch.Tensor, weight: torch.Tensor, temperature: Temperature = 1.0, *,
                       has_greedy: Optional[bool] = None) -> torch.Tensor:
    """``F.linear(hidden, weight)`` (cuBLAS logits), then :func:`multinomial_from_logits`."""
    return multinomial_from_logits(F.linear(hidden, weight), temperature, has_greedy=has_greedy)


def matmul_gumbel_argmax(hidden: torch.Tensor, weight: torch.Tensor, temperature: Temperature = 1.0, *,
                         has_greedy: Optional[bool] = None) -> torch.Tensor:
    """``F.linear(hidden, weight)`` (cuBLAS logits), then :func:`gumbel_argmax_from_logits`.

    has_greedy is accepted for the same signature as :func:`matmul_multinomial`; the
    Gumbel form handles greedy rows without a branch.
    """
    return gumbel_argmax_from_logits(F.linear(hidden, weight), temperature)


# name -> fn(hidden, weight, temperature, *, has_greedy=None) -> tokens int64 [B]
MATERIALIZED_SAMPLERS: Dict[str, Callable[..., torch.Tensor]] = {
    "multinomial": matmul_multinomial,
    "gumbel": matmul_gumbel_argmax,
}


def compiled_sampler(name: str, *, dynamic: Optional[bool] = None) -> Callable[..., torch.Tensor]:
    """A new ``torch.compile`` of ``MATERIALIZED_SAMPLERS[name]`` (matmul and sampling in one graph).

    dynamic: passed to torch.compile (None: recompile with a dynamic batch dimension once a
    second batch size is seen; False: one compile per shape). The first call compiles.
    """
    if name not in MATERIALIZED_SAMPLERS:
        raise ValueError(f"unknown sampler {name!r}; one of {sorted(MATERIALIZED_SAMPLERS)}")
    return torch.compile(MATERIALIZED_SAMPLERS[name], dynamic=dynamic)


def reference_sample(hidden: torch.Tensor, weight: torch.Tensor, *,
                     temperature: Temperature = 1.0, vocab_size: Optional[int] = None,
                     generator: Optional[torch.Generator] = None, return_logprobs: bool = False,
                     logits_dtype=torch.float32) -> SampleOutput:
    """Materialize logits, softmax, multinomial; greedy rows take the argmax."""
    scaled, greedy = scale_logits(materialize_logits(hidden, weight, vocab_size, logits_dtype), temperature)
    probs = torch.softmax(scaled, dim=-1)
    tokens = torch.multinomial(probs, 1, generator=generator).squeeze(1)
    tokens = torch.where(greedy, scaled.argmax(dim=-1), tokens)
    if not return_logprobs:
        return SampleOutput(tokens)
    logp = torch.log_softmax(scaled, dim=-1)
    return SampleOutput(tokens, logp.gather(1, tokens[:, None]).squeeze(1).float(),
                        torch.logsumexp(scaled, dim=-1).float())


def reference_gumbel(hidden: torch.Tensor, weight: torch.Tensor, *,
                     temperature: Temperature = 1.0, seed=0, offset=0,
                     vocab_size: Optional[int] = None):
    """argmax(logits / T + fsdist's noise) in float64; returns (tokens, margin).

    margin is the gap between the best and second-best perturbed score: rows with a
    margin far above fp32 rounding must match the fused kernel exactly.
    """
    logits = materialize_logits(hidden, weight, vocab_size)
    B, V = logits.shape
    scaled, greedy = scale_logits(logits, temperature)
    ids = torch.arange(V, device=logits.device)[None, :]
    seeds = _as_rows(seed, B, torch.int64, logits.device)[:, None]
    offsets = _as_rows(offset, B, torch.int64, logits.device)[:, None]
    noise = vocab_gumbel(seeds, offsets, ids)
    score = torch.where(greedy[:, None], scaled, scaled + noise)
    top2 = score.topk(2, dim=-1).values if V > 1 else torch.cat([score, score - float("inf")], -1)
    return score.argmax(dim=-1), top2[:, 0] - top2[:, 1]


__all__ = ["GREEDY_TEMPERATURE", "MATERIALIZED_SAMPLERS", "compiled_sampler", "gumbel_argmax_from_logits",
           "materialize_logits", "matmul_gumbel_argmax", "matmul_multinomial", "multinomial_from_logits",
           "reference_gumbel", "reference_sample", "sample_from_logits", "scale_logits"]
