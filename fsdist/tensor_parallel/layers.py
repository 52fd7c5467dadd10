"""ShardedFlashLMHead: a vocabulary-parallel LM head that samples instead of returning logits.

Composition (each piece knows only its own job):

* ``vocab.vocab_partition``  -- padding and which global ids this rank owns;
* ``agreement``              -- every rank built the same head (or everyone raises);
* ``transports``             -- buffers every rank can see, a barrier, an all-gather;
* ``candidates`` / ``group_logmass`` -- one sampling step across the group, built from
  the single-GPU plan and kernels in ``fsdist.ops`` (which know nothing of ranks).

Lock-step contract: ``forward`` is a collective. Every rank of ``tp_group`` calls it the
same number of times, with the same batch size, the same options (``return_logprobs``,
``path``, ``top_logprobs``, ``logprobs_mode``), the same per-row parameters (temperature,
seed, offset, filters) and processors, on its own weight shard and the same hidden states. Every rank then returns the same SampleOutput. A CUDA graph
replay of a captured ``forward`` counts as a call: every rank replays the same number
of times, in the same order relative to its eager calls.

CUDA graphs: ``forward`` can be captured once all its host-side work is done (the
Triton kernels are compiled, after one eager call, and the exchange buffers are large
enough: ``max_batch_size`` at construction or :meth:`reserve`, since a forward never grows
them). The buffer parity is read from
a device counter (``step_counter``) that every step advances on the stream, so
replays alternate the exchange buffers like eager calls do. See
docs/tensor_parallel.md, "CUDA graphs".
"""
import logging
from typing import Optional, Union

import torch
import torch.distributed as dist
from torch import nn

from .. import rows, validation
from ..env import apply_safe_env
from ..ops.configs import TileConfig, default_block_v, fast_memory
from ..ops.step_check import ERROR_INPUT
from ..types import Penalties, SampleOutput, SparseLogits
from . import agreement, head_args, transports
from .candidates import CandidatesReduction
from .group_logmass import GroupLogmassReduction
from .health import TensorParallelMismatchError  # noqa: F401  (documented with forward)
from .reduction import DEFAULT_MAX_BATCH_SIZE
from .testing import HeadTestSeam
from .vocab import vocab_partition

log = logging.getLogger("fsdist")

REDUCTIONS = {"candidates": CandidatesReduction, "group_logmass": GroupLogmassReduction}


