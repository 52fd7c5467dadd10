"""Stage 1 on Hopper with two ping-pong MMA warpgroups: each multiplies its own tile and samples it from registers.

``fused_sample_ws.py``'s kernel has one MMA warpgroup and a separate epilogue: the accumulator crosses shared memory
(two 32 KB hand-offs a tile), and past one batch tile the epilogue's noise slows the main loop beside it
(docs/performance.md v86-v110). This kernel (issue 14's ping-pong lever, v111) keeps the 128 x 128 x 64 tile and its
operand stream, but gives each program two *consumer* warpgroups and one load warp:

* the **load** warp fills a ring of operand stages with TMA, tile after tile (the same copies as the ws kernel's);
* consumer warpgroup c takes the program's tiles j with j % 2 == c: it runs the wgmma main loop of its tile, then
  the whole sampling epilogue on the accumulator *in its own registers* (no hand-off) while the other warpgroup
  runs the next tile's main loop. A "turn" barrier pair orders the main loops (A, B, A, ...), so the tensor cores
  serve one warpgroup at a time and the stage ring's phases stay unambiguous (a warpgroup waits for a stage's fill
  only after the other has waited for every earlier fill).

The epilogue works on the wgmma layout itself, 16 columns at a time. A thread holds two adjacent columns of a
Philox quad (4 ids share one evaluation) for a row r and for row r + 8; its neighbour (lane ^ 1) holds the quad's
other two columns of the same rows. So each thread evaluates Philox once for one (row, quad) - the even thread
for row r, the odd one for row r + 8 - and the two swap the halves the other needs with one warp shuffle a word:
one Philox per four ids, as everywhere else. Each thread keeps a running best (score, column) per slot, a later
column winning only when strictly larger, and the row's winner is the lowest column among the slots' maxima:
``fused_sample_ws``'s candidates bit for bit (the same wgmmas in the same K order, the same noise, the same
``perturb`` rounding).

``shared_epilogue`` instead moves the accumulator through shared memory, a column chunk at a time, into the ws
epilogue's layout and runs that epilogue's code (v111b). ``epilogue_warps=4`` (v113) keeps the consumers to their main
loops and hands each tile to 4 epilogue warps of their own through a buffer set per consumer (fused_sample_ws's
chunked hand-off and epilogue), so that one consumer's wait for the epilogue overlaps the other's main loop; on an
H100 it ran at 0.94-1.28x the ws kernel's time (v113: the noise's cost grew with the main loop's length, D).
``epilogue_warps=8`` (v115) gives the epilogue the ws kernel's warp count, at 64 registers.

Plain calls only (temperature, seed, offset scalar or ``[B]``; the fan-out to tensor-parallel peers' buffers): no
logprobs, kept logits, processors, call header or device parity. ``fused_sample.launch_fused`` runs it
(``configs.PP_GREEDY_ON``) for all-greedy plain calls from ``configs.PP_GREEDY_MIN_BATCH`` rows (greedy: the main
loop never waits for a hand-off; stage 1 4-16% faster than the ws kernel's at B >= 512 on an H100 (v111b / v111c /
v113), whole calls 4-11% faster at B = 256-1024, v112). With noise none of its epilogues keeps up: one consumer's
beside the other's wgmmas at D = 4096 (v111), 4 epilogue warps of its own at either D (v113; docs/performance.md),
so sampled calls keep the ws kernel.
"""
import torch
import triton
import triton.language as tl

from ..params import RowParams
from .epilogue import perturb, row_temperature
from .layout import BufferPair, CandidateLayout, store_fan_out
from .noise import gumbel_from_bits, vocab_quad_bits
from .utils import cdiv, fast_log_ok, load_row_param, row_param_args, sm_clock, sm_count

try:  # Gluon ships with Triton >= 3.5; without it (or its Hopper module) this path is off.
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor

    from .fused_sample_ws import (WS_LOAD_REGS, _argmax_lowest, _col_halves, _epilogue_half_chunked, _half_bits,
                                  _hand_off_phases, _load_tile, _store_hand_off, _wait_counted, ws_supported)

    HAVE_GLUON = True
except ImportError:  # pragma: no cover - depends on the installed Triton
    HAVE_GLUON = False

PP_BLOCK_B = 128
PP_BLOCK_V = 128
PP_BLOCK_K = 64
PP_STAGES = 5  # x 32 KB of operands; no accumulator hand-off buffer
# columns the epilogue takes at a time (column bit 3 is a register bit of the wgmma layout, above the lane bits)
PP_CHUNK = triton.language.constexpr(16)
# Registers: three warpgroups (two consumers, the load warp padded to one) share 64K: the launch gives every
# thread maxnreg = 168 (3 x 128 x 168 <= 64K), then (setmaxnreg) the load warpgroup drops to WS_LOAD_REGS and both
# consumers take PP_CONSUMER_REGS (24 + 2 x 240 = 504 <= 3 x 168).
PP_MAXNREG = 168
PP_CONSUMER_REGS = 240
PP_LOOKAHEAD = 1  # launch_fused_pp's lookahead
# launch_fused_pp(epilogue_warps=4): four warpgroups (two consumers, the epilogue warps, the load warp padded to one)
# share 64K: maxnreg 128 at launch (4 x 128 x 128), then the load warpgroup drops to WS_LOAD_REGS, the epilogue warps
# take PP_EPI_REGS, consumer B PP_HAND_OFF_CONSUMER_REGS and consumer A the rest (512 - 24 - 168 - 160 = 160)
PP_EPI_MAXNREG = 128
PP_EPI_REGS = 168
PP_HAND_OFF_CONSUMER_REGS = 160
# epilogue_warps=8 (v115): five warpgroups at maxnreg 96 (5 x 128 x 96 <= 64K); the load warpgroup 24, the epilogue's
# two at 64, consumer B 160, consumer A the rest (480 - 24 - 128 - 160 = 168). Local compile: 352 bytes of spills in
# the epilogue; any register more for the epilogue warps (72 / 80 / 88) leaves a consumer under 160, where ptxas
# serialises its wgmmas and spills 1-2 KB. epilogue_warps -> (maxnreg, consumer B's registers, the epilogue's):
PP_EPI_REGISTERS = {4: (PP_EPI_MAXNREG, PP_HAND_OFF_CONSUMER_REGS, PP_EPI_REGS), 8: (96, 160, 64)}
# launch_fused_pp(wait_probe=) (v116, benchmarks): int64 fields a program's row holds (%clock64 cycles). Consumer r
# (0, 1) at 4 r: its cycles in all, waiting for operand stages, waiting for its turn (the other's main loop), and its
# tiles' tails (from the end of a main loop to the next turn wait: the last wgmma's retire, then the hand-off to the
# epilogue warps or its own epilogue); 8: the epilogue warps' cycles in all (epilogue_warps > 0), 9: of them waiting
# for the consumers' halves. Each is one thread's count (warp 0 of its partition).
PP_WAIT_FIELDS = triton.language.constexpr(10)
# launch_fused_pp's epilogue_chunk: the hand-off's chunk columns (fused_sample_ws's EPI_CHUNK). 16: the epilogue
# warps at 168 registers spill 16 bytes; 32 (twice the independent Philox quads a thread) spills ~600 bytes inside
# the chunk loop (local compile; moving registers from the consumers to the epilogue warps spills more)
PP_HAND_OFF_CHUNK = 16

