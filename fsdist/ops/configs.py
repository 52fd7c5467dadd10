"""Tile configurations for the fused sampling kernel, picked by problem shape.

Decode is memory bound for B <= ~64: the weight [V, D] must stream through once,
so a program covers the whole batch (one batch tile) and enough vocabulary rows
to keep many loads in flight. Past that, the batch is split into tiles and the
grid orders them so that programs sharing a weight tile run together (the tile
comes from L2 the second time). From 33 rows on (from 17 for calls with bias / penalty entries on
fast-memory GPUs, SPARSE_WS_MIN_BATCH, and for one GPU's extended calls there at D <= EXTENDED_WS_MAX_HIDDEN; such
calls keep it past 64 rows on every sm_90 GPU), an sm_90 GPU runs the tile on the
warp-specialised kernel (its epilogue beside the next tile's main loop) where that kernel
applies, else on the Triton kernel (``triton_twin``). Configs are a pure function of the
shape, the GPU kind's memory speed (``fast_memory``, one answer agreed by a tensor-parallel group) and the
kind of call (plain or extended; with entries or not), so that every tensor-parallel rank of one GPU kind picks
the same one; the memory speed also picks the stage-1 path.
"""
import dataclasses
import functools
import re
from dataclasses import dataclass
from typing import Optional

from ..runtime import interpreting
from .utils import cdiv, next_pow2, pdl_supported


@dataclass(frozen=True)
class TileConfig:
    block_b: int
    block_v: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 4
    # Feed the fused kernel's GEMM through tensor descriptors (TMA) where the inputs allow
    # it (sm_90+, 16-byte aligned rows, tiles <= 256); otherwise pointers. Same candidates.
    tma: bool = False
    # Cap on registers per thread (ptxas maxrregcount), e.g. 128 so that two 8-warp programs
    # share an SM; None: the compiler's choice. Changes no arithmetic.
    max_regs: Optional[int] = None
    # Run the tile on the warp-specialised Hopper kernel (fused_sample_ws.py: per SM a load warp, an
    # MMA warpgroup and 8 epilogue warps (4 when num_warps < 8), persistent) where it applies
    # (fused_sample_ws.ws_supported, decided per call from the tensors): sm_90, a 128 or 64 x 128 x 64
    # TMA tile, with or without the tensor-parallel fan-out; processors on 64-row tiles only (a 128-row config
    # with bias / penalties runs the 64-row ws tile: launch_fused), logprobs and kept logits on 128-row tiles
    # only where fused_sample.ws_takes_fields says (WS_FIELDS_FULL_TILE).
    # Elsewhere the Triton kernel runs ``triton_twin(cfg)``: so ws=True in a plan is a preference, not a
    # promise of which kernel runs. Same candidates (the tile sums up to their summation order).
    ws: bool = False
    # Start the odd programs of the first wave (one program per SM) this many microseconds late, so that
    # the SMs finish their tiles, and run their epilogues, in two groups apart in time instead of all at
    # once: while one group runs its epilogue the other keeps the memory streaming (v56). 0: no delay. Only
    # the Triton kernel reads it, on an NVIDIA GPU, for a grid of one batch tile and several waves
    # (``stagger_applies``; elsewhere, ROCm included, a config may carry it and nothing waits), taking the first
    # wave as one program per SM (a tile small enough for two a SM delays a quarter of its first wave instead);
    # the warp-specialised kernel overlaps its epilogue by itself. Changes no arithmetic.
    stagger_us: int = 0

    def __post_init__(self):
        # (block_v >= 32: a tile reads whole 32-id words of the token bitmask, and keeps KEEP logits per row)
        for name, least in (("block_b", 16), ("block_v", 32), ("block_k", 16)):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < least or v & (v - 1):
                raise ValueError(f"TileConfig.{name} must be a power of two >= {least}, got {v!r}")
        if not isinstance(self.tma, bool):
            raise ValueError(f"TileConfig.tma must be a bool, got {self.tma!r}")
        if not isinstance(self.ws, bool):
            raise ValueError(f"TileConfig.ws must be a bool, got {self.ws!r}")
        if self.max_regs is not None and not (isinstance(self.max_regs, int) and 24 <= self.max_regs <= 255):
            raise ValueError(f"TileConfig.max_regs must be None or an int in [24, 255], got {self.max_regs!r}")
        if not (isinstance(self.stagger_us, int) and not isinstance(self.stagger_us, bool)
                and 0 <= self.stagger_us <= 1000):
            raise ValueError(f"TileConfig.stagger_us must be an int in [0, 1000], got {self.stagger_us!r}")

    @property
    def name(self) -> str:
        """'BBxBVxBKwWsS', plus 't' with TMA, 'rN' with a register cap, 'dN' with a first-wave stagger of N µs
        and '-ws' on the warp-specialised kernel: e.g. '64x128x64w8s4', '128x128x64w8s3tr128', '16x128x128w4s5d20',
        '128x128x64w8s5t-ws' (parse() reads it back)."""
        return (f"{self.block_b}x{self.block_v}x{self.block_k}w{self.num_warps}s{self.num_stages}"
                + ("t" if self.tma else "") + (f"r{self.max_regs}" if self.max_regs else "")
                + (f"d{self.stagger_us}" if self.stagger_us else "") + ("-ws" if self.ws else ""))

    @classmethod
    def parse(cls, text: str) -> "TileConfig":
        """Read a config written as ``name`` ('64x128x64w8s4[t][rN][dN][-ws]') or as
        'block_b:block_v:block_k[:warps[:stages]]'."""
        text = text.strip()
        m = re.fullmatch(r"(\d+)x(\d+)x(\d+)(?:w(\d+))?(?:s(\d+))?(t?)(?:r(\d+))?(?:d(\d+))?(-ws)?", text)
        if m:
            bb, bv, bk = (int(g) for g in m.groups()[:3])
            kw = {k: int(v) for k, v in (("num_warps", m.group(4)), ("num_stages", m.group(5)),
                                         ("max_regs", m.group(7)), ("stagger_us", m.group(8))) if v}
            return cls(bb, bv, bk, tma=bool(m.group(6)), ws=bool(m.group(9)), **kw)
        parts = text.split(":")
        if 3 <= len(parts) <= 5 and all(p.isdigit() for p in parts):
            return cls(*(int(p) for p in parts))
        raise ValueError(f"cannot read tile config {text!r}: want e.g. '64x128x64w8s4' (add 't' for TMA, "
                         "'r128' for a register cap, 'd20' for a 20 µs first-wave stagger, '-ws' for the "
                         "warp-specialised kernel) "
                         "or 'block_b:block_v:block_k[:num_warps[:num_stages]]'")


