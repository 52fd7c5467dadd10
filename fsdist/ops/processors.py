"""The logit processors inside a stage-1 tile: token bitmask, logit bias, penalties.

``apply_processors`` turns a [rows, ids] tile of raw logits, still in registers, into
processed logits (vLLM V1's order: bitmask, then bias, then penalties; see
``fsdist.processing`` for the inputs). Every stage-1 kernel (fused GEMM, chunked pass,
fallback materialization) calls it on the same logits with the same entries, so the
processed logits, hence the candidates and tokens, do not depend on the path, the tile
size or the tensor-parallel degree.

Bias and penalties come as a sorted list of entries per row (``id * 4 + kind``, built by
``prepare_processors``). A tile needs the slice of its own ids: the Triton fused GEMM reads it
from a per-launch table of offsets (``entry_offsets.py``; two loads issued before its main loop,
so nothing waits in the epilogue), the warp-specialised kernel searches both column halves of a
tile at its start (``split_slices``, ``slice_heads``: its epilogue runs beside the next tile's
MMAs), the other kernels search the list (a 16-ary search: a few rounds of independent loads,
any tiling, path or vocabulary range). ``process_tile`` then
walks those entries (usually none or one per row), summing, per (row, id), the bias values,
the occurrences in the output and whether the id was seen in the prompt or the output, and
rewrites each such id's logit once:

    x = x + bias;  x = x / r if x > 0 else x * r  (seen ids);  x = x - f * count - p * [count > 0]

(each product rounded on its own: ``processed_logit``)

Ids without entries keep their logit bit for bit. A disallowed id is -inf before and after
(-inf plus, times or minus a finite number).
"""
from typing import Optional

import torch
import triton
import triton.language as tl

from ..processing import SENTINEL, LogitProcessing, has_entries
from .epilogue import rounded_mul
from .prepare_processors import PROBES
from .utils import pinned_products_ok

_SENTINEL = tl.constexpr(SENTINEL)
_PROBES = tl.constexpr(PROBES)


@triton.jit
def _narrow(ent_ptr, row_base, key, lo, hi, k, PROBES: tl.constexpr):
    """One round for one key: the first position >= key lies in [lo, hi] (hi = width: none)."""
    span = hi - lo
    # probe k (1..PROBES) at lo + ceil(k * span / PROBES) - 1: probe PROBES is hi - 1
    q = lo[:, None] + (k[None, :] * span[:, None] + PROBES - 1) // PROBES - 1
    live = span[:, None] > 0
    e = tl.load(ent_ptr + row_base[:, None] + q, mask=live, other=0)
    below = tl.sum((live & (e < key)).to(tl.int32), axis=1)  # the entries are sorted: a prefix of probes
    q_below = tl.max(tl.where(k[None, :] == below[:, None], q, -1), axis=1)  # last probe < key
    q_above = tl.max(tl.where(k[None, :] == below[:, None] + 1, q, -1), axis=1)  # first probe >= key
    busy = span > 0
    lo = tl.where(busy & (below > 0), q_below + 1, lo)
    hi = tl.where(busy & (below < PROBES), q_above, hi)
    return lo, hi


@triton.jit
def lower_bounds(ent_ptr, row_base, width, key_a, key_b, mask_r, rounds, PROBES: tl.constexpr):
    """Per row: the first position in the row's sorted entries whose entry is >= key_a, and the
    same for key_b (width if none). A PROBES-ary search: each round loads PROBES entries per
    row and key, all independent, so a round costs one memory latency where a binary search
    pays one per halving (3 rounds instead of 11 dependent loads at 1,000 entries). rounds:
    ``prepare_processors.search_rounds(width)``."""
    return lower_bounds_at(ent_ptr, row_base, width, key_a, key_b, mask_r, rounds, tl.arange(0, PROBES) + 1, PROBES)


@triton.jit
def lower_bounds_at(ent_ptr, row_base, width, key_a, key_b, mask_r, rounds, probes, PROBES: tl.constexpr):
    """lower_bounds with the probe numbers given (probes: int32 [PROBES], 1 .. PROBES). Nothing
    here makes a tensor of its own, so a Gluon kernel can call it: its probes and rows carry the
    layouts (probes in the slice of the rows' parent layout along the columns)."""
    hi_a = tl.where(mask_r, width, 0)
    lo_a = hi_a * 0
    lo_b = lo_a
    hi_b = hi_a
    for _ in range(rounds):
        lo_a, hi_a = _narrow(ent_ptr, row_base, key_a, lo_a, hi_a, probes, PROBES)
        lo_b, hi_b = _narrow(ent_ptr, row_base, key_b, lo_b, hi_b, probes, PROBES)
    return lo_a, lo_b


