"""Logit processors as the kernels receive them: token bitmask, logit bias, penalties.

They come first in vLLM V1's order (docs/semantics.md)::

    raw logits -> token bitmask -> logit bias -> penalties  (= processed logits)
               -> / T -> min-p -> top-k -> top-p -> sample

and fsdist applies them inside stage 1, to each logits tile while it is still in
registers (``fsdist.ops.processors``), so the processed logits never exist in memory
either. Two shapes of work:

* The **token bitmask** is dense: xgrammar's int32 words (bit v % 32 of word v // 32 set =
  id v allowed), read BLOCK_V / 32 words per row and tile.
* **Bias and penalties** touch a few ids per row (tens to a few thousand of ~150k). They
  become one list of *entries* per row, ``id * 4 + kind`` (kind 0: a bias value, 1: an
  occurrence in output_ids, 2: an occurrence in prompt_ids), sorted, with the bias value
  beside each entry, built by one kernel (``fsdist.ops.prepare_processors``); a tile finds
  the entries of its own ids by a 16-ary search and visits only those, typically none or
  one. Sorting is stable, so repeated bias ids add up in the order given, on every path
  and rank alike.

Nothing here synchronises with the device. Values inside device tensors that the API
forbids (an id outside [-1, vocab_size), a NaN or infinite bias value, a repetition
penalty <= 0, a NaN or infinite penalty) mark their row bad: ``apply_to`` gives such a
row a NaN temperature, which every kernel treats as a poisoned row (token -1, NaN
logprob). ``check_values`` (``check=True``) raises instead, with a sync.
"""
import dataclasses
import numbers
from dataclasses import dataclass
from typing import Optional, Tuple

import torch

from .ops.prepare_processors import KIND_BIAS, KIND_OUTPUT, KIND_PROMPT, SENTINEL, launch_prepare, search_rounds
from .ops.step_check import processor_fingerprint
from . import validation
from .params import RowParams
from .types import Penalties, SparseLogits

MAX_IDS = 2**29  # entries hold id * 4 + kind in int32


@dataclass(frozen=True, eq=False)
class LogitProcessing:
    """A call's processors, ready for the kernels (see the module docstring).

    bitmask:   int32 [B, W] (W >= ceil(vocab_size / 32)) or None.
    entries:   int32 [B, S] sorted ``id * 4 + kind`` (SENTINEL pads), or None (no bias or
               penalty touches any id).
    values:    fp32 [B, S], the bias value of each entry (0 for occurrences).
    penalties: fp32 [3, B]: repetition, frequency, presence of each row.
    bad_rows:  bool [B], rows whose processor values are out of range, or None where no value can
               be (a bitmask alone: every int32 word is a valid mask).
    checks:    (argument, rule, tensor, predicate) per value rule, evaluated only by
               check_values (check=True), which names the argument.
    temperature: fp32 [B], the call's temperature with the bad rows' NaN, written by the preparation
               kernel when prepare_processing was given the temperature (else None: apply_to
               computes it).
    fingerprint: int64 [B], ``row_fingerprint(fingerprint_xor)`` written by the preparation kernel when
               prepare_processing was given ``fingerprint_xor`` and the call has entries (else None).
    """

    bitmask: Optional[torch.Tensor]
    entries: Optional[torch.Tensor]
    values: Optional[torch.Tensor]
    penalties: Optional[torch.Tensor]
    bad_rows: Optional[torch.Tensor]
    checks: Tuple = ()
    temperature: Optional[torch.Tensor] = None
    temperature_in: object = None  # the temperature ``temperature`` was made from (apply_to checks it)
    fingerprint: Optional[torch.Tensor] = None  # int64 [B]: row_fingerprint(fingerprint_xor), by the preparation kernel
    fingerprint_xor: object = None  # the xor ``fingerprint`` was made with (row_fingerprint checks it)

    @property
    def search_steps(self) -> int:
        """Rounds of the tiles' entry search (``ops.processors.lower_bounds``) for a row of entries."""
        return search_rounds(self.entries.shape[1]) if self.entries is not None else 0

    def apply_to(self, params: RowParams) -> RowParams:
        """params with bad rows poisoned: their temperature becomes NaN (a [B] tensor). Without
        values to check (bad_rows None) the temperature stays as it is: no launch."""
        if self.bad_rows is None:
            return RowParams(params.temperature, params.seed, params.offset, params.top_k, params.top_p, params.min_p,
                             params.fingerprint, self)
        if self.temperature is not None:  # poisoned by the preparation kernel already
            src = self.temperature_in
            if not (params.temperature is src or (not isinstance(src, torch.Tensor) and params.temperature == src)):
                raise ValueError("apply_to: params carry another temperature than the one these processors "
                                 "were prepared with")
            return RowParams(self.temperature, params.seed, params.offset, params.top_k, params.top_p, params.min_p,
                             params.fingerprint, self)
        t = params.temperature
        if not isinstance(t, torch.Tensor):
            t = torch.full(self.bad_rows.shape, float(t), dtype=torch.float32, device=self.bad_rows.device)
        t = torch.where(self.bad_rows, torch.full_like(t, float("nan")), t)
        return RowParams(t, params.seed, params.offset, params.top_k, params.top_p, params.min_p,
                         params.fingerprint, self)

    def row_fingerprint(self, xor=0):
        """int64 [B]: a cheap hash of each row's processor inputs, XOR ``xor`` (an int or int64 [B]: the
        filters' fingerprint), for the tensor-parallel call header (ranks that disagree on a bitmask word,
        an entry or a penalty are caught, up to sums that happen to agree). The preparation kernel's
        ``fingerprint`` where it was made with this ``xor`` (no launch), else one launch
        (``ops.step_check.processor_fingerprint``); ``xor`` itself when no processor is present."""
        if self.fingerprint is not None:
            src = self.fingerprint_xor
            if xor is src or (not isinstance(xor, torch.Tensor) and not isinstance(src, torch.Tensor) and xor == src):
                return self.fingerprint
        return processor_fingerprint(self.bitmask, self.entries, self.values, self.penalties, self.bad_rows, xor)


