"""Megatron-Core: build a ShardedFlashLMHead on a model's own output-layer weight.

``ShardedFlashLMHead.from_megatron(model_or_output_layer, vocab_size, **kwargs)`` calls
:func:`head_from_megatron`. Everything the head needs is read from Megatron's objects:

* the output layer: ``model.output_layer`` (a ``ColumnParallelLinear``) of a ``GPTModel``
  on its last pipeline stage, unwrapped from DDP / ``Float16Module`` wrappers (``.module``),
  or the layer itself;
* the weight: the layer's own Parameter, or, with tied embeddings
  (``share_embeddings_and_output_weights``), ``model.shared_embedding_or_output_weight()``
  (what GPTModel.forward hands its output layer; ``output_layer.weight`` is None then). The
  head *shares* it (``weight=``): no second ``[V_pad / tp, D]`` shard is allocated;
* the hidden size (``input_size``), dtype and device (the weight's), the TP group
  (``output_layer.tp_group``, else ``model.pg_collection.tp``, else
  ``parallel_state.get_tensor_model_parallel_group()``) and the padded vocabulary
  (``output_layer.output_size``; the head pads to exactly that, so it owns the same rows
  as Megatron: rank r has ids ``[r * V_pad / tp, (r + 1) * V_pad / tp)``).

``vocab_size`` is the *true* vocabulary (the tokenizer's). ``GPTModel.vocab_size`` is the
padded one; passing it would let padding rows be sampled, so a ``vocab_size`` equal to the
layer's padded size raises unless ``vocab_size_is_true=True`` says the model has no padding.

Checks that can fail are agreed across the TP group before anything else (one small
all-gather), so a rank with a bad argument never leaves its peers waiting.

megatron-core is an optional extra (``pip install -e '.[megatron]'``; megatron-core >= 0.17
declares Python >= 3.12, on 3.11 install the wheel with ``--no-deps --ignore-requires-python``).
It is imported only to find the TP group through ``parallel_state`` when the objects do not
carry one. docs/integration.md ("Megatron-Core") has the whole recipe: [s, b, h] hidden states,
sequence parallelism, ``Float16Module(fp32_output=True)``, DP x TP groups, CPU workarounds.
"""
import logging
from typing import Optional, Tuple

import torch
import torch.distributed as dist

from ..validation import check_flag

log = logging.getLogger("fsdist")

WHAT = "ShardedFlashLMHead.from_megatron"
# Constructor arguments from_megatron reads from the model instead of taking them.
READ_FROM_MODEL = ("hidden_size", "params_dtype", "device", "weight", "make_vocab_size_divisible_by")
INSTALL_HINT = ("pip install -e '.[megatron]' (megatron-core >= 0.17 declares Python >= 3.12; on Python 3.11: "
                "pip install --no-deps --ignore-requires-python megatron-core==0.19.2)")


def import_megatron_core():
    """megatron.core, or ImportError saying how to install it."""
    try:
        import megatron.core as core
    except Exception as e:  # ImportError, or one of its own imports failing
        raise ImportError(f"{WHAT} needs megatron-core: {INSTALL_HINT}; import failed with "
                          f"{type(e).__name__}: {e}") from e
    return core


def _is_output_layer(obj) -> bool:
    """A ColumnParallelLinear (duck-typed: Megatron's class moved between versions)."""
    return isinstance(obj, torch.nn.Module) and hasattr(obj, "output_size_per_partition") and hasattr(obj, "input_size")


def unwrap(model):
    """The module inside DDP / Float16Module / ... wrappers (each keeps it in ``.module``)."""
    for _ in range(8):
        if _is_output_layer(model) or hasattr(model, "output_layer") or not hasattr(model, "module"):
            return model
        model = model.module
    return model


