"""The chunked path's sampling pass: Gumbel-max over fp32 logits that cuBLAS wrote.

For large batches fsdist lets cuBLAS compute the logits of one vocabulary chunk
(sized to stay in L2) and then runs this kernel over them. It writes exactly the
candidates the fused kernel's epilogue would write for the same logits (same
noise, same tiles, same layout), so both paths give the same token.

This pass is pure elementwise work (one Philox-4x32-10 per four ids, two logs per
id) over B x V elements: at B = 256 that is ~39 M Gumbel variates per call, so its
instruction count, not memory, sets its cost. Two things keep it lean:

* Lanes instead of a reshape. Philox yields the noise of ids 4q .. 4q+3 as four
  separate words. Rather than interleaving those words into a [rows, BLOCK_V]
  tile (a layout change that goes through shared memory), the kernel loads the
  logits tile contiguously and splits it in registers into four [rows, BLOCK_V / 4]
  lanes, ``lane j = ids 4q + j`` (faster than four strided loads), and pairs
  each lane with its own word. The argmax does not care about column order; the
  winning id is rebuilt as 4q + j.
* Cheap reductions. The four lanes are merged elementwise, then one float max
  that propagates NaN (it doubles as the poisoned-row check) and one integer min
  over the ids that reach it (ties go to the lowest id, as in the fused kernel).
"""
import triton
import triton.language as tl

from .fused_sample import _load_row_param, row_temperature, write_candidates
from .noise import STREAM_VOCAB, gumbel_from_bits, philox_words
from .parity import parity_offsets


