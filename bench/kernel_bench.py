#!/usr/bin/env python
"""Single-GPU benchmark: fsdist.sample against materialize-then-sample baselines.

Every method samples the serving case by default: per-row parameters as [B] device
tensors, temperatures distinct per row (``--temperature`` 0.8 +- ``--temperature-spread``
25%, evenly spaced; ``--greedy-rows N`` sets N rows per batch to 0 = greedy, none by
default), seeds and offsets one per row. The baselines get the same [B] temperatures
(fsdist.reference.baselines; told whether the batch has greedy rows, as a serving stack
knows from its requests).

Methods (``--methods``; ``default`` = all that can run here):
  cublas               h @ W.T through cuBLAS alone: the floor for this op (no sampling)
  fsdist               fsdist.sample (fused matmul + Gumbel-max), [B] temperature, seed, offset
  fsdist_logprobs      the same with return_logprobs=True
  fsdist_scalar        fsdist.sample with one float temperature for the batch, as the ``fsdist``
                       method of the 2026-11-21 result JSONs (seeds/offsets stay [B]) (not default)
  multinomial_eager    cuBLAS logits -> /T -> softmax (fp32) -> torch.multinomial
  multinomial_compiled the same under torch.compile (the paper's "Multinomial Sampling")
  gumbel_eager         cuBLAS logits -> argmax(logits + T * Gumbel noise) (not default)
  gumbel_compiled      the same under torch.compile
  fi_topk_topp         cuBLAS logits -> /T -> flashinfer top_k_top_p_sampling_from_logits (top-k/p off), "FI1"
  fi_sampling          cuBLAS logits -> /T -> flashinfer sampling_from_logits, "FI2"
Filtered sampling (vLLM V1's order; each filter a [B] device tensor, ``--top-k`` 50,
``--top-p`` 0.9, ``--min-p`` 0.05; the fsdist rows also report the fraction of rows that
fell back to the exact fallback over their timed calls, ``fallback_rate`` in the JSON):
  fsdist_topk_topp     fsdist.sample(top_k=[B], top_p=[B])
  fsdist_minp          fsdist.sample(min_p=[B])
  torch_topk_topp_compiled  cuBLAS logits -> /T -> sort-based top-k + top-p as vLLM's torch
                       sampler (baselines.matmul_top_k_top_p) -> exponential race, torch.compile
  torch_topk_topp_compiled_es  the same with the top-p cumsum left out of the compiled graph
                       (baselines.matmul_top_k_top_p_eager_scan): torch 2.11's Inductor fails to
                       generate that 150k-wide scan at B >= 16, so this is the compiled baseline there
  torch_minp_compiled  cuBLAS logits -> /T -> min-p (baselines.matmul_min_p) -> race, torch.compile
  torch_topk_topp_eager, torch_minp_eager   the same without torch.compile (not default)
  fi_topk_topp_filtered  cuBLAS logits -> /T -> flashinfer top_k_top_p_sampling_from_logits with the
                       [B] top-k / top-p tensors ("FI1" with the filters on)
  fi_minp              cuBLAS logits -> /T -> softmax -> flashinfer min_p_sampling_from_probs([B] min-p)
Logit processors (issue 12; all [B]-row device tensors, applied in vLLM V1's order before
temperature; none in ``default``: select them with ``--methods processors``, a group name that
also brings cublas, fsdist and gumbel_compiled for the ratios). Per row: a token bitmask
(xgrammar's int32 layout, each bit set with probability ``--bitmask-density`` 0.5, row 0 all
ones), a logit bias on ``--bias-ids`` 500 ids and penalties (repetition / frequency / presence
evenly spaced over 1.1-1.3 / 0.1-0.4 / 0.1-0.3 across rows) over ``--output-ids`` 250 output and
``--prompt-ids`` 250 prompt ids: 1,000 listed ids per row, uniform over the vocabulary (a few
repeats by chance; fsdist turns them into 1,000 sorted entries per row):
  fsdist_bitmask       fsdist.sample(token_bitmask=[B, ceil(V/32)])
  fsdist_bias_pen      fsdist.sample(logit_bias=SparseLogits([B, 500]), penalties=Penalties([B] x 3, [B, 250] x 2))
  fsdist_processors_all  both
  torch_bitmask_compiled, torch_bias_pen_compiled, torch_processors_compiled   cuBLAS bf16 logits -> fp32
                       -> the same processors in plain torch (bits unpacked by shifts + masked_fill
                       -inf; bias by scatter_add; vLLM's penalties: occurrence counts
                       by scatter_add over a [B, V+1] table, prompt mask, where(x > 0, x / r, x * r),
                       - f * count - p * (count > 0)) -> Gumbel argmax; one static torch.compile per B
  torch_*_eager        the same without torch.compile (torch_processors_eager in the group, the others by name;
                       so is torch_bias_pen_compiled: the group keeps to three torch.compiles per cell)
  xgr_bitmask          cuBLAS logits -> fp32 -> xgrammar.apply_token_bitmask_inplace -> Gumbel argmax
                       (compiled per B on a GPU); skipped when xgrammar is not importable
Their table prints each processors method over plain fsdist and each baseline over it, per B,
with CUDA-graph replays of the fsdist ones (graph_default) next to the eager calls.
  GPU:  bash bench/run_gpu.sh kernel --methods processors --shapes 4096x151936,8192x128256 \
            --batches 1,4,16,64,256 --reps 40 --repeats 1 --warmup 10
  CPU smoke (interpreter, 64x1000, B 1,4; 20 / 10 / 10 listed ids):
        python bench/kernel_bench.py --methods processors,torch_bitmask_eager,torch_bias_pen_eager --no-json
FlashInfer methods are skipped cleanly when flashinfer is not importable; compiled
methods and CUDA graphs are skipped on a machine without a GPU.

Timing (bench/common.py): per-call CUDA events after warm-up, L2 flushed before every
call, hidden states rotated over several buffers; ``--repeats`` interleaved runs per
cell, median of all calls and the spread of the run medians reported. CUDA-graph
replay times for the ``--graph-methods`` (offsets held in a device tensor and advanced
between replays). Correctness is checked for every (shape, B) before timing; a failed
check is reported next to the table and makes the exit status 1.

CPU smoke run (Triton interpreter, tiny shape):   python bench/kernel_bench.py
Full GPU run: see bench/README.md.
"""
import common as C  # first: the repo root on sys.path, fsdist.env.apply_safe_env() before torch

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import importlib  # noqa: E402
import math  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from dataclasses import asdict, dataclass, field  # noqa: E402
from typing import Callable, Dict, List, Optional  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import fsdist  # noqa: E402  (sets TRITON_INTERPRET=1 itself when there is no GPU)
from fsdist import TileConfig  # noqa: E402
from fsdist.ops.configs import default_config  # noqa: E402
from fsdist.params import GREEDY_TEMPERATURE  # noqa: E402
from fsdist.reference import baselines, serving_semantics, vocab_gumbel  # noqa: E402

GPU_SHAPES = "4096x151936,8192x128256"
GPU_BATCHES = "1,2,4,8,16,32,64,128,256"
CPU_SHAPES = "64x1000"
CPU_BATCHES = "1,4"


# --------------------------------------------------------------------------- methods
@dataclass
class Method:
    name: str
    label: str  # short column label
    kind: str  # "floor" | "fsdist" | "baseline"
    build: Callable  # build(ctx) -> fn(h) -> output
    tokens: Callable = None  # output -> int64 [B] tokens (None for the matmul floor)
    compiled: bool = False
    flashinfer: bool = False
    default: bool = True
    graph_default: bool = False
    note: str = ""
    filter: Optional[str] = None  # "topk_topp" | "minp": the filters it applies (FILTER_GROUPS)
    processors: Optional[str] = None  # "bitmask" | "bias_pen" | "all": the logit processors (PROCESSOR_GROUPS)


# The filter groups of the filtered methods: which ShapeCtx filter tensors each one passes.
FILTER_GROUPS = {"topk_topp": ("top_k", "top_p"), "minp": ("min_p",)}
# The processor groups: which fsdist.sample processor arguments each one passes.
PROCESSOR_GROUPS = {"bitmask": ("token_bitmask",), "bias_pen": ("logit_bias", "penalties"),
                    "all": ("token_bitmask", "logit_bias", "penalties")}
PROCESSOR_TITLES = {"bitmask": "token bitmask", "bias_pen": "logit bias + penalties",
                    "all": "bitmask + bias + penalties"}


@dataclass
class ShapeCtx:
    D: int
    V: int
    dtype: torch.dtype
    device: torch.device
    T: float  # fsdist_scalar's temperature and the center of the per-row ones
    greedy_rows: int = 0
    weight: torch.Tensor = None
    compile_mode: str = "dynamic"
    compiled: Dict[str, Callable] = field(default_factory=dict)
    fi: object = None
    fi_notes: Dict[str, str] = field(default_factory=dict)
    filters: Dict[str, float] = field(default_factory=dict)  # top_k, top_p, min_p of the filtered methods
    # per batch size, set by the cell loop
    B: int = 0
    seed_t: torch.Tensor = None
    off_t: torch.Tensor = None
    temp_t: torch.Tensor = None  # [B] per-row temperatures (common.row_temperatures)
    top_k_t: torch.Tensor = None  # [B] int32, filters["top_k"] on every row
    top_p_t: torch.Tensor = None  # [B] fp32
    min_p_t: torch.Tensor = None  # [B] fp32
    # logit processors (set_processors; only when a processors method runs)
    proc_cfg: Dict[str, float] = field(default_factory=dict)  # density, n_bias, n_output, n_prompt
    bitmask_t: torch.Tensor = None  # int32 [B, ceil(V/32)]
    bias_ids_t: torch.Tensor = None  # int64 [B, n_bias]
    bias_vals_t: torch.Tensor = None  # fp32 [B, n_bias]
    out_ids_t: torch.Tensor = None  # int64 [B, n_output]
    prompt_ids_t: torch.Tensor = None  # int64 [B, n_prompt]
    rep_t: torch.Tensor = None  # fp32 [B]
    freq_t: torch.Tensor = None  # fp32 [B]
    pres_t: torch.Tensor = None  # fp32 [B]

    @property
    def has_greedy(self) -> bool:
        """Whether the batch has greedy rows: the baselines are told, as a serving stack knows."""
        return self.greedy_rows > 0

    def set_filters(self, B: int):
        """The [B] filter tensors of this batch size (the same value on every row)."""
        self.top_k_t = torch.full((B,), int(self.filters["top_k"]), dtype=torch.int32, device=self.device)
        self.top_p_t = torch.full((B,), float(self.filters["top_p"]), dtype=torch.float32, device=self.device)
        self.min_p_t = torch.full((B,), float(self.filters["min_p"]), dtype=torch.float32, device=self.device)

    def filter_kwargs(self, group: Optional[str]) -> Dict[str, torch.Tensor]:
        """The filter group's [B] tensors as keyword arguments (none for an unfiltered method)."""
        return {name: getattr(self, f"{name}_t") for name in FILTER_GROUPS.get(group, ())}

    def set_processors(self, B: int, gen: torch.Generator):
        """The logit processors of this batch size, all device tensors (module docstring).

        Bitmask: random int32 words (each bit set with probability proc_cfg["density"]), bits
        past V cleared, row 0 all ones. Bias ids, output ids and prompt ids: uniform over
        [0, V) (independent draws, so a few repeats by chance: repeated output ids count
        twice, repeated bias ids add up). Penalties evenly spaced across rows.
        """
        cfg, dev, V = self.proc_cfg, self.device, self.V
        words = (V + 31) // 32
        density = float(cfg["density"])
        bits = torch.rand(B, words, 32, device=dev, generator=gen) < density
        bits &= (torch.arange(words * 32, device=dev) < V).view(1, words, 32)
        weights = torch.ones(32, dtype=torch.int64, device=dev) << torch.arange(32, dtype=torch.int64, device=dev)
        unsigned = (bits.to(torch.int64) * weights).sum(dim=-1)
        self.bitmask_t = torch.where(unsigned >= 2**31, unsigned - 2**32, unsigned).to(torch.int32)
        self.bitmask_t[0] = -1  # row 0 allows everything (bits past V are ignored)

        def ids(n):
            return torch.randint(0, V, (B, int(n)), device=dev, generator=gen)
        self.bias_ids_t = ids(cfg["n_bias"])
        self.bias_vals_t = torch.randn(B, int(cfg["n_bias"]), device=dev, generator=gen) * 2.0
        self.out_ids_t = ids(cfg["n_output"])
        self.prompt_ids_t = ids(cfg["n_prompt"])

        def spread(lo, hi):
            if B == 1:
                return torch.full((1,), (lo + hi) / 2, device=dev)
            return torch.linspace(lo, hi, B, device=dev)
        self.rep_t, self.freq_t, self.pres_t = spread(1.1, 1.3), spread(0.1, 0.4), spread(0.1, 0.3)

    def processor_kwargs(self, group: Optional[str], rows=None) -> Dict:
        """fsdist.sample's processor arguments of the group (of the given rows only, if any)."""
        if not group:
            return {}

        def r(x):
            return x if rows is None else x[rows]
        out = {}
        names = PROCESSOR_GROUPS[group]
        if "token_bitmask" in names:
            out["token_bitmask"] = r(self.bitmask_t)
        if "logit_bias" in names:
            out["logit_bias"] = fsdist.SparseLogits(r(self.bias_ids_t), r(self.bias_vals_t))
        if "penalties" in names:
            out["penalties"] = fsdist.Penalties(r(self.rep_t), r(self.freq_t), r(self.pres_t), r(self.out_ids_t),
                                                r(self.prompt_ids_t))
        return out

    def processor_tensors(self, group: Optional[str]) -> Dict[str, torch.Tensor]:
        """The group's processors as flat tensors (the torch baselines' keyword arguments)."""
        out = {}
        names = PROCESSOR_GROUPS.get(group, ())
        if "token_bitmask" in names:
            out["token_bitmask"] = self.bitmask_t
        if "logit_bias" in names:
            out.update(bias_ids=self.bias_ids_t, bias_vals=self.bias_vals_t)
        if "penalties" in names:
            out.update(rep=self.rep_t, freq=self.freq_t, pres=self.pres_t, output_ids=self.out_ids_t,
                       prompt_ids=self.prompt_ids_t)
        return out

    def fs_params(self, scalar: bool = False, group: Optional[str] = None, procs: Optional[str] = None) -> Dict:
        """fsdist.sample's per-row parameters: [B] device tensors, or one float temperature
        (plus the filter group's [B] tensors and the processor group's arguments)."""
        return {"temperature": self.T if scalar else self.temp_t, "seed": self.seed_t, "offset": self.off_t,
                **self.filter_kwargs(group), **self.processor_kwargs(procs)}


