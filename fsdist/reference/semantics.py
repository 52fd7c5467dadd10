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

``SparseLogits`` and ``Penalties`` are defined here for now (this module imports nothing but
torch); fsdist's top level will export the same names.

Rows without a distribution (every id disallowed or -inf, or a NaN / +inf among the raw
logits of ids < vocab_size) are reported, not raised: their probabilities and logprobs are
NaN, their sampled token and top-N ids are -1 (what fsdist's kernels return for them).
Bad arguments (shapes, dtypes, out-of-range ids or values, NaN parameters) raise
TypeError / ValueError naming the argument.
"""
import numbers
from typing import NamedTuple, Optional, Tuple, Union

import torch

GREEDY_EPS = 1e-5
"""A row with temperature < GREEDY_EPS is greedy (vLLM's sampler epsilon, ``_SAMPLING_EPS``).
The comparison is made in the temperature's own dtype (float64 for a Python float)."""

MAX_TOP_LOGPROBS = 20
LOGPROBS_MODES = ("raw", "scaled", "processed")

Row = Union[float, int, torch.Tensor]
_NEG_INF = float("-inf")


class SparseLogits(NamedTuple):
    """A few (id, value) pairs per row: the logit bias.

    ids:    int64 [B, K]; -1 marks an empty slot. An id listed twice in a row gets both values.
    values: floating [B, K] (fp32 in fsdist); added to the logits of those ids.
    """

    ids: torch.Tensor
    values: torch.Tensor


class Penalties(NamedTuple):
    """OpenAI/vLLM-style penalties.

    repetition: > 0, scalar or [B]; 1 = off. For ids in prompt U output a positive logit
                is divided by it, a zero or negative one multiplied by it.
    frequency:  scalar or [B]; 0 = off. Subtracted once per occurrence in output_ids.
    presence:   scalar or [B]; 0 = off. Subtracted once if the id occurs in output_ids.
    output_ids: int64 [B, L], -1-padded, or None; duplicates count several times.
    prompt_ids: int64 [B, P], -1-padded, or None; only the repetition penalty reads it.
    """

    repetition: Row = 1.0
    frequency: Row = 0.0
    presence: Row = 0.0
    output_ids: Optional[torch.Tensor] = None
    prompt_ids: Optional[torch.Tensor] = None


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
# Token bitmask (xgrammar layout)
# ---------------------------------------------------------------------------------------------

def bitmask_words(vocab_size: int) -> int:
    """Number of int32 words of a bitmask row covering `vocab_size` ids: ceil(vocab_size / 32)."""
    return (int(vocab_size) + 31) // 32


def bitmask_from_allowed(allowed: torch.Tensor) -> torch.Tensor:
    """int32 [B, ceil(V/32)] bitmask from a bool [B, V] allowed mask.

    Bit v % 32 of word v // 32 is set when id v is allowed; bits past V are clear.
    """
    if not isinstance(allowed, torch.Tensor) or allowed.dtype != torch.bool or allowed.dim() != 2:
        raise TypeError("allowed must be a 2-D bool tensor [B, V]"
                        + (f", got {allowed.dtype} of shape {tuple(allowed.shape)}"
                           if isinstance(allowed, torch.Tensor) else f", got {type(allowed).__name__}"))
    batch, vocab = allowed.shape
    words = bitmask_words(vocab)
    bits = torch.zeros(batch, words * 32, dtype=torch.int64, device=allowed.device)
    bits[:, :vocab] = allowed.to(torch.int64)
    weights = torch.ones(32, dtype=torch.int64, device=allowed.device) << torch.arange(
        32, dtype=torch.int64, device=allowed.device)
    unsigned = (bits.view(batch, words, 32) * weights).sum(dim=-1)  # each in [0, 2**32)
    signed = torch.where(unsigned >= 2**31, unsigned - 2**32, unsigned)  # two's complement
    return signed.to(torch.int32)


def allowed_from_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """bool [B, vocab_size] allowed mask from an int32 [B, W] bitmask, W >= ceil(vocab_size/32)."""
    if not isinstance(bitmask, torch.Tensor) or bitmask.dtype != torch.int32 or bitmask.dim() != 2:
        raise TypeError("token_bitmask must be a 2-D int32 tensor [B, ceil(vocab_size/32)]"
                        + (f", got {bitmask.dtype} of shape {tuple(bitmask.shape)}"
                           if isinstance(bitmask, torch.Tensor) else f", got {type(bitmask).__name__}"))
    if bitmask.shape[1] < bitmask_words(vocab_size):
        raise ValueError(f"token_bitmask has {bitmask.shape[1]} words per row, fewer than the "
                         f"{bitmask_words(vocab_size)} that vocab_size={vocab_size} needs")
    shifts = torch.arange(32, dtype=torch.int64, device=bitmask.device)
    # int32 -> int64 sign-extends, which leaves the low 32 bits (the ones we read) unchanged.
    bits = (bitmask.to(torch.int64)[:, :, None] >> shifts) & 1
    return bits.reshape(bitmask.shape[0], -1)[:, :vocab_size].bool()


# ---------------------------------------------------------------------------------------------
# Argument checks
# ---------------------------------------------------------------------------------------------

def _row(name: str, value, batch: int, device, integer: bool = False) -> torch.Tensor:
    """A scalar or [B] tensor parameter as a [B] tensor (int64 or float64) on `device`."""
    if isinstance(value, torch.Tensor):
        if value.dim() != 0 and tuple(value.shape) != (batch,):
            raise ValueError(f"{name} must be a scalar or a [{batch}] tensor, got shape {tuple(value.shape)}")
        if integer and (value.dtype == torch.bool or value.is_floating_point() or value.is_complex()):
            raise TypeError(f"{name} must hold integers, got {value.dtype}")
        if not integer and (value.dtype == torch.bool or value.is_complex()):
            raise TypeError(f"{name} must hold real numbers, got {value.dtype}")
        out = value.to(device=device, dtype=torch.int64 if integer else torch.float64)
        return out.expand(batch) if out.dim() == 0 else out
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number or a [{batch}] tensor, got {type(value).__name__}")
    if integer and not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    return torch.full((batch,), value, dtype=torch.int64 if integer else torch.float64, device=device)


def _no_nan(name: str, x: torch.Tensor):
    if x.is_floating_point() and bool(torch.isnan(x).any()):
        raise ValueError(f"{name} must not be NaN")


def _ids(name: str, ids, batch: int, vocab_size: int, device) -> torch.Tensor:
    """A [B, K] int64 id tensor, -1 for empty slots, each id in [0, vocab_size)."""
    if not isinstance(ids, torch.Tensor):
        raise TypeError(f"{name} must be an int64 tensor [B, K], got {type(ids).__name__}")
    if ids.dtype != torch.int64:
        raise TypeError(f"{name} must be int64, got {ids.dtype}")
    if ids.dim() != 2 or ids.shape[0] != batch:
        raise ValueError(f"{name} must be [{batch}, K] (-1-padded), got shape {tuple(ids.shape)}")
    bad = (ids < -1) | (ids >= vocab_size)
    if bool(bad.any()):
        raise ValueError(f"{name} holds id {int(ids[bad][0])} outside [0, vocab_size={vocab_size}) "
                         "(use -1 for an empty slot)")
    return ids.to(device)


def _check_logits(logits) -> None:
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"logits must be a torch.Tensor, got {type(logits).__name__}")
    if logits.dim() != 2:
        raise ValueError(f"logits must be 2-D [B, V], got shape {tuple(logits.shape)}")
    if not logits.is_floating_point():
        raise TypeError(f"logits must be a floating tensor, got {logits.dtype}")
    if logits.shape[1] < 1:
        raise ValueError("logits must have at least one column")


def _check_vocab_size(vocab_size, width: int) -> int:
    if vocab_size is None:
        return width
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, numbers.Integral):
        raise TypeError(f"vocab_size must be an int, got {type(vocab_size).__name__}")
    if not 1 <= vocab_size <= width:
        raise ValueError(f"vocab_size must be in [1, {width}] (the logits width), got {vocab_size}")
    return int(vocab_size)


