"""``reduction="candidates"``: every rank's per-tile candidates meet in every rank's buffer.

The buffer is the single-GPU candidate layout with one shard block per rank,
fp32 [tp, n_fields, n_local, batch_cap] and int32 [tp, n_ifields * n_local + 2, batch_cap]
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
The layout always has every field (the logprob ones and the kept logits'), so every rank's
block has the same size whatever the call's flags (the collective transport's all-gather needs that).

Filters and top-N logprobs: every rank runs the single-GPU stage 2 for them
(``fsdist.ops.select_filtered``) on the identical merged buffer, so every rank flags the
same rows for the exact fallback. Those rows' logits are recomputed shard by shard into a
pool [tp, FALLBACK_ROWS, rows per rank] that every rank sees (``Transport.write_target`` /
``exchange``, like the candidates) and resolved on every rank, FALLBACK_ROWS rows per
round. Every rank must pass the same barriers. With peer stores (nvshmem, symm_mem, shm) every
filtered call runs ceil(B / FALLBACK_ROWS) rounds whatever the count (a round past the count exits
at once; one round covers B <= 64), and each round's two barriers are gated on the count
(``Transport.gated_barrier``): on a GPU the device skips them when the round has no row, so
nothing synchronises with the host and a CUDA graph captures the rounds. Every rank derives the
same count from the same merged buffer; in a step whose ranks diverged (filters on some ranks
only, a local error) the merge gives every row -1 and flags none, so the filtered ranks skip
exactly the barriers their peers never enqueued and the group stays in step. The collective
transport would all-gather the whole pool every round, so there the host reads the count (one
device integer, the same on every rank) and runs only the rounds needed: a filtered call on that
transport synchronises once (a plain call never does, and a single GPU never does).

Buffers are doubled by step parity (see step_buffers.py) so a fast rank's next
step never overwrites a slot a slow rank is still merging. The kernels read the
parity from the reduction's device counter, so a CUDA graph of a step alternates
the copies on replay; the collective transport has one copy (its all-gather needs a
host-known address and cannot race).
"""

import torch

from ..ops.fallback import KeptLogits, PoolLayout, launch_materialize, launch_resolve
from ..ops.layout import CandidateLayout
from ..ops.merge_candidates import launch_merge
from ..ops import configs
from ..ops.plan import asks_noise_skip, launch_stage1
from ..ops.select_filtered import launch_select_filtered
from ..params import RowParams
from ..processing import has_entries
from .reduction import CallOptions, Reduction, StepFailedLocally
from .step_buffers import StepBuffers
from .transports.base import Gate

# Always room for kept logits, so every rank's block has the same size whatever the call asks
# for (the collective transport's all-gather needs that); a plain call writes only what it uses.
N_FIELDS = CandidateLayout.fields(True, extended=True)
# Rows the shared fallback pool holds per round. Peer-store transports run ceil(B / rows)
# rounds on every filtered call without asking the host how many rows fell back (one round
# covers a decode batch of up to 64: 39 MB of pool per rank at V = 151936); the collective
# transport all-gathers the whole pool each round, so it keeps the pool small and reads the
# count instead.
FALLBACK_ROWS = 64
FALLBACK_ROWS_COLLECTIVE = 16


