"""Stage 1 on Hopper, warp-specialised: the LM-head GEMM and the sampling epilogue run side by side.

``fused_sample_kernel`` (Triton) computes a logits tile and then runs its epilogue (Philox,
two logs per id, the row reductions) in the same warps: past one 128-row batch tile the
tensor cores idle while it runs, and nothing else fits on the SM (one 160 KB program per
SM). This kernel, written in Gluon (Triton's explicit-layout dialect), is persistent (one
program per SM walks its tiles) and splits each program's warps by role:

* a **load** warp streams the operand tiles into a ring of shared-memory stages with TMA;
* the **MMA** warpgroup (the default partition) runs the wgmma main loop of one tile,
  hands the fp32 accumulator over through shared memory, and starts the next tile;
* the **epilogue** warpgroup reads the accumulator back and runs the same sampling
  epilogue as the Triton kernel (``noise.py``'s Philox stream, ``epilogue.py``'s
  temperature rules) while the next tile's MMAs proceed.

Stage buffers and the accumulator hand-off are guarded by mbarriers (ready / empty pairs).
The candidates are those of ``fused_sample_kernel`` with the same tile (128 or 64 x 128 x 64),
bit for bit: the same wgmma instruction sequence in the same K order gives the same logits, and
the noise is keyed by the global vocabulary id. Batch tiles of 128 rows (B > 64) or 64 rows
(``configs.pick_config`` uses them for B = 33-64, and for B = 17-32 with bias / penalty entries on
fast-memory GPUs; ``launch_fused`` also for calls with bias or penalties past B = 64);
temperature, seed and offset as scalars or ``[B]`` tensors. It also writes the logprob fields and
the kept logits of filtered calls (``epilogue.tile_stats`` / ``tile_topk``'s fields; on 64-row tiles
the first column half's logits stay in registers until the second arrives, on 128-row tiles each
half's fields are taken as it arrives and its sums rescaled to the tile's max at the end, which
``launch_fused`` uses where ``configs.WS_FIELDS_FULL_TILE`` says; the tile's sums add the halves'
partial sums, so they may differ from the Triton kernel's in the last bits),
and applies the logit processors (``processors.py``: three bitmask words per row and column half,
each row's bias / penalty slices of both halves by one 3-key search with their first 4 entries,
all loaded before the logits are awaited; the walk past those reads the list).
The tensor-parallel heads run here too: every store can fan out to each peer's buffer through an
address table, the double buffer's copy comes from the device counter (``parity.py``), and a checked
layout gets the call's header (``step_check.py``), as in the Triton kernel. ``ws_supported`` says when
this kernel applies, and every other call runs the Triton kernel (``configs.triton_twin``).
"""

import math

import torch
import triton

from ..params import RowParams
from .epilogue import perturb, raw_sum, row_temperature, scaled_sum, tile_draws_noise
from .layout import KEEP, BufferPair, CandidateLayout, store_fan_out
from .noise import LEGACY_PTX, gumbel_from_bits, vocab_quad_bits
from .parity import parity_args, parity_offsets
from .prepare_processors import PROBES as _PROBES_INT
from .processors import (process_tile, processor_args, row_penalties, slice_heads, span_allowed, span_words,
                         split_slices)
from .step_check import call_flags, write_record_words, write_row_fingerprints, writes_header
from .utils import cdiv, device_capability, fast_log_ok, load_row_param, row_param_args, sm_clock, sm_count

try:  # Gluon ships with Triton >= 3.5; without it (or its Hopper module) this path is off.
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                                   warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor

    HAVE_GLUON = True
except ImportError:  # pragma: no cover - depends on the installed Triton
    HAVE_GLUON = False

# The tile this kernel runs: 128 rows (or 64, launch_fused_ws(block_b=64)) x 128 ids x 64 of the hidden
# size per stage. The vocabulary tile fixes the candidate layout (configs.default_block_v on a GPU).
WS_BLOCK_B = 128
WS_BLOCK_V = 128
WS_BLOCK_K = 64
WS_STAGES = 4  # x 32 KB of operands, + 32 KB for the accumulator hand-off (one column half at a time)
WS_ROW_THREADS = 8  # rows a warp spans in the epilogue's layout
# Registers: the launch gives every warp maxnreg; the partitions then trade them per warpgroup
# (setmaxnreg): the load warp drops to LOAD_REGS, the epilogue rises to its budget, the MMA
# warpgroup keeps the rest (>= 128 for its accumulator). warps -> (maxnreg, epilogue registers):
# 4 + 1 + 4 warps run as 12 (3 x 128 threads x 168 <= 64K); 4 + 1 + 8 as 16 (4 x 128 x 128).
WS_EPILOGUE_WARPS = 4
WS_REGISTERS = {4: (168, 232), 8: (128, 160)}
WS_LOAD_REGS = 24
# launch_fused_ws(noise_probe=): benchmark variants of the noise, to split its cost (not the sampler's contract): the
# Philox bits without the logs, the logs of a cheap hash instead of Philox, Philox with 7 rounds; and the contract's
# noise in the instructions before v97 (tl.philox's separate high and low multiplies, lg2 without .ftz: the same bits)
_PROBE_PHILOX = triton.language.constexpr(1)
_PROBE_LOGS = triton.language.constexpr(2)
_PROBE_ROUNDS7 = triton.language.constexpr(3)
_PROBE_LEGACY = triton.language.constexpr(4)
_PROBE_LEGACY_PHILOX = triton.language.constexpr(5)  # tl.philox's multiplies alone (the shipped transform)
NOISE_PROBES = {"": 0, "philox": _PROBE_PHILOX.value, "logs": _PROBE_LOGS.value, "rounds7": _PROBE_ROUNDS7.value,
                "legacy": _PROBE_LEGACY.value, "legacy_philox": _PROBE_LEGACY_PHILOX.value}
# launch_fused_ws(wait_probe=): int64 fields a program's row holds (benchmarks): the MMA warpgroup's cycles in all,
# waiting for operands, waiting for the epilogue to free the hand-off buffer, its tiles; the load warp's cycles in all
# and waiting for free stages; the epilogue's cycles in all and waiting for the accumulator; the MMA warpgroup's cycles
# waiting for its wgmmas to retire (one thread's), and the most any of its threads waited for them
WAIT_FIELDS = triton.language.constexpr(10)
WGMMA_ROWS = 64  # the rows of one warpgroup's wgmma: a short last tile (last_box_rows) runs one of them a k-step
_PROBES = triton.language.constexpr(_PROBES_INT)  # the entry search's probes per round (processors.py)
HEAD_N = triton.language.constexpr(4)  # entries per (row, column half) walked from registers (processors.py)