# ---------------------------------------------------------------------------------------------
# Stages
# ---------------------------------------------------------------------------------------------

def _apply_bitmask(x: torch.Tensor, token_bitmask, vocab_size: int) -> None:
    batch, width = x.shape
    if not isinstance(token_bitmask, torch.Tensor):
        raise TypeError(f"token_bitmask must be an int32 tensor, got {type(token_bitmask).__name__}")
    if token_bitmask.dtype != torch.int32:
        raise TypeError(f"token_bitmask must be int32 (xgrammar layout), got {token_bitmask.dtype}")
    words = {bitmask_words(vocab_size), bitmask_words(width)}
    if token_bitmask.dim() != 2 or token_bitmask.shape[0] != batch or token_bitmask.shape[1] not in words:
        want = " or ".join(f"[{batch}, {w}]" for w in sorted(words))
        raise ValueError(f"token_bitmask must be {want} (ceil(vocab_size/32) words per row), "
                         f"got shape {tuple(token_bitmask.shape)}")
    allowed = allowed_from_bitmask(token_bitmask.to(x.device), vocab_size)
    x[:, :vocab_size].masked_fill_(~allowed, _NEG_INF)


def _apply_bias(x: torch.Tensor, logit_bias, vocab_size: int) -> None:
    batch = x.shape[0]
    if not isinstance(logit_bias, SparseLogits):
        if isinstance(logit_bias, tuple) and len(logit_bias) == 2:
            logit_bias = SparseLogits(*logit_bias)
        else:
            raise TypeError(f"logit_bias must be a SparseLogits(ids, values), got {type(logit_bias).__name__}")
    ids = _ids("logit_bias.ids", logit_bias.ids, batch, vocab_size, x.device)
    values = logit_bias.values
    if not isinstance(values, torch.Tensor) or not values.is_floating_point():
        raise TypeError("logit_bias.values must be a floating tensor [B, K]"
                        + (f", got {values.dtype}" if isinstance(values, torch.Tensor) else ""))
    if tuple(values.shape) != tuple(ids.shape):
        raise ValueError(f"logit_bias.values has shape {tuple(values.shape)}, logit_bias.ids "
                         f"has {tuple(ids.shape)}: they must match")
    used = ids >= 0
    values = values.to(device=x.device, dtype=torch.float64)
    if not bool(torch.isfinite(values[used]).all()):
        raise ValueError("logit_bias.values must be finite (use token_bitmask to forbid an id)")
    rows = torch.arange(batch, device=x.device)[:, None].expand_as(ids)
    # A masked (-inf) id stays -inf: -inf + finite = -inf.
    x.index_put_((rows[used], ids[used]), values[used], accumulate=True)


