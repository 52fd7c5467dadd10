"""``reduction="group_logmass"``: the paper's Algorithm I.4, O(1) values per row and rank.

Each rank samples from its own shard and computes the shard's log-mass, then the ranks
swap one (token, log-probability, log-sum-exp) triple per row and every rank picks
the winning shard by Gumbel-max over the log-masses (``fsdist.ops.group_select``).
Exact in distribution by the group factorisation (paper Lemma D.2): P(shard k) =
exp(L_k) / sum_j exp(L_j) and, given k, the local sample follows the shard's softmax.
Unlike ``candidates`` the tokens are not those of fsdist.sample for the same seed (the
shard choice uses its own noise stream), but the distribution is the same and the
exchange is tp * 12 bytes per row instead of tp * n_tiles * (8 or 20) bytes.

One step:
  1. stage 1 + stage 2 of the single-GPU sampler on the local shard, with logprobs,
     into a private candidate buffer (noise keyed by global ids);
  2. publish the triple into this rank's slot of the exchange buffer: through the peer
     table into every rank's buffer (peer-store transports) then a barrier, or into
     the local buffer then an in-place all-gather (collective);
  3. group select on every rank (identical inputs, identical noise: identical result).
The exchange buffer is doubled by step parity like the candidate buffer (the parity
comes from the reduction's device counter; one copy with the collective transport).
"""
import torch

from ..ops.configs import TileConfig
from ..ops.group_select import ExchangeLayout, launch_group_publish, launch_group_select
from ..ops.sampler import CandidateLayout, launch_fused, launch_reduce
from .._validation import RowParams
from .reduction import DebugHook, Reduction
from .step_buffers import StepBuffers


class GroupLogmassReduction(Reduction):
    name = "group_logmass"

    def _allocate(self) -> None:
        self.local_layout = CandidateLayout(CandidateLayout.fields(True), self.n_local, self.capacity, 1)
        # Private: only this rank's own stages touch it, in stream order.
        self.local_f, self.local_i = self.local_layout.alloc(self.device)
        self.exchange = ExchangeLayout(self.tp, self.capacity)
        self.buffers = StepBuffers(self.transport, self.exchange.float_numel, self.exchange.int_numel,
                                   self.counter, self.num_buffers)

    def _release(self) -> None:
        self.buffers.free()
        self.buffers = None
        self.local_f = self.local_i = None

    def _sample(self, hidden: torch.Tensor, weight: torch.Tensor, params: RowParams, cfg: TileConfig, step: int,
                logprobs: bool, hook: DebugHook = None, stage1=None):
        stage1 = stage1 or launch_fused
        B = hidden.shape[0]
        part, t, x = self.partition, self.transport, self.exchange
        bufs = self.buffers
        par = bufs.parity  # the kernels add the copy of the current step to their offsets
        if hook:
            hook("before_stage1", step)
        # 1. local exact sample, log-probability and log-mass of this shard
        stage1(hidden, weight, params, cfg, self.local_layout, self.local_f, self.local_i,
                     vocab_size=part.vocab_size, vocab_start=part.start, group=0, logprobs=True)
        tok, lp, _lse, stats = launch_reduce(self.local_layout, self.local_f, self.local_i, B, params=params,
                                             logprobs=True, stats=True)
        # 2. exchange the triples
        if t.peer_stores:
            launch_group_publish(tok, lp, stats, x, bufs.f.peer_ptrs, bufs.i.peer_ptrs, rank=self.rank,
                                 npeers=self.tp, parity=par)
            t.barrier()
        else:
            # One copy (parity strides 0): the all-gather below needs host-known slices.
            f, i = bufs.f.local, bufs.i.local
            launch_group_publish(tok, lp, stats, x, f, i, rank=self.rank, parity=par)
            out_f = f[:x.float_numel]
            out_i = i[:x.int_numel]
            r = self.rank
            t.all_gather_into(out_f, out_f[r * x.stride_rank:(r + 1) * x.stride_rank])
            t.all_gather_into(out_i, out_i[r * x.stride_rank_i:(r + 1) * x.stride_rank_i])
        if hook:
            hook("before_stage2", step)
        # 3. choose the shard, identically on every rank
        tokens, glp, glse = launch_group_select(x, bufs.f.local, bufs.i.local, B, params, parity=par)
        return tokens, (glp if logprobs else None), (glse if logprobs else None)