def has_entries(processing: Optional[LogitProcessing]) -> bool:
    """Whether a call's processing (None: no processors) carries logit bias / penalty entries, the
    sparse part that decides the tile and the path (a bitmask alone does not)."""
    return processing is not None and processing.entries is not None


def _ids_tensor(x, name: str, batch: int, device: torch.device) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be an int64 tensor [B, K] (-1 for an empty slot), got {type(x).__name__}")
    if x.dtype != torch.int64:
        raise TypeError(f"{name} must be int64, got {x.dtype}")
    if x.dim() != 2 or x.shape[0] != batch:
        raise ValueError(f"{name} must have shape [{batch}, K] (-1-padded), got {tuple(x.shape)}")
    if x.device != device:
        raise ValueError(f"{name} is on {x.device} but hidden is on {device}")
    # The kernels index ids as ptr + row * stride(0) + slot: a table whose slots are not adjacent (a transposed
    # or column-sliced view, a column expand) is copied first, or it would read other rows' ids or past its storage.
    return x if x.stride(1) == 1 or x.shape[1] <= 1 else x.contiguous()


def _penalty_row(x, name: str, batch: int, device: torch.device):
    """A [B] floating tensor (its values checked on the device) or a checked float."""
    if isinstance(x, torch.Tensor):
        if x.dim() != 1 or x.shape[0] != batch:
            raise ValueError(f"{name} tensor must have shape [{batch}] (one per row), got {tuple(x.shape)}")
        if x.device != device:
            raise ValueError(f"{name} is on {x.device} but hidden is on {device}")
        if not x.is_floating_point():
            raise TypeError(f"{name} tensor must be floating point, got {x.dtype}")
        return x if x.stride(0) == 1 else x.contiguous()
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise TypeError(f"{name} must be a real number or a [{batch}] tensor, got {type(x).__name__}")
    v = float(x)
    if v != v or v in (float("inf"), float("-inf")):
        raise ValueError(f"{name} must be finite, got {v}")
    if name.endswith("repetition") and v <= 0:
        raise ValueError(f"{name} must be > 0 (1 = off), got {v}")
    return v