def _block_k(hidden_size: int, cap: int) -> int:
    return max(16, min(cap, next_pow2(hidden_size)))


def default_block_v(device_type: str) -> int:
    """The vocabulary tile: fixes the candidate buffer layout, so it depends on nothing per call."""
    return 512 if (device_type == "cpu" and interpreting()) else 128


def pick_config(batch: int, hidden_size: int, device_type: str, *, block_v: int = None,
                fast_memory: bool = False, extended: bool = False, sparse_processors: bool = False,
                extended_ws: bool = False, ws_kernel: bool = False, fields_full_tile: bool = False) -> TileConfig:
    """The stage-1 tile for ``batch`` rows of ``hidden_size``. fast_memory (``configs.fast_memory`` of the device;
    ``plan_sample`` passes it): the 32-row tile takes FAST_MEMORY_32_ROW_STAGES pipeline stages. extended: the call
    keeps the tiles' largest logits (filters, top-N, raw logprobs): the 32-row tile's first-wave stagger is then
    longer (``first_wave_stagger_us``). sparse_processors: the call applies logit bias or penalty entries: on
    fast memory, from SPARSE_WS_MIN_BATCH rows it takes the warp-specialised 64-row tile. extended_ws: an extended
    call on one GPU where that kernel runs: at D <= EXTENDED_WS_MAX_HIDDEN it takes that tile past 64 rows too, and on
    fast memory from SPARSE_WS_MIN_BATCH rows. ws_kernel: the warp-specialised kernel runs on the device for the call's
    dtype (``fused_sample_ws.ws_device``): its 128-row tile then takes WS_LARGE_BATCH_STAGES stages from
    WS_FEWER_STAGES_FROM rows without fast memory. fields_full_tile: the call's logprob / kept-logit fields may run
    on the ws 128-row tile (``fused_sample.ws_takes_fields``: WS_FIELDS_FULL_TILE on, no raw sums): an extended call
    of at least FIELDS_FULL_TILE_MIN_BATCH rows then takes that tile instead of extended_ws's 64-row one. None
    changes a candidate."""
    block_v = block_v or default_block_v(device_type)
    if device_type == "cpu":
        # Interpreter: every program costs Python overhead, so use few, large ones.
        return TileConfig(block_b=max(16, min(512, next_pow2(batch))), block_v=block_v,
                          block_k=_block_k(hidden_size, 128), num_warps=4, num_stages=1)
    # Winners of bench/tune.py on an H200 (bench/results/tune_NVIDIA_H200_2026-11-21_v1-philox1x.json
    # and _v2-quads.json), the same for D = 4096 and 8192 within ~1%.
    if batch <= 16:
        return TileConfig(16, block_v, _block_k(hidden_size, 128), num_warps=4, num_stages=5,
                          stagger_us=first_wave_stagger_us(hidden_size))
    ws_tile = sparse_processors or (extended_ws and hidden_size <= EXTENDED_WS_MAX_HIDDEN)
    if batch <= 32 and not (ws_tile and fast_memory and batch >= SPARSE_WS_MIN_BATCH):
        return TileConfig(32, block_v, _block_k(hidden_size, 128), num_warps=4,
                          num_stages=FAST_MEMORY_32_ROW_STAGES if fast_memory else 4,
                          stagger_us=first_wave_stagger_us(hidden_size, rows=32, extended=extended))
    full_tile = fields_full_tile and batch >= FIELDS_FULL_TILE_MIN_BATCH
    if batch <= 64 or (extended_ws and hidden_size <= EXTENDED_WS_MAX_HIDDEN and not full_tile):
        # The warp-specialised kernel's 64-row tile where it runs (v25b, H100: the plain call as fast as the
        # Triton tile, a filtered one 19-20 us faster at B = 48 / 64: its epilogue runs beside the next
        # tile's wgmmas; so do the processors', v26); wherever fused_sample_ws.ws_supported says no (fp32,
        # misaligned operands, not sm_90) the Triton kernel's tile, triton_twin. The TP heads' shards run it too (v40).
        # Past 64 rows one GPU's extended calls keep it where D <= EXTENDED_WS_MAX_HIDDEN (v80 on an H200, v85 on an
        # H100): the 128-row ws tile had no registers for the extended epilogue, and its Triton twin waits for the MMA;
        # since v118 (WS_FIELDS_FULL_TILE) the 128-row ws tile takes it per column half, from
        # FIELDS_FULL_TILE_MIN_BATCH rows (fields_full_tile above).
        return TileConfig(64, block_v, _block_k(hidden_size, 64), num_warps=8, num_stages=5, tma=True, ws=True)
    # Past one 64-row tile: 128-row tiles fed by TMA, 5 stages (bench/epilogue_bench.py, H200,
    # 2026-11-24, docs/performance.md v16): 1.2-1.4x faster than the configs used before (64-row
    # tiles, or this tile through pointers) at B = 128-1024 (D = 4096), the best of 13 tried.
    # On an H100 / H200 the warp-specialised kernel runs it (v17, bench/ws_probe.py), 5-17% faster. From
    # WS_FEWER_STAGES_FROM rows, where the ws kernel runs without fast memory (the H100's case), one operand stage
    # fewer (v91 / v92; the H200 not measured; elsewhere the Triton kernel's tuned 5).
    stages = WS_LARGE_BATCH_STAGES if ws_kernel and batch >= WS_FEWER_STAGES_FROM and not fast_memory else 5
    return TileConfig(128, block_v, _block_k(hidden_size, 64), num_warps=8, num_stages=stages, tma=True, ws=True)