def _apply_penalties(x: torch.Tensor, penalties, vocab_size: int) -> None:
    batch = x.shape[0]
    if not isinstance(penalties, Penalties):
        raise TypeError(f"penalties must be a Penalties(...), got {type(penalties).__name__}")
    rep = _row("penalties.repetition", penalties.repetition, batch, x.device)
    freq = _row("penalties.frequency", penalties.frequency, batch, x.device)
    pres = _row("penalties.presence", penalties.presence, batch, x.device)
    for name, value in (("repetition", rep), ("frequency", freq), ("presence", pres)):
        if not bool(torch.isfinite(value).all()):
            raise ValueError(f"penalties.{name} must be finite (not NaN or inf)")
    if bool((rep <= 0).any()):
        raise ValueError("penalties.repetition must be > 0 (1 = off)")

    def occurrences(name, ids):
        """int64 [B, vocab_size]: how many times each id occurs in `ids` (-1 slots ignored)."""
        counts = torch.zeros(batch, vocab_size + 1, dtype=torch.int64, device=x.device)
        if ids is None:
            return counts[:, :vocab_size]
        ids = _ids(name, ids, batch, vocab_size, x.device)
        slot = torch.where(ids < 0, torch.full_like(ids, vocab_size), ids)  # -1 -> a spare column
        counts.scatter_add_(1, slot, torch.ones_like(slot))
        return counts[:, :vocab_size]

    out_count = occurrences("penalties.output_ids", penalties.output_ids)
    in_prompt = occurrences("penalties.prompt_ids", penalties.prompt_ids) > 0
    in_output = out_count > 0
    v = x[:, :vocab_size]
    r = rep[:, None]
    # vLLM's rule: strictly positive logits are divided, all others (0, negative, -inf) multiplied.
    repeated = torch.where(v > 0, v / r, v * r)
    v = torch.where(in_prompt | in_output, repeated, v)
    v = v - freq[:, None] * out_count.to(torch.float64) - pres[:, None] * in_output.to(torch.float64)
    x[:, :vocab_size] = v


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
    _check_logits(logits)
    batch, width = logits.shape
    vocab_size = _check_vocab_size(vocab_size, width)
    device = logits.device

    # Greedy is decided in the temperature's own precision, as vLLM and the kernels compare it:
    # a float32 temperature of 1e-5 is float32(1e-5), which is not < float32(1e-5).
    greedy_in = temperature < GREEDY_EPS if isinstance(temperature, torch.Tensor) else None
    temperature = _row("temperature", temperature, batch, device)
    top_k = _row("top_k", top_k, batch, device, integer=True)
    top_p = _row("top_p", top_p, batch, device)
    min_p = _row("min_p", min_p, batch, device)
    for name, value in (("temperature", temperature), ("top_p", top_p), ("min_p", min_p)):
        _no_nan(name, value)
    if bool((temperature < 0).any()) or not bool(torch.isfinite(temperature).all()):
        raise ValueError("temperature must be finite and >= 0 (< 1e-5 means greedy)")
    if bool((top_k < 0).any()):
        raise ValueError("top_k must be >= 0 (0 = off)")
    if bool(((top_p <= 0) | (top_p > 1)).any()):
        raise ValueError("top_p must be in (0, 1] (1 = off)")
    if bool(((min_p < 0) | (min_p > 1)).any()):
        raise ValueError("min_p must be in [0, 1] (0 = off)")

    raw = logits.detach().to(torch.float64).clone()
    raw[:, vocab_size:] = _NEG_INF
    real = raw[:, :vocab_size]
    broken = torch.isnan(real).any(dim=1) | torch.isposinf(real).any(dim=1)

    processed = raw.clone()
    if token_bitmask is not None:
        _apply_bitmask(processed, token_bitmask, vocab_size)
    if logit_bias is not None:
        _apply_bias(processed, logit_bias, vocab_size)
    if penalties is not None:
        _apply_penalties(processed, penalties, vocab_size)

    greedy = temperature < GREEDY_EPS if greedy_in is None else greedy_in.to(device).expand(batch)
    scaled = processed / torch.where(greedy, torch.ones_like(temperature), temperature)[:, None]
    usable = scaled.masked_fill(torch.isnan(scaled), _NEG_INF)
    valid = ~broken & ~torch.isnan(scaled).any(dim=1) & ~torch.isposinf(scaled).any(dim=1) \
        & torch.isfinite(scaled).any(dim=1)
    # Rows without a distribution go through the filters as a harmless uniform row, then get NaN.
    safe = torch.where(valid[:, None], usable, torch.zeros_like(usable))
    safe[:, vocab_size:] = _NEG_INF

    # min-p: p_i >= min_p * p_max  <=>  exp(s_i - s_max) >= min_p (no normalisation rounding).
    s_max = safe.max(dim=1, keepdim=True).values
    filtered = safe.masked_fill(torch.exp(safe - s_max) < min_p[:, None], _NEG_INF)

    # top-k: keep every id whose value is >= the k-th largest (ties at the k-th value all stay).
    k_on = (top_k > 0) & (top_k < width)
    kth_index = (top_k.clamp(min=1, max=width) - 1)[:, None]
    kth = filtered.sort(dim=1, descending=True).values.gather(1, kth_index)
    filtered = filtered.masked_fill(k_on[:, None] & (filtered < kth), _NEG_INF)

    # top-p on the survivors, renormalised.
    filtered = filtered.masked_fill(~_top_p_keep(filtered, top_p), _NEG_INF)

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