def check_bitmask(token_bitmask, batch: int, vocab_size: int, device: torch.device) -> torch.Tensor:
    if not isinstance(token_bitmask, torch.Tensor):
        raise TypeError(f"token_bitmask must be an int32 tensor [B, ceil(vocab_size/32)], "
                        f"got {type(token_bitmask).__name__}")
    if token_bitmask.dtype != torch.int32:
        raise TypeError(f"token_bitmask must be int32 (xgrammar's layout), got {token_bitmask.dtype}")
    words = (vocab_size + 31) // 32
    if token_bitmask.dim() != 2 or token_bitmask.shape[0] != batch or token_bitmask.shape[1] < words:
        raise ValueError(f"token_bitmask must have shape [{batch}, {words}] (ceil(vocab_size / 32) words per "
                         f"row; more words are ignored), got {tuple(token_bitmask.shape)}")
    if token_bitmask.device != device:
        raise ValueError(f"token_bitmask is on {token_bitmask.device} but hidden is on {device}")
    return token_bitmask if token_bitmask.stride(1) == 1 else token_bitmask.contiguous()


def prepare_processing(token_bitmask=None, logit_bias=None, penalties=None, *, batch: int, vocab_size: int,
                       device: torch.device, temperature=None, fingerprint_xor=None) -> Optional[LogitProcessing]:
    """Validate shapes, dtypes and devices (never values in device tensors) and build the
    kernels' view of the processors; None when none is given. temperature (the call's validated
    temperature, a float or a [B] tensor): the preparation kernel also writes it with the bad rows
    poisoned (``LogitProcessing.temperature``, which ``apply_to`` then uses without a launch).
    fingerprint_xor (an int or int64 [B], the filters' fingerprint; None: not wanted): the preparation
    kernel also writes the processors' row fingerprint XOR it (``LogitProcessing.fingerprint``, which
    ``row_fingerprint`` then returns without a launch: the tensor-parallel header's hash)."""
    if token_bitmask is None and logit_bias is None and penalties is None:
        return None
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:  # "cuda" means the current device (tensors say cuda:N)
        device = torch.device("cuda", torch.cuda.current_device())
    if vocab_size >= MAX_IDS:
        raise ValueError(f"logit processors support vocabularies below {MAX_IDS} ids, got {vocab_size}")
    bitmask = None if token_bitmask is None else check_bitmask(token_bitmask, batch, vocab_size, device)
    checks = []
    bias_ids = bias_values = out = prompt = None

    def id_rule(name, ids):
        checks.append((name, f"hold ids in [0, vocab_size={vocab_size}) or -1", ids,
                       lambda t: ((t < -1) | (t >= vocab_size)).any(dim=1)))

    if logit_bias is not None:
        if isinstance(logit_bias, tuple) and not isinstance(logit_bias, SparseLogits) and len(logit_bias) == 2:
            logit_bias = SparseLogits(*logit_bias)
        if not isinstance(logit_bias, SparseLogits):
            raise TypeError(f"logit_bias must be fsdist.SparseLogits(ids, values), got {type(logit_bias).__name__}")
        bias_ids = _ids_tensor(logit_bias.ids, "logit_bias.ids", batch, device)
        v = logit_bias.values
        if not isinstance(v, torch.Tensor) or not v.is_floating_point():
            raise TypeError("logit_bias.values must be a floating tensor [B, K]"
                            + (f", got {v.dtype}" if isinstance(v, torch.Tensor) else f", got {type(v).__name__}"))
        if v.shape != bias_ids.shape:
            raise ValueError(f"logit_bias.values has shape {tuple(v.shape)} but logit_bias.ids has "
                             f"{tuple(bias_ids.shape)}: they must match")
        if v.device != device:
            raise ValueError(f"logit_bias.values is on {v.device} but hidden is on {device}")
        bias_values = v if v.stride(-1) == 1 or v.shape[1] <= 1 else v.contiguous()
        id_rule("logit_bias.ids", bias_ids)
        checks.append(("logit_bias.values", "be finite (use token_bitmask to forbid an id)", (bias_ids, v),
                       lambda t: ((t[0] >= 0) & ~torch.isfinite(t[1].float())).any(dim=1)))

    rep, freq, pres = 1.0, 0.0, 0.0
    if penalties is not None:
        if not isinstance(penalties, Penalties):
            raise TypeError(f"penalties must be fsdist.Penalties(...), got {type(penalties).__name__}")
        rep = _penalty_row(penalties.repetition, "penalties.repetition", batch, device)
        freq = _penalty_row(penalties.frequency, "penalties.frequency", batch, device)
        pres = _penalty_row(penalties.presence, "penalties.presence", batch, device)
        for name, x in (("repetition", rep), ("frequency", freq), ("presence", pres)):
            if isinstance(x, torch.Tensor):
                rule = "be finite and > 0 (1 = off)" if name == "repetition" else "be finite"
                checks.append((f"penalties.{name}", rule, x, (lambda t: ~torch.isfinite(t) | (t <= 0))
                               if name == "repetition" else (lambda t: ~torch.isfinite(t))))
        if penalties.output_ids is not None:
            out = _ids_tensor(penalties.output_ids, "penalties.output_ids", batch, device)
            id_rule("penalties.output_ids", out)
        if penalties.prompt_ids is not None:
            prompt = _ids_tensor(penalties.prompt_ids, "penalties.prompt_ids", batch, device)
            id_rule("penalties.prompt_ids", prompt)

    tables = [t for t in (bias_ids, out, prompt) if t is not None]
    entries = values = pen = temp_out = fp_out = None
    if tables and sum(t.shape[1] for t in tables) > 0:
        if temperature is not None:
            temp_out = torch.empty(batch, dtype=torch.float32, device=device)
        if fingerprint_xor is not None:
            fp_out = torch.empty(batch, dtype=torch.int64, device=device)
        entries, values, pen, bad = launch_prepare(batch, vocab_size, device, bias_ids=bias_ids,
                                                   bias_values=bias_values, output_ids=out, prompt_ids=prompt,
                                                   repetition=rep, frequency=freq, presence=pres,
                                                   penalties=penalties is not None, temperature=temperature,
                                                   temperature_out=temp_out, fingerprint_out=fp_out,
                                                   fingerprint_xor=fingerprint_xor if fp_out is not None else 0,
                                                   bitmask=bitmask)
    else:
        # No listed id: bias and penalties change nothing, but bad penalty values still poison
        # their rows (the same rule as with ids). A bitmask alone has nothing to check.
        bad = None
        for name, _, x, pred in checks:
            if name.startswith("penalties.") and not name.endswith("_ids"):
                bad = pred(x) if bad is None else bad | pred(x)
    return LogitProcessing(bitmask, entries, values, pen, bad, tuple(checks), temp_out,
                           temperature if temp_out is not None else None, fp_out,
                           fingerprint_xor if fp_out is not None else None)