@triton.jit
def lower_bound(ent_ptr, row_base, width, key, mask_r, rounds, PROBES: tl.constexpr):
    """Per lane: the first position in its sorted entries (at row_base [R]) that is >= its key
    (key [R]; width if none); lower_bounds with a key per lane."""
    k = tl.arange(0, PROBES) + 1
    lo = tl.zeros(row_base.shape, tl.int32)
    hi = tl.where(mask_r, width, 0)
    for _ in range(rounds):
        lo, hi = _narrow(ent_ptr, row_base, key[:, None], lo, hi, k, PROBES)
    return lo


@triton.jit
def split_slices(ent_ptr, ent_stride, ent_width, search_steps, rows, mask_r, tile_lo, probes, HALF: tl.constexpr):
    """(start_0, n_0, start_1, n_1) per row: its entries of ids tile_lo .. + HALF - 1 and of the next HALF
    ids, by one 3-key search (the three keys narrow side by side: one memory latency per round, as
    searched_slice's two). For a kernel that processes a tile in two column halves."""
    base = rows.to(tl.int64) * ent_stride
    hi_a = tl.where(mask_r, ent_width, 0)
    lo_a = hi_a * 0
    lo_m = lo_a
    hi_m = hi_a
    lo_b = lo_a
    hi_b = hi_a
    for _ in range(search_steps):
        lo_a, hi_a = _narrow(ent_ptr, base, tile_lo * 4, lo_a, hi_a, probes, _PROBES)
        lo_m, hi_m = _narrow(ent_ptr, base, (tile_lo + HALF) * 4, lo_m, hi_m, probes, _PROBES)
        lo_b, hi_b = _narrow(ent_ptr, base, (tile_lo + 2 * HALF) * 4, lo_b, hi_b, probes, _PROBES)
    return lo_a, tl.where(mask_r, lo_m - lo_a, 0), lo_m, tl.where(mask_r, lo_b - lo_m, 0)


@triton.jit
def slice_heads(ent_ptr, val_ptr, ent_stride, rows, start, n, hcol):
    """(head, head_values) [R, HEAD]: the first HEAD entries of each row's slice (start, n) and their
    values, SENTINEL / 0.0 past the slice (hcol: int32 [HEAD], 0 .. HEAD - 1); one round of independent
    loads, which process_tile then walks from registers (what entry_offsets' table gives the fused GEMM)."""
    at = (rows.to(tl.int64) * ent_stride + start)[:, None] + hcol[None, :]
    take = hcol[None, :] < n[:, None]
    return (tl.load(ent_ptr + at, mask=take, other=_SENTINEL), tl.load(val_ptr + at, mask=take, other=0.0))


@triton.jit
def searched_slice(ent_ptr, ent_stride, ent_width, search_steps, rows, mask_r, tile_lo, probes, TILE: tl.constexpr,
                   SPARSE: tl.constexpr):
    """(start, n) per row: the row's entries of ids tile_lo .. tile_lo + TILE - 1, found by
    searching the row's list (any tiling); (0, 0) without entries. probes: int32 [_PROBES],
    1 .. _PROBES (``tl.arange(0, _PROBES) + 1``; a Gluon caller builds it in its own layout)."""
    if SPARSE:
        start, end = lower_bounds_at(ent_ptr, rows.to(tl.int64) * ent_stride, ent_width, tile_lo * 4,
                                     (tile_lo + TILE) * 4, mask_r, search_steps, probes, _PROBES)
        n = tl.where(mask_r, end - start, 0)
    else:
        start = rows.to(tl.int32) * 0
        n = start
    return start, n


