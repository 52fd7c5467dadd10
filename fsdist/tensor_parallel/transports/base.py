"""What a transport is: symmetric buffers, a peer address table, a barrier, an all-gather.

A transport moves the tensor-parallel head's small per-step exchange (candidates, or
group-log-mass triples) between the ranks of one process group. It knows nothing of
tiles, layouts or sampling; the head asks it for flat buffers and tells it when to
synchronise.

Two families:

* peer-store transports (``nvshmem``, ``symm_mem``, ``shm``): every rank's buffer is
  mapped into every other rank's address space. ``alloc`` returns this rank's buffer
  plus an int64 table of the base addresses of *all* ranks' buffers (index = rank in
  the group), which a kernel uses to store straight into its peers' memory. After the
  stores, :meth:`Transport.barrier` makes them visible everywhere.
* collective transports (``collective``): buffers are private; each rank writes its own
  block and an all-gather assembles the blocks on every rank.

Either way a step is the same two calls, so nothing above a transport branches on the
family: kernels write through :meth:`Transport.write_target` (a peer table, or the
local buffer), then :meth:`Transport.exchange` makes every rank's block visible to every
rank (a barrier, or the all-gather).
"""
import abc
import math
import os
from typing import Any, List, NamedTuple, Optional, Sequence, Tuple

import torch
import torch.distributed as dist


#: Seconds a step barrier of fsdist's own (``Transport.device_barrier``) waits for a peer on a GPU before it
#: gives up and reports the step (a rank that skipped a call, or stalls). Generous: a peer compiling its
#: kernels on a first call can take tens of seconds; 600 s is also torch's default NCCL timeout, past which
#: any collective of the job would have failed too. Environment: FSDIST_PEER_TIMEOUT_S.
DEFAULT_PEER_TIMEOUT_S = 600.0


def device_barrier_wanted(peer_stores: bool, device: torch.device, environ=None) -> bool:
    """Whether a transport runs its step barriers as fsdist's own device barrier (``Transport.device_barrier``).

    On by default for peer-store transports on a GPU (nvshmem, symm_mem), where it is the only step barrier with a
    timeout (the libraries' barriers wait forever for a rank that skipped a call) and costs about what they cost
    (docs/performance.md v47, v49); off on CPU (shm under the interpreter: there is no device clock, so no timeout
    to gain). FSDIST_DEVICE_BARRIER=0 (or false / off / no, or empty) turns it off, any other value on (shm
    included)."""
    if not peer_stores:
        return False
    raw = (os.environ if environ is None else environ).get("FSDIST_DEVICE_BARRIER")
    if raw is None:
        return torch.device(device).type == "cuda"
    return raw.strip().lower() not in ("", "0", "false", "off", "no")


