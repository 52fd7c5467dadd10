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

Filtered baselines (top-k / top-p / min-p), the sort-based way vLLM V1's torch sampler
filters materialized logits, each parameter a number or a ``[B]`` tensor:

* ``top_k_top_p_filter``: sort each row ascending, set everything below the k-th largest
  value to -inf (ties at the k-th value stay), softmax + cumulative sum of the sorted
  row, drop the ids whose cumulative mass (least likely first) is <= 1 - top_p (the most
  likely id always stays), scatter the sorted row back to vocabulary order.
* ``min_p_filter``: softmax, drop the ids with p < min_p * p_max.
* ``exponential_race``: the draw, argmax(softmax(x) / E) with E ~ Exp(1) i.i.d. per id
  (the same distribution as multinomial; no host synchronisation).
* ``top_k_top_p_from_logits`` / ``min_p_from_logits``: logits / T (greedy rows: argmax,
  as ``sample_from_logits``), filter, draw; ``matmul_top_k_top_p`` / ``matmul_min_p``
  put ``F.linear`` in front. ``FILTERED_SAMPLERS`` names them and ``compiled_sampler``
  compiles them too. Their kept sets are the reference's (``semantics.filtered_distribution``)
  away from exact ties: on a tie at the top-p boundary the sort decides which tied ids stay
  (see docs/semantics.md, "How this differs from vLLM on ties").

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


# the most bytes of the weight that materialize_logits converts to a wider dtype at once
MATERIALIZE_BLOCK_BYTES = 256 * 2**20