@triton.jit
def table_slice(eoff_ptr, eoff_stride, head_ptr, head_val_ptr, head_stride, rows, mask_r, tile, SPARSE: tl.constexpr,
                HEAD: tl.constexpr):
    """(start, n, head, head_values) per row for tile ``tile`` of a launch, read from its
    ``entry_offsets`` (start, n: int32 [R]; head / head_values: the slice's first HEAD entries and
    values, [R, HEAD]). All independent loads, so a kernel can issue them before its main loop
    and find them ready in the epilogue. Zeros / SENTINEL without entries."""
    h = tl.arange(0, HEAD)
    if SPARSE:
        base = eoff_ptr + rows.to(tl.int64) * eoff_stride + tile
        start = tl.load(base, mask=mask_r, other=0)
        n = tl.load(base + 1, mask=mask_r, other=0) - start
        hoff = rows[:, None].to(tl.int64) * head_stride + tile * HEAD + h[None, :]
        head = tl.load(head_ptr + hoff, mask=mask_r[:, None], other=_SENTINEL)
        head_val = tl.load(head_val_ptr + hoff, mask=mask_r[:, None], other=0.0)
    else:
        start = tl.zeros(rows.shape, tl.int32)
        n = start
        head = tl.zeros([rows.shape[0], HEAD], tl.int32) + _SENTINEL
        head_val = tl.zeros([rows.shape[0], HEAD], tl.float32)
    return start, n, head, head_val


