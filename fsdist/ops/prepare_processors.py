"""One launch that turns a call's logit bias and penalties into the kernels' sorted entries.

Per row, the bias ids, the output ids and the prompt ids become one list of int32 entries
``id * 4 + kind`` (kind 0: a bias value, 1: an occurrence in output_ids, 2: an occurrence
in prompt_ids), sorted ascending, with each bias entry's value beside it; -1 slots,
output ids of a row whose penalties are all off and prompt ids of a row whose repetition
penalty is off become SENTINEL (past every tile). Stage-1 tiles then find their own ids'
entries by a 16-ary search (``processors.lower_bounds``).

The same program checks the row's values (ids in [-1, vocab_size), finite bias values,
finite penalties with repetition > 0) and flags the row bad, and writes the three
penalties as fp32 [3, B] (scalars broadcast). Everything is on the device: no host sync,
and one launch instead of the ~80 small torch operations the same work takes in torch.

Sorting is stable (equal entries keep their slot order), so repeated bias ids add up in the
order given, on every path and rank alike. On a GPU each row is sorted by one bitonic sort inside
this kernel (``tl.sort`` of the keys ``entry, slot``: one uint32 where 4 x vocab_size x slots fits,
``key32_fits``, else int64), on up to 16 warps (``prepare_warps``): ~7 µs at B = 1 and ~12 µs at
B = 256 for 1,000 ids a row on an H200. Wider rows, where that sort is slow (63 µs for 3,000 ids), are
sorted in small batches by a second, many-program kernel that computes each entry's rank instead
(``sort_entries.py``, ``default_sort``). Under the interpreter torch sorts after the kernel.
"""
import torch
import triton
import triton.language as tl

from .sort_entries import launch_sort_entries, rank_sort_pays
from .step_check import fold_processor_fingerprint
from .utils import cdiv, load_row_param, next_pow2

SENTINEL = 2**31 - 1  # an entry past every tile (kept equal to fsdist.processing.SENTINEL)
KIND_BIAS, KIND_OUTPUT, KIND_PROMPT = 0, 1, 2
# jit code may read module globals only as constexprs (the compiler rejects plain ints)
_SENTINEL = tl.constexpr(SENTINEL)
_KIND_BIAS, _KIND_OUTPUT, _KIND_PROMPT = tl.constexpr(KIND_BIAS), tl.constexpr(KIND_OUTPUT), tl.constexpr(KIND_PROMPT)


# Entries probed per row and key in one round of the search (one memory latency per round).
PROBES = 16


def search_rounds(width: int, probes: int = PROBES) -> int:
    """Rounds of ``processors.lower_bounds`` (the tiles' search of these entries) that settle any position in a row of ``width`` entries: a
    round leaves at most ceil(span / probes) - 1 of a span of candidate positions."""
    rounds, span = 0, int(width)
    while span > 0:
        span = cdiv(span, probes) - 1
        rounds += 1
    return rounds


@triton.jit
def _ids_of(ptr, stride, rows, live, slot, lo, n, HAS: tl.constexpr):
    """The ids at slots [lo, lo + n) of one source table ([R, S] with -1 elsewhere) and
    where they sit."""
    here = live[:, None] & (slot[None, :] >= lo) & (slot[None, :] < lo + n)
    if HAS:
        ids = tl.load(ptr + rows[:, None].to(tl.int64) * stride + (slot - lo)[None, :], mask=here, other=-1)
    else:
        ids = tl.full(here.shape, -1, tl.int64)
    return ids, here


