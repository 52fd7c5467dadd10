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
from fsdist.ops.configs import pick_config  # noqa: E402
from fsdist.params import GREEDY_TEMPERATURE  # noqa: E402
from fsdist.reference import baselines  # noqa: E402

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
    # per batch size, set by the cell loop
    B: int = 0
    seed_t: torch.Tensor = None
    off_t: torch.Tensor = None
    temp_t: torch.Tensor = None  # [B] per-row temperatures (common.row_temperatures)

    @property
    def has_greedy(self) -> bool:
        """Whether the batch has greedy rows: the baselines are told, as a serving stack knows."""
        return self.greedy_rows > 0

    def fs_params(self, scalar: bool = False) -> Dict:
        """fsdist.sample's per-row parameters: [B] device tensors, or one float temperature."""
        return {"temperature": self.T if scalar else self.temp_t, "seed": self.seed_t, "offset": self.off_t}


def _fs_tokens(out):
    return out.tokens


def _plain(out):
    return out


SCALAR_METHODS = {"fsdist_scalar"}  # fsdist methods called with one float temperature


def _build_fsdist(logprobs: bool = False, scalar: bool = False, config: Optional[TileConfig] = None):
    def build(ctx: ShapeCtx):
        W = ctx.weight

        def fn(h):
            return fsdist.sample(h, W, **ctx.fs_params(scalar), return_logprobs=logprobs, config=config)
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


def _flashinfer():
    try:
        return importlib.import_module("flashinfer.sampling")
    except Exception as e:  # ImportError, or a CUDA/JIT error inside flashinfer's import
        return e


def _build_fi(which: str):
    def build(ctx: ShapeCtx):
        fi, W = ctx.fi, ctx.weight
        # Logits / T per row first (baselines.sample_from_logits, greedy rows -> argmax), as a
        # serving stack applies temperature before FlashInfer; in the logits' dtype, else fp32.
        dtypes = [("native", None), ("fp32", torch.float32)]
        if which == "fi_sampling":
            variants = [(f"logits/T {tag}", dt, lambda s: fi.sampling_from_logits(s)) for tag, dt in dtypes]
        else:  # top-k / top-p switched off, as in the paper (top_k=-1, else V; top_p=1.0)
            variants = [(f"logits/T {tag}, top_k={k}, top_p=1.0", dt,
                         lambda s, _k=k: fi.top_k_top_p_sampling_from_logits(s, _k, 1.0))
                        for k in (-1, ctx.V) for tag, dt in dtypes]

        def sampler(dt, draw):
            return lambda lg, t: baselines.sample_from_logits(lg, t, draw, has_greedy=ctx.has_greedy, dtype=dt)

        # Probe once: logits dtype straight from cuBLAS, else fp32; top_k=-1, else V.
        probe = F.linear(torch.randn(2, ctx.D, device=ctx.device, dtype=ctx.dtype), W)
        probe_t = torch.full((2,), ctx.T, device=ctx.device)
        last = None
        for note, dt, draw in variants:
            call = sampler(dt, draw)
            try:
                t = call(probe, probe_t)
                C.sync(ctx.device)
                if t.numel() != 2:
                    raise RuntimeError(f"unexpected output shape {tuple(t.shape)}")
                ctx.fi_notes[which] = note
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
]}


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
    default = pick_config(B, D, device.type)
    if spec in ("sweep", "sweep-small"):
        vkws = SWEEP_VKWS if spec == "sweep" else SWEEP_VKWS[2:6]
        bbs = [default.block_b] + ([default.block_b * 2] if B >= 64 and spec == "sweep" else [])
        out = [TileConfig(bb, bv, bk, nw, ns) for bb in bbs for (bv, bk, nw, ns) in vkws
               # pipelined bf16 tiles of hidden and weight must fit in shared memory (228 KB on Hopper)
               if device.type != "cuda" or ns * (bb + bv) * bk * 2 <= 200 * 1024]
    else:
        out = parse_configs(spec)
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


def check_tokens(ctx: ShapeCtx, m: Method, out, checks: Checks):
    if m.tokens is None:
        ok = tuple(out.shape) == (ctx.B, ctx.V)
        checks.add(ctx.D, ctx.V, ctx.B, f"{m.name} output shape", ok, f"{tuple(out.shape)}")
        return
    t = m.tokens(out).reshape(-1)
    ok = t.numel() == ctx.B and bool(((t >= 0) & (t < ctx.V)).all())
    checks.add(ctx.D, ctx.V, ctx.B, f"{m.name} tokens in [0, V)", ok,
               f"n={t.numel()} min={int(t.min()) if t.numel() else None} max={int(t.max()) if t.numel() else None}")


