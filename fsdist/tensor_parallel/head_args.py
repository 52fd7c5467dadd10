"""What a ShardedFlashLMHead is given: the checks of its constructor's arguments, and the
preparation of one forward call's arguments (every local check, the per-row parameters, the
logit processors, the call's options). ``layers.py`` composes the head; this module knows no
transport and no reduction, only how to validate and normalise what a caller passes.
"""
import dataclasses
import numbers
import warnings

import torch
import torch.distributed as dist

from .. import validation
from ..ops.configs import STAGE1_PATHS
from ..ops.step_check import filter_fingerprint
from ..processing import prepare_call_rows
from ..runtime import default_device
from ..types import SampleOutput
from .reduction import CallOptions


def check_reduction(name, choices) -> str:
    if not isinstance(name, str):
        raise TypeError(f"reduction must be a str, got {type(name).__name__}")
    if name not in choices:
        raise ValueError(f"unknown reduction {name!r}; choose one of {', '.join(choices)}")
    return name


def resolve_device(device) -> torch.device:
    device = default_device() if device is None else torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def positive_int(x, name: str) -> int:
    """x as a Python int (numpy and other integral scalars accepted: configs often come from numpy
    or JSON), or TypeError / ValueError naming the argument."""
    if isinstance(x, bool) or not isinstance(x, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(x).__name__}")
    if x < 1:
        raise ValueError(f"{name} must be >= 1, got {x}")
    return int(x)


def check_group(tp_group) -> None:
    """tp_group must be a torch.distributed ProcessGroup (or None for the whole world)."""
    if tp_group is not None and not isinstance(tp_group, dist.ProcessGroup):
        hint = (" (a list of ranks is not a group: build one on every rank with torch.distributed.new_group(ranks) "
                "and pass that)" if isinstance(tp_group, (list, tuple, range)) else "")
        raise TypeError(f"tp_group must be a torch.distributed.ProcessGroup or None, got "
                        f"{type(tp_group).__name__}{hint}")


def group_words(tp: int, default_group: bool) -> str:
    """How an error names the tensor-parallel group (a shard made for another TP degree
    has another row count: the first thing to check is which group the head was given)."""
    if default_group:
        return (f"tp_group=None, i.e. the whole world of {tp} ranks; if the model is tensor-parallel over "
                "a smaller group (DP x TP), pass that group as tp_group")
    return f"tp_group of {tp} ranks"


def check_shared_weight(weight, partition, hidden_size: int, params_dtype, device, tp_words: str):
    """A caller's Parameter that the head uses as its shard (no copy): this rank's rows."""
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"weight must be a torch.Tensor (this rank's shard), got {type(weight).__name__}")
    want = (partition.rows, hidden_size)
    if tuple(weight.shape) != want:
        raise ValueError(f"weight must be this rank's shard [padded_vocab_size / tp, hidden_size] = "
                         f"[{partition.padded_vocab_size} / {partition.tp_size}, {hidden_size}] = {list(want)} "
                         f"(vocabulary ids [{partition.start}, {partition.end}) of rank {partition.rank}), got "
                         f"{list(weight.shape)}; {tp_words}")
    if weight.dtype != params_dtype:
        raise TypeError(f"weight dtype {weight.dtype} does not match params_dtype {params_dtype}")
    if weight.device != device:
        raise ValueError(f"weight is on {weight.device} but device is {device}")
    if not weight.is_contiguous():
        raise ValueError("weight must be contiguous (the kernels read rows of the shard)")


def warn_if_padded(vocab_size: int, unit: int, vocab_size_is_true: bool):
    if vocab_size_is_true or vocab_size % unit:
        return
    warnings.warn(f"ShardedFlashLMHead: vocab_size={vocab_size} is a multiple of the padding unit {unit} "
                  "(make_vocab_size_divisible_by x tp size). If it is a padded size (e.g. Megatron's "
                  "GPTModel.vocab_size) the padding rows can be sampled: pass the tokenizer's true vocabulary "
                  "size, or vocab_size_is_true=True if it is the true size.", UserWarning, stacklevel=3)