@triton.jit
def _fingerprint(bad, bm_ptr, bm_stride, W, entry, val, keep, rep, freq, pres, xor_ptr, xor_val, rows, live,
                 BITMASK: tl.constexpr, XOR_ROW: tl.constexpr, BLOCK_R: tl.constexpr, WORDS: tl.constexpr):
    """``step_check.processor_fingerprint`` of the rows this program prepared, from its registers: the bad flag,
    the bitmask's sum, the entries' and the bias values' sums (sums: the sort's order does not change them), the
    penalties' bits, folded by step_check.fold_processor_fingerprint (the same bits), XOR the filters' fingerprint."""
    bm_sum = tl.zeros([BLOCK_R], tl.int64)
    if BITMASK:
        for start in range(0, W, WORDS):
            w = start + tl.arange(0, WORDS)
            m = live[:, None] & (w < W)[None, :]
            x = tl.load(bm_ptr + rows[:, None].to(tl.int64) * bm_stride + w[None, :], mask=m, other=0)
            bm_sum += tl.sum(x.to(tl.int64), axis=1)
    ent_sum = tl.sum(tl.where(keep, entry, 0).to(tl.int64), axis=1)
    val_sum = tl.sum(tl.where(keep, val.to(tl.int32, bitcast=True), 0).to(tl.int64), axis=1)
    fp = fold_processor_fingerprint(bad.to(tl.int64), bm_sum, ent_sum, val_sum, rep, freq, pres, BITMASK, True, True)
    if XOR_ROW:
        fp = fp ^ tl.load(xor_ptr + rows, mask=live, other=0)
    else:
        fp = fp ^ xor_val
    return fp


