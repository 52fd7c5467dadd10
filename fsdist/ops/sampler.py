"""Host wrappers that launch the two FlashSampling stages on a candidate buffer.

Used by fsdist.sample (one GPU) and by the tensor-parallel head, which hands in
buffers it got from a transport. Nothing here knows about process groups.
"""
from dataclasses import dataclass
from typing import Optional, Tuple

import torch
import triton

from .configs import TileConfig, choose_path, chunk_workspace_bytes
from .fused_sample import N_FIELDS_LOGPROBS, N_FIELDS_SAMPLE, fused_sample_kernel
from .reduce_candidates import reduce_candidates_kernel
from .sample_logits import sample_logits_kernel
from .._runtime import interpreting
from .._validation import RowParams


@dataclass(frozen=True)
class CandidateLayout:
    """Candidate buffer: fp32 [n_groups, n_fields, n_local, batch_cap], int32 [n_groups, n_local, batch_cap].

    n_local vocabulary tiles per group; a group is one tensor-parallel rank's block
    (n_groups = 1 on a single GPU). Batch is innermost so stores and loads coalesce.
    Group-major order lets an all-gather of per-rank blocks land in this layout as is.
    """

    n_fields: int
    n_local: int
    batch_cap: int
    n_groups: int = 1

    @staticmethod
    def fields(logprobs: bool) -> int:
        return N_FIELDS_LOGPROBS if logprobs else N_FIELDS_SAMPLE

    @property
    def n_slots(self) -> int:
        return self.n_groups * self.n_local

    @property
    def stride_slot(self) -> int:
        return self.batch_cap

    @property
    def stride_field(self) -> int:
        return self.n_local * self.batch_cap

    @property
    def stride_group(self) -> int:
        return self.n_fields * self.n_local * self.batch_cap

    @property
    def stride_group_i(self) -> int:
        return self.n_local * self.batch_cap

    @property
    def float_numel(self) -> int:
        return self.n_groups * self.stride_group

    @property
    def int_numel(self) -> int:
        return self.n_groups * self.stride_group_i

    def alloc(self, device) -> Tuple[torch.Tensor, torch.Tensor]:
        return (torch.empty(self.float_numel, dtype=torch.float32, device=device),
                torch.empty(self.int_numel, dtype=torch.int32, device=device))


@dataclass(frozen=True)
class DeviceParity:
    """Which half of a double buffer a launch uses, decided on the device.

    The kernels add ``(counter[0] & 1) * stride_f`` (fp32 buffer) and ``... * stride_i``
    (int32 buffer) elements to their buffer offsets. A host integer would be frozen into
    a captured CUDA graph; a counter in device memory, advanced on the stream, lets every
    replay use the half of the step it runs. Strides of 0 mean a single copy.
    """

    counter: torch.Tensor  # one integer element on the buffers' device
    stride_f: int
    stride_i: int


def _parity_args(parity: Optional[DeviceParity], dummy: torch.Tensor):
    """(pointer, stride_f, stride_i, DEVICE_PARITY) kernel arguments."""
    if parity is None:
        return dummy, 0, 0, False
    return parity.counter, parity.stride_f, parity.stride_i, True


def _param_args(x, dummy: torch.Tensor):
    """(pointer, scalar, per_row) kernel arguments for a scalar-or-tensor row parameter."""
    if isinstance(x, torch.Tensor):
        return x, 0, True
    return dummy, x, False


def _check_fit(hidden, weight, cfg, layout, group, vocab_start):
    B = hidden.shape[0]
    if layout.batch_cap < B:
        raise ValueError(f"batch {B} exceeds the candidate buffer's capacity {layout.batch_cap}")
    if vocab_start % 4:
        raise ValueError(f"vocab_start must be a multiple of 4 (the noise is drawn in quads), got {vocab_start}")
    n_vtiles = triton.cdiv(weight.shape[0], cfg.block_v)
    if n_vtiles != layout.n_local or not 0 <= group < layout.n_groups:
        raise ValueError(f"candidate layout {layout} does not fit {weight.shape[0]} rows in tiles of "
                         f"{cfg.block_v} (group {group})")
    return n_vtiles