def empty_output(device, opts: CallOptions) -> SampleOutput:
    def f():
        return torch.empty(0, dtype=torch.float32, device=device)

    top = opts.top_n > 0
    return SampleOutput(torch.empty(0, dtype=torch.int64, device=device),
                        f() if opts.logprobs else None, f() if opts.logprobs else None,
                        torch.empty(0, opts.top_n, dtype=torch.int64, device=device) if top else None,
                        torch.empty(0, opts.top_n, dtype=torch.float32, device=device) if top else None,
                        torch.empty(0, dtype=torch.bool, device=device) if opts.filtered or top else None)


def prepare_call(head, hidden, temperature, seed, offset, return_logprobs, weight, path, check, top_k, top_p, min_p,
             top_logprobs, logprobs_mode, token_bitmask=None, logit_bias=None, penalties=None):
    """Every local check of a forward call; raises on a bad argument."""
    validation.check_hidden(hidden, hidden_size=head.hidden_size)
    if hidden.device != head.device:
        raise ValueError(f"hidden is on {hidden.device} but the head lives on {head.device}")
    if weight is None:
        w = head.weight
    else:
        if isinstance(weight, torch.Tensor) and tuple(weight.shape) != tuple(head.weight.shape):
            raise ValueError(f"weight override must be this rank's shard of shape "
                             f"{tuple(head.weight.shape)} ([V_padded / tp, D], vocabulary ids "
                             f"[{head.vocab_start}, {head.vocab_end}) of rank {head.tp_rank}), got "
                             f"{tuple(weight.shape)}; {head.tp_group_words}")
        w = weight
    validation.check_weight(w, hidden, name="weight" if weight is None else "weight override")
    B = hidden.shape[0]
    if B > head.max_batch_size:
        raise ValueError(f"batch {B} exceeds the head's max_batch_size {head.max_batch_size}: construct the "
                         "head with a larger max_batch_size, or call head.reserve(batch) on every rank")
    validation.check_logprobs_options(top_logprobs, logprobs_mode)
    return_logprobs = validation.check_flag(return_logprobs, "return_logprobs")
    check = validation.check_flag(check, "check")
    if path is not None and path not in STAGE1_PATHS:
        raise ValueError(f"path must be 'fused', 'chunked' or None, got {path!r}")

    def options(p):
        return CallOptions(bool(return_logprobs), path, p.filtered(head.vocab_size), top_logprobs, logprobs_mode,
                           p.may_min_p)

    def filters_fingerprint(p):
        # the header's filter fingerprint (where the call runs the filters' path), made before the processors
        # so that the preparation kernel folds it into theirs: no fingerprint launch of its own (v73)
        return filter_fingerprint(p.top_k, p.top_p, p.min_p) if options(p).extended else p.fingerprint

    params, processing = prepare_call_rows(
        temperature, seed, offset, B, hidden.device, top_k=top_k, top_p=top_p, min_p=min_p,
        token_bitmask=token_bitmask, logit_bias=logit_bias, penalties=penalties, vocab_size=head.vocab_size,
        wants_logprobs=bool(return_logprobs or top_logprobs), logprobs_mode=logprobs_mode, check=check,
        filters_fingerprint_of=filters_fingerprint)
    opts = options(params)
    if opts.extended and head.reduction != "candidates":
        raise ValueError(f"top_k / top_p / min_p, top_logprobs and logprobs_mode='raw' need "
                         f"reduction='candidates' (this head uses {head.reduction!r}, which exchanges one "
                         "sample per rank and cannot apply a filter across shards)")
    if processing is not None:
        # Poisoned rows get a NaN temperature; the processors' hash joins the row fingerprint
        # so ranks given different bitmasks, biases or penalties are caught (step_check.py).
        params = processing.apply_to(params)
        params = dataclasses.replace(params, fingerprint=processing.row_fingerprint(xor=params.fingerprint))
    if hidden.stride(1) != 1:
        hidden = hidden.contiguous()
    return hidden, w.detach(), params, opts