@triton.jit
def prepare_processors_kernel(
    bias_ids_ptr, bias_ids_stride, bias_val_ptr, bias_val_stride, K,
    out_ids_ptr, out_ids_stride, L, prompt_ids_ptr, prompt_ids_stride, P,
    rep_ptr, rep_val, freq_ptr, freq_val, pres_ptr, pres_val,
    entries_ptr, values_ptr, ent_stride, pen_ptr, pen_stride, bad_ptr, B, vocab_size,
    temp_ptr, temp_val, temp_out_ptr,
    fp_out_ptr, bm_ptr, bm_stride, W, xor_ptr, xor_val,
    HAS_BIAS: tl.constexpr, HAS_OUT: tl.constexpr, HAS_PROMPT: tl.constexpr,
    REP_PER_ROW: tl.constexpr, FREQ_PER_ROW: tl.constexpr, PRES_PER_ROW: tl.constexpr,
    BLOCK_R: tl.constexpr, S_POW2: tl.constexpr, SORT: tl.constexpr,
    TEMP_OUT: tl.constexpr = False, TEMP_PER_ROW: tl.constexpr = False, KEY32: tl.constexpr = False,
    FP_OUT: tl.constexpr = False, FP_BITMASK: tl.constexpr = False, FP_XOR_ROW: tl.constexpr = False,
    FP_WORDS: tl.constexpr = 1024,
):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    live = rows < B
    slot = tl.arange(0, S_POW2)
    S = K + L + P
    rep = load_row_param(rep_ptr, rep_val, rows, live, tl.float32, REP_PER_ROW)
    freq = load_row_param(freq_ptr, freq_val, rows, live, tl.float32, FREQ_PER_ROW)
    pres = load_row_param(pres_ptr, pres_val, rows, live, tl.float32, PRES_PER_ROW)
    pen_bad = ((rep != rep) | (rep == float("inf")) | (rep <= 0.0) | (freq != freq) | (tl.abs(freq) == float("inf"))
               | (pres != pres) | (tl.abs(pres) == float("inf")))
    out_used = (rep != 1.0) | (freq != 0.0) | (pres != 0.0)  # else output ids change nothing
    prompt_used = rep != 1.0  # only the repetition penalty reads the prompt

    b_ids, in_b = _ids_of(bias_ids_ptr, bias_ids_stride, rows, live, slot, 0, K, HAS_BIAS)
    o_ids, in_o = _ids_of(out_ids_ptr, out_ids_stride, rows, live, slot, K, L, HAS_OUT)
    p_ids, in_p = _ids_of(prompt_ids_ptr, prompt_ids_stride, rows, live, slot, K + L, P, HAS_PROMPT)
    ids = tl.where(in_b, b_ids, tl.where(in_o, o_ids, p_ids))
    kind = tl.where(in_b, _KIND_BIAS, tl.where(in_o, _KIND_OUTPUT, _KIND_PROMPT)).to(tl.int64)
    out_of_range = (in_b | in_o | in_p) & ((ids < -1) | (ids >= vocab_size))
    row_val = rows[:, None].to(tl.int64) * bias_val_stride
    if HAS_BIAS:
        val = tl.load(bias_val_ptr + row_val + slot[None, :], mask=in_b, other=0.0).to(tl.float32)
    else:
        val = tl.zeros(in_b.shape, tl.float32)
    val_bad = in_b & (ids >= 0) & ((val != val) | (tl.abs(val) == float("inf")))
    bad = (tl.max((out_of_range | val_bad).to(tl.int32), axis=1) > 0) | pen_bad
    use = (ids >= 0) & ~out_of_range & (in_b | (in_o & out_used[:, None]) | (in_p & prompt_used[:, None]))
    entry = tl.where(use, ids * 4 + kind, _SENTINEL)
    if SORT and KEY32:
        # (entry, slot) in one uint32 where it fits (4 x vocab_size x S_POW2 <= 2**32, checked by the
        # launcher): half the registers and shuffles of the int64 key in every stage of the sort.
        # Every SENTINEL entry becomes the largest key (no real key reaches it: the largest is
        # below 4 x vocab_size x S_POW2 - S_POW2); their slots are never read.
        key = tl.where(use, ids * (4 * S_POW2) + kind * S_POW2 + slot[None, :], 4294967295).to(tl.uint32)
        key = tl.sort(key, dim=1)
        sorted_entry = tl.where(key == 4294967295, _SENTINEL, (key // S_POW2).to(tl.int32))
        src = (key % S_POW2).to(tl.int32)
    elif SORT:
        key = tl.sort((entry << 32) | slot[None, :].to(tl.int64), dim=1)
        sorted_entry = (key >> 32).to(tl.int32)
        src = (key & 0xFFFFFFFF).to(tl.int32)  # the slot each sorted entry came from
    else:  # sorted after this kernel (see launch_prepare)
        sorted_entry = entry.to(tl.int32)
        src = slot[None, :] + tl.zeros(in_b.shape, tl.int32)
    if HAS_BIAS:
        sorted_val = tl.load(bias_val_ptr + row_val + src, mask=(src < K) & (sorted_entry != _SENTINEL),
                             other=0.0).to(tl.float32)
    else:
        sorted_val = tl.zeros(in_b.shape, tl.float32)
    keep = live[:, None] & (slot[None, :] < S)
    out = rows[:, None].to(tl.int64) * ent_stride + slot[None, :]
    tl.store(entries_ptr + out, sorted_entry, mask=keep)
    tl.store(values_ptr + out, sorted_val, mask=keep)
    tl.store(pen_ptr + rows, rep, mask=live)
    tl.store(pen_ptr + pen_stride + rows, freq, mask=live)
    tl.store(pen_ptr + 2 * pen_stride + rows, pres, mask=live)
    tl.store(bad_ptr + rows, bad.to(tl.int8), mask=live)
    if TEMP_OUT:
        # The call's temperature with bad rows poisoned (NaN: every later kernel then returns -1 for
        # them), written here rather than by torch ops after this kernel (two launches fewer).
        t = load_row_param(temp_ptr, temp_val, rows, live, tl.float32, TEMP_PER_ROW)
        tl.store(temp_out_ptr + rows, tl.where(bad, float("nan"), t), mask=live)
    if FP_OUT:
        # The tensor-parallel call header's processor fingerprint, here instead of in a launch of its own
        # (v64: processor_fingerprint_kernel ~1.9 µs of device time and a launch per call, on every rank).
        fp = _fingerprint(bad, bm_ptr, bm_stride, W, sorted_entry, sorted_val, keep, rep, freq, pres, xor_ptr,
                          xor_val, rows, live, FP_BITMASK, FP_XOR_ROW, BLOCK_R, FP_WORDS)
        tl.store(fp_out_ptr + rows, fp, mask=live)


def key32_fits(vocab_size: int, s_pow2: int) -> bool:
    """Whether (entry, slot) fits one uint32 sort key: entries are below 4 x vocab_size and slots below
    s_pow2 (e.g. V = 151936 with up to 4,096 slots a row)."""
    return 4 * vocab_size * s_pow2 <= 2**32


def prepare_warps(s_pow2: int) -> int:
    """Warps of the preparation kernel for rows of s_pow2 slots: one warp per 64 slots, 4 to 16.
    The bitonic sort is latency-bound, one row a program, and more warps mean fewer dependent steps
    each (sm_90 PTX of a 1,024-slot int32 sort: 392 shuffles a thread on 4 warps, 108 on 16, with
    41 barriers instead of 26). Measured on an H200 (2026-11-26, bench/prepare_probe.py, 1,000 ids
    a row, 32-bit keys): 13.6 / 8.5 / 6.9 µs at B = 1 on 4 / 8 / 16 warps, 19.7 / 14.0 / 11.6 µs at
    B = 256."""
    return min(16, max(4, s_pow2 // 64))


def default_sort(on_gpu: bool, batch: int, width: int) -> str:
    """launch_prepare's sort for rows of ``width`` entries: under the interpreter "torch" (after the
    kernel: tl.sort runs element by element there); on a GPU "rank" for small batches of rows of more
    than 1,024 entries (``sort_entries.rank_sort_pays``: the one-program sort slows steeply with width), else
    "bitonic" (inside the kernel: 7-12 µs for 1,000 entries at B = 1-256 on an H200)."""
    if not on_gpu:
        return "torch"
    return "rank" if rank_sort_pays(batch, width) else "bitonic"


def _param(x, dummy):
    """(pointer, value, per_row) of a penalty: a [B] tensor or a Python number."""
    if isinstance(x, torch.Tensor):
        return x, 0.0, True
    return dummy, float(x), False


def _fingerprint_args(out, xor, bitmask, batch: int, dummy):
    """((out, bitmask, its row stride, its words, xor pointer, xor value), BITMASK, XOR_ROW) of the kernel's
    fingerprint, checked (dummies where absent)."""
    if out is None:
        return (dummy, dummy, 0, 0, dummy, 0), False, False
    if out.dtype != torch.int64 or out.numel() < batch or not out.is_contiguous():
        raise ValueError(f"fingerprint_out must be a contiguous int64 tensor of at least {batch} elements")
    xor_row = isinstance(xor, torch.Tensor)
    if xor_row:
        if xor.dtype != torch.int64 or xor.numel() != batch:
            raise ValueError(f"fingerprint_xor must be an int or an int64 tensor of {batch} elements")
        xor = xor.reshape(-1).contiguous()
    # (one word a row: any column stride, as processing.check_bitmask lets it through)
    if bitmask is not None and (bitmask.dtype != torch.int32 or bitmask.dim() != 2
                                or (bitmask.stride(1) != 1 and bitmask.shape[1] > 1)):
        raise ValueError("bitmask must be an int32 [B, W] tensor with unit column stride")
    bm = (bitmask, bitmask.stride(0), bitmask.shape[1]) if bitmask is not None else (dummy, 0, 0)
    return (out, *bm, xor if xor_row else dummy, 0 if xor_row else int(xor)), bitmask is not None, xor_row


def launch_prepare(batch: int, vocab_size: int, device: torch.device, *, bias_ids=None, bias_values=None,
                   output_ids=None, prompt_ids=None, repetition=1.0, frequency=0.0, presence=0.0,
                   penalties: bool = False, sort=None, temperature=None, temperature_out=None,
                   key32=None, num_warps=None, fingerprint_out=None, fingerprint_xor=0, bitmask=None):
    """(entries int32 [B, S], values fp32 [B, S], penalties fp32 [3, B], bad bool [B]).

    bias_ids / output_ids / prompt_ids: int64 [B, *] or None (shapes, dtypes and devices
    already checked by the caller); bias_values: floating [B, K]; repetition / frequency /
    presence: float or [B] floating tensors; penalties: whether a Penalties was given (else
    all three are off). S = K + L + P must be > 0. sort: "bitonic" (inside this kernel; the
    default on a GPU), "rank" (``sort_entries``; the default on a GPU where ``rank_sort_pays``: small
    batches of rows of more than 1,024 entries) or "torch" (after it; the default under the interpreter),
    as ``default_sort`` picks. All three
    give the same result. temperature_out (fp32 [B]): receives ``temperature`` (a float or a [B]
    tensor) with the bad rows' set to NaN. fingerprint_out (int64 [B]): receives
    ``step_check.processor_fingerprint(bitmask, entries, values, penalties, bad, fingerprint_xor)`` of this
    call, the same bits, without that kernel's launch (bitmask: int32 [B, W] or None; fingerprint_xor: an int or
    int64 [B]). key32 / num_warps (benchmarks, tests): the bitonic sort's
    key width (default: 32 bits where (entry, slot) fits, see ``key32_fits``) and the kernel's warps
    (default ``prepare_warps``).
    """
    tables = [t for t in (bias_ids, output_ids, prompt_ids) if t is not None]
    S = sum(t.shape[1] for t in tables)
    entries = torch.empty(batch, S, dtype=torch.int32, device=device)
    values = torch.empty(batch, S, dtype=torch.float32, device=device)
    pen = torch.empty(3, batch, dtype=torch.float32, device=device)
    bad = torch.empty(batch, dtype=torch.int8, device=device)
    if batch == 0:
        return entries, values, pen, bad.bool()
    dummy = entries

    def table(t):
        return (t, t.stride(0), t.shape[1]) if t is not None else (dummy, 0, 0)

    bi, bi_s, K = table(bias_ids)
    bv, bv_s = (bias_values, bias_values.stride(0)) if bias_values is not None else (dummy, 0)
    oi, oi_s, L = table(output_ids)
    pi, pi_s, P = table(prompt_ids)
    if not penalties:  # a bias alone: penalties off
        repetition, frequency, presence = 1.0, 0.0, 0.0
    rep, freq, pres = (_param(x, values) for x in (repetition, frequency, presence))
    if temperature_out is not None and (temperature_out.dtype != torch.float32 or temperature_out.numel() < batch):
        raise ValueError(f"temperature_out must be an fp32 tensor of at least {batch} elements")
    temp = _param(1.0 if temperature is None else temperature, values)
    fp = _fingerprint_args(fingerprint_out, fingerprint_xor, bitmask, batch, entries)
    s_pow2 = max(16, next_pow2(S))
    on_gpu = device.type == "cuda"
    if sort is None:
        sort = default_sort(on_gpu, batch, S)
    if sort not in ("rank", "bitonic", "torch"):
        raise ValueError(f"sort must be 'rank', 'bitonic' or 'torch', got {sort!r}")
    # One row per program on a GPU. Under the interpreter a program's cost is mostly fixed,
    # so many rows per program (and no bitonic sort by default: the interpreter runs tl.sort's
    # xor-reductions element by element, seconds per call). tests/ops/test_prepare_processors.py
    # checks that the three sorts agree.
    block_r = 1 if on_gpu or sort == "bitonic" else max(1, min(next_pow2(batch), 8192 // s_pow2))
    fits = key32_fits(vocab_size, s_pow2)
    key32 = fits if key32 is None else bool(key32)
    if key32 and not fits and sort == "bitonic":  # (only the in-kernel sort uses the key)
        raise ValueError(f"32-bit sort keys do not fit rows of {s_pow2} slots at vocab_size {vocab_size}")
    num_warps = prepare_warps(s_pow2) if num_warps is None else int(num_warps)
    prepare_processors_kernel[(cdiv(batch, block_r),)](
        bi, bi_s, bv, bv_s, K, oi, oi_s, L, pi, pi_s, P,
        rep[0], rep[1], freq[0], freq[1], pres[0], pres[1],
        entries, values, entries.stride(0), pen, pen.stride(0), bad, batch, vocab_size,
        temp[0], temp[1], temperature_out if temperature_out is not None else values,
        *fp[0], FP_OUT=fingerprint_out is not None, FP_BITMASK=fp[1], FP_XOR_ROW=fp[2],
        TEMP_OUT=temperature_out is not None, TEMP_PER_ROW=temp[2],
        HAS_BIAS=bias_ids is not None, HAS_OUT=output_ids is not None, HAS_PROMPT=prompt_ids is not None,
        REP_PER_ROW=rep[2], FREQ_PER_ROW=freq[2], PRES_PER_ROW=pres[2], BLOCK_R=block_r, S_POW2=s_pow2,
        SORT=sort == "bitonic", KEY32=key32 and fits, num_warps=num_warps)
    if sort == "rank":
        entries, values = launch_sort_entries(entries, values)
    elif sort == "torch":
        entries, order = torch.sort(entries, dim=1, stable=True)
        values = values.gather(1, order)
    return entries, values, pen, bad.view(torch.bool)  # 0 / 1 bytes: a view, not a conversion launch


__all__ = ["SENTINEL", "default_sort", "key32_fits", "launch_prepare", "prepare_processors_kernel", "prepare_warps"]