def tma_operands(hidden: torch.Tensor, weight: torch.Tensor, cfg: TileConfig):
    """(hidden, weight, TMA) kernel arguments: tensor descriptors when cfg.tma asks for them
    and the hardware and layouts allow (the candidates do not depend on it), else the tensors."""
    if not (cfg.tma and _tma_capable(hidden.device) and hidden.shape[0] > 0):
        return hidden, weight, False
    elem = hidden.element_size()
    aligned = all(t.data_ptr() % 16 == 0 and t.stride(1) == 1 and (t.stride(0) * elem) % 16 == 0
                  for t in (hidden, weight))
    if not aligned or max(cfg.block_b, cfg.block_v, cfg.block_k) > 256:
        return hidden, weight, False
    from triton.tools.tensor_descriptor import TensorDescriptor

    return (TensorDescriptor.from_tensor(hidden, [cfg.block_b, cfg.block_k]),
            TensorDescriptor.from_tensor(weight, [cfg.block_v, cfg.block_k]), True)


def _tma_capable(device: torch.device) -> bool:
    if device.type == "cpu":
        return interpreting()  # Triton's interpreter emulates descriptor loads (tests)
    return device.type == "cuda" and torch.version.hip is None and torch.cuda.get_device_capability(device)[0] >= 9


def launch_fused(hidden: torch.Tensor, weight: torch.Tensor, params: RowParams, cfg: TileConfig,
                 layout: CandidateLayout, cand_f: torch.Tensor, cand_i: torch.Tensor, *,
                 vocab_size: int, vocab_start: int = 0, group: int = 0, base_f: int = 0, base_i: int = 0,
                 npeers: Optional[int] = None, logprobs: bool = False, parity: Optional[DeviceParity] = None):
    """Stage 1: write this weight's candidates into `group` of the buffer.

    base_f / base_i: element offsets of the buffer inside cand_f / cand_i (the parity
    half of a double buffer). parity: add the half chosen by a device counter on top of
    them (see DeviceParity). With npeers set, cand_f / cand_i are int64 tables of the
    peers' buffer base addresses and every peer receives the candidates.
    """
    n_vtiles = _check_fit(hidden, weight, cfg, layout, group, vocab_start)
    B, D = hidden.shape
    V_rows = weight.shape[0]
    dummy = cand_i  # any tensor: ignored by the kernel when the parameter is a scalar
    seed_p, seed_v, seed_row = _param_args(params.seed, dummy)
    off_p, off_v, off_row = _param_args(params.offset, dummy)
    temp_p, temp_v, temp_row = _param_args(params.temperature, dummy)
    par_p, par_f, par_i, par_on = _parity_args(parity, dummy)
    h_arg, w_arg, tma = tma_operands(hidden, weight, cfg)
    fused_sample_kernel[(triton.cdiv(B, cfg.block_b), n_vtiles)](
        h_arg, w_arg,
        seed_p, seed_v, off_p, off_v, temp_p, float(temp_v),
        cand_f, cand_i,
        B, D, V_rows, vocab_size, vocab_start,
        hidden.stride(0),
        base_f + group * layout.stride_group, base_i + group * layout.stride_group_i,
        layout.stride_field, layout.stride_slot,
        par_p, par_f, par_i,
        BLOCK_B=cfg.block_b, BLOCK_V=cfg.block_v, BLOCK_K=cfg.block_k,
        EVEN_K=D % cfg.block_k == 0, EVEN_V=V_rows % cfg.block_v == 0,
        SEED_PER_ROW=seed_row, OFFSET_PER_ROW=off_row, TEMP_PER_ROW=temp_row,
        NOISE=not params.all_greedy, LOGPROBS=logprobs,
        PEER_TABLE=npeers is not None, NPEERS=npeers or 1,
        DOT_PRECISION="ieee" if hidden.dtype == torch.float32 else "tf32",
        DOT_UPCAST=hidden.dtype == torch.bfloat16 and hidden.device.type == "cpu",
        FAST_LOG=hidden.device.type == "cuda" and torch.version.hip is None,
        DEVICE_PARITY=par_on, TMA=tma, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )


