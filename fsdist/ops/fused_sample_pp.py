"""Stage 1 on Hopper with two ping-pong MMA warpgroups, each multiplying its own tile and then sampling it.

``fused_sample_ws.py``'s kernel has one MMA warpgroup and a separate epilogue: the accumulator crosses shared memory
(two 32 KB hand-offs a tile), and the MMA warpgroup waits for the epilogue to take each half before its next tile
(docs/performance.md v86-v110). This kernel (issue 14's ping-pong lever, v111) keeps the 128 x 128 x 64 tile and its
operand stream, but gives each program two *consumer* warpgroups and one load warp:

* the **load** warp fills a ring of operand stages with TMA, tile after tile (the same copies as the ws kernel's);
* consumer warpgroup c takes the program's tiles j with j % 2 == c: it runs the wgmma main loop of its tile, then
  samples the tile itself while the other warpgroup runs the next tile's main loop. A "turn" barrier pair orders the
  main loops (A, B, A, ...), so the tensor cores serve one warpgroup at a time and the stage ring's phases stay
  unambiguous (a warpgroup waits for a stage's fill only after the other has waited for every earlier fill).

The epilogue (``shared_epilogue`` = 8 or 4 column chunks, v111b) moves the accumulator a column chunk at a time
through shared memory (``convert_layout``) into the ws epilogue's quad layout, where a thread holds whole Philox quads,
and runs that epilogue's code: ``fused_sample_ws``'s candidates bit for bit (the same wgmmas in the same K order, the
same noise, the same ``perturb`` rounding, ties to the lowest column).

Plain calls only (temperature, seed, offset scalar or ``[B]``; the fan-out to tensor-parallel peers' buffers): no
logprobs, kept logits, processors, call header or device parity. ``fused_sample.launch_fused`` runs it
(``configs.PP_GREEDY_ON``) for all-greedy plain calls from ``configs.PP_GREEDY_MIN_BATCH`` rows (greedy: no consumer
ever waits for a hand-off; whole calls 4-11% faster than on the ws kernel at B = 256-1024 on an H100, v112). With
noise no arrangement of its epilogue kept up with the ws kernel on an H100, so sampled calls keep the ws kernel:
each consumer sampling its own tile from registers (v111) or through shared memory (v111b), or the consumers handing
their tiles to 4 or 8 epilogue warps of their own (v113-v116: up to 1.4x the ws kernel's time; 3-5% faster only
at D = 4096 B = 256 with 4 warps). Those variants were removed after v116 (the register epilogue, ``lookahead``,
``epilogue_warps``; commit ef07ffb has them); docs/performance.md keeps their measurements.
"""
import torch
import triton
import triton.language as tl

from ..params import RowParams
from .epilogue import perturb, row_temperature
from .layout import BufferPair, CandidateLayout, store_fan_out
from .noise import gumbel_from_bits
from .utils import cdiv, fast_log_ok, load_row_param, row_param_args, sm_clock, sm_count

try:  # Gluon ships with Triton >= 3.5; without it (or its Hopper module) this path is off.
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier, warpgroup_mma, warpgroup_mma_wait
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor

    from .fused_sample_ws import (WS_LOAD_REGS, _argmax_lowest, _col_halves, _half_bits, _load_tile, _wait_counted,
                                  ws_supported)

    HAVE_GLUON = True
except ImportError:  # pragma: no cover - depends on the installed Triton
    HAVE_GLUON = False

PP_BLOCK_B = 128
PP_BLOCK_V = 128
PP_BLOCK_K = 64
PP_STAGES = 5  # x 32 KB of operands; no accumulator hand-off buffer
# Registers: three warpgroups (two consumers, the load warp padded to one) share 64K: the launch gives every
# thread maxnreg = 168 (3 x 128 x 168 <= 64K), then (setmaxnreg) the load warpgroup drops to WS_LOAD_REGS and both
# consumers take PP_CONSUMER_REGS (24 + 2 x 240 = 504 <= 3 x 168).
PP_MAXNREG = 168
PP_CONSUMER_REGS = 240
# launch_fused_pp(wait_probe=) (v116, benchmarks): int64 fields a program's row holds (%clock64 cycles). Consumer r
# (0, 1) at 4 r: its cycles in all, waiting for operand stages, waiting for its turn (the other's main loop), and its
# tiles' tails (from the end of a main loop to the next turn wait: the last wgmma's retire, then its epilogue). Each
# is one thread's count (warp 0 of the consumer).
PP_WAIT_FIELDS = triton.language.constexpr(8)