class CandidatesReduction(Reduction):

    def _layout(self) -> CandidateLayout:
        return CandidateLayout(N_FIELDS, self.n_local, self.capacity, self.tp, checked=True,
                               n_ifields=self._n_ifields)

    @property
    def _n_ifields(self) -> int:
        from ..ops.layout import KEEP

        return 1 + KEEP

    def _allocate(self) -> None:
        full = self._layout()
        self.buffers = StepBuffers(self.transport, full.float_numel, full.int_numel, self.counter,
                                   self.seam.num_buffers)
        rows = FALLBACK_ROWS if self.transport.peer_stores else FALLBACK_ROWS_COLLECTIVE
        self.pool_layout = PoolLayout(rows, self.partition.rows, self.tp)
        self.pool = self.transport.alloc(self.pool_layout.numel, torch.float32)
        self._prepare_barriers()  # the fallback's rounds, and the step's with device_barrier

    def _blocks(self):
        full = self._layout()
        return full.stride_shard, full.stride_shard_i

    def _header_slots(self):
        full = self._layout()
        return full.stride_shard_i, full.record_slot

    def _release(self) -> None:
        if getattr(self, "pool", None) is not None:
            self.transport.free(self.pool)
            self.pool = None
        if self.buffers is not None:
            self.buffers.free()
            self.buffers = None

    def _sample(self, hidden: torch.Tensor, weight: torch.Tensor, params: RowParams, opts: CallOptions, step: int):
        B = hidden.shape[0]
        plan = self.plan(B, hidden.shape[1], opts.logprobs, opts.path, n_shards=self.tp, n_fields=N_FIELDS,
                         checked=True, extended=opts.extended, dtype=hidden.dtype, raw_sums=opts.raw_sums,
                         winner_logits=opts.winner_logits, sparse_processors=has_entries(params.processing))
        bufs, part = self.buffers, self.partition
        self.seam.call("before_stage1", step)
        # (configs.SKIP_NOISE_TP: the single-device rule, each rank deciding from the same arguments)
        skip = configs.SKIP_NOISE_TP and asks_noise_skip(plan, params, batch=B, filtered=opts.filtered,
                                                         vocab_size=part.vocab_size)
        launch_stage1(plan, hidden, weight, params, bufs.dest, vocab_size=part.vocab_size,
                      vocab_start=part.start, shard=self.rank, flags=opts.flags(plan), skip_filtered_noise=skip)
        bufs.exchange(plan.layout.stride_shard, plan.layout.stride_shard_i)
        self.seam.call("before_stage2", step)
        tokens, lp, lse = launch_merge(plan.layout, bufs.src, B, params, logprobs=opts.logprobs, raw=opts.raw,
                                       check=self.header_check(),
                                       end_step=self.ticket if self.merge_ends_step(opts) else None)
        top_ids = top_lp = fallback = None
        if opts.filtered or opts.top_n:
            if opts.top_n:
                top_ids = torch.empty(B, opts.top_n, dtype=torch.int64, device=self.device)
                top_lp = torch.empty(B, opts.top_n, dtype=torch.float32, device=self.device)
            kept = KeptLogits(plan.layout, bufs.src, plan.config.block_v,
                              torch.empty(B, dtype=torch.int64, device=self.device))
            fallback = launch_select_filtered(plan.layout, bufs.src, B, params, vocab_size=part.vocab_size,
                                              tokens=tokens, logprobs=lp, top_n=opts.top_n, mode=opts.mode,
                                              top_ids=top_ids, top_lp=top_lp, tile_v=kept.tile_v,
                                              need_key=kept.need_key, winners=plan.winner_logits)
            self._fallback(hidden, weight, params, opts, fallback, kept, tokens, lp, top_ids, top_lp)
        return tokens, lp, lse, top_ids, top_lp, fallback

    def merge_ends_step(self, opts: CallOptions) -> bool:
        # A plain call's merge is the step's last reader of this copy. A filtered or top-N call reads the copy
        # again (select_filtered, the fallback), so its step ends after those.
        return not (opts.filtered or opts.top_n) and self.seam.merge_ends_step

    def _fallback(self, hidden, weight, params, opts, flags, kept, tokens, lp, top_ids, top_lp) -> None:
        pool, target, npeers = self.pool_layout, *self.transport.write_target(self.pool)
        if self.transport.peer_stores:
            # No host read: ceil(B / pool rows) rounds whatever the count (one for B <= 64). A round
            # past the count exits at once, and its two barriers (the exchange and the settle) are
            # gated on the count, which stays on the device: skipped by every rank alike when the
            # merged buffers agree, since every rank derives the count from the same buffer. In a step
            # whose ranks diverged (filters or top-N on some ranks only, a local error) the merge gave
            # every row -1 and flagged none, so the ranks that called with filters skip exactly the
            # barriers their peers never enqueued, instead of waiting in them forever. CUDA-graph
            # capturable. (On CPU, shm, the host reads the count for the gate: no device sync.) The gate
            # counts the flags itself, in the barrier kernel: no reduction launched per call.
            rounds, count = flags.shape[0], flags
        else:
            # Collective: read the count and run only the rounds with rows. Each round all-gathers the
            # whole pool (tens of MB at a real vocabulary), too much to pay on every filtered step (one
            # host sync per filtered call on this transport; free on CPU). Every rank derives the same
            # count from the same merged buffer, and a diverged step flags none on any rank.
            rounds, count = int(flags.sum()), None
        # A local error in a round's kernels (say, out of memory on this rank alone) must not leave the peers in
        # this round's barriers or shift the gated barriers' epochs: the rank passes every barrier of every
        # round, launching nothing more, and raises StepFailedLocally after. The step then ends as on the peers
        # (Reduction.run), and the head reports the failure to them on its next call (an error header).
        failed = None
        for start in range(0, rounds, pool.rows):
            gate = None if count is None else Gate(count, start)
            if failed is None:
                try:
                    launch_materialize(hidden, weight, pool, target, flags=flags, start=start,
                                       vocab_size=self.partition.vocab_size, vocab_start=self.partition.start,
                                       kept=kept, shard=self.rank, npeers=npeers, processing=params.processing)
                except Exception as e:  # noqa: BLE001 (re-raised below)
                    failed = e
            self.transport.exchange([(self.pool, 0, pool.stride_shard)], gate=gate)
            if failed is None:
                try:
                    launch_resolve(pool, self.pool.local, params, flags=flags, start=start,
                                   vocab_size=self.partition.vocab_size, tokens=tokens, kept=kept, logprobs=lp,
                                   top_n=opts.top_n, mode=opts.mode, top_ids=top_ids, top_lp=top_lp)
                except Exception as e:  # noqa: BLE001 (re-raised below)
                    failed = e
            self.transport.settle(gate=gate)  # every rank has read the pool before anyone refills it
        if failed is not None:
            raise StepFailedLocally(failed)
