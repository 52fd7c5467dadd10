"""Serving-sampling semantics in float64: the oracle of fsdist's fused filters.

Everything here is materialized, plain torch, float64, and written for clarity, not speed.
It states, row by row, what a sampled token is distributed as once the serving
parameters (vLLM V1's processing order) are applied::

    raw logits [B, V]                    ids >= vocab_size (padding) are -inf from the start
      -> token bitmask                   disallowed ids -> -inf
      -> logit bias                      + values at the given ids
      -> penalties                       repetition (prompt U output), then frequency, presence
      = processed logits                 (process_logits)
      -> / temperature                   T < GREEDY_EPS: greedy row, T = 1, no filters below
      = scaled logits
      -> min-p                           keep p >= min_p * p_max
      -> top-k                           keep every id >= the k-th largest value (ties kept)
      -> top-p                           on the survivors, renormalised: keep an id when the
                                         mass of the ids strictly more likely is < top_p
      = filtered logits -> softmax       (filtered_distribution)

Every sampling parameter is a Python scalar (all rows) or a ``[B]`` tensor (per row). The
``docs/semantics.md`` page explains the order with a worked example, the off values, ties,
greedy rows, padding, rows without a distribution and the logprobs modes.

The logit processors (bitmask, bias, penalties) and their argument types ``SparseLogits``
and ``Penalties`` live in ``processors``; the argument checks in ``arguments``. This module
re-exports the processor names so that ``fsdist.reference.semantics`` is the one import a
reference user needs.

Rows without a distribution (every id disallowed or -inf, or a NaN / +inf among the raw
logits of ids < vocab_size) are reported, not raised: their probabilities and logprobs are
NaN, their sampled token and top-N ids are -1 (what fsdist's kernels return for them).
Bad arguments (shapes, dtypes, out-of-range ids or values, NaN parameters) raise
TypeError / ValueError naming the argument.
"""
import numbers
from typing import NamedTuple, Optional, Tuple

import torch

from ..types import Row
from .arguments import NEG_INF, check_logits, check_vocab_size, no_nan, row_param
from .processors import (Penalties, SparseLogits, allowed_from_bitmask, apply_bias, apply_bitmask,
                         apply_penalties, bitmask_from_allowed, bitmask_words)

# Re-exported: the processor names are part of this module's public face.
__all__ = ["GREEDY_EPS", "LOGPROBS_MODES", "MAX_TOP_LOGPROBS", "Penalties", "Row", "ServingSemantics",
           "SparseLogits", "allowed_from_bitmask", "bitmask_from_allowed", "bitmask_words",
           "filtered_distribution", "process_logits", "reference_filtered_sample", "reference_logprobs",
           "reference_top_logprobs", "serving_semantics"]

GREEDY_EPS = 1e-5
"""A row with temperature < GREEDY_EPS is greedy (vLLM's sampler epsilon, ``_SAMPLING_EPS``).
The comparison is made in the temperature's own dtype (float64 for a Python float)."""
# The largest temperature accepted (the spec's bound; fsdist.params.MAX_TEMPERATURE says the same).
MAX_TEMPERATURE = 1e30


MAX_TOP_LOGPROBS = 20
LOGPROBS_MODES = ("raw", "scaled", "processed")


class ServingSemantics(NamedTuple):
    """Every stage of :func:`serving_semantics`, all float64 [B, V] unless said otherwise.

    raw:       the input logits, ids >= vocab_size set to -inf.
    processed: after bitmask, logit bias and penalties.
    scaled:    processed / T (T = 1 for greedy rows).
    filtered:  scaled with the ids removed by min-p, top-k and top-p set to -inf
               (greedy rows: equal to scaled, the filters do not apply).
    probs:     the final distribution: softmax(filtered) for sampled rows, one-hot at the
               argmax for greedy rows, NaN for rows without a distribution.
    greedy:    bool [B], temperature < GREEDY_EPS.
    valid:     bool [B], the row has a distribution (see the module docstring).
    tokens:    int64 [B], the argmax of processed (lowest id on ties) for greedy rows,
               -1 for other rows (sampled rows are drawn by reference_filtered_sample).
    """

    raw: torch.Tensor
    processed: torch.Tensor
    scaled: torch.Tensor
    filtered: torch.Tensor
    probs: torch.Tensor
    greedy: torch.Tensor
    valid: torch.Tensor
    tokens: torch.Tensor