if HAVE_GLUON:

    @triton.jit
    def _after64(x, dep):
        """x (a row's seed), as a value the compiler must think depends on dep (any 32-bit value of the same shape): a
        chunk's Philox chains then start only once the chunk before is reduced, so that their temporaries are not all
        live at once (LLVM otherwise hoists them: they do not depend on the logits). The PTX's mov does not name dep,
        so only LLVM's order is bound; ptxas keeps it."""
        return tl.inline_asm_elementwise("mov.b64 $0, $1;", "=l,l,r", [x, dep], dtype=tl.int64, is_pure=True, pack=1)

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
    def _epilogue_shared(acc, pid_b, pid_v, seed_ptr, seed_val, offset_ptr, offset_val, temp_ptr, temp_val, cand_f,
                         cand_i, B, V_rows, vocab_size, vocab_start, buf_offset, buf_offset_i, stride_slot,
                         BLOCK_B: gl.constexpr, BLOCK_V: gl.constexpr, SEED_PER_ROW: gl.constexpr,
                         OFFSET_PER_ROW: gl.constexpr, TEMP_PER_ROW: gl.constexpr, NOISE: gl.constexpr,
                         FAST_LOG: gl.constexpr, PEER_TABLE: gl.constexpr, NPEERS: gl.constexpr,
                         NCHUNK: gl.constexpr):
        """Each row's candidate of one tile by the ws kernel's epilogue code: each of NCHUNK column chunks of the
        accumulator goes through shared memory into the ws epilogue's quad layout (convert_layout), where a thread
        holds whole Philox quads and its registers are the accumulator's no longer (more independent chains in
        flight)."""
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
        if not FIRST:  # this chunk's Philox once the chunk before is reduced (_after64: else LLVM hoists them all)
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
                  PEER_TABLE: gl.constexpr, NPEERS: gl.constexpr, SHARED_EPILOGUE: gl.constexpr, wait_ptr,
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
            _epilogue_shared(acc, pid_b, pid_v, seed_ptr, seed_val, offset_ptr, offset_val, temp_ptr, temp_val, cand_f,
                             cand_i, B, V_rows, vocab_size, vocab_start, buf_offset, buf_offset_i, stride_slot, BLOCK_B,
                             BLOCK_V, SEED_PER_ROW, OFFSET_PER_ROW, TEMP_PER_ROW, NOISE, FAST_LOG, PEER_TABLE, NPEERS,
                             SHARED_EPILOGUE)
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
                               SHARED_EPILOGUE: gl.constexpr = 8, WAITS: gl.constexpr = False):
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
        # (the partitions' arguments spelled out: a tuple built here would turn the constexprs into tensors)
        gl.warp_specialize([
            (_consumer, (0, h_bufs, w_bufs, ready, empty, turn, seed_ptr, seed_val, offset_ptr, offset_val, temp_ptr,
                         temp_val, cand_f, cand_i, B, V_rows, vocab_size, vocab_start, buf_offset, buf_offset_i,
                         stride_slot, n_btiles, n_tiles, k_steps, BLOCK_B, BLOCK_V, STAGES, SEED_PER_ROW,
                         OFFSET_PER_ROW, TEMP_PER_ROW, NOISE, FAST_LOG, PEER_TABLE, NPEERS, SHARED_EPILOGUE, wait_ptr,
                         WAITS)),
            (_consumer, (1, h_bufs, w_bufs, ready, empty, turn, seed_ptr, seed_val, offset_ptr, offset_val, temp_ptr,
                         temp_val, cand_f, cand_i, B, V_rows, vocab_size, vocab_start, buf_offset, buf_offset_i,
                         stride_slot, n_btiles, n_tiles, k_steps, BLOCK_B, BLOCK_V, STAGES, SEED_PER_ROW,
                         OFFSET_PER_ROW, TEMP_PER_ROW, NOISE, FAST_LOG, PEER_TABLE, NPEERS, SHARED_EPILOGUE, wait_ptr,
                         WAITS)),
            (_load_partition, (h_desc, w_desc, h_bufs, w_bufs, ready, empty, n_btiles, n_tiles, k_steps, BLOCK_B,
                               BLOCK_V, BLOCK_K, STAGES)),
        ], [4, 1], [CONSUMER_REGS, LOAD_REGS])


