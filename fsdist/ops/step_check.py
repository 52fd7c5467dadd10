"""A fingerprint of each call, written with the candidates, checked where they are merged.

Callers that write into a shared buffer from several processes (the tensor-parallel
head) must all make the *same* call: same step, same batch, same flags, same per-row
parameters. Checking that on the host would take a collective per step; instead every
writer stores, next to its candidates, a small header:

* a **step record** of RECORD_WORDS int32: the step (the low 31 bits of the device step
  counter the caller keeps, see parity.py), the batch size, the call's flags, and an
  error word (non-zero: this writer hit a local error and wrote no candidates; writers
  that all report the same error made the same call, which is not a mismatch);
* a **row fingerprint** per row: 32 bits of Philox keyed by the row's seed, at the
  row's offset and temperature bits (stream STREAM_CHECK), so two rows agree only if
  their (seed, offset, temperature) agree, up to a 2**-32 collision.

The kernel that merges the blocks compares every block's header with its own block's.
A row whose fingerprints differ, or any row of a step whose records differ or carry an
error, returns token -1, and the merge ORs a STATUS_* bit into the step's status word.
The status is two int32 words: [0] what earlier steps found (sticky; read, never written,
during a step) and [1] what this step finds; ``end_step_kernel`` folds [1] into [0] when
the step ends. A set word [0] makes every later merge return -1 too (a group that diverged
once cannot be trusted again). Reading [0] only keeps one program's finding from
poisoning the other programs' rows of the same step, whatever order they run in. Nothing here synchronises with the host: the caller
copies the status word to pinned memory asynchronously and raises when it lands.

Layout: in a checked ``CandidateLayout`` (``checked=True``) each shard's int32 block
has two more slots after its tiles: slot n_local holds the row fingerprints, slot
n_local + 1 the step record (its first RECORD_WORDS entries).
"""
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .layout import BufferPair, store_fan_out
from .noise import philox_bits
from .parity import parity_args, parity_offsets
from .utils import cdiv, next_pow2

RECORD_WORDS = 4  # step, batch, flags, error
# Flags of a call (record word 2): everything that changes what the merge must do.
FLAG_LOGPROBS = 1
FLAG_CHUNKED = 2
FLAG_EXTENDED = 4  # kept logits (filters, top-N or raw logprobs); top-N in bits 8-15, mode in 16-17
# Error word (record word 3) of a writer that skipped its candidates.
ERROR_INPUT = 1
# Sticky status bits (the merge ORs them into the caller's status word).
STATUS_RECORD_MISMATCH = 1  # steps, batch sizes or flags differ between writers
STATUS_PEER_ERROR = 2  # a writer reported a local error for this step
STATUS_ROW_MISMATCH = 4  # some row's (seed, offset, temperature) differs between writers
STATUS_PEER_TIMEOUT = 8  # a device barrier of the step gave up waiting for a peer (set by the transport)

STREAM_CHECK = tl.constexpr(2)  # noise stream of the fingerprints (0, 1: the sampler's)


@dataclass(frozen=True)
class HeaderCheck:
    """What a merge needs to check headers: whose block is its own, and the status word."""

    me: int
    status: torch.Tensor  # int32 [2]: earlier steps (sticky), this step


def call_flags(logprobs: bool, chunked: bool, extended: bool = False, top_n: int = 0, mode: int = 0) -> int:
    return ((FLAG_LOGPROBS if logprobs else 0) | (FLAG_CHUNKED if chunked else 0)
            | (FLAG_EXTENDED if extended else 0) | (top_n << 8) | (mode << 16))


# Odd multipliers of the filter fingerprint (golden-ratio and murmur-style constants: the three
# filters' bits land far apart). The host and the kernel compute the same int64 sums.
FP_TOP_K, FP_TOP_P, FP_MIN_P = 0x9E3779B1, 0x85EBCA77, 0xC2B2AE3D
_FP_TOP_K, _FP_TOP_P, _FP_MIN_P = tl.constexpr(FP_TOP_K), tl.constexpr(FP_TOP_P), tl.constexpr(FP_MIN_P)  # for the kernel
FINGERPRINT_BLOCK = 128


