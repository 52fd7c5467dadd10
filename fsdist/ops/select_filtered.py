"""Stage 2 for filtered rows and top-N logprobs: exact thresholds from the kept logits (one kernel).

With filters (min-p, top-k, top-p) a row samples from the logits at or above one
threshold tau (vLLM V1's order):

    tau_S = max(l_max + T log(min_p), k-th largest logit)      (min-p, then top-k)
    tau_p = the smallest logit v in S = {l >= tau_S} whose strictly-larger mass in S,
            renormalised over S, is < top_p                    (top-p on the survivors)
    tau   = max(tau_S, tau_p);  token = argmax_{l_v >= tau} (l_v + T * Gumbel(v))

Stage 1 kept, for every (row, vocabulary tile), the tile's KEEP largest logits and the
*boundary* b: the largest logit it did not keep. Let U be the kept logits of a row and
B = max b. Everything at or above B's successor is in U, so the thresholds computed from
U alone are the true ones whenever they lie strictly above B (and, with top-p after
min-p / top-k, tau_S does too: then the renormaliser Z_S is a sum over U). Such a row is
*proven* and finished here; any other row is marked for the exact fallback
(``fallback.py``), which recomputes its logits. Adding the missing logits can only raise
each threshold, so a proof never needs more than U.

Only the kept logits above B can decide a proven row: a proof needs every threshold above
B, the k-th largest is known only if U holds k logits above B, and the top-p search gives
a key above B over U exactly when it does over U's part above B (the mass above any key
>= B is the same in both). So the searches may run over each row's kept logits above B,
packed into a per-row scratch (``cap``, up to ``SEARCH_CAP`` of them; a program with a row
over the cap searches all of U, with the same outcome). Calls do not pack by default
(``DEFAULT_SEARCH_CAP``): U has 4 x 1,187 = 4,748 elements per row at V = 151936 against
700-1,300 above B on flat rows, but the bisections are bracketed by each row's live keys and
top-p runs over the packed survivors, and the pack itself then costs more than it saves
(H100, 2026-11-24).

The top-k search stops early on most rows: bisection keeps a key lo with at least k kept
logits at or above it, and once at most SMALL_CAP lie there (2-5 steps on a row's tail) the
program packs P = U's logits at or above pk = max(lo, the min-p threshold) into SMALL_CAP
lanes and ranks the k-th largest pairwise (``kth_key_small``). P holds S whenever S decides
anything: with the k-th largest known, S starts at max(min-p threshold, k-th) >= pk; without it
S starts at the min-p threshold, and the row is proven only if that lies above B, where fewer
than k logits reach it: then lo <= k-th < min-p threshold, or (k above the live count) every
live logit reaches it; either way P = S. Any other row is flagged and
needs only max(min-p threshold, k-th largest of U) for its fallback bound, which P gives
exactly (if P holds k logits its k-th largest is U's; if not, U's lies below pk, which is then
the min-p threshold). A program with a row whose P is over SMALL_CAP bisects on to the exact
key and runs top-p by search over all of U. A program whose rows ask for min-p alone has nothing
to rank pairwise: P (the survivors), when it holds at most WIDE_CAP logits, then packs into WIDE_CAP
lanes, so that its mass and the
draw's noise run over P's ids and not over all ~4,700 of U (min-p 0.05 rows often keep more than
SMALL_CAP survivors).

Thresholds are found by bisection on an order-preserving 32-bit key of the fp32 logits,
between each row's smallest and largest live keys (or pairwise, above): the k-th largest key,
and the smallest key whose strictly-larger mass is < top_p * Z_S. Both land on a logit that exists, so ties are handled exactly: every logit
equal to the threshold is kept (vLLM keeps all ties at the k-th value; for top-p this
keeps a whole tie group, which vLLM's sort may split). The sampling noise is recomputed
per kept id from the RNG contract (``noise.vocab_bits``), so the token is the one the
unfiltered argmax over the kept set would give: the same for any tile size, batch
position, path or tensor-parallel degree.

A row U cannot prove is flagged for ``fallback.py`` with a *need key*: a key at or below
every threshold the row needs (U's min-p threshold, its k-th and N-th largest when U holds
that many, its nucleus key when nothing restricts top-p's renormaliser; the missing logits
can only raise each). The fallback recomputes only the tiles whose boundary reaches the key
and runs ``finish_rows`` again over them and U's part at or above it; a row with no bound, or
with more than REFINE_CAP such logits, gets key 0 (its whole row is recomputed). With the
optional packed search a top-k row with fewer than k kept logits above B gets no k-th largest
of U (it was not searched), hence key 0 unless min-p bounds it.

Min-p from the winners. A row with min-p and no other filter needs no mass to fix its
threshold: tau = l_max + T log(min_p) is exact whatever U holds. When tau lies at or below B,
U may lack survivors, but the draw is an argmax, and stage 1 already took the argmax of every
tile: its winner (score, id, and with ``plan.winner_logits_needed`` the winner's logit). Call a
tile *open* when its boundary reaches tau (it may hold survivors U lacks). Then, with the
scores of U's survivors from the draw over them (the contract's noise):

* an open tile whose winner is a survivor offers that winner: the best score of all its ids,
  hence of its survivors;
* an open tile whose winner is not a survivor holds survivors scoring at most the winner's
  score: an upper bound;
* every survivor of a tile that is not open is in U.

If the best of U's survivors and the offered winners scores strictly above every open tile's
bound, it is the argmax over the survivors, with the lowest id among equal scores as on every
path: the row is proven with its token (``winner_draw``). Otherwise it goes to the fallback as
before. On the kernel bench's rows (min-p 0.05: a tile with five or more of ~150 survivors)
it proved all 20 of 1,536 rows U alone could not (bench/minp_winner_rate.py; a torch model of
the rule: 0.90% of rows flagged before, 0.05% after). "Processed" logprobs (of the token or the top N) need the
survivors' mass, so calls asking for them skip it; a row whose token the winners prove but whose
top-N U cannot still goes to the fallback, which redoes both.

Top-N logprobs: the N largest logits (lower id first among equal ones) are read off U
when the N-th one lies above B; logprobs in the requested mode: "scaled"
log_softmax(logits / T), "raw" log_softmax(logits), "processed" the log-probability in
the filtered, renormalised distribution (-inf for ids the filters drop; greedy and
unfiltered rows: scaled). Masses are fp32 sums, like the float32 samplers of serving stacks.
"""
import torch
import triton
import triton.language as tl

from ..params import LOGPROBS_MODES, RowParams
from ..runtime import interpreting
from .epilogue import filter_switches, perturb, row_temperature
from .layout import KEEP, BufferPair, CandidateLayout, slot_offset
from .noise import gumbel_from_bits, vocab_bits
from .merge_candidates import slot_winner, store_merged
from .parity import parity_args, parity_offsets
from .top_logprobs import fill_free_ids, place_pick, top_n_normaliser
from .utils import cdiv, fast_log_ok, load_row_param, next_pow2, pdl_args, pdl_prologue, pdl_wait_point, row_param_args

MODE_SCALED, MODE_RAW, MODE_PROCESSED = 0, 1, 2
# Most kept logits above the boundary a row may have for the packed search (else all of U
# is searched: same results). A power of two; 2,048 covers the 700-1,300 of flat rows.
SEARCH_CAP = 2048
# The cap a call uses unless told: 0, no packing. Since the searches are bracketed by each row's
# live keys and top-p runs over the packed survivors (SMALL_CAP), packing U's part above the
# boundary first costs more than it saves: 3.4-5 us per top-k + top-p call slower on an H100,
# min-p within 1.5 us (docs/performance.md, v21). Kept as an option (cap=SEARCH_CAP; tests, probes).
DEFAULT_SEARCH_CAP = 0
# Most logits a row's P (its logits at or above the stopped top-k bisection's lower end and the
# min-p threshold; see the module docstring) may hold for the k-th largest, top-p and the draw to
# run over P packed into this many lanes (pairwise, no search); else over all of U (same results
# up to the order of fp32 sums). Also the top-k bisection's stop. A power of two >= 32; 0 turns it
# off (tests).
SMALL_CAP = 128
# Most logits P may hold for a program whose rows ask for min-p alone (no top-k, no top-p: nothing
# pairwise to rank) to pack P into this many lanes for its mass and the draw; else they run over all
# of U (the noise of ~4,700 ids a row instead of P's). Min-p 0.05 rows of the kernel bench keep ~25-250
# survivors, often more than SMALL_CAP. A power of two > SMALL_CAP, or 0 (off).
WIDE_CAP = 1024
# select_filtered's warps on a GPU (one row a program). Timed alone (warm caches) 8 beat 16 by ~1.5 µs, but in
# whole calls (graph replays, L2 flushed as the weight stream flushes it in serving) 8 lost 11 µs at B = 1 for
# top-k + top-p and 1.8 µs for min-p (H100, D = 4096, docs/performance.md v30 / v32): with twice the lanes a
# thread the kernel's code is ~1.6x longer, and a call fetches it from HBM. 4 and 32 lost alone.
SELECT_WARPS = 16
# The k-th largest and top-p over P's packed lanes (SMALL_CAP of them) from P sorted once and one scan of its masses
# (kth_key_sorted, nucleus_key_sorted) instead of pairwise counts and sums over LANES x LANES pairs, which were ~23%
# of select_filtered's executed instructions for top-k + top-p (docs/performance.md, "select_filtered by source
# function"). The same thresholds up to the order of fp32 sums.
SORTED_TOP_P = True
# Most logits the fallback may gather for one row to finish it from a few recomputed tiles
# (fallback.py): U's part at or above the row's lower bound plus the tiles it must recompute.
# A power of two; a row over it has its whole logits row recomputed instead.
REFINE_CAP = 4096