def _fs_tokens(out):
    return out.tokens


def _plain(out):
    return out


SCALAR_METHODS = {"fsdist_scalar"}  # fsdist methods called with one float temperature


def _build_fsdist(logprobs: bool = False, scalar: bool = False, config: Optional[TileConfig] = None,
                  group: Optional[str] = None, procs: Optional[str] = None, path: Optional[str] = None):
    def build(ctx: ShapeCtx):
        W = ctx.weight

        def fn(h):
            return fsdist.sample(h, W, **ctx.fs_params(scalar, group, procs), return_logprobs=logprobs,
                                 config=config, path=path)
        return fn
    return build


def _build_cublas(ctx: ShapeCtx):
    W = ctx.weight
    return lambda h: F.linear(h, W)


def _build_torch(which: str, compiled: bool):
    """fsdist.reference.baselines' matmul + sampler, eager or torch.compiled, with ctx's [B] temperatures."""
    def build(ctx: ShapeCtx):
        W = ctx.weight
        if compiled:
            f = ctx.compiled.get(which)
            if f is None:
                f = baselines.compiled_sampler(which, dynamic=False if ctx.compile_mode == "static" else None)
                ctx.compiled[which] = f
        else:
            f = baselines.MATERIALIZED_SAMPLERS[which]
        return lambda h: f(h, W, ctx.temp_t, has_greedy=ctx.has_greedy)
    return build


def _build_torch_filtered(group: str, compiled: bool, which: Optional[str] = None):
    """fsdist.reference.baselines' filtered matmul + sampler (sort-based top-k/top-p, or min-p),
    eager or torch.compiled, with ctx's [B] temperatures and filter tensors. which: the
    FILTERED_SAMPLERS name (default: the group's)."""
    which = which or {"topk_topp": "top_k_top_p", "minp": "min_p"}[group]

    def build(ctx: ShapeCtx):
        W = ctx.weight
        if not compiled:
            f = baselines.FILTERED_SAMPLERS[which]
            return lambda h: f(h, W, ctx.temp_t, has_greedy=ctx.has_greedy, **ctx.filter_kwargs(group))
        # Always one static compile per batch size: with a dynamic batch dimension Inductor
        # (torch 2.11.0+cu130 on an H100, 2026-11-23) fails to generate the split cumsum over
        # the vocabulary ("InductorError: list indices must be integers or slices, not
        # NoneType"). Views drop the dynamic marks the harness puts on the shared inputs (a
        # dict lookup and a few views per call: host time, far below the GPU time of a call).
        # build() runs once per shape and the returned function reads ctx's tensors of the
        # current batch size at call time.
        def call(h):
            f = ctx.compiled.get((which, ctx.B))
            if f is None:
                f = ctx.compiled[(which, ctx.B)] = baselines.compiled_sampler(which, dynamic=False)
            kw = {k: v.view(v.shape) for k, v in ctx.filter_kwargs(group).items()}
            return f(h.view(h.shape), W, ctx.temp_t.view(ctx.temp_t.shape), has_greedy=ctx.has_greedy, **kw)
        return call
    return build


# ---- logit processors on materialized logits: the torch baselines (module docstring)
def torch_apply_bitmask(x: torch.Tensor, token_bitmask: torch.Tensor) -> torch.Tensor:
    """x [B, V] with the ids the int32 bitmask disallows set to -inf: every word's 32 bits
    unpacked by shifts (bit v % 32 of word v // 32 set = allowed), then masked_fill."""
    B, V = x.shape
    shifts = torch.arange(32, device=x.device, dtype=torch.int32)
    bits = (token_bitmask[:, :, None] >> shifts) & 1  # arithmetic shift: bit 31 of a negative word is 1 too
    allowed = bits.reshape(B, -1)[:, :V] != 0
    return x.masked_fill(~allowed, float("-inf"))


def torch_apply_bias(x: torch.Tensor, bias_ids: torch.Tensor, bias_vals: torch.Tensor) -> torch.Tensor:
    """x + the bias at its ids (repeated ids add up); a -1 slot adds 0.0 to id 0 (no change)."""
    vals = torch.where(bias_ids >= 0, bias_vals.to(x.dtype), torch.zeros_like(bias_vals, dtype=x.dtype))
    return x.scatter_add(1, bias_ids.clamp(min=0), vals)


def torch_apply_penalties(x: torch.Tensor, rep: torch.Tensor, freq: torch.Tensor, pres: torch.Tensor,
                          output_ids: torch.Tensor, prompt_ids: torch.Tensor) -> torch.Tensor:
    """vLLM V1's penalties on materialized logits: occurrence counts by scatter_add over a
    [B, V + 1] table (-1 slots land in the spare column V), the repetition penalty on ids
    seen in prompt or output (x / r where x > 0, else x * r), then - f * count - p * [count > 0]."""
    B, V = x.shape

    def counts(ids):
        slot = torch.where(ids < 0, torch.full_like(ids, V), ids)
        table = torch.zeros(B, V + 1, dtype=torch.int32, device=x.device)
        return table.scatter_add_(1, slot, torch.ones_like(slot, dtype=torch.int32))[:, :V]

    out_count = counts(output_ids)
    seen = (counts(prompt_ids) > 0) | (out_count > 0)
    r = rep.to(x.dtype)[:, None]
    x = torch.where(seen, torch.where(x > 0, x / r, x * r), x)
    return x - freq.to(x.dtype)[:, None] * out_count - pres.to(x.dtype)[:, None] * (out_count > 0)


def torch_processed_logits(logits: torch.Tensor, *, token_bitmask=None, bias_ids=None, bias_vals=None, rep=None,
                           freq=None, pres=None, output_ids=None, prompt_ids=None) -> torch.Tensor:
    """fp32 logits -> bitmask -> bias -> penalties (vLLM V1's order), each step optional."""
    x = logits.float()
    if token_bitmask is not None:
        x = torch_apply_bitmask(x, token_bitmask)
    if bias_ids is not None:
        x = torch_apply_bias(x, bias_ids, bias_vals)
    if rep is not None:
        x = torch_apply_penalties(x, rep, freq, pres, output_ids, prompt_ids)
    return x


def matmul_processors_gumbel(hidden: torch.Tensor, weight: torch.Tensor, temperature: torch.Tensor,
                             **processors) -> torch.Tensor:
    """cuBLAS logits (bf16 out), fp32, the processors, then argmax(x + T * Gumbel) (greedy rows: T = 0)."""
    x = torch_processed_logits(F.linear(hidden, weight), **processors)
    return baselines.gumbel_argmax_from_logits(x, temperature)


def _build_torch_processors(group: str, compiled: bool):
    """cuBLAS logits + the group's processors in torch + Gumbel argmax, eager or one static
    torch.compile per batch size (as the filtered baselines: views drop the harness's
    dynamic marks; ctx's tensors are read at call time)."""
    def build(ctx: ShapeCtx):
        W = ctx.weight
        if not compiled:
            return lambda h: matmul_processors_gumbel(h, W, ctx.temp_t, **ctx.processor_tensors(group))

        def call(h):
            key = ("processors", group, ctx.B)
            f = ctx.compiled.get(key)
            if f is None:
                f = ctx.compiled[key] = torch.compile(matmul_processors_gumbel, dynamic=False)
            kw = {k: v.view(v.shape) for k, v in ctx.processor_tensors(group).items()}
            return f(h.view(h.shape), W, ctx.temp_t.view(ctx.temp_t.shape), **kw)
        return call
    return build


def _xgrammar():
    try:
        return importlib.import_module("xgrammar")
    except Exception as e:  # ImportError, or a CUDA/JIT error inside xgrammar's import
        return e


def _build_xgr_bitmask(ctx: ShapeCtx):
    """cuBLAS logits -> fp32 -> xgrammar.apply_token_bitmask_inplace (its CUDA kernel on a GPU)
    -> Gumbel argmax (one static torch.compile per batch size on a GPU, eager on the CPU)."""
    xgr, W = _xgrammar(), ctx.weight
    if isinstance(xgr, Exception):
        raise RuntimeError(f"xgrammar not importable: {xgr}")
    on_gpu = ctx.device.type == "cuda"

    def call(h):
        logits = F.linear(h, W).float()
        xgr.apply_token_bitmask_inplace(logits, ctx.bitmask_t, vocab_size=ctx.V)
        if not on_gpu:
            return baselines.gumbel_argmax_from_logits(logits, ctx.temp_t)
        key = ("xgr_gumbel", ctx.B)
        f = ctx.compiled.get(key)
        if f is None:
            f = ctx.compiled[key] = torch.compile(baselines.gumbel_argmax_from_logits, dynamic=False)
        return f(logits, ctx.temp_t.view(ctx.temp_t.shape))
    return call


def _flashinfer():
    try:
        return importlib.import_module("flashinfer.sampling")
    except Exception as e:  # ImportError, or a CUDA/JIT error inside flashinfer's import
        return e


def _fi_variants(which: str, fi, V: int):
    """(note, dtype of logits / T, draw(scaled, filters) -> tokens) to try in order: the logits'
    dtype straight from cuBLAS, else fp32; for the unfiltered FI1 top_k=-1, else V."""
    dtypes = [("native", None), ("fp32", torch.float32)]
    if which == "fi_sampling":
        return [(f"logits/T {tag}", dt, lambda s, kw: fi.sampling_from_logits(s)) for tag, dt in dtypes]
    if which == "fi_topk_topp":  # top-k / top-p switched off, as in the paper (top_k=-1, else V; top_p=1.0)
        return [(f"logits/T {tag}, top_k={k}, top_p=1.0", dt,
                 lambda s, kw, _k=k: fi.top_k_top_p_sampling_from_logits(s, _k, 1.0))
                for k in (-1, V) for tag, dt in dtypes]
    if which == "fi_topk_topp_filtered":  # the [B] filter tensors (int32 top_k, else int64)
        return [(f"logits/T {tag}, top_k [B] {kt}, top_p [B] fp32", dt,
                 lambda s, kw, _kt=kt: fi.top_k_top_p_sampling_from_logits(
                     s, kw["top_k"] if _kt == "int32" else kw["top_k"].long(), kw["top_p"]))
                for kt in ("int32", "int64") for tag, dt in dtypes]
    if which == "fi_minp":  # FlashInfer's min-p samples from probabilities: softmax first (fp32)
        return [("logits/T fp32 -> softmax -> min_p [B] fp32", torch.float32,
                 lambda s, kw: fi.min_p_sampling_from_probs(torch.softmax(s, dim=-1), kw["min_p"]))]
    raise ValueError(which)