@triton.jit
def tile_bitmask_words(bm_ptr, bm_stride, rows, mask_r, tile_lo, vocab_size, WIDTH: tl.constexpr,
                       BITMASK: tl.constexpr):
    """int32 [R, WIDTH // 32]: the bitmask words of ids tile_lo .. tile_lo + WIDTH - 1 (tile_lo a
    multiple of 32), -1 (all allowed) past the vocabulary. One small independent load a kernel
    issues before its main loop (``bitmask_bits`` expands it in the epilogue), instead of a
    [R, WIDTH] gather that the epilogue waits for."""
    w = tile_lo // 32 + tl.arange(0, WIDTH // 32)
    if BITMASK:
        words = tl.load(bm_ptr + rows[:, None].to(tl.int64) * bm_stride + w[None, :],
                        mask=mask_r[:, None] & (w * 32 < vocab_size)[None, :], other=-1)
    else:
        words = tl.zeros([rows.shape[0], WIDTH // 32], tl.int32) - 1
    return words


@triton.jit
def bitmask_bits(words, WIDTH: tl.constexpr):
    """[R, WIDTH] bool, id tile_lo + c allowed, from ``tile_bitmask_words``: each word repeated
    over its 32 columns in registers, then bit c % 32 of it."""
    R: tl.constexpr = words.shape[0]
    full = tl.reshape(tl.broadcast_to(words[:, :, None], [R, WIDTH // 32, 32]), [R, WIDTH])
    return ((full >> (tl.arange(0, WIDTH) % 32)[None, :]) & 1) != 0


@triton.jit
def bitmask_allowed(bm_ptr, bm_stride, rows, mask_r, gid, ok):
    """[R, C] bool, id gid[c] allowed for row rows[r], gathered word by word from the bitmask
    (ok: ids inside the vocabulary; others and padding rows read as allowed). Any tiling and
    vocabulary offset; only loads, so a kernel can issue it before its logits are ready."""
    word = tl.load(bm_ptr + rows[:, None].to(tl.int64) * bm_stride + (gid // 32)[None, :],
                   mask=mask_r[:, None] & ok[None, :], other=-1)
    return ((word >> (gid % 32)[None, :]) & 1) != 0


@triton.jit
def span_words(bm_ptr, bm_stride, rows, mask_r, first_id, vocab_size):
    """The three bitmask words per row (int32 [R] each; -1, all allowed, for words past the
    vocabulary and for padding rows) that cover ids first_id .. first_id + 63: any 64 consecutive
    ids span at most three words. Three small loads where a per-id gather (bitmask_allowed) holds a
    [R, C] tile of words in registers. Ids past the vocabulary inside its last word read that word's
    bits (the kernels have set their logits to -inf already)."""
    w = first_id // 32
    base = bm_ptr + rows.to(tl.int64) * bm_stride + w
    w0 = tl.load(base, mask=mask_r & (w * 32 < vocab_size), other=-1)
    w1 = tl.load(base + 1, mask=mask_r & ((w + 1) * 32 < vocab_size), other=-1)
    w2 = tl.load(base + 2, mask=mask_r & ((w + 2) * 32 < vocab_size), other=-1)
    return w0, w1, w2


@triton.jit
def span_allowed(w0, w1, w2, first_id, gid):
    """[R, C] bool, id gid[c] allowed, from span_words(..., first_id, ...) (gid within first_id .. + 63)."""
    k = (gid // 32 - first_id // 32)[None, :]
    word = tl.where(k == 0, w0[:, None], tl.where(k == 1, w1[:, None], w2[:, None]))
    return ((word >> (gid % 32)[None, :]) & 1) != 0


@triton.jit
def row_penalties(pen_ptr, pen_stride, rows, mask_r, SPARSE: tl.constexpr):
    """(repetition, frequency, presence) fp32 [R] of the rows (1, 0, 0 without entries)."""
    if SPARSE:
        rep = tl.load(pen_ptr + rows, mask=mask_r, other=1.0)
        freq = tl.load(pen_ptr + pen_stride + rows, mask=mask_r, other=0.0)
        pres = tl.load(pen_ptr + 2 * pen_stride + rows, mask=mask_r, other=0.0)
    else:  # made from rows, so that a Gluon caller's layout carries over
        freq = rows.to(tl.float32) * 0.0
        rep = freq + 1.0
        pres = freq
    return rep, freq, pres


@triton.jit
def _entry_step(x, gid, e, v, live, run, bias, count, seen, rep, freq, pres, PINNED: tl.constexpr):
    """One entry per row (e, v; live: the row still has one): close the runs it ends, then add it."""
    ident = e >> 2
    fresh = ident != run
    ends = fresh & (run >= 0)
    hit = gid[None, :] == tl.where(ends, run, -1)[:, None]
    # the run's one logit, read out of the tile (a row max over a single hit) and written back
    xv = tl.max(tl.where(hit, x, float("-inf")), axis=1)
    x = tl.where(hit, processed_logit(xv, bias, count, seen, rep, freq, pres, PINNED)[:, None], x)
    kind = e & 3
    bias = tl.where(fresh, 0.0, bias) + tl.where(live & (kind == 0), v, 0.0)
    count = tl.where(fresh, 0, count) + (live & (kind == 1)).to(tl.int32)
    seen = tl.where(fresh, 0, seen) | (live & (kind != 0)).to(tl.int32)
    return x, ident, bias, count, seen


@triton.jit
def process_tile(x, rows, mask_r, gid, ok, bm_ptr, bm_stride, ent_ptr, val_ptr, ent_stride, start, n, head, head_val,
                 hcol, rep, freq, pres, words, BITMASK: tl.constexpr, SPARSE: tl.constexpr, HEAD: tl.constexpr,
                 WORDS: tl.constexpr, PINNED: tl.constexpr):
    """Processed logits of a tile whose entry slices (start, n per row), the slices' first HEAD
    entries (head, head_val [R, HEAD]; HEAD = 0: none given; hcol: int32 [HEAD], 0 .. HEAD - 1, in
    the heads' column layout) and the rows' penalties are known.
    x: fp32 [R, C] raw logits of global ids gid [C] for rows [R] (mask_r: real rows; ok: ids <
    vocab_size inside the weight).

    The entries are walked in list order, all rows at once, one entry per step: a step adds the
    entry to its id's run (bias values in the order given, output occurrences counted, any
    prompt/output occurrence marks the id seen) and, where a row's run ends (the next entry has
    another id, or none is left), rewrites that one logit with ``processed_logit``. Only
    per-row scalars carry between steps (no [R, C] accumulators: registers the GEMM's epilogue
    does not have). The sums are those of ``apply_entries`` (same order, same formula), so
    every path agrees bit for bit. WORDS: the bitmask's words of this tile are given (``words``,
    from ``tile_bitmask_words``; gid then holds the tile's ids in order from a multiple of 32),
    else they are gathered here. PINNED: processed_logit's products rounded apart (CUDA; the
    ``PINNED`` flag of ``processor_args``)."""
    if BITMASK and WORDS:
        x = tl.where(bitmask_bits(words, x.shape[1]), x, float("-inf"))
    elif BITMASK:
        x = tl.where(bitmask_allowed(bm_ptr, bm_stride, rows, mask_r, gid, ok), x, float("-inf"))
    if SPARSE:
        # The per-row state, made from rows (not tl.full) so that a Gluon caller's layout carries over.
        count = rows.to(tl.int32) * 0
        run = count - 1  # id of the run being summed (-1: none yet)
        bias = count.to(tl.float32)
        seen = count
        longest = tl.max(n, axis=0)
        if longest > 0:
            # The head entries are in registers already; a row past its slice reads SENTINEL
            # (an id of no tile), which closes its last run.
            for j in tl.static_range(HEAD):
                pick = hcol[None, :] == j
                e = tl.max(tl.where(pick, head, -1), axis=1)
                v = tl.sum(tl.where(pick, head_val, 0.0), axis=1)
                x, run, bias, count, seen = _entry_step(x, gid, e, v, j < n, run, bias, count, seen, rep, freq, pres,
                                                        PINNED)
            # Entries past the heads (and, without heads, all of them): read from the list, plus
            # one step past the longest slice to close every row's last run.
            row_ent = rows.to(tl.int64) * ent_stride + start
            for j in range(HEAD, longest + 1):
                live = j < n
                e = tl.load(ent_ptr + row_ent + j, mask=live, other=_SENTINEL)
                v = tl.load(val_ptr + row_ent + j, mask=live, other=0.0)
                x, run, bias, count, seen = _entry_step(x, gid, e, v, live, run, bias, count, seen, rep, freq, pres,
                                                        PINNED)
    return x


@triton.jit
def apply_processors(x, rows, mask_r, gid, ok, tile_lo,
                     bm_ptr, bm_stride, ent_ptr, val_ptr, ent_stride, ent_width, search_steps, pen_ptr, pen_stride,
                     BITMASK: tl.constexpr, SPARSE: tl.constexpr, PINNED: tl.constexpr):
    """Processed logits of a tile, its entry slices found by searching (``process_tile``; the
    tile's ids are tile_lo .. tile_lo + C - 1, gid may hold them in another order)."""
    start, n = searched_slice(ent_ptr, ent_stride, ent_width, search_steps, rows, mask_r, tile_lo,
                              tl.arange(0, _PROBES) + 1, x.shape[1], SPARSE)
    rep, freq, pres = row_penalties(pen_ptr, pen_stride, rows, mask_r, SPARSE)
    # No heads (HEAD = 0) and no preloaded bitmask words (WORDS off): head, head_val, hcol and
    # words are placeholders that process_tile never reads.
    return process_tile(x, rows, mask_r, gid, ok, bm_ptr, bm_stride, ent_ptr, val_ptr, ent_stride, start, n,
                        start, rep, start, rep, freq, pres, start, BITMASK, SPARSE, 0, False, PINNED)


@triton.jit
def processed_logit(x, bias, count, seen, rep, freq, pres, PINNED: tl.constexpr):
    """Bias and penalties of one id, elementwise: x + bias, then the repetition penalty where
    the id was seen (prompt or output), then frequency x count and presence. The one formula
    every path uses (in-tile here, in place on a chunk in ``apply_entries``), so a processed
    logit does not depend on where it was computed: every product is rounded on its own
    (``epilogue.rounded_mul``; PINNED on CUDA), since a compiler free to fuse
    ``x - freq * count`` into one multiply-add does so in one kernel and not in another. An id
    without entries (bias 0, count 0, not seen) keeps its value."""
    x = x + bias
    x = tl.where(seen != 0, tl.where(x > 0, x / rep, rounded_mul(x, rep, PINNED)), x)
    x = x - rounded_mul(freq, count.to(tl.float32), PINNED)
    return x - rounded_mul(pres, (count > 0).to(tl.float32), PINNED)


def processor_args(processing: Optional[LogitProcessing], dummy: torch.Tensor, sparse_in_tile: bool = True):
    """(runtime arguments, constexpr flags) of apply_processors; ((dummy, ...),
    BITMASK=False, SPARSE=False) without processors; PINNED (products rounded apart, CUDA: see
    processed_logit) either way. The same for every launch of a call.
    sparse_in_tile=False: bias and penalties are already in the logits (``apply_entries``
    ran on them), only the bitmask is left to the tiles."""
    bm = processing.bitmask if processing is not None else None
    sparse = has_entries(processing) and sparse_in_tile
    args = [bm if bm is not None else dummy, bm.stride(0) if bm is not None else 0]
    if sparse:
        ent = processing.entries
        args += [ent, processing.values, ent.stride(0), ent.shape[1], processing.search_steps,
                 processing.penalties, processing.penalties.stride(0)]
    else:
        args += [dummy, dummy, 0, dummy, 0, dummy, 0]
    return args, {"BITMASK": bm is not None, "SPARSE": sparse, "PINNED": pinned_products_ok(dummy.device)}


__all__ = ["apply_processors", "bitmask_allowed", "bitmask_bits", "lower_bound", "lower_bounds", "lower_bounds_at",
           "process_tile", "processed_logit", "processor_args", "row_penalties", "searched_slice", "slice_heads",
           "span_allowed", "span_words", "split_slices", "table_slice", "tile_bitmask_words"]