def default_config(batch: int, hidden_size: int, device, *, extended: bool = False,
                   block_v: Optional[int] = None, sparse_processors: bool = False) -> TileConfig:
    """The tile a call of ``batch`` rows runs on ``device`` when it passes no config: ``pick_config`` with the
    device's own ``fast_memory`` answer (``plan_sample`` gives it a TP group's agreed one instead). extended: the
    call keeps the tiles' largest logits (filters, top-N, raw logprobs); sparse_processors: it applies logit bias or
    penalty entries. For benchmarks and tests that name or time the default."""
    import torch

    from .fused_sample_ws import ws_device  # (lazily: that module imports this one's users)

    device = torch.device(device)
    ws_kernel = ws_device(device)
    ws = (sparse_processors or extended) and ws_kernel  # as plan_sample decides for one GPU (no raw sums)
    return pick_config(batch, hidden_size, device.type, block_v=block_v, fast_memory=fast_memory(device),
                       extended=extended, sparse_processors=sparse_processors and ws, extended_ws=extended and ws,
                       ws_kernel=ws_kernel, fields_full_tile=extended and ws and WS_FIELDS_FULL_TILE)


# The warp-specialised kernel on a batch of one partial 64-row tile (B <= 48) reads the hidden in TMA boxes of this
# many rows, as many as the batch needs, and keeps the tile's other rows zero in shared memory
# (fused_sample_ws.launch_fused_ws's box_rows; fused_sample.ws_box_rows decides): no zero-padded copy (tile_operand's
# launch), and at most the last box's 7 rows past the hidden's end instead of up to 63 (the copy engine's slow zero
# fill, v35 / v65). 0: one box of the tile's rows, padded by tile_operand's rules. docs/performance.md v77 (H200,
# D = 4096, graph replays, µs, padded copy / boxes of 8): filtered and bias + penalty calls at B = 17 / 24 / 32 -4.6 to
# -6.7 (top-k + top-p at B = 24 326.6 / 322.0), B = 40 / 48 level or better, B = 56 0.2-1.2 worse (v77c, so
# fused_sample.ws_box_rows stops at 48), plain at B <= 32 unchanged (the 32-row Triton tile). The box
# count is a compile-time constant: one compile per 8 rows of batch. Tiles of at most WS_BOX_TILE_ROWS rows only: on
# the 128-row tile (B = 96, plain) the boxes cost +2 µs against its padded copy.
WS_BOX_ROWS = 8
WS_BOX_TILE_ROWS = 64
# Past one 128-row tile, a batch whose last tile holds at most 64 rows (B % 128 in 1-64) runs that tile on the
# warp-specialised kernel as half a tile (fused_sample_ws.launch_fused_ws's last_box_rows): its rows read in boxes of
# this many rows, one 64-row wgmma a k-step instead of two, instead of a whole tile on a zero-padded copy. 0: off.
# docs/performance.md v78 (H200): stage 1 2-11% faster than the padded launch at B = 136-320, whole calls still slower
# than the chunked path there, so it runs where the fused path takes such a batch: choose_path's padded cases on other
# GPUs (D <= PADDED_FUSED_MAX_HIDDEN, B = 129-192), path="fused", and tensor-parallel shards on the fused path.
WS_LAST_BOX_ROWS = 8

# Calls with logit bias / penalty entries from this many rows take the warp-specialised 64-row tile (reading the hidden
# in boxes, WS_BOX_ROWS; a zero-padded copy before v77) instead of the 32-row Triton tile: its processors run beside the
# next tile's wgmmas, where the Triton tile's epilogue waits for them, and at 17-32 rows that cost twice B = 16's
# (docs/performance.md v66 / v67, H200, 1,000 entries a row, graph replays, µs, shipped 32-row tile / ws tile
# padded): D = 4096 B = 24 340.0 / 314.7, B = 32 331.4 / 319.0 (plain 295.7 / 297.5); D = 8192 B = 32 513.3 / 512.9.
# At B = 16 the ws tile loses (plain +13 µs, v65). Fast-memory GPUs only (``fast_memory``): on an H100 the 32-row
# tile's epilogue costs less (v58: its B = 32 plain call pays +4 µs over B = 16, the H200's +19) and this was not
# measured there.
SPARSE_WS_MIN_BATCH = 17
# Extended calls (filters, top-N or raw logprobs) on one GPU take that tile at B = 17-32 too, where D <= this: its
# extended epilogue runs beside the next tile's wgmmas (+9.5 µs over the plain call at B = 32 / 64 against the 32-row
# Triton tile's +19, v65). docs/performance.md v65 / v74 (H200, D = 4096, graph replays, µs, 32-row / ws 64-row
# padded, top-k 50 + top-p 0.9 and min-p 0.05): B = 24 335.2 / 332.6, 329.8 / 326.9; B = 32 339.1 / 336.3, 333.2 /
# 329.8 (v65), 332.4 / 330.0, 329.1 / 326.9 (v74). At D = 8192 the ws tile loses 7-8 µs (v65), so it stays there; not
# measured across TP, whose shards keep the 32-row tile (plan_sample passes extended_ws for unchecked layouts only).
# Past 64 rows too, instead of the 128-row tile's Triton twin (v80, H200, graph replays, µs, 128-row / 64-row, top-k
# 50 + top-p 0.9 and min-p 0.05, two runs): D = 4096 B = 96 440-441 / 414-415, 442-443 / 411-412; B = 128 441-451 /
# 416-427, 446-450 / 412-415; B = 256 773-783 / 723-727, 755-761 / 713-717 (5-8% faster); D = 8192 3-9% slower.
# Past 64 rows the rule holds on an H100 too, so it asks no fast memory there (v85, two runs each): D = 4096 top-k +
# top-p B = 96 548-549 / 496, B = 128 550-551 / 503, B = 256 819-830 / 757-779; min-p 549-550 / 492-493, 553 / 500,
# 822-832 / 745-758 (5-10% faster); D = 8192 level at B = 96 / 128, 1.5-7% slower at 256. At B = 17-32 the H100 keeps
# the 32-row tile: the ws tile with v77's boxes cost it 3-7 µs there at both D (v85).
EXTENDED_WS_MAX_HIDDEN = 4096