def _build_fi(which: str, group: Optional[str] = None):
    def build(ctx: ShapeCtx):
        fi, W = ctx.fi, ctx.weight

        # Logits / T per row first (baselines.sample_from_logits, greedy rows -> argmax), as a
        # serving stack applies temperature before FlashInfer.
        def sampler(dt, draw, kw):
            return lambda lg, t: baselines.sample_from_logits(lg, t, lambda s: draw(s, kw()), has_greedy=ctx.has_greedy,
                                                              dtype=dt)

        # Probe once on two rows, with two-row filter tensors.
        probe = F.linear(torch.randn(2, ctx.D, device=ctx.device, dtype=ctx.dtype), W)
        probe_t = torch.full((2,), ctx.T, device=ctx.device)
        probe_kw = {"top_k": torch.full((2,), int(ctx.filters["top_k"]), dtype=torch.int32, device=ctx.device),
                    "top_p": torch.full((2,), float(ctx.filters["top_p"]), device=ctx.device),
                    "min_p": torch.full((2,), float(ctx.filters["min_p"]), device=ctx.device)}
        last = None
        for note, dt, draw in _fi_variants(which, fi, ctx.V):
            try:
                t = sampler(dt, draw, lambda: probe_kw)(probe, probe_t)
                C.sync(ctx.device)
                if t.numel() != 2:
                    raise RuntimeError(f"unexpected output shape {tuple(t.shape)}")
                ctx.fi_notes[which] = note
                call = sampler(dt, draw, lambda: ctx.filter_kwargs(group))
                return lambda h, _c=call: _c(F.linear(h, W), ctx.temp_t)
            except Exception as e:  # noqa: BLE001
                last = e
        raise RuntimeError(f"flashinfer {which} failed on every probe: {last}")
    return build


METHODS: Dict[str, Method] = {m.name: m for m in [
    Method("cublas", "cuBLAS", "floor", _build_cublas, None, graph_default=True,
           note="F.linear(h, W): logits only, no sampling"),
    Method("fsdist", "fsdist", "fsdist", _build_fsdist(), _fs_tokens, graph_default=True,
           note="[B] device tensors for temperature, seed and offset (the serving case)"),
    Method("fsdist_logprobs", "fs+lp", "fsdist", _build_fsdist(logprobs=True), _fs_tokens, graph_default=True,
           note="as fsdist, return_logprobs=True"),
    Method("fsdist_scalar", "fs-scalar", "fsdist", _build_fsdist(scalar=True), _fs_tokens, default=False,
           graph_default=True, note="one float temperature, as the 'fsdist' method of the 2026-11-21 "
           "result JSONs; seeds and offsets [B] device tensors"),
    Method("fsdist_fused", "fs-fused", "fsdist", _build_fsdist(path="fused"), _fs_tokens, default=False,
           graph_default=True, note="as fsdist, stage 1 always the fused kernel (its default config for B)"),
    Method("fsdist_chunked", "fs-chunk", "fsdist", _build_fsdist(path="chunked"), _fs_tokens, default=False,
           graph_default=True, note="as fsdist, stage 1 always cuBLAS fp32 logits per chunk + the sampling pass"),
    Method("multinomial_eager", "mn-eager", "baseline", _build_torch("multinomial", False), _plain,
           note="torch.multinomial syncs the host (input check): not graph-capturable"),
    Method("multinomial_compiled", "mn-comp", "baseline", _build_torch("multinomial", True), _plain,
           compiled=True),
    Method("gumbel_eager", "gb-eager", "baseline", _build_torch("gumbel", False), _plain, default=False,
           graph_default=True),
    Method("gumbel_compiled", "gb-comp", "baseline", _build_torch("gumbel", True), _plain, compiled=True,
           graph_default=True),
    Method("fi_topk_topp", "FI1", "baseline", _build_fi("fi_topk_topp"), _plain, flashinfer=True),
    Method("fi_sampling", "FI2", "baseline", _build_fi("fi_sampling"), _plain, flashinfer=True),
    # filtered sampling: fsdist and materialize-then-filter baselines with the same [B] filters
    Method("fsdist_topk_topp", "fs-tk/tp", "fsdist", _build_fsdist(group="topk_topp"), _fs_tokens,
           filter="topk_topp", note="as fsdist, plus top_k and top_p as [B] device tensors"),
    Method("fsdist_minp", "fs-minp", "fsdist", _build_fsdist(group="minp"), _fs_tokens, filter="minp",
           note="as fsdist, plus min_p as a [B] device tensor"),
    Method("fsdist_topk_topp_chunked", "fs-tk/tp-ch", "fsdist", _build_fsdist(group="topk_topp", path="chunked"),
           _fs_tokens, filter="topk_topp", default=False, graph_default=True,
           note="as fsdist_topk_topp, stage 1 always the chunked path (B > 64: which path filters should take)"),
    Method("fsdist_minp_chunked", "fs-minp-ch", "fsdist", _build_fsdist(group="minp", path="chunked"), _fs_tokens,
           filter="minp", default=False, graph_default=True,
           note="as fsdist_minp, stage 1 always the chunked path"),
    Method("torch_topk_topp_eager", "tk/tp-eag", "baseline", _build_torch_filtered("topk_topp", False), _plain,
           filter="topk_topp", default=False, note="baselines.matmul_top_k_top_p, eager"),
    Method("torch_topk_topp_compiled", "tk/tp-comp", "baseline", _build_torch_filtered("topk_topp", True), _plain,
           filter="topk_topp", compiled=True,
           note="cuBLAS logits, then sort-based top-k + top-p (vLLM's torch sampler) and an exponential race, "
                "torch.compile"),
    Method("torch_topk_topp_compiled_es", "tk/tp-comp-es", "baseline",
           _build_torch_filtered("topk_topp", True, "top_k_top_p_eager_scan"), _plain, filter="topk_topp",
           compiled=True,
           note="as torch_topk_topp_compiled, its top-p cumsum outside the graph (torch 2.11's Inductor fails to "
                "generate that scan at B >= 16)"),
    Method("torch_minp_eager", "minp-eag", "baseline", _build_torch_filtered("minp", False), _plain, filter="minp",
           default=False, note="baselines.matmul_min_p, eager"),
    Method("torch_minp_compiled", "minp-comp", "baseline", _build_torch_filtered("minp", True), _plain,
           filter="minp", compiled=True, note="cuBLAS logits, then min-p and an exponential race, torch.compile"),
    Method("fi_topk_topp_filtered", "FI-tk/tp", "baseline", _build_fi("fi_topk_topp_filtered", "topk_topp"), _plain,
           flashinfer=True, filter="topk_topp",
           note="flashinfer top_k_top_p_sampling_from_logits with the [B] top-k / top-p tensors"),
    Method("fi_minp", "FI-minp", "baseline", _build_fi("fi_minp", "minp"), _plain, flashinfer=True, filter="minp",
           note="softmax, then flashinfer min_p_sampling_from_probs with the [B] min-p tensor"),
    # logit processors (none in default: --methods processors)
    Method("fsdist_bitmask", "fs-bm", "fsdist", _build_fsdist(procs="bitmask"), _fs_tokens, default=False,
           graph_default=True, processors="bitmask", note="as fsdist, plus a [B, ceil(V/32)] int32 token bitmask"),
    Method("fsdist_bias_pen", "fs-b+p", "fsdist", _build_fsdist(procs="bias_pen"), _fs_tokens, default=False,
           graph_default=True, processors="bias_pen",
           note="as fsdist, plus logit_bias [B, n_bias] and penalties ([B] x 3, output / prompt ids)"),
    Method("fsdist_bias_pen_chunked", "fs-b+p-ch", "fsdist", _build_fsdist(procs="bias_pen", path="chunked"),
           _fs_tokens, default=False, graph_default=True, processors="bias_pen",
           note="as fsdist_bias_pen, stage 1 always the chunked path (B > 64: which path processors should take)"),
    Method("fsdist_processors_all", "fs-proc", "fsdist", _build_fsdist(procs="all"), _fs_tokens, default=False,
           graph_default=True, processors="all", note="as fsdist, plus bitmask, logit bias and penalties"),
    Method("torch_bitmask_compiled", "bm-comp", "baseline", _build_torch_processors("bitmask", True), _plain,
           compiled=True, default=False, processors="bitmask",
           note="cuBLAS logits -> fp32 -> bits unpacked + masked_fill -inf -> Gumbel argmax, torch.compile per B"),
    Method("xgr_bitmask", "bm-xgr", "baseline", _build_xgr_bitmask, _plain, default=False, processors="bitmask",
           note="cuBLAS logits -> fp32 -> xgrammar.apply_token_bitmask_inplace -> Gumbel argmax (compiled per B)"),
    Method("torch_bias_pen_compiled", "b+p-comp", "baseline", _build_torch_processors("bias_pen", True), _plain,
           compiled=True, default=False, processors="bias_pen",
           note="cuBLAS logits -> fp32 -> scatter_add bias -> vLLM penalties -> Gumbel argmax, torch.compile per B"),
    Method("torch_processors_compiled", "proc-comp", "baseline", _build_torch_processors("all", True), _plain,
           compiled=True, default=False, processors="all",
           note="cuBLAS logits -> fp32 -> bitmask -> bias -> penalties -> Gumbel argmax, torch.compile per B"),
    Method("torch_bitmask_eager", "bm-eag", "baseline", _build_torch_processors("bitmask", False), _plain,
           default=False, processors="bitmask", note="torch_bitmask_compiled without torch.compile"),
    Method("torch_bias_pen_eager", "b+p-eag", "baseline", _build_torch_processors("bias_pen", False), _plain,
           default=False, processors="bias_pen", note="torch_bias_pen_compiled without torch.compile"),
    Method("torch_processors_eager", "proc-eag", "baseline", _build_torch_processors("all", False), _plain,
           default=False, processors="all", note="torch_processors_compiled without torch.compile"),
]}

# --methods group names: what each one selects, in this order.
METHOD_GROUPS = {
    "processors": ["cublas", "fsdist", "gumbel_compiled", "fsdist_bitmask", "fsdist_bias_pen", "fsdist_processors_all",
                   "torch_bitmask_compiled", "xgr_bitmask", "torch_processors_compiled", "torch_processors_eager"],
}


def parse_configs(spec: str) -> List[TileConfig]:
    """A comma list of TileConfig.parse spellings: '16:128:128:4:5' or '16x128x128w4s5'."""
    try:
        return [TileConfig.parse(s) for s in spec.split(",") if s.strip()]
    except ValueError as e:
        raise SystemExit(f"--configs: {e}") from None


# (block_v, block_k, num_warps, num_stages) tried by --configs sweep, with block_b from the
# default config for that B and, from B >= 64, one tile larger.
SWEEP_VKWS = [(64, 128, 4, 4), (64, 256, 4, 3), (128, 64, 4, 6), (128, 128, 4, 4), (128, 128, 4, 5),
              (128, 128, 8, 4), (128, 256, 8, 3), (256, 64, 8, 4), (256, 128, 8, 3)]