def peer_timeout_s() -> float:
    raw = os.environ.get("FSDIST_PEER_TIMEOUT_S", "")
    try:
        value = float(raw) if raw else DEFAULT_PEER_TIMEOUT_S
    except ValueError:
        raise ValueError(f"FSDIST_PEER_TIMEOUT_S must be a number of seconds, got {raw!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"FSDIST_PEER_TIMEOUT_S must be a finite number of seconds > 0, got {raw!r}")
    return value


class Gate(NamedTuple):
    """What gates an exchange / settle (Transport.gated_barrier): a barrier only when count > above."""
    count: torch.Tensor  # int32 [1], or bool [n] whose set entries are the count, on the transport's device
    above: int


class SymmetricBuffer:
    """This rank's part of a (possibly symmetric) flat allocation.

    local:     1-D tensor in this rank's memory; reductions read from it.
    peer_ptrs: int64 tensor [world_size] on the buffer's device holding the base
               address of every rank's buffer (this rank's included, at its own
               index), or None for transports without peer stores.
    """

    def __init__(self, local: torch.Tensor, peer_ptrs: Optional[torch.Tensor] = None, state: Any = None):
        self.local = local
        self.peer_ptrs = peer_ptrs
        self._state = state  # transport-private: keeps mappings / peer views alive
        self.freed = False


class Transport(abc.ABC):
    """Base class: a process group, a device, and the four operations the head needs."""

    #: registry name ("collective", "shm", "nvshmem", "symm_mem")
    name: str = "?"
    #: True if kernels may store into peers through ``SymmetricBuffer.peer_ptrs``
    peer_stores: bool = False

    def __init__(self, group, device: torch.device):
        self.group = group
        self.device = torch.device(device)
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self._buffers: List[SymmetricBuffer] = []
        self._ag_fn = None
        self._gate = None  # GatedBarrier, from prepare_gated_barrier()
        #: Peer-store transports: run every step barrier (exchange, settle) as fsdist's own device barrier
        #: (transports/gated_barrier.py: a signal pad, with a timeout on GPUs once a status word is attached by
        #: report_timeouts) instead of the library's (nvshmem barrier_all, symm_mem's handle barrier, a host
        #: barrier for shm). Set before the head allocates (prepare_gated_barrier). On by default on GPUs since
        #: 2026-11-27 (device_barrier_wanted; FSDIST_DEVICE_BARRIER=0 turns it off).
        self.device_barrier = device_barrier_wanted(self.peer_stores, self.device)
        self.closed = False

    # ---- buffers -------------------------------------------------------------------
    # An allocation has a local part, which may fail on one rank alone (out of memory), and a
    # collective part (exchanging handles). alloc() puts an agreement between the two: every
    # rank learns whether any rank's local part failed, and then all raise or all connect,
    # so no rank is left waiting in a collective its peer never entered.
    def _reserve(self, numel: int, dtype: torch.dtype) -> Any:
        """The local part (no communication); may raise. Default: a plain device tensor."""
        return torch.empty(numel, dtype=dtype, device=self.device)

    @abc.abstractmethod
    def _connect(self, local: Any, numel: int, dtype: torch.dtype) -> SymmetricBuffer:
        """The collective part, on every rank, after every rank's _reserve succeeded."""

    def _unreserve(self, local: Any) -> None:
        """Undo a successful _reserve without communicating (another rank's failed)."""

    def _free(self, buf: SymmetricBuffer) -> None:
        buf.local = None
        buf.peer_ptrs = None
        buf._state = None

    def alloc(self, numel: int, dtype: torch.dtype) -> SymmetricBuffer:
        """Collective: every rank of the group must call it with the same numel / dtype, in order."""
        if self.closed:
            raise RuntimeError(f"{self.name} transport is closed")
        if numel < 1:
            raise ValueError(f"buffer size must be >= 1 element, got {numel}")
        local, error = None, None
        try:
            local = self._reserve(int(numel), dtype)
        except Exception as e:  # e.g. out of memory on this rank only
            error = f"{type(e).__name__}: {e}"
        errors = [None] * self.world_size
        dist.all_gather_object(errors, error, group=self.group)
        failed = [(r, e) for r, e in enumerate(errors) if e]
        if failed:
            if local is not None:
                self._unreserve(local)
            raise RuntimeError(f"{self.name} transport: allocating {numel} x {dtype} failed on "
                               + "; ".join(f"rank {r}: {e}" for r, e in failed))
        buf = self._connect(local, int(numel), dtype)
        self._buffers.append(buf)
        return buf

    def free(self, buf: SymmetricBuffer) -> None:
        """Collective: release a buffer from :meth:`alloc` (no-op if already freed)."""
        if buf.freed:
            return
        buf.freed = True
        if buf in self._buffers:
            self._buffers.remove(buf)
        self._free(buf)

    # ---- the exchange ----------------------------------------------------------------
    def write_target(self, buf: SymmetricBuffer) -> Tuple[torch.Tensor, Optional[int]]:
        """(what a kernel stores through, number of peers or None) for rank blocks of ``buf``:
        the peer address table and the group size, or this rank's own buffer."""
        if self.peer_stores:
            return buf.peer_ptrs, self.world_size
        return buf.local, None

    def exchange(self, blocks: Sequence[Tuple[SymmetricBuffer, int, int]], gate: Optional[Gate] = None) -> None:
        """Publish this rank's block of each buffer and see everyone's.

        blocks: (buffer, element offset of the blocks, elements per rank block); rank r's
        block is ``[offset + r * n, offset + (r + 1) * n)``. Every rank has written its own
        block through :meth:`write_target`. On return every rank's buffer holds every
        block (stream ordered on GPUs). Collective.

        gate: (count, above): with peer stores, the barrier is :meth:`gated_barrier` (nothing to
        wait for, or to see, unless the device integer count > above). Collective transports
        ignore it: they all-gather whenever called, so their callers read such counts on the host.
        """
        if self.peer_stores:
            self._barrier_or_gated(gate)
            return
        for buf, offset, n in blocks:
            out = buf.local[offset:offset + self.world_size * n]
            self.all_gather_into(out, out[self.rank * n:(self.rank + 1) * n])

    def settle(self, gate: Optional[Gate] = None) -> None:
        """Every rank has finished reading what its peers wrote since the last exchange, so the
        buffers may be written again: a barrier for peer stores (a peer could otherwise overwrite
        a slot still being read), nothing for collectives (they write only inside the collective).
        gate: as for :meth:`exchange`."""
        if self.peer_stores:
            self._barrier_or_gated(gate)

    def _barrier_or_gated(self, gate: Optional[Gate]) -> None:
        if gate is not None:
            self.gated_barrier(*gate)
        elif self._gate is not None and self.device_barrier:
            self._gate.open()
        else:
            self.barrier()

    # ---- synchronisation -----------------------------------------------------------
    def barrier(self) -> None:
        """Every rank's earlier stores into any buffer of this transport are visible on return.

        On GPUs this is stream ordered: work queued on the current stream after the
        barrier runs after every rank's work queued before it.
        """
        dist.barrier(group=self.group)

    def prepare_gated_barrier(self) -> None:
        """Collective, once (later calls do nothing): what :meth:`gated_barrier` needs on a GPU with
        peer stores (a symmetric signal pad; ``transports/gated_barrier.py``). Call it where every
        rank is (e.g. when the head allocates), never on the first gated call: that call may be
        one some ranks skip."""
        if self._gate is None and self.peer_stores and (self.device.type == "cuda" or self.device_barrier):
            from .gated_barrier import GatedBarrier

            self._gate = GatedBarrier(self)

    def report_timeouts(self, status: torch.Tensor, bit: int, timeout_s: Optional[float] = None) -> None:
        """Let this transport's device barriers give up on a peer after ``timeout_s`` (default
        FSDIST_PEER_TIMEOUT_S, else DEFAULT_PEER_TIMEOUT_S) and OR ``bit`` into ``status[1]`` (the caller's
        int32 [2] status word) instead of waiting forever. After prepare_gated_barrier; no-op without a
        device barrier (other transports' barriers time out as their library does, or not at all)."""
        if self._gate is not None:
            self._gate.attach_status(status, bit, peer_timeout_s() if timeout_s is None else timeout_s)

    def gated_barrier(self, count: torch.Tensor, above: int) -> None:
        """:meth:`barrier` if the count > ``above``, nothing otherwise; every rank must decide the same
        way (a rank that would skip may also not call). ``count``: one int32 on this transport's
        device, or a 1-D bool tensor there whose set entries are counted. On a GPU with peer stores
        the device decides (``transports/gated_barrier.py``): no host read, CUDA-graph capturable.
        Elsewhere the host reads the count: free on CPU, one synchronisation on a GPU (the
        collective transport, whose callers read it anyway)."""
        from .gated_barrier import check_count, host_count

        if self._gate is not None:
            self._gate(count, above)  # checks the count
            return
        check_count(count, self.device)  # before the error below: a bad count is the caller's first mistake
        if self.peer_stores and self.device.type == "cuda":
            raise RuntimeError(f"{self.name} transport: gated_barrier() before prepare_gated_barrier()")
        if host_count(count) > above:
            self.barrier()

    def all_gather_into(self, out: torch.Tensor, inp: torch.Tensor) -> None:
        """out (world_size * n elements) = concatenation of every rank's inp (n elements).

        ``inp`` may be this rank's chunk of ``out`` (in-place all-gather).
        """
        if self._ag_fn is None:
            # torch >= 2.13 names it all_gather_single; older versions all_gather_into_tensor.
            self._ag_fn = getattr(dist, "all_gather_single", None) or getattr(dist, "all_gather_into_tensor", None)
            if self._ag_fn is None:
                self._ag_fn = _all_gather_via_list
        try:
            self._ag_fn(out, inp, group=self.group)
        except (RuntimeError, NotImplementedError) as e:
            # Backends without a flat all-gather reject it before communicating, on every
            # rank alike, so switching to the list form here cannot desynchronise ranks.
            msg = str(e).lower()
            unsupported = isinstance(e, NotImplementedError) or "support" in msg or "implement" in msg
            if self._ag_fn is _all_gather_via_list or not unsupported:
                raise
            self._ag_fn = _all_gather_via_list
            self._ag_fn(out, inp, group=self.group)

    # ---- lifetime ------------------------------------------------------------------
    def close(self) -> None:
        """Collective: free every buffer still allocated (in allocation order)."""
        if self.closed:
            return
        for buf in list(self._buffers):
            self.free(buf)
        self._gate = None  # its pad was one of the buffers
        self.closed = True


def _all_gather_via_list(out: torch.Tensor, inp: torch.Tensor, group=None) -> None:
    world = dist.get_world_size(group)
    chunks = list(out.view(world, -1).unbind(0))
    # The input may alias one of the outputs; gather from a private copy.
    dist.all_gather(chunks, inp.clone(), group=group)