class ShardedFlashLMHead(nn.Module):
    """Vocabulary-parallel LM head with FlashSampling fused into its matmul.

    Args:
        hidden_size: D.
        vocab_size: true vocabulary size V; ids >= V (padding) are never sampled.
        tp_group: the tensor-parallel process group (default: the whole world).
        transport: "auto" | "nvshmem" | "symm_mem" | "collective" | "shm" (CPU tests).
        reduction: "candidates" (same tokens as fsdist.sample on the full weight) or
            "group_logmass" (paper Alg. I.4: O(1) exchange per row, exact in distribution).
        make_vocab_size_divisible_by: V is padded to a multiple of this times tp.
        params_dtype: dtype of the weight shard (bf16, fp16 or fp32).
        device: device of the shard (default: the current CUDA device, else CPU).
        block_v: vocabulary tile of the fused kernel. It fixes the exchange buffer's
            layout, so it is chosen once here (default: fsdist.ops.configs.default_block_v).
        max_batch_size: rows the exchange buffers hold (default 256), allocated here. A
            larger batch raises (on every rank); grow with :meth:`reserve` on every rank.
        weight: this rank's shard [V_padded / tp, D] as an existing tensor (e.g. a model's own
            Parameter): the head uses it as ``head.weight`` without allocating or copying a
            shard of its own (``owns_weight`` is then False). It must have exactly this rank's
            rows (an error names the partition and the tp_group size), ``params_dtype``, live
            on ``device`` (default: the weight's device) and be contiguous. It is not
            registered as one of the head's parameters, so the head adds nothing to the
            owner's ``state_dict`` or optimizer; changes to it (loading a checkpoint, in-place
            dtype casts of ``.data``) are seen by the next call. See :meth:`from_megatron`.
        vocab_size_is_true: a ``vocab_size`` that is a multiple of the padding unit
            (``make_vocab_size_divisible_by * tp``) warns, since it may be a padded size (then
            padding rows could be sampled); True says it is the true vocabulary.
        test_seam: tests and benchmarks only (``fsdist.tensor_parallel.testing``).

    Attributes: ``weight`` [V_padded / tp, D], this rank's contiguous rows
    ``[vocab_start, vocab_end)``; ``owns_weight``; ``partition``
    (fsdist.tensor_parallel.vocab.VocabPartition); ``transport_name`` (the resolved
    transport); ``tp_rank``, ``tp_size``.
    """

    def __init__(self, hidden_size: int, vocab_size: int, *, tp_group=None, transport: str = "auto",
                 reduction: str = "candidates", make_vocab_size_divisible_by: int = 128,
                 params_dtype: torch.dtype = torch.bfloat16, device=None, block_v: Optional[int] = None,
                 max_batch_size: Optional[int] = None, test_seam: Optional[HeadTestSeam] = None,
                 weight: Optional[torch.Tensor] = None, vocab_size_is_true: bool = False):
        super().__init__()
        apply_safe_env()
        what = "ShardedFlashLMHead"
        seam = test_seam if test_seam is not None else HeadTestSeam()

        head_args.check_group(tp_group)  # before any use of it (every rank passing a list gets this alike)
        initialized = dist.is_available() and dist.is_initialized()
        group, rank, tp = None, 0, 1
        shared = weight
        if initialized:
            group = tp_group if tp_group is not None else dist.group.WORLD
            rank = dist.get_rank(group)
            if rank < 0:
                raise ValueError(f"{what}: this process is not a member of tp_group")
            tp = dist.get_world_size(group)

        # ---- local work that can fail: any error is raised after the gather, on every rank ----
        error = None
        dev = partition = weight = None
        probe = {"ok": True, "why": ""}
        max_batch_size = DEFAULT_MAX_BATCH_SIZE if max_batch_size is None else max_batch_size
        try:
            hidden_size = head_args.positive_int(hidden_size, "hidden_size")
            vocab_size = head_args.positive_int(vocab_size, "vocab_size")
            make_vocab_size_divisible_by = head_args.positive_int(make_vocab_size_divisible_by,
                                                                  "make_vocab_size_divisible_by")
            validation.check_flag(vocab_size_is_true, "vocab_size_is_true")
            if not isinstance(seam, HeadTestSeam):
                raise TypeError(f"test_seam must be a HeadTestSeam, got {type(seam).__name__}")
            if seam.num_buffers not in (1, 2):
                raise ValueError(f"test_seam.num_buffers must be 1 or 2 (a parity picks the copy), "
                                 f"got {seam.num_buffers}")
            max_batch_size = head_args.positive_int(max_batch_size, "max_batch_size")
            if params_dtype not in validation.SUPPORTED_DTYPES:
                raise TypeError(f"params_dtype must be one of bf16/fp16/fp32, got {params_dtype}")
            transports.check_transport_name(transport)
            head_args.check_reduction(reduction, REDUCTIONS)
            if device is None and isinstance(shared, torch.Tensor):
                device = shared.device
            dev = head_args.resolve_device(device)
            validation.check_device_runnable(dev)
            block_v = default_block_v(dev.type) if block_v is None else block_v  # (0 is refused, not the default)
            TileConfig(16, block_v, 16)  # validates block_v (power of two >= 32)
            partition = vocab_partition(vocab_size, tp, rank, make_vocab_size_divisible_by)
            if partition.start % 4 or partition.rows % 4:
                # The noise is drawn in Philox quads of 4 consecutive ids (fsdist.ops.noise): a
                # rank's range must start on a quad.
                raise ValueError(f"make_vocab_size_divisible_by must be a multiple of 4 with tensor parallelism "
                                 f"(each rank's vocabulary range must start at a multiple of 4), got "
                                 f"{make_vocab_size_divisible_by} with tp_size {tp}: rank {rank}'s range "
                                 f"[{partition.start}, {partition.start + partition.rows}) of the padded "
                                 f"{partition.padded_vocab_size} ids does not")
            probe = transports.probe(transport, dev)
            if shared is None:
                weight = torch.empty(partition.rows, hidden_size, dtype=params_dtype, device=dev)
            else:
                head_args.check_shared_weight(shared, partition, hidden_size, params_dtype, dev,
                                     head_args.group_words(tp, tp_group is None and initialized))
        except Exception as e:  # anything: a rank that raised alone would leave its peers in the gather
            error = f"{type(e).__name__}: {e}"
        if not initialized:
            if error:
                raise ValueError(f"{what}: {error}")
            raise RuntimeError(f"{what} needs torch.distributed to be initialised (e.g. "
                               "fsdist.distributed.init_distributed(), under torchrun or mpirun)")

        local = {"error": error, "hidden_size": hidden_size, "vocab_size": vocab_size, "tp_size": tp,
                 "params_dtype": str(params_dtype), "transport": transport, "reduction": reduction,
                 "block_v": block_v, "make_vocab_size_divisible_by": make_vocab_size_divisible_by,
                 "num_buffers": getattr(seam, "num_buffers", None), "max_batch_size": max_batch_size,
                 "device_type": dev.type if dev is not None else None,
                 "padded_vocab_size": partition.padded_vocab_size if partition else None, "probe": probe,
                 "fast_memory": fast_memory(dev) if dev is not None else False}
        gathered = agreement.gather(local, group)
        agreement.raise_local_errors(gathered, what)
        agreement.check_agreement(gathered, what)
        resolved, why = transports.resolve(transport, [g["probe"] for g in gathered], group)
        if transport == "auto":
            log.info("fsdist: ShardedFlashLMHead transport auto -> %s (%s)", resolved, why)
        elif resolved != transport:
            log.warning("fsdist: ShardedFlashLMHead transport %s -> %s (%s)", transport, resolved, why)
        if rank == 0:
            head_args.warn_if_padded(vocab_size, make_vocab_size_divisible_by * tp, vocab_size_is_true)

        # ---- build ----
        self.hidden_size = hidden_size
        self.vocab_size = vocab_size
        self.device = dev
        self.tp_group = group
        self.tp_group_words = head_args.group_words(tp, tp_group is None)  # how errors name the group
        self.tp_rank = rank
        self.tp_size = tp
        self.block_v = block_v
        self.reduction = reduction
        self.transport_name = resolved
        self.partition = partition
        self.owns_weight = shared is None
        if self.owns_weight:
            self.weight = nn.Parameter(weight)
            with torch.no_grad():
                self.weight.normal_(0.0, 0.02)
                self.weight[self.partition.valid_rows:].zero_()
        else:
            # Held by reference, deliberately not registered: the owner (e.g. Megatron's output
            # layer) keeps it in its own state_dict and optimizer; the head must not add a copy.
            object.__setattr__(self, "weight", shared)
        # Build in two agreed phases, so that a failure on one rank reaches every rank: the local
        # objects (the transport may initialise NVSHMEM), then the exchange buffers (each
        # allocation agrees on its local part before its collective part, see transports/base.py).
        build_error, transport_obj, reduction_obj = None, None, None
        try:
            transport_obj = transports.make_transport(resolved, group, dev)
            reduction_obj = REDUCTIONS[reduction](transport_obj, self.partition, block_v, dev, seam)
            # The stage-1 path, the 32-row tile's depth and the tile of calls with bias / penalty entries at B = 17-32
            # depend on the GPU's memory speed (configs.fast_memory):
            # one answer for the whole group, so that ranks of different kinds (or one whose driver did not say)
            # take the same path and tile.
            reduction_obj.fast_memory = all(g["fast_memory"] for g in gathered)
        except Exception as e:
            build_error = f"{type(e).__name__}: {e}"
        agreement.raise_local_errors(agreement.gather({"error": build_error}, group), what,
                                     verb="could not be built on")
        try:
            reduction_obj.reserve(max_batch_size)
        except RuntimeError as e:  # raised on every rank alike (an agreed allocation failure)
            transport_obj.close()
            raise ValueError(f"{what}: could not allocate its exchange buffers: {e}") from e
        self.transport = transport_obj
        self._reduction = reduction_obj
        seam.reduction = self._reduction
        self._step = 0

    @property
    def params_dtype(self) -> torch.dtype:
        """The weight shard's dtype: ``params_dtype`` at construction, or what a cast of the module (e.g.
        ``model.bfloat16()``) or of a shared weight's ``.data`` made of it since."""
        return self.weight.dtype

    @classmethod
    def from_megatron(cls, model_or_output_layer, vocab_size: int, **kwargs) -> "ShardedFlashLMHead":
        """A head on a Megatron-Core model's own output-layer weight (no shard of its own).

        ``model_or_output_layer``: a ``GPTModel`` (also wrapped in DDP / ``Float16Module``) on
        its last pipeline stage, or its ``output_layer`` (a ``ColumnParallelLinear``). The head
        shares the layer's weight Parameter, or with tied embeddings
        ``shared_embedding_or_output_weight()``, and reads the hidden size, dtype, device,
        TP group and padded vocabulary from Megatron. ``vocab_size`` is the *true*
        vocabulary: ``GPTModel.vocab_size`` is padded, and a ``vocab_size`` equal to the
        padded size raises unless ``vocab_size_is_true=True``. Other keyword arguments
        (``transport``, ``reduction``, ``max_batch_size``, ``tp_group``, ...) are the
        constructor's. Collective over the TP group. Needs megatron-core only to find the TP
        group through ``parallel_state`` when the layer carries none. See
        ``fsdist/integrations/megatron.py`` and docs/integration.md.
        """
        from ..integrations.megatron import head_from_megatron

        return head_from_megatron(cls, model_or_output_layer, vocab_size, **kwargs)

    # ---- vocabulary range -------------------------------------------------------------
    @property
    def vocab_start(self) -> int:
        return self.partition.start

    @property
    def vocab_end(self) -> int:
        return self.partition.end

    @property
    def padded_vocab_size(self) -> int:
        return self.partition.padded_vocab_size

    @property
    def max_batch_size(self) -> int:
        """Rows the exchange buffers hold (the constructor's max_batch_size rounded up to a power
        of two, at least 16; grown by :meth:`reserve`)."""
        return self._reduction.capacity

    @property
    def step(self) -> int:
        """Number of forward calls made from Python so far, empty and failed ones included (each
        still takes part in a step on every rank; a capture counts once,
        graph replays not at all). The exchange buffer is picked by ``step_counter`` instead."""
        return self._step

    @property
    def step_counter(self) -> torch.Tensor:
        """int64 [1] on the head's device: steps run on the device (eager calls and graph replays).

        Its parity picks the exchange buffer copy; each step adds 1 on the stream after its
        stage 2. Read it, do not write it (ranks must keep equal counters)."""
        return self._reduction.counter

    # ---- weights ----------------------------------------------------------------------
    @torch.no_grad()
    def load_full_weight(self, weight: torch.Tensor) -> None:
        """Copy this rank's rows out of a full [V, D] or [V_padded, D] weight (padding rows zeroed
        when the full weight has only V rows). Not a collective. Refused when the head shares
        a caller's weight (``weight=``, :meth:`from_megatron`): load the owner's weights instead."""
        if not self.owns_weight:
            raise ValueError("load_full_weight would overwrite a weight this head shares with its owner (weight= or "
                             "from_megatron): load the model's weights through the model instead")
        if not isinstance(weight, torch.Tensor):
            raise TypeError(f"weight must be a torch.Tensor, got {type(weight).__name__}")
        V_true, Vp, D = self.vocab_size, self.padded_vocab_size, self.hidden_size
        if weight.dim() != 2 or weight.shape[1] != D or weight.shape[0] not in (V_true, Vp):
            raise ValueError(f"full weight must be [{V_true}, {D}] or [{Vp}, {D}] (vocab_size or padded "
                             f"vocab size, hidden_size), got {tuple(weight.shape)}")
        if weight.dtype != self.params_dtype:
            raise TypeError(f"full weight dtype {weight.dtype} does not match the head's params_dtype "
                            f"{self.params_dtype} (convert it with .to() first)")
        start, end = self.partition.start, self.partition.end
        n = max(0, min(end, weight.shape[0]) - start)
        if n:
            self.weight[:n].copy_(weight[start:start + n])
        self.weight[n:].zero_()

    # ---- sampling ---------------------------------------------------------------------
    def forward(self, hidden: torch.Tensor, temperature: Union[float, torch.Tensor] = 1.0,
                seed: Union[int, torch.Tensor] = 0, offset: Union[int, torch.Tensor] = 0,
                return_logprobs: bool = False, weight: Optional[torch.Tensor] = None,
                path: Optional[str] = None, check: bool = False, *,
                top_k: Union[int, torch.Tensor] = 0, top_p: Union[float, torch.Tensor] = 1.0,
                min_p: Union[float, torch.Tensor] = 0.0, top_logprobs: int = 0,
                logprobs_mode: str = "scaled", token_bitmask: Optional[torch.Tensor] = None,
                logit_bias: Optional[SparseLogits] = None, penalties: Optional[Penalties] = None) -> SampleOutput:
        """Sample one token per row from softmax(hidden @ W_full.T / T) over ids < vocab_size.

        A collective over tp_group (see the module docstring). ``hidden`` is [B, D] or
        [..., D] (Megatron's [s, b, h] included): the outputs come back with its leading
        shape, and per-row parameters are scalars, [...] or flattened [N] tensors (row-major;
        ``fsdist.sample`` documents the tables). ``weight`` overrides this
        rank's shard for this call (tied embeddings: pass this rank's embedding shard,
        same shape, dtype and device as ``head.weight``, contiguous). ``path``: stage 1
        as "fused" (logits in the kernel) or "chunked" (cuBLAS logits per L2-sized
        chunk, then the same epilogue); None chooses by batch size like fsdist.sample.
        ``check``: also validate the values inside per-row tensors (synchronises).
        ``top_k``, ``top_p``, ``min_p``, ``top_logprobs``, ``logprobs_mode``: as in
        :func:`fsdist.sample` (``reduction="candidates"`` only; the tokens and logprobs equal
        fsdist.sample's on the full weight). On the collective transport a filtered or top-N
        call reads one integer from the device (how many rows the exact fallback must resolve),
        so every rank runs the same exchanges; nvshmem and symm_mem run a fixed number of them
        without asking (docs/tensor_parallel.md, section 5); plain calls never synchronise.
        ``token_bitmask``, ``logit_bias``, ``penalties``: as in :func:`fsdist.sample` (both
        reductions), in global vocabulary ids; each rank applies the bitmask words and the
        listed ids of its own range.

        Errors never leave the group out of step. A bad argument on this rank raises here
        *after* this rank has taken part in the step (it publishes an error header instead
        of candidates), so its peers are not left waiting; they return -1 for the step and
        raise :class:`TensorParallelMismatchError` (at once on CPU, within a call or two on
        a GPU, or from :meth:`check`). Ranks that made different calls (batch size, flags,
        step count, per-row parameters) get the same treatment. Known limits (a rank that skips a
        call; hidden states are not checked): docs/tensor_parallel.md, section 5.
        """
        if self.transport.closed:
            raise RuntimeError("this ShardedFlashLMHead was closed")
        if self._reduction.buffers is None:  # (every rank alike: a failed grow is agreed, see reserve)
            raise RuntimeError("this ShardedFlashLMHead has no exchange buffers: a reserve() failed to allocate "
                               "them; close() it on every rank and build a new head")
        lead = None
        try:
            if self._reduction.failed is not None:
                # A step failed on this rank alone after its exchange (Reduction.run): the peers finished it
                # without this rank's share, so their results for it are not to be trusted. Refuse this and every
                # later call; the error header below tells the peers (they raise TensorParallelMismatchError).
                raise RuntimeError(f"an earlier call failed on this rank ({self._reduction.failed}) after the "
                                   "group's exchange; the peers' results for that call may be wrong and they have "
                                   "been told. close() this head on every rank and build a new one")
            validation.check_hidden(hidden, hidden_size=self.hidden_size)
            hidden, lead = rows.flatten_hidden(hidden)  # [..., D] -> [N, D]; outputs get `lead` back
            rp = rows.flatten_row_args(lead, temperature=temperature, seed=seed, offset=offset, top_k=top_k,
                                       top_p=top_p, min_p=min_p)
            temperature, seed, offset = rp["temperature"], rp["seed"], rp["offset"]
            top_k, top_p, min_p = rp["top_k"], rp["top_p"], rp["min_p"]
            token_bitmask, logit_bias, penalties = rows.flatten_processors(lead, token_bitmask, logit_bias, penalties)
            hidden, w, params, opts = head_args.prepare_call(self, hidden, temperature, seed, offset, return_logprobs, weight, path,
                                                    check, top_k, top_p, min_p, top_logprobs, logprobs_mode,
                                                    token_bitmask, logit_bias, penalties)
        except Exception:
            # Take part in the step anyway, with an error header and no candidates (a bad input, or a rank
            # whose earlier call failed).
            self._reduction.skip_step(-1, 0, ERROR_INPUT, self._step)
            self._step += 1
            raise
        B = hidden.shape[0]
        if B == 0:
            # Nothing to sample, but the step still happens on every rank (headers alone).
            self._reduction.skip_step(0, opts.flags(), 0, self._step)
            out = head_args.empty_output(self.device, opts)
        else:
            # The exchange buffer's copy is chosen on the device (step_counter), not from self._step:
            # a host integer would be frozen into a captured CUDA graph. self._step feeds the test seam.
            out = SampleOutput(*self._reduction.run(hidden, w, params, opts, self._step))
        self._step += 1
        monitor = self._reduction.monitor
        monitor.raise_if_mismatched(monitor.poll())
        return rows.unflatten_output(out, lead)

    def reserve(self, batch_size: int) -> None:
        """Grow the exchange buffers to hold ``batch_size`` rows. Collective: call on every rank
        with the same value, outside CUDA-graph capture and before capturing. The ranks first agree
        (one host collective): a bad or differing ``batch_size`` on any rank raises ValueError on every
        rank with nothing changed; growing after a CUDA graph was captured on any rank raises RuntimeError on
        every rank. Inside a capture nothing can be agreed: growing raises RuntimeError at once, locally. If the
        allocation fails (on any rank: agreed too) the head keeps its old capacity where that can be allocated
        again, else it has no buffers and its calls say so."""
        if self.transport.closed:
            raise RuntimeError("this ShardedFlashLMHead was closed")
        if self._reduction.capturing():
            # Decided here, without the agreement below: a host collective inside a capture would break it.
            # Growing is refused (check_reserve raises); a batch that fits is a no-op, as on every path.
            self._reduction.check_reserve(head_args.positive_int(batch_size, "batch_size"))
            return
        error = refused = None  # agreed below, before any rank touches its buffers
        try:
            batch_size = head_args.positive_int(batch_size, "batch_size")
        except Exception as e:
            error = f"{type(e).__name__}: {e}"
        else:
            try:
                self._reduction.check_reserve(batch_size)
            except RuntimeError as e:  # the head's state refuses to grow (after a capture)
                refused = f"{e}"
        what = "ShardedFlashLMHead.reserve"
        gathered = agreement.gather({"batch_size": repr(batch_size), "error": error, "refused": refused},
                                    self.tp_group)
        agreement.raise_local_errors(gathered, what)
        agreement.raise_local_errors(gathered, what, verb="refused on", key="refused", error=RuntimeError)
        agreement.check_agreement(gathered, what, fields=("batch_size",),
                                  advice="reserve is collective: every rank must pass the same batch_size.")
        self._reduction.reserve(batch_size)

    def check(self) -> None:
        """Raise TensorParallelMismatchError if the group has diverged (synchronises with the
        device; the forward path finds out without synchronising, a little later on a GPU)."""
        monitor = self._reduction.monitor
        monitor.raise_if_mismatched(monitor.check())

    # ---- lifetime ---------------------------------------------------------------------
    def close(self) -> None:
        """Free the exchange buffers. Collective: call on every rank (before finalising NVSHMEM
        or destroying the process group). fsdist.distributed.shutdown() closes NVSHMEM heads."""
        if not self.transport.closed:
            self._reduction.close()
            self.transport.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def extra_repr(self) -> str:
        return (f"hidden_size={self.hidden_size}, vocab_size={self.vocab_size}, "
                f"padded_vocab_size={self.padded_vocab_size}, tp={self.tp_rank}/{self.tp_size}, "
                f"vocab_range=[{self.vocab_start}, {self.vocab_end}), transport={self.transport_name}, "
                f"reduction={self.reduction}, block_v={self.block_v}, dtype={self.params_dtype}")
