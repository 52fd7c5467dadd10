"""Common base of the two cross-rank reductions: planning, buffers, step bookkeeping.

Every call of the head is one *step* on every rank, and every step goes through the
same exchange on every rank, whatever happened locally: a normal step publishes this
rank's candidates (or group-log-mass record) with the call's header
(``fsdist.ops.step_check``); a rank that hit a local error, or has an empty batch,
publishes a header alone (:meth:`Reduction.skip_step`). So no rank ever waits in an
exchange that a peer skipped, and every rank's merge sees what every other rank did.

The step counter that picks the exchange buffer's copy lives here, in device memory
(``counter``, one int64), so that a CUDA graph captured around a step reads and advances
it at replay time (see step_buffers.py); the header's step word is read from it too.

Buffers are laid out for a batch capacity fixed at construction (``max_batch_size``)
and grown only by :meth:`reserve`, a collective every rank calls. A forward never grows
them: growing inside a step would be a collective that a rank with another batch size
skips, i.e. a hang. A batch larger than the capacity is a local error like any other.
"""
from dataclasses import dataclass
from typing import Optional, Tuple

import torch

from ..ops.plan import SamplePlan, plan_sample, raw_sums_needed, winner_logits_needed
from ..ops.step_check import (HeaderCheck, call_flags, launch_end_step, launch_step_record, launch_verify_step,
                              new_ticket, STATUS_PEER_TIMEOUT)
from ..ops.utils import cdiv
from ..params import LOGPROBS_MODES, RowParams
from .health import StepMonitor
from .testing import HeadTestSeam
from .transports.base import Transport
from .vocab import VocabPartition

DEFAULT_MAX_BATCH_SIZE = 256


@dataclass(frozen=True)
class CallOptions:
    """What one forward asks for besides its per-row parameters (the same on every rank)."""

    logprobs: bool = False
    path: Optional[str] = None
    filtered: bool = False  # some row may have a filter on
    top_n: int = 0
    mode: str = "scaled"
    min_p: bool = False  # some row may have min-p on

    @property
    def winner_logits(self) -> bool:
        """Stage 1 writes the tile winners' logits for select_filtered's min-p proof."""
        return winner_logits_needed(self.filtered, self.min_p)

    @property
    def raw(self) -> bool:
        return self.logprobs and self.mode == "raw"

    @property
    def extended(self) -> bool:
        return self.filtered or self.top_n > 0 or self.raw

    @property
    def raw_sums(self) -> bool:
        return raw_sums_needed(self.mode, self.logprobs, self.top_n)

    def flags(self, plan: Optional[SamplePlan] = None) -> int:
        """The header's flags word (step_check.py) for this call."""
        chunked = plan is not None and plan.path == "chunked"
        return call_flags(self.logprobs, chunked, self.extended, self.top_n, LOGPROBS_MODES.index(self.mode))


def capacity_for(batch: int) -> int:
    """Rows to allocate for ``batch``: the next power of two, at least 16."""
    return max(16, 1 << (max(1, batch) - 1).bit_length())


class StepFailedLocally(Exception):
    """Raised by a reduction's step for an error of this rank alone (``error``) after the step's exchange, once
    the rank has passed every later barrier of the step (the peers then finished it without this rank's share
    of the work; their results for that step are not to be trusted)."""

    def __init__(self, error: BaseException):
        super().__init__(str(error))
        self.error = error


