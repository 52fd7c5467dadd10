"""The one planning step: (shape, device, options) -> a frozen plan of what a call will do.

Both callers, ``fsdist.sample`` and the tensor-parallel head, make their decisions here
and nowhere else: which stage-1 path (``fused``: logits tiles computed in the kernel;
``chunked``: cuBLAS logits per L2-sized vocabulary chunk, then a sampling pass), which
tile configuration, and the candidate buffer's layout. A plan is a pure function of
its inputs, so every tensor-parallel rank with the same batch plans the same launch (and a call
reuses the plan of an earlier call with the same inputs: ``plan_sample``'s cache).
:func:`launch_stage1` then runs a plan's stage 1; stage 2 is ``launch_merge``.
"""
import functools
from dataclasses import dataclass
from typing import Optional

import torch

from ..params import RowParams
from . import configs
from .configs import STAGE1_PATHS, TileConfig, choose_path, default_block_v, pick_config
from .configs import fast_memory as device_fast_memory
from .fused_sample import launch_fused, ws_takes_fields
from .fused_sample_ws import WS_BLOCK_B, ws_device
from .layout import KEEP, BufferPair, CandidateLayout
from .sample_logits import launch_chunked
from .step_check import call_flags
from .utils import cdiv


@dataclass(frozen=True)
class SamplePlan:
    path: str  # "fused" | "chunked"
    config: TileConfig
    layout: CandidateLayout
    logprobs: bool
    extended: bool = False  # this call keeps the tiles' largest logits (the layout has room for them)
    raw_sums: bool = True  # ... and their raw (T = 1) sums, which only "raw" logprobs read
    winner_logits: bool = False  # stage 1 writes each tile winner's logit (field 1) even without logprobs
    ws_kernel: bool = False  # the warp-specialised kernel runs on the device for the dtype (a ws config's tile is its)

    @property
    def flags(self) -> int:
        """The call's flags as a header records them (step_check.py)."""
        return call_flags(self.logprobs, self.path == "chunked")


def raw_sums_needed(mode: str, logprobs: bool, top_n: int) -> bool:
    """Whether an extended stage 1 must write the tiles' raw (T = 1) sums: only "raw" logprobs,
    of the token or of the top N, read them (plan_sample's raw_sums)."""
    return mode == "raw" and (bool(logprobs) or top_n > 0)


def winner_logits_needed(filtered: bool, may_min_p: bool) -> bool:
    """Whether stage 1 must write each tile winner's logit (field 1) even without logprobs:
    select_filtered's min-p proof reads it, in filtered calls where some row may have min-p on
    (``RowParams.may_min_p``)."""
    return bool(filtered) and bool(may_min_p)


