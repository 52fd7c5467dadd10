"""Where candidates live: the buffer layout, and the value object that says where a launch writes.

One candidate buffer holds, for every (row, vocabulary tile) of every shard, the tile's
best perturbed score and winning id (and, with logprobs, the log-sum-exp state; with
filters or top-N logprobs, the tile's KEEP largest logits and their ids):

    fp32  [n_shards, n_fields, n_local, batch_cap]
    int32 [n_shards, n_ifields * n_local (+ 2 header slots), batch_cap]

A *shard* is one tensor-parallel rank's block (its vocabulary range); a single GPU has
one. Rows are innermost so one program's stores and stage 2's loads coalesce, and the
shard-major order lets an all-gather of per-rank blocks land in this layout as is.
Slots are numbered shard * n_local + tile, which is vocabulary order.
The fields are listed in ``epilogue.py``. A *checked* layout (tensor parallelism) adds
two int32 slots per shard after its tiles for the call's header (``step_check.py``):
the row fingerprints, then the step record.

``store_fan_out`` stores into such a buffer locally, or through a ``BufferPair``'s peer table into every
rank's copy: the warp-specialised epilogue, the header writers and the fallback's pool use it
(``epilogue.write_candidates`` / ``write_kept`` load each peer's address once for their several fields).
"""
from dataclasses import dataclass
from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from .parity import DeviceParity
from .utils import cdiv

N_FIELDS_SAMPLE = 1  # score only
N_FIELDS_LOGPROBS = 4  # score, winner's logit, tile max, tile sum
KEEP = 4  # logits kept per (row, tile) for filters and top-N (see select_filtered.py)
# score, winner's logit, tile max, scaled sum, raw sum, KEEP kept logits, the boundary
N_FIELDS_EXTENDED = 5 + KEEP + 1
F_RAW_SUM = 4
F_KEPT = 5
F_BOUNDARY = 5 + KEEP


@dataclass(frozen=True)
class CandidateLayout:
    n_fields: int
    n_local: int  # vocabulary tiles per shard
    batch_cap: int
    n_shards: int = 1
    checked: bool = False  # two header slots per shard in the int32 buffer (step_check.py)
    n_ifields: int = 1  # 1 + KEEP when extended (the kept logits' ids)

    @staticmethod
    def fields(logprobs: bool, extended: bool = False) -> int:
        if extended:
            return N_FIELDS_EXTENDED
        return N_FIELDS_LOGPROBS if logprobs else N_FIELDS_SAMPLE

    @property
    def extended(self) -> bool:
        return self.n_fields == N_FIELDS_EXTENDED

    @property
    def n_slots(self) -> int:
        return self.n_shards * self.n_local

    @property
    def stride_slot(self) -> int:
        return self.batch_cap

    @property
    def stride_field(self) -> int:
        return self.n_local * self.batch_cap

    @property
    def stride_shard(self) -> int:
        return self.n_fields * self.n_local * self.batch_cap

    @property
    def stride_shard_i(self) -> int:
        return (self.n_ifields * self.n_local + (2 if self.checked else 0)) * self.batch_cap

    @property
    def stride_ifield(self) -> int:
        return self.n_local * self.batch_cap

    @property
    def fingerprint_slot(self) -> int:
        """int32 offset of the row fingerprints inside a shard's block (checked layouts)."""
        return self.n_ifields * self.n_local * self.batch_cap

    @property
    def record_slot(self) -> int:
        """int32 offset of the step record inside a shard's block (checked layouts)."""
        return (self.n_ifields * self.n_local + 1) * self.batch_cap

    @property
    def float_numel(self) -> int:
        return self.n_shards * self.stride_shard

    @property
    def int_numel(self) -> int:
        return self.n_shards * self.stride_shard_i

    def alloc(self, device) -> Tuple[torch.Tensor, torch.Tensor]:
        return (torch.empty(self.float_numel, dtype=torch.float32, device=device),
                torch.empty(self.int_numel, dtype=torch.int32, device=device))

    def check_fit(self, batch: int, weight_rows: int, block_v: int, shard: int, vocab_start: int) -> int:
        """Raise unless a stage-1 launch fits: batch within capacity, the weight's tiles = a
        shard's tiles, vocab_start on a whole Philox quad. Returns the number of tiles."""
        if self.batch_cap < batch:
            raise ValueError(f"batch {batch} exceeds the candidate buffer's capacity {self.batch_cap}")
        if vocab_start % 4:
            raise ValueError(f"vocab_start must be a multiple of 4 (the noise is drawn in quads), got {vocab_start}")
        n_vtiles = cdiv(weight_rows, block_v)
        if n_vtiles != self.n_local or not 0 <= shard < self.n_shards:
            raise ValueError(f"candidate layout {self} does not fit {weight_rows} rows in tiles of "
                             f"{block_v} (shard {shard})")
        return n_vtiles


@dataclass(frozen=True)
class BufferPair:
    """An fp32 + int32 buffer pair as the kernels address it: where stage 1 (and the
    group-log-mass publish) writes, and what stage 2 (and the group select) reads.

    f, i: this process's flat fp32 / int32 buffers, or, when ``npeers`` is set, int64
    tables of the base addresses of every peer's buffers (stage 1 then stores into all of
    them: the tensor-parallel fan-out). base_f / base_i: element offsets of the buffer
    inside f / i. parity: add the copy a device counter picks (see parity.py).
    """

    f: torch.Tensor
    i: torch.Tensor
    base_f: int = 0
    base_i: int = 0
    npeers: Optional[int] = None
    parity: Optional[DeviceParity] = None

    @classmethod
    def alloc(cls, layout: CandidateLayout, device) -> "BufferPair":
        return cls(*layout.alloc(device))

    @property
    def peer_table(self) -> bool:
        return self.npeers is not None


@triton.jit
def store_fan_out(base, off, val, mask, DTYPE: tl.constexpr, PEER_TABLE: tl.constexpr, NPEERS: tl.constexpr):
    """Store ``val`` as DTYPE (the buffer's element type) at element offset ``off`` (masked) of a buffer: this
    process's (``base`` points into it) or, with PEER_TABLE, every tensor-parallel peer's (``base``: the int64
    table of their base addresses, a ``BufferPair`` with ``npeers``): the fan-out, the same values into each
    rank's copy. DTYPE is explicit because a table entry carries no element type."""
    if PEER_TABLE:
        for p in tl.static_range(NPEERS):
            peer = tl.load(base + p).to(tl.pointer_type(DTYPE))
            tl.store(peer + off, val.to(DTYPE), mask=mask)
    else:
        tl.store(base + off, val.to(DTYPE), mask=mask)


@triton.jit
def slot_offset(slots, n_local, stride_shard, stride_slot, ONE_SHARD: tl.constexpr = False):
    """Element offset of the slots ``slots`` (shard * n_local + tile, any shape) within one field of a candidate
    buffer whose shards are blocks of ``stride_shard`` elements (pass stride_shard_i for the int32 buffer).
    ONE_SHARD (a buffer of one shard: a single GPU) skips the division by the runtime n_local, ~10 instructions
    a lane in kernels that address a whole row's slots."""
    if ONE_SHARD:
        return slots * stride_slot
    else:
        return (slots // n_local) * stride_shard + (slots % n_local) * stride_slot