# ---------------------------------------------------------------------------------------------
# Stages
# ---------------------------------------------------------------------------------------------

def _first_argmax(x: torch.Tensor) -> torch.Tensor:
    """Row-wise argmax with ties going to the lowest id (x has no NaN)."""
    width = x.shape[1]
    ids = torch.arange(width, device=x.device).expand_as(x)
    at_max = x == x.max(dim=1, keepdim=True).values
    return torch.where(at_max, ids, torch.full_like(ids, width)).min(dim=1).values


def _top_p_keep(f: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """bool [B, V]: ids whose strictly-more-likely mass (renormalised over f's finite ids) is < top_p."""
    q = torch.softmax(f, dim=1)
    q_sorted, order = q.sort(dim=1, descending=True, stable=True)
    mass_before = torch.cumsum(q_sorted, dim=1) - q_sorted  # mass of the ids sorted before each one
    # Equal probabilities are tied: all of a tie group gets the mass before its first member,
    # i.e. the mass of the ids strictly more likely, whatever order the sort put them in.
    neg = (-q_sorted).contiguous()
    first_of_group = torch.searchsorted(neg, neg, side="left")
    strictly_above = mass_before.gather(1, first_of_group)
    keep_sorted = strictly_above < top_p[:, None]
    keep = torch.empty_like(keep_sorted).scatter_(1, order, keep_sorted)
    return keep | (top_p[:, None] >= 1.0)  # top_p = 1 is off, whatever the rounding of the sum


def serving_semantics(logits: torch.Tensor, *, temperature: Row = 1.0, top_k: Row = 0, top_p: Row = 1.0,
                      min_p: Row = 0.0, vocab_size: Optional[int] = None,
                      token_bitmask: Optional[torch.Tensor] = None,
                      logit_bias: Optional[SparseLogits] = None,
                      penalties: Optional[Penalties] = None) -> ServingSemantics:
    """Apply vLLM V1's processing order to `logits` [B, V] in float64; every stage comes back.

    temperature: >= 0, finite; < GREEDY_EPS (1e-5) makes the row greedy.
    top_k:       int >= 0; 0 or >= V is off.         top_p: in (0, 1]; 1 is off.
    min_p:       in [0, 1]; 0 is off.                vocab_size: ids >= it are never sampled.
    token_bitmask: int32 [B, ceil(vocab_size/32)] (or ceil(V/32)), xgrammar layout, bit set = allowed.
    logit_bias:  SparseLogits(ids [B, K] int64 -1-padded, values [B, K]).
    penalties:   Penalties(repetition, frequency, presence, output_ids, prompt_ids).
    """
    check_logits(logits)
    batch, width = logits.shape
    vocab_size = check_vocab_size(vocab_size, width)
    device = logits.device

    # Greedy is decided in the temperature's own precision, as vLLM and the kernels compare it:
    # a float32 temperature of 1e-5 is float32(1e-5), which is not < float32(1e-5).
    greedy_in = temperature < GREEDY_EPS if isinstance(temperature, torch.Tensor) else None
    temperature = row_param("temperature", temperature, batch, device)
    top_k = row_param("top_k", top_k, batch, device, integer=True)
    top_p = row_param("top_p", top_p, batch, device)
    min_p = row_param("min_p", min_p, batch, device)
    for name, value in (("temperature", temperature), ("top_p", top_p), ("min_p", min_p)):
        no_nan(name, value)
    if not bool(((temperature >= 0) & (temperature <= MAX_TEMPERATURE)).all()):
        raise ValueError(f"temperature must be in [0, {MAX_TEMPERATURE:g}] (< 1e-5 means greedy)")
    if bool((top_k < 0).any()):
        raise ValueError("top_k must be >= 0 (0 = off)")
    if bool(((top_p <= 0) | (top_p > 1)).any()):
        raise ValueError("top_p must be in (0, 1] (1 = off)")
    if bool(((min_p < 0) | (min_p > 1)).any()):
        raise ValueError("min_p must be in [0, 1] (0 = off)")

    raw = logits.detach().to(torch.float64).clone()
    raw[:, vocab_size:] = NEG_INF
    real = raw[:, :vocab_size]
    broken = torch.isnan(real).any(dim=1) | torch.isposinf(real).any(dim=1)

    processed = raw.clone()
    if token_bitmask is not None:
        apply_bitmask(processed, token_bitmask, vocab_size)
    if logit_bias is not None:
        apply_bias(processed, logit_bias, vocab_size)
    if penalties is not None:
        apply_penalties(processed, penalties, vocab_size)

    greedy = temperature < GREEDY_EPS if greedy_in is None else greedy_in.to(device).expand(batch)
    scaled = processed / torch.where(greedy, torch.ones_like(temperature), temperature)[:, None]
    usable = scaled.masked_fill(torch.isnan(scaled), NEG_INF)
    valid = ~broken & ~torch.isnan(scaled).any(dim=1) & ~torch.isposinf(scaled).any(dim=1) \
        & torch.isfinite(scaled).any(dim=1)
    # Rows without a distribution go through the filters as a harmless uniform row, then get NaN.
    safe = torch.where(valid[:, None], usable, torch.zeros_like(usable))
    safe[:, vocab_size:] = NEG_INF

    # min-p: p_i >= min_p * p_max  <=>  exp(s_i - s_max) >= min_p (no normalisation rounding).
    s_max = safe.max(dim=1, keepdim=True).values
    filtered = safe.masked_fill(torch.exp(safe - s_max) < min_p[:, None], NEG_INF)

    # top-k: keep every id whose value is >= the k-th largest (ties at the k-th value all stay).
    k_on = (top_k > 0) & (top_k < width)
    kth_index = (top_k.clamp(min=1, max=width) - 1)[:, None]
    kth = filtered.sort(dim=1, descending=True).values.gather(1, kth_index)
    filtered = filtered.masked_fill(k_on[:, None] & (filtered < kth), NEG_INF)

    # top-p on the survivors, renormalised.
    filtered = filtered.masked_fill(~_top_p_keep(filtered, top_p), NEG_INF)

    # Greedy rows skip the filters; their token is the argmax of the processed logits.
    filtered = torch.where(greedy[:, None], safe, filtered)
    tokens = torch.where(greedy & valid, _first_argmax(safe), torch.full((batch,), -1, device=device))
    probs = torch.softmax(filtered, dim=1)
    one_hot = torch.zeros_like(probs).scatter_(1, tokens.clamp(min=0)[:, None], 1.0)
    probs = torch.where(greedy[:, None], one_hot, probs)

    nan_rows = ~valid[:, None]
    nan = torch.full_like(probs, float("nan"))
    return ServingSemantics(
        raw=raw, processed=processed, scaled=scaled,
        filtered=torch.where(nan_rows, nan, filtered), probs=torch.where(nan_rows, nan, probs),
        greedy=greedy, valid=valid, tokens=tokens)


# ---------------------------------------------------------------------------------------------
# Public views of the stages
# ---------------------------------------------------------------------------------------------

def process_logits(logits: torch.Tensor, *, vocab_size: Optional[int] = None,
                   token_bitmask: Optional[torch.Tensor] = None, logit_bias: Optional[SparseLogits] = None,
                   penalties: Optional[Penalties] = None) -> torch.Tensor:
    """float64 [B, V]: logits after padding (-inf), bitmask (-inf), logit bias and penalties."""
    return serving_semantics(logits, vocab_size=vocab_size, token_bitmask=token_bitmask,
                             logit_bias=logit_bias, penalties=penalties).processed


def filtered_distribution(logits: torch.Tensor, **params) -> torch.Tensor:
    """float64 [B, V]: the final distribution (one-hot at the argmax for greedy rows, NaN rows
    where there is none). Keyword arguments: those of :func:`serving_semantics`."""
    return serving_semantics(logits, **params).probs


def _mode_logprobs(sem: ServingSemantics, mode: str) -> torch.Tensor:
    if mode not in LOGPROBS_MODES:
        raise ValueError(f"mode must be one of {LOGPROBS_MODES}, got {mode!r}")
    source = {"raw": sem.raw, "scaled": sem.scaled, "processed": sem.filtered}[mode]
    clean = torch.where(sem.valid[:, None], source, torch.zeros_like(source))
    logp = torch.log_softmax(clean, dim=1)  # padding ids are -inf in every source, so -inf here
    return torch.where(sem.valid[:, None], logp, torch.full_like(logp, float("nan")))


def reference_logprobs(logits: torch.Tensor, token_ids: torch.Tensor, *, mode: str = "scaled",
                       **params) -> torch.Tensor:
    """float64 logprobs of `token_ids` ([B] or [B, M] int64) under `mode`.

    mode "raw":       log_softmax(raw logits) over ids < vocab_size, before any processing;
         "scaled":    log_softmax(processed logits / T), before min-p/top-k/top-p (T = 1 for
                      greedy rows);
         "processed": log_softmax(filtered logits): the log of the final distribution for
                      sampled rows (-inf for filtered-out ids); for greedy rows, where no filter
                      applies, the same as "scaled" (what vLLM's processed_logprobs gives them).
    Ids >= vocab_size get -inf; an id of -1 (no token) and rows without a distribution get NaN.
    Other keyword arguments: those of :func:`serving_semantics`.
    """
    sem = serving_semantics(logits, **params)
    logp = _mode_logprobs(sem, mode)
    batch, width = logp.shape
    if not isinstance(token_ids, torch.Tensor) or token_ids.dtype != torch.int64:
        raise TypeError("token_ids must be an int64 tensor [B] or [B, M]")
    if token_ids.dim() not in (1, 2) or token_ids.shape[0] != batch:
        raise ValueError(f"token_ids must be [{batch}] or [{batch}, M], got shape {tuple(token_ids.shape)}")
    bad = (token_ids < -1) | (token_ids >= width)
    if bool(bad.any()):
        raise ValueError(f"token_ids holds {int(token_ids[bad][0])}, outside [-1, {width})")
    ids = token_ids.to(logp.device)
    flat = ids if ids.dim() == 2 else ids[:, None]
    picked = logp.gather(1, flat.clamp(min=0))
    picked = torch.where(flat < 0, torch.full_like(picked, float("nan")), picked)
    return picked if ids.dim() == 2 else picked[:, 0]


def reference_top_logprobs(logits: torch.Tensor, n: int, *, mode: str = "scaled",
                           **params) -> Tuple[torch.Tensor, torch.Tensor]:
    """The `n` (0..20) most likely ids under `mode` and their logprobs, most likely first.

    Ties go to the lower id first. In "processed" mode the ids the filters drop (-inf) come
    after the kept ones in the order of their logits (the kept ones are the largest logits,
    so this is simply the "scaled" order, with -inf values for the dropped ids).
    Returns (ids int64 [B, n], values float64 [B, n]). Rows without a distribution: ids -1,
    values NaN. `mode` and other keyword arguments: as in :func:`reference_logprobs`.
    """
    if isinstance(n, bool) or not isinstance(n, numbers.Integral):
        raise TypeError(f"n (top_logprobs) must be an int, got {type(n).__name__}")
    sem = serving_semantics(logits, **params)
    vocab_size = params.get("vocab_size") or logits.shape[1]
    if not 0 <= n <= min(MAX_TOP_LOGPROBS, vocab_size):
        raise ValueError(f"n (top_logprobs) must be in [0, {min(MAX_TOP_LOGPROBS, vocab_size)}], got {n}")
    logp = _mode_logprobs(sem, mode)
    order = {"raw": sem.raw, "scaled": sem.scaled, "processed": sem.scaled}[mode]
    order = torch.where(sem.valid[:, None], order, torch.zeros_like(order))
    ids = order.sort(dim=1, descending=True, stable=True).indices[:, :n]  # stable: equal logits keep id order
    values = logp.gather(1, ids)
    invalid = ~sem.valid[:, None]
    return (torch.where(invalid, torch.full_like(ids, -1), ids),
            torch.where(invalid, torch.full_like(values, float("nan")), values))


def reference_filtered_sample(logits: torch.Tensor, *, generator: Optional[torch.Generator] = None,
                              **params) -> torch.Tensor:
    """int64 [B]: one token per row from the final distribution (torch.multinomial in float64).

    Greedy rows take the argmax of the processed logits (lowest id on ties); rows without a
    distribution get -1. Other keyword arguments: those of :func:`serving_semantics`.
    """
    sem = serving_semantics(logits, **params)
    probs = torch.where(sem.valid[:, None], sem.probs, torch.ones_like(sem.probs))
    drawn = torch.multinomial(probs, 1, generator=generator)[:, 0]
    tokens = torch.where(sem.greedy, sem.tokens, drawn)
    return torch.where(sem.valid, tokens, torch.full_like(tokens, -1))
