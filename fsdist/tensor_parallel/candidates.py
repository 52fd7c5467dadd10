"""``reduction="candidates"``: every rank's per-tile candidates meet in every rank's buffer.

The buffer is the single-GPU candidate layout with one group per rank,
fp32 [tp, n_fields, n_local, batch_cap] and int32 [tp, n_local, batch_cap]
(``fsdist.ops.sampler.CandidateLayout``); rank r's stage 1 fills group r with
candidates carrying *global* vocabulary ids and noise keyed by those ids. Stage 2 then
reduces all tp * n_local slots, in vocabulary order, on every rank. The result is the
token fsdist.sample would return for the full weight (same seed, offset): the argmax
of the perturbed scores does not care how the vocabulary was cut into tiles or ranks.

How group r gets into every rank's buffer depends on the transport:

* peer stores (nvshmem, symm_mem, shm): the fused kernel's epilogue stores into every
  peer's buffer through the peer address table, then one barrier;
* collective: the kernel writes the local buffer's group r, then an in-place
  all-gather of the tp group blocks.

Buffers are doubled by step parity (see step_buffers.py) so a fast rank's next
step never overwrites a slot a slow rank is still reducing. The kernels read the
parity from the reduction's device counter, so a CUDA graph of a step alternates
the copies on replay; the collective transport has one copy (its all-gather needs a
host-known address and cannot race).
"""
import torch

from ..ops.configs import TileConfig
from ..ops.sampler import CandidateLayout, launch_fused, launch_reduce
from .._validation import RowParams
from .reduction import DebugHook, Reduction
from .step_buffers import StepBuffers


class CandidatesReduction(Reduction):
    name = "candidates"

    def _layout(self, logprobs: bool) -> CandidateLayout:
        return CandidateLayout(CandidateLayout.fields(logprobs), self.n_local, self.capacity, self.tp)

    def _allocate(self) -> None:
        # Sized for the logprobs layout (4 fields); a call without logprobs uses a prefix of each copy.
        full = self._layout(True)
        self.buffers = StepBuffers(self.transport, full.float_numel, full.int_numel, self.counter, self.num_buffers)

    def _release(self) -> None:
        self.buffers.free()
        self.buffers = None

    def _sample(self, hidden: torch.Tensor, weight: torch.Tensor, params: RowParams, cfg: TileConfig, step: int,
                logprobs: bool, hook: DebugHook = None, stage1=None):
        stage1 = stage1 or launch_fused
        B = hidden.shape[0]
        layout = self._layout(logprobs)
        bufs = self.buffers
        par = bufs.parity  # the kernels add the copy of the current step to these offsets
        part, t = self.partition, self.transport
        if hook:
            hook("before_stage1", step)
        if t.peer_stores:
            stage1(hidden, weight, params, cfg, layout, bufs.f.peer_ptrs, bufs.i.peer_ptrs,
                   vocab_size=part.vocab_size, vocab_start=part.start, group=self.rank,
                   npeers=self.tp, logprobs=logprobs, parity=par)
            t.barrier()
        else:
            # One copy (parity strides 0): the all-gather below needs host-known slices.
            f, i = bufs.f.local, bufs.i.local
            stage1(hidden, weight, params, cfg, layout, f, i,
                   vocab_size=part.vocab_size, vocab_start=part.start, group=self.rank,
                   logprobs=logprobs, parity=par)
            gf, gi = layout.stride_group, layout.stride_group_i
            out_f = f[:self.tp * gf]
            out_i = i[:self.tp * gi]
            t.all_gather_into(out_f, out_f[self.rank * gf:(self.rank + 1) * gf])
            t.all_gather_into(out_i, out_i[self.rank * gi:(self.rank + 1) * gi])
        if hook:
            hook("before_stage2", step)
        return launch_reduce(layout, bufs.f.local, bufs.i.local, B, params=params, logprobs=logprobs, parity=par)