def plan_sample(*, batch: int, hidden_size: int, weight_rows: int, device: torch.device, logprobs: bool = False,
                config: Optional[TileConfig] = None, path: Optional[str] = None, block_v: Optional[int] = None,
                n_shards: int = 1, batch_cap: Optional[int] = None, n_fields: Optional[int] = None,
                checked: bool = False, extended: bool = False, dtype: Optional[torch.dtype] = None,
                raw_sums: bool = True, winner_logits: bool = False, sparse_processors: bool = False,
                fast_memory: Optional[bool] = None) -> SamplePlan:
    """Plan one sampling call.

    weight_rows: rows of the weight (one shard's, with tensor parallelism); n_shards: how
    many such shards the candidate buffer holds; batch_cap: the buffer's row capacity
    (default: the batch); n_fields: fp32 fields per slot (default: what ``logprobs``
    needs; a head sizes its buffers for the largest); checked: the int32 buffer carries the
    call's header (``step_check.py``; tensor parallelism); extended: keep the tiles' largest
    logits too (filters, top-N and raw logprobs; ``select_filtered.py``; it also picks the 32-row tile's
    first-wave stagger); raw_sums: with extended,
    also their raw (T = 1) sums (False when no "raw" logprobs are asked: one exp pass less per
    tile; the field is then NaN); dtype: the operands' dtype
    (fp32 takes the chunked path past B = 64); winner_logits: stage 1 writes each tile winner's logit
    (``winner_logits_needed``; with logprobs it always does); sparse_processors: the call applies logit
    bias or penalty entries (``choose_path``: chunked past one 128-row tile; ``pick_config``: the
    warp-specialised 64-row tile from B = 17 where that kernel runs; ``fsdist.sample`` and the tensor-parallel
    heads pass it; measured on one GPU only). fast_memory: the device's memory speed
    (``configs.fast_memory``, asked of the device when None; a tensor-parallel head passes its group's agreed
    answer): it picks the path and the 32-row tile's depth. config / path / block_v override
    the choices (tests and benchmarks; block_v fixes a head's layout).
    """
    device = torch.device(device)
    if fast_memory is None:
        fast_memory = device_fast_memory(device)
    # What the plan asks of the device and of the environment, asked here on every call (so a changed answer, or a
    # test's stand-in, takes effect at once); the rest is a pure function of these answers and the arguments, cached.
    ws_kernel = ws_device(device, dtype)
    default_v = default_block_v(device.type)
    # (by name: a key in another order than _plan's parameters cannot pass one answer as another)
    key = dict(batch=batch, hidden_size=hidden_size, weight_rows=weight_rows, device_type=device.type,
               logprobs=logprobs, config=config, path=path, block_v=block_v, n_shards=n_shards, batch_cap=batch_cap,
               n_fields=n_fields, checked=checked, extended=extended, dtype=dtype, raw_sums=raw_sums,
               winner_logits=winner_logits, sparse_processors=sparse_processors, fast_memory=bool(fast_memory),
               ws_kernel=ws_kernel, default_v=default_v, fields_full_tile=configs.WS_FIELDS_FULL_TILE)
    try:
        hash(tuple(key.values()))
    except TypeError:  # (an unhashable argument, e.g. a symbolic batch size under tracing: plan it uncached)
        return _plan(**key)
    return _cached_plan(**key)


def _plan(batch, hidden_size, weight_rows, device_type, logprobs, config, path, block_v, n_shards, batch_cap,
          n_fields, checked, extended, dtype, raw_sums, winner_logits, sparse_processors, fast_memory, ws_kernel,
          default_v, fields_full_tile) -> SamplePlan:
    """plan_sample's decisions from its arguments and the device's answers (ws_kernel: the warp-specialised kernel
    runs on the device for the dtype; default_v: the device's default vocabulary tile; fields_full_tile:
    configs.WS_FIELDS_FULL_TILE, read at each call)."""
    path = path or choose_path(batch, hidden_size, device_type, dtype.itemsize if dtype is not None else 2,
                               sparse_processors, fast_memory=fast_memory)
    if path not in STAGE1_PATHS:
        raise ValueError(f"path must be 'fused', 'chunked' or None, got {path!r}")
    # (the 64-row tile of calls with entries at B = 17-32 was measured on the warp-specialised kernel only: where
    # that kernel cannot run, such calls keep the 32-row Triton tile)
    # (and extended calls there at D <= 4096, measured on one GPU only: a checked layout, the TP heads', keeps
    # the 32-row tile for them)
    extended_ws = extended and not checked
    cfg = config or pick_config(batch, hidden_size, device_type, block_v=block_v or default_v,
                                fast_memory=fast_memory, extended=extended,
                                sparse_processors=sparse_processors and ws_kernel,
                                extended_ws=extended_ws and ws_kernel, ws_kernel=ws_kernel,
                                fields_full_tile=fields_full_tile and ws_kernel
                                and ws_takes_fields(WS_BLOCK_B, logprobs, extended, raw_sums))
    if block_v is not None and cfg.block_v != block_v:
        raise ValueError(f"config.block_v = {cfg.block_v} but the buffers are laid out for block_v = {block_v}")
    roomy = extended or n_fields == CandidateLayout.fields(True, extended=True)
    if extended:
        n_fields = CandidateLayout.fields(logprobs, extended=True)
    layout = CandidateLayout(n_fields or CandidateLayout.fields(logprobs), cdiv(weight_rows, cfg.block_v),
                             max(batch_cap or batch, 1), n_shards, checked, 1 + KEEP if roomy else 1)
    return SamplePlan(path, cfg, layout, bool(logprobs), bool(extended), bool(raw_sums),
                      bool(logprobs or winner_logits), bool(ws_kernel))


