"""Input checks shared by fsdist.sample and ShardedFlashLMHead.

Every check raises TypeError or ValueError naming the offending argument. Checks of
shapes, dtypes and devices cost nothing; checks of the *values* held in device tensors
would need a device-to-host synchronisation, so they are opt-in (``check_row_values``,
``fsdist.sample(..., check=True)``). Without them the kernels handle bad values on the
device: a negative or NaN temperature makes its row return token -1, never a wrong token.
"""
import numbers
from typing import Optional

import torch

from . import runtime
from .params import RowParams

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def check_hidden(hidden, dtype: Optional[torch.dtype] = None, hidden_size: Optional[int] = None):
    if not isinstance(hidden, torch.Tensor):
        raise TypeError(f"hidden must be a torch.Tensor, got {type(hidden).__name__}")
    if hidden.dim() != 2:
        raise ValueError(f"hidden must be 2-D [B, D], got shape {tuple(hidden.shape)}")
    if hidden.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"hidden dtype must be one of bf16/fp16/fp32, got {hidden.dtype}")
    if dtype is not None and hidden.dtype != dtype:
        raise TypeError(f"hidden dtype {hidden.dtype} does not match weight dtype {dtype}")
    if hidden.shape[1] == 0:
        raise ValueError("hidden has D=0 (no hidden features): the LM head needs D >= 1")
    if hidden_size is not None and hidden.shape[1] != hidden_size:
        raise ValueError(f"hidden has D={hidden.shape[1]} but the weight expects D={hidden_size}")


def check_weight(weight, hidden: torch.Tensor, name: str = "weight"):
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(weight).__name__}")
    if weight.dim() != 2:
        raise ValueError(f"{name} must be 2-D [V, D], got shape {tuple(weight.shape)}")
    if weight.dtype != hidden.dtype:
        raise TypeError(f"{name} dtype {weight.dtype} does not match hidden dtype {hidden.dtype}")
    if weight.device != hidden.device:
        raise ValueError(f"{name} is on {weight.device} but hidden is on {hidden.device}")
    if weight.shape[1] != hidden.shape[1]:
        raise ValueError(
            f"{name} has D={weight.shape[1]} but hidden has D={hidden.shape[1]} "
            f"({name} must be [V, D], the nn.Linear layout)")
    if not weight.is_contiguous():
        raise ValueError(f"{name} must be contiguous (call .contiguous() once, outside the decode loop)")
    if weight.shape[0] == 0:
        raise ValueError(f"{name} has no rows")


def check_vocab_size(vocab_size, rows: int) -> int:
    if vocab_size is None:
        return rows
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int):
        raise TypeError(f"vocab_size must be an int or None, got {type(vocab_size).__name__}")
    if not 1 <= vocab_size <= rows:
        raise ValueError(f"vocab_size must be in [1, {rows}] (the weight's rows), got {vocab_size}")
    return vocab_size


def _row_tensor(x, name: str, batch: int, device: torch.device, integer: bool) -> torch.Tensor:
    if x.dim() != 1 or x.shape[0] != batch:
        raise ValueError(f"{name} tensor must have shape [{batch}] (one per row), got {tuple(x.shape)}")
    if x.device != device:
        raise ValueError(f"{name} is on {x.device} but hidden is on {device}")
    if integer:
        if x.dtype != torch.int64:
            raise TypeError(f"{name} tensor must be int64, got {x.dtype}")
    elif not x.is_floating_point():
        raise TypeError(f"{name} tensor must be floating point, got {x.dtype}")
    return x.contiguous()


def row_params(temperature, seed, offset, batch: int, device: torch.device) -> RowParams:
    """Validate shapes, dtypes and devices (never values held on the device: no sync)."""
    if isinstance(temperature, torch.Tensor):
        temperature = _row_tensor(temperature, "temperature", batch, device, integer=False).to(torch.float32)
    elif isinstance(temperature, numbers.Real) and not isinstance(temperature, bool):
        temperature = float(temperature)
        if temperature != temperature or temperature < 0:
            raise ValueError(f"temperature must be >= 0 and not NaN, got {temperature}")
    else:
        raise TypeError(f"temperature must be a real number or a [B] tensor, got {type(temperature).__name__}")

    def as_int(x, name):
        if isinstance(x, torch.Tensor):
            return _row_tensor(x, name, batch, device, integer=True)
        if isinstance(x, bool) or not isinstance(x, numbers.Integral):
            raise TypeError(f"{name} must be an int or a [B] int64 tensor, got {type(x).__name__}")
        x = int(x)
        if not _INT64_MIN <= x <= _INT64_MAX:
            raise ValueError(f"{name} must fit in int64, got {x}")
        return x

    return RowParams(temperature, as_int(seed, "seed"), as_int(offset, "offset"))


def check_row_values(params: RowParams) -> None:
    """Opt-in check of the values held in device tensors (synchronises with the device).

    Raises ValueError naming the argument and the first bad rows. Without it, such rows
    return token -1 (the kernels check them on the device).
    """
    t = params.temperature
    if isinstance(t, torch.Tensor):
        bad = (t < 0) | torch.isnan(t)
        if bool(bad.any()):
            raise ValueError("temperature must be >= 0 and not NaN in every row "
                             f"(bad rows: {bad.nonzero().flatten().tolist()[:8]})")


def check_device_runnable(device: torch.device):
    if device.type == "cuda":
        return
    if device.type == "cpu" and runtime.interpreting():
        runtime.check_interpreter()
        return
    raise ValueError(
        f"fsdist kernels run on CUDA tensors, or on CPU tensors under Triton's interpreter "
        f"(TRITON_INTERPRET=1 set before triton is imported); got tensors on {device}")
