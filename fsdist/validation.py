"""Input checks shared by fsdist.sample and ShardedFlashLMHead.

Every check raises TypeError or ValueError naming the offending argument. Checks of
shapes, dtypes and devices cost nothing; checks of the *values* held in device tensors
would need a device-to-host synchronisation, so they are opt-in (``check_row_values``,
``fsdist.sample(..., check=True)``). Without them the kernels handle bad values on the
device: a negative, NaN or too large (> 1e30, +inf included) temperature makes its row return token
-1, never a wrong token.
"""
import numbers
from typing import Optional

import torch

from . import runtime
from .params import GREEDY_TEMPERATURE, LOGPROBS_MODES, MAX_TEMPERATURE, MAX_TOP_LOGPROBS, RowParams

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def check_hidden(hidden, dtype: Optional[torch.dtype] = None, hidden_size: Optional[int] = None):
    if not isinstance(hidden, torch.Tensor):
        raise TypeError(f"hidden must be a torch.Tensor, got {type(hidden).__name__}")
    if hidden.dim() < 2:
        raise ValueError(f"hidden must be 2-D [B, D] or more, [..., D] (one row per leading index, e.g. "
                         f"Megatron's [s, b, h]), got shape {tuple(hidden.shape)}")
    if hidden.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"hidden dtype must be one of bf16/fp16/fp32, got {hidden.dtype}")
    if dtype is not None and hidden.dtype != dtype:
        raise TypeError(f"hidden dtype {hidden.dtype} does not match weight dtype {dtype}")
    if hidden.shape[-1] == 0:
        raise ValueError("hidden has D=0 (no hidden features): the LM head needs D >= 1")
    if hidden_size is not None and hidden.shape[-1] != hidden_size:
        raise ValueError(f"hidden has D={hidden.shape[-1]} but the weight expects D={hidden_size}")


def check_weight(weight, hidden: torch.Tensor, name: str = "weight"):
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(weight).__name__}")
    if weight.dim() != 2:
        raise ValueError(f"{name} must be 2-D [V, D], got shape {tuple(weight.shape)}")
    if weight.dtype != hidden.dtype:
        raise TypeError(f"{name} dtype {weight.dtype} does not match hidden dtype {hidden.dtype}")
    if weight.device != hidden.device:
        raise ValueError(f"{name} is on {weight.device} but hidden is on {hidden.device}")
    if weight.shape[1] != hidden.shape[-1]:
        raise ValueError(
            f"{name} has D={weight.shape[1]} but hidden has D={hidden.shape[-1]} "
            f"({name} must be [V, D], the nn.Linear layout)")
    if not weight.is_contiguous():
        raise ValueError(f"{name} must be contiguous (call .contiguous() once, outside the decode loop)")
    if weight.shape[0] == 0:
        raise ValueError(f"{name} has no rows")


def check_vocab_size(vocab_size, rows: int) -> int:
    if vocab_size is None:
        return rows
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, numbers.Integral):
        raise TypeError(f"vocab_size must be an int or None, got {type(vocab_size).__name__}")
    vocab_size = int(vocab_size)  # (numpy integers too, as seed and top_k take them)
    if not 1 <= vocab_size <= rows:
        raise ValueError(f"vocab_size must be in [1, {rows}] (the weight's rows), got {vocab_size}")
    return vocab_size


def _row_tensor(x, name: str, batch: int, device: torch.device, kind: str) -> torch.Tensor:
    if x.dim() == 0:  # one device value for every row (expanded on the device: no sync)
        x = x.reshape(1).expand(batch)
    if x.dim() != 1 or x.shape[0] != batch:
        raise ValueError(f"{name} tensor must have shape [{batch}] (one per row), got {tuple(x.shape)}")
    if x.device != device:
        raise ValueError(f"{name} is on {x.device} but hidden is on {device}")
    if kind == "int64":
        if x.dtype != torch.int64:
            raise TypeError(f"{name} tensor must be int64, got {x.dtype}")
    elif kind == "int":
        if x.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"{name} tensor must be int32 or int64, got {x.dtype}")
    elif not x.is_floating_point():
        raise TypeError(f"{name} tensor must be floating point, got {x.dtype}")
    return x.contiguous()