# Logprob / kept-logit calls (filters, top-N) whose config is the warp-specialised 128-row tile: with this on,
# launch_fused runs them on that tile (its epilogue takes each column half's fields as the half arrives: the half's
# max, sums shifted by it, 4 largest logits; the sums rescaled to the tile's max at the end, so they differ from the
# Triton kernel's in the last bits as the 64-row tile's do), else on its Triton twin; with it on, one GPU's extended
# calls of at least FIELDS_FULL_TILE_MIN_BATCH rows at D <= EXTENDED_WS_MAX_HIDDEN take that tile too (pick_config's
# fields_full_tile) instead of the 64-row one. With raw sums ("raw" logprobs) a 128-row config keeps its Triton twin
# and one GPU's calls at D <= EXTENDED_WS_MAX_HIDDEN the 64-row tile (fused_sample.ws_takes_fields).
# docs/performance.md v118 (H200, graph replays, µs, two A/B pairs, top-k 50 + top-p 0.9 / min-p 0.05, switch off ->
# on): D = 4096 the default dispatch B = 256 783, 717 -> 646, 654 / 706, 700 -> 637, 672; B = 512 1,407, 1,385 ->
# 1,214, 1,331 / 1,393, 1,422 -> 1,394, 1,316; B = 1024 2,744, 2,803 -> 2,677, 2,694 / 2,735, 2,756 -> 2,668, 2,653
# (3-13% on the pairs' means, 0-17% pair by pair); the 128-row config itself (twin -> ws) 3-16% faster at B = 96
# and 256-1024, level at B = 136; D = 8192 (128-row tiles past 64 rows) 1-3% faster at B = 96, 5-11% at B = 256-1024,
# 1-5% slower at B = 192, where the plain call, which the switch does not touch, moved as much. At D = 4096 the
# 128-row ws tile is level to 3% slower than the 64-row one at B = 96 (418-432 against 416-426 µs) and level at
# B = 136 (576-594 against 576-593), so the 64-row tile keeps B <= 128. Plain logprob calls (no filters) move to the
# 128-row ws tile too, untimed (their GPU tests pass).
WS_FIELDS_FULL_TILE = True
FIELDS_FULL_TILE_MIN_BATCH = 129

# A filtered call's stage 1 draws no noise in a tile none of whose rows has a reader for it: every row greedy or
# restricted by top-k / top-p, whose token select_filtered draws over its surviving kept logits (with the contract's
# noise for those ids) or the fallback recomputes (epilogue.rows_draw_noise; launch_fused's skip_filtered_noise).
# Same tokens, logprobs, logsumexp and top-N either way; only such tiles' winner fields change (the score is the logit
# instead of the perturbed one, so the winner's logit and id may change too), which nothing reads but the merge: its
# poison (NaN) and dead (-inf) tests, which the noise never decides, and the token and logprob it writes first, which
# select_filtered replaces. docs/performance.md v122: without the noise a filtered call's stage 1 runs at 0.94-1.04x
# the plain one's on an H100, 7-15% under its cost with the noise; v123: top-k + top-p calls 8.6-14% faster at
# B = 256 / 1024 when every row is restricted. Tiles that still draw pay the rule's code (their rows' top-k / top-p,
# the 64-row tile's bits drawn after the logits, 176 bytes of spills on the 128-row tile against 76 without the skip):
# v124 (H100): such tiles (every 8th row unfiltered: filter_probe's "k50+p0.9 mixed") level at B = 96 (+0.1-0.4%) and
# 2-5.5% faster at B = 256 / 1024 at D = 4096 (D = 8192: -4.0 to +2.7% a pair, within that shape's spread), though
# every tile draws.
SKIP_FILTERED_NOISE = True

# v125 (a probe, off): the skip's code asked for in every sampled call, plain and min-p-only calls too, where a tile
# then draws unless all its rows are greedy (rows_draw_noise: a row no filter restricts reads its noise). Exact by
# the same rule. H100 (docs/performance.md v125): min-p calls level (-6.6 to +5.4% a pair, within the runs' spread),
# plain calls 2.2% slower at B = 96 (one 128-row ws tile) and faster from B = 256 (below).
SKIP_NOISE_EVERY_CALL = False

# v125, shipped: plain sampled calls (no filter, no logprobs, no processors) of SKIP_NOISE_PLAIN_MIN_BATCH rows or more
# on the warp-specialised 128-row tile ask for the skip's code (plan.asks_noise_skip), where every tile with a sampled
# row draws: their bits are then drawn after the tile's logits arrive instead of while they are awaited. H100,
# D = 4096 / 8192, graph replays, B = 256-1024: faster in 17 of 19 pairs (0.2-12%, median 3.9%), +0.7% and one outlier
# in the others; same tokens in every cell. At B = 96 (one 128-row tile) 2.2% slower in both pairs, so smaller
# batches do not ask; nor does the Triton kernel (untimed). v126 (H100, more pairs, both orders) did not reproduce
# the gain past B = 256: faster at 256 (4 of 4 pairs), level at 192, either way at 1024 (-3.8 to +3.4%), level to
# slower at 512 (0 to +6.5%); median -0.5% over every pair past one tile. v127 (H100, timed in turns, 40 rounds a
# cell): 1.5-3.5% faster at B = 256, level at 192 / 512, level to 4.6% faster at 1024 (two runs). Kept (exact, faster
# at 256, not slower past it).
SKIP_NOISE_PLAIN_WIDE_TILE = True
SKIP_NOISE_PLAIN_MIN_BATCH = 256