def output_layer_and_weight(model_or_output_layer) -> Tuple[Optional[torch.nn.Module], torch.nn.Module, torch.Tensor]:
    """(model or None, output layer, the weight GPTModel.forward multiplies by)."""
    obj = unwrap(model_or_output_layer)
    if _is_output_layer(obj):
        model, layer = None, obj
    elif isinstance(getattr(obj, "output_layer", None), torch.nn.Module):
        model, layer = obj, obj.output_layer
        if not _is_output_layer(layer):
            raise TypeError(f"{WHAT}: model.output_layer is a {type(layer).__name__}, not a ColumnParallelLinear "
                            "(Transformer Engine's LM-head layers are not supported)")
    elif hasattr(obj, "output_layer") or hasattr(obj, "post_process"):
        raise ValueError(f"{WHAT}: this {type(obj).__name__} has no output layer (not the last pipeline stage?): "
                         "build the head on the stage that computes the logits")
    else:
        raise TypeError(f"{WHAT} needs a Megatron GPTModel (or a wrapper of one: DDP, Float16Module) or its "
                        f"output_layer (a ColumnParallelLinear), got {type(model_or_output_layer).__name__}")
    weight = None
    if model is not None and getattr(model, "share_embeddings_and_output_weights", False):
        weight = model.shared_embedding_or_output_weight()  # what GPTModel.forward passes its output layer
    if weight is None:
        weight = layer.weight
    if weight is None:
        raise ValueError(f"{WHAT}: output_layer.weight is None (tied embeddings: the layer was built with "
                         "skip_weight_param_allocation); pass the GPTModel, whose "
                         "shared_embedding_or_output_weight() is the weight")
    if getattr(layer, "bias", None) is not None:
        raise ValueError(f"{WHAT}: the output layer has a bias; the head samples from hidden @ W.T without one")
    config = getattr(model, "config", None) or getattr(layer, "config", None)
    if getattr(config, "use_mup", False) and getattr(config, "mup_output_mult", 1.0) != 1.0:
        raise ValueError(f"{WHAT}: MuP output scaling (config.use_mup, mup_output_mult="
                         f"{config.mup_output_mult}) multiplies Megatron's logits; the head would sample from the "
                         "unscaled ones")
    return model, layer, weight


def tp_group_of(layer, model):
    """The output layer's tensor-parallel group, as Megatron resolved it."""
    group = getattr(layer, "tp_group", None)
    if group is None and model is not None:
        group = getattr(getattr(model, "pg_collection", None), "tp", None)
    if group is None:
        group = import_megatron_core().parallel_state.get_tensor_model_parallel_group(check_initialized=False)
    if group is None:
        raise ValueError(f"{WHAT}: cannot find the tensor-parallel group (the output layer has no tp_group and "
                         "parallel_state is not initialised); pass tp_group=")
    return group


def _positive_int(x, name: str) -> None:
    if isinstance(x, bool) or not isinstance(x, int):
        raise TypeError(f"{name} must be an int, got {type(x).__name__}")
    if x < 1:
        raise ValueError(f"{name} must be >= 1, got {x}")


def _check_vocab(vocab_size, padded: int, tp: int, rows: int, vocab_size_is_true: bool) -> None:
    _positive_int(vocab_size, "vocab_size")
    check_flag(vocab_size_is_true, "vocab_size_is_true")  # ("no" must not pass for True and hide the padding)
    if rows * tp != padded:
        raise ValueError(f"the output layer holds {rows} rows per rank over {tp} ranks but its output_size is "
                         f"{padded}: is tp_group the model's tensor-parallel group?")
    if vocab_size > padded:
        raise ValueError(f"vocab_size {vocab_size} exceeds the output layer's padded vocabulary {padded}")
    if vocab_size == padded and not vocab_size_is_true:
        raise ValueError(f"vocab_size {vocab_size} equals the output layer's padded vocabulary (GPTModel.vocab_size "
                         "is the padded size, and padding rows would then be sampled): pass the tokenizer's true "
                         "vocabulary size, or vocab_size_is_true=True if the model has no padding rows")
    if rows % 4:
        raise ValueError(f"the output layer has {rows} rows per rank (padded vocabulary {padded} over {tp} ranks); "
                         "fsdist needs a multiple of 4 (its noise is drawn in quads of ids): pad the vocabulary to a "
                         "multiple of 4 * tp (Megatron's make_vocab_size_divisible_by=128 does)")


