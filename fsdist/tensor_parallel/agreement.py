"""Construction-time agreement check: every rank must build the same head.

Ranks that disagree on the hidden size, vocabulary, tile size or buffer layout would
exchange buffers of different shapes and silently produce garbage (or hang in a
collective of mismatched sizes). So at construction every rank all-gathers a small
dict describing its head and compares. Local argument errors travel in the same
gather: if one rank was given a bad argument, *every* rank raises (instead of the
others waiting forever in the next collective).
"""
from typing import Dict, List, Optional

import torch.distributed as dist

# Fields that must be identical on every rank (anything else in the dict is informational).
AGREED_FIELDS = ("hidden_size", "vocab_size", "tp_size", "params_dtype", "transport", "reduction",
                 "block_v", "make_vocab_size_divisible_by", "padded_vocab_size", "num_buffers", "max_batch_size",
                 "device_type")


def gather(local: Dict, group) -> List[Dict]:
    """all_gather_object of this rank's dict over `group`; index = rank in the group."""
    out: List[Optional[Dict]] = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, local, group=group)
    return out


def raise_local_errors(gathered: List[Dict], what: str, verb: str = "invalid arguments on", key: str = "error",
                       error: type = ValueError) -> None:
    """Raise ``error`` on every rank if any rank's ``gathered[rank][key]`` holds one, naming each such rank."""
    errors = [(r, d.get(key)) for r, d in enumerate(gathered) if d.get(key)]
    if errors:
        detail = "; ".join(f"rank {r}: {e}" for r, e in errors)
        raise error(f"{what}: {verb} {len(errors)} rank(s): {detail}")


def check_agreement(gathered: List[Dict], what: str, fields=AGREED_FIELDS,
                    advice: str = "Every rank must construct the head with the same arguments.") -> None:
    """Raise ValueError naming every field whose value differs between ranks (then ``advice``)."""
    bad = []
    for field in fields:
        values = [d.get(field) for d in gathered]
        if any(v != values[0] for v in values[1:]):
            per_rank = ", ".join(f"rank {r}={v!r}" for r, v in enumerate(values))
            bad.append(f"{field} ({per_rank})")
    if bad:
        raise ValueError(f"{what}: configuration differs across tensor-parallel ranks: " + "; ".join(bad)
                         + f". {advice}")