class Reduction:
    """Owns the exchange buffers of one head; ``run`` does one sampling step."""

    def __init__(self, transport: Transport, partition: VocabPartition, block_v: int, device: torch.device,
                 seam: HeadTestSeam):
        self.transport = transport
        self.partition = partition
        self.block_v = block_v
        self.seam = seam
        self.device = device
        self.rank = transport.rank
        self.tp = transport.world_size
        self.n_local = cdiv(partition.rows, block_v)  # vocabulary tiles per rank
        self.capacity = 0
        # The group's answer to configs.fast_memory (the head sets it after construction agrees on it).
        self.fast_memory = False
        self.buffers = None  # StepBuffers
        # Steps run on the device (eager calls and graph replays); parity = copy in use.
        # int64: never wraps in practice.
        self.counter = torch.zeros(1, dtype=torch.int64, device=device)
        self.monitor = StepMonitor(device, where=f"rank {self.rank} of {self.tp}")
        self.captured = False  # a CUDA graph holds pointers into the current buffers
        self.failed: Optional[str] = None  # a step that failed here after the exchange (StepFailedLocally)
        # A step whose merge is its last reader lets the merge's last program end it (step_check.finish_step),
        # counted with this ticket (merge_ends_step says which steps).
        self.ticket = new_ticket(device)
        # No buffers yet: the head calls reserve() on every rank once every rank has built this.

    # ---- subclasses ----------------------------------------------------------------
    def _allocate(self) -> None:
        """Allocate the buffers for self.capacity (collective)."""
        raise NotImplementedError

    def _release(self) -> None:
        """Free the buffers _allocate made, also after it failed part way (collective)."""
        raise NotImplementedError

    def _sample(self, hidden: torch.Tensor, weight: torch.Tensor, params: RowParams, opts: CallOptions,
                step: int) -> Tuple:
        """One step: (tokens, logprobs, lse, top_ids, top_logprobs, fallback), None where not asked."""
        raise NotImplementedError

    def merge_ends_step(self, opts: CallOptions) -> bool:
        """Whether this call's merge is the step's last reader of its buffer copy and so ends the step itself
        (launch_merge(end_step=ticket)); otherwise run() launches end_step after _sample. Default: never."""
        return False

    def _blocks(self) -> Tuple[int, int]:
        """(fp32, int32) elements of one rank's block of the exchange buffers."""
        raise NotImplementedError

    def _header_slots(self) -> Tuple[int, int]:
        """(int32 stride between ranks' blocks, offset of the step record inside a block)."""
        raise NotImplementedError

    # ---- shared ----------------------------------------------------------------------
    def plan(self, batch: int, hidden_size: int, logprobs: bool, path: Optional[str], n_shards: int,
             n_fields: Optional[int] = None, checked: bool = False, extended: bool = False,
             dtype: Optional[torch.dtype] = None, raw_sums: bool = True,
             winner_logits: bool = False, sparse_processors: bool = False) -> SamplePlan:
        """Stage 1 of this rank's shard, into a buffer of the current capacity with n_shards blocks.
        sparse_processors: the call applies logit bias / penalty entries (the path and tile rules of fsdist.sample:
        chunked past one 128-row tile, the warp-specialised 64-row tile from B = 17 on fast memory; every rank gets
        the same call, and the step record catches one that took another path)."""
        return plan_sample(batch=batch, hidden_size=hidden_size, weight_rows=self.partition.rows, device=self.device,
                           logprobs=logprobs, path=path, block_v=self.block_v, n_shards=n_shards,
                           batch_cap=self.capacity, n_fields=n_fields, checked=checked, extended=extended,
                           dtype=dtype, raw_sums=raw_sums, winner_logits=winner_logits,
                           sparse_processors=sparse_processors, fast_memory=self.fast_memory)

    def header_check(self) -> HeaderCheck:
        return HeaderCheck(self.rank, self.monitor.status)

    def _prepare_barriers(self) -> None:
        """Collective (every rank allocates here): the transport's device barrier (the fallback's gated rounds;
        every step barrier with ``device_barrier`` on), whose timeouts report into this head's status word."""
        self.transport.prepare_gated_barrier()
        self.transport.report_timeouts(self.monitor.status, STATUS_PEER_TIMEOUT)

    def capturing(self) -> bool:
        """Whether the current stream of this reduction's device is capturing a CUDA graph."""
        return self.device.type == "cuda" and torch.cuda.is_current_stream_capturing()

    def _note_capture(self) -> None:
        if self.capturing():
            self.captured = True

    def run(self, hidden: torch.Tensor, weight: torch.Tensor, params: RowParams, opts: CallOptions,
            step: int) -> Tuple:
        """One sampling step across the group (the batch fits the capacity: the head checked).
        ``step`` is the host count, for the test seam only: the exchange buffer's copy and the
        header's step come from ``self.counter``."""
        self._note_capture()
        try:
            out = self._sample(hidden, weight, params, opts, step)
        except StepFailedLocally as e:
            # This rank passed every exchange and barrier of the step, so the group stays in step: end it as
            # the peers did, and remember the failure (the head reports it to the peers on its next call).
            self._end_step()
            self.failed = f"{type(e.error).__name__}: {e.error}"
            raise e.error
        self._end_step(launch=not self.merge_ends_step(opts))
        return out

    def skip_step(self, batch: int, flags: int, error: int, step: int) -> None:
        """Take part in a step without candidates: publish a header alone, exchange, check the
        records. What a rank does on a local error (error != 0) or an empty batch."""
        self._note_capture()
        stride_i, record = self._header_slots()
        self.seam.call("before_stage1", step)
        launch_step_record(self.buffers.dest, self.rank * stride_i + record, batch, flags, error)
        self.buffers.exchange(*self._blocks())
        self.seam.call("before_stage2", step)
        launch_verify_step(self.buffers.src, self.rank, self.tp, stride_i, record, self.monitor.status)
        self._end_step()

    def _end_step(self, launch: bool = True) -> None:
        # Stream ordered after this step's last reader of its copy, and captured by a graph, so every
        # replay advances it too; the step's header findings join the sticky word. launch=False: the
        # merge's last program has done it (merge_ends_step).
        if launch:
            launch_end_step(self.counter, self.monitor.status)
        self.monitor.after_step()

    def check_reserve(self, batch: int) -> None:
        """Raise (locally) if growing to ``batch`` rows is not allowed now."""
        if batch <= self.capacity:
            return
        if self.capturing():
            raise RuntimeError(f"reserve({batch}) during CUDA-graph capture: growing needs a collective allocation")
        if self.captured:
            raise RuntimeError(
                f"reserve({batch}) after a CUDA graph was captured on the current buffers: growing would free "
                "memory the graph still uses. Reserve the largest batch before any capture.")

    def reserve(self, batch: int) -> None:
        """Make the buffers hold ``batch`` rows. Collective when it (re)allocates: every rank
        must call it with the same value; a no-op when the batch fits. An allocation failure is
        agreed by the transport (every rank raises): the old capacity is then allocated again if
        it can be, else the reduction is left without buffers (``buffers`` None, capacity 0)."""
        if batch <= self.capacity:
            return
        self.check_reserve(batch)
        old = self.capacity
        if old:
            self._release()
            self.capacity = 0
        try:
            self.capacity = capacity_for(batch)
            self._allocate()
        except Exception as grow_error:
            self._release()  # whatever _allocate made before failing (every rank alike: allocations are agreed)
            self.capacity = 0
            if old:
                try:
                    self.capacity = old
                    self._allocate()
                except Exception:
                    self._release()
                    self.capacity = 0
            kept = f"it keeps max_batch_size {self.capacity}" if self.capacity else "it has no buffers now"
            raise RuntimeError(f"reserve({batch}) could not allocate the exchange buffers ({grow_error}); "
                               f"{kept}") from grow_error

    def close(self) -> None:
        """Collective."""
        if self.capacity:
            self._release()
            self.capacity = 0