def _as_dtype(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x in dtype: x itself when it is already (what .to returns then too, without the ~1 µs of its call)."""
    return x if x.dtype == dtype else x.to(dtype)


def _real(x, name: str, lo: float, hi: float, lo_open: bool = False) -> float:
    """A real scalar in [lo, hi] (or (lo, hi] with lo_open)."""
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise TypeError(f"{name} must be a real number or a [B] tensor, got {type(x).__name__}")
    x = float(x)
    if x != x or x > hi or x < lo or (lo_open and x == lo):
        interval = f"{'(' if lo_open else '['}{lo:g}, {hi:g}]"
        raise ValueError(f"{name} must be in {interval}, got {x}")
    return x


def row_params(temperature, seed, offset, batch: int, device: torch.device, *, top_k=0, top_p=1.0,
               min_p=0.0) -> RowParams:
    """Validate shapes, dtypes and devices, and the values of scalars (never the values held in
    device tensors: that would synchronise; the kernels handle those, see check_row_values)."""
    # A row is greedy when its temperature is below GREEDY_TEMPERATURE in the temperature's own dtype
    # (docs/semantics.md); the kernels compare in fp32, where a value just below 1e-5 in float64 may round
    # to fp32(1e-5) and sample. So greedy values are zeroed before the fp32 cast (float64 tensors: on the
    # device, no sync; narrower floats convert to fp32 exactly).
    if isinstance(temperature, torch.Tensor):
        temperature = _row_tensor(temperature, "temperature", batch, device, "float")
        if temperature.dtype == torch.float64:
            temperature = torch.where((temperature >= 0) & (temperature < GREEDY_TEMPERATURE), 0.0, temperature)
        temperature = _as_dtype(temperature, torch.float32)
    elif isinstance(temperature, numbers.Real) and not isinstance(temperature, bool):
        temperature = float(temperature)
        if not 0 <= temperature <= MAX_TEMPERATURE:  # NaN fails too
            raise ValueError(f"temperature must be in [0, {MAX_TEMPERATURE:g}] (finite, not NaN), got {temperature}")
        if temperature < GREEDY_TEMPERATURE:
            temperature = 0.0
    else:
        raise TypeError(f"temperature must be a real number or a [B] tensor, got {type(temperature).__name__}")

    def as_int(x, name):
        if isinstance(x, torch.Tensor):
            return _row_tensor(x, name, batch, device, "int64")
        if isinstance(x, bool) or not isinstance(x, numbers.Integral):
            raise TypeError(f"{name} must be an int or a [B] int64 tensor, got {type(x).__name__}")
        x = int(x)
        if not _INT64_MIN <= x <= _INT64_MAX:
            raise ValueError(f"{name} must fit in int64, got {x}")
        return x

    if isinstance(top_k, torch.Tensor):
        top_k = _row_tensor(top_k, "top_k", batch, device, "int")
        if top_k.dtype == torch.int64:  # (on the device) past int32: off, as a scalar is; negative stays bad
            top_k = top_k.clamp(-1, 2**31 - 1)
        top_k = _as_dtype(top_k, torch.int32)
    else:
        if isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral):
            raise TypeError(f"top_k must be an int or a [B] int tensor, got {type(top_k).__name__}")
        if top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {top_k}")
        top_k = min(int(top_k), 2**31 - 1)
    if isinstance(top_p, torch.Tensor):
        top_p = _as_dtype(_row_tensor(top_p, "top_p", batch, device, "float"), torch.float32)
    else:
        top_p = _real(top_p, "top_p", 0.0, 1.0, lo_open=True)
    if isinstance(min_p, torch.Tensor):
        min_p = _as_dtype(_row_tensor(min_p, "min_p", batch, device, "float"), torch.float32)
    else:
        min_p = _real(min_p, "min_p", 0.0, 1.0)
    return RowParams(temperature, as_int(seed, "seed"), as_int(offset, "offset"), top_k, top_p, min_p)


def check_flag(x, name: str) -> bool:
    """A bool argument (numpy's too): a string such as "no" is refused, not read as True."""
    if x not in (True, False):  # (a string, an int other than 0 / 1, None: refused)
        raise TypeError(f"{name} must be a bool, got {x!r}")
    return bool(x)


def check_logprobs_options(top_logprobs, logprobs_mode) -> None:
    if isinstance(top_logprobs, bool) or not isinstance(top_logprobs, numbers.Integral):
        raise TypeError(f"top_logprobs must be an int, got {type(top_logprobs).__name__}")
    if not 0 <= top_logprobs <= MAX_TOP_LOGPROBS:
        raise ValueError(f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {top_logprobs}")
    if logprobs_mode not in LOGPROBS_MODES:
        raise ValueError(f"logprobs_mode must be one of {', '.join(map(repr, LOGPROBS_MODES))}, "
                         f"got {logprobs_mode!r}")


def check_row_values(params: RowParams) -> None:
    """Opt-in check of the values held in device tensors (synchronises with the device).

    Raises ValueError naming the argument and the first bad rows. Without it, such rows
    return token -1 (the kernels check them on the device).
    """
    checks = [("temperature", params.temperature, lambda t: ~((t >= 0) & (t <= MAX_TEMPERATURE)),
               f"be in [0, {MAX_TEMPERATURE:g}] (finite, not NaN)"),
              ("top_k", params.top_k, lambda k: k < 0, "be >= 0"),
              ("top_p", params.top_p, lambda p: ~((p > 0) & (p <= 1)), "be in (0, 1]"),
              ("min_p", params.min_p, lambda p: ~((p >= 0) & (p <= 1)), "be in [0, 1]")]
    for name, x, is_bad, rule in checks:
        if isinstance(x, torch.Tensor):
            bad = is_bad(x)
            if bool(bad.any()):
                raise ValueError(f"{name} must {rule} in every row (bad rows: {bad.nonzero().flatten().tolist()[:8]})")


def check_device_runnable(device: torch.device):
    if device.type == "cuda":
        return
    if device.type == "cpu" and runtime.interpreting():
        runtime.check_interpreter()
        return
    raise ValueError(
        f"fsdist kernels run on CUDA tensors, or on CPU tensors under Triton's interpreter "
        f"(TRITON_INTERPRET=1 set before triton is imported); got tensors on {device}")