def materialize_logits(hidden: torch.Tensor, weight: torch.Tensor, vocab_size: Optional[int] = None,
                       dtype=torch.float64) -> torch.Tensor:
    """[B, V] logits in `dtype`, ids >= vocab_size set to -inf.

    The weight [V, D] is converted to `dtype` a block of vocabulary rows at a time (at most
    ``MATERIALIZE_BLOCK_BYTES`` each), never whole: a float64 copy of a 151936 x 4096 weight
    would take 5 GB beside the [B, V] result, which is what a test oracle may hold.
    """
    h = hidden.to(dtype)
    rows = weight.shape[0]
    if weight.dtype == dtype:
        logits = h @ weight.T
    else:
        block = max(1, MATERIALIZE_BLOCK_BYTES // max(1, weight.shape[1] * h.element_size()))
        logits = torch.empty(h.shape[0], rows, dtype=dtype, device=h.device)
        for start in range(0, rows, block):
            logits[:, start:start + block] = h @ weight[start:start + block].to(dtype).T
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


# --------------------------------------------------------------------------- filtered baselines
Filter = Union[int, float, torch.Tensor]
_NEG_INF = float("-inf")


def top_k_top_p_filter(scaled: torch.Tensor, top_k: Filter = 0, top_p: Filter = 1.0, *,
                       cumsum: Optional[Callable[[torch.Tensor], torch.Tensor]] = None) -> torch.Tensor:
    """A new [B, V] tensor: `scaled` (logits / T) with the ids top-k, then top-p, drop set to -inf.

    top_k: int or [B] integer tensor, 0 or >= V = off; every id >= the k-th largest value
    stays (ties at the k-th value too). top_p: float or [B] tensor in (0, 1], 1 = off;
    computed on the survivors of top-k, renormalised. Sort-based, the way vLLM V1's torch
    sampler does it: one ascending sort per row, the k-th largest read at column V - k,
    softmax and cumulative sum of the sorted row (least likely first), an id dropped when
    the mass up to and including it is <= 1 - top_p (never the last, most likely one),
    then the sorted row scattered back to vocabulary order. cumsum: the row scan (default
    ``torch.cumsum`` along the row; see ``eager_row_cumsum``).
    """
    batch, vocab = scaled.shape
    k = _as_rows(top_k, batch, torch.int64, scaled.device)
    p = _as_rows(top_p, batch, scaled.dtype, scaled.device)
    asc, order = scaled.sort(dim=-1)
    k = torch.where((k > 0) & (k < vocab), k, torch.full_like(k, vocab))  # off: the k-th largest is the minimum
    kth = asc.gather(1, (vocab - k)[:, None])
    asc = asc.masked_fill(asc < kth, _NEG_INF)
    probs = asc.softmax(dim=-1)
    mass_up_to = probs.cumsum(dim=-1) if cumsum is None else cumsum(probs)
    drop = mass_up_to <= (1.0 - p)[:, None]
    last = torch.arange(vocab, device=scaled.device)[None, :] == vocab - 1
    asc = asc.masked_fill(drop & ~last, _NEG_INF)
    return torch.empty_like(asc).scatter_(1, order, asc)


def min_p_filter(scaled: torch.Tensor, min_p: Filter = 0.0) -> torch.Tensor:
    """A new [B, V] tensor: `scaled` with the ids whose probability is < min_p * p_max set to -inf.

    min_p: float or [B] tensor in [0, 1], 0 = off. Probabilities in the dtype of `scaled`
    (float32 here, as vLLM computes them).
    """
    m = _as_rows(min_p, scaled.shape[0], scaled.dtype, scaled.device)
    probs = scaled.softmax(dim=-1)
    return scaled.masked_fill(probs < m[:, None] * probs.amax(dim=-1, keepdim=True), _NEG_INF)


def exponential_race(filtered: torch.Tensor, generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """Tokens int64 [B] drawn from softmax(filtered): argmax over ids of p / E, E ~ Exp(1) i.i.d.

    The winner of the race is id v with probability p_v (the exponential-clock form of a
    categorical draw, as vLLM samples); ids at -inf have p = 0 and never win. No host
    synchronisation (unlike torch.multinomial). E is clamped away from 0 so that 0 / 0
    can never produce a NaN.
    """
    probs = filtered.softmax(dim=-1)
    if generator is None:
        clocks = torch.empty_like(probs).exponential_()
    else:
        clocks = torch.empty_like(probs).exponential_(generator=generator)
    return (probs / clocks.clamp_min(1e-30)).argmax(dim=-1)


def top_k_top_p_from_logits(logits: torch.Tensor, temperature: Temperature = 1.0, top_k: Filter = 0,
                            top_p: Filter = 1.0, *, has_greedy: Optional[bool] = None,
                            generator: Optional[torch.Generator] = None,
                            cumsum: Optional[Callable[[torch.Tensor], torch.Tensor]] = None) -> torch.Tensor:
    """Tokens int64 [B]: fp32 logits / T, :func:`top_k_top_p_filter`, :func:`exponential_race`;
    greedy rows (T < 1e-5) take the argmax (the filters never remove it). has_greedy: as in
    :func:`sample_from_logits`; cumsum: as in :func:`top_k_top_p_filter`."""
    def draw(scaled):
        return exponential_race(top_k_top_p_filter(scaled, top_k, top_p, cumsum=cumsum), generator)

    return sample_from_logits(logits, temperature, draw, has_greedy=has_greedy)


def min_p_from_logits(logits: torch.Tensor, temperature: Temperature = 1.0, min_p: Filter = 0.0, *,
                      has_greedy: Optional[bool] = None, generator: Optional[torch.Generator] = None
                      ) -> torch.Tensor:
    """Tokens int64 [B]: fp32 logits / T, :func:`min_p_filter`, :func:`exponential_race`
    (greedy rows: the argmax)."""
    def draw(scaled):
        return exponential_race(min_p_filter(scaled, min_p), generator)

    return sample_from_logits(logits, temperature, draw, has_greedy=has_greedy)


def matmul_top_k_top_p(hidden: torch.Tensor, weight: torch.Tensor, temperature: Temperature = 1.0, *,
                       top_k: Filter = 0, top_p: Filter = 1.0, has_greedy: Optional[bool] = None) -> torch.Tensor:
    """``F.linear(hidden, weight)`` (cuBLAS logits), then :func:`top_k_top_p_from_logits`."""
    return top_k_top_p_from_logits(F.linear(hidden, weight), temperature, top_k, top_p, has_greedy=has_greedy)


@torch.compiler.disable
def eager_row_cumsum(x: torch.Tensor) -> torch.Tensor:
    """``x.cumsum(dim=-1)`` kept out of any ``torch.compile`` graph (a graph break: the scan runs
    as the eager CUDA kernel). Torch 2.11's Inductor fails to generate its split scan over a
    150k-wide row at B >= 16 ("list indices must be integers or slices, not NoneType", on an
    H100, 2026-11-24); with this the rest of the sampler still compiles."""
    return x.cumsum(dim=-1)


def matmul_top_k_top_p_eager_scan(hidden: torch.Tensor, weight: torch.Tensor, temperature: Temperature = 1.0, *,
                                  top_k: Filter = 0, top_p: Filter = 1.0, has_greedy: Optional[bool] = None
                                  ) -> torch.Tensor:
    """:func:`matmul_top_k_top_p` with the top-p scan outside the compiled graph (``eager_row_cumsum``)."""
    return top_k_top_p_from_logits(F.linear(hidden, weight), temperature, top_k, top_p, has_greedy=has_greedy,
                                   cumsum=eager_row_cumsum)


def matmul_min_p(hidden: torch.Tensor, weight: torch.Tensor, temperature: Temperature = 1.0, *,
                 min_p: Filter = 0.0, has_greedy: Optional[bool] = None) -> torch.Tensor:
    """``F.linear(hidden, weight)`` (cuBLAS logits), then :func:`min_p_from_logits`."""
    return min_p_from_logits(F.linear(hidden, weight), temperature, min_p, has_greedy=has_greedy)


# name -> fn(hidden, weight, temperature, *, <its filters as keywords>, has_greedy=None) -> tokens int64 [B]
FILTERED_SAMPLERS: Dict[str, Callable[..., torch.Tensor]] = {
    "top_k_top_p": matmul_top_k_top_p,
    "top_k_top_p_eager_scan": matmul_top_k_top_p_eager_scan,
    "min_p": matmul_min_p,
}


def compiled_sampler(name: str, *, dynamic: Optional[bool] = None) -> Callable[..., torch.Tensor]:
    """A new ``torch.compile`` of ``MATERIALIZED_SAMPLERS[name]`` or ``FILTERED_SAMPLERS[name]``
    (matmul and sampling in one graph).

    dynamic: passed to torch.compile (None: recompile with a dynamic batch dimension once a
    second batch size is seen; False: one compile per shape). The first call compiles.
    """
    table = {**MATERIALIZED_SAMPLERS, **FILTERED_SAMPLERS}
    if name not in table:
        raise ValueError(f"unknown sampler {name!r}; one of {sorted(table)}")
    return torch.compile(table[name], dynamic=dynamic)


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


# the most bytes of one [B, block] float64 tensor in reference_gumbel: its noise, logits and scores are made a block of
# vocabulary ids at a time, since the noise's Philox rounds hold several int64 tensors of the block's size at once
REFERENCE_BLOCK_BYTES = 64 * 2**20


def reference_gumbel(hidden: torch.Tensor, weight: torch.Tensor, *,
                     temperature: Temperature = 1.0, seed=0, offset=0,
                     vocab_size: Optional[int] = None):
    """argmax(logits / T + fsdist's noise) in float64; returns (tokens, margin).

    margin is the gap between the best and second-best perturbed score: rows with a
    margin far above fp32 rounding must match the fused kernel exactly. Computed a block
    of vocabulary ids at a time (``REFERENCE_BLOCK_BYTES``) with one pass's argmax rule (on
    equal scores the lowest id wins); the margin equals one pass's up to float64 rounding of
    the logits (BLAS may sum a block's dot products in another order), exactly when they are
    exact (e.g. bf16 inputs, small D)."""
    B, V = hidden.shape[0], weight.shape[0]
    device = hidden.device
    seeds = _as_rows(seed, B, torch.int64, device)[:, None]
    offsets = _as_rows(offset, B, torch.int64, device)[:, None]
    neg_inf = torch.full((B,), float("-inf"), dtype=torch.float64, device=device)
    best, second = neg_inf, neg_inf
    tokens = torch.zeros(B, dtype=torch.int64, device=device)
    h = hidden.to(torch.float64)  # (once, not once a block)
    step = max(1, REFERENCE_BLOCK_BYTES // (8 * max(1, B)))
    for start in range(0, V, step):
        stop = min(V, start + step)
        # the block's ids from vocab_size on at -inf: materialize_logits' mask, counted from the block's first id
        logits = materialize_logits(h, weight[start:stop], None if vocab_size is None else max(0, vocab_size - start))
        scaled, greedy = scale_logits(logits, temperature)
        ids = torch.arange(start, stop, device=device)[None, :]
        score = torch.where(greedy[:, None], scaled, scaled + vocab_gumbel(seeds, offsets, ids))
        block_best, block_id = score.max(dim=-1)
        # strictly greater: an earlier block's id keeps a tie (NaN never replaces a number: not a case fsdist defines)
        tokens = torch.where(block_best > best, block_id + start, tokens) if start else block_id
        top = torch.cat([best[:, None], second[:, None], score.topk(min(2, stop - start), dim=-1).values], -1)
        best, second = top.topk(2, dim=-1).values.unbind(-1)
    return tokens, best - second


__all__ = ["FILTERED_SAMPLERS", "GREEDY_TEMPERATURE", "MATERIALIZED_SAMPLERS", "compiled_sampler",
           "exponential_race", "gumbel_argmax_from_logits", "materialize_logits", "matmul_gumbel_argmax",
           "matmul_min_p", "matmul_multinomial", "matmul_top_k_top_p", "min_p_filter", "min_p_from_logits",
           "multinomial_from_logits", "reference_gumbel", "reference_sample", "sample_from_logits", "scale_logits",
           "top_k_top_p_filter", "top_k_top_p_from_logits"]