def _filter_bits(x, is_int: bool) -> int:
    """A scalar filter's bits: the int itself, or the float32 pattern as a signed int32."""
    import struct

    return int(x) if is_int else struct.unpack("<i", struct.pack("<f", float(x)))[0]


@triton.jit
def _row_bits(ptr, bits, rows, mask, PER_ROW: tl.constexpr, IS_FLOAT: tl.constexpr, BLOCK: tl.constexpr):
    if PER_ROW:
        if IS_FLOAT:
            v = tl.load(ptr + rows, mask=mask, other=0.0).to(tl.float32).to(tl.int32, bitcast=True).to(tl.int64)
        else:
            v = tl.load(ptr + rows, mask=mask, other=0).to(tl.int64)
    else:
        v = tl.zeros((BLOCK,), tl.int64) + bits
    return v


@triton.jit
def filter_fingerprint_kernel(out_ptr, k_ptr, k_bits, p_ptr, p_bits, m_ptr, m_bits, B,
                              K_ROW: tl.constexpr, P_ROW: tl.constexpr, M_ROW: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = rows < B
    k = _row_bits(k_ptr, k_bits, rows, mask, K_ROW, False, BLOCK)
    p = _row_bits(p_ptr, p_bits, rows, mask, P_ROW, True, BLOCK)
    m = _row_bits(m_ptr, m_bits, rows, mask, M_ROW, True, BLOCK)
    # int64 products that wrap as the host's masked sum would not: the host path masks to 63 bits, and
    # both set bit 0, so a fingerprint is never 0 (0 = "no filter" for a scalar call).
    c_k = tl.full((BLOCK,), _FP_TOP_K, tl.int64)
    c_p = tl.full((BLOCK,), _FP_TOP_P, tl.int64)
    c_m = tl.full((BLOCK,), _FP_MIN_P, tl.int64)
    mixed = k * c_k + p * c_p + m * c_m
    tl.store(out_ptr + rows, mixed | 1, mask=mask)


def filter_fingerprint(top_k, top_p, min_p):
    """Per-row bits of (top_k, top_p, min_p) for the row fingerprint (``RowParams.fingerprint``):
    an int for scalars, an int64 [B] tensor if any filter is a tensor (one kernel launch, no
    sync: in a CUDA graph a chain of small torch ops here cost ~20 µs of launches per call).
    0 when every filter is off and a scalar, so plain calls keep their fingerprints.

    top_k: int or integer [B]; top_p, min_p: float or floating [B] (the float32 bits count).
    """
    tensors = [x for x in (top_k, top_p, min_p) if isinstance(x, torch.Tensor)]
    if not tensors:
        if top_k == 0 and top_p == 1.0 and min_p == 0.0:
            return 0
        mixed = (_filter_bits(top_k, True) * FP_TOP_K + _filter_bits(top_p, False) * FP_TOP_P
                 + _filter_bits(min_p, False) * FP_MIN_P)
        return (mixed & 0x7FFFFFFFFFFFFFFF) | 1
    device, B = tensors[0].device, max(t.numel() for t in tensors)
    out = torch.empty(B, dtype=torch.int64, device=device)
    args = []
    for x, is_int in ((top_k, True), (top_p, False), (min_p, False)):
        if isinstance(x, torch.Tensor):
            if x.numel() not in (1, B):
                raise ValueError(f"filter_fingerprint: per-row filters of different lengths ({x.numel()} and {B})")
            # dense [B] (the kernel reads rows at unit stride; a one-element tensor stands for every row)
            args.append((x.reshape(-1).expand(B).contiguous(), 0))
        else:
            args.append((out, _filter_bits(x, is_int)))  # out: a pointer the kernel never reads
    (kp, kb), (pp, pb), (mp, mb) = args
    grid = (cdiv(max(B, 1), FINGERPRINT_BLOCK),)
    filter_fingerprint_kernel[grid](out, kp, kb, pp, pb, mp, mb, B,
                                    K_ROW=isinstance(top_k, torch.Tensor), P_ROW=isinstance(top_p, torch.Tensor),
                                    M_ROW=isinstance(min_p, torch.Tensor), BLOCK=FINGERPRINT_BLOCK)
    return out


# Multipliers of the processor fingerprint (primes near 10**6), in the order its terms are folded.
FP_BITMASK, FP_ENTRIES, FP_VALUES, FP_PENALTIES = 1000003, 1000033, 1000037, 1000039
FP_FREQUENCY, FP_PRESENCE = 7919, 104729
_FP_BITMASK, _FP_ENTRIES, _FP_VALUES = tl.constexpr(FP_BITMASK), tl.constexpr(FP_ENTRIES), tl.constexpr(FP_VALUES)
_FP_PENALTIES, _FP_FREQUENCY, _FP_PRESENCE = tl.constexpr(FP_PENALTIES), tl.constexpr(FP_FREQUENCY), tl.constexpr(FP_PRESENCE)


@triton.jit
def _row_sum(ptr, stride_c, n, IS_FLOAT: tl.constexpr, BLOCK: tl.constexpr):
    """int64 sum of a row's n int32 entries (IS_FLOAT: the fp32 entries' bit patterns as int32)."""
    acc = tl.zeros([], tl.int64)
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        if IS_FLOAT:
            x = tl.load(ptr + offs * stride_c, mask=offs < n, other=0.0).to(tl.int32, bitcast=True)
        else:
            x = tl.load(ptr + offs * stride_c, mask=offs < n, other=0)
        acc += tl.sum(x.to(tl.int64), axis=0)
    return acc


@triton.jit
def fold_processor_fingerprint(fp, bm_sum, ent_sum, val_sum, rep, freq, pres, BITMASK: tl.constexpr,
                               ENTRIES: tl.constexpr, PENALTIES: tl.constexpr):
    """The processors' fingerprint from its parts (scalars or [rows]): ``fp`` (the bad flag, or 0), then the
    bitmask's word sum, the entries' sum and the bias values' bit sum, then the fp32 penalties' bits, each folded in
    with its multiplier (int64, wrapping). The one formula of processor_fingerprint_kernel and of the preparation
    kernel's fingerprint (prepare_processors.py), which must give the same bits."""
    if BITMASK:
        fp = fp * _FP_BITMASK + bm_sum
    if ENTRIES:
        fp = fp * _FP_ENTRIES + ent_sum
        fp = fp * _FP_VALUES + val_sum
    if PENALTIES:
        fp = (fp * _FP_PENALTIES + rep.to(tl.int32, bitcast=True).to(tl.int64)
              + freq.to(tl.int32, bitcast=True).to(tl.int64) * _FP_FREQUENCY
              + pres.to(tl.int32, bitcast=True).to(tl.int64) * _FP_PRESENCE)
    return fp


@triton.jit
def processor_fingerprint_kernel(out_ptr, bad_ptr, bm_ptr, bm_stride_r, bm_stride_c, W, ent_ptr, ent_stride_r,
                                 ent_stride_c, val_ptr, val_stride_r, val_stride_c, S, pen_ptr, pen_stride,
                                 xor_ptr, xor_val, BAD: tl.constexpr, BITMASK: tl.constexpr,
                                 ENTRIES: tl.constexpr, PENALTIES: tl.constexpr, XOR_ROW: tl.constexpr,
                                 BLOCK: tl.constexpr):
    """One program per row: the processors' fingerprint (bad flag, then the bitmask's, entries' and bias
    values' sums, then the penalties' bits, each folded in with its multiplier), XOR the filters'."""
    row = tl.program_id(0).to(tl.int64)
    fp = tl.zeros([], tl.int64)
    if BAD:
        fp = tl.load(bad_ptr + row).to(tl.int64)
    bm_sum = tl.zeros([], tl.int64)
    ent_sum = tl.zeros([], tl.int64)
    val_sum = tl.zeros([], tl.int64)
    rep = tl.zeros([], tl.float32)
    freq = tl.zeros([], tl.float32)
    pres = tl.zeros([], tl.float32)
    if BITMASK:
        bm_sum = _row_sum(bm_ptr + row * bm_stride_r, bm_stride_c, W, False, BLOCK)
    if ENTRIES:
        ent_sum = _row_sum(ent_ptr + row * ent_stride_r, ent_stride_c, S, False, BLOCK)
        val_sum = _row_sum(val_ptr + row * val_stride_r, val_stride_c, S, True, BLOCK)
    if PENALTIES:
        rep = tl.load(pen_ptr + row)
        freq = tl.load(pen_ptr + pen_stride + row)
        pres = tl.load(pen_ptr + 2 * pen_stride + row)
    fp = fold_processor_fingerprint(fp, bm_sum, ent_sum, val_sum, rep, freq, pres, BITMASK, ENTRIES, PENALTIES)
    if XOR_ROW:
        fp = fp ^ tl.load(xor_ptr + row)
    else:
        fp = fp ^ xor_val
    tl.store(out_ptr + row, fp)


def processor_fingerprint(bitmask, entries, values, penalties, bad_rows, xor=0):
    """int64 [B]: a hash of each row's processor inputs XOR ``xor`` (an int, or int64 [B]: the filters'
    fingerprint), for the tensor-parallel call header, in one launch (the torch ops it replaces cost a
    dozen launches per call). bitmask int32 [B, W], entries int32 [B, S] with values fp32 [B, S],
    penalties fp32 [3, B], bad_rows bool [B]: each may be None; all None gives ``xor`` back unchanged."""
    present = [t for t in (bad_rows, bitmask, entries, penalties) if t is not None]
    if not present:
        return xor
    B, device = (present[0].shape[1] if present[0] is penalties else present[0].shape[0]), present[0].device
    out = torch.empty(B, dtype=torch.int64, device=device)
    # the kernel reads these rows at unit stride (the 2-D ones take their strides): no-ops for the head's tensors
    bad_rows = bad_rows.contiguous() if bad_rows is not None else None
    penalties = penalties.contiguous() if penalties is not None else None
    xor = xor.reshape(-1).contiguous() if isinstance(xor, torch.Tensor) else xor
    bm = bitmask if bitmask is not None else out.view(B, 1)
    ent = entries if entries is not None else out.view(B, 1)
    val = values if entries is not None else out.view(B, 1)
    pen = penalties if penalties is not None else out.view(1, B)
    xor_row = isinstance(xor, torch.Tensor)
    if B:
        processor_fingerprint_kernel[(B,)](
            out, bad_rows if bad_rows is not None else out, bm, bm.stride(0), bm.stride(1), bm.shape[1],
            ent, ent.stride(0), ent.stride(1), val, val.stride(0), val.stride(1), ent.shape[1],
            pen, pen.stride(0), xor if xor_row else out, 0 if xor_row else int(xor),
            BAD=bad_rows is not None, BITMASK=bitmask is not None, ENTRIES=entries is not None,
            PENALTIES=penalties is not None, XOR_ROW=xor_row, BLOCK=1024, num_warps=4)
    return out


def describe_status(bits: int) -> str:
    """Human-readable list of what a status word says."""
    what = []
    if bits & STATUS_PEER_ERROR:
        what.append("a rank reported an error for a step (a bad input, or a failure of its previous call; "
                    "its exception says which)")
    if bits & STATUS_RECORD_MISMATCH:
        what.append("ranks made different calls (step count, batch size or flags such as return_logprobs)")
    if bits & STATUS_ROW_MISMATCH:
        what.append("ranks passed different per-row parameters (seed, offset, temperature, filters or logit processors)")
    if bits & STATUS_PEER_TIMEOUT:
        what.append("a peer did not reach a step's barrier within FSDIST_PEER_TIMEOUT_S (a rank skipped a call, or "
                    "stalled); the group is out of step: close the heads and rebuild them")
    return "; ".join(what) or "no mismatch"


def writes_header(layout, dest: BufferPair) -> bool:
    """Whether a stage-1 launch into ``dest`` with ``layout`` writes the call's header: a checked layout
    does, and its step comes from the caller's device step counter (``dest.parity``), which it must have."""
    if layout.checked and dest.parity is None:
        raise ValueError("a checked candidate layout needs the caller's device step counter (dest.parity)")
    return bool(layout.checked)


@triton.jit
def row_fingerprint(seed, offset, temp):
    """32 bits identifying a row's (seed, offset, temperature)."""
    bits = temp.to(tl.int32, bitcast=True)
    return philox_bits(seed, offset, bits, STREAM_CHECK).to(tl.int32, bitcast=True)


@triton.jit
def write_row_fingerprints(dst_i, off_i, rows, mask, seed, offset, temp,
                           PEER_TABLE: tl.constexpr, NPEERS: tl.constexpr):
    """Store the rows' fingerprints at int32 offset off_i + rows (locally or into every peer)."""
    store_fan_out(dst_i, off_i + rows, row_fingerprint(seed, offset, temp), mask, tl.int32, PEER_TABLE, NPEERS)


@triton.jit
def write_step_record(dst_i, off_i, step_ptr, batch, flags, error, PEER_TABLE: tl.constexpr, NPEERS: tl.constexpr):
    """Store the RECORD_WORDS-word record (step, batch, flags, error) at int32 offset off_i."""
    write_record_words(dst_i, off_i, tl.arange(0, 4), step_ptr, batch, flags, error, PEER_TABLE, NPEERS)


@triton.jit
def write_record_words(dst_i, off_i, w, step_ptr, batch, flags, error, PEER_TABLE: tl.constexpr,
                       NPEERS: tl.constexpr):
    """write_step_record with the word indices ``w`` (0 .. 3) given by the caller: a Gluon kernel passes them in
    its own layout (fused_sample_ws.py)."""
    step = (tl.load(step_ptr) & 0x7FFFFFFF).to(tl.int32)
    values = tl.where(w == 0, step, tl.where(w == 1, batch, tl.where(w == 2, flags, error)))
    store_fan_out(dst_i, off_i + w, values, w < 4, tl.int32, PEER_TABLE, NPEERS)


@triton.jit
def load_records(src_i, base_i, n_writers, stride_writer_i, rec_slot, NW: tl.constexpr):
    """Every writer's step record, [NW, RECORD_WORDS] int32 in one load (writers past n_writers read 0)."""
    w = tl.arange(0, NW)
    words = tl.arange(0, 4)
    return tl.load(src_i + base_i + w[:, None] * stride_writer_i + rec_slot + words[None, :],
                   mask=(w < n_writers)[:, None], other=0)


@triton.jit
def judge_records(records, me, n_writers, NW: tl.constexpr):
    """(records differ, some writer reported an error) over the writers of ``records`` (load_records),
    against writer ``me``'s."""
    w = tl.arange(0, NW)
    live = (w < n_writers)[:, None]
    words = tl.arange(0, 4)[None, :]
    mine = tl.sum(tl.where((w == me)[:, None], records, 0), axis=0)  # one writer is me: a select, not a sum
    differ = tl.max(tl.max(((records != mine[None, :]) & live).to(tl.int32), axis=1), axis=0) != 0
    err = tl.max(tl.max(((words == 3) & (records != 0) & live).to(tl.int32), axis=1), axis=0) != 0
    return differ, err


@triton.jit
def status_bits(differ, err):
    # STATUS_RECORD_MISMATCH, plus STATUS_PEER_ERROR when some writer's record carries an error.
    # Writers that all report the same error made the same (bad) call: no mismatch.
    return tl.where(differ, 1, 0) | tl.where(differ & err, 2, 0)


@triton.jit
def load_headers(src_i, base_i, n_writers, stride_writer_i, fp_slot, rec_slot, rows, mask, status_ptr,
                 NW: tl.constexpr):
    """Issue every load a header check needs, at once: every writer's record [NW, RECORD_WORDS] and row
    fingerprints [NW, rows] (NW: a power of two >= n_writers; writers past n_writers read 0), and the sticky
    status word. A merge calls this before its loop over the candidates and ``judge_headers`` after it, so
    the loads' latency hides behind the loop's instead of adding a chain of round trips at its end."""
    w = tl.arange(0, NW)
    records = load_records(src_i, base_i, n_writers, stride_writer_i, rec_slot, NW)
    prints = tl.load(src_i + base_i + w[:, None] * stride_writer_i + fp_slot + rows[None, :],
                     mask=(w < n_writers)[:, None] & mask[None, :], other=0)
    sticky = tl.load(status_ptr)  # earlier steps only: this step's findings go to word 1
    return records, prints, sticky


@triton.jit
def judge_headers(records, prints, sticky, me, n_writers, mask, status_ptr, NW: tl.constexpr):
    """Compare the headers ``load_headers`` read with writer ``me``'s; returns whether each row is bad and
    ORs the findings (STATUS_* bits) into word 1 of the status. A set sticky word poisons every row."""
    w = tl.arange(0, NW)
    live = (w < n_writers)[:, None]
    differ, err = judge_records(records, me, n_writers, NW)
    fp_mine = tl.sum(tl.where((w == me)[:, None], prints, 0), axis=0)
    row_bad = tl.max(((prints != fp_mine[None, :]) & live).to(tl.int32), axis=0) != 0
    # A step whose records differ is poisoned whole; fingerprints only mean something otherwise.
    row_bad = row_bad & ~differ & mask
    any_row = tl.max(row_bad.to(tl.int32), axis=0) != 0
    bits = status_bits(differ, err) | tl.where(any_row, 4, 0)  # STATUS_ROW_MISMATCH
    # Relaxed: whoever folds word 1 reads it after this kernel ends, or (a merge that ends the step) after
    # the last program's acquire-release ticket, which orders this OR before it; an acq_rel atomic would add
    # a fence per program for nothing.
    tl.atomic_or(status_ptr + 1, bits, sem="relaxed")
    return row_bad | differ | (sticky != 0)


def writers_block(n_writers: int) -> int:
    """The NW of load_headers / judge_headers for ``n_writers`` writers (a power of two, at least 2)."""
    return max(2, next_pow2(int(n_writers)))


@triton.jit
def verify_step_kernel(src_i, base_i, parity_ptr, parity_stride_f, parity_stride_i, me, n_writers,
                       stride_writer_i, rec_slot, status_ptr, NW: tl.constexpr = 2):
    """The record check alone, for a step without rows to merge (a local error, an empty batch)."""
    _off_f, base_i = parity_offsets(0, base_i, parity_ptr, parity_stride_f, parity_stride_i, True)
    records = load_records(src_i, base_i, n_writers, stride_writer_i, rec_slot, NW)
    differ, err = judge_records(records, me, n_writers, NW)
    tl.atomic_or(status_ptr + 1, status_bits(differ, err))


@triton.jit
def step_record_kernel(dst_i, off_i, parity_ptr, parity_stride_f, parity_stride_i, batch, flags, error,
                       PEER_TABLE: tl.constexpr, NPEERS: tl.constexpr):
    """A record on its own: what a writer publishes when it has no candidates for a step
    (a local error, or an empty batch)."""
    _off_f, off_i = parity_offsets(0, off_i, parity_ptr, parity_stride_f, parity_stride_i, True)
    write_step_record(dst_i, off_i, parity_ptr, batch, flags, error, PEER_TABLE, NPEERS)


def launch_step_record(dest: BufferPair, record_offset: int, batch: int, flags: int, error: int) -> None:
    """Publish a step record at int32 element ``record_offset`` of ``dest`` (the writer's own
    block; through the peer table into every peer's). Needs the device step counter (dest.parity)."""
    if dest.parity is None:
        raise ValueError("a step record needs the caller's device step counter (dest.parity)")
    par_p, par_f, par_i, _ = parity_args(dest.parity, dest.i)
    step_record_kernel[(1,)](dest.i, dest.base_i + record_offset, par_p, par_f, par_i, batch, flags, error,
                             PEER_TABLE=dest.peer_table, NPEERS=dest.npeers or 1, num_warps=1)


def launch_verify_step(src: BufferPair, me: int, n_writers: int, stride_writer_i: int, record_slot: int,
                       status: torch.Tensor) -> None:
    """Compare the step records in ``src`` (after the exchange) and OR what differs into ``status``."""
    par_p, par_f, par_i, _ = parity_args(src.parity, src.i)
    verify_step_kernel[(1,)](src.i, src.base_i, par_p, par_f, par_i, me, n_writers, stride_writer_i, record_slot,
                             status, NW=writers_block(n_writers), num_warps=1)


@triton.jit
def finish_step(counter_ptr, status_ptr):
    """The end of a step: the step counter advances and the step's findings (status word 1) join the
    sticky word 0. Run by one program, after every reader of this step's buffer copy: its own kernel
    (end_step_kernel), or the last program of a merge that is the step's last reader (a ticket)."""
    finish_step_from(counter_ptr, tl.load(counter_ptr), status_ptr)


@triton.jit
def finish_step_from(counter_ptr, step, status_ptr):
    """finish_step with the counter's value ``step`` already read (by a program of this step: only a step's
    end moves the counter), which spares the last program of a merge one dependent load."""
    tl.store(counter_ptr, step + 1)
    # Relaxed: one program, after the ticket's acquire (or alone in its kernel); the kernels after it read
    # both words once it has ended.
    found = tl.atomic_xchg(status_ptr + 1, 0, sem="relaxed")  # read and clear, after every program's atomic OR
    tl.atomic_or(status_ptr, found, sem="relaxed")


@triton.jit
def last_program_finishes_step(ticket_ptr, counter_ptr, step, status_ptr):
    """Every program of a grid takes a ticket when it is done; the last one (it sees every other
    program's writes: the ticket is acquire-release) ends the step and resets the ticket for the next.
    step: the counter's value, read by the program at its start."""
    done = tl.atomic_add(ticket_ptr, 1, sem="acq_rel")
    if done == tl.num_programs(0) - 1:
        tl.store(ticket_ptr, 0)
        finish_step_from(counter_ptr, step, status_ptr)


@triton.jit
def end_step_kernel(counter_ptr, status_ptr):
    """The end of a step, in one launch (steps whose last reader is not a merge that ends it)."""
    finish_step(counter_ptr, status_ptr)


def launch_end_step(counter: torch.Tensor, status: torch.Tensor) -> None:
    end_step_kernel[(1,)](counter, status, num_warps=1)


def new_ticket(device) -> torch.Tensor:
    """A zeroed int32 ticket for last_program_finishes_step (each use leaves it zeroed again)."""
    return torch.zeros(1, dtype=torch.int32, device=device)


def new_status(device) -> torch.Tensor:
    """Zeroed int32 status words [earlier steps, this step] on ``device``."""
    return torch.zeros(2, dtype=torch.int32, device=device)


__all__ = ["HeaderCheck", "call_flags", "filter_fingerprint", "fold_processor_fingerprint", "processor_fingerprint",
           "FLAG_EXTENDED",
           "STATUS_PEER_TIMEOUT", "RECORD_WORDS", "FLAG_LOGPROBS", "FLAG_CHUNKED", "ERROR_INPUT", "STATUS_RECORD_MISMATCH",
           "STATUS_PEER_ERROR", "STATUS_ROW_MISMATCH", "describe_status", "row_fingerprint", "write_row_fingerprints",
           "write_step_record", "load_records", "judge_records", "load_headers", "judge_headers", "writers_block", "launch_step_record",
           "launch_verify_step", "launch_end_step", "new_status", "finish_step", "finish_step_from",
           "last_program_finishes_step", "new_ticket"]