# The same rule (plan.asks_noise_skip) on the tensor-parallel head's candidates reduction: each rank's stage 1 over its
# vocabulary shard, whose restricted rows get their token from select_filtered over every rank's kept logits or from
# the pooled fallback, never from the tiles' noisy winners. Exact (CPU: tests/tensor_parallel/test_filters_tp.py on
# gloo, 2 ranks, every transport); off until its GPU tests (the ws tiles with the peer table and the call
# header) and a timing have run.
SKIP_NOISE_TP = False

# The warp-specialised 128-row tile's operand ring from WS_FEWER_STAGES_FROM rows on a GPU without fast memory: one
# stage fewer than the 5 below it, where the ws kernel runs (pick_config's ws_kernel: an sm_90 GPU, bf16 / fp16). The
# key is "no fast memory" (configs.fast_memory: the H100 SXM / PCIe, the H800; also an sm_90 GPU whose driver gives no
# memory speed), measured on the H100 SXM only. docs/performance.md v91 / v92 (stage 1 alone, [B] temperatures, three
# runs a cell, µs, 5 / 4 stages): B = 1024 2,388 / 2,194 (D = 4096) and 4,038 / 3,425 (D = 8192), faster in every
# run; whole calls in A/B/A/B order (v95) 2.6% / 9.6% faster at B = 1024. B = 768 is mixed (stage 1: 1,729 / 1,715 and
# 2,818 / 2,664; whole calls -3.9% at D = 4096, +5.3% at 8192), so it keeps 5; level at 512; 2-7% slower at 256-384
# (v94: 3 stages 14-22% slower than 4). With noise on,
# the MMA warps wait 3.4x longer for their operands than greedy with 5 stages (v89); fewer in flight help. All-greedy
# calls gain less or lose up to 3% (they run the same config). Fast memory (the H200): v87's two-buffer variant with 4
# stages ran level with 5 at B = 1024 (one run); it keeps 5. A call the ws kernel cannot take (ws_supported: e.g.
# misaligned operands) runs the Triton twin with the same depth.
WS_FEWER_STAGES_FROM = 1024
WS_LARGE_BATCH_STAGES = 4

# All-greedy calls (one scalar temperature 0: vLLM passes one when its batch is all greedy) of at least
# PP_GREEDY_MIN_BATCH rows on the warp-specialised 128-row tile run the ping-pong kernel (fused_sample_pp.py: two MMA
# warpgroups, each running its own tile's main loop while the other samples; the shared-memory epilogue in 8 chunks)
# where the call is plain (no logprobs, kept logits, processors, call header or device parity) and the batch has no
# short last tile (last_box_rows); the same candidates bit for bit. Stage 1 alone, H100, three runs a cell (medians),
# docs/performance.md v111b / v111c, greedy pp (this epilogue) / greedy ws: D = 4096 B = 256 / 512 / 1024 0.97 /
# 0.84-0.93 / 0.85-0.87, D = 8192 0.93-0.97 / 0.89-0.92 / 0.90-0.94 (v111's register epilogue: 0.88-1.02, and 1.11 at
# 8192 / 1024 in a run whose cells moved up to 20%); in v111c at D = 4096 B = 1024 it ran at 0.98x cuBLAS's matmul.
# With noise the ping-pong epilogue (one warpgroup beside the other's wgmmas) cannot keep up at D = 4096 (v111-v111c),
# nor can 4 epilogue warps of its own at either D (v113: 0.94-1.28x ws's time), so sampled calls keep the ws kernel.
# Whole calls (v112, H100, bench/greedy_pp_ab.py, three runs a cell): fsdist.sample(temperature=0.0) 4-11% faster
# with the rule (pp / ws 0.89-0.93 at D = 4096, 0.93-0.96 at D = 8192, B = 256-1024), 0.90-1.05x cuBLAS's matmul.
# Fast memory (the H200) not measured: off there.
PP_GREEDY_ON = True
PP_GREEDY_MIN_BATCH = 256


def pp_greedy_rule(batch: int, fast_memory: bool) -> bool:
    """Whether an all-greedy plain call of ``batch`` rows on the ws 128-row tile takes the ping-pong kernel (see
    PP_GREEDY_MIN_BATCH; fused_sample.launch_fused checks the call's other conditions). Always False when
    PP_GREEDY_ON is switched off."""
    return PP_GREEDY_ON and batch >= PP_GREEDY_MIN_BATCH and not fast_memory


# The 32-row tile's pipeline depth on a GPU with faster memory (``fast_memory``; measured on the H200 only): one stage
# more keeps more bytes in flight per SM, which a faster memory needs to stay busy (docs/performance.md v59 / v60, graph
# replays, [B] parameters, µs, 4 -> 5 stages at B = 20 / 32): H200 D = 4096 plain 301 -> 298 / 305 -> 301,
# top-k + top-p 341 -> 335 / 346 -> 339; D = 8192 plain -1 to -3, filtered -6 to -10. On an H100 5 stages gain
# nothing at D = 4096 and lose 6-7 µs plain at D = 8192, so it keeps 4.
FAST_MEMORY_32_ROW_STAGES = 5

# The first-wave stagger of the one-batch-tile Triton configs (B <= 32; TileConfig.stagger_us, docs/performance.md
# v56): one program per SM and equal tiles make every SM run its epilogue at the same moment while the memory idles;
# holding the odd programs of the first wave keeps two groups apart, so one streams while the other computes. On an
# H100 (graph replays, [B] parameters) 10-12 µs took 4-5 µs off filtered calls at B = 1 / 16 (D = 4096), 12.5 µs at
# B = 32, and 4-5 µs off plain calls at D = 8192 and B = 32; 3 µs was too short, 20 about as good. It scales with the
# tile's streaming time (the hidden size) up to STAGGER_MAX_US (extended calls on the 32-row tile: 16, below).
STAGGER_MAX_US = 12
# ... and only for grids of at least this many waves (vocabulary tiles per SM): the lockstep it breaks builds up over
# waves, and a grid of one or two (a small vocabulary, a tensor-parallel shard at TP = 8) would only start half its
# programs late (every measurement had ~9 waves; TP = 2 shards of V = 151936 have 4.5).
STAGGER_MIN_WAVES = 3