# A serving loop plans the same few shapes over and over (~6 µs of Python a call on a CPU, bench/host_cpu_probe.py,
# more on a slower GPU host); a plan is frozen (its config and layout too), so one object serves every call with the
# same key. An exception (a bad path, a block_v the config contradicts) is not cached: it is raised at every call.
# configs' module constants (SPARSE_WS_MIN_BATCH, FAST_MEMORY_FULL_TILE_ROWS, ...) are read inside: code that changes
# one at run time (a probe) must call ``_cached_plan.cache_clear()`` after, or reuse plans of the old value
# (WS_FIELDS_FULL_TILE excepted: plan_sample reads it at each call, into the key).
_cached_plan = functools.lru_cache(maxsize=256)(_plan)


def asks_noise_skip(plan: SamplePlan, params: RowParams, *, batch: int, filtered: bool, vocab_size: int) -> bool:
    """Whether a call's stage 1 runs with launch_fused's ``skip_filtered_noise`` (a tile then draws the noise only if
    one of its rows reads it: epilogue.rows_draw_noise). Asked (configs.SKIP_FILTERED_NOISE on, some row sampled, the
    fused path) by filtered calls where top-k or top-p may be on, whose restricted rows never read their tiles' noise
    (v123); by plain calls (no filter, logprobs or processors) of ``batch`` >= configs.SKIP_NOISE_PLAIN_MIN_BATCH
    rows on the ws 128-row tile, whose tiles all draw, with the skip's late bits (faster in v125, level in v126)
    (configs.SKIP_NOISE_PLAIN_WIDE_TILE, v125; only where the ws kernel runs for the device and dtype, plan.ws_kernel:
    elsewhere the plan's tile runs as its Triton twin, untimed with it; B = 96 on that tile was slower); by every call
    with the probe
    configs.SKIP_NOISE_EVERY_CALL. Min-p-only calls do not ask (their proof reads the winners: every tile draws)."""
    if not configs.SKIP_FILTERED_NOISE or params.all_greedy or plan.path != "fused":
        return False
    if (filtered and params.may_top_k_or_p(vocab_size)) or configs.SKIP_NOISE_EVERY_CALL:
        return True
    return (configs.SKIP_NOISE_PLAIN_WIDE_TILE and not filtered and not plan.logprobs and not plan.extended
            and params.processing is None and plan.config.ws and plan.config.block_b == 128
            and batch >= configs.SKIP_NOISE_PLAIN_MIN_BATCH and plan.ws_kernel)


def launch_stage1(plan: SamplePlan, hidden: torch.Tensor, weight: torch.Tensor, params: RowParams,
                  dest: BufferPair, *, vocab_size: int, vocab_start: int = 0, shard: int = 0,
                  flags: Optional[int] = None, trigger: bool = False, skip_filtered_noise: bool = False) -> None:
    """Run a plan's stage 1: candidates of ``hidden @ weight.T`` into block ``shard`` of ``dest``.
    flags: the call's flags for a checked layout's header (default: the plan's own). trigger: the next launch is a
    programmatic dependent that waits for stage 1's end before any memory access (launch_fused).
    skip_filtered_noise: launch_fused's (the fused path only; the chunked pass draws every tile's noise)."""
    if hidden.shape[0] == 0:
        return
    if hidden.shape[0] > plan.layout.batch_cap:
        raise ValueError(f"batch {hidden.shape[0]} exceeds the planned capacity {plan.layout.batch_cap}")
    kw = dict(shard=shard, logprobs=plan.logprobs, extended=plan.extended, flags=flags, raw_sums=plan.raw_sums,
              winner_logit=plan.winner_logits)
    if plan.path == "chunked":
        launch_chunked(hidden, weight, params, plan.config, plan.layout, dest, vocab_size=vocab_size,
                       vocab_start=vocab_start, **kw)
    else:
        launch_fused(hidden, weight, params, plan.config, plan.layout, dest, vocab_size=vocab_size,
                     vocab_start=vocab_start, trigger=trigger, skip_filtered_noise=skip_filtered_noise, **kw)