def check_graph(ctx: ShapeCtx, graph: C.CapturedGraph, m: Method, hs, checks: Checks):
    """The replayed graph gives eager fsdist's tokens and picks up the offset tensor's updates."""
    scalar = m.name in SCALAR_METHODS
    ctx.off_t.fill_(7)
    graph.replay()
    C.sync(ctx.device)
    got = m.tokens(graph.outputs[0]).clone()
    want = m.tokens(fsdist.sample(hs[0], ctx.weight, **ctx.fs_params(scalar),
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
        bases = {m: r for m, r in ev.items() if METHODS.get(m) is not None and METHODS[m].kind == "baseline"}
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

    def table(mode: str, title: str):
        ms = [m for m in methods if any(r["method"] == m and r["mode"] == mode and r.get("median_us")
                                        for r in res)]
        if not ms:
            return
        print(f"\n{title}")
        for D, V in shapes:
            print(f"D={D} V={V}: median us per call")
            print("     B " + "".join(f"{label[m]:>10}" for m in ms))
            for B in sorted({r["B"] for r in res if (r["D"], r["V"]) == (D, V)}):
                cells = []
                for m in ms:
                    r = next((r for r in res if (r["D"], r["V"], r["B"], r["method"], r["mode"])
                              == (D, V, B, m, mode)), None)
                    cells.append(C.fmt_us(r.get("median_us")) if r and r.get("median_us") else
                                 ("err" if r and r.get("error") else "-"))
                print(f"{B:>6} " + "".join(f"{c:>10}" for c in cells))

    table("events", "== all methods, per call (median; CUDA events, host clock on CPU) ==")
    table("graph", "== CUDA-graph replay, per call (median) ==")

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


# --------------------------------------------------------------------------- main
def _quiet_sync(device):
    """Synchronise after a failure; a second error here must not end the run."""
    try:
        C.sync(device)
    except Exception as e:  # noqa: BLE001
        C.log(f"  (synchronize after the failure raised {type(e).__name__}: {str(e)[:120]})")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", help=f"DxV list (GPU default {GPU_SHAPES}; CPU default {CPU_SHAPES})")
    p.add_argument("--batches", help=f"batch sizes, e.g. 1,2,4 or 1..256 (GPU default {GPU_BATCHES}; CPU {CPU_BATCHES})")
    p.add_argument("--methods", default="default",
                   help="comma list of " + ",".join(METHODS) + "; 'default' or 'all'")
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
    p.add_argument("--warmup", type=int, help="warm-up calls per measurement (GPU 25, CPU 1)")
    p.add_argument("--reps", type=int, help="timed calls per run (GPU 100, CPU 3)")
    p.add_argument("--repeats", type=int, help="interleaved runs per cell (GPU 3, CPU 1)")
    p.add_argument("--rotate", type=int, default=4, help="hidden-state buffers rotated over")
    p.add_argument("--graph-calls", type=int, default=4, help="calls captured per CUDA graph")
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
        names = [s.strip() for s in spec.split(",") if s.strip()]
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
                      "greedy_rows": args.greedy_rows, "fsdist_row_params": True,
                      "row_temperatures": C.describe_row_temperatures(args.temperature, args.temperature_spread,
                                                                      args.greedy_rows),
                      "warmup": warmup, "reps": reps, "repeats": repeats,
                      "rotate": args.rotate, "graph_calls": args.graph_calls, "flush_l2": not args.no_flush,
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
                       compile_mode=args.compile_mode, fi=fi_mod)
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
            if B >= 2 and args.compile_mode == "dynamic":
                for x in hs + [ctx.temp_t]:
                    torch._dynamo.mark_dynamic(x, 0)
            try:
                check_cell(ctx, hs, checks)
            except Exception as e:  # noqa: BLE001
                checks.add(D, V, B, "fsdist check raised", False, f"{type(e).__name__}: {e}")
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
                    check_tokens(ctx, m, out, checks)
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
            for rep in range(repeats):
                for name, fn in fns.items():
                    if name in errors:
                        continue
                    if budget.exceeded() and rep > 0:
                        break
                    try:
                        w = warmup if rep == 0 else min(5, warmup)  # later runs only re-warm the clocks
                        samples[name].append(C.time_calls(lambda h: fn(h), [(h,) for h in hs], warmup=w,
                                                           reps=reps, flush=flush, before_call=bump, device=device))
                    except Exception as e:  # noqa: BLE001
                        errors[name] = f"{type(e).__name__}: {str(e)[:300]}"
                        C.log(f"  {name} B={B}: timing failed: {errors[name]}")
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
                       (asdict(pick_config(B, D, device.type)) if name.startswith("fsdist") else None)}
                if name in ("fi_sampling", "fi_topk_topp"):
                    row["note"] = ctx.fi_notes.get(name)
                if args.save_samples:
                    row["samples_us"] = runs
                record(row)
                if row["median_us"] is not None:
                    spread = f" spread {100 * row['spread']:.1f}%" if row["spread"] is not None else ""
                    C.log(f"  D={D} V={V} B={B:<4} {name:<22} {C.fmt_us(row['median_us']):>9} us"
                          f" (first call {compile_s.get(name, 0):.2f}s){spread}")

            for name in graph_methods:
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
