"""``reduction="candidates"``: every rank's per-tile candidates meet in every rank's buffer.

The buffer is the single-GPU candidate layout with one shard block per rank,
fp32 [tp, n_fields, n_local, batch_cap] and int32 [tp, n_local, batch_cap]
(``fsdist.ops.layout.CandidateLayout``); rank r's stage 1 fills block r with
candidates carrying *global* vocabulary ids and noise keyed by those ids. Stage 2 then
merges all tp * n_local slots, in vocabulary order, on every rank. The result is the
token fsdist.sample would return for the full weight (same seed, offset): the argmax
of the perturbed scores does not care how the vocabulary was cut into tiles or ranks.

How block r gets into every rank's buffer is the transport's business
(``Transport.write_target`` / ``exchange``): stores into every peer's buffer from the
kernel epilogue then a barrier, or the local block then an all-gather.

Every rank also writes its call's header next to its candidates (step, batch, flags, row
fingerprints; ``fsdist.ops.step_check``) and the merge checks all of them against its
own, so ranks that made different calls get -1 and an error instead of wrong tokens.
The layout always has the four logprob fields, so every rank's block has the same size
whatever the call's flags (the collective transport's all-gather needs that).

Buffers are doubled by step parity (see step_buffers.py) so a fast rank's next
step never overwrites a slot a slow rank is still merging. The kernels read the
parity from the reduction's device counter, so a CUDA graph of a step alternates
the copies on replay; the collective transport has one copy (its all-gather needs a
host-known address and cannot race).
"""
from typing import Optional

import torch

from ..ops.layout import CandidateLayout
from ..ops.merge_candidates import launch_merge
from ..ops.plan import launch_stage1
from ..params import RowParams
from .reduction import Reduction
from .step_buffers import StepBuffers


N_FIELDS = CandidateLayout.fields(True)


class CandidatesReduction(Reduction):

    def _layout(self) -> CandidateLayout:
        return CandidateLayout(N_FIELDS, self.n_local, self.capacity, self.tp, checked=True)

    def _allocate(self) -> None:
        full = self._layout()
        self.buffers = StepBuffers(self.transport, full.float_numel, full.int_numel, self.counter,
                                   self.seam.num_buffers)

    def _blocks(self):
        full = self._layout()
        return full.stride_shard, full.stride_shard_i

    def _header_slots(self):
        full = self._layout()
        return full.stride_shard_i, full.record_slot

    def _release(self) -> None:
        self.buffers.free()
        self.buffers = None

    def _sample(self, hidden: torch.Tensor, weight: torch.Tensor, params: RowParams, logprobs: bool,
                path: Optional[str], step: int):
        B = hidden.shape[0]
        plan = self.plan(B, hidden.shape[1], logprobs, path, n_shards=self.tp, n_fields=N_FIELDS, checked=True)
        bufs, part = self.buffers, self.partition
        self.seam.call("before_stage1", step)
        launch_stage1(plan, hidden, weight, params, bufs.dest, vocab_size=part.vocab_size,
                      vocab_start=part.start, shard=self.rank)
        bufs.exchange(plan.layout.stride_shard, plan.layout.stride_shard_i)
        self.seam.call("before_stage2", step)
        return launch_merge(plan.layout, bufs.src, B, params, logprobs=logprobs, check=self.header_check())
