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
  peer's buffer through the peer address table. Completion is signalled one way: each
  stage-1 program, after its stores, adds 1 to its rank's counter in every peer's
  counter array (release, system scope), and stage 2 waits (acquire) until every
  rank's counter reaches the running total of programs launched so far. That replaces
  a group barrier (two round trips) with one. ``FSDIST_TP_SYNC=barrier`` restores the
  barrier;
* collective: the kernel writes the local buffer's group r, then an in-place
  all-gather of the tp group blocks.

Buffers are doubled by step parity (see step_buffers.py) so a fast rank's next
step never overwrites a slot a slow rank is still reducing. The signal keeps that
argument: a rank writes copy s % 2 again only in step s+2, after its own stage 2 of
step s+1 saw every peer's stage-1 programs of step s+1, which every peer queues after
its stage 2 of step s.
"""
import os

import torch

from ..ops.configs import TileConfig
from ..ops.sampler import CandidateLayout, launch_fused, launch_reduce
from .._validation import RowParams
from .reduction import DebugHook, Reduction
from .step_buffers import StepBuffers


class CandidatesReduction(Reduction):
    name = "candidates"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        sync = os.environ.get("FSDIST_TP_SYNC", "signal")
        if sync not in ("signal", "barrier"):
            raise ValueError(f"FSDIST_TP_SYNC must be 'signal' or 'barrier', got {sync!r}")
        self.sync = sync if self.transport.peer_stores else "collective"
        self.counters = None  # per-writer completion counters (signal sync), allocated once
        self.signalled = 0  # programs every rank has launched so far: the waiters' target

    def _ensure_counters(self) -> None:
        if self.counters is None:
            self.counters = self.transport.alloc(self.tp, torch.int64)
            self.counters.local.zero_()
            self.transport.barrier()  # every copy is zero before anyone signals into it

    def close(self) -> None:
        super().close()
        if self.counters is not None:
            self.transport.free(self.counters)
            self.counters = None

    def _layout(self, logprobs: bool) -> CandidateLayout:
        return CandidateLayout(CandidateLayout.fields(logprobs), self.n_local, self.capacity, self.tp)

    def _allocate(self) -> None:
        # Sized for the logprobs layout (4 fields); a call without logprobs uses a prefix of each copy.
        full = self._layout(True)
        self.buffers = StepBuffers(self.transport, full.float_numel, full.int_numel, self.num_buffers)

    def _release(self) -> None:
        self.buffers.free()
        self.buffers = None

    def run(self, hidden: torch.Tensor, weight: torch.Tensor, params: RowParams, cfg: TileConfig, step: int,
            logprobs: bool, hook: DebugHook = None, stage1=launch_fused):
        B = hidden.shape[0]
        self.ensure_capacity(B)
        layout = self._layout(logprobs)
        bufs = self.buffers
        base_f, base_i = bufs.offsets(step)
        part, t = self.partition, self.transport
        if hook:
            hook("before_stage1", step)
        wait = None
        if t.peer_stores and self.sync == "signal":
            self._ensure_counters()
            programs = stage1(hidden, weight, params, cfg, layout, bufs.f.peer_ptrs, bufs.i.peer_ptrs,
                              vocab_size=part.vocab_size, vocab_start=part.start, group=self.rank,
                              base_f=base_f, base_i=base_i, npeers=self.tp, logprobs=logprobs,
                              signal=(self.counters.peer_ptrs, self.rank))
            # Every rank launches the same programs (same B, same config): one target for all.
            self.signalled += programs
            wait = (self.counters.local, self.signalled)
        elif t.peer_stores:
            stage1(hidden, weight, params, cfg, layout, bufs.f.peer_ptrs, bufs.i.peer_ptrs,
                   vocab_size=part.vocab_size, vocab_start=part.start, group=self.rank,
                   base_f=base_f, base_i=base_i, npeers=self.tp, logprobs=logprobs)
            t.barrier()
        else:
            f, i = bufs.f.local, bufs.i.local
            stage1(hidden, weight, params, cfg, layout, f, i,
                         vocab_size=part.vocab_size, vocab_start=part.start, group=self.rank,
                         base_f=base_f, base_i=base_i, logprobs=logprobs)
            gf, gi = layout.stride_group, layout.stride_group_i
            out_f = f[base_f:base_f + self.tp * gf]
            out_i = i[base_i:base_i + self.tp * gi]
            t.all_gather_into(out_f, out_f[self.rank * gf:(self.rank + 1) * gf])
            t.all_gather_into(out_i, out_i[self.rank * gi:(self.rank + 1) * gi])
        if hook:
            hook("before_stage2", step)
        return launch_reduce(layout, bufs.f.local, bufs.i.local, B, base_f=base_f, base_i=base_i,
                             logprobs=logprobs, wait=wait)