def configs_for(spec: Optional[str], B: int, D: int, device: torch.device) -> List[TileConfig]:
    if not spec:
        return []
    default = default_config(B, D, device)
    if spec in ("sweep", "sweep-small"):
        vkws = SWEEP_VKWS if spec == "sweep" else SWEEP_VKWS[2:6]
        bbs = [default.block_b] + ([default.block_b * 2] if B >= 64 and spec == "sweep" else [])
        out = [TileConfig(bb, bv, bk, nw, ns) for bb in bbs for (bv, bk, nw, ns) in vkws
               # pipelined bf16 tiles of hidden and weight must fit in shared memory (228 KB on Hopper)
               if device.type != "cuda" or ns * (bb + bv) * bk * 2 <= 200 * 1024]
    else:
        out = parse_configs(spec)
    # sweep candidates carry the default's first-wave stagger (configs.first_wave_stagger_us); named configs keep theirs
    if spec in ("sweep", "sweep-small"):
        out = [dataclasses.replace(c, stagger_us=default.stagger_us) for c in out]
    out = [default] + [c for c in out if c != default]
    seen, uniq = set(), []
    for c in out:
        if c not in seen:
            seen.add(c)
            uniq.append(c)
    return uniq


# --------------------------------------------------------------------------- checks
class Checks:
    def __init__(self, writer: C.ResultWriter):
        self.rows: List[Dict] = []
        self.writer = writer

    def add(self, D, V, B, name, ok, detail="", fatal=True):
        self.rows.append({"D": D, "V": V, "B": B, "check": name, "ok": bool(ok), "fatal": fatal,
                          "detail": detail})
        if not ok:
            C.log(f"CHECK {'FAILED' if fatal else 'warning'}: D={D} V={V} B={B} {name}: {detail}")

    def failed(self, D=None, V=None, B=None) -> List[Dict]:
        return [r for r in self.rows if not r["ok"] and r["fatal"]
                and (D is None or (r["D"], r["V"], r["B"]) == (D, V, B))]


def reference_logits(h: torch.Tensor, W: torch.Tensor, rows: List[int], chunk: int = 16384) -> torch.Tensor:
    """fp32 logits of the chosen rows, from upcast inputs, W processed in chunks (bounded memory)."""
    hr = h[rows].float()
    return torch.cat([hr @ W[i:i + chunk].float().T for i in range(0, W.shape[0], chunk)], dim=1)