def chunk_logits(hidden: torch.Tensor, weight_rows: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """fp32 logits hidden @ weight_rows.T into `out` ([B, n] contiguous), through cuBLAS on CUDA."""
    if hidden.device.type == "cuda":
        if hidden.dtype == torch.float32:
            return torch.mm(hidden, weight_rows.T, out=out)
        return torch.mm(hidden, weight_rows.T, torch.float32, out=out)
    return torch.mm(hidden.float(), weight_rows.float().T, out=out)


def chunk_rows_for(batch: int, V_rows: int, block_v: int, budget_bytes: int) -> int:
    """Vocabulary rows per chunk: the fewest chunks whose fp32 logits [B, rows] fit the
    budget, all of about the same size (a small last chunk would run cuBLAS at a poor
    wave fill), in whole tiles of block_v."""
    cap = max(block_v, budget_bytes // (4 * max(batch, 1)) // block_v * block_v)  # rows that fit, >= 1 tile
    n_chunks = triton.cdiv(V_rows, cap)
    # cdiv(V_rows, n_chunks) <= cap and cap is whole tiles, so rounding up stays within it.
    return triton.cdiv(triton.cdiv(V_rows, n_chunks), block_v) * block_v


def launch_chunked(hidden: torch.Tensor, weight: torch.Tensor, params: RowParams, cfg: TileConfig,
                   layout: CandidateLayout, cand_f: torch.Tensor, cand_i: torch.Tensor, *,
                   vocab_size: int, vocab_start: int = 0, group: int = 0, base_f: int = 0, base_i: int = 0,
                   npeers: Optional[int] = None, logprobs: bool = False, chunk_rows: Optional[int] = None,
                   parity: Optional[DeviceParity] = None):
    """Stage 1 for large batches: cuBLAS writes fp32 logits per vocabulary chunk, then
    sample_logits_kernel turns them into candidates.

    Writes the candidates launch_fused would (same noise, same tiles, same layout); the
    logits differ only by fp32 accumulation order, so tokens agree except on near-exact
    ties. Extra memory is one fp32 chunk of at most configs.chunk_workspace_bytes (the
    L2 size by default) or of chunk_rows rows: O(L2), never O(B x V).
    """
    _check_fit(hidden, weight, cfg, layout, group, vocab_start)
    B, V_rows = hidden.shape[0], weight.shape[0]
    rows = chunk_rows or chunk_rows_for(B, V_rows, cfg.block_v, chunk_workspace_bytes(hidden.device))
    if rows % cfg.block_v:
        raise ValueError(f"chunk_rows ({rows}) must be a multiple of block_v ({cfg.block_v})")
    buf = torch.empty(B * min(rows, V_rows), dtype=torch.float32, device=hidden.device)
    for r0 in range(0, V_rows, rows):
        r1 = min(r0 + rows, V_rows)
        logits = chunk_logits(hidden, weight[r0:r1], buf[: B * (r1 - r0)].view(B, r1 - r0))
        launch_sample_logits(logits, params, layout, cand_f, cand_i, block_v=cfg.block_v,
                             tiles=(r0 // cfg.block_v, triton.cdiv(r1, cfg.block_v)), V_rows=V_rows,
                             vocab_size=vocab_size, vocab_start=vocab_start, group=group, base_f=base_f,
                             base_i=base_i, npeers=npeers, logprobs=logprobs, parity=parity)


STAGE1_PATHS = ("fused", "chunked")


def stage1_launcher(path: Optional[str], batch: int, hidden_size: int, device_type: str):
    """launch_fused or launch_chunked: explicit `path`, else the choice by shape (configs.choose_path).

    A pure function of the shape, so every tensor-parallel rank picks the same one.
    """
    path = path or choose_path(batch, hidden_size, device_type)
    if path not in STAGE1_PATHS:
        raise ValueError(f"path must be 'fused', 'chunked' or None, got {path!r}")
    return launch_chunked if path == "chunked" else launch_fused


def launch_reduce(layout: CandidateLayout, cand_f: torch.Tensor, cand_i: torch.Tensor, batch: int, *,
                  params: Optional[RowParams] = None, base_f: int = 0, base_i: int = 0, logprobs: bool = False,
                  stats: bool = False, blocks: Optional[Tuple[int, int]] = None,
                  parity: Optional[DeviceParity] = None):
    """Stage 2: tokens int64 [B], and logprobs / logsumexp fp32 [B] (or None).

    params: the rows' parameters (the temperature scales the log-sum-exp; needed with
    logprobs). stats: also return fp32 [2, B] = (max raw logit M, log S) per row, where
    S = sum exp((logit - M) / T) (group-log-mass publishes them). blocks: (rows per
    program, slots per chunk) override, for tests. parity: as in launch_fused.
    """
    device = cand_f.device
    if logprobs and params is None:
        raise ValueError("launch_reduce needs params (the temperatures) when logprobs is set")
    stats = stats and logprobs
    tokens = torch.empty(batch, dtype=torch.int64, device=device)
    lp = torch.empty(batch, dtype=torch.float32, device=device) if logprobs else tokens
    lse = torch.empty(batch, dtype=torch.float32, device=device) if logprobs else tokens
    st = torch.empty(2, batch, dtype=torch.float32, device=device) if stats else tokens
    if batch:
        if device.type == "cpu":  # interpreter: few, large programs
            block_r, block_s = min(128, max(16, triton.next_power_of_2(batch))), min(triton.next_power_of_2(layout.n_slots), 2048)
        else:
            # Latency bound: many programs of a few rows each, one pass over <= 1024 slots,
            # so a decode batch spreads over SMs instead of looping in one program.
            block_r, block_s = (2 if batch <= 64 else 4), min(triton.next_power_of_2(layout.n_slots), 1024)
        block_r, block_s = blocks or (block_r, block_s)
        par_p, par_f, par_i, par_on = _parity_args(parity, cand_i)
        temp_p, temp_v, temp_row = _param_args(params.temperature if params is not None else 1.0, cand_i)
        reduce_candidates_kernel[(triton.cdiv(batch, block_r),)](
            cand_f, cand_i, tokens, lp, lse, st,
            batch, layout.n_slots, layout.n_local, base_f, base_i, layout.stride_group, layout.stride_group_i,
            layout.stride_field, layout.stride_slot, par_p, par_f, par_i, temp_p, float(temp_v),
            BLOCK_R=block_r, BLOCK_S=block_s, LOGPROBS=logprobs, DEVICE_PARITY=par_on,
            TEMP_PER_ROW=temp_row, STATS=stats, num_warps=4,
        )
    out = (tokens, (lp if logprobs else None), (lse if logprobs else None))
    return out + (st,) if stats else out


def launch_sample_logits(logits: torch.Tensor, params: RowParams, layout: CandidateLayout,
                         cand_f: torch.Tensor, cand_i: torch.Tensor, *, block_v: int, tiles: Tuple[int, int],
                         V_rows: int, vocab_size: int, vocab_start: int = 0, group: int = 0, base_f: int = 0,
                         base_i: int = 0, npeers: Optional[int] = None, logprobs: bool = False,
                         block_b: Optional[int] = None, tiles_per_program: int = 2, num_warps: Optional[int] = None,
                         parity: Optional[DeviceParity] = None):
    """The chunked path's sampling pass over fp32 `logits` [B, n] (column 0 = weight row
    tiles[0] * block_v): candidates of vocabulary tiles [tiles[0], tiles[1])."""
    B = logits.shape[0]
    if B == 0 or tiles[1] <= tiles[0]:
        return
    dummy = cand_i
    seed_p, seed_v, seed_row = _param_args(params.seed, dummy)
    off_p, off_v, off_row = _param_args(params.offset, dummy)
    temp_p, temp_v, temp_row = _param_args(params.temperature, dummy)
    par_p, par_f, par_i, par_on = _parity_args(parity, dummy)
    on_gpu = logits.device.type == "cuda"
    if block_b is None:
        # GPU (bench/epilogue_bench.py, H100 and H200): 16-row blocks while that still fills
        # the SMs, 32 rows on 8 warps past B = 128. Interpreter: few, big programs.
        block_b = (16 if B <= 128 else 32) if on_gpu else max(16, min(256, triton.next_power_of_2(B)))
    if num_warps is None:
        num_warps = 8 if block_b >= 32 and on_gpu else 4
    grid = (triton.cdiv(B, block_b), triton.cdiv(tiles[1] - tiles[0], tiles_per_program))
    sample_logits_kernel[grid](
        logits, logits.stride(0), tiles[0], tiles[1],
        seed_p, seed_v, off_p, off_v, temp_p, float(temp_v),
        cand_f, cand_i,
        B, V_rows, vocab_size, vocab_start,
        base_f + group * layout.stride_group, base_i + group * layout.stride_group_i,
        layout.stride_field, layout.stride_slot,
        par_p, par_f, par_i,
        BLOCK_B=block_b, BLOCK_V=block_v, TILES=tiles_per_program,
        SEED_PER_ROW=seed_row, OFFSET_PER_ROW=off_row, TEMP_PER_ROW=temp_row,
        NOISE=not params.all_greedy, LOGPROBS=logprobs,
        PEER_TABLE=npeers is not None, NPEERS=npeers or 1,
        FAST_LOG=on_gpu and torch.version.hip is None,
        DEVICE_PARITY=par_on, num_warps=num_warps,
    )
