"""Triton kernels, one per file, and their host launchers. Nothing here knows about
torch.distributed: a tensor-parallel caller hands in buffers (or peer address tables)
and the vocabulary range of its shard.

Reading order: ``plan.py`` (what a call will do) -> ``fused_sample.py`` /
``sample_logits.py`` (stage 1, candidates per vocabulary tile) -> ``merge_candidates.py``
(stage 2, one token per row). ``noise.py`` is the RNG contract, ``epilogue.py`` the
sampling epilogue every stage-1 kernel shares, ``layout.py`` where candidates live.
"""
from ..runtime import setup

# The interpreter (no GPU) must be chosen before the first kernel below is decorated.
setup()