@triton.jit
def _nan_max(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _lane_scores(x, valid, noise_scale, bits, NOISE: tl.constexpr, FAST_LOG: tl.constexpr):
    """(masked raw logits, perturbed scores logit + T * Gumbel) of one lane."""
    logit = tl.where(valid, x, float("-inf"))
    if NOISE:
        score = logit + noise_scale[:, None] * gumbel_from_bits(bits, FAST_LOG)
    else:
        score = logit
    return logit, score


@triton.jit
def _lane_sum(s, valid, tmax_safe, inv_t):
    live = valid & (s > float("-inf"))
    return tl.sum(tl.where(live, tl.exp((s - tmax_safe[:, None]) * inv_t[:, None]), 0.0), axis=1)


@triton.jit
def sample_logits_kernel(
    logits_ptr, stride_lb, tile_base, tile_end,
    seed_ptr, seed_val, offset_ptr, offset_val, temp_ptr, temp_val,
    cand_f, cand_i,
    B, V_rows, vocab_size, vocab_start,
    buf_offset, buf_offset_i, stride_field, stride_slot,
    parity_ptr, parity_stride_f, parity_stride_i,
    BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr, TILES: tl.constexpr,
    SEED_PER_ROW: tl.constexpr, OFFSET_PER_ROW: tl.constexpr, TEMP_PER_ROW: tl.constexpr,
    NOISE: tl.constexpr, LOGPROBS: tl.constexpr,
    PEER_TABLE: tl.constexpr, NPEERS: tl.constexpr, FAST_LOG: tl.constexpr,
    DEVICE_PARITY: tl.constexpr,
):
    """Candidates of vocabulary tiles [tile_base, tile_end) from a logits chunk whose column 0
    is weight row tile_base * BLOCK_V. A program covers BLOCK_B rows and TILES tiles."""
    Q: tl.constexpr = BLOCK_V // 4
    BIG: tl.constexpr = 1 << 30
    pid_b = tl.program_id(0)
    offs_b = pid_b * BLOCK_B + tl.arange(0, BLOCK_B)
    mask_b = offs_b < B
    q = tl.arange(0, Q)

    # Row parameters: loaded once, shared by the program's tiles.
    temp = _load_row_param(temp_ptr, temp_val, offs_b, mask_b, tl.float32, TEMP_PER_ROW)
    inv_t, noise_scale, greedy, bad_temp = row_temperature(temp)
    seed = _load_row_param(seed_ptr, seed_val, offs_b, mask_b, tl.int64, SEED_PER_ROW)
    offset = _load_row_param(offset_ptr, offset_val, offs_b, mask_b, tl.int64, OFFSET_PER_ROW)
    row_ptr = logits_ptr + offs_b[:, None].to(tl.int64) * stride_lb
    buf_offset, buf_offset_i = parity_offsets(buf_offset, buf_offset_i, parity_ptr, parity_stride_f,
                                              parity_stride_i, DEVICE_PARITY)

    for t in tl.static_range(TILES):
        pid_v = tile_base + tl.program_id(1) * TILES + t
        if pid_v < tile_end:
            local = pid_v * BLOCK_V + 4 * q  # weight row of lane 0
            gid = vocab_start + local  # global id of lane 0
            v0 = (local < V_rows) & (gid < vocab_size)
            v1 = (local + 1 < V_rows) & (gid + 1 < vocab_size)
            v2 = (local + 2 < V_rows) & (gid + 2 < vocab_size)
            v3 = (local + 3 < V_rows) & (gid + 3 < vocab_size)
            # One contiguous (vectorised) load of the tile, then the lanes peeled off in registers.
            cols = (pid_v - tile_base) * BLOCK_V + tl.arange(0, BLOCK_V)
            inb = (pid_v * BLOCK_V + tl.arange(0, BLOCK_V)) < V_rows
            tile = tl.load(row_ptr + cols[None, :], mask=mask_b[:, None] & inb[None, :], other=0.0)
            xe, xo = tl.split(tl.reshape(tile, [BLOCK_B, Q, 2, 2]))  # lanes (0, 2) and (1, 3)
            x0, x2 = tl.split(xe)
            x1, x3 = tl.split(xo)
            if NOISE:
                r0, r1, r2, r3 = philox_words(seed[:, None], offset[:, None], (gid >> 2)[None, :], STREAM_VOCAB)
            else:
                r0 = 0
                r1 = 0
                r2 = 0
                r3 = 0
            s0, c0 = _lane_scores(x0, v0[None, :], noise_scale, r0, NOISE, FAST_LOG)
            s1, c1 = _lane_scores(x1, v1[None, :], noise_scale, r1, NOISE, FAST_LOG)
            s2, c2 = _lane_scores(x2, v2[None, :], noise_scale, r2, NOISE, FAST_LOG)
            s3, c3 = _lane_scores(x3, v3[None, :], noise_scale, r3, NOISE, FAST_LOG)

            # Lanes are merged elementwise first, so each row needs only one float and one
            # integer reduction. The max propagates NaN: a NaN logit makes m NaN, which
            # poisons the row (its noise is finite, so only the logit can be NaN); so does
            # a +inf logit (m = +inf).
            m = tl.reduce(_nan_max(_nan_max(c0, c1), _nan_max(c2, c3)), 1, _nan_max)
            mm = m[:, None]
            lane = tl.where(c0 == mm, 0, tl.where(c1 == mm, 1, tl.where(c2 == mm, 2, tl.where(c3 == mm, 3, BIG))))
            best = tl.min(lane + (4 * q)[None, :], axis=1)  # the lowest id that reaches m
            lane0 = (4 * q)[None, :]
            poisoned = (m != m) | (m == float("inf")) | bad_temp
            best_score = tl.where(poisoned, float("nan"), m)
            best_idx = tl.where(poisoned, -1, vocab_start + pid_v * BLOCK_V + best).to(tl.int32)

            if LOGPROBS:
                tmax = tl.maximum(tl.maximum(tl.max(s0, axis=1), tl.max(s1, axis=1)),
                                  tl.maximum(tl.max(s2, axis=1), tl.max(s3, axis=1)))
                safe = tl.where(tmax == float("-inf"), 0.0, tmax)
                tsum = (_lane_sum(s0, v0[None, :], safe, inv_t) + _lane_sum(s1, v1[None, :], safe, inv_t)
                        + _lane_sum(s2, v2[None, :], safe, inv_t) + _lane_sum(s3, v3[None, :], safe, inv_t))
                b2 = best[:, None]
                best_logit = tl.maximum(
                    tl.maximum(tl.max(tl.where(lane0 == b2, s0, float("-inf")), axis=1),
                               tl.max(tl.where(lane0 + 1 == b2, s1, float("-inf")), axis=1)),
                    tl.maximum(tl.max(tl.where(lane0 + 2 == b2, s2, float("-inf")), axis=1),
                               tl.max(tl.where(lane0 + 3 == b2, s3, float("-inf")), axis=1)))
            else:
                tmax = best_score
                tsum = best_score
                best_logit = best_score

            dst = buf_offset + pid_v * stride_slot + offs_b
            dst_i = buf_offset_i + pid_v * stride_slot + offs_b
            write_candidates(cand_f, cand_i, dst, dst_i, stride_field, best_score, best_idx, best_logit, tmax, tsum,
                             mask_b, LOGPROBS, PEER_TABLE, NPEERS)