def launch_fused_pp(hidden: torch.Tensor, weight: torch.Tensor, params: RowParams, layout: CandidateLayout,
                    dest: BufferPair, *, vocab_size: int, vocab_start: int = 0, shard: int = 0,
                    stages: int = PP_STAGES, grid_cap: int = 0, batch: int = None, shared_epilogue: int = 8,
                    epilogue_only: bool = False, wait_probe: torch.Tensor = None) -> None:
    """Every (row, vocabulary tile)'s candidate of ``hidden @ weight.T`` into block ``shard`` of ``dest``: the same
    candidates as ``fused_sample_ws.launch_fused_ws`` (plain calls) bit for bit, on the ping-pong kernel above.

    hidden [B, D], weight [V_rows, D]: bf16 / fp16 on an sm_90 GPU, rows 16-byte aligned (``ws_supported``'s
    conditions). A batch that is not a multiple of 128 rows reads past the hidden's end (the copy engine's zero fill:
    correct, slower; pad the hidden for speed). ``params``: temperature, seed, offset as scalars or ``[B]`` tensors;
    no processors. stages: operand stages in shared memory (2-6, 32 KB each). grid_cap: at most this many
    persistent programs (0: one per SM). batch: the rows to sample when ``hidden`` is padded with extra rows (as
    launch_fused_ws's); default all of hidden's rows. shared_epilogue: the column chunks (8 or 4) in which each
    consumer moves its accumulator through shared memory into the epilogue's layout; the same candidates.
    epilogue_only (benchmarks): skip the main loops (zero logits), to time the epilogues alone (the two consumers'
    then run side by side). wait_probe (v116, benchmarks): an int64 CUDA tensor [programs, PP_WAIT_FIELDS]
    (:func:`new_pp_wait_probe`) that each program fills with cycle counts (PP_WAIT_FIELDS says which); the same
    candidates.

    Example (what ``fused_sample.launch_fused`` does for an all-greedy call of 350 rows)::

        padded = fused_sample.tile_operand(hidden, 128)  # 350 rows zero-padded to 384: whole tiles for the copy engine
        launch_fused_pp(padded, weight, RowParams(0.0, 0, 0), layout, dest, vocab_size=V, batch=350)
    """
    if not HAVE_GLUON:
        raise RuntimeError("launch_fused_pp needs Triton's Gluon (Triton >= 3.5)")
    if not ws_supported(hidden, weight, params, block_b=PP_BLOCK_B):
        raise ValueError("launch_fused_pp needs an sm_90 GPU and bf16 / fp16 operands of one dtype, rows 16-byte "
                         "aligned (fused_sample_ws.ws_supported)")
    if params.processing is not None:
        raise ValueError("launch_fused_pp serves plain calls only (no processors)")
    if layout.n_fields != 1 or layout.checked:
        raise ValueError("launch_fused_pp writes the plain candidate layout only (score and id, no call header)")
    if shared_epilogue not in (4, 8):
        raise ValueError(f"shared_epilogue must be 4 or 8, got {shared_epilogue}")
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
    fused_sample_pp_kernel[(programs, )](
        h_desc, w_desc, seed_p, seed_v, off_p, off_v, temp_p, float(temp_v), dest.f, dest.i, B, V_rows, vocab_size,
        vocab_start, dest.base_f + shard * layout.stride_shard, dest.base_i + shard * layout.stride_shard_i,
        layout.stride_slot, n_btiles, n_tiles, 0 if epilogue_only else cdiv(D, PP_BLOCK_K),
        dummy if wait_probe is None else wait_probe, STAGES=stages, CONSUMER_REGS=PP_CONSUMER_REGS,
        LOAD_REGS=WS_LOAD_REGS, SEED_PER_ROW=seed_row, OFFSET_PER_ROW=off_row, TEMP_PER_ROW=temp_row,
        NOISE=not params.all_greedy, FAST_LOG=fast_log_ok(hidden.device), PEER_TABLE=dest.peer_table,
        NPEERS=dest.npeers or 1, SHARED_EPILOGUE=shared_epilogue, WAITS=wait_probe is not None, num_warps=4,
        maxnreg=PP_MAXNREG)


def new_pp_wait_probe(device) -> torch.Tensor:
    """A blank ``wait_probe`` for :func:`launch_fused_pp` (benchmarks): int64 [one row per SM, PP_WAIT_FIELDS], every
    field -1, so that a row no program wrote shows as -1."""
    return torch.full((sm_count(device), PP_WAIT_FIELDS.value), -1, dtype=torch.int64, device=device)