# On the 32-row tile one size does not suit both kinds of call (v61 / v62, D = 4096, graph replays, [B] parameters):
# plain calls do best with half the delay (6 µs against 12: H200 -2.3 µs, H100 -1.0; v63's A/B/A: -2.0 / -2.8),
# while 6 µs costs the calls with the longer extended epilogue 3-8 µs. Those take a third more (16 µs): single
# runs put it 1-3 µs ahead of 12, v63's A/B/A found it level (top-k + top-p unchanged, min-p -0.8 / -1.1), so it
# is kept because it costs them nothing. Its plain rate reaches 12 µs at D = 8192, the size v56b measured there
# (-4.6 to -5.5 µs); the extended 16 µs at D = 8192 is not measured, nor are logprobs / top-N calls and TP shards
# apart (they take the rate of their kind). The 16-row tile was flat from 6 to 16 µs on both GPUs.
# The 32-row tile's (µs per 1,024 of the hidden size, cap), keyed by whether the call is extended (the cap of the
# extended rate is above STAGGER_MAX_US, which bounds the other tiles and plain calls):
STAGGER_32_ROW_RATES = {False: (1.5, STAGGER_MAX_US), True: (4, 16)}


def first_wave_stagger_us(hidden_size: int, rows: int = 16, extended: bool = False) -> int:
    """The first-wave stagger (µs) of a one-batch-tile config of ``rows`` rows for this hidden size, at least 1:
    3 µs per 1,024 up to STAGGER_MAX_US (12 from D = 4096 on); a 32-row tile 1.5 µs per 1,024 up to 12 for plain
    calls and 4 up to 16 for extended ones (STAGGER_32_ROW_RATES)."""
    rate, cap = STAGGER_32_ROW_RATES[bool(extended)] if rows == 32 else (3, STAGGER_MAX_US)
    return max(1, min(cap, int(rate * hidden_size) // 1024))


def stagger_applies(cfg: TileConfig, device, batch_tiles: int, vocab_tiles: int, sms: int) -> bool:
    """Whether the Triton kernel holds its first wave for cfg.stagger_us: on an NVIDIA GPU (the wait reads a PTX
    timer), for a grid of one batch tile (its waves are then the vocabulary tiles in order) and at least
    STAGGER_MIN_WAVES waves of ``sms`` programs."""
    import torch

    return (cfg.stagger_us > 0 and getattr(device, "type", None) == "cuda" and torch.version.hip is None
            and batch_tiles == 1 and vocab_tiles >= STAGGER_MIN_WAVES * sms)


@functools.lru_cache(maxsize=64)  # (pure; a filtered call asks it on every call: a new TileConfig is ~5 µs)
def triton_twin(cfg: TileConfig, hidden_size: int) -> TileConfig:
    """The Triton kernel's config for a call ``cfg`` sends to the warp-specialised kernel when that kernel
    cannot run it: for the 64-row tile the Triton kernel's best 64-row tile (64x128x128 w8 s4: the 64x128x64
    TMA tile runs 2-4% slower there, v25b), else the same tile. Same candidates either way."""
    if not cfg.ws:
        return cfg
    if cfg.block_b == 64:
        return TileConfig(64, cfg.block_v, _block_k(hidden_size, 128), num_warps=8, num_stages=4)
    return dataclasses.replace(cfg, ws=False)


def fit_num_stages(cfg: TileConfig, elem_size: int, device) -> int:
    """cfg.num_stages, lowered until the fused kernel's pipeline fits the device's shared memory.

    The configs above are tuned for 2-byte operands; fp32 operands double every stage (at
    D = 4096, 16x128x128 with 5 stages would need 288 KB). Triton keeps num_stages - 1 operand
    tiles in flight, so the count is cut to what fits beside a reserve for the epilogue. The
    stage count changes no arithmetic: the candidates, hence the tokens, are the same.
    """
    if getattr(device, "type", None) != "cuda" or cfg.num_stages <= 2:
        return cfg.num_stages
    per_stage = (cfg.block_b + cfg.block_v) * cfg.block_k * elem_size
    room = _smem_per_block(device.index if device.index is not None else -1) - _EPILOGUE_RESERVE
    return max(2, min(cfg.num_stages, 1 + room // per_stage))


# Programmatic dependent launch (PDL, sm_90+) of the Triton fused kernel behind entry_offsets_kernel, the launch
# before it in calls with bias / penalty entries: the fused kernel's main loop reads only the hidden and the weight,
# so it starts while that kernel runs and waits for it (griddepcontrol.wait) only before its epilogue reads the
# entry table. docs/performance.md v73. False: the two launches in order, as before.
PDL_AFTER_ENTRY_OFFSETS = True
# PDL of a single-GPU call's stage 2 (the merge, or select_filtered with the merge folded in) behind the Triton
# fused kernel, which lets it launch as soon as its last tiles have started: stage 2 waits for stage 1's end at
# its first instruction, so only its launch and the start of its programs overlap stage 1's last wave, never a
# memory access. Off: on an H200 (docs/performance.md v74) it gained nothing at B = 16 and cost filtered calls
# 4-6 µs at B = 32 (select_filtered's early programs share the SMs stage 1's last wave frees first, several to an
# SM, where launched in order each has an SM to itself). Kept as a switch for probes (bench/filter_probe.py --pdl).
PDL_STAGE2 = False
# PDL of the fallback's two launches (materialize, resolve) behind select_filtered, and of resolve behind
# materialize where nothing comes between them (one GPU): each waits for its predecessor's end at its first
# instruction, so a call with nothing to resolve pays less for the two launches after select_filtered (v74, H200:
# -0.5 to -2 µs a filtered call at B = 1-64, measured on calls with no row to resolve).
PDL_FALLBACK = True
# select_filtered beside the merge (v76): a single-GPU filtered / top-N call launches the merge unfolded, which lets
# select_filtered launch at once as its programmatic dependent; select_filtered reads only stage 1's candidates
# until its thresholds are found and waits for the merge's end only before its first store (it needs the merge's
# verdict on each row then, and must overwrite the merge's tokens). The merge's work (each row's winner over every
# slot, and its stores) then runs beside select_filtered instead of inside it (docs/performance.md v76, H200: -0.5 to
# -3.3 µs a filtered call at B = 1-64, the same tokens). False: the merge folded into select_filtered (one program
# does both), as before.
PDL_SELECT_BESIDE_MERGE = True


def pdl_after_entry_offsets(device) -> bool:
    """Whether launch_fused starts the fused kernel as a programmatic dependent of entry_offsets_kernel: where
    PDL_AFTER_ENTRY_OFFSETS holds and ``pdl_supported(device)``."""
    return PDL_AFTER_ENTRY_OFFSETS and pdl_supported(device)


def pdl_stage2(device) -> bool:
    """Whether a single-GPU call launches stage 2 as a programmatic dependent of stage 1 (PDL_STAGE2)."""
    return PDL_STAGE2 and pdl_supported(device)


def pdl_fallback(device) -> bool:
    """Whether the fallback's launches are programmatic dependents of the launch before them (PDL_FALLBACK)."""
    return PDL_FALLBACK and pdl_supported(device)


_EPILOGUE_RESERVE = 16 << 10


@functools.lru_cache(maxsize=None)
def _smem_per_block(index: int) -> int:
    import torch

    dev = torch.cuda.current_device() if index < 0 else index
    props = torch.cuda.get_device_properties(dev)
    optin = getattr(props, "shared_memory_per_block_optin", 0)
    if optin:
        return int(optin)
    # Older torch: the opt-in limits of the architectures (Hopper 227 KB, Ampere 163 KB).
    return {9: 227 << 10, 8: 163 << 10}.get(props.major, 99 << 10)


# Most bytes of fp32 logits the chunked path keeps at once (one chunk), or None for the
# device's L2 size. A chunk that fits in L2 is written by cuBLAS and read back by the
# sampling pass without touching HBM; on an H200 (60 MB of L2) B = 256 then runs as three
# even chunks of 50 MB, which beat two 74 MB chunks by 20-80 us (bench/epilogue_bench.py).
# Set an int to trade speed for memory; every value gives the same tokens up to fp32 near-ties.
CHUNK_WORKSPACE_BYTES = None
_FALLBACK_WORKSPACE = 16 << 20  # CPU interpreter, or a device that does not report its L2


def chunk_workspace_bytes(device) -> int:
    """The chunked path's workspace budget on `device` (see CHUNK_WORKSPACE_BYTES)."""
    if CHUNK_WORKSPACE_BYTES is not None:
        return int(CHUNK_WORKSPACE_BYTES)
    if getattr(device, "type", None) != "cuda":
        return _FALLBACK_WORKSPACE
    return _l2_bytes(device.index if device.index is not None else -1)


@functools.lru_cache(maxsize=None)
def _l2_bytes(index: int) -> int:
    import torch

    dev = torch.cuda.current_device() if index < 0 else index
    return int(getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 0) or _FALLBACK_WORKSPACE)


def chunk_rows_for(batch: int, V_rows: int, block_v: int, budget_bytes: int) -> int:
    """Vocabulary rows per chunk: the fewest chunks whose fp32 logits [B, rows] fit the
    budget, all of about the same size (a small last chunk would run cuBLAS at a poor
    wave fill), in whole tiles of block_v."""
    cap = max(block_v, budget_bytes // (4 * max(batch, 1)) // block_v * block_v)  # rows that fit, >= 1 tile
    n_chunks = cdiv(V_rows, cap)
    # cdiv(V_rows, n_chunks) <= cap and cap is whole tiles, so rounding up stays within it.
    return cdiv(cdiv(V_rows, n_chunks), block_v) * block_v


# Up to this batch size stage 1 is always the fused kernel: one batch tile covers the batch and
# the op is memory bound (bench/epilogue_bench.py on an H200: at B = 64 fused is ~10% faster than
# chunked). Past it choose_path weighs the 128-row tiles against the chunked path.
CHUNKED_MIN_BATCH = 65
# The fused kernel's 128-row TMA tiles (pick_config) against the chunked path, CUDA-graph replays
# on an H100 and an H200, both shapes (docs/performance.md v16b): one full tile is 8-17% faster on
# the H100 and within 3% either way on the H200; from two tiles the paths are within ~5% of each
# other (D = 4096 fused ahead, D = 8192 chunked ahead), and the fused call needs one launch instead
# of one per chunk. A batch pays its last tile whole. Since the hidden is padded to whole tiles
# (PAD_TILE_ROWS, v35) a partial tile costs what a full one does, so the fused kernel takes every
# batch of one tile (B = 65-128; H100 graph replays, v38: fused / chunked at B = 65-95 ~446 / 508-530 µs
# at D = 4096, ~748 / 800-804 at D = 8192) and, past 128, batches whose last tile holds >= FULL_TILE_ROWS
# rows (B % 128 == 0 or >= 96) and, with a hidden of at most PADDED_FUSED_MAX_HIDDEN, every batch of two
# tiles (B = 129-256); the others (B = 257-351, ...; at D > 4096 also 129-223) stay chunked. v36, fused /
# chunked µs, D = 4096: B = 144 537 / 573, 192 550 / 607, 224 558 / 648, 288 787 / 760, 320 841 / 859;
# D = 8192: 144 913 / 867, 192 923 / 898, 224 972 / 1,012, 320 1,292 / 1,199 (the padded rows' MMA work
# grows with D, the chunked pass's noise does not).
# fp32 operands stay chunked past B = 64: the fused kernel's fp32 dot is exact FMA math, not tensor cores.
# On a GPU with faster memory (H200: v39) cuBLAS's GEMM at these B is cheaper and the chunked path wins more:
# graph replays, fused / chunked µs, D = 4096: B = 176 495 / 452, 192 503 / 466, 208 505 / 493, 224 527 / 543,
# 256 512 / 589; D = 8192: 192 866 / 719, 224 919 / 848, 256 875 / 922. There a last tile must hold
# >= FAST_MEMORY_FULL_TILE_ROWS rows (the v16b rule, one rule for every D: at D = 4096 B = 224 it gives up 3%, at
# D = 8192 it saves 8%); FAST_MEMORY_GBPS (the DRAM bandwidth the driver reports) tells the GPUs apart: H100 SXM
# ~3,350 GB/s, H200 4,814.
LARGE_TILE_ROWS = 128
FULL_TILE_ROWS = 96
PADDED_FUSED_MAX_HIDDEN = 4096
PADDED_FUSED_MAX_BATCH = 2 * LARGE_TILE_ROWS
FAST_MEMORY_FULL_TILE_ROWS = 112
FAST_MEMORY_GBPS = 4000


def fast_memory(device) -> bool:
    """Whether ``device`` is a GPU whose DRAM bandwidth (from the driver's memory clock and bus width) is at least
    FAST_MEMORY_GBPS; False on a CPU, or where the driver does not say. A tensor-parallel head asks it once per
    rank at construction and the group keeps one answer (fast only if every rank is)."""
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return False
    try:
        index = device.index if device.index is not None else torch.cuda.current_device()
    except Exception:  # no CUDA runtime: nothing to ask
        return False
    return dram_gbps(index) >= FAST_MEMORY_GBPS


@functools.lru_cache(maxsize=None)
def dram_gbps(index: int) -> float:
    """The DRAM bandwidth of CUDA device ``index`` in GB/s (Triton's ``testing.get_dram_gbps``: the driver's memory
    clock and bus width); 0.0 where the driver does not report it."""
    try:
        from triton.testing import get_dram_gbps

        return float(get_dram_gbps(index))
    except Exception:  # depends on the driver (and there is none on a CPU-only machine)
        return 0.0


# Batch tiles of at least this many rows read a zero-padded copy of the hidden when the batch leaves the last
# tile partly empty (``fused_sample.tile_operand``): a TMA box of the hidden that reaches past its rows is
# zero-filled by the copy engine, and on 128-row tiles such a box made the whole stage 1 far slower (H100,
# D = 4096, B = 192: 793 µs, 540 with the hidden padded to 256 rows, B = 256 itself 585; docs/performance.md
# v35). The copy is [ceil(B / tile) x tile, D], one launch (``pad_rows``); the candidates are the same bit for bit.
PAD_TILE_ROWS = 128
# Tiles of at least this many rows (and under PAD_TILE_ROWS) read the padded copy only when the batch is one tile at
# least half empty (B = 17-32 with bias / penalty entries, SPARSE_WS_MIN_BATCH; B = 65-96 of such calls, two 64-row
# tiles, were not measured and stay unpadded). The warp-specialised 64-row tile on an H200 (D = 4096, graph replays,
# µs): at B = 32 the unpadded box cost ~17 µs (plain 321.6 against 304.9 padded, v58 / v65), at B = 48 the padded
# copy cost ~3 (every kind of call, v68's A/B/A: plain 296.2 -> 299.5). Since v77 that kernel reads a one-tile batch
# of a 64-row tile in smaller boxes instead (WS_BOX_ROWS): this rule then serves the Triton kernel's 64-row TMA tile
# and WS_BOX_ROWS = 0.
PAD_HALF_TILE_ROWS = 64


STAGE1_PATHS = ("fused", "chunked")
# Logit bias / penalty entries past one 128-row tile: the fused call runs them on 64-row ws tiles (the
# 128-row tile's epilogue has no room for them, launch_fused), and the chunked path (cuBLAS's GEMM, then
# the sampling pass applies the entries) was faster at B = 256 on an H100: 709 vs 766 µs (D = 4096), 999 vs
# 1,147 (D = 8192); at B = 128 the fused call was ahead, 475 vs 572 / 799 vs 864 (graph replays, 1,000
# entries a row, docs/performance.md v32). Filters alone stay fused: chunked was 7-26% slower at B = 128-256.
SPARSE_CHUNKED_ABOVE = LARGE_TILE_ROWS


def choose_path(batch: int, hidden_size: int, device_type: str, elem_size: int = 2,
                sparse_processors: bool = False, fast_memory: bool = False) -> str:
    """'fused' while the op is memory bound (B <= 64), for every B of one 128-row tile, for larger batches whose
    last 128-row tile holds >= FULL_TILE_ROWS rows and, with hidden_size <= PADDED_FUSED_MAX_HIDDEN, for
    every B up to two tiles; 'chunked' (cuBLAS's GEMM, then the sampling pass) otherwise,
    for every B > 64 with 4-byte (fp32) operands, and past B = SPARSE_CHUNKED_ABOVE for calls with logit
    bias or penalty entries (sparse_processors). elem_size: bytes per hidden / weight element. fast_memory
    (configs.fast_memory of the device): past one tile only a last tile of >= FAST_MEMORY_FULL_TILE_ROWS rows
    is fused."""
    if device_type != "cuda" or batch < CHUNKED_MIN_BATCH:
        return "fused"
    if elem_size >= 4 or (sparse_processors and batch > SPARSE_CHUNKED_ABOVE):
        return "chunked"
    if batch <= LARGE_TILE_ROWS:
        return "fused"
    last = batch % LARGE_TILE_ROWS
    if fast_memory:
        return "fused" if last == 0 or last >= FAST_MEMORY_FULL_TILE_ROWS else "chunked"
    if last == 0 or last >= FULL_TILE_ROWS:
        return "fused"
    return "fused" if hidden_size <= PADDED_FUSED_MAX_HIDDEN and batch <= PADDED_FUSED_MAX_BATCH else "chunked"


def pdl_select_beside_merge(device) -> bool:
    """Whether a single-GPU filtered / top-N call runs select_filtered beside the merge (PDL_SELECT_BESIDE_MERGE)
    instead of folding the merge into it: where PDL runs (``pdl_supported``)."""
    return PDL_SELECT_BESIDE_MERGE and pdl_supported(device)