if HAVE_GLUON:

    @triton.jit
    def _swap_with_neighbour(x):
        """x of lane ^ 1 of the same warp, elementwise (every lane runs it: the layouts here keep warps converged)."""
        return tl.inline_asm_elementwise("shfl.sync.bfly.b32 $0, $1, 1, 0x1f, 0xffffffff;", "=r,r", [x],
                                         dtype=tl.uint32, is_pure=True, pack=1)

    @triton.jit
    def _after(x, dep):
        """x (int32), as a value the compiler must think depends on dep (same shape): the chunks' Philox chains
        then start only once the chunk before is reduced, so that their temporaries are not all live at once
        (LLVM otherwise hoists them: they do not depend on the logits). The PTX's mov does not name dep, so only
        LLVM's order is bound; ptxas keeps it (local compile: 128 bytes of spills with it, 1,744 without)."""
        return tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r,r", [x, dep], dtype=tl.int32, is_pure=True, pack=1)

    @triton.jit
    def _after64(x, dep):
        """_after for an int64 x (a row's seed)."""
        return tl.inline_asm_elementwise("mov.b64 $0, $1;", "=l,l,r", [x, dep], dtype=tl.int64, is_pure=True, pack=1)

    @gluon.jit
    def _row_halves(x, ROWS: gl.constexpr, W: gl.constexpr):
        """The rows of x [ROWS, W] (the wgmma layout, or a column slice of it) with row bit 3 clear and set, each
        [ROWS / 2, W]: compact row i is row (i // 8) * 16 + i % 8 (+ 8). Row bit 3 is a register bit of the wgmma
        layout (a thread holds rows r and r + 8), so no data moves."""
        y = gl.permute(gl.reshape(x, [ROWS // 16, 2, 8, W]), (0, 2, 3, 1))
        lo, hi = gl.split(y)
        return gl.reshape(lo, [ROWS // 2, W]), gl.reshape(hi, [ROWS // 2, W])

    @gluon.jit
    def _pairs(x, ROWS: gl.constexpr, W: gl.constexpr):
        """x [ROWS, W]'s even and odd columns, [ROWS, W / 2] each (column bit 0: a register bit)."""
        return gl.split(gl.reshape(x, [ROWS, W // 2, 2]))

    @gluon.jit
    def _slot_update(best, at, bad, logit, col, valid, scale, bits, NOISE: gl.constexpr, FAST_LOG: gl.constexpr):
        """One column of every slot into the slots' running (best score, its column, any NaN / +inf logit)."""
        logit = gl.where(valid, logit, float("-inf"))
        bad = bad | (logit != logit) | (logit == float("inf"))
        if NOISE:
            score = perturb(logit, scale, gumbel_from_bits(bits, FAST_LOG), FAST_LOG)
        else:
            score = logit
        take = score > best
        return gl.where(take, score, best), gl.where(take, col, at), bad

    @gluon.jit
    def _chunk(x, c0, first_id, tile_start, V_rows, vocab_size, seed_lo, seed_hi, off_lo, off_hi, scale_lo, scale_hi,
               b_lo, a_lo, d_lo, b_hi, a_hi, d_hi, dep, FIRST: gl.constexpr, DEP: gl.constexpr, ROWS: gl.constexpr,
               NOISE: gl.constexpr, FAST_LOG: gl.constexpr):
        """Columns c0 .. c0 + PP_CHUNK - 1 of the tile (x: those columns of the accumulator, [ROWS, PP_CHUNK]) into
        the running slots of the low rows (b_lo, a_lo, d_lo: best, column, bad) and of the high rows (row bit 3).
        DEP: the chunk's Philox starts only once dep (an earlier chunk's result) is known (_after)."""
        HALF: gl.constexpr = PP_CHUNK // 2
        ev, od = _pairs(x, ROWS, PP_CHUNK)
        e_lo, e_hi = _row_halves(ev, ROWS, HALF)
        o_lo, o_hi = _row_halves(od, ROWS, HALF)
        lay: gl.constexpr = e_lo.type.layout
        p = gl.arange(0, HALF, gl.SliceLayout(0, lay))[None, :]  # pair p: columns c0 + 2p, c0 + 2p + 1
        col_e = c0 + 2 * p
        col_o = col_e + 1
        valid_e = (first_id + 2 * p < vocab_size) & (tile_start + col_e < V_rows)
        valid_o = (first_id + 2 * p + 1 < vocab_size) & (tile_start + col_o < V_rows)
        odd = (p & 1) == 1  # the pair holds lanes 2, 3 of its quad (else 0, 1); also this thread's lane bit 0
        if NOISE:
            # one Philox a thread: the even thread's for its low row, the odd thread's for its high row
            quad = (first_id >> 2) + (p >> 1) + gl.zeros(e_lo.shape, gl.int32, lay)
            if DEP:
                quad = _after(quad, dep)
            r0, r1, r2, r3 = vocab_quad_bits(gl.where(odd, seed_hi, seed_lo), gl.where(odd, off_hi, off_lo), quad,
                                             10, FAST_LOG)
            # hand the neighbour the two words its pair needs of the row this thread drew
            ra = _swap_with_neighbour(gl.where(odd, r0, r2))
            rb = _swap_with_neighbour(gl.where(odd, r1, r3))
            bits_lo_e = gl.where(odd, ra, r0)
            bits_lo_o = gl.where(odd, rb, r1)
            bits_hi_e = gl.where(odd, r2, ra)
            bits_hi_o = gl.where(odd, r3, rb)
        else:
            bits_lo_e = p.to(gl.uint32)
            bits_lo_o = bits_lo_e
            bits_hi_e = bits_lo_e
            bits_hi_o = bits_lo_e
        if FIRST:
            # the first column of each slot seeds it (a later one wins only when strictly larger)
            b_lo = gl.full(e_lo.shape, float("-inf"), gl.float32, lay)
            a_lo = col_e + gl.zeros(e_lo.shape, gl.int32, lay)
            d_lo = gl.zeros(e_lo.shape, gl.int1, lay)
            b_hi = b_lo
            a_hi = a_lo
            d_hi = d_lo
        b_lo, a_lo, d_lo = _slot_update(b_lo, a_lo, d_lo, e_lo, col_e, valid_e, scale_lo, bits_lo_e, NOISE, FAST_LOG)
        b_hi, a_hi, d_hi = _slot_update(b_hi, a_hi, d_hi, e_hi, col_e, valid_e, scale_hi, bits_hi_e, NOISE, FAST_LOG)
        b_lo, a_lo, d_lo = _slot_update(b_lo, a_lo, d_lo, o_lo, col_o, valid_o, scale_lo, bits_lo_o, NOISE, FAST_LOG)
        b_hi, a_hi, d_hi = _slot_update(b_hi, a_hi, d_hi, o_hi, col_o, valid_o, scale_hi, bits_hi_o, NOISE, FAST_LOG)
        return b_lo, a_lo, d_lo, b_hi, a_hi, d_hi

    @gluon.jit
    def _pick_dep(last, before, LOOKAHEAD: gl.constexpr):
        """The result a chunk's Philox waits for: the previous chunk's (LOOKAHEAD 1) or the one before it (2)."""
        if LOOKAHEAD == 1:
            return last
        else:
            return before

    @gluon.jit
    def _store_rows(best, at, bad, rows, bad_temp, cand_f, cand_i, buf_offset, buf_offset_i, pid_v, stride_slot, B,
                    tile_start, vocab_start, PEER_TABLE: gl.constexpr, NPEERS: gl.constexpr):
        """Each row's winner over its slots (the lowest column among the largest), poisoned as the ws kernel's."""
        m = gl.max(best, axis=1)
        col = gl.min(gl.where(best == m[:, None], at, 1 << 30), axis=1)
        poisoned = (gl.max(bad.to(gl.int32), axis=1) > 0) | bad_temp
        score = gl.where(poisoned, float("nan"), m)
        idx = gl.where(poisoned, -1, vocab_start + tile_start + col).to(gl.int32)
        mask = rows < B
        store_fan_out(cand_f, buf_offset + pid_v * stride_slot + rows, score, mask, gl.float32, PEER_TABLE, NPEERS)
        store_fan_out(cand_i, buf_offset_i + pid_v * stride_slot + rows, idx, mask, gl.int32, PEER_TABLE, NPEERS)

    @gluon.jit
    def _row_params(rows, B, seed_ptr, seed_val, offset_ptr, offset_val, temp_ptr, temp_val,
                    SEED_PER_ROW: gl.constexpr, OFFSET_PER_ROW: gl.constexpr, TEMP_PER_ROW: gl.constexpr):
        """(seed, offset, noise scale, bad temperature) of the given rows."""
        mask = rows < B
        temp = load_row_param(temp_ptr, temp_val, rows, mask, gl.float32, TEMP_PER_ROW)
        seed = load_row_param(seed_ptr, seed_val, rows, mask, gl.int64, SEED_PER_ROW)
        offset = load_row_param(offset_ptr, offset_val, rows, mask, gl.int64, OFFSET_PER_ROW)
        _inv_t, scale, _greedy, bad_temp = row_temperature(temp)
        return seed, offset, scale, bad_temp

    @gluon.jit
    def _epilogue(acc, pid_b, pid_v, seed_ptr, seed_val, offset_ptr, offset_val, temp_ptr, temp_val, cand_f, cand_i,
                  B, V_rows, vocab_size, vocab_start, buf_offset, buf_offset_i, stride_slot,
                  BLOCK_B: gl.constexpr, BLOCK_V: gl.constexpr, SEED_PER_ROW: gl.constexpr,
                  OFFSET_PER_ROW: gl.constexpr, TEMP_PER_ROW: gl.constexpr, NOISE: gl.constexpr,
                  FAST_LOG: gl.constexpr, PEER_TABLE: gl.constexpr, NPEERS: gl.constexpr, LOOKAHEAD: gl.constexpr):
        """The sampling epilogue of one tile from the accumulator in registers: each row's candidate."""
        gl.static_assert(BLOCK_V == 8 * PP_CHUNK, "the epilogue splits the tile into 8 chunks of PP_CHUNK columns")
        tile_start = pid_v * BLOCK_V
        first = vocab_start + tile_start
        # the column chunks, in column order (each split halves the columns at a register bit: no data moves)
        h0, h1 = _col_halves(acc, BLOCK_B, BLOCK_V)
        q0, q1 = _col_halves(h0, BLOCK_B, BLOCK_V // 2)
        q2, q3 = _col_halves(h1, BLOCK_B, BLOCK_V // 2)
        c0, c1 = _col_halves(q0, BLOCK_B, BLOCK_V // 4)
        # the rows' parameters in the slots' layout (low rows: row bit 3 clear)
        probe_lo, _probe_hi = _row_halves(_pairs(c0, BLOCK_B, PP_CHUNK)[0], BLOCK_B, PP_CHUNK // 2)
        row_lay: gl.constexpr = gl.SliceLayout(1, probe_lo.type.layout)
        i = gl.arange(0, BLOCK_B // 2, row_lay)
        rows_lo = pid_b * BLOCK_B + (i // 8) * 16 + i % 8
        rows_hi = rows_lo + 8
        s_lo, o_lo, n_lo, t_lo = _row_params(rows_lo, B, seed_ptr, seed_val, offset_ptr, offset_val, temp_ptr,
                                             temp_val, SEED_PER_ROW, OFFSET_PER_ROW, TEMP_PER_ROW)
        s_hi, o_hi, n_hi, t_hi = _row_params(rows_hi, B, seed_ptr, seed_val, offset_ptr, offset_val, temp_ptr,
                                             temp_val, SEED_PER_ROW, OFFSET_PER_ROW, TEMP_PER_ROW)
        s_lo = s_lo[:, None]
        s_hi = s_hi[:, None]
        o_lo = o_lo[:, None]
        o_hi = o_hi[:, None]
        n_lo = n_lo[:, None]
        n_hi = n_hi[:, None]
        C: gl.constexpr = PP_CHUNK
        # LOOKAHEAD: chunk i's Philox waits for chunk i - LOOKAHEAD's result (0: never; ptxas then hoists them all)
        b_lo, a_lo, d_lo, b_hi, a_hi, d_hi = _chunk(c0, 0, first, tile_start, V_rows, vocab_size, s_lo, s_hi, o_lo,
                                                    o_hi, n_lo, n_hi, None, None, None, None, None, None, None, True,
                                                    False, BLOCK_B, NOISE, FAST_LOG)
        r0 = b_hi
        b_lo, a_lo, d_lo, b_hi, a_hi, d_hi = _chunk(c1, C, first + C, tile_start, V_rows, vocab_size, s_lo, s_hi,
                                                    o_lo, o_hi, n_lo, n_hi, b_lo, a_lo, d_lo, b_hi, a_hi, d_hi, r0,
                                                    False, LOOKAHEAD == 1, BLOCK_B, NOISE, FAST_LOG)
        r1 = b_hi
        c2, c3 = _col_halves(q1, BLOCK_B, BLOCK_V // 4)
        b_lo, a_lo, d_lo, b_hi, a_hi, d_hi = _chunk(c2, 2 * C, first + 2 * C, tile_start, V_rows, vocab_size, s_lo,
                                                    s_hi, o_lo, o_hi, n_lo, n_hi, b_lo, a_lo, d_lo, b_hi, a_hi, d_hi,
                                                    _pick_dep(r1, r0, LOOKAHEAD), False, LOOKAHEAD > 0, BLOCK_B,
                                                    NOISE, FAST_LOG)
        r2 = b_hi
        b_lo, a_lo, d_lo, b_hi, a_hi, d_hi = _chunk(c3, 3 * C, first + 3 * C, tile_start, V_rows, vocab_size, s_lo,
                                                    s_hi, o_lo, o_hi, n_lo, n_hi, b_lo, a_lo, d_lo, b_hi, a_hi, d_hi,
                                                    _pick_dep(r2, r1, LOOKAHEAD), False, LOOKAHEAD > 0, BLOCK_B,
                                                    NOISE, FAST_LOG)
        r3 = b_hi
        c4, c5 = _col_halves(q2, BLOCK_B, BLOCK_V // 4)
        b_lo, a_lo, d_lo, b_hi, a_hi, d_hi = _chunk(c4, 4 * C, first + 4 * C, tile_start, V_rows, vocab_size, s_lo,
                                                    s_hi, o_lo, o_hi, n_lo, n_hi, b_lo, a_lo, d_lo, b_hi, a_hi, d_hi,
                                                    _pick_dep(r3, r2, LOOKAHEAD), False, LOOKAHEAD > 0, BLOCK_B,
                                                    NOISE, FAST_LOG)
        r4 = b_hi
        b_lo, a_lo, d_lo, b_hi, a_hi, d_hi = _chunk(c5, 5 * C, first + 5 * C, tile_start, V_rows, vocab_size, s_lo,
                                                    s_hi, o_lo, o_hi, n_lo, n_hi, b_lo, a_lo, d_lo, b_hi, a_hi, d_hi,
                                                    _pick_dep(r4, r3, LOOKAHEAD), False, LOOKAHEAD > 0, BLOCK_B,
                                                    NOISE, FAST_LOG)
        r5 = b_hi
        c6, c7 = _col_halves(q3, BLOCK_B, BLOCK_V // 4)
        b_lo, a_lo, d_lo, b_hi, a_hi, d_hi = _chunk(c6, 6 * C, first + 6 * C, tile_start, V_rows, vocab_size, s_lo,
                                                    s_hi, o_lo, o_hi, n_lo, n_hi, b_lo, a_lo, d_lo, b_hi, a_hi, d_hi,
                                                    _pick_dep(r5, r4, LOOKAHEAD), False, LOOKAHEAD > 0, BLOCK_B,
                                                    NOISE, FAST_LOG)
        r6 = b_hi
        b_lo, a_lo, d_lo, b_hi, a_hi, d_hi = _chunk(c7, 7 * C, first + 7 * C, tile_start, V_rows, vocab_size, s_lo,
                                                    s_hi, o_lo, o_hi, n_lo, n_hi, b_lo, a_lo, d_lo, b_hi, a_hi, d_hi,
                                                    _pick_dep(r6, r5, LOOKAHEAD), False, LOOKAHEAD > 0, BLOCK_B,
                                                    NOISE, FAST_LOG)
        _store_rows(b_lo, a_lo, d_lo, rows_lo, t_lo, cand_f, cand_i, buf_offset, buf_offset_i, pid_v, stride_slot, B,
                    tile_start, vocab_start, PEER_TABLE, NPEERS)
        _store_rows(b_hi, a_hi, d_hi, rows_hi, t_hi, cand_f, cand_i, buf_offset, buf_offset_i, pid_v, stride_slot, B,
                    tile_start, vocab_start, PEER_TABLE, NPEERS)

    @gluon.jit
    def _epilogue_shared(acc, pid_b, pid_v, seed_ptr, seed_val, offset_ptr, offset_val, temp_ptr, temp_val, cand_f,
                         cand_i, B, V_rows, vocab_size, vocab_start, buf_offset, buf_offset_i, stride_slot,
                         BLOCK_B: gl.constexpr, BLOCK_V: gl.constexpr, SEED_PER_ROW: gl.constexpr,
                         OFFSET_PER_ROW: gl.constexpr, TEMP_PER_ROW: gl.constexpr, NOISE: gl.constexpr,
                         FAST_LOG: gl.constexpr, PEER_TABLE: gl.constexpr, NPEERS: gl.constexpr,
                         NCHUNK: gl.constexpr):
        """_epilogue's candidates by the ws kernel's epilogue code: each of NCHUNK column chunks of the accumulator goes
        through shared memory into the ws epilogue's quad layout (convert_layout), where a thread holds whole Philox
        quads (no swaps) and its registers are the accumulator's no longer (more independent chains in flight)."""
        W: gl.constexpr = BLOCK_V // NCHUNK
        # a warp spans 8 rows x 4 threads of quads (fused_sample_ws's ROW_THREADS = 8 on 4 warps)
        quad_layout: gl.constexpr = gl.BlockedLayout([1, 1], [8, 4], [4, 1], [1, 0])
        row_layout: gl.constexpr = gl.SliceLayout(1, quad_layout)
        zq = gl.zeros([BLOCK_B, W // 4], gl.int32, quad_layout)
        lay: gl.constexpr = gl.reshape(gl.join(gl.join(zq, zq), gl.join(zq, zq)), [BLOCK_B, W]).type.layout
        offs_b = pid_b * BLOCK_B + gl.arange(0, BLOCK_B, row_layout)
        seed, offset, scale, bad_temp = _row_params(offs_b, B, seed_ptr, seed_val, offset_ptr, offset_val, temp_ptr,
                                                    temp_val, SEED_PER_ROW, OFFSET_PER_ROW, TEMP_PER_ROW)
        scale = gl.convert_layout(scale, gl.SliceLayout(1, lay))[:, None]
        tile_start = pid_v * BLOCK_V
        first = vocab_start + tile_start
        cols = gl.arange(0, W, gl.SliceLayout(0, lay))
        h0, h1 = _col_halves(acc, BLOCK_B, BLOCK_V)
        x0, x1 = _col_halves(h0, BLOCK_B, BLOCK_V // 2)
        x2, x3 = _col_halves(h1, BLOCK_B, BLOCK_V // 2)
        if NCHUNK == 4:
            best, at, bad = _shared_chunk(x0, 0, first, tile_start, V_rows, vocab_size, seed, offset, scale, cols, lay,
                                          quad_layout, None, None, None, True, NOISE, FAST_LOG)
            best, at, bad = _shared_chunk(x1, W, first, tile_start, V_rows, vocab_size, seed, offset, scale, cols, lay,
                                          quad_layout, best, at, bad, False, NOISE, FAST_LOG)
            best, at, bad = _shared_chunk(x2, 2 * W, first, tile_start, V_rows, vocab_size, seed, offset, scale, cols,
                                          lay, quad_layout, best, at, bad, False, NOISE, FAST_LOG)
            best, at, bad = _shared_chunk(x3, 3 * W, first, tile_start, V_rows, vocab_size, seed, offset, scale, cols,
                                          lay, quad_layout, best, at, bad, False, NOISE, FAST_LOG)
        else:
            gl.static_assert(NCHUNK == 8, "the shared epilogue takes the tile in 4 or 8 column chunks")
            y0, y1 = _col_halves(x0, BLOCK_B, BLOCK_V // 4)
            best, at, bad = _shared_chunk(y0, 0, first, tile_start, V_rows, vocab_size, seed, offset, scale, cols, lay,
                                          quad_layout, None, None, None, True, NOISE, FAST_LOG)
            best, at, bad = _shared_chunk(y1, W, first, tile_start, V_rows, vocab_size, seed, offset, scale, cols, lay,
                                          quad_layout, best, at, bad, False, NOISE, FAST_LOG)
            y2, y3 = _col_halves(x1, BLOCK_B, BLOCK_V // 4)
            best, at, bad = _shared_chunk(y2, 2 * W, first, tile_start, V_rows, vocab_size, seed, offset, scale, cols,
                                          lay, quad_layout, best, at, bad, False, NOISE, FAST_LOG)
            best, at, bad = _shared_chunk(y3, 3 * W, first, tile_start, V_rows, vocab_size, seed, offset, scale, cols,
                                          lay, quad_layout, best, at, bad, False, NOISE, FAST_LOG)
            y4, y5 = _col_halves(x2, BLOCK_B, BLOCK_V // 4)
            best, at, bad = _shared_chunk(y4, 4 * W, first, tile_start, V_rows, vocab_size, seed, offset, scale, cols,
                                          lay, quad_layout, best, at, bad, False, NOISE, FAST_LOG)
            best, at, bad = _shared_chunk(y5, 5 * W, first, tile_start, V_rows, vocab_size, seed, offset, scale, cols,
                                          lay, quad_layout, best, at, bad, False, NOISE, FAST_LOG)
            y6, y7 = _col_halves(x3, BLOCK_B, BLOCK_V // 4)
            best, at, bad = _shared_chunk(y6, 6 * W, first, tile_start, V_rows, vocab_size, seed, offset, scale, cols,
                                          lay, quad_layout, best, at, bad, False, NOISE, FAST_LOG)
            best, at, bad = _shared_chunk(y7, 7 * W, first, tile_start, V_rows, vocab_size, seed, offset, scale, cols,
                                          lay, quad_layout, best, at, bad, False, NOISE, FAST_LOG)
        poisoned = gl.convert_layout(bad > 0, row_layout) | bad_temp
        score = gl.where(poisoned, float("nan"), gl.convert_layout(best, row_layout))
        idx = gl.where(poisoned, -1, first + gl.convert_layout(at, row_layout)).to(gl.int32)
        mask = offs_b < B
        store_fan_out(cand_f, buf_offset + pid_v * stride_slot + offs_b, score, mask, gl.float32, PEER_TABLE, NPEERS)
        store_fan_out(cand_i, buf_offset_i + pid_v * stride_slot + offs_b, idx, mask, gl.int32, PEER_TABLE, NPEERS)

    @gluon.jit
    def _shared_chunk(x, c0, first, tile_start, V_rows, vocab_size, seed, offset, scale, cols, lay: gl.constexpr,
                 quad_layout: gl.constexpr, best, at, bad, FIRST: gl.constexpr, NOISE: gl.constexpr,
                 FAST_LOG: gl.constexpr):
        """Columns c0 .. c0 + W - 1 (x: those columns of the accumulator) into the rows' running (best score, its
        column, any NaN / +inf logit), as fused_sample_ws's chunked epilogue merges its chunks."""
        W: gl.constexpr = x.shape[1]
        if not FIRST:  # this chunk's Philox once the chunk before is reduced (_after: else LLVM hoists them all)
            seed = _after64(seed, gl.convert_layout(best, seed.type.layout))
        col = c0 + cols
        valid = (first + col < vocab_size) & (tile_start + col < V_rows)
        logit = gl.where(valid[None, :], gl.convert_layout(x, lay), float("-inf"))
        q_bad = gl.max(((logit != logit) | (logit == float("inf"))).to(gl.int32), axis=1)
        if NOISE:
            g = gumbel_from_bits(_half_bits(seed, offset, first + c0, W, quad_layout, 0, FAST_LOG), FAST_LOG)
            score = perturb(logit, scale, g, FAST_LOG)
        else:
            score = logit
        q_best, q_at = _argmax_lowest(score, col)
        if FIRST:
            return q_best, q_at, q_bad
        else:
            take = q_best > best
            return gl.where(take, q_best, best), gl.where(take, q_at, at), gl.maximum(bad, q_bad)

    @gluon.jit
    def _consumer(ROLE: gl.constexpr, h_bufs, w_bufs, ready, empty, turn, seed_ptr, seed_val, offset_ptr, offset_val,
                  temp_ptr, temp_val, cand_f, cand_i, B, V_rows, vocab_size, vocab_start, buf_offset, buf_offset_i,
                  stride_slot, n_btiles, n_tiles, k_steps, BLOCK_B: gl.constexpr, BLOCK_V: gl.constexpr,
                  STAGES: gl.constexpr, SEED_PER_ROW: gl.constexpr, OFFSET_PER_ROW: gl.constexpr,
                  TEMP_PER_ROW: gl.constexpr, NOISE: gl.constexpr, FAST_LOG: gl.constexpr,
                  PEER_TABLE: gl.constexpr, NPEERS: gl.constexpr, LOOKAHEAD: gl.constexpr,
                  SHARED_EPILOGUE: gl.constexpr, acc_smem, acc_ready, acc_empty, EPI_WARPS: gl.constexpr, wait_ptr,
                  WAITS: gl.constexpr):
        # Consumer ROLE (0: the default partition, 1: a worker) takes this program's tiles j = ROLE, ROLE + 2, ...;
        # tile j's operands are the ring's iterations j * k_steps .. (j + 1) * k_steps - 1.
        acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                             instr_shape=[16, BLOCK_V, 16])
        pid = gl.program_id(0)
        P = gl.num_programs(0)
        m = 0  # this consumer's tiles so far
        w_rdy = pid.to(gl.int64) * 0  # (wait_probe's counts)
        w_turn = w_rdy
        w_tail = w_rdy
        if WAITS:
            c_start = sm_clock(pid)
        for t in range(pid + ROLE * P, n_tiles, 2 * P):
            it = (2 * m + ROLE) * k_steps
            # my turn: consumer 0's first passes at once (a fresh barrier's "previous" phase); then each waits for
            # the other's main loop before it
            w_turn = _wait_counted(turn.index(ROLE), (m + 1 - ROLE) & 1, w_turn, WAITS)
            acc = gl.zeros([BLOCK_B, BLOCK_V], gl.float32, acc_layout)
            for k in range(k_steps):
                s = it % STAGES
                w_rdy = _wait_counted(ready.index(s), (it // STAGES) & 1, w_rdy, WAITS)
                acc = warpgroup_mma(h_bufs.index(s), w_bufs.index(s).permute((1, 0)), acc, is_async=True)
                acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc, ))
                mbarrier.arrive(empty.index((it + STAGES - 1) % STAGES), pred=k > 0)
                it += 1
            # every fill of this tile awaited: the other consumer's main loop may start
            mbarrier.arrive(turn.index(1 - ROLE))
            if WAITS:
                c_tail = sm_clock(it)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
            mbarrier.arrive(empty.index((it + STAGES - 1) % STAGES), pred=k_steps > 0)
            pid_b = t % n_btiles
            pid_v = t // n_btiles
            if EPI_WARPS > 0:
                # hand the tile to the epilogue warps (fused_sample_ws's chunked hand-off, through this consumer's
                # own buffers): while this warpgroup waits for them to read the left half, the other multiplies
                NCH: gl.constexpr = acc_smem.shape[0] // 2
                left, right = _col_halves(acc, BLOCK_B, BLOCK_V)
                p0, p1 = _hand_off_phases(2 * m, 1)
                mbarrier.wait(acc_empty.index(ROLE), p0 ^ 1)
                _store_hand_off(acc_smem, ROLE * NCH, left, BLOCK_B, BLOCK_V // 2, NCH, True)
                mbarrier.arrive(acc_ready.index(ROLE))
                mbarrier.wait(acc_empty.index(ROLE), p1 ^ 1)
                _store_hand_off(acc_smem, ROLE * NCH, right, BLOCK_B, BLOCK_V // 2, NCH, True)
                mbarrier.arrive(acc_ready.index(ROLE))
            elif SHARED_EPILOGUE:
                _epilogue_shared(acc, pid_b, pid_v, seed_ptr, seed_val, offset_ptr, offset_val, temp_ptr, temp_val,
                                 cand_f, cand_i, B, V_rows, vocab_size, vocab_start, buf_offset, buf_offset_i,
                                 stride_slot, BLOCK_B, BLOCK_V, SEED_PER_ROW, OFFSET_PER_ROW, TEMP_PER_ROW, NOISE,
                                 FAST_LOG, PEER_TABLE, NPEERS, SHARED_EPILOGUE)
            else:
                _epilogue(acc, pid_b, pid_v, seed_ptr, seed_val, offset_ptr, offset_val, temp_ptr, temp_val, cand_f,
                          cand_i, B, V_rows, vocab_size, vocab_start, buf_offset, buf_offset_i, stride_slot, BLOCK_B,
                          BLOCK_V, SEED_PER_ROW, OFFSET_PER_ROW, TEMP_PER_ROW, NOISE, FAST_LOG, PEER_TABLE, NPEERS,
                          LOOKAHEAD)
            if WAITS:
                w_tail += sm_clock(it) - c_tail
            m += 1
        if WAITS:  # (launch_fused_pp's wait_probe, PP_WAIT_FIELDS)
            row = wait_ptr + pid * PP_WAIT_FIELDS + 4 * ROLE
            gl.store(row + 0, sm_clock(pid) - c_start)
            gl.store(row + 1, w_rdy)
            gl.store(row + 2, w_turn)
            gl.store(row + 3, w_tail)

    @gluon.jit
    def _epi_tile(acc_smem, base: gl.constexpr, acc_ready, acc_empty, m, t, seed_ptr, seed_val, offset_ptr,
                  offset_val, temp_ptr, temp_val, cand_f, cand_i, B, V_rows, vocab_size, vocab_start, buf_offset,
                  buf_offset_i, stride_slot, n_btiles, BLOCK_B: gl.constexpr, BLOCK_V: gl.constexpr,
                  EPI_WARPS: gl.constexpr, SEED_PER_ROW: gl.constexpr, OFFSET_PER_ROW: gl.constexpr,
                  TEMP_PER_ROW: gl.constexpr, NOISE: gl.constexpr, FAST_LOG: gl.constexpr,
                  PEER_TABLE: gl.constexpr, NPEERS: gl.constexpr, WAITS: gl.constexpr):
        """Tile t, a consumer's m-th, from its hand-off buffers base ..: fused_sample_ws's plain chunked epilogue.
        Returns the cycles spent waiting for its halves (WAITS; else 0)."""
        HALF: gl.constexpr = BLOCK_V // 2
        CHUNK: gl.constexpr = acc_smem.shape[2]
        quad_layout: gl.constexpr = gl.BlockedLayout([1, 1], [8, 4], [EPI_WARPS, 1], [1, 0])
        row_layout: gl.constexpr = gl.SliceLayout(1, quad_layout)
        pid_b = t % n_btiles
        pid_v = t // n_btiles
        offs_b = pid_b * BLOCK_B + gl.arange(0, BLOCK_B, row_layout)
        seed, offset, scale, bad_temp = _row_params(offs_b, B, seed_ptr, seed_val, offset_ptr, offset_val, temp_ptr,
                                                    temp_val, SEED_PER_ROW, OFFSET_PER_ROW, TEMP_PER_ROW)
        tile_start = pid_v * BLOCK_V
        p0, p1 = _hand_off_phases(2 * m, 1)
        best0, at0, bad0, w0 = _epilogue_half_chunked(acc_smem, base, acc_ready, acc_empty, p0, 0, seed, offset,
                                                      scale, tile_start, V_rows, vocab_size, vocab_start, HALF, CHUNK,
                                                      NOISE, FAST_LOG, quad_layout, WAITS)
        best1, at1, bad1, w1 = _epilogue_half_chunked(acc_smem, base, acc_ready, acc_empty, p1, 1, seed, offset,
                                                      scale, tile_start, V_rows, vocab_size, vocab_start, HALF, CHUNK,
                                                      NOISE, FAST_LOG, quad_layout, WAITS)
        take1 = best1 > best0  # the right half wins only when strictly larger (ties to the lower id)
        best = gl.convert_layout(gl.where(take1, best1, best0), row_layout)
        at = gl.convert_layout(gl.where(take1, at1, at0), row_layout)
        poisoned = gl.convert_layout((bad0 | bad1) > 0, row_layout) | bad_temp
        score = gl.where(poisoned, float("nan"), best)
        idx = gl.where(poisoned, -1, vocab_start + tile_start + at).to(gl.int32)
        mask = offs_b < B
        store_fan_out(cand_f, buf_offset + pid_v * stride_slot + offs_b, score, mask, gl.float32, PEER_TABLE, NPEERS)
        store_fan_out(cand_i, buf_offset_i + pid_v * stride_slot + offs_b, idx, mask, gl.int32, PEER_TABLE, NPEERS)
        return w0 + w1

    @gluon.jit
    def _epilogue_partition(acc_smem, acc_ready, acc_empty, seed_ptr, seed_val, offset_ptr, offset_val, temp_ptr,
                            temp_val, cand_f, cand_i, B, V_rows, vocab_size, vocab_start, buf_offset, buf_offset_i,
                            stride_slot, n_btiles, n_tiles, BLOCK_B: gl.constexpr, BLOCK_V: gl.constexpr,
                            EPI_WARPS: gl.constexpr, SEED_PER_ROW: gl.constexpr, OFFSET_PER_ROW: gl.constexpr,
                            TEMP_PER_ROW: gl.constexpr, NOISE: gl.constexpr, FAST_LOG: gl.constexpr,
                            PEER_TABLE: gl.constexpr, NPEERS: gl.constexpr, wait_ptr, WAITS: gl.constexpr):
        # EPI_WARPS warps of their own (epilogue_warps=): the program's tiles in order, consumer 0's from its
        # buffers 0 .., consumer 1's from NCH .., a pair of tiles a round (so each call's buffer base is static)
        NCH: gl.constexpr = acc_smem.shape[0] // 2
        pid = gl.program_id(0)
        P = gl.num_programs(0)
        m = 0
        w = pid.to(gl.int64) * 0
        if WAITS:
            c_start = sm_clock(pid)
        for t in range(pid, n_tiles, 2 * P):
            w += _epi_tile(acc_smem, 0, acc_ready.index(0), acc_empty.index(0), m, t, seed_ptr, seed_val, offset_ptr,
                           offset_val, temp_ptr, temp_val, cand_f, cand_i, B, V_rows, vocab_size, vocab_start,
                           buf_offset, buf_offset_i, stride_slot, n_btiles, BLOCK_B, BLOCK_V, EPI_WARPS, SEED_PER_ROW,
                           OFFSET_PER_ROW, TEMP_PER_ROW, NOISE, FAST_LOG, PEER_TABLE, NPEERS, WAITS)
            if t + P < n_tiles:
                w += _epi_tile(acc_smem, NCH, acc_ready.index(1), acc_empty.index(1), m, t + P, seed_ptr, seed_val,
                               offset_ptr, offset_val, temp_ptr, temp_val, cand_f, cand_i, B, V_rows, vocab_size,
                               vocab_start, buf_offset, buf_offset_i, stride_slot, n_btiles, BLOCK_B, BLOCK_V,
                               EPI_WARPS, SEED_PER_ROW, OFFSET_PER_ROW, TEMP_PER_ROW, NOISE, FAST_LOG, PEER_TABLE,
                               NPEERS, WAITS)
            m += 1
        if WAITS:  # (launch_fused_pp's wait_probe, PP_WAIT_FIELDS)
            row = wait_ptr + pid * PP_WAIT_FIELDS
            gl.store(row + 8, sm_clock(pid) - c_start)
            gl.store(row + 9, w)

    @gluon.jit
    def _load_partition(h_desc, w_desc, h_bufs, w_bufs, ready, empty, n_btiles, n_tiles, k_steps,
                        BLOCK_B: gl.constexpr, BLOCK_V: gl.constexpr, BLOCK_K: gl.constexpr, STAGES: gl.constexpr):
        # One warp: every tile of this program in order, a stage a k-step (fused_sample_ws._load_tile).
        it = 0
        w_emp = gl.program_id(0).to(gl.int64) * 0
        for t in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
            it, w_emp = _load_tile(h_desc, w_desc, h_bufs, w_bufs, ready, empty, it, (t % n_btiles) * BLOCK_B,
                                   (t // n_btiles) * BLOCK_V, k_steps, BLOCK_K, STAGES, 1, w_emp)

    @gluon.jit
    def fused_sample_pp_kernel(h_desc, w_desc, seed_ptr, seed_val, offset_ptr, offset_val, temp_ptr, temp_val,
                               cand_f, cand_i, B, V_rows, vocab_size, vocab_start, buf_offset, buf_offset_i,
                               stride_slot, n_btiles, n_tiles, k_steps, wait_ptr, STAGES: gl.constexpr,
                               CONSUMER_REGS: gl.constexpr, LOAD_REGS: gl.constexpr, SEED_PER_ROW: gl.constexpr,
                               OFFSET_PER_ROW: gl.constexpr, TEMP_PER_ROW: gl.constexpr, NOISE: gl.constexpr,
                               FAST_LOG: gl.constexpr, PEER_TABLE: gl.constexpr = False, NPEERS: gl.constexpr = 1,
                               LOOKAHEAD: gl.constexpr = 1, SHARED_EPILOGUE: gl.constexpr = 0,
                               EPI_WARPS: gl.constexpr = 0, EPI_REGS: gl.constexpr = 0, EPI_CHUNK: gl.constexpr = 16,
                               WAITS: gl.constexpr = False):
        BLOCK_B: gl.constexpr = h_desc.block_type.shape[0]
        BLOCK_K: gl.constexpr = h_desc.block_type.shape[1]
        BLOCK_V: gl.constexpr = w_desc.block_type.shape[0]
        dtype: gl.constexpr = h_desc.dtype
        h_bufs = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_B, BLOCK_K], h_desc.layout)
        w_bufs = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_V, BLOCK_K], w_desc.layout)
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(ready.index(i), count=1)
            mbarrier.init(empty.index(i), count=1)
        for i in gl.static_range(2):
            mbarrier.init(turn.index(i), count=1)
        # EPI_WARPS (epilogue_warps=): the consumers hand their tiles to that many epilogue warps of their own through
        # a buffer set each (fused_sample_ws's chunked hand-off: each column half as EPI_CHUNK-column chunks)
        CHUNK: gl.constexpr = EPI_CHUNK
        NCH: gl.constexpr = BLOCK_V // 2 // CHUNK
        acc_smem = gl.allocate_shared_memory(gl.float32, [2 * NCH if EPI_WARPS > 0 else 2, BLOCK_B, CHUNK],
                                             gl.SwizzledSharedLayout(4, 32 // CHUNK, CHUNK // 4, order=[1, 0]))
        acc_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        acc_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(2):
            mbarrier.init(acc_ready.index(i), count=1)
            mbarrier.init(acc_empty.index(i), count=1)
        # (the partitions' arguments spelled out: a tuple built here would turn the constexprs into tensors)
        if EPI_WARPS > 0:
            gl.warp_specialize([
                (_consumer, (0, h_bufs, w_bufs, ready, empty, turn, seed_ptr, seed_val, offset_ptr, offset_val,
                             temp_ptr, temp_val, cand_f, cand_i, B, V_rows, vocab_size, vocab_start, buf_offset,
                             buf_offset_i, stride_slot, n_btiles, n_tiles, k_steps, BLOCK_B, BLOCK_V, STAGES,
                             SEED_PER_ROW, OFFSET_PER_ROW, TEMP_PER_ROW, NOISE, FAST_LOG, PEER_TABLE, NPEERS, LOOKAHEAD,
                             SHARED_EPILOGUE, acc_smem, acc_ready, acc_empty, EPI_WARPS, wait_ptr, WAITS)),
                (_consumer, (1, h_bufs, w_bufs, ready, empty, turn, seed_ptr, seed_val, offset_ptr, offset_val,
                             temp_ptr, temp_val, cand_f, cand_i, B, V_rows, vocab_size, vocab_start, buf_offset,
                             buf_offset_i, stride_slot, n_btiles, n_tiles, k_steps, BLOCK_B, BLOCK_V, STAGES,
                             SEED_PER_ROW, OFFSET_PER_ROW, TEMP_PER_ROW, NOISE, FAST_LOG, PEER_TABLE, NPEERS, LOOKAHEAD,
                             SHARED_EPILOGUE, acc_smem, acc_ready, acc_empty, EPI_WARPS, wait_ptr, WAITS)),
                (_epilogue_partition, (acc_smem, acc_ready, acc_empty, seed_ptr, seed_val, offset_ptr, offset_val,
                                       temp_ptr, temp_val, cand_f, cand_i, B, V_rows, vocab_size, vocab_start,
                                       buf_offset, buf_offset_i, stride_slot, n_btiles, n_tiles, BLOCK_B, BLOCK_V,
                                       EPI_WARPS, SEED_PER_ROW, OFFSET_PER_ROW, TEMP_PER_ROW, NOISE, FAST_LOG,
                                       PEER_TABLE, NPEERS, wait_ptr, WAITS)),
                (_load_partition, (h_desc, w_desc, h_bufs, w_bufs, ready, empty, n_btiles, n_tiles, k_steps, BLOCK_B,
                                   BLOCK_V, BLOCK_K, STAGES)),
            ], [4, EPI_WARPS, 1], [CONSUMER_REGS, EPI_REGS, LOAD_REGS])
        else:
            gl.warp_specialize([
                (_consumer, (0, h_bufs, w_bufs, ready, empty, turn, seed_ptr, seed_val, offset_ptr, offset_val,
                             temp_ptr, temp_val, cand_f, cand_i, B, V_rows, vocab_size, vocab_start, buf_offset,
                             buf_offset_i, stride_slot, n_btiles, n_tiles, k_steps, BLOCK_B, BLOCK_V, STAGES,
                             SEED_PER_ROW, OFFSET_PER_ROW, TEMP_PER_ROW, NOISE, FAST_LOG, PEER_TABLE, NPEERS, LOOKAHEAD,
                             SHARED_EPILOGUE, acc_smem, acc_ready, acc_empty, EPI_WARPS, wait_ptr, WAITS)),
                (_consumer, (1, h_bufs, w_bufs, ready, empty, turn, seed_ptr, seed_val, offset_ptr, offset_val,
                             temp_ptr, temp_val, cand_f, cand_i, B, V_rows, vocab_size, vocab_start, buf_offset,
                             buf_offset_i, stride_slot, n_btiles, n_tiles, k_steps, BLOCK_B, BLOCK_V, STAGES,
                             SEED_PER_ROW, OFFSET_PER_ROW, TEMP_PER_ROW, NOISE, FAST_LOG, PEER_TABLE, NPEERS, LOOKAHEAD,
                             SHARED_EPILOGUE, acc_smem, acc_ready, acc_empty, EPI_WARPS, wait_ptr, WAITS)),
                (_load_partition, (h_desc, w_desc, h_bufs, w_bufs, ready, empty, n_btiles, n_tiles, k_steps, BLOCK_B,
                                   BLOCK_V, BLOCK_K, STAGES)),
            ], [4, 1], [CONSUMER_REGS, LOAD_REGS])


def launch_fused_pp(hidden: torch.Tensor, weight: torch.Tensor, params: RowParams, layout: CandidateLayout,
                    dest: BufferPair, *, vocab_size: int, vocab_start: int = 0, shard: int = 0,
                    stages: int = PP_STAGES, grid_cap: int = 0, lookahead: int = PP_LOOKAHEAD,
                    batch: int = None, shared_epilogue: int = 0, epilogue_only: bool = False,
                    epilogue_warps: int = 0, epilogue_chunk: int = PP_HAND_OFF_CHUNK,
                    wait_probe: torch.Tensor = None) -> None:
    """Every (row, vocabulary tile)'s candidate of ``hidden @ weight.T`` into block ``shard`` of ``dest``: the same
    candidates as ``fused_sample_ws.launch_fused_ws`` (plain calls) bit for bit, on the ping-pong kernel above.

    hidden [B, D], weight [V_rows, D]: bf16 / fp16 on an sm_90 GPU, rows 16-byte aligned (``ws_supported``'s
    conditions). A batch that is not a multiple of 128 rows reads past the hidden's end (the copy engine's zero fill:
    correct, slower; pad the hidden for speed). ``params``: temperature, seed, offset as scalars or ``[B]`` tensors;
    no processors. stages: operand stages in shared memory (2-6, 32 KB each). grid_cap: at most this many
    persistent programs (0: one per SM). lookahead (benchmarks): the epilogue's chunk i draws its noise once chunk
    i - lookahead is reduced (1, 2), or whenever ptxas likes (0: it hoists every chunk's, and spills); the same
    candidates. shared_epilogue (v111b): 4 or 8: each consumer moves its accumulator through shared memory in that
    many column chunks into fused_sample_ws's epilogue layout and runs that epilogue's code (lookahead then unused);
    0: the epilogue on the accumulator's registers; the same candidates. batch: the rows to sample when ``hidden`` is
    padded with extra rows (as launch_fused_ws's); default all of hidden's rows. epilogue_only (benchmarks): skip the
    main loops (zero logits), to time the epilogues alone (the two consumers' then run side by side).
    epilogue_warps (v113 / v115, benchmarks): 4 or 8: the consumers only multiply, and hand each tile to that many
    epilogue warps of their own through shared memory (fused_sample_ws's chunked hand-off and epilogue; a buffer set
    per consumer, so one consumer's wait for the epilogue overlaps the other's main loop; registers
    PP_EPI_REGISTERS); stages at most 5; 0: each consumer samples its own tiles (shared_epilogue / lookahead as
    above); the same candidates. epilogue_chunk: the columns (16 or 32) the epilogue warps take at a time
    (PP_HAND_OFF_CHUNK). wait_probe (v116, benchmarks): an int64 CUDA tensor [programs, PP_WAIT_FIELDS]
    (:func:`new_pp_wait_probe`) that each program fills with cycle counts (PP_WAIT_FIELDS says which); the same
    candidates."""
    if not HAVE_GLUON:
        raise RuntimeError("launch_fused_pp needs Triton's Gluon (Triton >= 3.5)")
    if not ws_supported(hidden, weight, params, block_b=PP_BLOCK_B):
        raise ValueError("launch_fused_pp needs an sm_90 GPU and bf16 / fp16 operands of one dtype, rows 16-byte "
                         "aligned (fused_sample_ws.ws_supported)")
    if params.processing is not None:
        raise ValueError("launch_fused_pp serves plain calls only (no processors)")
    if layout.n_fields != 1 or layout.checked:
        raise ValueError("launch_fused_pp writes the plain candidate layout only (score and id, no call header)")
    if epilogue_warps not in (0, 4, 8):
        raise ValueError(f"epilogue_warps must be 0, 4 or 8, got {epilogue_warps}")
    if epilogue_warps and (shared_epilogue or stages > 5):
        raise ValueError("epilogue_warps takes no shared_epilogue and at most 5 stages (the hand-off's 64 KB)")
    if epilogue_chunk not in (16, 32):
        raise ValueError(f"epilogue_chunk must be 16 or 32, got {epilogue_chunk}")
    if shared_epilogue not in (0, 4, 8):
        raise ValueError(f"shared_epilogue must be 0, 4 or 8, got {shared_epilogue}")
    if lookahead not in (0, 1, 2):
        raise ValueError(f"lookahead must be 0, 1 or 2, got {lookahead}")
    if not 2 <= stages <= 6:
        raise ValueError(f"stages must be in [2, 6], got {stages}")
    if dest.parity is not None:
        raise ValueError("launch_fused_pp does not read a device parity")
    B, D = hidden.shape
    if batch is not None:
        if not 0 < batch <= B:
            raise ValueError(f"batch must be in [1, {B}] (hidden's rows), got {batch}")
        B = batch
    if B == 0:
        raise ValueError("hidden has no rows")
    V_rows = weight.shape[0]
    n_vtiles = layout.check_fit(B, V_rows, PP_BLOCK_V, shard, vocab_start)
    n_btiles = cdiv(B, PP_BLOCK_B)
    n_tiles = n_btiles * n_vtiles
    gdt = gl.bfloat16 if hidden.dtype == torch.bfloat16 else gl.float16
    smem = gl.NVMMASharedLayout.get_default_for([PP_BLOCK_B, PP_BLOCK_K], gdt)
    h_desc = GluonDescriptor.from_tensor(hidden, [PP_BLOCK_B, PP_BLOCK_K], smem)
    w_desc = GluonDescriptor.from_tensor(weight, [PP_BLOCK_V, PP_BLOCK_K], smem)
    dummy = dest.i
    seed_p, seed_v, seed_row = row_param_args(params.seed, dummy)
    off_p, off_v, off_row = row_param_args(params.offset, dummy)
    temp_p, temp_v, temp_row = row_param_args(params.temperature, dummy)
    cap = sm_count(hidden.device)
    if grid_cap:
        cap = min(cap, grid_cap)
    programs = min(n_tiles, cap)
    if wait_probe is not None and (wait_probe.dtype != torch.int64 or wait_probe.dim() != 2
                                   or wait_probe.shape[1] != PP_WAIT_FIELDS.value or not wait_probe.is_contiguous()
                                   or wait_probe.shape[0] < programs or wait_probe.device != hidden.device):
        raise ValueError(f"wait_probe must be a contiguous int64 tensor [>= {programs} programs, "
                         f"{PP_WAIT_FIELDS.value}] on {hidden.device}, got {tuple(wait_probe.shape)} "
                         f"{wait_probe.dtype} on {wait_probe.device}")
    maxnreg, consumer_regs, epi_regs = PP_EPI_REGISTERS.get(epilogue_warps, (PP_MAXNREG, PP_CONSUMER_REGS, 0))
    fused_sample_pp_kernel[(programs, )](
        h_desc, w_desc, seed_p, seed_v, off_p, off_v, temp_p, float(temp_v), dest.f, dest.i, B, V_rows, vocab_size,
        vocab_start, dest.base_f + shard * layout.stride_shard, dest.base_i + shard * layout.stride_shard_i,
        layout.stride_slot, n_btiles, n_tiles, 0 if epilogue_only else cdiv(D, PP_BLOCK_K),
        dummy if wait_probe is None else wait_probe, STAGES=stages,
        CONSUMER_REGS=consumer_regs, LOAD_REGS=WS_LOAD_REGS,
        SEED_PER_ROW=seed_row, OFFSET_PER_ROW=off_row, TEMP_PER_ROW=temp_row,
        NOISE=not params.all_greedy, FAST_LOG=fast_log_ok(hidden.device), PEER_TABLE=dest.peer_table,
        NPEERS=dest.npeers or 1, LOOKAHEAD=lookahead, SHARED_EPILOGUE=shared_epilogue, EPI_WARPS=epilogue_warps,
        EPI_REGS=epi_regs, EPI_CHUNK=epilogue_chunk, WAITS=wait_probe is not None, num_warps=4, maxnreg=maxnreg)


def new_pp_wait_probe(device) -> torch.Tensor:
    """A blank ``wait_probe`` for :func:`launch_fused_pp` (benchmarks): int64 [one row per SM, PP_WAIT_FIELDS], every
    field -1, so that a row no program wrote, or a field a launch does not fill (8 and 9 without epilogue warps),
    shows as -1."""
    return torch.full((sm_count(device), PP_WAIT_FIELDS.value), -1, dtype=torch.int64, device=device)
