"""Logit processors of the float64 reference: token bitmask, logit bias, penalties.

They run in vLLM V1's order before temperature and the filters (``semantics`` composes
them). ``SparseLogits`` and ``Penalties`` are the argument types fsdist's API takes too;
the bitmask is xgrammar's layout (int32 words, bit v % 32 of word v // 32 set = id v
allowed). Each ``apply_*`` edits a float64 [B, W] logits tensor in place; ids >= vocab_size
(padding) are never touched.
"""

import torch

from ..types import Penalties, SparseLogits
from .arguments import NEG_INF, id_table, row_param


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
# Processors (in place, float64)
# ---------------------------------------------------------------------------------------------


def apply_bitmask(x: torch.Tensor, token_bitmask, vocab_size: int) -> None:
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
    x[:, :vocab_size].masked_fill_(~allowed, NEG_INF)


def apply_bias(x: torch.Tensor, logit_bias, vocab_size: int) -> None:
    batch = x.shape[0]
    if not isinstance(logit_bias, SparseLogits):
        if isinstance(logit_bias, tuple) and len(logit_bias) == 2:
            logit_bias = SparseLogits(*logit_bias)
        else:
            raise TypeError(f"logit_bias must be a SparseLogits(ids, values), got {type(logit_bias).__name__}")
    ids = id_table("logit_bias.ids", logit_bias.ids, batch, vocab_size, x.device)
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


def apply_penalties(x: torch.Tensor, penalties, vocab_size: int) -> None:
    batch = x.shape[0]
    if not isinstance(penalties, Penalties):
        raise TypeError(f"penalties must be a Penalties(...), got {type(penalties).__name__}")
    rep = row_param("penalties.repetition", penalties.repetition, batch, x.device)
    freq = row_param("penalties.frequency", penalties.frequency, batch, x.device)
    pres = row_param("penalties.presence", penalties.presence, batch, x.device)
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
        ids = id_table(name, ids, batch, vocab_size, x.device)
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
