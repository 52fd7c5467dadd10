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
The candidates are those of ``fused_sample_kernel`` with the same 128x128x64 tile, bit for
bit: the same wgmma instruction sequence in the same K order gives the same logits, and the
noise is keyed by the global vocabulary id. It covers the plain call (temperature, seed and
offset as scalars or ``[B]`` tensors; no logprobs, filters, processors or tensor-parallel
fan-out); ``ws_supported`` says when it applies, and every other call keeps the Triton kernel.
"""
import functools

import torch
import triton

from ..params import RowParams
from .epilogue import perturb, row_temperature
from .layout import BufferPair, CandidateLayout
from .noise import gumbel_from_bits, vocab_quad_bits
from .utils import fast_log_ok, row_param_args

try:  # Gluon ships with Triton >= 3.5; without it (or its Hopper module) this path is off.
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor

    HAVE_GLUON = True
except ImportError:  # pragma: no cover - depends on the installed Triton
    HAVE_GLUON = False

# The tile: 128 rows x WS_BLOCK_V (128) or 256 ids x 64 of the hidden size per stage. Candidates are
# always per 128-id vocabulary tile (configs.default_block_v on a GPU): a 256-id MMA tile writes two.
WS_BLOCK_B = 128
WS_BLOCK_V = 128
WS_BLOCK_K = 64
WS_MMA_WIDTHS = (128, 256)
WS_STAGES = 4  # x 32 KB of operands (48 KB with 256 ids), + 32 KB per accumulator hand-off buffer
# Rows a warp spans in the epilogue's layout, per MMA width (16 for 256: fewer rows' state per
# thread in the 4 epilogue warps' smaller register budget; 116 bytes of spills left, sm_90 ptxas).
WS_ROW_THREADS = {128: 8, 256: 16}
# The accumulator goes to the epilogue in 64-column pieces through WS_HANDOFF[mma_n] 32 KB buffers:
# 128 ids = 2 pieces through one buffer (the epilogue holds one piece in registers while the
# MMA warpgroup stores the other); 256 ids = 4 pieces through two.
WS_HANDOFF = {128: 1, 256: 2}
WS_SMEM_BYTES = 227 * 1024 - 1024  # sm_90's per-block limit, less room for the barriers
# Registers: the launch gives every warp maxnreg; the partitions then trade them per warpgroup
# (setmaxnreg): the load warp drops to LOAD_REGS, the epilogue rises to its budget, the MMA
# warpgroup(s) keep the rest (>= 128 for a 128x128 accumulator per warpgroup).
# (ids per MMA tile, epilogue warps) -> (maxnreg, epilogue registers):
# 128: 4 + 1 + 4 warps run as 12 (3 x 128 threads x 168 <= 64K); 4 + 1 + 8 as 16 (4 x 128 x 128);
# 256: two MMA warpgroups (a 64 x 256 accumulator each) that also issue the TMA loads (a separate
# load warp would make 20 warps) + 8 epilogue warps = 16 warps at 128 registers, no trading.
WS_EPILOGUE_WARPS = 4
WS_REGISTERS = {(128, 4): (168, 232), (128, 8): (128, 160), (256, 4): (168, 176)}
WS_LOAD_REGS = 24

if HAVE_GLUON:

    @gluon.jit
    def _load_partition(h_desc, w_desc, h_bufs, w_bufs, ready, empty, n_btiles, n_tiles, k_steps,
                        BLOCK_B: gl.constexpr, BLOCK_V: gl.constexpr, BLOCK_K: gl.constexpr,
                        STAGES: gl.constexpr):
        # One warp: wait for a free stage, then let the copy engine fill it (both operands
        # arrive on the stage's "ready" barrier, which counts their bytes).
        it = 0
        for t in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
            off_b = (t % n_btiles) * BLOCK_B
            off_v = (t // n_btiles) * BLOCK_V
            for k in range(k_steps):
                s = it % STAGES
                mbarrier.wait(empty.index(s), ((it // STAGES) & 1) ^ 1)
                mbarrier.expect(ready.index(s), h_desc.block_type.nbytes + w_desc.block_type.nbytes)
                tma.async_copy_global_to_shared(h_desc, [off_b, k * BLOCK_K], ready.index(s), h_bufs.index(s))
                tma.async_copy_global_to_shared(w_desc, [off_v, k * BLOCK_K], ready.index(s), w_bufs.index(s))
                it += 1

    @gluon.jit
    def _hand_over(acc_smem, acc_ready, acc_empty, piece, k, NBUF: gl.constexpr):
        # Piece k of the stream goes through buffer k % NBUF once the epilogue has read out
        # what that buffer held before.
        b = k % NBUF
        mbarrier.wait(acc_empty.index(b), ((k // NBUF) & 1) ^ 1)
        acc_smem.index(b).store(piece)
        mbarrier.arrive(acc_ready.index(b))
        return k + 1

    @gluon.jit
    def _mma_partition(h_bufs, w_bufs, ready, empty, acc_smem, acc_ready, acc_empty, n_tiles, k_steps,
                       BLOCK_B: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, NBUF: gl.constexpr,
                       MMA_WARPS: gl.constexpr):
        # The 128-id tile's main loop (one warpgroup; a load warp fills the stages):
        # acc[BLOCK_B, BLOCK_N] = h_tile @ w_tile^T over k, one wgmma group in flight while the
        # next stage's data is awaited; a stage is released as soon as the wgmma that read it
        # has retired.
        acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[MMA_WARPS, 1],
                                                             instr_shape=[16, 128, 16])
        it = 0
        hc = 0
        for t in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
            acc = gl.zeros([BLOCK_B, BLOCK_N], gl.float32, acc_layout)
            for k in range(k_steps):
                s = it % STAGES
                mbarrier.wait(ready.index(s), (it // STAGES) & 1)
                acc = warpgroup_mma(h_bufs.index(s), w_bufs.index(s).permute((1, 0)), acc, is_async=True)
                acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc, ))
                # the previous stage's wgmma has retired: its buffers may be refilled
                mbarrier.arrive(empty.index((it + STAGES - 1) % STAGES), pred=k > 0)
                it += 1
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
            mbarrier.arrive(empty.index((it + STAGES - 1) % STAGES), pred=k_steps > 0)
            # Hand the tile over in two 64-column halves. (Column 64 is a register bit of the wgmma
            # layout: the split moves no data.)
            left, right = gl.split(gl.permute(gl.reshape(acc, [BLOCK_B, 2, BLOCK_N // 2]), (0, 2, 1)))
            hc = _hand_over(acc_smem, acc_ready, acc_empty, left, hc, NBUF)
            hc = _hand_over(acc_smem, acc_ready, acc_empty, right, hc, NBUF)

    @gluon.jit
    def _load_stage(h_desc, w_desc, h_bufs, w_bufs, ready, j, n_loads, lt, lk, k_steps, n_btiles,
                    BLOCK_B: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, STAGES: gl.constexpr):
        # Load j of this program's stream (tile lt, k-step lk) into stage j % STAGES, if there is
        # such a load; returns the next load's (tile, k-step).
        if j < n_loads:
            s = j % STAGES
            mbarrier.expect(ready.index(s), h_desc.block_type.nbytes + w_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(h_desc, [(lt % n_btiles) * BLOCK_B, lk * BLOCK_K], ready.index(s),
                                            h_bufs.index(s))
            tma.async_copy_global_to_shared(w_desc, [(lt // n_btiles) * BLOCK_N, lk * BLOCK_K], ready.index(s),
                                            w_bufs.index(s))
        lk += 1
        wrap = lk == k_steps
        lt = gl.where(wrap, lt + gl.num_programs(0), lt)
        lk = gl.where(wrap, 0, lk)
        return lt, lk

    @gluon.jit
    def _mma_load_partition(h_desc, w_desc, h_bufs, w_bufs, ready, acc_smem, acc_ready, acc_empty, n_btiles,
                            n_tiles, k_steps, BLOCK_B: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
                            STAGES: gl.constexpr, NBUF: gl.constexpr, MMA_WARPS: gl.constexpr):
        # The 256-id tile's main loop: the two MMA warpgroups issue their own TMA loads, STAGES - 1
        # ahead. Load j + STAGES - 1 goes into the stage that wgmma j - 1 read, which has retired
        # once warpgroup_mma_wait(1) returns in step j, so no "empty" barriers are needed.
        acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[MMA_WARPS, 1],
                                                             instr_shape=[16, 128, 16])
        n_mine = gl.cdiv(n_tiles - gl.program_id(0), gl.num_programs(0))
        n_loads = n_mine * k_steps
        lt = gl.program_id(0)
        lk = 0
        for j in gl.static_range(STAGES - 1):
            lt, lk = _load_stage(h_desc, w_desc, h_bufs, w_bufs, ready, j, n_loads, lt, lk, k_steps, n_btiles,
                                 BLOCK_B, BLOCK_N, BLOCK_K, STAGES)
        it = 0
        hc = 0
        for _i in range(n_mine):
            acc = gl.zeros([BLOCK_B, BLOCK_N], gl.float32, acc_layout)
            for _k in range(k_steps):
                s = it % STAGES
                mbarrier.wait(ready.index(s), (it // STAGES) & 1)
                acc = warpgroup_mma(h_bufs.index(s), w_bufs.index(s).permute((1, 0)), acc, is_async=True)
                acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc, ))
                lt, lk = _load_stage(h_desc, w_desc, h_bufs, w_bufs, ready, it + STAGES - 1, n_loads, lt, lk,
                                     k_steps, n_btiles, BLOCK_B, BLOCK_N, BLOCK_K, STAGES)
                it += 1
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
            left, right = gl.split(gl.permute(gl.reshape(acc, [BLOCK_B, 2, BLOCK_N // 2]), (0, 2, 1)))
            q0, q1 = gl.split(gl.permute(gl.reshape(left, [BLOCK_B, 2, BLOCK_N // 4]), (0, 2, 1)))
            hc = _hand_over(acc_smem, acc_ready, acc_empty, q0, hc, NBUF)
            hc = _hand_over(acc_smem, acc_ready, acc_empty, q1, hc, NBUF)
            q2, q3 = gl.split(gl.permute(gl.reshape(right, [BLOCK_B, 2, BLOCK_N // 4]), (0, 2, 1)))
            hc = _hand_over(acc_smem, acc_ready, acc_empty, q2, hc, NBUF)
            hc = _hand_over(acc_smem, acc_ready, acc_empty, q3, hc, NBUF)

    @gluon.jit
    def _slice_bits(seed, offset, col0, vocab_start, tile_start, WIDTH: gl.constexpr, quad_layout: gl.constexpr):
        """Philox bits of columns [col0, col0 + WIDTH) of the slot, [rows, WIDTH]."""
        cols_q = gl.arange(0, WIDTH // 4, gl.SliceLayout(0, quad_layout))
        quad = ((vocab_start + tile_start + col0) >> 2) + cols_q
        r0, r1, r2, r3 = vocab_quad_bits(seed[:, None], offset[:, None], quad[None, :])
        # Column 4q + 2i + j is lane 2i + j of quad q (noise.vocab_bits_tile's arrangement).
        return gl.reshape(gl.join(gl.join(r0, r2), gl.join(r1, r3)), [r0.shape[0], WIDTH])

    @gluon.jit
    def _slice_best(logit, bits, noise_scale, col0, tile_start, V_rows, vocab_size, vocab_start, WIDTH: gl.constexpr,
                    NOISE: gl.constexpr, FAST_LOG: gl.constexpr):
        """(best score, best column, any NaN / +inf logit) of WIDTH columns from col0 of the slot."""
        lay: gl.constexpr = bits.type.layout
        col = col0 + gl.arange(0, WIDTH, gl.SliceLayout(0, lay))
        gid = vocab_start + tile_start + col
        valid = (gid < vocab_size) & (tile_start + col < V_rows)
        logit = gl.where(valid[None, :], logit, float("-inf"))
        bad = gl.max(((logit != logit) | (logit == float("inf"))).to(gl.int32), axis=1)
        if NOISE:
            g = gumbel_from_bits(bits, FAST_LOG)
            score = perturb(logit, gl.convert_layout(noise_scale, gl.SliceLayout(1, lay))[:, None], g, FAST_LOG)
        else:
            score = logit
        best = gl.max(score, axis=1)
        # lowest column among equal maxima, as tl.argmax
        at = gl.min(gl.where(score == best[:, None], col[None, :], 1 << 30), axis=1)
        return best, at, bad

    @gluon.jit
    def _epilogue_half(acc_smem, acc_ready, acc_empty, k, NBUF: gl.constexpr, half: gl.constexpr, seed, offset,
                       noise_scale, tile_start, V_rows, vocab_size, vocab_start, HALF: gl.constexpr,
                       NOISE: gl.constexpr, FAST_LOG: gl.constexpr, quad_layout: gl.constexpr, SPLIT: gl.constexpr):
        """(best score, best column, any NaN / +inf logit) of one HALF-wide column slice of the slot,
        piece k of the hand-off stream. SPLIT: run its noise in two HALF / 2 column passes (fewer
        live registers: for 4 epilogue warps beside two MMA warpgroups)."""
        b = k % NBUF
        c0 = half * HALF
        if SPLIT:
            W: gl.constexpr = HALF // 2
            bits = _slice_bits(seed, offset, c0, vocab_start, tile_start, W, quad_layout)
            lay: gl.constexpr = bits.type.layout
            mbarrier.wait(acc_ready.index(b), (k // NBUF) & 1)
            logit0 = acc_smem.index(b).slice(0, W, dim=1).load(lay)
            logit1 = acc_smem.index(b).slice(W, W, dim=1).load(lay)
            mbarrier.arrive(acc_empty.index(b))
            best, at, bad = _slice_best(logit0, bits, noise_scale, c0, tile_start, V_rows, vocab_size, vocab_start,
                                        W, NOISE, FAST_LOG)
            bits = _slice_bits(seed, offset, c0 + W, vocab_start, tile_start, W, quad_layout)
            best1, at1, bad1 = _slice_best(logit1, bits, noise_scale, c0 + W, tile_start, V_rows, vocab_size,
                                           vocab_start, W, NOISE, FAST_LOG)
            # the right part wins only when strictly larger (ties to the lower id)
            take1 = best1 > best
            best = gl.where(take1, best1, best)
            at = gl.where(take1, at1, at)
            bad = bad | bad1
        else:
            bits = _slice_bits(seed, offset, c0, vocab_start, tile_start, HALF, quad_layout)
            lay2: gl.constexpr = bits.type.layout
            # The half's logits, then the buffer goes straight back to the MMA warps.
            mbarrier.wait(acc_ready.index(b), (k // NBUF) & 1)
            logit = acc_smem.index(b).load(lay2)
            mbarrier.arrive(acc_empty.index(b))
            best, at, bad = _slice_best(logit, bits, noise_scale, c0, tile_start, V_rows, vocab_size, vocab_start,
                                        HALF, NOISE, FAST_LOG)
        return best, at, bad

    @gluon.jit
    def _epilogue_partition(acc_smem, acc_ready, acc_empty, seed_ptr, seed_val, offset_ptr, offset_val, temp_ptr,
                            temp_val, cand_f, cand_i, B, V_rows, vocab_size, vocab_start, buf_offset, buf_offset_i,
                            stride_slot, n_slots, n_btiles, n_tiles,
                            BLOCK_B: gl.constexpr, BLOCK_N: gl.constexpr, SLOT_V: gl.constexpr, NBUF: gl.constexpr,
                            EPI_WARPS: gl.constexpr, SEED_PER_ROW: gl.constexpr, OFFSET_PER_ROW: gl.constexpr,
                            TEMP_PER_ROW: gl.constexpr, NOISE: gl.constexpr, FAST_LOG: gl.constexpr,
                            ROW_THREADS: gl.constexpr):
        HALF: gl.constexpr = SLOT_V // 2
        SPLIT: gl.constexpr = BLOCK_N > SLOT_V  # 4 warps beside two MMA warpgroups: fewer live registers
        # Philox quads of a half slot, [BLOCK_B, HALF / 4]: a warp spans ROW_THREADS rows, so each
        # thread keeps few rows' keys and counters (the per-row state is what crowds the registers).
        quad_layout: gl.constexpr = gl.BlockedLayout([1, 1], [ROW_THREADS, 32 // ROW_THREADS], [EPI_WARPS, 1],
                                                     [1, 0])
        row_layout: gl.constexpr = gl.SliceLayout(1, quad_layout)
        hc = 0
        for t in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
            pid_b = t % n_btiles
            pid_v = t // n_btiles
            offs_b = pid_b * BLOCK_B + gl.arange(0, BLOCK_B, row_layout)
            mask_b = offs_b < B
            if TEMP_PER_ROW:
                temp = gl.load(temp_ptr + offs_b, mask=mask_b, other=0.0).to(gl.float32)
            else:
                temp = gl.full([BLOCK_B], 0.0, gl.float32, row_layout) + temp_val
            if SEED_PER_ROW:
                seed = gl.load(seed_ptr + offs_b, mask=mask_b, other=0).to(gl.int64)
            else:
                seed = gl.full([BLOCK_B], 0, gl.int64, row_layout) + seed_val
            if OFFSET_PER_ROW:
                offset = gl.load(offset_ptr + offs_b, mask=mask_b, other=0).to(gl.int64)
            else:
                offset = gl.full([BLOCK_B], 0, gl.int64, row_layout) + offset_val
            _inv_t, noise_scale, _greedy, bad_temp = row_temperature(temp)

            # One candidate per SLOT_V ids: a 256-id tile covers two vocabulary slots.
            for j in gl.static_range(BLOCK_N // SLOT_V):
                slot = pid_v * (BLOCK_N // SLOT_V) + j
                tile_start = slot * SLOT_V
                best0, at0, bad0 = _epilogue_half(acc_smem, acc_ready, acc_empty, hc, NBUF, 0, seed, offset,
                                                  noise_scale, tile_start, V_rows, vocab_size, vocab_start, HALF,
                                                  NOISE, FAST_LOG, quad_layout, SPLIT)
                best1, at1, bad1 = _epilogue_half(acc_smem, acc_ready, acc_empty, hc + 1, NBUF, 1, seed, offset,
                                                  noise_scale, tile_start, V_rows, vocab_size, vocab_start, HALF,
                                                  NOISE, FAST_LOG, quad_layout, SPLIT)
                hc += 2

                # Merge the halves: the second wins only when strictly larger (ties to the lower id).
                take1 = best1 > best0
                best = gl.convert_layout(gl.where(take1, best1, best0), row_layout)
                at = gl.convert_layout(gl.where(take1, at1, at0), row_layout)
                bad = gl.convert_layout((bad0 | bad1) > 0, row_layout)
                poisoned = bad | bad_temp
                score = gl.where(poisoned, float("nan"), best)
                idx = gl.where(poisoned, -1, vocab_start + tile_start + at).to(gl.int32)
                # the second slot of the last 256-id tile may lie past the layout's slots
                keep = mask_b & (slot < n_slots)
                gl.store(cand_f + buf_offset + slot * stride_slot + offs_b, score, mask=keep)
                gl.store(cand_i + buf_offset_i + slot * stride_slot + offs_b, idx, mask=keep)

    @gluon.jit
    def fused_sample_ws_kernel(h_desc, w_desc, seed_ptr, seed_val, offset_ptr, offset_val, temp_ptr, temp_val,
                               cand_f, cand_i, B, V_rows, vocab_size, vocab_start, buf_offset, buf_offset_i,
                               stride_slot, n_slots, n_btiles, n_tiles, k_steps,
                               STAGES: gl.constexpr, NBUF: gl.constexpr, EPI_WARPS: gl.constexpr,
                               EPI_REGS: gl.constexpr, LOAD_REGS: gl.constexpr,
                               SEED_PER_ROW: gl.constexpr, OFFSET_PER_ROW: gl.constexpr, TEMP_PER_ROW: gl.constexpr,
                               NOISE: gl.constexpr, FAST_LOG: gl.constexpr, ROW_THREADS: gl.constexpr = 8,
                               SLOT_V: gl.constexpr = 128):
        BLOCK_B: gl.constexpr = h_desc.block_type.shape[0]
        BLOCK_K: gl.constexpr = h_desc.block_type.shape[1]
        BLOCK_N: gl.constexpr = w_desc.block_type.shape[0]  # ids per MMA tile: 128 or 256
        MMA_WARPS: gl.constexpr = gl.num_warps()
        dtype: gl.constexpr = h_desc.dtype
        h_bufs = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_B, BLOCK_K], h_desc.layout)
        w_bufs = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, BLOCK_K], w_desc.layout)
        # The accumulator hand-off, swizzled so the wgmma layout's row-strided stores and the
        # epilogue's quad loads spread over the banks.
        acc_smem = gl.allocate_shared_memory(gl.float32, [NBUF, BLOCK_B, SLOT_V // 2],
                                             gl.SwizzledSharedLayout(4, 1, 8, order=[1, 0]))
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        acc_ready = gl.allocate_shared_memory(gl.int64, [NBUF, 1], mbarrier.MBarrierLayout())
        acc_empty = gl.allocate_shared_memory(gl.int64, [NBUF, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(ready.index(i), count=1)
            mbarrier.init(empty.index(i), count=1)
        for i in gl.static_range(NBUF):
            mbarrier.init(acc_ready.index(i), count=1)
            mbarrier.init(acc_empty.index(i), count=1)

        # (The epilogue's arguments are written out twice: a tuple of them would lose the constexprs.)
        if BLOCK_N == SLOT_V:
            gl.warp_specialize([
                (_mma_partition, (h_bufs, w_bufs, ready, empty, acc_smem, acc_ready, acc_empty, n_tiles, k_steps,
                                  BLOCK_B, BLOCK_N, STAGES, NBUF, MMA_WARPS)),
                (_load_partition, (h_desc, w_desc, h_bufs, w_bufs, ready, empty, n_btiles, n_tiles, k_steps,
                                   BLOCK_B, BLOCK_N, BLOCK_K, STAGES)),
                (_epilogue_partition, (acc_smem, acc_ready, acc_empty, seed_ptr, seed_val, offset_ptr, offset_val,
                                       temp_ptr, temp_val, cand_f, cand_i, B, V_rows, vocab_size, vocab_start,
                                       buf_offset, buf_offset_i, stride_slot, n_slots, n_btiles, n_tiles,
                                       BLOCK_B, BLOCK_N, SLOT_V, NBUF, EPI_WARPS, SEED_PER_ROW, OFFSET_PER_ROW,
                                       TEMP_PER_ROW, NOISE, FAST_LOG, ROW_THREADS)),
            ], [1, EPI_WARPS], [LOAD_REGS, EPI_REGS])
        else:
            gl.warp_specialize([
                (_mma_load_partition, (h_desc, w_desc, h_bufs, w_bufs, ready, acc_smem, acc_ready, acc_empty,
                                       n_btiles, n_tiles, k_steps, BLOCK_B, BLOCK_N, BLOCK_K, STAGES, NBUF,
                                       MMA_WARPS)),
                (_epilogue_partition, (acc_smem, acc_ready, acc_empty, seed_ptr, seed_val, offset_ptr, offset_val,
                                       temp_ptr, temp_val, cand_f, cand_i, B, V_rows, vocab_size, vocab_start,
                                       buf_offset, buf_offset_i, stride_slot, n_slots, n_btiles, n_tiles,
                                       BLOCK_B, BLOCK_N, SLOT_V, NBUF, EPI_WARPS, SEED_PER_ROW, OFFSET_PER_ROW,
                                       TEMP_PER_ROW, NOISE, FAST_LOG, ROW_THREADS)),
            ], [EPI_WARPS], [EPI_REGS])


def ws_supported(hidden: torch.Tensor, weight: torch.Tensor, params: RowParams, layout: CandidateLayout,
                 dest: BufferPair, *, logprobs: bool = False, extended: bool = False,
                 block_v: int = WS_BLOCK_V) -> bool:
    """Whether this call can run on the warp-specialised kernel: a Hopper GPU (sm_90: wgmma),
    bf16 / fp16 operands TMA can read, the 128-id vocabulary tile, and a plain call (no logprobs,
    kept logits, processors, peer fan-out or call header). Everything else keeps fused_sample_kernel."""
    if not HAVE_GLUON or hidden.device.type != "cuda" or torch.version.hip is not None:
        return False
    if torch.cuda.get_device_capability(hidden.device) != (9, 0):
        return False
    if hidden.dtype not in (torch.bfloat16, torch.float16) or weight.dtype != hidden.dtype:
        return False
    if logprobs or extended or params.processing is not None or dest.peer_table or dest.parity is not None:
        return False
    if layout.checked or block_v != WS_BLOCK_V or hidden.shape[0] == 0:
        return False
    elem = hidden.element_size()
    return all(t.dim() == 2 and t.stride(1) == 1 and t.data_ptr() % 16 == 0 and (t.stride(0) * elem) % 16 == 0
               for t in (hidden, weight))


def launch_fused_ws(hidden: torch.Tensor, weight: torch.Tensor, params: RowParams, layout: CandidateLayout,
                    dest: BufferPair, *, vocab_size: int, vocab_start: int = 0, shard: int = 0,
                    mma_n: int = WS_BLOCK_V, stages: int = WS_STAGES, row_threads: int = 0, handoff: int = 0,
                    epilogue_warps: int = WS_EPILOGUE_WARPS, grid_cap: int = 0, epilogue_only: bool = False) -> None:
    """Write every (row, 128-id vocabulary tile)'s candidate of ``hidden @ weight.T`` into block
    ``shard`` of ``dest``, as launch_fused does with the 128x128x64 TMA tile. The caller checks
    :func:`ws_supported` first. mma_n: ids per MMA tile, 128 (one warpgroup) or 256 (two; each
    tile writes two slots' candidates, the same ones). grid_cap: at most this many persistent
    programs (0: one per SM). row_threads, handoff (32 KB hand-off buffers): 0 for the width's
    default. epilogue_only (benchmarks):
    skip the main loop (zero logits), to time the epilogue alone."""
    if mma_n not in WS_MMA_WIDTHS:
        raise ValueError(f"mma_n must be one of {WS_MMA_WIDTHS}, got {mma_n}")
    if (mma_n, epilogue_warps) not in WS_REGISTERS:
        raise ValueError(f"epilogue_warps={epilogue_warps} is not available with mma_n={mma_n}: "
                         f"one of {sorted(w for n, w in WS_REGISTERS if n == mma_n)}")
    B, D = hidden.shape
    V_rows = weight.shape[0]
    n_slots = layout.check_fit(B, V_rows, WS_BLOCK_V, shard, vocab_start)
    n_btiles = triton.cdiv(B, WS_BLOCK_B)
    n_tiles = n_btiles * triton.cdiv(n_slots * WS_BLOCK_V, mma_n)
    gdt = gl.bfloat16 if hidden.dtype == torch.bfloat16 else gl.float16
    h_desc = GluonDescriptor.from_tensor(hidden, [WS_BLOCK_B, WS_BLOCK_K],
                                         gl.NVMMASharedLayout.get_default_for([WS_BLOCK_B, WS_BLOCK_K], gdt))
    w_desc = GluonDescriptor.from_tensor(weight, [mma_n, WS_BLOCK_K],
                                         gl.NVMMASharedLayout.get_default_for([mma_n, WS_BLOCK_K], gdt))
    dummy = dest.i
    seed_p, seed_v, seed_row = row_param_args(params.seed, dummy)
    off_p, off_v, off_row = row_param_args(params.offset, dummy)
    temp_p, temp_v, temp_row = row_param_args(params.temperature, dummy)
    maxnreg, epi_regs = WS_REGISTERS[(mma_n, epilogue_warps)]
    row_threads = row_threads or WS_ROW_THREADS[mma_n]
    handoff = handoff or WS_HANDOFF[mma_n]
    smem = stages * (WS_BLOCK_B + mma_n) * WS_BLOCK_K * hidden.element_size() + handoff * WS_BLOCK_B * 64 * 4
    if stages < 2 or smem > WS_SMEM_BYTES:
        raise ValueError(f"stages={stages} with {handoff} hand-off buffer(s) needs {smem} bytes of shared memory "
                         f"for mma_n={mma_n}; at least 2 stages and at most {WS_SMEM_BYTES} bytes")
    programs = min(n_tiles, _sm_count(hidden.device))
    if grid_cap:
        programs = min(programs, grid_cap)
    fused_sample_ws_kernel[(programs, )](
        h_desc, w_desc, seed_p, seed_v, off_p, off_v, temp_p, float(temp_v),
        dest.f, dest.i, B, V_rows, vocab_size, vocab_start,
        dest.base_f + shard * layout.stride_shard, dest.base_i + shard * layout.stride_shard_i, layout.stride_slot,
        n_slots, n_btiles, n_tiles, 0 if epilogue_only else triton.cdiv(D, WS_BLOCK_K),
        STAGES=stages, NBUF=handoff, EPI_WARPS=epilogue_warps, EPI_REGS=epi_regs, LOAD_REGS=WS_LOAD_REGS,
        SEED_PER_ROW=seed_row, OFFSET_PER_ROW=off_row, TEMP_PER_ROW=temp_row,
        NOISE=not params.all_greedy, FAST_LOG=fast_log_ok(hidden.device), ROW_THREADS=row_threads,
        SLOT_V=WS_BLOCK_V, num_warps=4 * mma_n // 128, maxnreg=maxnreg,
    )


def _sm_count(device: torch.device) -> int:
    return _sm_count_of(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _sm_count_of(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count