def check_values(processing: Optional[LogitProcessing]) -> None:
    """Opt-in (``check=True``): raise ValueError on rows whose processor values are out of
    range, naming the argument (synchronises with the device)."""
    if processing is None:
        return
    for name, rule, x, pred in processing.checks:
        rows = pred(x)
        if bool(rows.any()):
            raise ValueError(f"{name} must {rule} in every row (bad rows: {rows.nonzero().flatten().tolist()[:8]})")




def prepare_call_rows(temperature, seed, offset, batch: int, device, *, top_k, top_p, min_p, token_bitmask,
                      logit_bias, penalties, vocab_size: int, wants_logprobs: bool, logprobs_mode: str,
                      check: bool, filters_fingerprint_of=None):
    """(RowParams, LogitProcessing or None) of one call, with the checks ``fsdist.sample`` and the
    tensor-parallel head both make: raw logprobs refuse the processors; ``check`` also validates
    the values inside device tensors (synchronises). filters_fingerprint_of (tensor-parallel calls): a
    function of the validated RowParams giving the call header's filter fingerprint (an int or int64 [B]);
    the returned params carry it, and the preparation kernel folds it into the processors' fingerprint
    (``prepare_processing``), so that ``row_fingerprint(params.fingerprint)`` costs no launch."""
    params = validation.row_params(temperature, seed, offset, batch, device, top_k=top_k, top_p=top_p, min_p=min_p)
    if filters_fingerprint_of is not None:
        params = dataclasses.replace(params, fingerprint=filters_fingerprint_of(params))
    processing = prepare_processing(token_bitmask, logit_bias, penalties, batch=batch, vocab_size=vocab_size,
                                    device=device, temperature=params.temperature,
                                    fingerprint_xor=None if filters_fingerprint_of is None else params.fingerprint)
    if processing is not None and logprobs_mode == "raw" and wants_logprobs:
        raise ValueError("logprobs_mode='raw' cannot be combined with token_bitmask / logit_bias / penalties "
                         "(raw logprobs need the unprocessed logits); use 'scaled' or 'processed'")
    if check:
        validation.check_row_values(params)
        check_values(processing)
    return params, processing


__all__ = ["KIND_BIAS", "KIND_OUTPUT", "KIND_PROMPT", "LogitProcessing", "SENTINEL", "check_bitmask",
           "check_values", "has_entries", "prepare_call_rows", "prepare_processing"]
