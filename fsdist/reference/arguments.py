"""Argument checks shared by the float64 reference (``semantics`` and ``processors``).

Every check raises TypeError / ValueError naming the argument. These run on the reference's
own (materialized, host-synchronizing) path only; fsdist's kernels validate in
``fsdist.validation``.
"""
import numbers

import torch


NEG_INF = float("-inf")



def row_param(name: str, value, batch: int, device, integer: bool = False) -> torch.Tensor:
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


def no_nan(name: str, x: torch.Tensor):
    if x.is_floating_point() and bool(torch.isnan(x).any()):
        raise ValueError(f"{name} must not be NaN")


def id_table(name: str, ids, batch: int, vocab_size: int, device) -> torch.Tensor:
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


def check_logits(logits) -> None:
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"logits must be a torch.Tensor, got {type(logits).__name__}")
    if logits.dim() != 2:
        raise ValueError(f"logits must be 2-D [B, V], got shape {tuple(logits.shape)}")
    if not logits.is_floating_point():
        raise TypeError(f"logits must be a floating tensor, got {logits.dtype}")
    if logits.shape[1] < 1:
        raise ValueError("logits must have at least one column")


def check_vocab_size(vocab_size, width: int) -> int:
    if vocab_size is None:
        return width
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, numbers.Integral):
        raise TypeError(f"vocab_size must be an int, got {type(vocab_size).__name__}")
    if not 1 <= vocab_size <= width:
        raise ValueError(f"vocab_size must be in [1, {width}] (the logits width), got {vocab_size}")
    return int(vocab_size)
