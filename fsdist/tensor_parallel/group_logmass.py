"""``reduction="group_logmass"``: the paper's Algorithm I.4, O(1) values per row and rank.

Each rank samples from its own shard and computes the shard's log-mass, then the ranks
swap one (token, log-probability, max logit, log-sum) record per row and every rank
picks the winning shard by Gumbel-max over the log-masses (``fsdist.ops.group_select``).
Exact in distribution by the group factorisation (paper Lemma D.2): P(shard k) =
exp(L_k) / sum_j exp(L_j) and, given k, the local sample follows the shard's softmax.
Unlike ``candidates`` the tokens are not those of fsdist.sample for the same seed (the
shard choice uses its own noise stream), but the distribution is the same and the
exchange is tp * 16 bytes per row instead of tp * n_tiles * (8 bytes plain, 20 with logprobs,
more with filters or top-N: fsdist.ops.layout) bytes.

One step:
  1. stage 1 + stage 2 of the single-GPU sampler on the local shard, with logprobs and
     the (M, log S) statistics, into a private candidate buffer (noise keyed by global ids);
  2. publish the record into this rank's slot of the exchange buffer and exchange
     (``Transport.write_target`` / ``exchange``);
  3. group select on every rank (identical inputs, identical noise: identical result).
The record carries the call's header (``fsdist.ops.step_check``), checked by the select
on every rank. The exchange buffer is doubled by step parity like the candidate buffer
(the parity comes from the reduction's device counter; one copy with the collective
transport).
"""
from typing import Optional

import torch

from ..ops.group_select import ExchangeLayout, launch_group_publish, launch_group_select
from ..ops.layout import BufferPair
from ..ops.merge_candidates import launch_merge
from ..ops.plan import launch_stage1
from ..params import RowParams
from ..processing import has_entries
from .reduction import CallOptions, Reduction
from .step_buffers import StepBuffers


class GroupLogmassReduction(Reduction):

    def _allocate(self) -> None:
        # Private: only this rank's own stages touch it, in stream order.
        self.local = None  # allocated per plan's layout below, sized for the capacity
        self.exchange_layout = ExchangeLayout(self.tp, self.capacity, checked=True)
        self.buffers = StepBuffers(self.transport, self.exchange_layout.float_numel, self.exchange_layout.int_numel,
                                   self.counter, self.seam.num_buffers)
        self._prepare_barriers()  # the step's barrier, with device_barrier on

    def _blocks(self):
        return self.exchange_layout.stride_rank, self.exchange_layout.stride_rank_i

    def _header_slots(self):
        return self.exchange_layout.stride_rank_i, self.exchange_layout.record_slot

    def _release(self) -> None:
        if self.buffers is not None:
            self.buffers.free()
        self.buffers = None
        self.local = None

    def _sample(self, hidden: torch.Tensor, weight: torch.Tensor, params: RowParams, opts: CallOptions, step: int):
        B = hidden.shape[0]
        part, x, bufs = self.partition, self.exchange_layout, self.buffers
        logprobs, path = opts.logprobs, opts.path
        plan = self.plan(B, hidden.shape[1], True, path, n_shards=1, dtype=hidden.dtype,
                         sparse_processors=has_entries(params.processing))
        if self.local is None:
            self.local = BufferPair.alloc(plan.layout, self.device)
        self.seam.call("before_stage1", step)
        # 1. local exact sample, log-probability and (M, log S) of this shard
        launch_stage1(plan, hidden, weight, params, self.local, vocab_size=part.vocab_size, vocab_start=part.start)
        tok, lp, _lse, stats = launch_merge(plan.layout, self.local, B, params, logprobs=True, stats=True)
        # 2. exchange the records
        # flags read only plan.path, which logprobs does not change: the stage-1 plan's is the call's
        flags = opts.flags(plan)
        launch_group_publish(tok, lp, stats, x, bufs.dest, rank=self.rank, params=params, flags=flags)
        bufs.exchange(x.stride_rank, x.stride_rank_i)
        self.seam.call("before_stage2", step)
        # 3. choose the shard, identically on every rank
        tokens, glp, glse = launch_group_select(x, bufs.src, B, params, check=self.header_check())
        return tokens, (glp if logprobs else None), (glse if logprobs else None), None, None, None