def check_cell(ctx: ShapeCtx, hs: List[torch.Tensor], checks: Checks):
    """Light correctness checks of fsdist on this (shape, B) before anything is timed,
    with the serving case's [B] parameters."""
    D, V, B = ctx.D, ctx.V, ctx.B
    h = hs[0]
    rows = sorted({0, 1, B // 2, B - 1} & set(range(B)))
    ref = reference_logits(h, ctx.weight, rows)
    ref_max = ref.max(dim=1)
    tol = 1e-3 * (1.0 + ref_max.values.abs())
    temps = ctx.temp_t.float()
    sampled = temps >= GREEDY_TEMPERATURE
    n_sampled = int(sampled.sum())
    params = ctx.fs_params()

    out = fsdist.sample(h, ctx.weight, **params)
    t = out.tokens
    ok = t.dtype == torch.int64 and tuple(t.shape) == (B,) and bool(((t >= 0) & (t < V)).all())
    checks.add(D, V, B, "fsdist tokens in [0, V)", ok, f"dtype={t.dtype} shape={tuple(t.shape)} "
               f"min={int(t.min())} max={int(t.max())}")
    again = fsdist.sample(h, ctx.weight, **params).tokens
    checks.add(D, V, B, "fsdist same (seed, offset) -> same tokens", torch.equal(t, again),
               f"{int((t != again).sum())} rows differ")
    other = fsdist.sample(h, ctx.weight, **dict(params, offset=ctx.off_t + 1)).tokens
    n_diff = int((other != t)[sampled].sum())
    if n_sampled:
        checks.add(D, V, B, "fsdist new offset -> new draw", n_diff > 0, f"{n_diff}/{n_sampled} sampled rows changed",
                   fatal=n_sampled >= 8)

    greedy_all = fsdist.sample(h, ctx.weight, temperature=0.0).tokens
    if n_sampled < B:
        n_bad = int((t != greedy_all)[~sampled].sum())
        checks.add(D, V, B, "fsdist greedy rows (T=0 in the [B] tensor) == temperature=0.0", n_bad == 0,
                   f"{n_bad}/{B - n_sampled} rows differ")
    greedy = greedy_all[rows]
    g_logit = ref.gather(1, greedy[:, None].clamp(0, V - 1)).squeeze(1)
    exact = int((greedy == ref_max.indices).sum())
    ok = bool(((ref_max.values - g_logit) <= tol).all())
    checks.add(D, V, B, "fsdist greedy == argmax (fp32 reference; near-ties allowed)", ok,
               f"{exact}/{len(rows)} exact; worst gap {float((ref_max.values - g_logit).max()):.3g}")
    cub = F.linear(h[rows], ctx.weight).argmax(dim=1)
    checks.add(D, V, B, "fsdist greedy == cuBLAS argmax (info: bf16 logits round ties)",
               True, f"{int((cub == greedy).sum())}/{len(rows)} equal", fatal=False)

    lp = fsdist.sample(h, ctx.weight, **params, return_logprobs=True)
    checks.add(D, V, B, "fsdist return_logprobs -> same tokens", torch.equal(lp.tokens, t),
               f"{int((lp.tokens != t).sum())} rows differ")
    t_eff = torch.where(sampled, temps, torch.ones_like(temps))[rows][:, None]  # greedy rows: T = 1
    ref_lse = torch.logsumexp(ref / t_eff, dim=1)
    lse_err = float(((lp.logsumexp[rows] - ref_lse).abs() / (1 + ref_lse.abs())).max())
    tok = lp.tokens[rows].clamp(0, V - 1)
    ref_lp = ref.gather(1, tok[:, None]).squeeze(1) / t_eff[:, 0] - ref_lse
    lp_err = float((lp.logprobs[rows] - ref_lp).abs().max())
    checks.add(D, V, B, "fsdist logsumexp/logprob vs fp32 reference", lse_err < 1e-3 and lp_err < 2e-3,
               f"lse rel err {lse_err:.2e}, logprob abs err {lp_err:.2e}")


def filtered_row_check(logits: torch.Tensor, tokens: torch.Tensor, temperature: torch.Tensor, *,
                       top_k=0, top_p=1.0, min_p=0.0, seed: Optional[torch.Tensor] = None,
                       offset: Optional[torch.Tensor] = None, tol: float = 1e-3) -> Dict:
    """Sampled tokens of a few rows against the float64 reference of the filters (fsdist.reference).

    logits: [R, V] reference logits of those rows; tokens, temperature: [R]; top_k / top_p /
    min_p: numbers or [R] tensors, as the sampler got them. With a margin
    m = tol * (1 + max |logit|) per row for rounding at the boundary:

    kept:  the token's logit is >= the smallest logit the reference keeps, less m.
    noise: (seed and offset given: fsdist's rows) the token's score, scaled logit + fsdist's
           Gumbel noise (float64), is within m / T of the best score over the ids the
           reference keeps with a margin (logit >= threshold + m): the token is the argmax
           over the kept set, up to rounding at the boundary. Greedy rows: kept only.
    Returns {"kept": bool [R], "noise": bool [R] (all True without seed), "detail": str}.
    """
    x = logits.double()
    R, V = x.shape
    dev = x.device
    toks = tokens.to(dev).long().clamp(0, V - 1)
    sem = serving_semantics(x, temperature=temperature.to(dev), top_k=top_k, top_p=top_p, min_p=min_p)
    keep = sem.probs > 0
    margin = tol * (1.0 + x.abs().amax(dim=1))
    thr = torch.where(keep, x, torch.full_like(x, float("inf"))).amin(dim=1)
    tok_logit = x.gather(1, toks[:, None])[:, 0]
    kept = (tok_logit >= thr - margin) & (tokens.to(dev) >= 0) & (tokens.to(dev) < V)
    noise_ok = torch.ones_like(kept)
    if seed is not None and offset is not None:
        ids = torch.arange(V, device=dev)[None, :]
        score = sem.scaled + vocab_gumbel(seed.to(dev).long()[:, None], offset.to(dev).long()[:, None], ids)
        sure = keep & (x >= (thr + margin)[:, None])
        best = torch.where(sure, score, torch.full_like(score, float("-inf"))).amax(dim=1)
        t_eff = torch.where(sem.greedy, torch.ones_like(thr), temperature.to(dev).double())
        noise_ok = sem.greedy | (score.gather(1, toks[:, None])[:, 0] >= best - margin / t_eff)
    detail = f"{int(kept.sum())}/{R} in the reference's kept set"
    if seed is not None and offset is not None:
        detail += f", {int(noise_ok.sum())}/{R} = its argmax with fsdist's noise"
    detail += f"; kept-set sizes {keep.sum(dim=1).tolist()}"
    return {"kept": kept, "noise": noise_ok, "detail": detail}


def check_filtered(ctx: ShapeCtx, m: Method, h: torch.Tensor, tokens: torch.Tensor, checks: Checks):
    """A filtered method's tokens on four rows: in the float64 reference's kept set, and (fsdist)
    the argmax over it with fsdist's noise. Baselines read bf16 cuBLAS logits: a wider margin."""
    rows = sorted({0, 1, ctx.B // 2, ctx.B - 1} & set(range(ctx.B)))
    kw = {k: v[rows] for k, v in ctx.filter_kwargs(m.filter).items()}
    is_fs = m.kind == "fsdist"
    wide = not is_fs and ctx.dtype != torch.float32
    res = filtered_row_check(reference_logits(h, ctx.weight, rows), tokens[rows], ctx.temp_t[rows], **kw,
                             seed=ctx.seed_t[rows] if is_fs else None, offset=ctx.off_t[rows] if is_fs else None,
                             tol=1e-2 if wide else 1e-3)
    what = ", ".join(f"{k}={ctx.filters[k]:g}" for k in FILTER_GROUPS[m.filter])
    checks.add(ctx.D, ctx.V, ctx.B, f"{m.name} tokens in the float64 reference's kept set ({what})",
               bool(res["kept"].all()), res["detail"])
    if is_fs:
        checks.add(ctx.D, ctx.V, ctx.B, f"{m.name} token = argmax over the kept set with fsdist's noise",
                   bool(res["noise"].all()), res["detail"])


def bitmask_allows(token_bitmask: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """bool, the shape of tokens ([N] or [N, B] where the bitmask has B rows and tokens[..., b] is
    row b's): whether each token is in [0, V) of the mask and its bit is set."""
    tok = tokens.long()
    rows = torch.arange(token_bitmask.shape[0], device=tok.device).expand_as(tok)
    inside = (tok >= 0) & (tok < token_bitmask.shape[1] * 32)
    t = tok.clamp(0, token_bitmask.shape[1] * 32 - 1)
    word = token_bitmask.to(tok.device)[rows, t // 32].to(torch.int64)
    return inside & (((word >> (t % 32)) & 1) != 0)


def processed_row_check(logits: torch.Tensor, tokens: torch.Tensor, temperature: torch.Tensor, procs: Dict, *,
                        seed: Optional[torch.Tensor] = None, offset: Optional[torch.Tensor] = None,
                        tol: float = 1e-3) -> Dict:
    """Tokens of a few rows against the float64 reference with the logit processors
    (fsdist.reference.serving_semantics; no filters).

    logits: [R, V] reference logits of those rows; procs: fsdist.sample's processor
    arguments for those rows. With m = tol * (1 + max |processed logit|) per row:
    support: the token's processed logit is finite (allowed by the bitmask);
    noise:   (seed and offset given: fsdist's rows) the token's score, processed / T +
             fsdist's Gumbel noise (float64), is within m / T of the best score; greedy rows:
             the token's processed logit is within m of the largest.
    Returns {"support": bool [R], "noise": bool [R], "detail": str}.
    """
    x = logits.double()
    R, V = x.shape
    dev = x.device
    toks = tokens.to(dev).long()
    sem = serving_semantics(x, temperature=temperature.to(dev), **procs)
    fin = torch.isfinite(sem.processed)
    margin = tol * (1.0 + torch.where(fin, sem.processed.abs(), torch.zeros_like(x)).amax(dim=1))
    t = toks.clamp(0, V - 1)
    support = (toks >= 0) & (toks < V) & fin.gather(1, t[:, None])[:, 0]
    best_logit = sem.processed.amax(dim=1)
    tok_logit = sem.processed.gather(1, t[:, None])[:, 0]
    noise_ok = ~sem.greedy | (tok_logit >= best_logit - margin)
    detail = f"{int(support.sum())}/{R} allowed by the processors"
    if seed is not None and offset is not None:
        ids = torch.arange(V, device=dev)[None, :]
        score = sem.scaled + vocab_gumbel(seed.to(dev).long()[:, None], offset.to(dev).long()[:, None], ids)
        score = torch.where(fin, score, torch.full_like(score, float("-inf")))
        t_eff = torch.where(sem.greedy, torch.ones_like(best_logit), temperature.to(dev).double())
        sampled_ok = score.gather(1, t[:, None])[:, 0] >= score.amax(dim=1) - margin / t_eff
        noise_ok = torch.where(sem.greedy, noise_ok, sampled_ok)
        detail += f", {int(noise_ok.sum())}/{R} = the argmax of processed / T + fsdist's noise"
    detail += f"; allowed ids per row {fin.sum(dim=1).tolist()}"
    return {"support": support, "noise": noise_ok, "detail": detail}


def _check_rows(B: int) -> List[int]:
    return sorted({0, 1, B // 2, B - 1} & set(range(B)))


def check_processed(ctx: ShapeCtx, m: Method, h: torch.Tensor, tokens: torch.Tensor, checks: Checks):
    """A processors method's tokens: every row's token allowed by the bitmask (when the group has
    one); on four rows, in the float64 reference's support and (fsdist) the argmax of the
    processed logits with fsdist's noise. Baselines read bf16 cuBLAS logits: a wider margin."""
    D, V, B = ctx.D, ctx.V, ctx.B
    if "token_bitmask" in PROCESSOR_GROUPS[m.processors]:
        ok = bitmask_allows(ctx.bitmask_t, tokens)
        checks.add(D, V, B, f"{m.name} tokens allowed by the bitmask (every row)", bool(ok.all()),
                   f"{int((~ok).sum())}/{B} rows drew a disallowed id")
    rows = _check_rows(B)
    is_fs = m.kind == "fsdist"
    wide = not is_fs and ctx.dtype != torch.float32
    res = processed_row_check(reference_logits(h, ctx.weight, rows), tokens[rows], ctx.temp_t[rows],
                              ctx.processor_kwargs(m.processors, rows), seed=ctx.seed_t[rows] if is_fs else None,
                              offset=ctx.off_t[rows] if is_fs else None, tol=1e-2 if wide else 1e-3)
    checks.add(D, V, B, f"{m.name} tokens in the float64 reference's support ({PROCESSOR_TITLES[m.processors]})",
               bool(res["support"].all()), res["detail"])
    if is_fs:
        checks.add(D, V, B, f"{m.name} token = argmax of processed / T + fsdist's noise", bool(res["noise"].all()),
                   res["detail"])


def check_processors_cell(ctx: ShapeCtx, hs: List[torch.Tensor], groups: List[str], checks: Checks):
    """Per processor group, once per (shape, B) before timing:

    * the torch baselines' processed logits (torch_processed_logits on fp32 reference
      logits of four rows) equal fsdist.reference's float64 ones: same -inf ids, values
      within 1e-5 * (1 + |x|) (what the baselines time is the reference's semantics);
    * fsdist with temperature 0 (every row greedy) takes the float64 argmax of the processed
      logits on those rows (near-ties allowed, 1e-3 * (1 + max |x|));
    * fsdist's greedy tokens equal the argmax of the baseline's processed cuBLAS logits on
      every row where that argmax is decided (gap to the runner-up > 1e-2 * (1 + max |x|):
      about twice the worst bf16 rounding of two logits); how many were decided is reported.
    """
    D, V, B = ctx.D, ctx.V, ctx.B
    h = hs[0]
    rows = _check_rows(B)
    ref = reference_logits(h, ctx.weight, rows)
    for g in groups:
        procs_rows = ctx.processor_kwargs(g, rows)
        want = serving_semantics(ref.double(), temperature=0.0, **procs_rows).processed
        tens = {k: v[rows] for k, v in ctx.processor_tensors(g).items()}
        got = torch_processed_logits(ref, **tens).double()
        same_inf = torch.equal(torch.isinf(got), torch.isinf(want))
        fin = torch.isfinite(want)
        err = float(((got - want).abs() / (1 + want.abs()))[fin].max()) if bool(fin.any()) else 0.0
        checks.add(D, V, B, f"torch baseline's processed logits == float64 reference ({PROCESSOR_TITLES[g]})",
                   same_inf and err < 1e-5, f"same -inf ids: {same_inf}; max rel err {err:.2e}")

        greedy = fsdist.sample(h, ctx.weight, temperature=0.0, **ctx.processor_kwargs(g)).tokens
        g_rows = greedy[rows].to(want.device).clamp(0, V - 1)
        best = want.amax(dim=1)
        tol = 1e-3 * (1.0 + torch.where(fin, want.abs(), torch.zeros_like(want)).amax(dim=1))
        gap = best - want.gather(1, g_rows[:, None])[:, 0]
        exact = int((g_rows == want.argmax(dim=1)).sum())
        checks.add(D, V, B, f"fsdist greedy == float64 argmax of the processed logits ({PROCESSOR_TITLES[g]})",
                   bool((gap <= tol).all()) and bool((greedy[rows] >= 0).all()),
                   f"{exact}/{len(rows)} exact; worst gap {float(gap.max()):.3g}")

        base = torch_processed_logits(F.linear(h, ctx.weight), **ctx.processor_tensors(g))
        top2 = base.topk(2, dim=1).values
        scale = torch.where(torch.isfinite(base), base.abs(), torch.zeros_like(base)).amax(dim=1)
        decided = (top2[:, 0] - top2[:, 1]) > 1e-2 * (1.0 + scale)
        agree = greedy == base.argmax(dim=1)
        n_dec, n_bad = int(decided.sum()), int((~agree & decided).sum())
        checks.add(D, V, B, f"fsdist greedy == baseline argmax where decided ({PROCESSOR_TITLES[g]})",
                   n_bad == 0,
                   f"{n_dec}/{B} rows decided, {n_bad} of them differ; {int(agree.sum())}/{B} equal overall")


def check_tokens(ctx: ShapeCtx, m: Method, out, checks: Checks, h: Optional[torch.Tensor] = None):
    if m.tokens is None:
        ok = tuple(out.shape) == (ctx.B, ctx.V)
        checks.add(ctx.D, ctx.V, ctx.B, f"{m.name} output shape", ok, f"{tuple(out.shape)}")
        return
    t = m.tokens(out).reshape(-1)
    ok = t.numel() == ctx.B and bool(((t >= 0) & (t < ctx.V)).all())
    checks.add(ctx.D, ctx.V, ctx.B, f"{m.name} tokens in [0, V)", ok,
               f"n={t.numel()} min={int(t.min()) if t.numel() else None} max={int(t.max()) if t.numel() else None}")
    if m.filter and h is not None and ok:
        check_filtered(ctx, m, h, t, checks)
    if m.processors and h is not None and ok:
        check_processed(ctx, m, h, t, checks)


def graph_rows_from_rounds(cell: dict, samples: Dict[str, List[float]], rounds: int, against: str = "cublas"):
    """--graph-rounds: one "graph" row per method from its round medians (time_interleaved's samples), and for each
    other method its ratio to ``against`` round by round (fsdist.timing.paired_ratio) under "paired"."""
    rows = []
    for name, xs in samples.items():
        s = C.summarize(xs)
        row = dict(cell, method=name, mode="graph", median_us=s.get("median_us"), min_us=s.get("min_us"),
                   p10_us=s.get("p10_us"), p90_us=s.get("p90_us"), n=s.get("n", 0), error=None,
                   graph_rounds=rounds, round_medians_us=list(xs))
        if name != against and against in samples and len(samples[against]) == len(xs) and xs:
            row["paired"] = dict(against=against, **C.paired_ratio(xs, samples[against]))
        rows.append(row)
    return rows


def interleaved_graph_rows(ctx: ShapeCtx, fns: dict, names: List[str], hs, checks: "Checks", args, reps: int,
                           flush, bump, budget) -> List[dict]:
    """--graph-rounds R: every graph method of the cell captured first (and checked, as the one-block path does),
    then timed in turns, R rounds of ``max(2, reps // graph_calls // 4)`` replays a graph (reps: the cell's timed
    calls a run; fsdist.timing.time_interleaved): the machine's drift between blocks (2-5% on the lent H100s, v126)
    falls on every method alike, and fsdist's ratio to cuBLAS is taken round by round. A method whose capture fails
    gets an error row; a failure while timing gives every captured method one."""
    D, V, B = ctx.D, ctx.V, hs[0].shape[0]
    cell = {"D": D, "V": V, "B": B, "dtype": C.dtype_name(ctx.dtype), "graph_calls": args.graph_calls}
    graphs, rows = {}, []
    for name in names:
        if budget.exceeded():
            break
        try:
            g = C.CapturedGraph(fns[name], [(h,) for h in hs], calls=args.graph_calls)
            if METHODS[name].kind == "fsdist":
                check_graph(ctx, g, METHODS[name], hs, checks)
            graphs[name] = g
        except Exception as e:  # noqa: BLE001
            rows.append(dict(cell, method=name, mode="graph", median_us=None,
                             error=f"{type(e).__name__}: {str(e)[:300]}"))
            C.log(f"  {name} B={B}: graph failed: {rows[-1]['error']}")
            _quiet_sync(ctx.device)
    if not graphs:
        return rows
    replays = max(2, reps // args.graph_calls // 4)
    try:
        samples = C.time_interleaved(
            {name: (lambda g=g: statistics.median(C.time_graph(g, warmup=1, reps=replays, flush=flush,
                                                               before_replay=bump)))
             for name, g in graphs.items()}, rounds=args.graph_rounds)
    except Exception as e:  # noqa: BLE001  (as the one-block path: an error row a method, the run goes on)
        err = f"{type(e).__name__}: {str(e)[:300]}"
        C.log(f"  B={B}: interleaved graph timing failed: {err}")
        _quiet_sync(ctx.device)
        return rows + [dict(cell, method=name, mode="graph", median_us=None, error=err) for name in graphs]
    del graphs
    for row in graph_rows_from_rounds(cell, samples, args.graph_rounds):
        p = row.get("paired")
        C.log(f"  D={D} V={V} B={B:<4} {row['method'] + ' [graph]':<22} {C.fmt_us(row['median_us']):>9} us"
              + (f", {p['median']:.3f}x cuBLAS round by round (p10 {p['p10']:.3f}, p90 {p['p90']:.3f})" if p else ""))
        rows.append(row)
    return rows


def check_graph(ctx: ShapeCtx, graph: C.CapturedGraph, m: Method, hs, checks: Checks):
    """The replayed graph gives eager fsdist's tokens and picks up the offset tensor's updates."""
    scalar = m.name in SCALAR_METHODS
    ctx.off_t.fill_(7)
    graph.replay()
    C.sync(ctx.device)
    got = m.tokens(graph.outputs[0]).clone()
    want = m.tokens(fsdist.sample(hs[0], ctx.weight, **ctx.fs_params(scalar, m.filter, m.processors),
                                  return_logprobs=m.name == "fsdist_logprobs"))
    checks.add(ctx.D, ctx.V, ctx.B, f"{m.name} graph replay == eager", torch.equal(got, want),
               f"{int((got != want).sum())} rows differ")
    ctx.off_t.fill_(8)
    graph.replay()
    C.sync(ctx.device)
    sampled = torch.ones_like(got, dtype=torch.bool) if scalar else ctx.temp_t >= GREEDY_TEMPERATURE
    n, n_sampled = int((m.tokens(graph.outputs[0]) != got)[sampled].sum()), int(sampled.sum())
    if n_sampled:
        checks.add(ctx.D, ctx.V, ctx.B, f"{m.name} graph replay sees new offset", n > 0,
                   f"{n}/{n_sampled} sampled rows changed", fatal=n_sampled >= 8)


# --------------------------------------------------------------------------- summary
def _median(xs):
    return statistics.median(xs) if xs else None


def summarize_results(data: Dict) -> List[Dict]:
    """Per (shape, B): the table's numbers (also stored in the JSON for plot.py)."""
    ceil = data.get("ceilings", {})
    copy_bps = ceil.get("copy", {}).get("bytes_per_s")
    flops = ceil.get("matmul", {}).get("flop_per_s")
    cells: Dict[tuple, Dict] = {}
    for r in data.get("results", []):
        if r.get("median_us") is None:
            continue
        key = (r["D"], r["V"], r["B"])
        cells.setdefault(key, {})[(r["method"], r["mode"])] = r
    out = []
    for (D, V, B), rs in sorted(cells.items()):
        ev = {m: r for (m, mode), r in rs.items() if mode == "events"}
        gr = {m: r for (m, mode), r in rs.items() if mode == "graph"}
        row = {"D": D, "V": V, "B": B}
        row["cublas_us"] = ev["cublas"]["median_us"] if "cublas" in ev else None
        row["fsdist_us"] = ev["fsdist"]["median_us"] if "fsdist" in ev else None
        row["fsdist_graph_us"] = gr["fsdist"]["median_us"] if "fsdist" in gr else None
        row["fsdist_logprobs_us"] = ev["fsdist_logprobs"]["median_us"] if "fsdist_logprobs" in ev else None
        if "fsdist_scalar" in ev:
            row["fsdist_scalar_us"] = ev["fsdist_scalar"]["median_us"]
        tuned = {m: r for m, r in ev.items() if m.startswith("fsdist@")}
        if tuned:
            best = min(tuned.values(), key=lambda r: r["median_us"])
            row["best_config"], row["best_config_us"] = best["method"][len("fsdist@"):], best["median_us"]
        bases = {m: r for m, r in ev.items() if METHODS.get(m) is not None and METHODS[m].kind == "baseline"
                 and not METHODS[m].filter and not METHODS[m].processors}
        if bases:
            bm = min(bases, key=lambda m: bases[m]["median_us"])
            row["best_baseline"], row["best_baseline_us"] = bm, bases[bm]["median_us"]
        row["baselines_us"] = {m: r["median_us"] for m, r in bases.items()}
        if row["fsdist_us"] and row["cublas_us"]:
            row["fsdist_over_cublas"] = row["fsdist_us"] / row["cublas_us"]
        if row["fsdist_us"] and row.get("best_baseline_us"):
            row["speedup_vs_best_baseline"] = row["best_baseline_us"] / row["fsdist_us"]
        if row["fsdist_us"] and copy_bps and flops:
            elem = {"bf16": 2, "fp16": 2, "fp32": 4}.get(data.get("args", {}).get("dtype"), 2)
            fl = C.floor_us(D, V, B, elem, copy_bps, flops)
            row.update(floor_us=fl["floor_us"], mem_floor_us=fl["mem_us"], compute_floor_us=fl["compute_us"])
            row["pct_copy_bw"] = 100.0 * fl["bytes"] / (row["fsdist_us"] * 1e-6) / copy_bps
            row["pct_floor"] = 100.0 * fl["floor_us"] / row["fsdist_us"]
            if row["cublas_us"]:
                row["cublas_pct_copy_bw"] = 100.0 * fl["bytes"] / (row["cublas_us"] * 1e-6) / copy_bps
        filtered = {}
        for group, fs_name in FILTERED_FSDIST.items():
            g = {}
            if fs_name in ev:
                g.update(fsdist_method=fs_name, fsdist_us=ev[fs_name]["median_us"],
                         fallback_rate=ev[fs_name].get("fallback_rate"))
            gb = {m: r["median_us"] for m, r in ev.items()
                  if METHODS.get(m) is not None and METHODS[m].kind == "baseline" and METHODS[m].filter == group}
            if gb:
                bm = min(gb, key=gb.get)
                g.update(baselines_us=gb, best_baseline=bm, best_baseline_us=gb[bm])
            if g.get("fsdist_us") and g.get("best_baseline_us"):
                g["speedup_vs_best_baseline"] = g["best_baseline_us"] / g["fsdist_us"]
            if g:
                filtered[group] = g
        if filtered:
            row["filtered"] = filtered
        procs = {}
        for group, fs_name in PROCESSOR_FSDIST.items():
            g = {}
            if fs_name in ev:
                g.update(fsdist_method=fs_name, fsdist_us=ev[fs_name]["median_us"])
                if row["fsdist_us"]:
                    g["over_plain_fsdist"] = g["fsdist_us"] / row["fsdist_us"]
            if fs_name in gr:
                g["fsdist_graph_us"] = gr[fs_name]["median_us"]
                if row["fsdist_graph_us"]:
                    g["graph_over_plain_graph"] = g["fsdist_graph_us"] / row["fsdist_graph_us"]
            gb = {m: r["median_us"] for m, r in ev.items()
                  if METHODS.get(m) is not None and METHODS[m].kind == "baseline" and METHODS[m].processors == group}
            if gb:
                bm = min(gb, key=gb.get)
                g.update(baselines_us=gb, best_baseline=bm, best_baseline_us=gb[bm])
                if g.get("fsdist_us"):
                    g["baselines_over_fsdist"] = {m: t / g["fsdist_us"] for m, t in gb.items()}
                    g["speedup_vs_best_baseline"] = gb[bm] / g["fsdist_us"]
            if g:
                procs[group] = g
        if procs:
            row["processors"] = procs
        row["checks_failed"] = [c["check"] for c in data.get("checks", [])
                                if not c["ok"] and c["fatal"] and (c["D"], c["V"], c["B"]) == (D, V, B)]
        out.append(row)
    return out


def print_tables(data: Dict):
    rows = summarize_results(data)
    res = data.get("results", [])
    methods = []
    for r in res:
        if r["method"] not in methods and not r["method"].startswith("fsdist@"):
            methods.append(r["method"])
    label = {m: (METHODS[m].label if m in METHODS else m) for m in methods}
    shapes = sorted({(r["D"], r["V"]) for r in res})

    def find(D, V, B, m, mode="events"):
        return next((r for r in res if (r["D"], r["V"], r["B"], r["method"], r["mode"]) == (D, V, B, m, mode)), None)

    def cell(r):
        return C.fmt_us(r.get("median_us")) if r and r.get("median_us") else ("err" if r and r.get("error") else "-")

    def table(mode: str, title: str, only=None):
        ms = [m for m in methods if (only is None or m in only)
              and any(r["method"] == m and r["mode"] == mode and r.get("median_us") for r in res)]
        if not ms:
            return
        print(f"\n{title}")
        for D, V in shapes:
            print(f"D={D} V={V}: median us per call")
            print("     B " + "".join(f"{label[m]:>11}" for m in ms))
            for B in sorted({r["B"] for r in res if (r["D"], r["V"]) == (D, V)}):
                print(f"{B:>6} " + "".join(f"{cell(find(D, V, B, m, mode)):>11}" for m in ms))

    unfiltered = {m for m in methods if not (m in METHODS and (METHODS[m].filter or METHODS[m].processors))}
    table("events", "== all methods without filters, per call (median; CUDA events, host clock on CPU) ==",
          unfiltered)
    table("graph", "== CUDA-graph replay, per call (median) ==")

    filters = data.get("args", {}).get("filters") or {}
    for group, fs_name in FILTERED_FSDIST.items():
        ms = [m for m in methods if m in METHODS and METHODS[m].filter == group and m != fs_name]
        if fs_name not in methods and not ms:
            continue
        what = " + ".join(f"{k.replace('_', '-')} {filters.get(k, '?')}" for k in FILTER_GROUPS[group])
        print(f"\n== filtered sampling, {what} ([B] tensors): fsdist against materialize-then-filter ==")
        for D, V in shapes:
            print(f"D={D} V={V}: median us per call; fb% = rows resolved by the exact fallback (timed calls)")
            print("     B " + f"{METHODS[fs_name].label:>11}{'fb%':>7}" + "".join(f"{label[m]:>11}" for m in ms)
                  + f"{'speedup':>9}")
            for B in sorted({r["B"] for r in res if (r["D"], r["V"]) == (D, V)}):
                fs = find(D, V, B, fs_name)
                fb = fs.get("fallback_rate") if fs else None
                line = f"{B:>6} {cell(fs):>11}{(f'{100 * fb:.1f}' if fb is not None else '-'):>7}"
                line += "".join(f"{cell(find(D, V, B, m)):>11}" for m in ms)
                bt = [find(D, V, B, m) for m in ms]
                bt = [r["median_us"] for r in bt if r and r.get("median_us")]
                sp = f"{min(bt) / fs['median_us']:.2f}x" if (bt and fs and fs.get("median_us")) else "-"
                print(line + f"{sp:>9}")

    pc = data.get("args", {}).get("processors") or {}
    for group, fs_name in PROCESSOR_FSDIST.items():
        ms = [m for m in methods if m in METHODS and METHODS[m].processors == group and m != fs_name]
        if fs_name not in methods and not ms:
            continue
        print(f"\n== logit processors: {PROCESSOR_TITLES[group]} ([B] tensors; {pc.get('what', '')}) ==")
        for D, V in shapes:
            print(f"D={D} V={V}: median us per call; x/fs = over plain fsdist in the same run; graph = CUDA-graph "
                  f"replay; base/x = each baseline over {METHODS[fs_name].label}")
            print("     B " + f"{'fsdist':>9}{METHODS[fs_name].label:>9}{'x/fs':>7}{'fsGraph':>9}{'xGraph':>9}"
                  f"{'xG/fsG':>7}" + "".join(f"{label[m]:>10}{'/x':>6}" for m in ms))
            for B in sorted({r["B"] for r in res if (r["D"], r["V"]) == (D, V)}):
                fs, x = find(D, V, B, "fsdist"), find(D, V, B, fs_name)
                fg, xg = find(D, V, B, "fsdist", "graph"), find(D, V, B, fs_name, "graph")

                def ratio(a, b, digits=3):
                    ok = a and b and a.get("median_us") and b.get("median_us")
                    return f"{a['median_us'] / b['median_us']:.{digits}f}" if ok else "-"
                line = (f"{B:>6} {cell(fs):>9}{cell(x):>9}{ratio(x, fs):>7}{cell(fg):>9}{cell(xg):>9}"
                        f"{ratio(xg, fg):>7}")
                line += "".join(f"{cell(find(D, V, B, m)):>10}{ratio(find(D, V, B, m), x, 2):>6}" for m in ms)
                print(line)

    if any("best_config" in r for r in rows):
        print("\n== fsdist tile-config sweep: best per (shape, B) ==")
        print(f"{'D':>5} {'V':>7} {'B':>4} {'default':>9} {'best':>9} {'config (bb x bv x bk w s)':>26}")
        for r in rows:
            if "best_config" in r:
                print(f"{r['D']:>5} {r['V']:>7} {r['B']:>4} {C.fmt_us(r['fsdist_us']):>9} "
                      f"{C.fmt_us(r['best_config_us']):>9} {r['best_config']:>26}")

    ceil = data.get("ceilings", {})
    copy_bps = ceil.get("copy", {}).get("bytes_per_s")
    print("\n== summary: fsdist against cuBLAS (floor) and the best baseline ==")
    if copy_bps:
        print(f"copy bw {C.fmt_rate(copy_bps)} (read+write), matmul {C.fmt_rate(ceil['matmul']['flop_per_s'], 'FLOP/s')}"
              f"; dtype {data.get('args', {}).get('dtype')}; device {(data.get('env', {}).get('gpu') or {}).get('name', 'cpu')}")
    if data.get("args", {}).get("row_temperatures"):
        print(f"fsdist and baselines: temperature {data['args']['row_temperatures']}")
    hdr = (f"{'D':>5} {'V':>7} {'B':>4} {'cuBLAS':>8} {'fsdist':>8} {'fs/cuB':>6} {'fsGraph':>8} {'fs+lp':>8} "
           f"{'best baseline':>22} {'speedup':>7} {'%copyBW':>7} {'%floor':>6}")
    print(hdr)
    for r in rows:
        bb = (f"{label.get(r['best_baseline'], r['best_baseline'])} {C.fmt_us(r['best_baseline_us'])}"
              if r.get("best_baseline") else "-")
        sp = f"{r['speedup_vs_best_baseline']:.2f}x" if r.get("speedup_vs_best_baseline") else "-"
        ratio = f"{r['fsdist_over_cublas']:.3f}" if r.get("fsdist_over_cublas") else "-"
        pbw = f"{r['pct_copy_bw']:.0f}%" if r.get("pct_copy_bw") else "-"
        pfl = f"{r['pct_floor']:.0f}%" if r.get("pct_floor") else "-"
        flag = "  CHECK FAILED" if r["checks_failed"] else ""
        print(f"{r['D']:>5} {r['V']:>7} {r['B']:>4} {C.fmt_us(r['cublas_us']):>8} {C.fmt_us(r['fsdist_us']):>8} "
              f"{ratio:>6} {C.fmt_us(r['fsdist_graph_us']):>8} {C.fmt_us(r['fsdist_logprobs_us']):>8} "
              f"{bb:>22} {sp:>7} {pbw:>7} {pfl:>6}{flag}")
    skipped = data.get("skipped", {})
    if skipped:
        print("skipped: " + "; ".join(f"{k}: {v}" for k, v in skipped.items()))
    fails = [c for c in data.get("checks", []) if not c["ok"] and c["fatal"]]
    errs = [r for r in res if r.get("error")]
    if errs:
        print(f"errors: {len(errs)} measurement(s) failed, e.g. {errs[0]['method']} B={errs[0]['B']}: "
              f"{errs[0]['error'][:200]}")
    if fails:
        print(f"!!! CORRECTNESS CHECKS FAILED ({len(fails)}): the fsdist numbers above are not valid !!!")
        for c in fails[:6]:
            print(f"  D={c['D']} V={c['V']} B={c['B']} {c['check']}: {c['detail']}")
    else:
        print(f"correctness checks: {len(data.get('checks', []))} run, 0 failed")
    if data.get("json_path"):
        print(f"results: {data['json_path']}")


# fsdist method of each filter group
FILTERED_FSDIST = {m.filter: m.name for m in METHODS.values() if m.kind == "fsdist" and m.filter}
# fsdist method of each processor group
PROCESSOR_FSDIST = {m.processors: m.name for m in METHODS.values() if m.kind == "fsdist" and m.processors}


# --------------------------------------------------------------------------- main
def _quiet_sync(device):
    """Synchronise after a failure; a second error here must not end the run."""
    try:
        C.sync(device)
    except Exception as e:  # noqa: BLE001
        C.log(f"  (synchronize after the failure raised {type(e).__name__}: {str(e)[:120]})")


def _recording(fn: Callable, sink: List[torch.Tensor], bump: Callable, pick: Callable = lambda out: out.fallback):
    """(call, before_call) for C.time_calls: `call` runs fn and, from the first timed call on
    (the hook is not called during warm-up), appends pick(output) (default: the fallback
    flags) to `sink`."""
    on = [False]

    def call(h):
        out = fn(h)
        if on[0]:
            sink.append(pick(out))
        return out

    def before(i):
        on[0] = True
        bump(i)
    return call, before


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", help=f"DxV list (GPU default {GPU_SHAPES}; CPU default {CPU_SHAPES})")
    p.add_argument("--batches", help=f"batch sizes, e.g. 1,2,4 or 1..256 (GPU default {GPU_BATCHES}; CPU {CPU_BATCHES})")
    p.add_argument("--methods", default="default",
                   help="comma list of " + ",".join(METHODS) + "; 'default', 'all', or a group name: "
                   + ", ".join(f"{k} (= {','.join(v)})" for k, v in METHOD_GROUPS.items()))
    p.add_argument("--graph-methods", default="default",
                   help="methods also timed as CUDA-graph replays; 'default', 'all' or 'none'")
    p.add_argument("--configs", help="fsdist TileConfig sweep: 'sweep', 'sweep-small' or a comma list of "
                   "block_b:block_v:block_k[:num_warps[:num_stages]]; adds fsdist@<config> methods")
    p.add_argument("--quick", action="store_true",
                   help="GPU: D=4096 V=151936, B in 1,16,64,256, fewer repetitions")
    p.add_argument("--dtype", help="bf16 (GPU default) | fp16 | fp32 (CPU default)")
    p.add_argument("--temperature", type=float, default=0.8,
                   help="center of the per-row temperatures; fsdist_scalar's one temperature")
    p.add_argument("--temperature-spread", type=float, default=0.25,
                   help="per-row temperatures evenly spaced over T * [1 - spread, 1 + spread]")
    p.add_argument("--greedy-rows", type=int, default=0, help="rows per batch with temperature 0 (greedy)")
    p.add_argument("--top-k", type=int, default=50, help="top_k of the top-k/top-p methods (every row)")
    p.add_argument("--top-p", type=float, default=0.9, help="top_p of the top-k/top-p methods (every row)")
    p.add_argument("--min-p", type=float, default=0.05, help="min_p of the min-p methods (every row)")
    p.add_argument("--bitmask-density", type=float, default=0.5,
                   help="processors methods: probability that a bitmask bit (an id) is allowed; row 0 allows all")
    p.add_argument("--bias-ids", type=int, help="processors methods: logit_bias ids per row (GPU 500, CPU 20)")
    p.add_argument("--output-ids", type=int, help="processors methods: penalties.output_ids per row (GPU 250, CPU 10)")
    p.add_argument("--prompt-ids", type=int, help="processors methods: penalties.prompt_ids per row (GPU 250, CPU 10)")
    p.add_argument("--warmup", type=int, help="warm-up calls per measurement (GPU 25, CPU 1)")
    p.add_argument("--reps", type=int, help="timed calls per run (GPU 100, CPU 3)")
    p.add_argument("--repeats", type=int, help="interleaved runs per cell (GPU 3, CPU 1)")
    p.add_argument("--rotate", type=int, default=4, help="hidden-state buffers rotated over")
    p.add_argument("--graph-calls", type=int, default=4, help="calls captured per CUDA graph")
    p.add_argument("--graph-rounds", type=int, default=0, metavar="R",
                   help="graph replays: capture every graph method of a cell first, then time them in turns, R "
                        "rounds (the order reversed each round), and keep each method's ratio to cuBLAS round by "
                        "round ('paired' in its row); for differences smaller than the machine's drift between "
                        "blocks (v126). Default 0: one block a method, as before")
    p.add_argument("--no-flush", action="store_true", help="do not flush L2 before each timed call")
    p.add_argument("--compile-mode", choices=["dynamic", "static"], default="dynamic",
                   help="dynamic: batch dim marked dynamic (2 compiles per shape: B=1 and B>=2); "
                        "static: one compile per (shape, B)")
    p.add_argument("--force-compile", action="store_true", help="run the compiled methods on CPU too")
    p.add_argument("--max-minutes", type=float, help="stop starting new cells after this (GPU 8, CPU 30)")
    p.add_argument("--seed", type=int, default=0, help="input data seed")
    p.add_argument("--out", help="JSON path or directory (default bench/results/)")
    p.add_argument("--no-json", action="store_true")
    p.add_argument("--save-samples", action="store_true", help="store every timed call in the JSON")
    return p.parse_args(argv)


def resolve_methods(spec: str, on_gpu: bool, allow_compile: bool, skipped: Dict[str, str]) -> List[str]:
    if spec in ("default", "all"):
        names = [m.name for m in METHODS.values() if spec == "all" or m.default]
    else:
        names = []
        for s in spec.split(","):
            for n in METHOD_GROUPS.get(s.strip(), [s.strip()] if s.strip() else []):
                if n not in names:
                    names.append(n)
        bad = [n for n in names if n not in METHODS]
        if bad:
            raise SystemExit(f"unknown method(s) {bad}; known: {list(METHODS)}")
    keep = []
    fi = None
    for n in names:
        m = METHODS[n]
        if m.compiled and not allow_compile:
            skipped[n] = "torch.compile skipped without a GPU (use --force-compile)"
            continue
        if n == "xgr_bitmask":
            xgr = _xgrammar()
            if isinstance(xgr, Exception):
                skipped[n] = f"xgrammar not importable ({type(xgr).__name__}: {str(xgr)[:80]})"
                continue
        if m.flashinfer:
            if not on_gpu:
                skipped[n] = "flashinfer needs a GPU"
                continue
            fi = _flashinfer() if fi is None else fi
            if isinstance(fi, Exception):
                skipped[n] = f"flashinfer not importable ({type(fi).__name__}: {str(fi)[:80]})"
                continue
        keep.append(n)
    return keep


def main(argv=None) -> int:
    args = parse_args(argv)
    device = C.bench_device()
    on_gpu = device.type == "cuda"
    if args.temperature <= 0:
        raise SystemExit("--temperature must be > 0 (greedy decoding is not what is benchmarked)")
    if not 0 <= args.temperature_spread < 1:
        raise SystemExit("--temperature-spread must be in [0, 1): every sampled row keeps T > 0")
    if args.top_k < 0 or not 0 < args.top_p <= 1 or not 0 <= args.min_p <= 1:
        raise SystemExit("--top-k must be >= 0, --top-p in (0, 1], --min-p in [0, 1]")
    filters = {"top_k": args.top_k, "top_p": args.top_p, "min_p": args.min_p}
    if not 0 <= args.bitmask_density <= 1:
        raise SystemExit("--bitmask-density must be in [0, 1]")
    if args.graph_rounds < 0:
        raise SystemExit(f"--graph-rounds must be >= 0, got {args.graph_rounds}")
    if args.quick and on_gpu:
        args.shapes = args.shapes or "4096x151936"
        args.batches = args.batches or "1,16,64,256"
        args.reps = args.reps or 40
        args.repeats = args.repeats or 1
        args.warmup = args.warmup or 10
    shapes = C.parse_shapes(args.shapes or (GPU_SHAPES if on_gpu else CPU_SHAPES))
    batches = C.parse_int_list(args.batches or (GPU_BATCHES if on_gpu else CPU_BATCHES))
    # bf16 under Triton's interpreter is not trusted (numpy has no bf16): fp32 on CPU.
    dtype = C.parse_dtype(args.dtype or ("bf16" if on_gpu else "fp32"))
    warmup = args.warmup if args.warmup is not None else (25 if on_gpu else 1)
    reps = args.reps or (100 if on_gpu else 3)
    repeats = args.repeats or (3 if on_gpu else 1)
    budget = C.Budget(60 * (args.max_minutes or (8.0 if on_gpu else 30.0)))
    skipped: Dict[str, str] = {}
    methods = resolve_methods(args.methods, on_gpu, on_gpu or args.force_compile, skipped)
    proc_groups = [g for g in PROCESSOR_GROUPS if any(METHODS[m].processors == g for m in methods)]
    proc_cfg = {"density": args.bitmask_density,
                "n_bias": args.bias_ids if args.bias_ids is not None else (500 if on_gpu else 20),
                "n_output": args.output_ids if args.output_ids is not None else (250 if on_gpu else 10),
                "n_prompt": args.prompt_ids if args.prompt_ids is not None else (250 if on_gpu else 10)}
    proc_cfg["what"] = (f"bitmask density {proc_cfg['density']:g} (row 0 all ones); {proc_cfg['n_bias']} bias + "
                        f"{proc_cfg['n_output']} output + {proc_cfg['n_prompt']} prompt ids per row; "
                        f"repetition 1.1-1.3, frequency 0.1-0.4, presence 0.1-0.3")
    if args.graph_methods == "none" or not on_gpu:
        graph_methods = []
        if not on_gpu:
            skipped["graphs"] = "CUDA graphs need a GPU"
    elif args.graph_methods in ("default", "all"):
        graph_methods = [m for m in methods if args.graph_methods == "all" or METHODS[m].graph_default]
    else:
        graph_methods = [m for m in args.graph_methods.split(",") if m in methods]
    if on_gpu:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch._dynamo.config.cache_size_limit = 64  # alias of recompile_limit in newer torch
        if hasattr(torch._dynamo.config, "recompile_limit"):
            torch._dynamo.config.recompile_limit = 64
        if hasattr(torch._dynamo.config, "accumulated_cache_size_limit"):
            torch._dynamo.config.accumulated_cache_size_limit = 512

    writer = C.ResultWriter("kernel_bench", device, args.out, enabled=not args.no_json)
    data = writer.data
    data.update(kind="kernel", env=C.env_info(), skipped=skipped, results=[], checks=[], summary=[],
                args={"shapes": [list(s) for s in shapes], "batches": batches, "methods": methods,
                      "graph_methods": graph_methods, "configs": args.configs, "dtype": C.dtype_name(dtype),
                      "temperature": args.temperature, "temperature_spread": args.temperature_spread,
                      "greedy_rows": args.greedy_rows, "fsdist_row_params": True, "filters": filters,
                      "method_filters": {n: METHODS[n].filter for n in methods if METHODS[n].filter},
                      "processors": proc_cfg if proc_groups else None,
                      "method_processors": {n: METHODS[n].processors for n in methods if METHODS[n].processors},
                      "row_temperatures": C.describe_row_temperatures(args.temperature, args.temperature_spread,
                                                                      args.greedy_rows),
                      "warmup": warmup, "reps": reps, "repeats": repeats,
                      "rotate": args.rotate, "graph_calls": args.graph_calls, "graph_rounds": args.graph_rounds,
                      "flush_l2": not args.no_flush,
                      "compile_mode": args.compile_mode, "device": str(device)},
                json_path=str(writer.path) if writer.enabled else None,
                method_notes={n: METHODS[n].note for n in methods if METHODS[n].note})
    C.log(f"kernel_bench on {(data['env']['gpu'] or {}).get('name', 'cpu')}: shapes {shapes} batches {batches} "
          f"dtype {C.dtype_name(dtype)} methods {methods} graphs {graph_methods}")
    if skipped:
        C.log("skipped:", skipped)

    C.log("measuring ceilings (copy bandwidth, matmul rate) ...")
    data["ceilings"] = C.measure_ceilings(device, dtype)
    C.log(f"copy {C.fmt_rate(data['ceilings']['copy']['bytes_per_s'])} (read+write), read "
          f"{C.fmt_rate(data['ceilings']['read']['bytes_per_s'])}, matmul "
          f"{C.fmt_rate(data['ceilings']['matmul']['flop_per_s'], 'FLOP/s')}")
    writer.flush()

    checks = Checks(writer)
    data["checks"] = checks.rows
    flush = C.L2Flusher(device) if not args.no_flush else None
    gen = torch.Generator(device=device).manual_seed(args.seed)
    fi_mod = _flashinfer() if any(METHODS[m].flashinfer for m in methods) else None

    def record(row):
        data["results"].append(row)
        data["summary"] = summarize_results(data)
        writer.flush()

    stopped = False
    for D, V in shapes:
        if stopped:
            break
        torch._dynamo.reset()
        ctx = ShapeCtx(D=D, V=V, dtype=dtype, device=device, T=args.temperature, greedy_rows=args.greedy_rows,
                       compile_mode=args.compile_mode, fi=fi_mod, filters=filters, proc_cfg=proc_cfg)
        C.log(f"shape D={D} V={V}: weight {V * D * torch.finfo(dtype).bits // 8 / 1e9:.2f} GB")
        # Logits with a spread of about 2 (not zeros, not a flat distribution).
        ctx.weight = torch.randn(V, D, device=device, generator=gen, dtype=dtype).mul_(2.0 / math.sqrt(D))
        built: Dict[str, Callable] = {}
        for B in batches:
            if budget.exceeded():
                C.log(f"time budget spent: stopping before D={D} V={V} B={B}")
                skipped["budget"] = f"stopped before D={D} V={V} B={B}"
                stopped = True
                break
            ctx.B = B
            hs = [torch.randn(B, D, device=device, generator=gen, dtype=torch.float32).to(dtype)
                  for _ in range(max(1, args.rotate))]
            ctx.seed_t = torch.arange(B, device=device, dtype=torch.int64) + 1000 * args.seed + 12345
            ctx.off_t = torch.zeros(B, device=device, dtype=torch.int64)
            ctx.temp_t = C.row_temperatures(B, args.temperature, args.temperature_spread, args.greedy_rows, device)
            ctx.set_filters(B)
            if B >= 2 and args.compile_mode == "dynamic":
                for x in hs + [ctx.temp_t, ctx.top_k_t, ctx.top_p_t, ctx.min_p_t]:
                    torch._dynamo.mark_dynamic(x, 0)
            if proc_groups:
                ctx.set_processors(B, gen)
            try:
                check_cell(ctx, hs, checks)
            except Exception as e:  # noqa: BLE001
                checks.add(D, V, B, "fsdist check raised", False, f"{type(e).__name__}: {e}")
                traceback.print_exc()
            if proc_groups:
                try:
                    check_processors_cell(ctx, hs, proc_groups, checks)
                except Exception as e:  # noqa: BLE001
                    checks.add(D, V, B, "processors check raised", False, f"{type(e).__name__}: {e}")
                    traceback.print_exc()
            writer.flush()

            cell_methods = list(methods)
            cfgs = configs_for(args.configs, B, D, device)
            cfg_of = {}
            for c in cfgs:
                name = f"fsdist@{c.name}"
                cfg_of[name] = c
                cell_methods.append(name)

            fns: Dict[str, Callable] = {}
            compile_s: Dict[str, float] = {}
            errors: Dict[str, str] = {}
            for name in cell_methods:
                m = METHODS.get(name) or Method(name, name, "fsdist", _build_fsdist(config=cfg_of[name]), _fs_tokens)
                try:
                    if name not in built:
                        built[name] = m.build(ctx)
                    fn = built[name]
                    t0 = time.perf_counter()
                    out = fn(hs[0])
                    C.sync(device)
                    compile_s[name] = time.perf_counter() - t0
                    check_tokens(ctx, m, out, checks, hs[0])
                    if name in cfg_of:  # a tuned config must give the default config's tokens
                        ref = fsdist.sample(hs[0], ctx.weight, **ctx.fs_params())
                        checks.add(D, V, B, f"{name} tokens == default config's", torch.equal(out.tokens, ref.tokens),
                                   f"{int((out.tokens != ref.tokens).sum())} rows differ")
                    fns[name] = fn
                except Exception as e:  # noqa: BLE001
                    errors[name] = f"{type(e).__name__}: {str(e)[:300]}"
                    C.log(f"  {name} B={B}: setup failed: {errors[name]}")
                    _quiet_sync(device)

            samples: Dict[str, List[List[float]]] = {n: [] for n in fns}
            bump = (lambda i: ctx.off_t.add_(1))
            # Filtered fsdist methods: each timed call's fallback flags (device tensors, kept by
            # reference: nothing is added to the timed region but a list append).
            fallback_flags: Dict[str, List[torch.Tensor]] = {n: [] for n in fns
                                                             if n in METHODS and METHODS[n].filter
                                                             and METHODS[n].kind == "fsdist"}
            # Methods with a bitmask: each timed call's tokens (kept by reference, checked after
            # the timing: no call may ever draw a disallowed id).
            drawn: Dict[str, List[torch.Tensor]] = {n: [] for n in fns if n in METHODS and METHODS[n].processors
                                                     and "token_bitmask" in PROCESSOR_GROUPS[METHODS[n].processors]}
            for rep in range(repeats):
                for name, fn in fns.items():
                    if name in errors:
                        continue
                    if budget.exceeded() and rep > 0:
                        break
                    try:
                        w = warmup if rep == 0 else min(5, warmup)  # later runs only re-warm the clocks
                        if name in fallback_flags:
                            call, before = _recording(fn, fallback_flags[name], bump)
                        elif name in drawn:
                            call, before = _recording(fn, drawn[name], bump, METHODS[name].tokens)
                        else:
                            call, before = (lambda h, _fn=fn: _fn(h)), bump
                        samples[name].append(C.time_calls(call, [(h,) for h in hs], warmup=w,
                                                           reps=reps, flush=flush, before_call=before, device=device))
                    except Exception as e:  # noqa: BLE001
                        errors[name] = f"{type(e).__name__}: {str(e)[:300]}"
                        C.log(f"  {name} B={B}: timing failed: {errors[name]}")
            for name, toks in drawn.items():
                if toks:
                    ok = bitmask_allows(ctx.bitmask_t, torch.stack([t.reshape(-1) for t in toks]))
                    checks.add(D, V, B, f"{name}: timed calls never drew a disallowed id", bool(ok.all()),
                               f"{int((~ok).sum())} of {ok.numel()} draws ({len(toks)} calls) disallowed")
            for name in cell_methods:
                runs = samples.get(name) or []
                flat = [x for run in runs for x in run]
                s = C.summarize(flat)
                run_meds = [statistics.median(run) for run in runs if run]
                row = {"D": D, "V": V, "B": B, "method": name, "mode": "events", "dtype": C.dtype_name(dtype),
                       "median_us": s.get("median_us"), "min_us": s.get("min_us"), "p10_us": s.get("p10_us"),
                       "p90_us": s.get("p90_us"), "n": s.get("n", 0), "run_medians_us": run_meds,
                       "spread": ((max(run_meds) - min(run_meds)) / statistics.median(run_meds)) if len(run_meds) > 1
                       else None,
                       "first_call_s": compile_s.get(name), "error": errors.get(name),
                       "config": asdict(cfg_of[name]) if name in cfg_of else
                       (asdict(default_config(B, D, device, extended=bool(name in METHODS and METHODS[name].filter),
                                              sparse_processors=bool(name in METHODS and METHODS[name].processors
                                                                     in ("bias_pen", "all"))))
                        if name.startswith("fsdist") else None)}
                if name in METHODS and METHODS[name].flashinfer:
                    row["note"] = ctx.fi_notes.get(name)
                if name in METHODS and METHODS[name].filter:
                    row["filter"] = {k: filters[k] for k in FILTER_GROUPS[METHODS[name].filter]}
                if name in METHODS and METHODS[name].processors:
                    row["processors"] = METHODS[name].processors
                if fallback_flags.get(name):
                    flags = torch.cat(fallback_flags[name])
                    row.update(fallback_rate=float(flags.float().mean()), fallback_rows=int(flags.sum()),
                               fallback_row_calls=int(flags.numel()))
                if args.save_samples:
                    row["samples_us"] = runs
                record(row)
                if row["median_us"] is not None:
                    spread = f" spread {100 * row['spread']:.1f}%" if row["spread"] is not None else ""
                    fb = f" fallback {100 * row['fallback_rate']:.1f}%" if "fallback_rate" in row else ""
                    C.log(f"  D={D} V={V} B={B:<4} {name:<24} {C.fmt_us(row['median_us']):>9} us"
                          f" (first call {compile_s.get(name, 0):.2f}s){spread}{fb}")

            if args.graph_rounds:
                for row in interleaved_graph_rows(ctx, fns, [n for n in graph_methods if n in fns and n not in errors],
                                                  hs, checks, args, reps, flush, bump, budget):
                    record(row)
            for name in ([] if args.graph_rounds else graph_methods):  # (one block a method)
                if name not in fns or name in errors or budget.exceeded():
                    continue
                m = METHODS[name]
                row = {"D": D, "V": V, "B": B, "method": name, "mode": "graph", "dtype": C.dtype_name(dtype),
                       "median_us": None, "error": None, "graph_calls": args.graph_calls}
                try:
                    g = C.CapturedGraph(fns[name], [(h,) for h in hs], calls=args.graph_calls)
                    if m.kind == "fsdist":
                        check_graph(ctx, g, m, hs, checks)
                    ts = C.time_graph(g, warmup=3, reps=max(10, reps // args.graph_calls), flush=flush,
                                      before_replay=bump)
                    s = C.summarize(ts)
                    row.update(median_us=s["median_us"], min_us=s["min_us"], p10_us=s["p10_us"],
                               p90_us=s["p90_us"], n=s["n"])
                    del g
                    C.log(f"  D={D} V={V} B={B:<4} {name + ' [graph]':<22} {C.fmt_us(row['median_us']):>9} us")
                except Exception as e:  # noqa: BLE001
                    row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                    C.log(f"  {name} B={B}: graph failed: {row['error']}")
                    _quiet_sync(device)
                record(row)
            del hs
        del built
        ctx.weight = None
        ctx.compiled.clear()
        if on_gpu:
            torch.cuda.empty_cache()

    data["summary"] = summarize_results(data)
    data["wall_s"] = budget.elapsed()
    writer.flush()
    C.log(f"done in {budget.elapsed():.0f}s")
    print_tables(data)
    fs_errors = [r for r in data["results"] if r.get("error") and r["method"].startswith("fsdist")]
    return 1 if (checks.failed() or fs_errors) else 0


if __name__ == "__main__":
    sys.exit(main())
