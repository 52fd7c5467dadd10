"""float64 mirror of filtered sampling: the reference's kept set + fsdist's noise.

fsdist draws the token of a filtered row as argmax over the kept ids of
logit / T + Gumbel(seed, offset, id) (fp32, as logit + T * Gumbel). The mirror computes
the kept set with ``fsdist.reference.semantics`` in float64 and the same noise with
``fsdist.reference.noise``, so tests can compare tokens one by one, not only in
distribution. ``margin`` is the gap between the best and second-best perturbed score
among kept ids: rows with a margin far above fp32 rounding must match exactly.
"""
import torch

from fsdist.reference import materialize_logits, serving_semantics, vocab_gumbel


def _rows(x, B, dtype):
    return x.cpu().to(dtype) if isinstance(x, torch.Tensor) else torch.full((B,), x, dtype=dtype)


def _cpu(x):
    if isinstance(x, torch.Tensor):
        return x.cpu()
    if isinstance(x, tuple):  # SparseLogits, Penalties
        return type(x)(*(_cpu(v) for v in x))
    return x


def filtered_mirror(hidden, weight, *, vocab_size=None, temperature=1.0, seed=0, offset=0, top_k=0, top_p=1.0,
                    min_p=0.0, token_bitmask=None, logit_bias=None, penalties=None):
    """(tokens int64 [B], margin float64 [B], semantics) for the given parameters (the logit
    processors included: the reference applies them in float64, in vLLM V1's order)."""
    logits = materialize_logits(hidden.cpu(), weight.cpu(), None)
    V = vocab_size or logits.shape[1]
    B = logits.shape[0]
    t = _rows(temperature, B, torch.float32)  # the kernels compare T in fp32 (greedy below 1e-5)
    sem = serving_semantics(logits, temperature=t, top_k=_rows(top_k, B, torch.int64),
                            top_p=_rows(top_p, B, torch.float32).double(), min_p=_rows(min_p, B, torch.float32).double(),
                            vocab_size=V, token_bitmask=_cpu(token_bitmask), logit_bias=_cpu(logit_bias),
                            penalties=_cpu(penalties))
    ids = torch.arange(logits.shape[1])[None, :]
    g = vocab_gumbel(_rows(seed, B, torch.int64)[:, None], _rows(offset, B, torch.int64)[:, None], ids)
    kept = sem.filtered > float("-inf")
    score = torch.where(kept, sem.scaled + g, torch.full_like(g, float("-inf")))
    score = torch.where(sem.greedy[:, None], torch.where(kept, sem.scaled, score), score)
    top2 = score.topk(2, dim=1).values
    tokens = score.argmax(dim=1)
    tokens = torch.where(sem.valid, tokens, torch.full_like(tokens, -1))
    return tokens, top2[:, 0] - top2[:, 1], sem