if HAVE_GLUON:

    @gluon.jit
    def _tile_coords(t, n_btiles, ROTATE: gl.constexpr):
        """(batch tile, vocabulary tile) of tile t, batch tiles innermost. ROTATE (persistent_grid, which asks for it
        only with P a multiple of n_btiles): the batch tiles of each vocabulary tile rotate by the program's round
        t // P, so that every program visits every batch tile (each round's P tiles are whole groups of one
        vocabulary tile's batch tiles: the rotation permutes within them, so every tile still runs once)."""
        pid_b = t % n_btiles
        if ROTATE:
            pid_b = (pid_b + t // gl.num_programs(0)) % n_btiles
        return pid_b, t // n_btiles

    @gluon.jit
    def _wait_counted(bar, phase, w, WAITS: gl.constexpr):
        """mbarrier.wait(bar, phase); with WAITS (launch_fused_ws's wait_probe) w plus the cycles the wait took, else
        w as given."""
        if WAITS:
            c0 = sm_clock(phase)
        mbarrier.wait(bar, phase)
        if WAITS:
            w += sm_clock(phase) - c0
        return w

    @gluon.jit
    def _mma_wait_counted(acc, NUM: gl.constexpr, anchor, w, WAITS: gl.constexpr):
        """warpgroup_mma_wait(num_outstanding=NUM) on acc; with WAITS also w plus the cycles it took (else w)."""
        if WAITS:
            c0 = sm_clock(anchor)
        acc = warpgroup_mma_wait(num_outstanding=NUM, deps=(acc, ))
        if WAITS:
            w += sm_clock(anchor) - c0
        return acc, w

    @gluon.jit
    def _load_tile(h_desc, w_desc, h_bufs, w_bufs, ready, empty, it, off_b, off_v, k_steps, BLOCK_K: gl.constexpr,
                   STAGES: gl.constexpr, BOXES: gl.constexpr, w_emp, WAITS: gl.constexpr = False):
        """One tile's copies: BOXES boxes of h_desc's rows from row off_b and the weight's box from off_v, a stage a
        k-step; the advanced stage counter, and w_emp plus the cycles spent waiting for free stages (WAITS; else
        w_emp as given). Fewer rows than the stage holds: with box_rows the rest are the zeros _load_partition wrote;
        with LAST_BOXES they hold an earlier tile's data (or, in a stage not yet used, whatever shared memory held),
        for rows past the batch, which the epilogue never stores."""
        BOX: gl.constexpr = h_desc.block_type.shape[0]
        for k in range(k_steps):
            s = it % STAGES
            w_emp = _wait_counted(empty.index(s), ((it // STAGES) & 1) ^ 1, w_emp, WAITS)
            mbarrier.expect(ready.index(s), BOXES * h_desc.block_type.nbytes + w_desc.block_type.nbytes)
            if BOX == h_bufs.shape[1]:
                tma.async_copy_global_to_shared(h_desc, [off_b, k * BLOCK_K], ready.index(s), h_bufs.index(s))
            else:
                for r in gl.static_range(BOXES):
                    tma.async_copy_global_to_shared(h_desc, [off_b + r * BOX, k * BLOCK_K], ready.index(s),
                                                    h_bufs.index(s).slice(r * BOX, BOX))
            tma.async_copy_global_to_shared(w_desc, [off_v, k * BLOCK_K], ready.index(s), w_bufs.index(s))
            it += 1
        return it, w_emp

    @gluon.jit
    def _load_partition(h_desc, hl_desc, w_desc, h_bufs, w_bufs, ready, empty, n_btiles, n_tiles, k_steps,
                        BLOCK_B: gl.constexpr, BLOCK_V: gl.constexpr, BLOCK_K: gl.constexpr,
                        STAGES: gl.constexpr, H_BOXES: gl.constexpr, LAST_BOXES: gl.constexpr,
                        ROTATE: gl.constexpr, wait_ptr, WAITS: gl.constexpr):
        # One warp: wait for a free stage, then let the copy engine fill it (both operands
        # arrive on the stage's "ready" barrier, which counts their bytes).
        BOX: gl.constexpr = h_desc.block_type.shape[0]
        if BOX < BLOCK_B:
            # A one-tile batch loaded in H_BOXES boxes of BOX rows (launch_fused_ws's box_rows): the rows past them
            # are never loaded, so they are zeroed here once, before the first copy (the zeros keep those rows'
            # logits finite; they are never sampled). The proxy fence orders these stores before the copy engine's.
            zl: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [1, 1], [1, 0])
            z = gl.zeros([8, BLOCK_K], h_desc.dtype, zl)  # 8 rows at a time: this warp has few registers
            for i in gl.static_range(STAGES):
                for r in gl.static_range(BOX * H_BOXES // 8, BLOCK_B // 8):
                    h_bufs.index(i).slice(r * 8, 8).store(z)
            fence_async_shared()
        it = 0
        w_emp = gl.program_id(0).to(gl.int64) * 0
        if WAITS:
            c_start = sm_clock(it)
        for t in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
            pid_b, pid_v = _tile_coords(t, n_btiles, ROTATE)
            off_b = pid_b * BLOCK_B
            off_v = pid_v * BLOCK_V
            if LAST_BOXES > 0:  # (static: a launch without it compiles the whole-tile copies alone)
                if pid_b == n_btiles - 1:
                    it, w_emp = _load_tile(hl_desc, w_desc, h_bufs, w_bufs, ready, empty, it, off_b, off_v, k_steps,
                                           BLOCK_K, STAGES, LAST_BOXES, w_emp, WAITS)
                else:
                    it, w_emp = _load_tile(h_desc, w_desc, h_bufs, w_bufs, ready, empty, it, off_b, off_v, k_steps,
                                           BLOCK_K, STAGES, H_BOXES, w_emp, WAITS)
            else:
                it, w_emp = _load_tile(h_desc, w_desc, h_bufs, w_bufs, ready, empty, it, off_b, off_v, k_steps,
                                       BLOCK_K, STAGES, H_BOXES, w_emp, WAITS)
        if WAITS:  # (launch_fused_ws's wait_probe) the load warp's cycles in all, and waiting for free stages
            row = wait_ptr + gl.program_id(0) * WAIT_FIELDS
            gl.store(row + 4, sm_clock(it) - c_start)
            gl.store(row + 5, w_emp)

    @gluon.jit
    def _col_halves(x, ROWS: gl.constexpr, W: gl.constexpr):
        """The left and right column halves of x [ROWS, W] (a register bit of the wgmma layout: no data moves)."""
        return gl.split(gl.permute(gl.reshape(x, [ROWS, 2, W // 2]), (0, 2, 1)))

    @gluon.jit
    def _hand_off_phases(hc, ACC_BUFS: gl.constexpr):
        """The ready-barrier phases of a tile's two hand-offs (left half, right half), hc = 2 x the tiles handed off
        before: hand-off u = hc + half uses buffer u % ACC_BUFS for the (u // ACC_BUFS)-th time. The MMA side waits on
        the empty barriers with the opposite phases (a fresh barrier's "previous" phase passes at once)."""
        if ACC_BUFS == 2:
            p0 = (hc // 2) & 1
            p1 = p0
        else:
            p0 = hc & 1
            p1 = (hc + 1) & 1
        return p0, p1

    @gluon.jit
    def _argmax_lowest(x, col):
        """Each row's largest value of x and its column, the lowest among equal maxima (as tl.argmax)."""
        m = gl.max(x, axis=1)
        return m, gl.min(gl.where(x == m[:, None], col[None, :], 1 << 30), axis=1)

    @gluon.jit
    def _store_hand_off(acc_smem, base: gl.constexpr, x, ROWS: gl.constexpr, W: gl.constexpr, NCH: gl.constexpr,
                        WHOLE: gl.constexpr):
        """x [ROWS, W] into buffer `base` of acc_smem (NCH = 1), or its NCH column chunks (2 or 4) into buffers
        base .. base + NCH - 1 (the chunked epilogue's, EPI_CHUNK); a short tile fills each buffer's first ROWS rows."""
        if NCH == 1:
            if WHOLE:
                acc_smem.index(base).store(x)
            else:
                acc_smem.index(base).slice(0, ROWS).store(x)
        elif NCH == 2:
            a, b = _col_halves(x, ROWS, W)
            _store_hand_off(acc_smem, base, a, ROWS, W // 2, 1, WHOLE)
            _store_hand_off(acc_smem, base + 1, b, ROWS, W // 2, 1, WHOLE)
        else:
            gl.static_assert(NCH == 4, "the hand-off splits a column half into 1, 2 or 4 chunks")
            a, b = _col_halves(x, ROWS, W)
            _store_hand_off(acc_smem, base, a, ROWS, W // 2, 2, WHOLE)
            _store_hand_off(acc_smem, base + 2, b, ROWS, W // 2, 2, WHOLE)

    @gluon.jit
    def _mma_tile(h_bufs, w_bufs, ready, empty, acc_smem, acc_ready, acc_empty, it, hc, k_steps,
                  ROWS: gl.constexpr, BLOCK_V: gl.constexpr, STAGES: gl.constexpr, WHOLE: gl.constexpr,
                  ACC_BUFS: gl.constexpr, NCH: gl.constexpr, w_rdy, w_hnd, w_mma, WAITS: gl.constexpr = False):
        """One tile's main loop over the first ROWS rows of the stages (WHOLE: all of them) and its hand-off; the
        advanced (it, hc), and w_rdy / w_hnd / w_mma plus the cycles spent waiting for operands (while the previous
        k-step's wgmma may still run) / for the epilogue to free the hand-off buffer / for wgmmas to retire (WAITS;
        else as given)."""
        acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                             instr_shape=[16, BLOCK_V, 16])
        acc = gl.zeros([ROWS, BLOCK_V], gl.float32, acc_layout)
        for k in range(k_steps):
            s = it % STAGES
            w_rdy = _wait_counted(ready.index(s), (it // STAGES) & 1, w_rdy, WAITS)
            if WHOLE:
                acc = warpgroup_mma(h_bufs.index(s), w_bufs.index(s).permute((1, 0)), acc, is_async=True)
            else:
                acc = warpgroup_mma(h_bufs.index(s).slice(0, ROWS), w_bufs.index(s).permute((1, 0)), acc,
                                    is_async=True)
            acc, w_mma = _mma_wait_counted(acc, 1, s, w_mma, WAITS)
            # the previous stage's wgmma has retired: its buffers may be refilled
            mbarrier.arrive(empty.index((it + STAGES - 1) % STAGES), pred=k > 0)
            it += 1
        acc, w_mma = _mma_wait_counted(acc, 0, hc, w_mma, WAITS)
        mbarrier.arrive(empty.index((it + STAGES - 1) % STAGES), pred=k_steps > 0)
        # Hand the tile to the epilogue in two column halves through one 32 KB buffer, each
        # once the epilogue has read the previous one out. (Column 64 is a register bit of
        # the wgmma layout: the split moves no data.) A short tile fills the buffer's first ROWS rows: the
        # epilogue reads the others too (an earlier tile's values, or never-written shared memory), for rows past
        # the batch, which it never stores.
        # With ACC_BUFS = 2 each half has a buffer of its own (a 64 KB hand-off): the right half is stored without
        # waiting for the epilogue to read the left one out (hand-off number u = hc + half uses buffer u % ACC_BUFS
        # for the (u // ACC_BUFS)-th time).
        left, right = _col_halves(acc, ROWS, BLOCK_V)
        J1: gl.constexpr = ACC_BUFS - 1  # the right half's buffer (0: the left one's, 1: its own)
        p0, p1 = _hand_off_phases(hc, ACC_BUFS)
        w_hnd = _wait_counted(acc_empty.index(0), p0 ^ 1, w_hnd, WAITS)
        _store_hand_off(acc_smem, 0, left, ROWS, BLOCK_V // 2, NCH, WHOLE)
        mbarrier.arrive(acc_ready.index(0))
        w_hnd = _wait_counted(acc_empty.index(J1), p1 ^ 1, w_hnd, WAITS)
        _store_hand_off(acc_smem, J1 * NCH, right, ROWS, BLOCK_V // 2, NCH, WHOLE)
        mbarrier.arrive(acc_ready.index(J1))
        return it, hc + 2, w_rdy, w_hnd, w_mma

    @gluon.jit
    def _mma_partition(h_bufs, w_bufs, ready, empty, acc_smem, acc_ready, acc_empty, n_btiles, n_tiles, k_steps,
                       BLOCK_B: gl.constexpr, BLOCK_V: gl.constexpr, STAGES: gl.constexpr,
                       LAST_BOXES: gl.constexpr, ROTATE: gl.constexpr, ACC_BUFS: gl.constexpr,
                       NCH: gl.constexpr, wait_ptr, WAITS: gl.constexpr):
        # One warpgroup: acc[BLOCK_B, BLOCK_V] = h_tile @ w_tile^T over k, one wgmma group in
        # flight while the next stage's data is awaited; a stage is released as soon as the
        # wgmma that read it has retired. With LAST_BOXES the batch's last tile (at most half a tile of rows)
        # runs as half a tile: one 64-row wgmma a k-step instead of two (the same products for its rows).
        it = 0
        hc = 0
        w_rdy = gl.program_id(0).to(gl.int64) * 0
        w_hnd = w_rdy
        w_mma = w_rdy
        if WAITS:
            c_start = sm_clock(it)
        for t in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
            if LAST_BOXES > 0:  # (static: a launch without it compiles the whole-tile loop alone)
                pid_b, _pid_v = _tile_coords(t, n_btiles, ROTATE)
                if pid_b == n_btiles - 1:
                    it, hc, w_rdy, w_hnd, w_mma = _mma_tile(h_bufs, w_bufs, ready, empty, acc_smem, acc_ready,
                                                            acc_empty, it, hc, k_steps, BLOCK_B // 2, BLOCK_V, STAGES,
                                                            False, ACC_BUFS, NCH, w_rdy, w_hnd, w_mma, WAITS)
                else:
                    it, hc, w_rdy, w_hnd, w_mma = _mma_tile(h_bufs, w_bufs, ready, empty, acc_smem, acc_ready,
                                                            acc_empty, it, hc, k_steps, BLOCK_B, BLOCK_V, STAGES, True,
                                                            ACC_BUFS, NCH, w_rdy, w_hnd, w_mma, WAITS)
            else:
                it, hc, w_rdy, w_hnd, w_mma = _mma_tile(h_bufs, w_bufs, ready, empty, acc_smem, acc_ready, acc_empty,
                                                        it, hc, k_steps, BLOCK_B, BLOCK_V, STAGES, True, ACC_BUFS, NCH,
                                                        w_rdy, w_hnd, w_mma, WAITS)
        if WAITS:  # (launch_fused_ws's wait_probe) the MMA warpgroup's cycles in all, waiting for operands, for the
            # epilogue to free the hand-off buffer, its tiles, and waiting for wgmmas to retire
            row = wait_ptr + gl.program_id(0) * WAIT_FIELDS
            gl.store(row + 0, sm_clock(it) - c_start)
            gl.store(row + 1, w_rdy)
            gl.store(row + 2, w_hnd)
            gl.store(row + 3, (hc // 2).to(gl.int64))
            gl.store(row + 8, w_mma)
            # and the most any of its threads waited for wgmmas to retire: a scalar store writes one thread's count
            # (v109: the four warps may wait unequally, and Nsight Compute's samples average them)
            lanes: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
            gl.atomic_max(row + 9 + gl.zeros([128], gl.int32, lanes), gl.zeros([128], gl.int64, lanes) + w_mma)

    @gluon.jit
    def _half_bits(seed, offset, first_id, HALF: gl.constexpr, quad_layout: gl.constexpr, PROBE: gl.constexpr = 0,
                   PTX: gl.constexpr = False):
        """The Philox bits of ids first_id .. + HALF - 1 for each row, [rows, HALF]: column 4q + 2i + j is lane
        2i + j of quad q (noise.vocab_bits_tile's arrangement). PROBE (benchmarks, launch_fused_ws's noise_probe):
        _PROBE_LOGS a cheap hash of the id instead of Philox, _PROBE_ROUNDS7 Philox with 7 rounds, _PROBE_LEGACY
        tl.philox's instructions (and _PROBE_LEGACY_PHILOX). PTX: noise.philox_words'."""
        quad = (first_id >> 2) + gl.arange(0, HALF // 4, gl.SliceLayout(0, quad_layout))
        if PROBE == _PROBE_LOGS:
            h = ((quad[None, :] + seed[:, None].to(gl.int32) + offset[:, None].to(gl.int32)) * -1640531535).to(
                gl.uint32, bitcast=True)
            r0, r1, r2, r3 = h, h ^ 0x5bd1e995, h ^ 0x1b873593, h ^ 0x27d4eb2f
        else:
            r0, r1, r2, r3 = vocab_quad_bits(seed[:, None], offset[:, None], quad[None, :],
                                             7 if PROBE == _PROBE_ROUNDS7 else 10,
                                             PTX and PROBE != _PROBE_LEGACY and PROBE != _PROBE_LEGACY_PHILOX)
        return gl.reshape(gl.join(gl.join(r0, r2), gl.join(r1, r3)), [r0.shape[0], HALF])

    @gluon.jit
    def _epilogue_half(acc_smem, acc_ready, acc_empty, phase, half: gl.constexpr, seed, offset, noise_scale,
                       tile_start, V_rows, vocab_size, vocab_start, offs_b, mask_b, bm_ptr, bm_stride, ent_ptr,
                       val_ptr, ent_stride, start, n, head, head_val, rep, freq, pres, HALF: gl.constexpr,
                       NOISE: gl.constexpr, FAST_LOG: gl.constexpr, quad_layout: gl.constexpr,
                       BITMASK: gl.constexpr, SPARSE: gl.constexpr, PINNED: gl.constexpr,
                       LATE_NOISE: gl.constexpr, PROBE: gl.constexpr = 0, WAITS: gl.constexpr = False,
                       inv_t=None, STATS: gl.constexpr = False, EXTENDED: gl.constexpr = False,
                       WINNER_LOGIT: gl.constexpr = False, RAW_SUM: gl.constexpr = False, draw=True,
                       SKIP: gl.constexpr = False):
        """(best score, best column, any NaN / +inf logit) of one HALF-wide column slice of the tile,
        its (processed) logits and columns, and the cycles spent waiting for the half (WAITS; else 0); then with
        STATS (the 128-row tile) the half's logprob / kept-logit fields (_half_stats), taken from the processed
        logits before the noise is drawn (LATE_NOISE: the top-4 search's temporaries and the noise's are not live
        together), the winner's logit after it; else placeholders. SKIP (a filtered call's
        skip_filtered_noise): ``draw`` is the tile's verdict (epilogue.rows_draw_noise over its rows), and a tile
        that draws no noise scores each id by its logit; the bits are then drawn late, under that verdict."""
        # The noise's layout (Philox quads joined into columns); with LATE_NOISE the bits themselves are drawn
        # after the logits are processed, so they and the processors' temporaries are not live together.
        gl.static_assert(LATE_NOISE or not SKIP, "a tile that may skip the noise draws its bits late")
        zq = gl.zeros([seed.shape[0], HALF // 4], gl.int32, quad_layout)
        lay: gl.constexpr = gl.reshape(gl.join(gl.join(zq, zq), gl.join(zq, zq)), [seed.shape[0], HALF]).type.layout
        if not LATE_NOISE:
            bits = _half_bits(seed, offset, vocab_start + tile_start + half * HALF, HALF, quad_layout, PROBE,
                              FAST_LOG)
        col = half * HALF + gl.arange(0, HALF, gl.SliceLayout(0, lay))
        gid = vocab_start + tile_start + col
        valid = (gid < vocab_size) & (tile_start + col < V_rows)
        # The bitmask needs only the rows: each row's three words over the half, loaded before the
        # logits are awaited (the entries' slices and heads were loaded at the tile's start).
        rows = gl.convert_layout(offs_b, gl.SliceLayout(1, lay))
        rmask = gl.convert_layout(mask_b, gl.SliceLayout(1, lay))
        first_id = vocab_start + tile_start + half * HALF
        if BITMASK:
            w0, w1, w2 = span_words(bm_ptr, bm_stride, rows, rmask, first_id, vocab_size)
        # The half's logits, then the buffer goes straight back to the MMA warpgroup.
        w = _wait_counted(acc_ready, phase, phase.to(gl.int64) * 0, WAITS)
        logit = acc_smem.load(lay)
        mbarrier.arrive(acc_empty)
        logit = gl.where(valid[None, :], logit, float("-inf"))
        bad = gl.max(((logit != logit) | (logit == float("inf"))).to(gl.int32), axis=1)
        if BITMASK:
            logit = gl.where(span_allowed(w0, w1, w2, first_id, gid), logit, float("-inf"))
        if SPARSE:
            # processors.process_tile on the half, its first HEAD_N entries from registers (the rest, rare,
            # from the list); the bitmask is applied above. The same processed logits as the Triton kernel's.
            row_lay: gl.constexpr = gl.SliceLayout(1, lay)
            hcol = gl.arange(0, HEAD_N, gl.SliceLayout(0, lay))
            st = gl.convert_layout(start, row_lay)
            logit = process_tile(logit, rows, rmask, gid, valid, bm_ptr, bm_stride, ent_ptr, val_ptr, ent_stride,
                                 st, gl.convert_layout(n, row_lay), gl.convert_layout(head, lay),
                                 gl.convert_layout(head_val, lay), hcol, gl.convert_layout(rep, row_lay),
                                 gl.convert_layout(freq, row_lay), gl.convert_layout(pres, row_lay), st,
                                 False, True, HEAD_N, False, PINNED)
        if STATS:
            m, s, r, v0, v1, v2, v3, c0, c1, c2, c3, bnd = _half_stats(logit, col, inv_t, EXTENDED, RAW_SUM)
        if NOISE:
            if draw:  # (True, or with SKIP the tile's verdict: a branch taken by the whole tile)
                if LATE_NOISE:
                    bits = _half_bits(seed, offset, vocab_start + tile_start + half * HALF, HALF, quad_layout, PROBE,
                                      FAST_LOG)
                if PROBE == _PROBE_PHILOX:  # (benchmarks) the bits without the logs: one conversion keeps Philox live
                    g = (bits & 0xFFFF).to(gl.float32) * 1e-6
                elif PROBE == _PROBE_LEGACY:  # (benchmarks) the same bits from the instructions before v97
                    g = gumbel_from_bits(bits, LEGACY_PTX if FAST_LOG else FAST_LOG)
                else:
                    g = gumbel_from_bits(bits, FAST_LOG)
                score = perturb(logit, gl.convert_layout(noise_scale, gl.SliceLayout(1, lay))[:, None], g, FAST_LOG)
            else:
                score = logit
        else:
            score = logit
        best, at = _argmax_lowest(score, col)
        if STATS:
            wl = m  # (a placeholder without WINNER_LOGIT)
            if WINNER_LOGIT:
                wl = gl.max(gl.where(col[None, :] == at[:, None], logit, float("-inf")), axis=1)
        else:  # placeholders nothing reads
            m = best
            c0 = at
            s, r, wl, v0, v1, v2, v3, c1, c2, c3, bnd = m, m, m, m, m, m, m, c0, c0, c0, m
        return best, at, bad, logit, col, w, m, s, r, wl, v0, v1, v2, v3, c0, c1, c2, c3, bnd

    @gluon.jit
    def _epilogue_half_chunked(acc_smem, base: gl.constexpr, acc_ready, acc_empty, phase, half: gl.constexpr, seed,
                               offset, noise_scale, tile_start, V_rows, vocab_size, vocab_start, HALF: gl.constexpr,
                               CHUNK: gl.constexpr, NOISE: gl.constexpr, FAST_LOG: gl.constexpr,
                               quad_layout: gl.constexpr, WAITS: gl.constexpr = False):
        """_epilogue_half's (best score, best column, any NaN / +inf logit) for a plain call (no logprobs, kept logits
        or processors), CHUNK columns at a time from buffers base .. base + HALF / CHUNK - 1 in a loop that is not
        unrolled: the same results from a fraction of the code (v89: the unrolled noise's SASS slows the MMA
        warpgroup's loop beside it). Chunks come in column order and a later one wins only when strictly larger, so
        ties still go to the lowest column. Also the cycles spent waiting for the half (WAITS; else 0)."""
        zq = gl.zeros([seed.shape[0], CHUNK // 4], gl.int32, quad_layout)
        lay: gl.constexpr = gl.reshape(gl.join(gl.join(zq, zq), gl.join(zq, zq)), [seed.shape[0], CHUNK]).type.layout
        row_lay: gl.constexpr = gl.SliceLayout(1, lay)
        cols = gl.arange(0, CHUNK, gl.SliceLayout(0, lay))
        scale = gl.convert_layout(noise_scale, row_lay)[:, None]
        best = gl.full([seed.shape[0]], float("-inf"), gl.float32, row_lay)
        at = gl.full([seed.shape[0]], half * HALF, gl.int32, row_lay)
        bad = gl.zeros([seed.shape[0]], gl.int32, row_lay)
        first_id = vocab_start + tile_start + half * HALF
        w = _wait_counted(acc_ready, phase, phase.to(gl.int64) * 0, WAITS)
        for c in range(HALF // CHUNK):
            # ptxas unrolls a loop of a known trip count; the pragma (in the loop's first block) keeps one copy
            cc = gl.inline_asm_elementwise('.pragma "nounroll";\n mov.b32 $0, $1;', "=r,r", [c], dtype=gl.int32,
                                           is_pure=True, pack=1)
            col = half * HALF + cc * CHUNK + cols
            valid = (vocab_start + tile_start + col < vocab_size) & (tile_start + col < V_rows)
            logit = gl.where(valid[None, :], acc_smem.index(base + cc).load(lay), float("-inf"))
            bad = gl.maximum(bad, gl.max(((logit != logit) | (logit == float("inf"))).to(gl.int32), axis=1))
            if NOISE:
                g = gumbel_from_bits(_half_bits(seed, offset, first_id + cc * CHUNK, CHUNK, quad_layout, 0, FAST_LOG),
                                     FAST_LOG)
                score = perturb(logit, scale, g, FAST_LOG)
            else:
                score = logit
            chunk_best, chunk_at = _argmax_lowest(score, col)
            take = chunk_best > best
            best = gl.where(take, chunk_best, best)
            at = gl.where(take, chunk_at, at)
        mbarrier.arrive(acc_empty)
        return best, at, bad, w

    @gluon.jit
    def _take_largest(x, col):
        """The largest value of each row of x (lowest column among equal ones), its column, and x without it."""
        m, c = _argmax_lowest(x, col)
        return m, c, gl.where(col[None, :] == c[:, None], float("-inf"), x)

    @gluon.jit
    def _pick4(i, x0, x1, x2, x3):
        return gl.where(i == 0, x0, gl.where(i == 1, x1, gl.where(i == 2, x2, x3)))

    @gluon.jit
    def _half_top4(x, col):
        """epilogue.tile_topk of one column half, KEEP = 4: values and columns largest first, boundary."""
        v0, c0, x = _take_largest(x, col)
        v1, c1, x = _take_largest(x, col)
        v2, c2, x = _take_largest(x, col)
        v3, c3, x = _take_largest(x, col)
        return v0, v1, v2, v3, c0, c1, c2, c3, gl.max(x, axis=1)

    @gluon.jit
    def _merged_slot(ia, ib, a0, a1, a2, a3, ac0, ac1, ac2, ac3, b0, b1, b2, b3, bc0, bc1, bc2, bc3):
        """The next slot of two merged kept lists (A: the left half's, B: the right half's; heads at ia, ib):
        the larger head, A's on equal values (its columns are the lower ones), and the advanced heads."""
        av = _pick4(ia, a0, a1, a2, a3)
        bv = _pick4(ib, b0, b1, b2, b3)
        take_a = av >= bv
        v = gl.where(take_a, av, bv)
        c = gl.where(take_a, _pick4(ia, ac0, ac1, ac2, ac3), _pick4(ib, bc0, bc1, bc2, bc3))
        return v, c, ia + take_a.to(gl.int32), ib + (~take_a).to(gl.int32)

    @gluon.jit
    def _half_stats(logit, col, inv_t, EXTENDED: gl.constexpr, RAW_SUM: gl.constexpr):
        """One column half's share of the logprob and kept-logit fields (the 128-row tile, whose epilogue has no
        registers to hold the first half's logits beside the second's): the half's max m, its sums shifted by m
        (scaled by 1 / T, and raw when EXTENDED and RAW_SUM; 0 for an all -inf half), and its 4 largest logits,
        their columns and boundary (EXTENDED). Fields a flag leaves out hold m (columns 0). _merge_sums rescales the
        sums to the tile's max; the winner's logit, which needs the noise, is _epilogue_half's."""
        lay: gl.constexpr = logit.type.layout
        m = gl.max(logit, axis=1)
        it = gl.convert_layout(inv_t, gl.SliceLayout(1, lay))
        s = scaled_sum(logit, True, m, it)
        r = m
        if EXTENDED and RAW_SUM:
            r = raw_sum(logit, True, m)
        if EXTENDED:
            v0, v1, v2, v3, c0, c1, c2, c3, bnd = _half_top4(logit, col)
        else:  # placeholders nothing reads
            c0 = gl.zeros_like(m).to(gl.int32)
            v0, v1, v2, v3, c1, c2, c3, bnd = m, m, m, m, c0, c0, c0, m
        return m, s, r, v0, v1, v2, v3, c0, c1, c2, c3, bnd

    @gluon.jit
    def _merge_sums(m0, sum0, m1, sum1, tmax, it):
        """Two halves' sums, each shifted by its own max (m0, m1), as one sum shifted by the tile's max tmax: each
        half's sum times exp((m - tmax) * it) (it = 1 / T, or 1 for raw sums). The same sum as one pass over the
        tile up to the fp32 rounding of the products. A half with nothing to add (all -inf, or all NaN: its max is
        then NaN, which the factor must not carry into the sum) adds 0; a +inf logit gives NaN, as one pass does."""
        safe = gl.where(tmax == float("-inf"), 0.0, tmax)
        t0 = gl.where(sum0 == 0.0, 0.0, sum0 * gl.exp((m0 - safe) * it))
        t1 = gl.where(sum1 == 0.0, 0.0, sum1 * gl.exp((m1 - safe) * it))
        return t0 + t1

    @gluon.jit
    def _epilogue_partition(acc_smem, acc_ready, acc_empty, seed_ptr, seed_val, offset_ptr, offset_val, temp_ptr,
                            temp_val, cand_f, cand_i, B, V_rows, vocab_size, vocab_start, buf_offset, buf_offset_i,
                            stride_slot, n_btiles, n_tiles, stride_field, stride_ifield, bm_ptr, bm_stride, ent_ptr,
                            val_ptr, ent_stride, ent_width, search_steps, pen_ptr, pen_stride, parity_ptr,
                            parity_stride_f, parity_stride_i, hdr_off_i, flags, xfp_ptr, xfp_val, topk_ptr,
                            topk_val, topp_ptr, topp_val,
                            BLOCK_B: gl.constexpr, BLOCK_V: gl.constexpr, EPI_WARPS: gl.constexpr,
                            SEED_PER_ROW: gl.constexpr, OFFSET_PER_ROW: gl.constexpr, TEMP_PER_ROW: gl.constexpr,
                            NOISE: gl.constexpr, FAST_LOG: gl.constexpr, ROW_THREADS: gl.constexpr,
                            LOGPROBS: gl.constexpr, EXTENDED: gl.constexpr, WINNER_LOGIT: gl.constexpr,
                            RAW_SUM: gl.constexpr, BITMASK: gl.constexpr, SPARSE: gl.constexpr,
                            PINNED: gl.constexpr, PEER_TABLE: gl.constexpr, NPEERS: gl.constexpr,
                            DEVICE_PARITY: gl.constexpr, HEADER: gl.constexpr, XFP_PER_ROW: gl.constexpr,
                            ROTATE: gl.constexpr, NOISE_PROBE: gl.constexpr, ACC_BUFS: gl.constexpr,
                            EPI_CHUNK: gl.constexpr, wait_ptr, WAITS: gl.constexpr, SKIP_NOISE: gl.constexpr,
                            TOPK_PER_ROW: gl.constexpr, TOPP_PER_ROW: gl.constexpr):
        HALF: gl.constexpr = BLOCK_V // 2
        # The 128-row tile takes each half's logprob / kept-logit fields as the half arrives (_half_stats); the
        # 64-row tile holds both halves' logits and takes them over the whole tile.
        PER_HALF: gl.constexpr = LOGPROBS and BLOCK_B > 64
        # the copy of a double buffer this call writes (parity.py), read once
        buf_offset, buf_offset_i = parity_offsets(buf_offset, buf_offset_i, parity_ptr, parity_stride_f,
                                                  parity_stride_i, DEVICE_PARITY)
        # Philox quads of a half tile, [BLOCK_B, HALF / 4]: a warp spans ROW_THREADS rows, so each
        # thread keeps few rows' keys and counters (the per-row state is what crowds the registers).
        quad_layout: gl.constexpr = gl.BlockedLayout([1, 1], [ROW_THREADS, 32 // ROW_THREADS], [EPI_WARPS, 1],
                                                     [1, 0])
        row_layout: gl.constexpr = gl.SliceLayout(1, quad_layout)
        hc = 0
        w_acc = gl.program_id(0).to(gl.int64) * 0
        if WAITS:
            c_start = sm_clock(hc)
        for t in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
            pid_b, pid_v = _tile_coords(t, n_btiles, ROTATE)
            offs_b = pid_b * BLOCK_B + gl.arange(0, BLOCK_B, row_layout)
            mask_b = offs_b < B
            temp = load_row_param(temp_ptr, temp_val, offs_b, mask_b, gl.float32, TEMP_PER_ROW)
            seed = load_row_param(seed_ptr, seed_val, offs_b, mask_b, gl.int64, SEED_PER_ROW)
            offset = load_row_param(offset_ptr, offset_val, offs_b, mask_b, gl.int64, OFFSET_PER_ROW)
            inv_t, noise_scale, _greedy, bad_temp = row_temperature(temp)
            draw = True
            if SKIP_NOISE:
                # a filtered call (launch_fused's skip_filtered_noise): the tile draws noise only if one of its rows
                # has a reader for it (epilogue.rows_draw_noise)
                draw = tile_draws_noise(noise_scale, topk_ptr, topk_val, topp_ptr, topp_val, offs_b, mask_b,
                                        vocab_size, TOPK_PER_ROW, TOPP_PER_ROW)
            if HEADER:
                # The call's header (step_check.py), written with the first vocabulary tile of each batch tile,
                # as fused_sample_kernel writes it (the rows' fingerprints, one step record), before the logits
                # are awaited, so that none of its temporaries is live beside them.
                if pid_v == 0:
                    xfp = load_row_param(xfp_ptr, xfp_val, offs_b, mask_b, gl.int64, XFP_PER_ROW)
                    write_row_fingerprints(cand_i, buf_offset_i + hdr_off_i, offs_b, mask_b, seed, offset ^ xfp, temp,
                                           PEER_TABLE, NPEERS)
                    if pid_b == 0:
                        write_record_words(cand_i, buf_offset_i + hdr_off_i + stride_slot,
                                           gl.arange(0, 4, row_layout), parity_ptr, B, flags, 0, PEER_TABLE, NPEERS)
            tile_start = pid_v * BLOCK_V
            rep, freq, pres = row_penalties(pen_ptr, pen_stride, offs_b, mask_b, SPARSE)  # (1, 0, 0) without
            # Each row's bias / penalty entries of the two column halves (one 3-key search) and their first
            # HEAD_N entries: a few rounds of loads issued before the tile's logits are awaited.
            hcol = gl.arange(0, HEAD_N, gl.SliceLayout(0, quad_layout))
            if SPARSE:
                probes = gl.arange(0, _PROBES, gl.SliceLayout(0, quad_layout)) + 1
                s0, n0, s1, n1 = split_slices(ent_ptr, ent_stride, ent_width, search_steps, offs_b, mask_b,
                                              vocab_start + tile_start, probes, HALF)
                h0, hv0 = slice_heads(ent_ptr, val_ptr, ent_stride, offs_b, s0, n0, hcol)
                h1, hv1 = slice_heads(ent_ptr, val_ptr, ent_stride, offs_b, s1, n1, hcol)
            else:  # placeholders the halves never read
                s0 = offs_b
                n0 = offs_b
                s1 = offs_b
                n1 = offs_b
                h0 = offs_b[:, None] + hcol[None, :]
                hv0 = rep[:, None] + hcol[None, :].to(gl.float32)
                h1 = h0
                hv1 = hv0

            # the halves' buffers and phases (_mma_tile's hand-off numbering; J1: the right half's buffer)
            J1: gl.constexpr = ACC_BUFS - 1
            p0, p1 = _hand_off_phases(hc, ACC_BUFS)
            if EPI_CHUNK > 0:
                NCH: gl.constexpr = HALF // EPI_CHUNK
                best0, at0, bad0, wa0 = _epilogue_half_chunked(acc_smem, 0, acc_ready.index(0), acc_empty.index(0),
                                                               p0, 0, seed, offset, noise_scale, tile_start, V_rows,
                                                               vocab_size, vocab_start, HALF, EPI_CHUNK, NOISE,
                                                               FAST_LOG, quad_layout, WAITS)
                best1, at1, bad1, wa1 = _epilogue_half_chunked(acc_smem, J1 * NCH, acc_ready.index(J1),
                                                               acc_empty.index(J1), p1, 1, seed, offset, noise_scale,
                                                               tile_start, V_rows, vocab_size, vocab_start, HALF,
                                                               EPI_CHUNK, NOISE, FAST_LOG, quad_layout, WAITS)
            else:
                # (LATE_NOISE: bias / penalty entries on 128 rows, or the fields taken per half before the noise, or a
                # tile that may skip the noise: its bits drawn under the tile's verdict)
                late: gl.constexpr = (SPARSE and BLOCK_B > 64) or PER_HALF or SKIP_NOISE
                (best0, at0, bad0, l0, col0, wa0, m0, sum0, raw0, wl0, a0, a1, a2, a3, ac0, ac1, ac2, ac3,
                 abnd) = _epilogue_half(acc_smem.index(0), acc_ready.index(0), acc_empty.index(0), p0, 0, seed,
                                        offset, noise_scale, tile_start, V_rows, vocab_size, vocab_start, offs_b,
                                        mask_b, bm_ptr, bm_stride, ent_ptr, val_ptr, ent_stride, s0, n0, h0, hv0,
                                        rep, freq, pres, HALF, NOISE, FAST_LOG, quad_layout, BITMASK, SPARSE,
                                        PINNED, late, NOISE_PROBE, WAITS, inv_t, PER_HALF, EXTENDED,
                                        WINNER_LOGIT, RAW_SUM, draw, SKIP_NOISE)
                (best1, at1, bad1, l1, col1, wa1, m1, sum1, raw1, wl1, b0, b1, b2, b3, bc0, bc1, bc2, bc3,
                 bbnd) = _epilogue_half(acc_smem.index(J1), acc_ready.index(J1), acc_empty.index(J1), p1, 1, seed,
                                        offset, noise_scale, tile_start, V_rows, vocab_size, vocab_start, offs_b,
                                        mask_b, bm_ptr, bm_stride, ent_ptr, val_ptr, ent_stride, s1, n1, h1, hv1,
                                        rep, freq, pres, HALF, NOISE, FAST_LOG, quad_layout, BITMASK, SPARSE,
                                        PINNED, late, NOISE_PROBE, WAITS, inv_t, PER_HALF, EXTENDED,
                                        WINNER_LOGIT, RAW_SUM, draw, SKIP_NOISE)
            hc += 2
            w_acc += wa0 + wa1
            dst = buf_offset + pid_v * stride_slot + offs_b
            dst_i = buf_offset_i + pid_v * stride_slot + offs_b
            # Merge the halves: the second wins only when strictly larger (ties to the lower id).
            take1 = best1 > best0
            best = gl.convert_layout(gl.where(take1, best1, best0), row_layout)
            at = gl.convert_layout(gl.where(take1, at1, at0), row_layout)
            bad = gl.convert_layout((bad0 | bad1) > 0, row_layout)
            poisoned = bad | bad_temp
            score = gl.where(poisoned, float("nan"), best)
            idx = gl.where(poisoned, -1, vocab_start + tile_start + at).to(gl.int32)
            store_fan_out(cand_f, dst, score, mask_b, gl.float32, PEER_TABLE, NPEERS)
            store_fan_out(cand_i, dst_i, idx, mask_b, gl.int32, PEER_TABLE, NPEERS)
            if LOGPROBS:
                # epilogue.tile_stats / raw_sum over both halves: the 64-row tile holds the first half's logits until
                # the second arrives (each exp needs the whole tile's max), the 128-row tile rescales each half's
                # sums (_merge_sums). The halves' padding is -inf already, so every column counts as valid.
                if PER_HALF:
                    tmax = gl.maximum(m0, m1)
                    it = gl.convert_layout(inv_t, tmax.type.layout)
                    tsum = _merge_sums(m0, sum0, m1, sum1, tmax, it)
                else:
                    lay: gl.constexpr = l0.type.layout
                    tmax = gl.maximum(gl.max(l0, axis=1), gl.max(l1, axis=1))
                    it = gl.convert_layout(inv_t, gl.SliceLayout(1, lay))
                    tsum = scaled_sum(l0, True, tmax, it) + scaled_sum(l1, True, tmax, it)
                store_fan_out(cand_f, 2 * stride_field + dst, gl.convert_layout(tmax, row_layout), mask_b,
                              gl.float32, PEER_TABLE, NPEERS)
                store_fan_out(cand_f, 3 * stride_field + dst, gl.convert_layout(tsum, row_layout), mask_b,
                              gl.float32, PEER_TABLE, NPEERS)
                if WINNER_LOGIT:
                    if not PER_HALF:
                        wl0 = gl.max(gl.where(col0[None, :] == at0[:, None], l0, float("-inf")), axis=1)
                        wl1 = gl.max(gl.where(col1[None, :] == at1[:, None], l1, float("-inf")), axis=1)
                    wl = gl.convert_layout(gl.where(best1 > best0, wl1, wl0), row_layout)
                else:  # field 1 only feeds the winner's logprob, which this call does not return
                    wl = score
                store_fan_out(cand_f, 1 * stride_field + dst, wl, mask_b, gl.float32, PEER_TABLE, NPEERS)
            if EXTENDED:
                # epilogue.tile_topk: each half's 4 largest (the halves' columns never interleave), merged.
                if not PER_HALF:
                    a0, a1, a2, a3, ac0, ac1, ac2, ac3, abnd = _half_top4(l0, col0)
                    b0, b1, b2, b3, bc0, bc1, bc2, bc3, bbnd = _half_top4(l1, col1)
                ia = gl.zeros_like(ac0)
                ib = gl.zeros_like(bc0)
                id0 = vocab_start + tile_start
                for j in gl.static_range(4):
                    v, c, ia, ib = _merged_slot(ia, ib, a0, a1, a2, a3, ac0, ac1, ac2, ac3, b0, b1, b2, b3,
                                                bc0, bc1, bc2, bc3)
                    store_fan_out(cand_f, (5 + j) * stride_field + dst, gl.convert_layout(v, row_layout), mask_b,
                                  gl.float32, PEER_TABLE, NPEERS)
                    store_fan_out(cand_i, (1 + j) * stride_ifield + dst_i, gl.convert_layout(id0 + c, row_layout),
                                  mask_b, gl.int32, PEER_TABLE, NPEERS)
                # the boundary: the larger of the lists' next heads (a list used up: its own boundary)
                na = gl.where(ia == 4, abnd, _pick4(ia, a0, a1, a2, a3))
                nb = gl.where(ib == 4, bbnd, _pick4(ib, b0, b1, b2, b3))
                store_fan_out(cand_f, 9 * stride_field + dst, gl.convert_layout(gl.maximum(na, nb), row_layout),
                              mask_b, gl.float32, PEER_TABLE, NPEERS)
                if RAW_SUM:
                    if PER_HALF:
                        rsum = _merge_sums(m0, raw0, m1, raw1, tmax, gl.full_like(tmax, 1.0))
                    else:
                        rsum = raw_sum(l0, True, tmax) + raw_sum(l1, True, tmax)
                    store_fan_out(cand_f, 4 * stride_field + dst, gl.convert_layout(rsum, row_layout), mask_b,
                                  gl.float32, PEER_TABLE, NPEERS)
                else:  # only "raw" logprobs read it: NaN, so that a wrong reader shows
                    store_fan_out(cand_f, 4 * stride_field + dst,
                                  gl.full([BLOCK_B], float("nan"), gl.float32, row_layout), mask_b, gl.float32,
                                  PEER_TABLE, NPEERS)
        if WAITS:  # (launch_fused_ws's wait_probe) the epilogue's cycles in all, and waiting for the accumulator
            row = wait_ptr + gl.program_id(0) * WAIT_FIELDS
            gl.store(row + 6, sm_clock(hc) - c_start)
            gl.store(row + 7, w_acc)

    # (one compile whatever a scalar top-k, which Triton would specialise at 1 and 16 * n)
    @gluon.jit(do_not_specialize=["topk_val"])
    def fused_sample_ws_kernel(h_desc, hl_desc, w_desc, seed_ptr, seed_val, offset_ptr, offset_val, temp_ptr, temp_val,
                               cand_f, cand_i, B, V_rows, vocab_size, vocab_start, buf_offset, buf_offset_i,
                               stride_slot, n_btiles, n_tiles, k_steps, stride_field, stride_ifield,
                               bm_ptr, bm_stride, ent_ptr, val_ptr, ent_stride, ent_width, search_steps, pen_ptr,
                               pen_stride, parity_ptr, parity_stride_f, parity_stride_i, hdr_off_i, flags, xfp_ptr,
                               xfp_val, STAGES: gl.constexpr, BLOCK_B: gl.constexpr, EPI_WARPS: gl.constexpr,
                               EPI_REGS: gl.constexpr, LOAD_REGS: gl.constexpr,
                               SEED_PER_ROW: gl.constexpr, OFFSET_PER_ROW: gl.constexpr, TEMP_PER_ROW: gl.constexpr,
                               NOISE: gl.constexpr, FAST_LOG: gl.constexpr, ROW_THREADS: gl.constexpr = 8,
                               LOGPROBS: gl.constexpr = False, EXTENDED: gl.constexpr = False,
                               WINNER_LOGIT: gl.constexpr = False, RAW_SUM: gl.constexpr = False,
                               BITMASK: gl.constexpr = False, SPARSE: gl.constexpr = False,
                               PINNED: gl.constexpr = False, PEER_TABLE: gl.constexpr = False,
                               NPEERS: gl.constexpr = 1, DEVICE_PARITY: gl.constexpr = False,
                               HEADER: gl.constexpr = False, XFP_PER_ROW: gl.constexpr = False,
                               H_BOXES: gl.constexpr = 1, LAST_BOXES: gl.constexpr = 0,
                               ROTATE: gl.constexpr = False, NOISE_PROBE: gl.constexpr = 0,
                               ACC_BUFS: gl.constexpr = 1, EPI_CHUNK: gl.constexpr = 0, wait_ptr=None,
                               WAITS: gl.constexpr = False, topk_ptr=None, topk_val=0, topp_ptr=None, topp_val=1.0,
                               SKIP_NOISE: gl.constexpr = False, TOPK_PER_ROW: gl.constexpr = False,
                               TOPP_PER_ROW: gl.constexpr = False):
        # BLOCK_B: the batch tile, loaded as one TMA box of the hidden, or (launch_fused_ws's box_rows: a one-tile
        # batch) as H_BOXES smaller boxes. LAST_BOXES (launch_fused_ws's last_box_rows): the batch's last tile, of
        # at most BLOCK_B / 2 rows, loaded as that many boxes of hl_desc's rows and multiplied as half a tile. ROTATE:
        # the batch tiles rotate by round (_tile_coords; persistent_grid).
        BLOCK_K: gl.constexpr = h_desc.block_type.shape[1]
        BLOCK_V: gl.constexpr = w_desc.block_type.shape[0]
        dtype: gl.constexpr = h_desc.dtype
        h_bufs = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_B, BLOCK_K], h_desc.layout)
        w_bufs = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_V, BLOCK_K], w_desc.layout)
        # The accumulator hand-off, swizzled so the wgmma layout's row-strided stores and the
        # epilogue's quad loads spread over the banks.
        if EPI_CHUNK > 0:
            # the chunked epilogue (plain calls): each column half in HALF / EPI_CHUNK buffers of EPI_CHUNK columns
            gl.static_assert(not (LOGPROBS or EXTENDED or BITMASK or SPARSE) and NOISE_PROBE == 0,
                             "the chunked epilogue serves plain calls only")
            NCH: gl.constexpr = BLOCK_V // 2 // EPI_CHUNK
            acc_smem = gl.allocate_shared_memory(gl.float32, [ACC_BUFS * NCH, BLOCK_B, EPI_CHUNK],
                                                 gl.SwizzledSharedLayout(4, 32 // EPI_CHUNK, EPI_CHUNK // 4,
                                                                         order=[1, 0]))
        else:
            NCH: gl.constexpr = 1
            acc_smem = gl.allocate_shared_memory(gl.float32, [ACC_BUFS, BLOCK_B, BLOCK_V // 2],
                                                 gl.SwizzledSharedLayout(4, 1, 8, order=[1, 0]))
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        acc_ready = gl.allocate_shared_memory(gl.int64, [ACC_BUFS, 1], mbarrier.MBarrierLayout())
        acc_empty = gl.allocate_shared_memory(gl.int64, [ACC_BUFS, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(ready.index(i), count=1)
            mbarrier.init(empty.index(i), count=1)
        for i in gl.static_range(ACC_BUFS):
            mbarrier.init(acc_ready.index(i), count=1)
            mbarrier.init(acc_empty.index(i), count=1)

        gl.warp_specialize([
            (_mma_partition, (h_bufs, w_bufs, ready, empty, acc_smem, acc_ready, acc_empty, n_btiles, n_tiles,
                              k_steps, BLOCK_B, BLOCK_V, STAGES, LAST_BOXES, ROTATE, ACC_BUFS, NCH, wait_ptr,
                              WAITS)),
            (_load_partition, (h_desc, hl_desc, w_desc, h_bufs, w_bufs, ready, empty, n_btiles, n_tiles, k_steps,
                               BLOCK_B, BLOCK_V, BLOCK_K, STAGES, H_BOXES, LAST_BOXES, ROTATE, wait_ptr, WAITS)),
            (_epilogue_partition, (acc_smem, acc_ready, acc_empty, seed_ptr, seed_val, offset_ptr, offset_val,
                                   temp_ptr, temp_val, cand_f, cand_i, B, V_rows, vocab_size, vocab_start,
                                   buf_offset, buf_offset_i, stride_slot, n_btiles, n_tiles, stride_field,
                                   stride_ifield, bm_ptr, bm_stride, ent_ptr, val_ptr, ent_stride, ent_width,
                                   search_steps, pen_ptr, pen_stride, parity_ptr, parity_stride_f, parity_stride_i,
                                   hdr_off_i, flags, xfp_ptr, xfp_val, topk_ptr, topk_val, topp_ptr, topp_val,
                                   BLOCK_B, BLOCK_V, EPI_WARPS, SEED_PER_ROW,
                                   OFFSET_PER_ROW, TEMP_PER_ROW, NOISE, FAST_LOG, ROW_THREADS, LOGPROBS, EXTENDED,
                                   WINNER_LOGIT, RAW_SUM, BITMASK, SPARSE, PINNED, PEER_TABLE, NPEERS, DEVICE_PARITY,
                                   HEADER, XFP_PER_ROW, ROTATE, NOISE_PROBE, ACC_BUFS, EPI_CHUNK, wait_ptr, WAITS,
                                   SKIP_NOISE, TOPK_PER_ROW, TOPP_PER_ROW)),
        ], [1, EPI_WARPS], [LOAD_REGS, EPI_REGS])


def hidden_boxes(batch: int, block_b: int, box_rows: int = 0) -> tuple:
    """(rows of the hidden's TMA box, boxes a stage loads) for ``batch`` rows on ``block_b``-row tiles: with box_rows
    and a batch of one partial tile, as few boxes of box_rows rows as cover the batch; else one box of block_b rows."""
    if not box_rows or batch >= block_b:
        return block_b, 1
    if box_rows % 8 or block_b % box_rows or box_rows <= 0:
        raise ValueError(f"box_rows must be a positive multiple of 8 dividing block_b ({block_b}), got {box_rows}")
    return box_rows, cdiv(batch, box_rows)


def last_tile_boxes(batch: int, block_b: int, last_box_rows: int = 0) -> tuple:
    """(rows of the last batch tile's TMA boxes, boxes a stage loads) for ``batch`` rows on ``block_b``-row tiles:
    with last_box_rows and a last tile of at most WGMMA_ROWS rows on the 128-row tile (half of it: one 64-row wgmma),
    as few boxes of last_box_rows rows as cover that tile's rows; else (0, 0), the last tile read and multiplied
    whole. A bad last_box_rows is refused whatever the batch."""
    if last_box_rows and (last_box_rows % 8 or WGMMA_ROWS % last_box_rows or last_box_rows < 0):
        raise ValueError(f"last_box_rows must be a positive multiple of 8 dividing {WGMMA_ROWS}, got {last_box_rows}")
    rest = batch % block_b
    if not last_box_rows or block_b != 2 * WGMMA_ROWS or rest == 0 or rest > WGMMA_ROWS:
        return 0, 0
    return last_box_rows, cdiv(rest, last_box_rows)


def new_wait_probe(device) -> torch.Tensor:
    """A blank ``wait_probe`` for :func:`launch_fused_ws` (benchmarks): int64 [one row per SM (at least
    :func:`persistent_grid`'s programs), WAIT_FIELDS], every field -1, so that a row no program wrote, or a field left
    unwritten, shows as -1 (and field 9, an atomic max, starts below every count)."""
    return torch.full((sm_count(device), WAIT_FIELDS.value), -1, dtype=torch.int64, device=device)


def persistent_grid(sms: int, n_btiles: int, n_tiles: int, short_last: bool, grid_cap: int = 0) -> tuple:
    """(persistent programs, rotate) of a launch of n_tiles tiles (n_btiles batch tiles a vocabulary tile) on ``sms``
    SMs, at most grid_cap programs (0: no cap). Program p runs tiles p, p + P, p + 2P, ... with the batch tile
    innermost, so where P and n_btiles have a common divisor (132 SMs, two batch tiles) a program visits some batch
    tiles only. Tiles that cost the same do not mind; with a short last tile (last_box_rows) half the programs would
    run only whole tiles and the other half only short ones, and the call would take as long as with whole tiles
    everywhere (v78's first probe). So with a short last tile: P programs, P a multiple of n_btiles, with each
    vocabulary tile's batch tiles rotating by the program's round (the kernel's ROTATE: a round's tiles are then whole
    groups, permuted within); else the most programs coprime with n_btiles (the rounds cycle every program through
    every batch tile; at most a few SMs idle, v78b). Without a short last tile: one program per SM (or the cap)."""
    cap = min(sms, grid_cap) if grid_cap else sms
    if not short_last or n_btiles <= 1:
        return min(n_tiles, cap), False
    if cap % n_btiles == 0:
        return min(n_tiles, cap), True  # (n_tiles is a multiple of n_btiles too)
    p = cap
    while p > 1 and math.gcd(p, n_btiles) != 1:
        p -= 1
    return min(n_tiles, p), False


def ws_device(device: torch.device, dtype: torch.dtype = None) -> bool:
    """Whether ``device`` runs this kernel at all (Gluon present, a CUDA sm_90 GPU, bf16 / fp16 operands; dtype None:
    assumed so): what a plan can know before it has the tensors (ws_supported checks the call itself)."""
    device = torch.device(device)
    if not HAVE_GLUON or device.type != "cuda" or torch.version.hip is not None:
        return False
    if dtype is not None and dtype not in (torch.bfloat16, torch.float16):
        return False
    return device_capability(device) == (9, 0)


def ws_supported(hidden: torch.Tensor, weight: torch.Tensor, params: RowParams, *, logprobs: bool = False,
                 extended: bool = False, block_v: int = WS_BLOCK_V, block_b: int = WS_BLOCK_B) -> bool:
    """Whether this call can run on the warp-specialised kernel: a Hopper GPU (sm_90: wgmma),
    bf16 / fp16 operands TMA can read, the 128-id vocabulary tile (with or without the tensor-parallel
    fan-out, device parity and call header); logprobs and kept logits (filters, top-N) with KEEP = 4 kept
    logits a tile; processors (bitmask, bias, penalties) only on the 64-row batch tile (its epilogue has the
    registers for their per-row state). Everything else keeps fused_sample_kernel. Every candidate layout and
    destination is supported. (launch_fused runs logprob / kept-logit calls on the 128-row tile only where
    configs.WS_FIELDS_FULL_TILE says.)"""
    if not ws_device(hidden.device, hidden.dtype) or weight.dtype != hidden.dtype:
        return False
    if (logprobs or extended) and KEEP != 4:
        return False
    if params.processing is not None and block_b != 64:
        return False
    if block_v != WS_BLOCK_V or hidden.shape[0] == 0:
        return False
    elem = hidden.element_size()
    return all(t.dim() == 2 and t.stride(1) == 1 and t.data_ptr() % 16 == 0 and (t.stride(0) * elem) % 16 == 0
               for t in (hidden, weight))


def launch_fused_ws(hidden: torch.Tensor, weight: torch.Tensor, params: RowParams, layout: CandidateLayout,
                    dest: BufferPair, *, vocab_size: int, vocab_start: int = 0, shard: int = 0,
                    stages: int = WS_STAGES, row_threads: int = WS_ROW_THREADS,
                    epilogue_warps: int = WS_EPILOGUE_WARPS, grid_cap: int = 0, epilogue_only: bool = False,
                    block_b: int = WS_BLOCK_B, logprobs: bool = False, extended: bool = False,
                    raw_sums: bool = True, winner_logit: bool = False, batch: int = None,
                    flags: int = None, box_rows: int = 0, last_box_rows: int = 0, noise_probe: str = "",
                    acc_buffers: int = 1, epilogue_chunk: int = 0, wait_probe: torch.Tensor = None,
                    skip_filtered_noise: bool = False) -> None:
    """Write every (row, vocabulary tile)'s candidate of ``hidden @ weight.T`` into block ``shard``
    of ``dest``, as launch_fused does with the same TMA tile. The caller checks
    :func:`ws_supported` first. grid_cap: at most this many persistent programs (0: one per SM).
    epilogue_only (benchmarks): skip the main loop (zero logits), to time the epilogue alone. noise_probe
    (benchmarks; not the sampler: other tokens): "philox" the Philox bits without the two logs, "logs" the logs
    of a cheap hash instead of Philox, "rounds7" Philox with 7 rounds instead of 10, "legacy" the sampler's noise
    from the instructions before v97 (the same candidates; NOISE_PROBES), "legacy_philox" only its Philox in them.
    acc_buffers: the accumulator's hand-off to the epilogue through one 32 KB buffer, a column half at a time (1), or
    a buffer per half (2, 64 KB: the MMA warpgroup stores the second half without waiting for the epilogue to read
    the first); the same candidates. epilogue_chunk (plain calls: no logprobs, kept logits or processors): the
    epilogue takes each column half this many columns (16 or 32) at a time in a loop kept rolled, a fraction of the
    unrolled code (0: the whole half at once); the same candidates.
    wait_probe (benchmarks): an int64 CUDA tensor [programs, WAIT_FIELDS] (programs: :func:`persistent_grid`'s) that
    each program fills with cycle counts (%clock64): field 0 the MMA warpgroup's cycles in all, 1 of them waiting for
    operand stages (while the previous k-step's wgmma may still run), 2 waiting for the epilogue to free the hand-off
    buffer, 3 its tiles, 8 waiting for its wgmmas to retire; 4 the load warp's cycles in all, 5 of them waiting for
    free stages; 6 the epilogue's cycles in all, 7 of them waiting for the accumulator's halves; 9 the most any thread
    of the MMA warpgroup waited for its wgmmas to retire (fields 0-3 and 8 are one thread's, of warp 0). Two clock
    reads per wait (other instructions the compiler schedules between a read and its wait count as waiting); the
    same candidates.
    block_b: the batch tile, 128 or 64 (one wgmma of 64 rows per k-step instead of two; the same
    candidates: each row's products and their order do not depend on it). logprobs / extended /
    raw_sums / winner_logit as launch_fused's: the winner's logit with logprobs or
    winner_logit, the tile's (max, sum) with logprobs or extended, the kept logits, their ids and the
    boundary with extended, the raw sums unless raw_sums is False. The sums add the two column halves' partial
    sums (on 128-row tiles each shifted by its half's max, then rescaled to the tile's), so they may differ
    from the Triton kernel's in the last bits; every other field is the same bit for bit.
    params.processing: the logits are processed as the Triton kernel's (ws_supported sends processors to
    64-row tiles only; on 128-row tiles the epilogue spills registers, for benchmarks).
    batch: the rows to sample when ``hidden`` is padded with extra rows (launch_fused passes the padded operand
    the copy engine reads; the candidates, and a header's batch and fingerprints, are those of
    ``hidden[:batch]``); default all of hidden's rows.
    dest: this process's buffers or, with ``dest.npeers``, every tensor-parallel peer's (the fan-out), the copy
    of a double buffer ``dest.parity`` picks; a checked layout gets the call's header (step_check.py) with
    ``flags`` (default: the flags of this launch's options), as launch_fused's.
    box_rows: a batch of one partial tile (fewer rows than ``block_b``) reads the hidden in boxes of this many rows
    (a multiple of 8 dividing block_b), as many as its rows need, and zeroes the tile's rows past them once in shared
    memory, instead of one box of block_b rows reaching past the hidden's end (the copy engine's slow zero fill,
    docs/performance.md v35 / v65) or a zero-padded copy (``fused_sample.tile_operand``: one launch more); the same
    candidates. 0 (default), or a batch of whole tiles: one box of block_b rows.
    last_box_rows: on 128-row tiles, a batch whose last tile holds at most 64 rows reads that tile in boxes of this
    many rows (a multiple of 8 dividing 64; :func:`last_tile_boxes`) and multiplies it as a 64-row tile (one wgmma a
    k-step instead of two; each row's products the same), instead of a whole tile on a padded hidden: the same
    candidates for half the tile's MMA work (the epilogue still runs the tile's 128 rows, the unused ones never
    stored; the grid: :func:`persistent_grid`). It also needs the hidden's own rows; 0 (default), or another batch: the
    last tile whole.
    skip_filtered_noise: as launch_fused's (a tile whose rows all get their token elsewhere draws no noise)."""
    if block_b not in (64, 128):
        raise ValueError(f"block_b must be 64 or 128, got {block_b}")
    if acc_buffers not in (1, 2):
        raise ValueError(f"acc_buffers must be 1 or 2, got {acc_buffers}")
    if epilogue_chunk not in (0, 16, 32):
        raise ValueError(f"epilogue_chunk must be 0, 16 or 32, got {epilogue_chunk}")
    if epilogue_chunk and (logprobs or extended or params.processing is not None or noise_probe):
        raise ValueError("epilogue_chunk serves plain calls only (no logprobs, kept logits, processors or noise_probe)")
    if noise_probe not in NOISE_PROBES:
        raise ValueError(f"noise_probe must be one of {sorted(NOISE_PROBES)}, got {noise_probe!r}")
    if wait_probe is not None and (wait_probe.dtype != torch.int64 or wait_probe.dim() != 2
                                   or wait_probe.shape[1] != WAIT_FIELDS.value or not wait_probe.is_contiguous()):
        raise ValueError(f"wait_probe must be a contiguous int64 tensor [programs, {WAIT_FIELDS.value}], got "
                         f"{tuple(wait_probe.shape)} {wait_probe.dtype}")
    if extended and not layout.extended:
        raise ValueError("kept logits need an extended candidate layout")
    B, D = hidden.shape
    if batch is not None:
        if not 0 < batch <= B:
            raise ValueError(f"batch must be in [1, {B}] (hidden's rows), got {batch}")
        B = batch
    V_rows = weight.shape[0]
    n_vtiles = layout.check_fit(B, V_rows, WS_BLOCK_V, shard, vocab_start)
    n_btiles = cdiv(B, block_b)
    n_tiles = n_btiles * n_vtiles
    gdt = gl.bfloat16 if hidden.dtype == torch.bfloat16 else gl.float16
    smem = gl.NVMMASharedLayout.get_default_for([block_b, WS_BLOCK_K], gdt)
    box, boxes = hidden_boxes(B, block_b, box_rows)
    last_box, last_boxes = last_tile_boxes(B, block_b, last_box_rows)
    if last_boxes and box < block_b:
        raise ValueError("box_rows (a one-tile batch) and last_box_rows (a short last tile) exclude each other")
    if (box < block_b or last_boxes) and (batch is not None and batch != hidden.shape[0]):
        raise ValueError("box_rows and last_box_rows read the hidden's own rows: pass the unpadded hidden (batch, if "
                         "given, must be its row count)")
    # (a box of fewer rows has the same 128-byte swizzle, so the tile's buffers keep the tile's layout)
    h_desc = GluonDescriptor.from_tensor(hidden, [box, WS_BLOCK_K], smem)
    # (unused without last_boxes: the kernel then never reads it)
    hl_desc = GluonDescriptor.from_tensor(hidden, [last_box, WS_BLOCK_K], smem) if last_boxes else h_desc
    w_desc = GluonDescriptor.from_tensor(weight, [WS_BLOCK_V, WS_BLOCK_K], smem)
    dummy = dest.i
    seed_p, seed_v, seed_row = row_param_args(params.seed, dummy)
    off_p, off_v, off_row = row_param_args(params.offset, dummy)
    temp_p, temp_v, temp_row = row_param_args(params.temperature, dummy)
    xfp_p, xfp_v, xfp_row = row_param_args(params.fingerprint, dummy)
    topk_p, topk_v, topk_row = row_param_args(params.top_k, dummy)
    topp_p, topp_v, topp_row = row_param_args(params.top_p, dummy)
    skip = bool(skip_filtered_noise) and not params.all_greedy
    if skip and epilogue_chunk:
        raise ValueError("skip_filtered_noise serves filtered calls, which the chunked epilogue does not run")
    par_p, par_f, par_i, par_on = parity_args(dest.parity, dummy)
    header = writes_header(layout, dest)
    if epilogue_warps not in WS_REGISTERS:
        raise ValueError(f"epilogue_warps must be one of {sorted(WS_REGISTERS)}, got {epilogue_warps}")
    maxnreg, epi_regs = WS_REGISTERS[epilogue_warps]
    # Token bitmask, bias and penalties: the epilogue gathers the bitmask words and searches each
    # row's entries itself (no entry-offset table: the searches run while the tile's MMAs do).
    proc_args, proc_flags = processor_args(params.processing, dummy)
    programs, rotate = persistent_grid(sm_count(hidden.device), n_btiles, n_tiles, last_boxes > 0, grid_cap)
    if wait_probe is not None and (wait_probe.shape[0] < programs or wait_probe.device != hidden.device):
        raise ValueError(f"wait_probe needs a row for each of the launch's {programs} programs on {hidden.device}, got "
                         f"{tuple(wait_probe.shape)} on {wait_probe.device}")
    fused_sample_ws_kernel[(programs, )](
        h_desc, hl_desc, w_desc, seed_p, seed_v, off_p, off_v, temp_p, float(temp_v),
        dest.f, dest.i, B, V_rows, vocab_size, vocab_start,
        dest.base_f + shard * layout.stride_shard, dest.base_i + shard * layout.stride_shard_i, layout.stride_slot,
        n_btiles, n_tiles, 0 if epilogue_only else cdiv(D, WS_BLOCK_K), layout.stride_field,
        layout.stride_ifield, *proc_args, par_p, par_f, par_i, layout.fingerprint_slot,
        call_flags(logprobs, chunked=False) if flags is None else flags, xfp_p, xfp_v,
        STAGES=stages, EPI_WARPS=epilogue_warps, EPI_REGS=epi_regs, LOAD_REGS=WS_LOAD_REGS,
        SEED_PER_ROW=seed_row, OFFSET_PER_ROW=off_row, TEMP_PER_ROW=temp_row,
        NOISE=not params.all_greedy, FAST_LOG=fast_log_ok(hidden.device), ROW_THREADS=row_threads,
        LOGPROBS=logprobs or extended, EXTENDED=extended, WINNER_LOGIT=logprobs or winner_logit, RAW_SUM=raw_sums,
        **proc_flags, PEER_TABLE=dest.peer_table, NPEERS=dest.npeers or 1, DEVICE_PARITY=par_on, HEADER=header,
        XFP_PER_ROW=xfp_row, BLOCK_B=block_b, H_BOXES=boxes, LAST_BOXES=last_boxes, ROTATE=rotate,
        NOISE_PROBE=NOISE_PROBES[noise_probe], ACC_BUFS=acc_buffers, EPI_CHUNK=epilogue_chunk,
        wait_ptr=dummy if wait_probe is None else wait_probe, WAITS=wait_probe is not None,
        topk_ptr=topk_p, topk_val=int(topk_v), topp_ptr=topp_p, topp_val=float(topp_v), SKIP_NOISE=skip,
        TOPK_PER_ROW=topk_row, TOPP_PER_ROW=topp_row,
        num_warps=4, maxnreg=maxnreg,
    )