@triton.jit
def pack_lanes(dst_f, dst_i, base, vals, ids, take, n, LANES: tl.constexpr, GROUP: tl.constexpr = 1):
    """Each row's taken (vals, ids) [rows, n_in], in order, stored at dst + base [rows] + [0, n) and
    read back as [rows, LANES] (-inf / -1 past n). n: the rows' take counts, at most LANES. The
    lanes go through global scratch because other threads of the program read what one wrote
    (a barrier between): Triton has no other way to compact a tensor.

    GROUP > 1: the caller promises that within each group of GROUP consecutive lanes the taken ones
    come first (U's lanes with a threshold on the value: each slot's kept logits are stored largest
    first). A lane's position is then its group's start (a scan over the groups' counts, GROUP times
    narrower than a scan over the lanes, which was ~20% of select_filtered's executed instructions,
    v51's ncu) plus its place in the group: the same positions."""
    if GROUP > 1:
        R: tl.constexpr = take.shape[0]
        W: tl.constexpr = take.shape[1]
        cnt = tl.sum(tl.reshape(take.to(tl.int32), [R, W // GROUP, GROUP]), axis=2)
        start = tl.cumsum(cnt, axis=1) - cnt
        pos = tl.reshape(start[:, :, None] + tl.arange(0, GROUP)[None, None, :], [R, W])
        # (a broken promise misplaces lanes, but never outside this row's LANES: no other row's pack is touched)
        take = take & (pos < LANES)
    else:
        pos = tl.cumsum(take.to(tl.int32), axis=1) - 1
    tl.store(dst_f + base[:, None] + pos, vals, mask=take)
    tl.store(dst_i + base[:, None] + pos, ids, mask=take)
    tl.debug_barrier()
    c = tl.arange(0, LANES)
    cm = c[None, :] < n[:, None]
    return (tl.load(dst_f + base[:, None] + c[None, :], mask=cm, other=float("-inf")),
            tl.load(dst_i + base[:, None] + c[None, :], mask=cm, other=-1))


@triton.jit
def order_key(v):
    """int64 key in [0, 2**32) ordered like the fp32 values (-0 folded into +0; NaN-free input)."""
    b = (v + 0.0).to(tl.int32, bitcast=True).to(tl.int64)
    return tl.where(b >= 0, b + 2147483648, 2147483647 - (b & 2147483647))


@triton.jit
def order_skey(v):
    """order_key(v) - 2**31 as int32 (the same order in signed 32-bit compares), computed in 32 bits: the
    per-lane form of the key (an int64 key costs two or three instructions a compare or select)."""
    b = (v + 0.0).to(tl.int32, bitcast=True)
    return tl.where(b >= 0, b, -1 - (b & 2147483647))


@triton.jit
def lane_at_least(key):
    """The int32 threshold t of a row key (int64, any value) such that, for every real logit's lane,
    ``skey >= t`` exactly when ``order_key >= key``: keys below 0 or above 2**32 - 1 clamp to the ends (a real
    logit's key lies in [0, 2**32 - 1), 2**32 - 1 being a NaN's). ``order_key > key`` is ``lane_at_least(key + 1)``."""
    return (tl.minimum(tl.maximum(key, 0), 4294967295) - 2147483648).to(tl.int32)


@triton.jit
def tile_reaches(bnd, key):
    """Whether the fallback must recompute a tile for a row with need key ``key``: the tile's
    boundary ``bnd`` (the largest logit it did not keep) is a real logit at or above the key.
    One predicate for select_filtered's size estimate, materialize and resolve (fallback.py)."""
    return (bnd > float("-inf")) & (order_key(bnd) >= key)


@triton.jit
def kept_logits(cand_f, cand_i, base_f, base_i, rows, active, n_slots, n_local, stride_shard, stride_shard_i,
                stride_field, stride_ifield, stride_slot, BLOCK_U: tl.constexpr, KEEP: tl.constexpr,
                ONE_SHARD: tl.constexpr = False):
    """Each row's kept logits U, flattened slot-major to [rows, BLOCK_U] (-inf past n_slots and for
    inactive rows), with the pointers to their ids and to each lane's slot boundary, and the
    lanes' mask."""
    u = tl.arange(0, BLOCK_U)
    slot = u // KEEP
    j = u % KEEP
    lanes = active[:, None] & (slot < n_slots)[None, :]
    off_f = slot_offset(slot, n_local, stride_shard, stride_slot, ONE_SHARD)
    off_i = slot_offset(slot, n_local, stride_shard_i, stride_slot, ONE_SHARD)
    slot_at = cand_f + base_f + off_f[None, :] + rows[:, None]
    vals = tl.load(slot_at + ((5 + j) * stride_field)[None, :], mask=lanes, other=float("-inf"))
    ids_at = cand_i + base_i + (off_i + (1 + j) * stride_ifield)[None, :] + rows[:, None]
    return vals, ids_at, slot_at + (5 + KEEP) * stride_field, lanes


@triton.jit
def live_key_range(skeys, live):
    """Per row, the order keys (int64) of the smallest and the largest live element (skeys as in
    kth_largest_key), and how many elements are live."""
    kmin = tl.min(tl.where(live, skeys, 2147483647), axis=1).to(tl.int64) + 2147483648
    kmax = tl.max(tl.where(live, skeys, -2147483648), axis=1).to(tl.int64) + 2147483648
    return kmin, kmax, tl.sum(live.to(tl.int32), axis=1)


@triton.jit
def kth_largest_key(skeys, live, k):
    """Per row, the key (order_key) of the k-th largest live element (k >= 1, at most the live
    count; 0 for a row with nothing live). skeys: order_key - 2**31 as int32 [rows, n] (the same
    order in 32-bit compares, half the work of int64 ones in every step); live: [rows, n]; k: [rows].

    Bisection between the row's smallest and largest live keys, not over all 2**32 keys: the
    logits of one row span a few exponents, so ~20-24 steps instead of 32 (same answer)."""
    lo, hi, n_live = kth_bracket(skeys, live)
    lo, hi, _n = kth_bisect(skeys, live, k, lo, hi, n_live, n_live > 0, 0)
    return lo


@triton.jit
def kth_bracket(skeys, live):
    """The bisection's start for kth_largest_key: (lo, hi, live count) with count(keys >= lo) >= k
    for every k <= the live count, and count(keys >= hi) = 0."""
    kmin, kmax, n_live = live_key_range(skeys, live)
    return tl.where(n_live > 0, kmin, 0), tl.where(n_live > 0, kmax + 1, 1), n_live


@triton.jit
def kth_bisect(skeys, live, k, lo, hi, n_lo, go, STOP: tl.constexpr):
    """Bisection for the k-th largest key from a bracket lo < hi with count(keys >= lo) = n_lo >= k
    and count(keys >= hi) < k, for the rows ``go``: (lo, hi, n_lo) once hi = lo + 1 (lo is then the
    k-th largest key) or, with STOP > 0, as soon as n_lo <= STOP (the k-th largest is one of the
    n_lo elements at or above lo: few enough to rank pairwise, ``kth_key_small``). On a row's flat
    tail the count falls fast: with k = 50 of ~4,700 kept logits, under 128 lie above lo after 2-5
    steps where the exact answer takes ~24."""
    go = go & (hi - lo > 1) & (n_lo > STOP)
    while tl.max(go.to(tl.int32), axis=0) > 0:
        mid = (lo + hi) // 2  # in [0, 2**32): its signed twin fits int32
        n = tl.sum((live & (skeys >= (mid - 2147483648).to(tl.int32)[:, None])).to(tl.int32), axis=1)
        big = n >= k
        lo = tl.where(go & big, mid, lo)
        n_lo = tl.where(go & big, n, n_lo)
        hi = tl.where(go & ~big, mid, hi)
        go = go & (hi - lo > 1) & (n_lo > STOP)
    return lo, hi, n_lo


@triton.jit
def kth_key_small(sv_at, n_s, keys, live, k, SMALL: tl.constexpr, CHUNK: tl.constexpr):
    """kth_largest_key without a search, for rows whose elements at or above some key (at most
    SMALL of them, stored at sv_at [rows] + [0, n_s)) include the k largest: the largest key whose
    count of elements at or above it (pairwise, chunk by chunk) reaches k; 0 for a row with fewer
    than k. keys / live: the same elements as [rows, SMALL] (lane i = element i)."""
    skeys = (keys - 2147483648).to(tl.int32)
    at_or_above = tl.zeros(keys.shape, tl.int32)
    for c in tl.static_range(SMALL // CHUNK):
        j = c * CHUNK + tl.arange(0, CHUNK)
        vj = tl.load(sv_at[:, None] + j[None, :], mask=j[None, :] < n_s[:, None], other=float("-inf"))
        kj = order_skey(vj)
        ge = (vj > float("-inf"))[:, None, :] & (kj[:, None, :] >= skeys[:, :, None])
        at_or_above += tl.sum(ge.to(tl.int32), axis=2)
    return tl.max(tl.where(live & (at_or_above >= k[:, None]), keys, 0), axis=1)


@triton.jit
def nucleus_key(skeys, mass, live, target, floor):
    """Per row, the smallest key x > floor such that the mass of live elements with key > x is
    < target (skeys as in kth_largest_key; the result is an order_key; 2**32 - 1 when no x
    qualifies). floor: int64 [rows], a key known to fail the predicate: -1 when nothing is
    known; the fallback passes one below its proven lower bound, which also holds the answer
    there under fp32 rounding.

    The mass above x only changes at live keys, so the answer is floor + 1 or a live key: the
    bisection runs between max(floor, smallest live key - 1) and the largest live key (~20-24
    steps instead of 32); when even the whole live mass is < target the answer is floor + 1."""
    kmin, kmax, n_live = live_key_range(skeys, live)
    total = tl.sum(tl.where(live, mass, 0.0), axis=1)  # the mass above any key below kmin
    lo = tl.where(n_live > 0, tl.maximum(floor, kmin - 1), floor)  # predicate false (or below every key)
    hi = tl.where((n_live > 0) & (target > 0.0), kmax, 4294967295)  # true: nothing lies above kmax
    hi = tl.maximum(hi, lo + 1)  # every live key at or below floor: the answer is floor + 1
    early = (lo > floor) & (total < target)  # already true below the smallest live key
    while tl.max(hi - lo, axis=0) > 1:
        mid = (lo + hi) // 2  # in [0, 2**32 - 1)
        above = tl.sum(tl.where(live & (skeys > (mid - 2147483648).to(tl.int32)[:, None]), mass, 0.0), axis=1)
        ok = above < target
        go = hi - lo > 1  # rows already settled stay (a floor that passes the predicate would sink hi to it)
        hi = tl.where(ok & go, mid, hi)
        lo = tl.where(ok | ~go, lo, mid)
    return tl.where(early, floor + 1, hi)


@triton.jit
def nucleus_key_small(sv_at, n_s, keys, mass, live, msafe, inv_t, target, floor, SMALL: tl.constexpr,
                      CHUNK: tl.constexpr):
    """nucleus_key without a search, for rows whose elements are stored at sv_at [rows] + [0, n_s)
    (at most SMALL) and include S (``live``, a top part of them: every element above one of S is
    in S): each element's strictly-larger mass, summed pairwise chunk by chunk, and the smallest
    qualifying key (floor + 1 or a live key, as in nucleus_key). keys / mass / live: the stored
    elements as [rows, SMALL] (lane i = element i)."""
    skeys = (keys - 2147483648).to(tl.int32)  # 32-bit compares, as in the searches
    above = tl.zeros(mass.shape, tl.float32)
    for c in tl.static_range(SMALL // CHUNK):
        j = c * CHUNK + tl.arange(0, CHUNK)
        vj = tl.load(sv_at[:, None] + j[None, :], mask=j[None, :] < n_s[:, None], other=float("-inf"))
        lj = vj > float("-inf")
        kj = order_skey(vj)
        mj = tl.where(lj, tl.exp((vj - msafe[:, None]) * inv_t[:, None]), 0.0)
        gt = lj[:, None, :] & (kj[:, None, :] > skeys[:, :, None])
        above += tl.sum(tl.where(gt, mj[:, None, :], 0.0), axis=2)
    low = tl.sum(tl.where(live & (keys > (floor + 1)[:, None]), mass, 0.0), axis=1)  # mass above floor + 1
    ok = live & (keys > floor[:, None]) & (above < target[:, None])
    best = tl.min(tl.where(ok, keys, 4294967295), axis=1)
    return tl.where(low < target, floor + 1, best)


@triton.jit
def _strictly_above(a_v, a_before, a_group, b_v, b_before, b_group):
    """Combine of a scan over values sorted largest first, each element carrying (its value, 0, its mass): a run's
    state is (its last value v, the mass of its elements strictly above v, the mass of those equal to v). Where the
    later run b ends on the earlier run's last value, all of b equals it (sorted), so it only joins that group."""
    same = b_v == a_v
    return b_v, tl.where(same, a_before, a_before + a_group + b_before), tl.where(same, a_group + b_group, b_group)


@triton.jit
def kth_key_sorted(desc, k):
    """kth_largest_key over elements sorted largest first (``desc`` [rows, n], -inf for none): the key of the k-th
    (k >= 1) largest, which is the largest key whose count at or above it reaches k; 0 for a row with fewer than k."""
    pos = tl.arange(0, desc.shape[1])[None, :]
    v = tl.max(tl.where(pos == (k - 1)[:, None], desc, float("-inf")), axis=1)
    return tl.where(v > float("-inf"), order_key(v), 0)


@triton.jit
def nucleus_key_sorted(desc, key_s, msafe, inv_t, target, floor):
    """nucleus_key_small over elements sorted largest first (``desc`` [rows, n], -inf for none) whose part at or
    above key_s is S (a top part, hence a prefix): each element's strictly-larger mass in S from one scan over the
    sorted masses (_strictly_above: equal values share it) instead of pairwise sums, and the smallest qualifying key
    (floor + 1 or a key of S, as in nucleus_key). The same answer up to the order of the fp32 sums."""
    d_skeys = order_skey(desc)
    d_keys = d_skeys.to(tl.int64) + 2147483648
    d_in = (desc > float("-inf")) & (d_skeys >= lane_at_least(key_s)[:, None])
    mass = tl.where(d_in, tl.exp((desc - msafe[:, None]) * inv_t[:, None]), 0.0)
    _v, above, _g = tl.associative_scan((desc, tl.zeros(mass.shape, tl.float32), mass), 1, _strictly_above)
    low = tl.sum(tl.where(d_in & (d_keys > (floor + 1)[:, None]), mass, 0.0), axis=1)  # mass above floor + 1
    ok = d_in & (d_keys > floor[:, None]) & (above < target[:, None])
    best = tl.min(tl.where(ok, d_keys, 4294967295), axis=1)
    return tl.where(low < target, floor + 1, best)


@triton.jit
def draw_token(vals, ids, skeys, mass, live, key_t, noise_scale, seed, offset, FAST_LOG: tl.constexpr):
    """(token, mass of the kept set, the token's logit, its score) of each row: the argmax of
    logit + T * Gumbel (the contract's noise for each id) over the live elements with key >= key_t
    (the lowest id among equal scores; token 2**31 - 1 and score -inf for a row with none). skeys: the
    elements' order_skey (32-bit)."""
    kept = live & (skeys >= lane_at_least(key_t)[:, None])
    g = gumbel_from_bits(vocab_bits(seed[:, None], offset[:, None], ids, FAST_LOG), FAST_LOG)
    score = tl.where(kept, perturb(vals, noise_scale[:, None], g, FAST_LOG), float("-inf"))
    best = tl.max(score, axis=1)
    tok = tl.min(tl.where(kept & (score == best[:, None]), ids, 2147483647), axis=1)
    z_kept = tl.sum(tl.where(kept, mass, 0.0), axis=1)
    l_tok = tl.max(tl.where(kept & (ids == tok[:, None]), vals, float("-inf")), axis=1)
    return tok, z_kept, l_tok, best


@triton.jit
def winner_draw(cand_f, cand_i, base_f, base_i, rows, go, n_slots, n_local, stride_shard, stride_shard_i,
                stride_field, stride_slot, bnd, key_minp, best_u, tok_u, l_u,
                BLOCK_S: tl.constexpr, UNCHECKED: tl.constexpr = False, ONE_SHARD: tl.constexpr = False):
    """The token of min-p-only rows ``go`` whose threshold key ``key_minp`` lies at or below the
    boundary, from U and the tiles' stage-1 winners (module docstring, "Min-p from the winners"):
    (proven, token, its logit). best_u / tok_u / l_u: the best score among U's survivors, its id
    (the lowest among equal scores) and logit (``draw_token`` over them with key_t = key_minp; -inf /
    2**31 - 1 when U holds none). An open tile (its boundary reaches the threshold: it may hold
    survivors U lacks) contributes its winner when the winner's logit (field 1) is a survivor, and
    otherwise bounds every survivor it holds by the winner's score. A row is proven when its best
    score beats every such bound. bnd: the slots' boundaries [rows, BLOCK_S]. UNCHECKED (tests
    only: the power check) skips the bound."""
    sl = tl.arange(0, BLOCK_S)
    ms = go[:, None] & (sl < n_slots)[None, :]
    off_f = slot_offset(sl, n_local, stride_shard, stride_slot, ONE_SHARD)
    off_i = slot_offset(sl, n_local, stride_shard_i, stride_slot, ONE_SHARD)
    at_f = cand_f + base_f + off_f[None, :] + rows[:, None]
    s_w = tl.load(at_f, mask=ms, other=float("-inf"))  # field 0: the tile's best score
    l_w = tl.load(at_f + stride_field, mask=ms, other=float("-inf"))  # field 1: its logit
    id_w = tl.load(cand_i + base_i + off_i[None, :] + rows[:, None], mask=ms, other=-1)
    open_t = ms & tile_reaches(bnd, key_minp[:, None])
    surv = open_t & (l_w > float("-inf")) & (order_key(l_w) >= key_minp[:, None])
    s_surv = tl.where(surv, s_w, float("-inf"))
    best = tl.maximum(best_u, tl.max(s_surv, axis=1))
    # lowest id among equal best scores, as every path breaks ties
    tok = tl.minimum(tl.where(best_u == best, tok_u, 2147483647),
                     tl.min(tl.where(surv & (s_surv == best[:, None]), id_w, 2147483647), axis=1))
    l_tok = tl.maximum(tl.where(tok_u == tok, l_u, float("-inf")),
                       tl.max(tl.where(surv & (id_w == tok[:, None]), l_w, float("-inf")), axis=1))
    if UNCHECKED:
        bound = tl.full(best.shape, float("-inf"), tl.float32)
    else:
        bound = tl.max(tl.where(open_t & ~surv, s_w, float("-inf")), axis=1)
    return go & (best > float("-inf")) & (bound < best), tok, l_tok


@triton.jit
def _top_p_and_draw(vals, ids, skeys, mass, live, in_s, key_s, use_p, any_p, target, floor_key, noise_scale,
                    seed, offset, FAST_LOG: tl.constexpr):
    """finish_rows' top-p (a search over S's elements in place) and draw: (key_t, token, kept mass, its
    logit, its score)."""
    if any_p:
        key_p = nucleus_key(skeys, mass, in_s, target, floor_key)
    else:
        key_p = tl.zeros(key_s.shape, tl.int64)
    key_t = tl.where(use_p, tl.maximum(key_s, key_p), key_s)
    # the token: argmax over the kept ids of logit + T * Gumbel, with the contract's noise
    tok, z_kept, l_tok, best = draw_token(vals, ids, skeys, mass, live, key_t, noise_scale, seed, offset, FAST_LOG)
    return key_t, tok, z_kept, l_tok, best


@triton.jit
def _search_rows(vals, ids, skeys, mass, live, kk, lo, hi, n_lo, ask_k, any_k, use_k, k_known, key_minp, z_full,
                 use_p, any_p, top_p, floor_key, noise_scale, seed, offset, FAST_LOG: tl.constexpr):
    """finish_rows over the elements in place: the top-k bisection to the end (from where it
    stopped), S, top-p and the draw: (max(min-p threshold, k-th largest), key_s, key_t, token,
    kept mass, its logit, its score)."""
    if any_k:
        lo, hi, n_lo = kth_bisect(skeys, live, kk, lo, hi, n_lo, ask_k, 0)
    key_km = tl.maximum(key_minp, tl.where(use_k, lo, 0))
    key_s = tl.where(use_k & k_known, key_km, key_minp)
    in_s = live & (skeys >= lane_at_least(key_s)[:, None])
    z_s = tl.where(key_s > 0, tl.sum(tl.where(in_s, mass, 0.0), axis=1), z_full)
    key_t, tok, z_kept, l_tok, best = _top_p_and_draw(vals, ids, skeys, mass, live, in_s, key_s, use_p, any_p,
                                                      top_p * z_s, floor_key, noise_scale, seed, offset, FAST_LOG)
    return key_km, key_s, key_t, tok, z_kept, l_tok, best


@triton.jit
def _packed_rows(vals, ids, skeys, live, pk, n_p, kk, any_k, any_p, use_k, use_p, k_known, key_minp, z_full, top_p,
                 floor_key, msafe, inv_t, noise_scale, seed, offset, lanes_f, lanes_i, lanes_base,
                 LANES: tl.constexpr, CHUNK: tl.constexpr, PAIRWISE: tl.constexpr, FAST_LOG: tl.constexpr,
                 GROUP: tl.constexpr = 1, SORTED: tl.constexpr = True):
    """finish_rows over P (the elements at or above pk, n_p [rows] of them, at most LANES) packed into
    LANES lanes: the k-th largest and top-p over P (PAIRWISE; a caller without it has no row asking
    for either), S and the draw: the same outputs as _search_rows. SORTED: the k-th largest and top-p from P
    sorted once (kth_key_sorted, nucleus_key_sorted; v72), else by pairwise counts and sums (kth_key_small,
    nucleus_key_small)."""
    sv, si = pack_lanes(lanes_f, lanes_i, lanes_base, vals, ids, live & (skeys >= lane_at_least(pk)[:, None]), n_p,
                        LANES, GROUP)
    s_live = sv > float("-inf")
    s_skeys = order_skey(sv)
    s_keys = s_skeys.to(tl.int64) + 2147483648
    s_mass = tl.where(s_live, tl.exp((sv - msafe[:, None]) * inv_t[:, None]), 0.0)
    key_km = key_minp  # max(min-p threshold, k-th largest): P has the k largest or the max is the former
    key_p = tl.zeros(key_minp.shape, tl.int64)
    if PAIRWISE:
        if SORTED:
            desc = sv
            if any_k | any_p:  # (a program of min-p rows sorts nothing, as it ranks nothing pairwise)
                desc = tl.sort(sv, 1, descending=True)
        if any_k:
            if SORTED:
                key_km = tl.maximum(key_minp, kth_key_sorted(desc, kk))
            else:
                key_km = tl.maximum(key_minp, kth_key_small(lanes_f + lanes_base, n_p, s_keys, s_live, kk, LANES,
                                                            CHUNK))
    key_s = tl.where(use_k & k_known, key_km, key_minp)
    s_in = s_live & (s_skeys >= lane_at_least(key_s)[:, None])
    z_s = tl.where(key_s > 0, tl.sum(tl.where(s_in, s_mass, 0.0), axis=1), z_full)
    if PAIRWISE:
        if any_p:
            if SORTED:
                key_p = nucleus_key_sorted(desc, key_s, msafe, inv_t, top_p * z_s, floor_key)
            else:
                key_p = nucleus_key_small(lanes_f + lanes_base, n_p, s_keys, s_mass, s_in, msafe, inv_t, top_p * z_s,
                                          floor_key, LANES, CHUNK)
    key_t = tl.where(use_p, tl.maximum(key_s, key_p), key_s)
    tok, z_kept, l_tok, best = draw_token(sv, si, s_skeys, s_mass, s_live, key_t, noise_scale, seed, offset, FAST_LOG)
    return key_km, key_s, key_t, tok, z_kept, l_tok, best


@triton.jit
def ids_where(ids, mask, IDS_AT: tl.constexpr):
    """The elements' ids where ``mask`` holds (-1 elsewhere): ``ids`` itself, or with IDS_AT the ids loaded through
    ``ids`` (a tensor of pointers) under the mask, so a caller loads only the lanes it uses (finish_rows' packed
    branches: P's few ids, not all of U's)."""
    if IDS_AT:
        out = tl.load(ids, mask=mask, other=-1)
    else:
        out = ids
    return out


@triton.jit
def merge_verdict(tokens_ptr, rows, mask_r, WAIT: tl.constexpr = False):
    """The rows the merge left without a valid token (its -1 in ``tokens``: NaN / +inf logits, a bad temperature, no
    finite logit, a tensor-parallel mismatch). WAIT: read after waiting for the merge's end (a programmatic dependent
    beside it, ``utils.pdl_wait_point``)."""
    pdl_wait_point(WAIT)
    return tl.load(tokens_ptr + rows, mask=mask_r, other=-1) < 0


@triton.jit
def mark_bad_rows(tokens_ptr, logprob_ptr, rows, bad, LOGPROBS: tl.constexpr):
    """-1 tokens (and NaN logprobs) for the rows ``bad``: filter values a tensor may hold but the API forbids (no
    sync to raise)."""
    tl.store(tokens_ptr + rows, -1, mask=bad)
    if LOGPROBS:
        tl.store(logprob_ptr + rows, float("nan"), mask=bad)


@triton.jit
def finish_rows(vals, ids, rows, mask_r, active, filtered, row_bad, bkey, complete, m, msafe, z_full, log_z_raw,
                inv_t, noise_scale, temp, top_k, top_p, min_p, use_k, use_p, use_minp, floor_key, vocab_size,
                seed_ptr, seed_val, offset_ptr, offset_val, tokens_ptr, logprob_ptr, top_ids_ptr, top_lp_ptr,
                small_f, small_i, small_base,
                SEED_PER_ROW: tl.constexpr, OFFSET_PER_ROW: tl.constexpr, TOP_N: tl.constexpr,
                TOP_N_POW2: tl.constexpr, MODE: tl.constexpr, LOGPROBS: tl.constexpr, FAST_LOG: tl.constexpr,
                SMALL: tl.constexpr = 0, SMALL_CHUNK: tl.constexpr = 32, WIDE: tl.constexpr = 0,
                GROUP: tl.constexpr = 1, SORTED: tl.constexpr = True, IDS_AT: tl.constexpr = False,
                DEAD_LATE: tl.constexpr = False, PDL_LATE: tl.constexpr = False):
    """Thresholds, proof, token, logprobs and top-N of each row from its kept logits ``vals`` /
    ``ids`` [rows, n] (-inf = empty): all of U, or only its elements above the boundary (the
    same outcome: see the module docstring). The fallback calls it too, on a row's logits at or
    above a proven lower bound (``fallback.py``: bkey and floor_key one below that bound).

    Writes the proven rows' tokens, logprobs and top-N; returns (need, lower, used): the rows the
    kept logits could not finish, for each a key at or below every threshold it needs (its
    min-p / top-k / top-p thresholds and its N-th largest logit; 0 = no bound known), and where
    the k-th largest, top-p and the draw ran: 1 over P packed into SMALL lanes, 2 over P packed into
    WIDE lanes (a program with min-p alone), 0 over the elements in place (module docstring;
    small_f / small_i at small_base [rows], int64 element offsets, max(SMALL, WIDE) lanes a row;
    SMALL = 0: never), then (pending, topn_ok, key_minp): the rows whose token U could not prove,
    whether each row's top-N is proven, and each row's min-p threshold key (0: no min-p), then
    (token, its logit, its score) of the draw over the elements at or above the row's threshold,
    for select_filtered's winner proof. vocab_size: the ids a top-N list may name (fill_free_ids). GROUP:
    vals is made of groups of GROUP lanes each sorted largest first (U as kept_logits loads it: KEEP), which
    lets the packs scan groups instead of lanes (pack_lanes); 1 for any other order. IDS_AT: ``ids`` are pointers
    to the ids (of the lanes vals holds), loaded only where a branch uses them (``ids_where``): a packed branch loads
    P's ids, not all of U's (v52's profile: the eager load of U's ids was 5-9% of select_filtered's stall samples).
    DEAD_LATE (select_filtered beside the merge, ``launch_select_filtered(late=True)``): the caller took no row for
    dead (``filtered`` / ``row_bad`` without the merge's verdict); once the thresholds are found, and before the
    first store, it is read from ``tokens_ptr`` (the merge's -1), with PDL_LATE after waiting for the merge's end
    (griddepcontrol.wait), and the rows the caller found bad and the merge did not get their -1 / NaN here.
    """
    BLOCK_R: tl.constexpr = vals.shape[0]
    live = vals > float("-inf")
    # The keys per lane in 32 bits (order_skey; compares against a row's int64 key through lane_at_least); the
    # int64 keys only where a lane's key is returned (the top-N).
    skeys = order_skey(vals)
    keys = skeys.to(tl.int64) + 2147483648
    mass = tl.where(live, tl.exp((vals - msafe[:, None]) * inv_t[:, None]), 0.0)  # exp((l - max) / T)

    # ---- thresholds (vLLM's order), and whether U proves them ----
    # Key 0 lies below every real logit's key: it stands for "no min-p / top-k threshold".
    # Every logit above B is in U, so U's k-th largest is the true one iff U holds at
    # least k logits above B; otherwise the true k-th largest is <= B and only a min-p
    # threshold above B can still fix tau_S.
    n_live = tl.sum(live.to(tl.int32), axis=1)
    n_above = tl.sum((live & (skeys >= lane_at_least(bkey + 1)[:, None])).to(tl.int32), axis=1)
    key_minp = tl.where(use_minp, order_key(m + temp * tl.log(tl.where(use_minp, min_p, 1.0))), 0)
    k_known = ~use_k | (top_k <= n_above) | complete
    kk = tl.maximum(tl.minimum(top_k, n_live), 1)  # the rank searched (all of a row when it has fewer)
    ask_k = use_k & active
    # The top-k search only where a row of the program asks for it (one row per program on a GPU:
    # a min-p row runs none). With SMALL it stops once at most SMALL elements lie at or above its
    # lower end lo (a few steps on a row's tail): the k-th largest is then ranked among those.
    any_k = tl.max(ask_k.to(tl.int32), axis=0) > 0
    lo = tl.zeros([BLOCK_R], tl.int64)
    hi = lo + 1
    n_lo = n_live
    if any_k:
        lo, hi, n_lo = kth_bracket(skeys, live)
        lo, hi, n_lo = kth_bisect(skeys, live, kk, lo, hi, n_lo, ask_k, SMALL)
    any_p = tl.max((use_p & active).to(tl.int32), axis=0) > 0
    s_known = k_known | (key_minp > bkey)
    seed = load_row_param(seed_ptr, seed_val, rows, mask_r, tl.int64, SEED_PER_ROW)
    offset = load_row_param(offset_ptr, offset_val, rows, mask_r, tl.int64, OFFSET_PER_ROW)
    # P: the elements at or above max(lo, the min-p threshold) (top-k rows) or the min-p threshold
    # (others). P holds S (the survivors of min-p and top-k) whenever S matters (module docstring).
    # When P is small in every row of the program, it is packed into SMALL lanes: the k-th largest
    # and top-p are then pairwise (no search) and the draw's noise runs over SMALL ids, not all of vals.
    pk = tl.maximum(tl.where(use_k, lo, 0), key_minp)
    in_p = live & (skeys >= lane_at_least(pk)[:, None])
    n_p = tl.sum(in_p.to(tl.int32), axis=1)
    # used: 0 where the search over vals served, 1 where P packed into SMALL lanes, 2 into WIDE lanes
    used = tl.zeros([BLOCK_R], tl.int32)
    if SMALL > 0:  # (constexpr tests first: a packed branch does not compile with 0 lanes)
        if tl.max(n_p, axis=0) <= SMALL:
            key_km, key_s, key_t, tok, z_kept, l_tok, best = _packed_rows(
                vals, ids_where(ids, in_p, IDS_AT), skeys, live, pk, n_p, kk, any_k, any_p, use_k, use_p, k_known,
                key_minp, z_full, top_p, floor_key, msafe, inv_t, noise_scale, seed, offset, small_f, small_i,
                small_base, SMALL, SMALL_CHUNK, True, FAST_LOG, GROUP, SORTED)
            used = tl.full([BLOCK_R], 1, tl.int32)
        elif WIDE > SMALL:
            # A program whose rows ask for neither top-k nor top-p (min-p alone) needs no pairwise work
            # over P, only its mass and the draw: P packs into WIDE lanes (a min-p row's survivors are
            # often more than SMALL) and the noise runs over them instead of over all of vals.
            if (tl.max(n_p, axis=0) <= WIDE) & ~any_k & ~any_p:
                key_km, key_s, key_t, tok, z_kept, l_tok, best = _packed_rows(
                    vals, ids_where(ids, in_p, IDS_AT), skeys, live, pk, n_p, kk, any_k, any_p, use_k, use_p,
                    k_known, key_minp, z_full, top_p, floor_key, msafe, inv_t, noise_scale, seed, offset, small_f,
                    small_i, small_base, WIDE, SMALL_CHUNK, False, FAST_LOG, GROUP, SORTED)
                used = tl.full([BLOCK_R], 2, tl.int32)
            else:
                key_km, key_s, key_t, tok, z_kept, l_tok, best = _search_rows(
                    vals, ids_where(ids, live, IDS_AT), skeys, mass, live, kk, lo, hi, n_lo, ask_k, any_k, use_k,
                    k_known, key_minp, z_full, use_p, any_p, top_p, floor_key, noise_scale, seed, offset, FAST_LOG)
        else:
            key_km, key_s, key_t, tok, z_kept, l_tok, best = _search_rows(
                vals, ids_where(ids, live, IDS_AT), skeys, mass, live, kk, lo, hi, n_lo, ask_k, any_k, use_k, k_known,
                key_minp, z_full, use_p, any_p, top_p, floor_key, noise_scale, seed, offset, FAST_LOG)
    else:
        key_km, key_s, key_t, tok, z_kept, l_tok, best = _search_rows(
            vals, ids_where(ids, live, IDS_AT), skeys, mass, live, kk, lo, hi, n_lo, ask_k, any_k, use_k, k_known,
            key_minp, z_full, use_p, any_p, top_p, floor_key, noise_scale, seed, offset, FAST_LOG)
    if DEAD_LATE:
        # Everything above read only stage 1's candidates; from here on the merge's writes matter: its verdict on
        # each row (-1: no valid token), and its tokens / logprobs, which the stores below overwrite.
        dead = merge_verdict(tokens_ptr, rows, mask_r, PDL_LATE)
        # (row_bad: the caller's bad filter values alone)
        mark_bad_rows(tokens_ptr, logprob_ptr, rows, row_bad & ~dead & mask_r, LOGPROBS)
        filtered = filtered & ~dead
        row_bad = row_bad | dead
    # Top-p renormalises over S: its sum comes from U only if S lies above B.
    proven = complete | (s_known & (key_t > bkey) & (~use_p | (key_s == 0) | (key_s > bkey)))
    done = filtered & proven & mask_r
    tl.store(tokens_ptr + rows, tok.to(tl.int64), mask=done)
    pending = filtered & ~proven & mask_r
    tl.store(tokens_ptr + rows, -1, mask=pending)  # the fallback writes it
    if LOGPROBS:
        if MODE == 1:
            lp = (l_tok - msafe) - log_z_raw
        elif MODE == 2:
            lp = (l_tok - msafe) * inv_t - tl.log(z_kept)
        else:
            lp = (l_tok - msafe) * inv_t - tl.log(z_full)
        tl.store(logprob_ptr + rows, lp, mask=done)
        tl.store(logprob_ptr + rows, float("nan"), mask=pending)

    # ---- top-N logprobs (every row) ----
    topn_ok = mask_r
    topn_key = tl.zeros([BLOCK_R], tl.int64)  # the N-th largest logit's key (0: unknown)
    if TOP_N > 0:
        n = tl.arange(0, TOP_N_POW2)
        out_ids = tl.full([BLOCK_R, TOP_N_POW2], -1, tl.int64)
        out_lp = tl.full([BLOCK_R, TOP_N_POW2], float("-inf"), tl.float32)
        log_z, scale = top_n_normaliser(log_z_raw, tl.log(z_full), tl.log(z_kept), filtered, inv_t, MODE)
        alive = live
        ids_live = ids_where(ids, live, IDS_AT)
        last_key = tl.full([BLOCK_R], 4294967296, tl.int64)
        found_all = mask_r
        for t in tl.static_range(TOP_N):
            kmax = tl.max(tl.where(alive, keys, -1), axis=1)
            pick = alive & (keys == kmax[:, None])
            idsel = tl.min(tl.where(pick, ids_live, 2147483647), axis=1)
            chosen = pick & (ids_live == idsel[:, None])
            vsel = tl.max(tl.where(chosen, vals, float("-inf")), axis=1)
            have = kmax >= 0
            out_ids, out_lp = place_pick(out_ids, out_lp, n, t, have, idsel, vsel, msafe, scale, log_z, filtered,
                                         kmax, key_t, MODE)
            last_key = tl.where(have, kmax, last_key)
            found_all = found_all & have
            alive = alive & ~chosen
        out_ids = fill_free_ids(out_ids, n, vocab_size, TOP_N)  # (rows written below hold all their finite logits)
        # The N-th largest of U is the true one if U holds N logits and the N-th lies above B.
        topn_ok = (found_all & (last_key > bkey)) | complete | row_bad
        topn_key = tl.where(found_all, last_key, 0)
        out_ids = tl.where(row_bad[:, None], -1, out_ids)
        out_lp = tl.where(row_bad[:, None], float("nan"), out_lp)
        wr = (topn_ok & mask_r)[:, None] & (n < TOP_N)[None, :]
        tl.store(top_ids_ptr + rows[:, None] * TOP_N + n[None, :], out_ids, mask=wr)
        tl.store(top_lp_ptr + rows[:, None] * TOP_N + n[None, :], out_lp, mask=wr)
    # ---- a lower bound on what the fallback must see, for the rows it finishes ----
    # Adding the logits U lacks can only raise a k-th largest, the min-p threshold (fixed by
    # the row max) and an N-th largest, so U's values bound the true ones from below, if U
    # holds k (N) logits at all. A top-p threshold is bounded by U's only when its
    # renormaliser is exact, i.e. when nothing restricts S (z_s = z_full): U's mass above a
    # key then under-counts the true one, so U's nucleus key is at or below the true one.
    # With min-p or top-k before top-p, the bound is S's own.
    k_ok = (top_k <= n_live) | complete
    lower_s = tl.where(use_k & k_ok, key_km, key_minp)
    lower = tl.where(use_p & ~(use_k | use_minp), key_t, lower_s)
    need = pending | (active & ~topn_ok)
    lower = tl.where(pending, lower, 4294967296)
    if TOP_N > 0:
        # The fallback rewrites the top-N of every row it finishes (in "processed" mode they
        # depend on the threshold it finds), so it needs the N-th largest too.
        lower = tl.where(need, tl.minimum(lower, topn_key), lower)
    return need, lower, used, pending, topn_ok, key_minp, tok, l_tok, best


@triton.jit
def row_slot_stats(cand_f, base_f, rows, active, n_slots, n_local, stride_shard, stride_field, stride_slot, inv_t,
                   BLOCK_S: tl.constexpr, KEEP: tl.constexpr, MODE: tl.constexpr, ONE_SHARD: tl.constexpr = False):
    """Per row, from the per-slot fields of the extended layout: (bnd [rows, BLOCK_S] each slot's
    boundary (-inf past n_slots), its max B, the row max m, msafe (0 for an empty row),
    z_full = sum exp((l - m) / T), and log sum exp(l - m) (MODE 1, "raw", only; else 0))."""
    sl = tl.arange(0, BLOCK_S)
    ms = active[:, None] & (sl < n_slots)[None, :]
    slot_off = slot_offset(sl, n_local, stride_shard, stride_slot, ONE_SHARD)
    slot_f = cand_f + base_f + slot_off[None, :] + rows[:, None]
    bnd = tl.load(slot_f + (5 + KEEP) * stride_field, mask=ms, other=float("-inf"))
    tmax = tl.load(slot_f + 2 * stride_field, mask=ms, other=float("-inf"))
    tsum = tl.load(slot_f + 3 * stride_field, mask=ms, other=0.0)
    m = tl.max(tmax, axis=1)
    msafe = tl.where(m == float("-inf"), 0.0, m)
    z_full = tl.sum(tl.where(tmax > float("-inf"), tsum * tl.exp((tmax - msafe[:, None]) * inv_t[:, None]), 0.0),
                    axis=1)
    log_z_raw = tl.zeros(m.shape, tl.float32)  # only MODE 1 ("raw") reads it
    if MODE == 1:
        rsum = tl.load(slot_f + 4 * stride_field, mask=ms, other=0.0)
        log_z_raw = tl.log(tl.sum(tl.where(tmax > float("-inf"), rsum * tl.exp(tmax - msafe[:, None]), 0.0), axis=1))
    return bnd, tl.max(bnd, axis=1), m, msafe, z_full, log_z_raw


@triton.jit
def select_filtered_kernel(
    cand_f, cand_i, base_f, base_i, parity_ptr, parity_stride_f, parity_stride_i,
    B, n_slots, n_local, stride_shard, stride_shard_i, stride_field, stride_ifield, stride_slot,
    seed_ptr, seed_val, offset_ptr, offset_val, temp_ptr, temp_val,
    topk_ptr, topk_val, topp_ptr, topp_val, minp_ptr, minp_val,
    vocab_size,
    tokens_ptr, logprob_ptr, top_ids_ptr, top_lp_ptr, fallback_ptr, need_key_ptr, scratch_f, scratch_i, searched_ptr,
    small_f, small_i, drew_ptr, won_ptr, lse_ptr,
    SEED_PER_ROW: tl.constexpr, OFFSET_PER_ROW: tl.constexpr, TEMP_PER_ROW: tl.constexpr,
    TOPK_PER_ROW: tl.constexpr, TOPP_PER_ROW: tl.constexpr, MINP_PER_ROW: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_U: tl.constexpr, KEEP: tl.constexpr, TOP_N: tl.constexpr,
    TOP_N_POW2: tl.constexpr, MODE: tl.constexpr, LOGPROBS: tl.constexpr, FAST_LOG: tl.constexpr,
    DEVICE_PARITY: tl.constexpr, PACK: tl.constexpr = False, CAP: tl.constexpr = 1,
    SEARCHED: tl.constexpr = False, TILE_V: tl.constexpr = 128, REFINE_CAP: tl.constexpr = 4096,
    SMALL_CAP: tl.constexpr = 0, DREW: tl.constexpr = False, SMALL_CHUNK: tl.constexpr = 32,
    WIDE_CAP: tl.constexpr = 0, SCRATCH_LANES: tl.constexpr = 1,
    WINNERS: tl.constexpr = False, WINNERS_UNCHECKED: tl.constexpr = False, WON: tl.constexpr = False,
    MERGE: tl.constexpr = False, RAW: tl.constexpr = False, ONE_SHARD: tl.constexpr = False,
    SORTED: tl.constexpr = True, PDL_WAIT: tl.constexpr = False, TRIGGER: tl.constexpr = False,
    DEAD_LATE: tl.constexpr = False, PDL_LATE: tl.constexpr = False,
):
    # A programmatic dependent of stage 1 (configs.pdl_stage2) waits for it here (beside the merge, PDL_LATE: later,
    # before the first store); the fallback's materialize, a dependent of this launch (configs.pdl_fallback), may
    # launch once every program of this one has started.
    pdl_prologue(PDL_WAIT, TRIGGER)
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    mask_r = rows < B
    base_f, base_i = parity_offsets(base_f, base_i, parity_ptr, parity_stride_f, parity_stride_i, DEVICE_PARITY)
    temp = load_row_param(temp_ptr, temp_val, rows, mask_r, tl.float32, TEMP_PER_ROW)
    inv_t, noise_scale, greedy, _bad = row_temperature(temp)
    BLOCK_S: tl.constexpr = BLOCK_U // KEEP  # the per-slot fields on their own slot axis, a quarter of U's width
    if MERGE:
        # Stage 2's merge folded in (one launch less a call): every row's unfiltered token, logprob and
        # logsumexp, as merge_candidates writes them, from its slots in one chunk, and the per-slot
        # statistics the filtered rows reuse below.
        bnd, bound, m, msafe, z_full, log_z_raw = row_slot_stats(
            cand_f, base_f, rows, mask_r, n_slots, n_local, stride_shard, stride_field, stride_slot, inv_t,
            BLOCK_S, KEEP, MODE, ONE_SHARD)
        sl = tl.arange(0, BLOCK_S)
        slot_off = slot_offset(sl, n_local, stride_shard, stride_slot, ONE_SHARD)
        score = tl.load(cand_f + base_f + slot_off[None, :] + rows[:, None],
                        mask=mask_r[:, None] & (sl < n_slots)[None, :], other=float("-inf"))
        best, best_slot, poisoned = slot_winner(score, 1)
        dead = (poisoned > 0) | (best == float("-inf"))
        store_merged(cand_f, cand_i, base_f, base_i, tokens_ptr, logprob_ptr, lse_ptr, rows, mask_r, best_slot,
                     dead, poisoned > 0, m, z_full, log_z_raw, inv_t, n_local, stride_shard, stride_shard_i,
                     stride_field, stride_slot, LOGPROBS, RAW)
        # The rows finished below overwrite these stores, maybe from other threads: order them.
        tl.debug_barrier()
    elif DEAD_LATE:
        # Beside the merge (launch_select_filtered(late=True)): it may still run, so its verdict is read only where
        # it matters, after the thresholds (finish_rows, or the branch without active rows below); until then every
        # row counts as alive (a dead row's work is thrown away: its NaN / inf keys cannot stall a bounded search).
        dead = tl.zeros([BLOCK_R], tl.int1)
    else:
        # Stage 2 (merge_candidates) ran first and wrote -1 for rows without a valid token
        # (NaN / +inf logits, bad temperature, no finite logit, a tensor-parallel mismatch).
        dead = merge_verdict(tokens_ptr, rows, mask_r)
    top_k = load_row_param(topk_ptr, topk_val, rows, mask_r, tl.int32, TOPK_PER_ROW)
    top_p = load_row_param(topp_ptr, topp_val, rows, mask_r, tl.float32, TOPP_PER_ROW)
    min_p = load_row_param(minp_ptr, minp_val, rows, mask_r, tl.float32, MINP_PER_ROW)
    # Values a tensor may hold but the API forbids: the row returns -1 (no sync to raise).
    # Greedy rows ignore their filters, bad values included, as they do when a scalar
    # temperature of 0 skips this kernel altogether (same token either way).
    bad_filter = ((top_k < 0) | ~((top_p > 0.0) & (top_p <= 1.0)) | ~((min_p >= 0.0) & (min_p <= 1.0))) & ~greedy
    use_k, use_p = filter_switches(top_k, top_p, vocab_size)
    use_minp = min_p > 0.0
    filtered = ~greedy & (use_k | use_p | use_minp) & ~bad_filter & ~dead
    row_bad = dead | bad_filter
    if not DEAD_LATE:  # (else once the merge's verdict is known)
        mark_bad_rows(tokens_ptr, logprob_ptr, rows, bad_filter & ~dead & mask_r, LOGPROBS)
    if TOP_N > 0:
        active = mask_r
    else:
        active = filtered & mask_r
    if tl.max(active.to(tl.int32), axis=0) > 0:
        # ---- each row's kept logits U, flattened [rows, slots * KEEP], ids, boundary, stats ----
        vals, ids_at, _bnd_at, m2 = kept_logits(cand_f, cand_i, base_f, base_i, rows, active, n_slots, n_local,
                                                stride_shard, stride_shard_i, stride_field, stride_ifield,
                                                stride_slot, BLOCK_U, KEEP, ONE_SHARD)
        if not MERGE:  # (the folded merge computed them for every row)
            # Per-slot fields (boundary, tile max and sums).
            bnd, bound, m, msafe, z_full, log_z_raw = row_slot_stats(
                cand_f, base_f, rows, active, n_slots, n_local, stride_shard, stride_field, stride_slot, inv_t,
                BLOCK_S, KEEP, MODE, ONE_SHARD)
        bkey = order_key(bound)
        complete = bound == float("-inf")  # every logit of the row is in U
        # Only the kept logits above the boundary B can decide a proven row (module docstring):
        # when each row has at most CAP of them, they are packed in order into this row's
        # scratch and the threshold searches run over CAP elements instead of all of U.
        above = (vals > float("-inf")) & (order_key(vals) > bkey[:, None]) & active[:, None]
        n_up = tl.sum(above.to(tl.int32), axis=1)
        small = False
        if PACK:
            small = tl.max(n_up, axis=0) <= CAP
        if SEARCHED:  # instrumentation: how many kept logits each row's search ran over (-1: all of U)
            tl.store(searched_ptr + rows, tl.where(small, n_up, -1), mask=mask_r)
        no_floor = tl.full([BLOCK_R], -1, tl.int64)
        if small:
            # (only the packed ids are loaded)
            up_vals, up_ids = pack_lanes(scratch_f, scratch_i, rows.to(tl.int64) * CAP, vals,
                                         tl.load(ids_at, mask=above, other=-1), above, n_up, CAP)
            need, lower, drew_small, pending, topn_ok, key_minp, tok_u, l_u, best_u = finish_rows(
                up_vals, up_ids,
                rows, mask_r, active, filtered, row_bad, bkey, complete, m, msafe, z_full, log_z_raw,
                inv_t, noise_scale, temp, top_k, top_p, min_p, use_k, use_p, use_minp, no_floor, vocab_size,
                seed_ptr, seed_val, offset_ptr, offset_val, tokens_ptr, logprob_ptr, top_ids_ptr, top_lp_ptr,
                small_f, small_i, rows.to(tl.int64) * SCRATCH_LANES,
                SEED_PER_ROW, OFFSET_PER_ROW, TOP_N, TOP_N_POW2, MODE, LOGPROBS, FAST_LOG, SMALL_CAP,
                SMALL_CHUNK, WIDE_CAP, 1, SORTED, False, DEAD_LATE, PDL_LATE)
        else:
            need, lower, drew_small, pending, topn_ok, key_minp, tok_u, l_u, best_u = finish_rows(
                vals, ids_at,
                rows, mask_r, active, filtered, row_bad, bkey, complete, m, msafe, z_full, log_z_raw,
                inv_t, noise_scale, temp, top_k, top_p, min_p, use_k, use_p, use_minp, no_floor, vocab_size,
                seed_ptr, seed_val, offset_ptr, offset_val, tokens_ptr, logprob_ptr, top_ids_ptr, top_lp_ptr,
                small_f, small_i, rows.to(tl.int64) * SCRATCH_LANES,
                SEED_PER_ROW, OFFSET_PER_ROW, TOP_N, TOP_N_POW2, MODE, LOGPROBS, FAST_LOG, SMALL_CAP,
                SMALL_CHUNK, WIDE_CAP, KEEP, SORTED, True,  # (U: KEEP lanes a slot, largest first; ids where used)
                DEAD_LATE, PDL_LATE)
        if DREW:  # instrumentation: 1 / 2 where top-p and the draw ran over P packed in SMALL / WIDE lanes
            tl.store(drew_ptr + rows, drew_small, mask=mask_r)
        # the winners carry no survivor mass: "processed" values are never asked of them (the launcher)
        tl.static_assert(not (WINNERS and MODE == 2 and (LOGPROBS or TOP_N > 0)))
        if WINNERS:
            # Min-p-only rows U could not prove: their threshold is known (the row max fixes it),
            # so the tiles' stage-1 winners may finish them (module docstring).
            go = pending & use_minp & ~use_k & ~use_p
            if tl.max(go.to(tl.int32), axis=0) > 0:
                # finish_rows drew a go row's token over its kept logits at or above the min-p
                # threshold: over U's survivors, which the proof takes as they are, unless only U's
                # part above the boundary was searched (PACK): then the draw runs again over all of U.
                if small:
                    seed = load_row_param(seed_ptr, seed_val, rows, mask_r, tl.int64, SEED_PER_ROW)
                    offset = load_row_param(offset_ptr, offset_val, rows, mask_r, tl.int64, OFFSET_PER_ROW)
                    tok_u, _z, l_u, best_u = draw_token(vals, tl.load(ids_at, mask=m2, other=-1), order_skey(vals),
                                                        tl.zeros(vals.shape, tl.float32), vals > float("-inf"),
                                                        key_minp, noise_scale, seed, offset, FAST_LOG)
                won, tok, l_tok = winner_draw(cand_f, cand_i, base_f, base_i, rows, go, n_slots, n_local,
                                              stride_shard, stride_shard_i, stride_field, stride_slot, bnd, key_minp,
                                              best_u, tok_u, l_u, BLOCK_S, WINNERS_UNCHECKED, ONE_SHARD)
                tl.store(tokens_ptr + rows, tok.to(tl.int64), mask=won)
                if LOGPROBS:  # "scaled" or "raw" (WINNERS is off where "processed" values are asked)
                    if MODE == 1:
                        lp = (l_tok - msafe) - log_z_raw
                    else:
                        lp = (l_tok - msafe) * inv_t - tl.log(z_full)
                    tl.store(logprob_ptr + rows, lp, mask=won)
                # a row whose top-N U could not prove still goes to the fallback (it redoes the token)
                need = need & ~(won & topn_ok)
                if WON:  # instrumentation: 1 where the winners finished the row (its top-N proven too)
                    tl.store(won_ptr + rows, tl.where(won & topn_ok, 1, 0), mask=mask_r)
        need = need & mask_r
        tl.store(fallback_ptr + rows, need, mask=mask_r)
        if tl.max(need.to(tl.int32), axis=0) > 0:
            # ---- how the fallback finishes each such row (fallback.py) ----
            # Every logit at or above `lower` lies in U or in a tile whose boundary is at or above
            # it. If those tiles, recomputed whole, plus U's part at or above `lower` fit in
            # REFINE_CAP elements, the fallback recomputes only them (key `lower`); otherwise
            # it recomputes the whole row (key 0).
            n_tiles = tl.sum(tile_reaches(bnd, lower[:, None]).to(tl.int32), axis=1)
            n_u = tl.sum(((vals > float("-inf")) & (order_key(vals) >= lower[:, None])).to(tl.int32), axis=1)
            fits = (lower > 0) & (n_u + TILE_V * n_tiles <= REFINE_CAP)
            tl.store(need_key_ptr + rows, tl.where(fits, lower, 0), mask=need)
    else:
        if DEAD_LATE:  # (no row to finish here; the rows with bad filter values still get their -1)
            mark_bad_rows(tokens_ptr, logprob_ptr, rows,
                          bad_filter & ~merge_verdict(tokens_ptr, rows, mask_r, PDL_LATE) & mask_r, LOGPROBS)
        # Every row's flag is written here (the caller allocates them uninitialised: no fill launch).
        tl.store(fallback_ptr + rows, tl.zeros([BLOCK_R], tl.int1), mask=mask_r)


def merge_folds(layout: CandidateLayout, device: torch.device) -> bool:
    """Whether fsdist.sample folds stage 2's merge into select_filtered (``merge=True``) for this layout. Always
    under the interpreter; on a GPU where a row keeps at least 256 logits (V >= ~8,000 in 128-id tiles): a small
    vocabulary keeps the separate merge launch, since Triton 3.6 failed to compile the folded kernel's 16 warps
    over [1, 32] kept logits (V = 1,024, H200, 2026-11-27), and the fold is only measured and GPU-tested on larger
    rows (a folded launch on a GPU has at least 512 lanes, launch_select_filtered's floor: 512 in
    tests/ops/test_select_filtered.py, 8,192 at V = 151936)."""
    return torch.device(device).type != "cuda" or layout.n_slots * KEEP >= 256


def launch_select_filtered(layout: CandidateLayout, src: BufferPair, batch: int, params: RowParams, *,
                           vocab_size: int, tokens: torch.Tensor, logprobs=None, top_n: int = 0,
                           mode: str = "scaled", top_ids=None, top_lp=None, cap: int = None, searched=None,
                           tile_v: int = 128, need_key=None, refine_cap: int = None, small_cap: int = None,
                           drew_small=None, winners: bool = False, won=None, winners_unchecked: bool = False,
                           num_warps: int = None, wide_cap: int = None, merge: bool = False, lse=None,
                           raw: bool = False, sorted_top_p: bool = None, pdl_wait: bool = False,
                           trigger: bool = False, late: bool = False, rows_per_program: int = None):
    """Finish filtered rows and top-N logprobs from an extended candidate buffer ``src``, after
    launch_merge wrote ``tokens`` (and ``logprobs``) for every row (with ``late``: while it may still run); or,
    with ``merge``, in place of launch_merge: the kernel then first writes what the merge would (``tokens``, and
    with ``logprobs`` the logprobs, the logsumexp into ``lse`` and, with ``raw``, raw logprobs; launch_merge's
    meanings), one launch less a call. Not for a checked layout (tensor parallelism: the merge checks the headers).

    Overwrites the tokens / logprobs of filtered rows it proves, fills ``top_ids`` /
    ``top_lp`` [B, top_n], and returns the rows the fallback must finish: bool [B] flags
    (``SampleOutput.fallback`` as it is; every row's flag written by the kernel).
    need_key: int64 [B], receives for each flagged row what the fallback recomputes
    (fallback.py): the key of a lower bound on everything the row needs (only the tiles whose
    boundary reaches it), or 0 (the whole row). tile_v: the vocabulary tile of stage 1 (the
    layout's slot width); refine_cap: REFINE_CAP unless set (0: always the whole row; tests).
    cap: how many kept logits above the boundary a row may have for the packed search
    (default DEFAULT_SEARCH_CAP = 0: all of U is searched; SEARCH_CAP packs, with the same
    results; at most half of U's padded size is used); ``searched``, an int32 [B] tensor, receives how many kept
    logits each row's search ran over (-1: all of U). small_cap: SMALL_CAP unless set (0: the
    exact top-k bisection, top-p and the draw always over the searched elements; tests);
    ``drew_small``, an int32 [B] tensor, receives 1 where they ran over the packed P (else 0), 2
    where min-p alone packed P into wide_cap lanes (WIDE_CAP unless set, where some row may have
    min-p and WIDE_CAP exceeds small_cap; 0: off; small_cap = 0 turns them off too) for the draw.
    winners: stage 1 wrote each tile winner's logit (field 1; ``plan.winner_logits_needed``), so
    min-p-only rows U cannot prove may be finished from the winners (module docstring); off where
    "processed" logprobs of the token or the top N are asked (they need the survivors' mass). ``won``, an int32 [B]
    tensor, receives 1 where the winners finished a row (else 0); winners_unchecked (tests only:
    the power check) drops the proof's bound. num_warps (benchmarks): the kernel's warps on a GPU
    (default SELECT_WARPS); the results are the same up to the order of fp32 sums (logprobs' last bits, top-p at
    an exact tie of its mass). sorted_top_p: the k-th largest and top-p over P's packed lanes from one sort
    (SORTED_TOP_P unless set; False: pairwise counts and sums), the same answers up to the order of fp32 sums.
    Under the interpreter the default is the pairwise path: it runs tl.sort's compare-exchange stages element by
    element there (a filtered chi-squared test went from minutes to over twenty); tests that want the sort ask
    for it (tests/ops/test_select_filtered.py runs both against the search).
    pdl_wait: launched as a programmatic dependent of the launch before it (configs.pdl_stage2), which it waits for
    at its first instruction; trigger: the caller's next launch is such a dependent (configs.pdl_fallback).
    late: the merge (``launch_merge(trigger=True)``, unfolded: ``merge`` False) was launched just before and may still
    run (configs.pdl_select_beside_merge): the kernel reads only stage 1's candidates until its thresholds are
    found, and the merge's verdict on each row (its -1 tokens) only then, after waiting for the merge's end where
    PDL runs (``utils.pdl_wait_point``); elsewhere (a CPU, an older GPU) the launches run in order and the verdict is
    read at the same point. The same results as the merge first, then select_filtered. rows_per_program (tests):
    the rows a program takes (a GPU's launch takes one; the interpreter's default takes many).
    """
    if not layout.extended:
        raise ValueError("filters and top-N logprobs need an extended candidate layout (layout.fields(extended=True))")
    if merge and (layout.checked or src.peer_table):
        raise ValueError("the merge folds into select_filtered only on an unchecked local buffer (no header check)")
    if merge and late:
        raise ValueError("late is for select_filtered beside an unfolded merge (merge=False)")
    if late and pdl_wait:
        raise ValueError("late and pdl_wait are two places for one wait: pass one")
    if merge and logprobs is not None and (lse is None or (raw and mode != "raw")):
        raise ValueError("a folded merge with logprobs needs an lse tensor, and raw logprobs need mode='raw'")
    device = src.f.device
    fallback = torch.empty(batch, dtype=torch.bool, device=device)
    if batch == 0:
        return fallback
    if rows_per_program is not None and (rows_per_program < 1 or rows_per_program & (rows_per_program - 1)):
        raise ValueError(f"rows_per_program must be a power of two, got {rows_per_program}")
    dummy = src.i
    args = []
    flags = {}
    for name, x in (("SEED", params.seed), ("OFFSET", params.offset), ("TEMP", params.temperature),
                    ("TOPK", params.top_k), ("TOPP", params.top_p), ("MINP", params.min_p)):
        p, v, per_row = row_param_args(x, dummy)
        args += [p, float(v) if name in ("TEMP", "TOPP", "MINP") else v]
        flags[f"{name}_PER_ROW"] = per_row
    par_p, par_f, par_i, par_on = parity_args(src.parity, dummy)
    on_gpu = device.type == "cuda"
    # GPU: one row per program, a decode batch spreads over the SMs. Interpreter: big blocks.
    block_u = next_pow2(layout.n_slots * KEEP)
    if on_gpu and merge:
        # At least 512 lanes (the extra ones masked): Triton 3.6 fails to compile the folded merge for sm_90 over
        # a small vocabulary's [1, 32] kept logits on 16 warps (TritonGPU layout inference; lowering case).
        block_u = max(512, block_u)
    block_r = 1 if on_gpu else max(1, min(1024, next_pow2(batch), 2 ** 16 // block_u))
    block_r = rows_per_program or block_r
    cap = DEFAULT_SEARCH_CAP if cap is None else cap
    if cap < 0 or cap & (cap - 1):
        raise ValueError(f"cap must be 0 or a power of two, got {cap}")
    cap = min(cap, block_u // 2)  # a search over more than half of U saves too little to pack
    if cap == 1 and on_gpu:
        cap = 2  # Triton 3.6 fails to compile a one-lane pack for sm_90 (same results with 2)
    if searched is not None and (searched.dtype != torch.int32 or searched.numel() < batch):
        raise ValueError(f"searched must be an int32 tensor of at least {batch} elements")
    if drew_small is not None and (drew_small.dtype != torch.int32 or drew_small.numel() < batch):
        raise ValueError(f"drew_small must be an int32 tensor of at least {batch} elements")
    if won is not None:
        if won.dtype != torch.int32 or won.numel() < batch:
            raise ValueError(f"won must be an int32 tensor of at least {batch} elements")
        won.zero_()  # (instrumentation) the kernel writes only programs with min-p rows to finish
    # "processed" logprobs (of the token or the top N) need the survivors' mass, which the winners lack
    winners = bool(winners) and not (mode == "processed" and (logprobs is not None or top_n > 0))
    if need_key is None:
        need_key = torch.empty(batch, dtype=torch.int64, device=device)
    elif need_key.dtype != torch.int64 or need_key.numel() < batch:
        raise ValueError(f"need_key must be an int64 tensor of at least {batch} elements")
    refine_cap = REFINE_CAP if refine_cap is None else refine_cap
    # [B, cap] scratch for the packed kept logits and [B, max(small, wide)] for the packed survivors
    # (fp32 values, int32 ids): O(B), never O(B x V).
    scratch_f = torch.empty(max(batch * cap, 1), dtype=torch.float32, device=device)
    scratch_i = torch.empty(max(batch * cap, 1), dtype=torch.int32, device=device)
    small = SMALL_CAP if small_cap is None else small_cap
    if small and (small < 32 or small & (small - 1)):
        raise ValueError(f"small_cap must be 0 or a power of two >= 32, got {small}")
    # The wide lanes serve programs with min-p alone: none without min-p (nor without the small lanes);
    # left out, the kernel compiles without their branch.
    if wide_cap is None:
        wide = WIDE_CAP if small and WIDE_CAP > small and params.may_min_p else 0
    else:
        wide = wide_cap if small else 0
    if wide and (wide <= small or wide & (wide - 1)):
        raise ValueError(f"wide_cap must be 0 or a power of two above small_cap ({small}), got {wide}")
    lanes = max(small, wide, 1)
    small_f = torch.empty(max(batch * lanes, 1), dtype=torch.float32, device=device)
    small_i = torch.empty(max(batch * lanes, 1), dtype=torch.int32, device=device)
    # Beside the merge, this kernel writes its scratch (scratch_f / small_f ...) before waiting for the merge: these
    # allocations must not reuse memory the merge still writes. They cannot: the merge's outputs (tokens, logprobs,
    # lse) are alive, held by the caller, and launch_merge frees no temporary its kernel writes.
    select_filtered_kernel[(cdiv(batch, block_r),)](
        src.f, src.i, src.base_f, src.base_i, par_p, par_f, par_i,
        batch, layout.n_slots, layout.n_local, layout.stride_shard, layout.stride_shard_i, layout.stride_field,
        layout.stride_ifield, layout.stride_slot,
        *args, vocab_size,
        tokens, logprobs if logprobs is not None else dummy,
        top_ids if top_ids is not None else dummy, top_lp if top_lp is not None else dummy,
        fallback, need_key, scratch_f, scratch_i, searched if searched is not None else dummy, small_f, small_i,
        drew_small if drew_small is not None else dummy, won if won is not None else dummy,
        lse if lse is not None else dummy,
        **flags,
        BLOCK_R=block_r, BLOCK_U=block_u, KEEP=KEEP, TOP_N=top_n,
        TOP_N_POW2=next_pow2(max(top_n, 1)), MODE=LOGPROBS_MODES.index(mode),
        LOGPROBS=logprobs is not None, FAST_LOG=fast_log_ok(device), DEVICE_PARITY=par_on,
        PACK=cap > 0, CAP=max(cap, 1), SEARCHED=searched is not None, TILE_V=tile_v, REFINE_CAP=refine_cap,
        SMALL_CAP=small, WIDE_CAP=wide, SCRATCH_LANES=lanes, DREW=drew_small is not None, WINNERS=winners,
        WINNERS_UNCHECKED=bool(winners_unchecked),
        WON=won is not None, MERGE=bool(merge), RAW=bool(raw) and logprobs is not None,
        ONE_SHARD=layout.n_shards == 1,  # (no division by n_local in the slot addresses)
        SORTED=(SORTED_TOP_P and not interpreting()) if sorted_top_p is None else bool(sorted_top_p),
        # pairwise top-p in [rows, small, chunk] steps: the interpreter's many-row programs stay under
        # Triton's 2**20-element tensors
        SMALL_CHUNK=32 if on_gpu else max(1, min(32, 2 ** 20 // max(1, block_r * small))),
        **pdl_args(device, wait=pdl_wait, trigger=trigger, late=late), DEAD_LATE=bool(late),
        num_warps=(SELECT_WARPS if num_warps is None else int(num_warps)) if on_gpu else 4,
    )
    return fallback