def head_from_megatron(cls, model_or_output_layer, vocab_size: int, *, vocab_size_is_true: bool = False,
                       tp_group=None, **kwargs):
    """Build ``cls`` (ShardedFlashLMHead) on a Megatron model's output-layer weight (module docstring).

    ``kwargs`` go to the constructor (transport, reduction, block_v, max_batch_size, ...);
    ``tp_group`` overrides the group read from Megatron."""
    given = sorted(set(kwargs) & set(READ_FROM_MODEL))
    if given:
        raise TypeError(f"{WHAT} reads {', '.join(given)} from the model; do not pass "
                        f"{'it' if len(given) == 1 else 'them'}")
    model, layer, weight = output_layer_and_weight(model_or_output_layer)
    group = tp_group if tp_group is not None else tp_group_of(layer, model)
    tp = dist.get_world_size(group) if dist.is_initialized() else 1
    padded = int(getattr(layer, "output_size", weight.shape[0] * tp))
    error = None
    try:  # anything that can differ between ranks is agreed before the head's own collectives
        _check_vocab(vocab_size, padded, tp, weight.shape[0], vocab_size_is_true)
    except (TypeError, ValueError) as e:
        error = f"{type(e).__name__}: {e}"
    if dist.is_initialized():
        from ..tensor_parallel import agreement

        agreement.raise_local_errors(agreement.gather({"error": error}, group), WHAT)
    elif error:
        raise ValueError(f"{WHAT}: {error}")
    if getattr(layer, "sequence_parallel", False):
        log.info("fsdist: %s: the model uses sequence parallelism; hidden states are [s / tp, b, h] per rank: "
                 "gather them along the sequence first (fsdist.integrations.megatron.gather_sequence_parallel, "
                 "or output_processor())", WHAT)
    return cls(layer.input_size, vocab_size, tp_group=group, params_dtype=weight.dtype, device=weight.device,
               make_vocab_size_divisible_by=padded // tp, weight=weight, vocab_size_is_true=vocab_size_is_true,
               **kwargs)


def gather_sequence_parallel(hidden: torch.Tensor, group) -> torch.Tensor:
    """[s / tp, b, h] per rank (Megatron's sequence parallelism) -> the full [s, b, h] on every rank.

    An all-gather along dim 0 over the TP group (``torch.distributed.all_gather``, which gloo
    supports too); the same gather Megatron's output layer does on its input."""
    hidden = hidden.contiguous()
    parts = [torch.empty_like(hidden) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, hidden, group=group)
    return torch.cat(parts, dim=0)


def output_processor(head, *, last_token_only: bool = False):
    """A ``GPTModel.forward(output_processor=...)`` hook that samples with ``head`` instead of
    computing logits.

    Megatron calls it with the decoder's final hidden states ``[s, b, h]`` (sequence-parallel
    chunks are gathered first); ``last_token_only`` keeps the last position (decode). The
    sampling arguments come from ``output_processor_context`` (a dict of ``head(...)`` keyword
    arguments: temperature, seed, offset, ...). Returns the head's SampleOutput (tokens
    ``[s, b]`` or ``[1, b]``); through ``Float16Module(fp32_output=True)`` it arrives as a plain
    tuple: ``fsdist.SampleOutput(*out)`` restores it."""

    def process(*, hidden_states, output_layer=None, context=None, **_unused):
        if getattr(output_layer, "sequence_parallel", False):
            hidden_states = gather_sequence_parallel(hidden_states, head.tp_group)
        if last_token_only:
            hidden_states = hidden_states[-1:]
        return head(hidden_states, **dict(context or {}))

    return process


__all__ = ["head_from_megatron", "output_layer_and_weight", "tp_group_of", "unwrap", "gather_sequence_parallel",
           "output_processor", "import_megatron_core"]
