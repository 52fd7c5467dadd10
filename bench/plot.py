#!/usr/bin/env python
"""Plots and markdown tables from benchmark JSONs (kernel_bench.py, tp_sweep.py, fallback_rate.py).

    python bench/plot.py bench/results/kernel_bench_h100_<date>.json [more.json ...]

writes PNGs into docs/plots/ and regenerates the generated sections of
docs/benchmarks.md (between the ``<!-- BEGIN GENERATED: kernel -->`` /
``<!-- END GENERATED: kernel -->``, ``... tp ...`` and ``... fallback ...`` markers; the
rest of the file is left alone; a missing section is appended). Several kernel JSONs (e.g.
H100 and H200) each get a section; several tp_sweep JSONs (one per TP degree) are merged
into one table per GPU and shape. Kernel JSONs with filtered methods (fsdist_topk_topp,
fsdist_minp and their baselines) get a filtered-sampling table per shape (with the
fraction of rows that fell back) and a ``_filtered`` plot; older JSONs have none and
render as before. fallback_rate.py JSONs get a table per JSON and a heat map.

    python bench/plot.py --filter-ab BEFORE.json AFTER.json BEFORE2.json [three more ...]

reads filter_probe.py JSONs of an A/B/A (graph replays: plain, top-k 50 + top-p 0.9, min-p 0.05), three per GPU, and
writes one plot per triple (``filter_ab_<gpu>_<date>.png``: filtered / plain against B, before and after, with issue
11's 1.10x line) and prints its markdown table; docs/benchmarks.md is left alone.

    python bench/plot.py --filter-settings OFF,ON filter_probe.json [more.json ...]

reads filter_probe.py JSONs whose graph replays ran each case under several ``--pdl`` settings in one process (e.g.
v118's ``fields64,beside,fields64,beside``), and writes one plot per JSON (``filter_settings_<gpu>_d<D>_<date>T<hhmm>.png``:
filtered / plain against B under setting OFF and under ON, each the mean over that setting's repeats, every ratio over
the plain call of the same setting and repeat) and prints its markdown table.

Options: --plots-dir DIR, --md FILE, --no-md (print the markdown instead), --no-plots.
Only matplotlib (Agg backend) and the standard library are needed; no GPU.
"""
import argparse
import json
import math
import os
import re
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

LABELS = {
    "cublas": "cuBLAS matmul only (floor)",
    "fsdist": "fsdist",
    "fsdist_logprobs": "fsdist + logprobs",
    "fsdist_scalar": "fsdist, one float temperature",
    "fsdist_tvec": "fsdist, [B] temperature",  # runs of 2026-11-21 only (equal temperatures)
    "multinomial_eager": "matmul+softmax+multinomial (eager)",
    "multinomial_compiled": "matmul+softmax+multinomial (compiled)",
    "gumbel_eager": "matmul+Gumbel argmax (eager)",
    "gumbel_compiled": "matmul+Gumbel argmax (compiled)",
    "fi_topk_topp": "FlashInfer top_k_top_p_sampling_from_logits (FI1)",
    "fi_sampling": "FlashInfer sampling_from_logits (FI2)",
    "fsdist_topk_topp": "fsdist, top-k + top-p ([B] tensors)",
    "fsdist_minp": "fsdist, min-p ([B] tensor)",
    "torch_topk_topp_compiled": "matmul+sort-based top-k/top-p+race (compiled)",
    "torch_topk_topp_eager": "matmul+sort-based top-k/top-p+race (eager)",
    "torch_topk_topp_compiled_es": "matmul+sort-based top-k/top-p+race (compiled, top-p scan eager)",
    "torch_minp_compiled": "matmul+min-p+race (compiled)",
    "torch_minp_eager": "matmul+min-p+race (eager)",
    "fi_topk_topp_filtered": "FlashInfer top_k_top_p_sampling_from_logits, filters on",
    "fi_minp": "softmax+FlashInfer min_p_sampling_from_probs",
    "fsdist_bitmask": "fsdist, token bitmask",
    "fsdist_bias_pen": "fsdist, logit bias + penalties",
    "fsdist_processors_all": "fsdist, bitmask + bias + penalties",
    "torch_bitmask_compiled": "matmul+fp32+bitmask+Gumbel (compiled)",
    "xgr_bitmask": "matmul+fp32+xgrammar bitmask+Gumbel",
    "torch_bias_pen_compiled": "matmul+fp32+bias+penalties+Gumbel (compiled)",
    "torch_processors_compiled": "matmul+fp32+bitmask+bias+penalties+Gumbel (compiled)",
    "torch_bitmask_eager": "matmul+fp32+bitmask+Gumbel (eager)",
    "torch_bias_pen_eager": "matmul+fp32+bias+penalties+Gumbel (eager)",
    "torch_processors_eager": "matmul+fp32+bitmask+bias+penalties+Gumbel (eager)",
}
SHORT = {"cublas": "cuBLAS", "fsdist": "fsdist", "fsdist_logprobs": "fsdist+lp", "fsdist_scalar": "fsdist scalar T",
         "fsdist_tvec": "fsdist tvec",
         "multinomial_eager": "mn eager", "multinomial_compiled": "mn compiled", "gumbel_eager": "gumbel eager",
         "gumbel_compiled": "gumbel compiled", "fi_topk_topp": "FI1", "fi_sampling": "FI2",
         "fsdist_topk_topp": "fsdist top-k/top-p", "fsdist_minp": "fsdist min-p",
         "torch_topk_topp_compiled": "torch top-k/top-p compiled", "torch_topk_topp_eager": "torch top-k/top-p eager",
         "torch_topk_topp_compiled_es": "torch top-k/top-p compiled (eager scan)",
         "torch_minp_compiled": "torch min-p compiled", "torch_minp_eager": "torch min-p eager",
         "fi_topk_topp_filtered": "FI top-k/top-p", "fi_minp": "FI min-p",
         "fsdist_bitmask": "fsdist bitmask", "fsdist_bias_pen": "fsdist bias+pen",
         "fsdist_processors_all": "fsdist all processors", "torch_bitmask_compiled": "torch bitmask compiled",
         "xgr_bitmask": "xgrammar bitmask", "torch_bias_pen_compiled": "torch bias+pen compiled",
         "torch_processors_compiled": "torch all compiled", "torch_bitmask_eager": "torch bitmask eager",
         "torch_bias_pen_eager": "torch bias+pen eager", "torch_processors_eager": "torch all eager"}
BASELINES = ["multinomial_eager", "multinomial_compiled", "gumbel_eager", "gumbel_compiled", "fi_topk_topp",
             "fi_sampling"]
# Filtered sampling (kernel_bench.py since 2026-11-23): per filter group, fsdist's method, its
# baselines (same [B] filters) and the filter parameters it reads from args["filters"].
FILTERED = {
    "topk_topp": {"fsdist": "fsdist_topk_topp", "params": ("top_k", "top_p"),
                  "baselines": ["torch_topk_topp_compiled", "torch_topk_topp_compiled_es", "torch_topk_topp_eager",
                                "fi_topk_topp_filtered"]},
    "minp": {"fsdist": "fsdist_minp", "params": ("min_p",),
             "baselines": ["torch_minp_compiled", "torch_minp_eager", "fi_minp"]},
}
FILTERED_METHODS = {m for g in FILTERED.values() for m in [g["fsdist"], *g["baselines"]]}
# Logit processors (kernel_bench.py --methods processors): per group, fsdist's method and its
# materialized baselines; summary[i]["processors"][group] holds the ratios.
PROCESSORS = {
    "bitmask": {"title": "token bitmask", "fsdist": "fsdist_bitmask",
                "baselines": ["torch_bitmask_compiled", "xgr_bitmask", "torch_bitmask_eager"]},
    "bias_pen": {"title": "logit bias + penalties", "fsdist": "fsdist_bias_pen",
                 "baselines": ["torch_bias_pen_compiled", "torch_bias_pen_eager"]},
    "all": {"title": "bitmask + bias + penalties", "fsdist": "fsdist_processors_all",
            "baselines": ["torch_processors_compiled", "torch_processors_eager"]},
}
PROCESSOR_METHODS = {m for g in PROCESSORS.values() for m in [g["fsdist"], *g["baselines"]]}

# Published FlashSampling speedups (paper, appendix E, Tables 4 and 5): FlashSampling vs the
# compiled multinomial baseline, FI1 and FI2, per GPU, keyed by D. Medians over 100 iterations.
PAPER_SPEEDUP = {
    "multinomial_compiled": {
        ("h100", 4096): [1.29, 1.28, 1.28, 1.31, 1.35, 1.44, 1.64, 1.67, 1.30],
        ("h200", 4096): [1.35, 1.34, 1.35, 1.38, 1.44, 1.53, 1.67, 1.43, 1.22],
        ("h100", 8192): [1.23, 1.22, 1.22, 1.23, 1.24, 1.27, 1.36, 1.30, 0.88],
        ("h200", 8192): [1.26, 1.23, 1.24, 1.25, 1.27, 1.34, 1.43, 1.01, 0.82],
    },
    "fi_topk_topp": {
        ("h100", 4096): [1.34, 1.32, 1.32, 1.35, 1.37, 1.39, 1.47, 1.36, 1.03],
        ("h200", 4096): [1.39, 1.44, 1.42, 1.48, 1.49, 1.50, 1.49, 1.15, 1.00],
        ("h100", 8192): [1.20, 1.21, 1.20, 1.21, 1.21, 1.23, 1.28, 1.16, 0.80],
        ("h200", 8192): [1.25, 1.21, 1.21, 1.23, 1.25, 1.30, 1.33, 0.88, 0.74],
    },
    "fi_sampling": {
        ("h100", 4096): [1.20, 1.19, 1.19, 1.19, 1.20, 1.22, 1.27, 1.14, 0.81],
        ("h200", 4096): [1.24, 1.22, 1.23, 1.24, 1.25, 1.27, 1.25, 0.94, 0.79],
        ("h100", 8192): [1.14, 1.13, 1.13, 1.13, 1.14, 1.15, 1.19, 1.05, 0.69],
        ("h200", 8192): [1.13, 1.11, 1.12, 1.12, 1.13, 1.18, 1.20, 0.78, 0.65],
    },
}
PAPER_BATCHES = [1, 2, 4, 8, 16, 32, 64, 128, 256]


# Since 2026-11-23 the benchmarks' default fsdist methods (and the baselines) get per-row [B]
# temperatures, the serving case; older JSONs passed one float temperature. The method names
# did not change, so labels and table notes read the mode from the JSON's args.
def row_params_mode(data) -> str:
    return "rows" if (data.get("args") or {}).get("fsdist_row_params") else "scalar"


def labels_for(data) -> dict:
    """LABELS with the default fsdist methods' parameters spelled out for this JSON."""
    tag = "[B] temperature, seed, offset" if row_params_mode(data) == "rows" else "one float temperature"
    return dict(LABELS, fsdist=f"fsdist ({tag})", fsdist_logprobs=f"fsdist + logprobs ({tag})")


def params_note(data) -> str:
    args = data.get("args") or {}
    if row_params_mode(data) == "rows":
        return (f"fsdist and the baselines sample the serving case: per-row temperatures "
                f"{args.get('row_temperatures', '[B] tensor')}; seeds and offsets [B] device tensors.")
    return (f"fsdist methods: one float temperature T={args.get('temperature')} for the batch, seeds and "
            f"offsets [B] device tensors (runs before 2026-11-23).")


def paper_speedup(baseline: str, gpu: str, D: int, B: int):
    row = PAPER_SPEEDUP.get(baseline, {}).get((gpu, D))
    if row is None or B not in PAPER_BATCHES:
        return None
    return row[PAPER_BATCHES.index(B)]


def fmt(x, nd=1):
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    return f"{x:.{nd}f}"


def gpu_of(data) -> str:
    gpu = (data.get("env") or {}).get("gpu") or {}
    name = gpu.get("name") or "cpu"
    m = re.search(r"\b([A-Z]{1,2}\d{2,4}[A-Z]?)\b", name)
    return (m.group(1) if m else name).lower().replace(" ", "-") if name != "cpu" else "cpu"


def env_line(data) -> str:
    env = data.get("env", {})
    gpu = env.get("gpu") or {}
    parts = [gpu.get("name", "CPU (Triton interpreter)"), f"driver {gpu.get('driver')}" if gpu else None,
             f"torch {env.get('torch')}", f"CUDA {env.get('torch_cuda')}" if env.get("torch_cuda") else None,
             f"Triton {env.get('triton')}", f"source {env.get('source_sha256_16')}",
             f"{env.get('date_utc')}"]
    return ", ".join(p for p in parts if p)


# --------------------------------------------------------------------------- kernel
def _kernel_index(data):
    idx = {}
    for r in data.get("results", []):
        idx[(r["D"], r["V"], r["B"], r["method"], r["mode"])] = r
    return idx


def _med(idx, D, V, B, m, mode="events"):
    r = idx.get((D, V, B, m, mode))
    return r.get("median_us") if r else None


def roofline_point(D: int, V: int, B: int, t_us: float, elem: int = 2):
    """(arithmetic intensity in FLOP/byte, achieved FLOP/s) of one call that took t_us.

    FLOPs = 2*B*D*V; bytes = the floor model's minimal bytes V*D*s + B*D*s + 8*B (weight and
    hidden read once, int64 tokens written), the same for every method, so methods are compared
    at the same intensity and extra traffic shows up as lower achieved throughput.
    """
    flops = 2.0 * B * D * V
    nbytes = V * D * elem + B * D * elem + 8 * B
    return flops / nbytes, flops / (t_us * 1e-6)


def pct_roofline(D: int, V: int, B: int, t_us: float, copy_bps: float, flop_ps: float, elem: int = 2):
    """Achieved FLOP/s as % of the roofline min(copy_bw * AI, matmul_rate) at this call's AI.

    Algebraically this is max(bytes / copy_bw, FLOPs / matmul_rate) / time, i.e. exactly the
    tables' "% floor" (same bytes, same measured ceilings), so it is not a separate column.
    """
    ai, achieved = roofline_point(D, V, B, t_us, elem)
    return 100.0 * achieved / min(copy_bps * ai, flop_ps)



ROOFLINE_CAPTION = (
    "Roofline: x = arithmetic intensity 2·B·D·V FLOP / (V·D·2 + B·D·2 + 8·B) bytes (the floor model's "
    "minimal bytes, charged to every method alike), y = achieved TFLOP/s = 2·B·D·V / median time, both log; "
    "the roofs are the run's measured copy bandwidth × intensity and bf16 matmul rate. A method that moves more "
    "bytes (materialized logits) therefore sits lower at the same intensity, not further left; the height below "
    "the roof is the tables' \"% floor\" (achieved / min(roofs) = floor / time, so no separate column).")


def kernel_markdown(data, source: str, plot_files) -> str:
    idx = _kernel_index(data)
    summ = {(s["D"], s["V"], s["B"]): s for s in data.get("summary", [])}
    gpu = gpu_of(data)
    ceil = data.get("ceilings", {})
    args = data.get("args", {})
    out = [f"### {(data.get('env', {}).get('gpu') or {}).get('name', 'CPU')} — `{source}`", "",
           f"{env_line(data)}.  ", f"Command: `{data.get('env', {}).get('command', '?')}`  "]
    if ceil:
        out.append(f"Measured ceilings: copy {ceil['copy']['bytes_per_s'] / 1e12:.2f} TB/s (read+write), "
                   f"read-only {ceil.get('read', {}).get('bytes_per_s', float('nan')) / 1e12:.2f} TB/s, "
                   f"{ceil['matmul']['dtype']} matmul {ceil['matmul']['flop_per_s'] / 1e12:.0f} TFLOP/s.  ")
    out.append(f"dtype {args.get('dtype')}, T={args.get('temperature')}, {args.get('repeats')}×{args.get('reps')} "
               f"timed calls after {args.get('warmup')} warm-up, L2 flushed: {args.get('flush_l2')}, "
               f"torch.compile batch dim: {args.get('compile_mode')}. Times are medians in µs.  ")
    out.append(params_note(data))
    out.append("")
    methods_present = {r["method"] for r in data.get("results", []) if r.get("median_us")}
    base_cols = [m for m in BASELINES if m in methods_present]
    shapes = sorted({(r["D"], r["V"]) for r in data.get("results", [])})
    for D, V in shapes:
        out.append(f"#### D={D}, V={V}")
        out.append("")
        hdr = ["B", "cuBLAS", "fsdist", "fsdist / cuBLAS", "fsdist graph", "fsdist+logprobs"]
        hdr += [SHORT[m] for m in base_cols]
        hdr += ["best baseline", "speedup vs best", "vs mn compiled (paper)", "% copy BW", "% floor"]
        out.append("| " + " | ".join(hdr) + " |")
        out.append("|" + "---|" * len(hdr))
        for B in sorted({r["B"] for r in data.get("results", []) if (r["D"], r["V"]) == (D, V)}):
            s = summ.get((D, V, B), {})
            fs = _med(idx, D, V, B, "fsdist")
            cells = [str(B), fmt(_med(idx, D, V, B, "cublas")), fmt(fs),
                     fmt(s.get("fsdist_over_cublas"), 3), fmt(_med(idx, D, V, B, "fsdist", "graph")),
                     fmt(_med(idx, D, V, B, "fsdist_logprobs"))]
            cells += [fmt(_med(idx, D, V, B, m)) for m in base_cols]
            bb = s.get("best_baseline")
            cells.append(f"{SHORT.get(bb, bb)}" if bb else "–")
            cells.append(f"{s['speedup_vs_best_baseline']:.2f}×" if s.get("speedup_vs_best_baseline") else "–")
            mn = _med(idx, D, V, B, "multinomial_compiled")
            ps = paper_speedup("multinomial_compiled", gpu, D, B)
            ours = f"{mn / fs:.2f}×" if (mn and fs) else "–"
            cells.append(f"{ours} ({ps:.2f}×)" if ps else ours)
            cells.append(f"{s['pct_copy_bw']:.0f}%" if s.get("pct_copy_bw") else "–")
            cells.append(f"{s['pct_floor']:.0f}%" if s.get("pct_floor") else "–")
            if s.get("checks_failed"):
                cells[2] += " **(check failed)**"
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    out += filtered_markdown(data, idx, shapes)
    out += processors_markdown(data, idx, shapes)
    tuned = [s for s in data.get("summary", []) if s.get("best_config")]
    if tuned:
        out += ["#### fsdist tile-config sweep (best per shape and B)", "",
                "| D | V | B | default µs | best µs | best config (block_b × block_v × block_k, warps, stages) |",
                "|---|---|---|---|---|---|"]
        for s in tuned:
            out.append(f"| {s['D']} | {s['V']} | {s['B']} | {fmt(s.get('fsdist_us'))} | {fmt(s['best_config_us'])} "
                       f"| {s['best_config']} |")
        out.append("")
    fails = [c for c in data.get("checks", []) if not c["ok"] and c.get("fatal", True)]
    out.append(f"Correctness checks in this run: {len(data.get('checks', []))}, failed: {len(fails)}.")
    skipped = data.get("skipped") or {}
    if skipped:
        out.append("Skipped: " + "; ".join(f"{k} ({v})" for k, v in skipped.items()) + ".")
    out.append("")
    for p in plot_files:
        out.append(f"![{Path(p).stem}]({p})")
    if any(Path(p).stem.endswith("_roofline") for p in plot_files):
        out += ["", ROOFLINE_CAPTION]
    out.append("")
    return "\n".join(out)


def _filter_text(data, group: str) -> str:
    vals = (data.get("args") or {}).get("filters") or {}
    return ", ".join(f"{k}={vals.get(k, '?')}" for k in FILTERED[group]["params"])


def speedup_ceiling(idx, D, V, B, bases):
    """(best baseline's CUDA-graph replay, the empirical floor, their ratio) at one shape and B, or None.
    The floor is the faster replay of cuBLAS's matmul alone and plain fsdist: every method here streams
    the weight once, so a filtered or processed fsdist call that cost nothing beyond that pass would be
    ratio x faster than the best materialized baseline, and no fused design gets further. A speed-up
    target above the ratio is out of reach at that shape, whatever the kernels do."""
    times = [t for t in (_med(idx, D, V, B, m, "graph") for m in bases) if t]
    floors = [t for t in (_med(idx, D, V, B, m, "graph") for m in ("cublas", "fsdist")) if t]
    if not times or not floors:
        return None
    best, floor = min(times), min(floors)
    return best, floor, best / floor


CEILING_NOTE = ("Ceiling: the best baseline's replay over the faster replay of cuBLAS alone and plain fsdist, the "
                "speed-up a call costing nothing beyond one pass over the weight would reach (no fused design gets "
                "further); replay speedup: the best baseline's replay over fsdist's.")


def filtered_markdown(data, idx, shapes) -> list:
    """Per filter group present in the JSON, per shape: fsdist's time and fallback rate against
    the same filters materialized. Empty for JSONs without filtered methods."""
    present = {r["method"] for r in data.get("results", []) if r.get("median_us")}
    out = []
    for group, g in FILTERED.items():
        bases = [m for m in g["baselines"] if m in present]
        if g["fsdist"] not in present and not bases:
            continue
        for D, V in shapes:
            bs = sorted({r["B"] for r in data.get("results", []) if (r["D"], r["V"]) == (D, V)})
            graphs = any(_med(idx, D, V, B, g["fsdist"], "graph") for B in bs)
            out += [f"#### Filtered sampling, {_filter_text(data, group)} ([B] tensors): D={D}, V={V}", "",
                    "fsdist's fallback column: the fraction of rows of its timed calls resolved by the exact "
                    "fallback (the kept logits could not prove the filtered set)."
                    + (" Graph: fsdist's call as a CUDA-graph replay (the serving number where eager calls are "
                       "host-bound), its ratio over the plain call's replay, and the speedup of that replay over "
                       "the best baseline (eager calls of the baselines). " + CEILING_NOTE if graphs else ""), ""]
            hdr = ["B", SHORT[g["fsdist"]], "fallback"]
            if graphs:
                hdr += ["graph", "graph / plain graph"]
            hdr += [SHORT[m] for m in bases] + ["best baseline", "speedup vs best"]
            if graphs:
                hdr += ["graph speedup vs best", "replay speedup", "ceiling"]
            out += ["| " + " | ".join(hdr) + " |", "|" + "---|" * len(hdr)]
            for B in bs:
                r = idx.get((D, V, B, g["fsdist"], "events")) or {}
                fs, fb = r.get("median_us"), r.get("fallback_rate")
                times = {m: _med(idx, D, V, B, m) for m in bases}
                times = {m: t for m, t in times.items() if t}
                best = min(times, key=times.get) if times else None
                cells = [str(B), fmt(fs), f"{100 * fb:.1f}%" if fb is not None else "–"]
                fg, pg = _med(idx, D, V, B, g["fsdist"], "graph"), _med(idx, D, V, B, "fsdist", "graph")
                if graphs:
                    cells += [fmt(fg), f"{fg / pg:.3f}" if (fg and pg) else "–"]
                cells += [fmt(_med(idx, D, V, B, m)) for m in bases]
                cells += [SHORT[best] if best else "–", f"{times[best] / fs:.2f}×" if (best and fs) else "–"]
                if graphs:
                    cells += [f"{times[best] / fg:.2f}×" if (best and fg) else "–"]
                    cells += _ceiling_cells(idx, D, V, B, bases, fg)
                out.append("| " + " | ".join(cells) + " |")
            out.append("")
    return out


def _ceiling_cells(idx, D, V, B, bases, fsdist_graph_us) -> list:
    """The replay speedup and ceiling cells of one table row (speedup_ceiling)."""
    c = speedup_ceiling(idx, D, V, B, bases)
    if c is None:
        return ["–", "–"]
    return [f"{c[0] / fsdist_graph_us:.2f}×" if fsdist_graph_us else "–", f"{c[2]:.2f}×"]


def processors_markdown(data, idx, shapes) -> list:
    """Per processor group present in the JSON, per shape: fsdist with the processors against plain
    fsdist (eager calls and CUDA-graph replays) and against the same processors materialized.
    Empty for JSONs without processors methods."""
    present = {r["method"] for r in data.get("results", []) if r.get("median_us")}
    what = ((data.get("args") or {}).get("processors") or {}).get("what", "")
    out = []
    for group, g in PROCESSORS.items():
        bases = [m for m in g["baselines"] if m in present]
        if g["fsdist"] not in present and not bases:
            continue
        for D, V in shapes:
            bs = sorted({r["B"] for r in data.get("results", []) if (r["D"], r["V"]) == (D, V)})
            graphs = any(_med(idx, D, V, B, g["fsdist"], "graph") for B in bs)
            out += [f"#### Logit processors, {g['title']} ([B] tensors): D={D}, V={V}", "",
                    f"{what}. Ratios: over plain fsdist in the same run (eager calls, and CUDA-graph replays); "
                    "each baseline over fsdist with the same processors."
                    + (" " + CEILING_NOTE if graphs else ""), ""]
            hdr = ["B", "fsdist", SHORT[g["fsdist"]], "ratio", "graph ratio"] + [SHORT[m] for m in bases]
            hdr += [f"{SHORT[m]} / fsdist" for m in bases]
            if graphs:
                hdr += ["replay speedup", "ceiling"]
            out += ["| " + " | ".join(hdr) + " |", "|" + "---|" * len(hdr)]
            for B in bs:
                fs, x = _med(idx, D, V, B, "fsdist"), _med(idx, D, V, B, g["fsdist"])
                fg, xg = _med(idx, D, V, B, "fsdist", "graph"), _med(idx, D, V, B, g["fsdist"], "graph")
                times = [_med(idx, D, V, B, m) for m in bases]
                cells = [str(B), fmt(fs), fmt(x), f"{x / fs:.3f}" if (x and fs) else "–",
                         f"{xg / fg:.3f}" if (xg and fg) else "–"]
                cells += [fmt(t) for t in times]
                cells += [f"{t / x:.2f}×" if (t and x) else "–" for t in times]
                if graphs:
                    cells += _ceiling_cells(idx, D, V, B, bases, xg)
                out.append("| " + " | ".join(cells) + " |")
            out.append("")
    return out


def kernel_plots(data, plots_dir: Path, stem: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    idx = _kernel_index(data)
    labels = labels_for(data)
    summ = {(s["D"], s["V"], s["B"]): s for s in data.get("summary", [])}
    shapes = sorted({(r["D"], r["V"]) for r in data.get("results", [])})
    methods = []
    for r in data.get("results", []):
        if (r["method"] not in methods and not r["method"].startswith("fsdist@") and r["method"] not in FILTERED_METHODS
                and r["method"] not in PROCESSOR_METHODS):
            methods.append(r["method"])
    files = []
    if not shapes:
        return files
    title = (data.get("env", {}).get("gpu") or {}).get("name", "CPU (interpreter)")

    def batches(D, V):
        return sorted({r["B"] for r in data["results"] if (r["D"], r["V"]) == (D, V)})

    # 1. time per call against B
    fig, axes = plt.subplots(1, len(shapes), figsize=(6.5 * len(shapes), 4.6), squeeze=False)
    for ax, (D, V) in zip(axes[0], shapes):
        bs = batches(D, V)
        for m in methods:
            for mode, ls in (("events", "-"), ("graph", ":")):
                ys = [_med(idx, D, V, B, m, mode) for B in bs]
                pts = [(B, y) for B, y in zip(bs, ys) if y]
                if not pts or (mode == "graph" and m not in ("fsdist", "cublas")):
                    continue
                ax.plot(*zip(*pts), ls, marker="o", ms=3, label=labels.get(m, m) + (" [graph]" if mode == "graph" else ""),
                        lw=2.2 if m == "fsdist" else 1.2)
        fl = [(B, summ.get((D, V, B), {}).get("floor_us")) for B in bs]
        fl = [(B, y) for B, y in fl if y]
        if fl:
            ax.plot(*zip(*fl), "k--", lw=1, label="floor: max(bytes/copy BW, FLOP/matmul rate)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch size B")
        ax.set_ylabel("µs per call (median)")
        ax.set_title(f"{title}: D={D}, V={V}")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    files.append(plots_dir / f"{stem}_time.png")
    fig.savefig(files[-1], dpi=120)
    plt.close(fig)

    # 2. speedup of fsdist over each baseline
    fig, axes = plt.subplots(1, len(shapes), figsize=(6.5 * len(shapes), 4.2), squeeze=False)
    gpu = gpu_of(data)
    for ax, (D, V) in zip(axes[0], shapes):
        bs = batches(D, V)
        for m in [m for m in methods if m in BASELINES] + ["cublas"]:
            pts = []
            for B in bs:
                fs, b = _med(idx, D, V, B, "fsdist"), _med(idx, D, V, B, m)
                if fs and b:
                    pts.append((B, b / fs))
            if pts:
                ax.plot(*zip(*pts), "-o", ms=3, label=f"vs {labels.get(m, m)}")
        for m, mk in (("multinomial_compiled", "x"), ("fi_topk_topp", "+"), ("fi_sampling", "^")):
            pp = [(B, paper_speedup(m, gpu, D, B)) for B in bs]
            pp = [(B, y) for B, y in pp if y]
            if pp:
                ax.plot(*zip(*pp), mk, color="gray", mfc="none", label=f"paper Table 4/5, vs {SHORT[m]} ({gpu})")
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch size B")
        ax.set_ylabel(f"baseline time / {labels['fsdist']} time")
        ax.set_title(f"{title}: fsdist speedup, D={D}, V={V}")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    files.append(plots_dir / f"{stem}_speedup.png")
    fig.savefig(files[-1], dpi=120)
    plt.close(fig)

    # 3. fraction of the measured copy bandwidth
    copy = (data.get("ceilings") or {}).get("copy", {}).get("bytes_per_s")
    if copy:
        elem = {"bf16": 2, "fp16": 2, "fp32": 4}.get(data.get("args", {}).get("dtype"), 2)
        fig, axes = plt.subplots(1, len(shapes), figsize=(6.5 * len(shapes), 4.2), squeeze=False)
        for ax, (D, V) in zip(axes[0], shapes):
            bs = batches(D, V)
            for m in ("fsdist", "fsdist_logprobs", "cublas"):
                pts = []
                for B in bs:
                    t = _med(idx, D, V, B, m)
                    if t:
                        nbytes = V * D * elem + B * D * elem
                        pts.append((B, 100.0 * nbytes / (t * 1e-6) / copy))
                if pts:
                    ax.plot(*zip(*pts), "-o", ms=3, label=labels.get(m, m))
            ax.axhline(100.0, color="k", lw=0.8, ls="--")
            ax.set_xscale("log", base=2)
            ax.set_ylim(0, 110)
            ax.set_xlabel("batch size B")
            ax.set_ylabel("% of copy bandwidth (weight+hidden bytes / time)")
            ax.set_title(f"{title}: D={D}, V={V}")
            ax.grid(True, which="both", alpha=0.3)
        axes[0][0].legend(fontsize=7)
        fig.tight_layout()
        files.append(plots_dir / f"{stem}_bandwidth.png")
        fig.savefig(files[-1], dpi=120)
        plt.close(fig)

    # 4. roofline: achieved FLOP/s against arithmetic intensity, both shapes on one axis
    f = roofline_plot(data, plots_dir / f"{stem}_roofline.png")
    if f:
        files.append(f)

    # 5. filtered sampling: fsdist with filters against the same filters materialized
    f = filtered_plot(data, plots_dir / f"{stem}_filtered.png")
    if f:
        files.append(f)
    # ... and as CUDA-graph replays, where the JSON has them for every filtered method (no host in the time)
    f = filtered_plot(data, plots_dir / f"{stem}_filtered_graph.png", mode="graph")
    if f:
        files.append(f)
    return files


def filtered_plot(data, path: Path, mode: str = "events"):
    """Time per call of the filtered methods (one colour per filter group, fsdist bold, the
    fallback rate in fsdist's label), with cuBLAS and unfiltered fsdist for reference.
    mode: "events" (eager calls) or "graph" (CUDA-graph replays; only where every fsdist
    filtered method has them). Returns the path written, or None when the JSON has no
    filtered method (in that mode)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    idx = _kernel_index(data)
    present = {r["method"] for r in data.get("results", []) if r.get("median_us") and r.get("mode") == mode}
    if not present & FILTERED_METHODS:
        return None
    if mode != "events" and not all(g["fsdist"] in present for g in FILTERED.values()):
        return None
    labels = labels_for(data)
    shapes = sorted({(r["D"], r["V"]) for r in data.get("results", [])})
    title = (data.get("env", {}).get("gpu") or {}).get("name", "CPU (interpreter)")
    styles = ["-", "--", ":", "-."]
    fig, axes = plt.subplots(1, len(shapes), figsize=(6.5 * len(shapes), 4.6), squeeze=False)
    for ax, (D, V) in zip(axes[0], shapes):
        bs = sorted({r["B"] for r in data["results"] if (r["D"], r["V"]) == (D, V)})
        for m, color in (("cublas", "#444444"), ("fsdist", "#999999")):
            pts = [(B, _med(idx, D, V, B, m, mode)) for B in bs]
            pts = [(B, y) for B, y in pts if y]
            if pts:
                ax.plot(*zip(*pts), "-", color=color, lw=1, label=labels.get(m, m) + " (no filter)")
        for gi, (group, g) in enumerate(FILTERED.items()):
            color = f"C{gi}"
            for mi, m in enumerate([g["fsdist"]] + g["baselines"]):
                pts = [(B, _med(idx, D, V, B, m, mode)) for B in bs]
                pts = [(B, y) for B, y in pts if y]
                if not pts:
                    continue
                label = labels.get(m, m)
                if m == g["fsdist"]:
                    fbs = [idx[(D, V, B, m, "events")].get("fallback_rate") for B, _ in pts]
                    fbs = [x for x in fbs if x is not None]
                    if fbs:
                        label += f", fallback {100 * min(fbs):.1f}-{100 * max(fbs):.1f}% of rows"
                ax.plot(*zip(*pts), styles[mi % len(styles)], marker="o", ms=3, color=color,
                        lw=2.2 if m == g["fsdist"] else 1.2, label=f"{label} [{_filter_text(data, group)}]")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch size B")
        ax.set_ylabel("µs per call (median)")
        # (two lines: a long GPU name, e.g. "NVIDIA H100 80GB HBM3", ran the one-line title past the figure's edge)
        ax.set_title(f"{title}: filtered sampling\nD={D}, V={V}" + (", CUDA-graph replays" if mode == "graph" else ""))
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=6, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def roofline_plot(data, path: Path):
    """Roofline of one kernel-bench JSON: fsdist, cuBLAS and the best materialized baseline.

    Every method is charged the floor model's minimal bytes (see roofline_point), so the
    x position depends only on (D, V, B) and the y position on the method's time.
    Returns the path written, or None without measured ceilings or results.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    ceil = data.get("ceilings") or {}
    copy = (ceil.get("copy") or {}).get("bytes_per_s")
    rate = (ceil.get("matmul") or {}).get("flop_per_s")
    if not (copy and rate):
        return None
    idx = _kernel_index(data)
    summ = {(s["D"], s["V"], s["B"]): s for s in data.get("summary", [])}
    shapes = sorted({(r["D"], r["V"]) for r in data.get("results", [])})
    if not shapes:
        return None
    elem = {"bf16": 2, "fp16": 2, "fp32": 4}.get(data.get("args", {}).get("dtype"), 2)
    title = (data.get("env", {}).get("gpu") or {}).get("name", "CPU (interpreter)")
    dtype = (ceil.get("matmul") or {}).get("dtype", "bf16")

    def best_baseline(D, V, B):
        s = summ.get((D, V, B), {})
        if s.get("best_baseline_us"):
            return s["best_baseline_us"]
        ts = [t for t in (_med(idx, D, V, B, m) for m in BASELINES) if t]
        return min(ts) if ts else None

    series = (("cublas", "cuBLAS matmul only", "#444444", 1.0, 1.2),
              ("fsdist", labels_for(data)["fsdist"], "C0", 1.0, 2.0),
              ("best", "best materialized baseline (per B)", "C1", 0.45, 1.0))
    markers = ["o", "s", "^", "D", "v"]
    fig, ax = plt.subplots(figsize=(8.5, 5.8))
    ais = []
    fs_pts = defaultdict(list)  # B -> [(ai, TFLOP/s, % of roofline)] of fsdist, one per shape
    y_min = {}  # B -> lowest point plotted at that B (labels go under it)
    for si, (D, V) in enumerate(shapes):
        mk = markers[si % len(markers)]
        bs = sorted({r["B"] for r in data["results"] if (r["D"], r["V"]) == (D, V)})
        for key, label, color, alpha, lw in series:
            pts = []
            for B in bs:
                t = best_baseline(D, V, B) if key == "best" else _med(idx, D, V, B, key)
                if t:
                    ai, fl = roofline_point(D, V, B, t, elem)
                    pts.append((B, ai, fl / 1e12, t))
            if not pts:
                continue
            ais += [p[1] for p in pts]
            for B, ai, y, t in pts:
                y_min[B] = min(y_min.get(B, y), y)
            ax.plot([p[1] for p in pts], [p[2] for p in pts], "-", marker=mk, ms=5 if key == "fsdist" else 4,
                    color=color, alpha=alpha, lw=lw, mfc=color if si == 0 else "none",
                    label=f"{label}, D={D} V={V}")
            if key == "fsdist":
                for B, ai, y, t in pts:
                    fs_pts[B].append((ai, y, pct_roofline(D, V, B, t, copy, rate, elem)))
    # label a few batch sizes: small B above the memory roof; B >= 128 below the points with
    # fsdist's % of the roofline per shape (in the order of the legend)
    for B, pl in sorted(fs_pts.items()):
        if B in (1, 4, 16, 64):
            ai, y = pl[0][0], max(q[1] for q in pl)
            ax.annotate(f"B={B}", (ai, y), textcoords="offset points", xytext=(-6, 8), ha="right",
                        fontsize=7)
        elif B >= 128:
            ax.annotate(f"B={B}\n" + " / ".join(f"{q[2]:.0f}%" for q in pl), (pl[0][0], y_min[B]),
                        textcoords="offset points", xytext=(0, -10 if B < 256 else -30), ha="center",
                        va="top", fontsize=7, color="C0")
    if fs_pts:
        ax.text(0.98, 0.03, "% = fsdist achieved / roofline at its AI\n(" +
                " / ".join(f"D={D}" for D, _ in shapes) + ")", transform=ax.transAxes, ha="right",
                va="bottom", fontsize=7, color="C0")
    lo, hi = min(ais) / 2, max(ais) * 3
    ridge = rate / copy
    xr = min(ridge, hi)  # roofs drawn bold where they bind, faint where the other one does
    ax.plot([lo, xr], [copy * lo / 1e12, copy * xr / 1e12], "k-", lw=1.3,
            label=f"memory roof: copy BW {copy / 1e12:.2f} TB/s × AI")
    ax.plot([xr, hi], [copy * xr / 1e12, copy * hi / 1e12], "k-", lw=0.6, alpha=0.25)
    ax.plot([xr, hi], [rate / 1e12] * 2, "k--", lw=1.3,
            label=f"compute roof: {dtype} matmul {rate / 1e12:.0f} TFLOP/s")
    ax.plot([lo, xr], [rate / 1e12] * 2, "k--", lw=0.6, alpha=0.25)
    if ridge < hi:
        ax.annotate(f"ridge AI = {ridge:.0f}", (ridge, rate / 1e12), textcoords="offset points",
                    xytext=(-30, 8), fontsize=7)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_ylim(min(copy * lo / 1e12, min(y_min.values()) / 2, 1.0), rate / 1e12 * 2.5)
    ax.set_xlabel(f"arithmetic intensity (FLOP / byte): 2·B·D·V / (V·D·{elem} + B·D·{elem} + 8·B)")
    ax.set_ylabel("achieved TFLOP/s (2·B·D·V / median time)")
    ax.set_title(f"{title}: roofline, same minimal bytes for every method")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------- tensor parallel
SCALAR_TAG = " [scalar T]"


def _results_by_key(d):
    for r in d.get("results", []):
        if r.get("min_us") is not None:
            yield (gpu_of(d), r["D"], r["V"]), r


def tp_merge(datas):
    """{(gpu, D, V): {(method, B): {tp: row}}} from several tp_sweep JSONs (min over duplicates).

    Where JSONs with per-row [B] temperatures and older scalar-temperature ones meet in one
    (gpu, D, V), the older ones' fsdist methods get SCALAR_TAG so that the two are not mixed; the fsdist
    methods of a ``tp_sweep --filters`` run carry the filters' name in brackets.
    """
    merged = defaultdict(lambda: defaultdict(dict))
    meta = {}
    modes = defaultdict(set)
    for d in datas:
        for key, _ in _results_by_key(d):
            modes[key].add(row_params_mode(d))
    for d in datas:
        for key, r in _results_by_key(d):
            tagged = len(modes[key]) > 1 and row_params_mode(d) == "scalar" and r["method"].startswith("fsdist")
            method = r["method"] + (SCALAR_TAG if tagged else "")
            filters = (d.get("args") or {}).get("filters", "none")
            if filters != "none" and r["method"].startswith("fsdist"):
                method += f" [{filters}]"  # tp_sweep --filters: the same head doing more work; never merged with plain
            cell = merged[key][(method, r["B"])]
            tp = r["tp"]
            if tp not in cell or r["min_us"] < cell[tp]["min_us"]:
                cell[tp] = r
            meta[key] = d
    return merged, meta


def tp_markdown(datas, sources) -> str:
    merged, meta = tp_merge(datas)
    out = []
    for (gpu, D, V), cells in sorted(merged.items()):
        d = meta[(gpu, D, V)]
        here = [x for x in datas if any(key == (gpu, D, V) for key, _ in _results_by_key(x))]
        notes = sorted({params_note(x) for x in here})
        if len({row_params_mode(x) for x in here}) > 1:
            notes.append(f"The older runs' fsdist rows carry `{SCALAR_TAG.strip()}`.")
        tps = sorted({tp for c in cells.values() for tp in c})
        out += [f"### {gpu.upper()}: D={D}, V={V} (tensor parallel)", "",
                f"{env_line(d)}. Sources: " + ", ".join(f"`{s}`" for s in sources) + ".  ",
                "Minimum over runs of per-iteration mean time (µs), every rank in lock-step; "
                "'ideal' is the TP=1 time / N; speedup is TP=1 / TP=N.  "] + [f"{n}  " for n in notes] + [""]
        hdr = ["B", "method"] + [f"TP={t}" for t in tps] + [f"ideal TP={t}" for t in tps if t > 1] + \
              [f"speedup TP={t}" for t in tps if t > 1]
        out.append("| " + " | ".join(hdr) + " |")
        out.append("|" + "---|" * len(hdr))
        for (method, B) in sorted(cells, key=lambda k: (k[1], k[0])):
            c = cells[(method, B)]
            t1 = c.get(1, {}).get("min_us")
            row = [str(B), method] + [fmt(c.get(t, {}).get("min_us")) for t in tps]
            row += [fmt(t1 / t) if t1 else "–" for t in tps if t > 1]
            row += [(f"{t1 / c[t]['min_us']:.2f}×" if (t1 and t in c) else "–") for t in tps if t > 1]
            out.append("| " + " | ".join(row) + " |")
        out.append("")
    return "\n".join(out)


def tp_plotted(methods) -> set:
    """The methods a TP plot draws: not the A/B variants (``..._endk``, ``..._devbar``: the tables keep them), and
    not an eager fsdist method whose CUDA-graph twin (``fsdist_graph/...``, same transport and filters) is there:
    eager calls are host-bound on these machines, and the plot should read at a glance."""
    ab = re.compile(r"_(endk|devbar)( \[|$)")
    keep = {m for m in methods if not ab.search(m)}
    return {m for m in keep if not (m.startswith("fsdist/") and m.replace("fsdist/", "fsdist_graph/", 1) in keep)}


def tp_plots(datas, plots_dir: Path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    merged, _ = tp_merge(datas)
    files = []
    for (gpu, D, V), cells in sorted(merged.items()):
        bs = sorted({B for (_, B) in cells})
        drawn = tp_plotted({m for (m, _) in cells})
        fig, axes = plt.subplots(1, len(bs), figsize=(4.8 * len(bs), 4.2), squeeze=False)
        for ax, B in zip(axes[0], bs):
            ideal_done = False
            for (method, b), c in sorted(cells.items()):
                if b != B or method not in drawn:
                    continue
                pts = sorted((tp, r["min_us"]) for tp, r in c.items())
                fs = method.startswith("fsdist")  # fsdist solid and thick, the baselines dashed
                ax.plot(*zip(*pts), "-o" if fs else "--s", ms=3, label=method, lw=2 if fs else 1)
                if not ideal_done and method.startswith(("fsdist/", "fsdist_graph/")) and method.endswith("/candidates") \
                        and 1 in c:
                    ideal_done = True  # the dotted line: TP=1 time / N of the first fsdist candidates method
                    t1 = c[1]["min_us"]
                    ax.plot([tp for tp, _ in pts], [t1 / tp for tp, _ in pts], "k:", lw=1,
                            label=f"ideal ({method} TP=1 / N)")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("TP degree")
            ax.set_ylabel("µs per step (min)")
            ax.set_title(f"{gpu.upper()} D={D} V={V} B={B}")
            ax.grid(True, which="both", alpha=0.3)
        handles, labels = axes[0][0].get_legend_handles_labels()
        fig.legend(handles, labels, fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
        fig.tight_layout()
        f = plots_dir / f"tp_{gpu}_{D}x{V}.png"
        fig.savefig(f, dpi=120, bbox_inches="tight")
        plt.close(fig)
        files.append(f)
    return files


# --------------------------------------------------------------------------- fallback rate
def _fb_cells(data):
    """{(top_k, top_p, min_p): {bucket: cell}} in the JSON's filter order."""
    table = {}
    for c in data.get("cells", []):
        table.setdefault((c["top_k"], c["top_p"], c["min_p"]), {})[c["bucket"]] = c
    return table


def _pct(rate) -> str:
    if rate is None:
        return "–"
    return "0" if rate == 0 else ("100" if rate >= 0.9995 else f"{100 * rate:.1f}")


def fallback_markdown(data, source: str, plot_files) -> str:
    """One fallback_rate.py JSON: the family, the per-bucket statistics and the rate table."""
    fam, buckets, t = data.get("family", {}), data.get("buckets", []), data.get("target", {})
    gpu = (data.get("env", {}).get("gpu") or {}).get("name", "CPU (interpreter)")
    out = [f"### Fallback rate, {gpu} — `{source}`", "", f"{env_line(data)}.  ",
           f"Command: `{data.get('env', {}).get('command', '?')}`  ",
           f"Family: {fam.get('description', '?')}; V={fam.get('vocab')}, {fam.get('profiles')} profiles "
           f"(D={fam.get('hidden_size')}), exponents a ∈ {fam.get('exponents')}, temperatures in "
           f"{fam.get('temperature_range')}, {fam.get('dtype')}; KEEP={fam.get('keep_per_tile')} logits per "
           f"{fam.get('block_v')}-id tile ({fam.get('tiles')} tiles), stage-1 path {fam.get('path')}. "
           f"{data.get('rows_done')} of {data.get('rows_planned')} rows sampled. Entries: % of a cell's rows that "
           "the exact fallback resolved.", ""]
    hdr = ["top_k", "top_p", "min_p"] + [f"H {b['lo']:g}–{b['hi']:g}" for b in buckets]
    out += ["| " + " | ".join(hdr) + " |", "|" + "---|" * len(hdr)]
    for name, key, nd in (("mean H (exact)", "H_mean", 2), ("T min", "T_min", 2), ("T max", "T_max", 2)):
        out.append("| " + " | ".join([name, "", ""] + [fmt(b.get(key), nd) for b in buckets]) + " |")
    out.append("| " + " | ".join(["ids for 95% mass", "", ""] +
                                 [str((b.get("median_ids_for_mass") or {}).get("0.95", "–")) for b in buckets]) + " |")
    out.append("| " + " | ".join(["rows per cell (min)", "", ""] + [
        str(min((c["rows"] for c in data.get("cells", []) if c["bucket"] == i), default=0))
        for i in range(len(buckets))]) + " |")
    for (k, p, mp), row in _fb_cells(data).items():
        out.append("| " + " | ".join([str(k), f"{p:g}", f"{mp:g}"] +
                                     [_pct((row.get(i) or {}).get("fallback_rate")) for i in range(len(buckets))]) + " |")
    out.append("")
    if t.get("max_cell"):
        w = t["max_cell"]
        out.append(f"Target ({t['statement']}): pooled {100 * t['pooled_rate']:.2f}% of {t['rows']} rows; worst cell "
                   f"{100 * w['fallback_rate']:.2f}% (95% upper {100 * w['upper95']:.2f}%) at H {w['H_lo']:g}–"
                   f"{w['H_hi']:g}, top_k={w['top_k']}, top_p={w['top_p']:g}, min_p={w['min_p']:g}: "
                   f"**{'met' if t['met'] else 'not met'}**.")
    fails = data.get("failures") or []
    out.append(f"Checks: {len(data.get('checks', []))} calls checked, {len(fails)} failed.")
    out.append("")
    for f in plot_files:
        out.append(f"![{Path(f).stem}]({f})")
    out.append("")
    return "\n".join(out)


def fallback_plot(data, path: Path):
    """Heat map: filters (rows) x entropy buckets (columns), colour = % of rows that fell back."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    buckets, table = data.get("buckets", []), _fb_cells(data)
    if not buckets or not table:
        return None
    keys = list(table)
    grid = [[(table[k].get(i) or {}).get("fallback_rate") for i in range(len(buckets))] for k in keys]
    vals = [[100 * x if x is not None else float("nan") for x in row] for row in grid]
    fig, ax = plt.subplots(figsize=(1.0 * len(buckets) + 3, 0.28 * len(keys) + 1.8))
    im = ax.imshow(vals, aspect="auto", cmap="magma_r", vmin=0, vmax=100)
    for r, row in enumerate(grid):
        for c, x in enumerate(row):
            ax.text(c, r, _pct(x), ha="center", va="center", fontsize=6,
                    color="white" if (x or 0) > 0.5 else "black")
    ax.set_xticks(range(len(buckets)))
    ax.set_xticklabels([f"{b['lo']:g}-{b['hi']:g}\n(H̄ {fmt(b.get('H_mean'), 2)})" for b in buckets], fontsize=7)
    ax.set_yticks(range(len(keys)))
    ax.set_yticklabels([f"k={k} p={p:g} min_p={mp:g}" for k, p, mp in keys], fontsize=7)
    ax.set_xlabel("row entropy bucket (nats; mean exact entropy)")
    fam = data.get("family", {})
    gpu = (data.get("env", {}).get("gpu") or {}).get("name", "CPU")
    ax.set_title(f"{gpu}: % of rows resolved by the exact fallback\nZipf-like logits, {fam.get('layout')} layout, "
                 f"V={fam.get('vocab')}", fontsize=9)
    fig.colorbar(im, ax=ax, label="% fallback")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------- docs
def replace_section(text: str, tag: str, body: str) -> str:
    begin, end = f"<!-- BEGIN GENERATED: {tag} -->", f"<!-- END GENERATED: {tag} -->"
    block = f"{begin}\n<!-- written by bench/plot.py; edits here are overwritten -->\n\n{body.strip()}\n\n{end}"
    if begin in text and end in text:
        pre, rest = text.split(begin, 1)
        _, post = rest.split(end, 1)
        return pre + block + post
    return text.rstrip() + "\n\n" + block + "\n"


FILTER_CASES = (("k50+p0.9", "top-k 50 + top-p 0.9"), ("min_p0.05", "min-p 0.05"))


def filter_ab(before: dict, after: dict, before2: dict):
    """{B: {case: (ratio before, ratio after)}} of an A/B/A of filter_probe.py graph replays: each filtered call over
    the plain call of the same run, "before" the mean of the two before-runs' ratios."""
    out = {}
    for b in sorted(after["batches"], key=int):
        runs = [d["batches"].get(b, {}).get("graph_us", {}) for d in (before, after, before2)]
        if not all("plain" in r for r in runs):
            continue
        row = {}
        for case, _label in FILTER_CASES:
            if all(case in r for r in runs):
                r0, r1, r2 = (r[case] / r["plain"] for r in runs)
                row[case] = ((r0 + r2) / 2, r1)
        out[int(b)] = row
    return out


def filter_settings(data: dict, off: str, on: str):
    """{B: {case: (ratio under ``off``, ratio under ``on``)}} of one filter_probe.py run whose graph replays ran every
    case under several --pdl settings (keys "<case> pdl=<setting>" and, for the k-th repeat, "... pdl=<setting>#<k>"):
    each filtered call over the plain call of the same setting and repeat, averaged over the repeats. A batch that
    lacks the plain call under either setting is left out; a case missing under either setting leaves its cell out."""
    def ratios(runs: dict, case: str, setting: str):
        out, k = [], 1
        while True:
            tag = f" pdl={setting}" + (f"#{k}" if k > 1 else "")
            if f"plain{tag}" not in runs:
                return out
            if f"{case}{tag}" in runs:
                out.append(runs[f"{case}{tag}"] / runs[f"plain{tag}"])
            k += 1

    table = {}
    for b in sorted(data["batches"], key=int):
        runs = data["batches"][b].get("graph_us", {})
        row = {}
        for case, _label in FILTER_CASES:
            r_off, r_on = ratios(runs, case, off), ratios(runs, case, on)
            if r_off and r_on:
                row[case] = (sum(r_off) / len(r_off), sum(r_on) / len(r_on))
        if row:
            table[int(b)] = row
    return table


def filter_settings_main(files, settings: str, plots_dir: Path, no_plots: bool, labels: str = None) -> int:
    names = settings.split(",")
    if len(names) != 2 or not all(names):
        print(f"--filter-settings wants two setting names, OFF,ON; got {settings!r}", file=sys.stderr)
        return 2
    off, on = names
    shown = labels.split(",") if labels else names
    if len(shown) != 2 or not all(shown):
        print(f"--setting-labels wants two labels, got {labels!r}", file=sys.stderr)
        return 2
    for f in files:
        data = json.loads(Path(f).read_text())
        table = filter_settings(data, off, on)
        if not table:
            print(f"{f}: no batch has the plain call under both {off!r} and {on!r}", file=sys.stderr)
            return 2
        gpu = data["env"]["gpu"]["name"]
        D = data["shape"][0]
        print(filter_ab_markdown(table, f"{gpu}, D = {D}", [os.path.basename(f)], before=shown[0], after=shown[1]))
        if not no_plots:
            m = re.search(r"_(\d{8}T\d{4})\d\dZ", os.path.basename(f))  # (the run's minute: one plot per run)
            plots_dir.mkdir(parents=True, exist_ok=True)
            out = filter_ab_plot(table, f"{gpu}, D = {D}", plots_dir / (
                f"filter_settings_{gpu_of(data)}_d{D}_{m.group(1) if m else Path(f).stem}.png"),
                before=shown[0], after=shown[1])
            print(f"wrote {out}")
    return 0


def filter_ab_markdown(table: dict, gpu: str, sources, before: str = "before", after: str = "after") -> str:
    lines = [f"{gpu} ({', '.join(sources)}): filtered / plain, graph replays, {before} -> {after}", "",
             "| B | " + " | ".join(label for _c, label in FILTER_CASES) + " |", "|---|" + "---|" * len(FILTER_CASES)]
    for b, row in table.items():
        cells = [f"{row[c][0]:.3f} -> **{row[c][1]:.3f}**" if c in row else "" for c, _l in FILTER_CASES]
        lines.append(f"| {b} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def filter_ab_plot(table: dict, gpu: str, path: Path, limit: float = 1.10, before: str = "before",
                   after: str = "after"):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    bs = list(table)
    xs = range(len(bs))
    for (case, label), color in zip(FILTER_CASES, ("tab:blue", "tab:orange")):
        r_before = [table[b].get(case, (math.nan, math.nan))[0] for b in bs]
        r_after = [table[b].get(case, (math.nan, math.nan))[1] for b in bs]
        ax.plot(xs, r_before, "o--", color=color, alpha=0.5, label=f"{label}, {before}")
        ax.plot(xs, r_after, "o-", color=color, label=f"{label}, {after}")
    ax.axhline(limit, color="red", lw=1, ls=":", label=f"issue 11: {limit:.2f}x")
    ax.set_xticks(list(xs), [str(b) for b in bs])
    ax.set_xlabel("batch size B")
    ax.set_ylabel("filtered / plain fsdist (graph replays)")
    ax.set_title(f"Filtered calls over plain, {gpu}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def filter_ab_main(files, plots_dir: Path, no_plots: bool) -> int:
    if len(files) % 3:
        print(f"--filter-ab wants JSONs in threes (before, after, before again), got {len(files)}", file=sys.stderr)
        return 2
    for i in range(0, len(files), 3):
        trio = [json.loads(Path(f).read_text()) for f in files[i:i + 3]]
        gpu = gpu_of(trio[1])
        table = filter_ab(*trio)
        print(filter_ab_markdown(table, trio[1]["env"]["gpu"]["name"], [os.path.basename(f) for f in files[i:i + 3]]))
        if not no_plots:
            m = re.search(r"_(\d{8})T", os.path.basename(files[i + 1]))
            plots_dir.mkdir(parents=True, exist_ok=True)
            out = filter_ab_plot(table, trio[1]["env"]["gpu"]["name"],
                                 plots_dir / f"filter_ab_{gpu}_{m.group(1) if m else Path(files[i + 1]).stem}.png")
            print(f"wrote {out}")
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("json", nargs="+")
    p.add_argument("--filter-ab", action="store_true", help="the JSONs are filter_probe.py A/B/A triples")
    p.add_argument("--filter-settings", default=None, metavar="OFF,ON",
                   help="each JSON is one filter_probe.py run with these two --pdl settings (e.g. fields64,beside)")
    p.add_argument("--setting-labels", default=None, metavar="OFF,ON",
                   help="--filter-settings: the two settings' names in the table and the plot (default: as given)")
    p.add_argument("--plots-dir", default=str(REPO / "docs" / "plots"))
    p.add_argument("--md", default=str(REPO / "docs" / "benchmarks.md"))
    p.add_argument("--no-md", action="store_true", help="print the markdown instead of editing --md")
    p.add_argument("--no-plots", action="store_true")
    args = p.parse_args(argv)

    plots_dir = Path(args.plots_dir)
    md_path = Path(args.md)
    if args.filter_ab:
        return filter_ab_main(args.json, plots_dir, args.no_plots)
    if args.filter_settings is not None:
        return filter_settings_main(args.json, args.filter_settings, plots_dir, args.no_plots, args.setting_labels)
    kernel, tp, tp_src, fallback = [], [], [], []
    for f in args.json:
        d = json.loads(Path(f).read_text())
        kind = d.get("kind")
        if kind == "kernel":
            kernel.append((f, d))
        elif kind == "fallback_rate":
            fallback.append((f, d))
        elif kind == "tp":
            tp.append(d)
            tp_src.append(os.path.basename(f))
        else:
            print(f"{f}: unknown kind {kind!r}, skipped", file=sys.stderr)
    if not args.no_plots:
        plots_dir.mkdir(parents=True, exist_ok=True)

    def rel(pth: Path) -> str:
        try:
            return os.path.relpath(pth, md_path.parent)
        except ValueError:
            return str(pth)

    sections = {}
    if kernel:
        parts = []
        per_gpu, per_day = defaultdict(int), defaultdict(int)

        def stamp(f):
            return re.search(r"_(\d{8})T(\d{6})Z", os.path.basename(f))

        for f, d in kernel:
            per_gpu[gpu_of(d)] += 1
            m = stamp(f)
            per_day[(gpu_of(d), m.group(1) if m else f)] += 1
        for f, d in kernel:
            stem = f"kernel_{gpu_of(d)}"
            if per_gpu[gpu_of(d)] > 1:  # several runs on one GPU kind: one set of plots per run
                m = stamp(f)
                if not m:
                    stem += f"_{Path(f).stem}"
                else:  # the day, and the time where that GPU kind has several runs that day
                    stem += f"_{m.group(1)}" + (f"T{m.group(2)}" if per_day[(gpu_of(d), m.group(1))] > 1 else "")
            files = [] if args.no_plots else kernel_plots(d, plots_dir, stem)
            for x in files:
                print(f"wrote {x}")
            parts.append(kernel_markdown(d, os.path.basename(f), [rel(x) for x in files]))
        sections["kernel"] = "\n".join(parts)
    if tp:
        files = [] if args.no_plots else tp_plots(tp, plots_dir)
        for x in files:
            print(f"wrote {x}")
        sections["tp"] = tp_markdown(tp, tp_src) + "\n" + "\n".join(f"![{Path(x).stem}]({rel(x)})" for x in files)
    if fallback:
        parts = []
        for f, d in fallback:
            fam = d.get("family") or {}
            stem = f"fallback_{gpu_of(d)}_{fam.get('layout', 'random')}"
            x = None if args.no_plots else fallback_plot(d, plots_dir / f"{stem}.png")
            if x:
                print(f"wrote {x}")
            parts.append(fallback_markdown(d, os.path.basename(f), [rel(x)] if x else []))
        sections["fallback"] = "\n".join(parts)
    if args.no_md:
        for tag, body in sections.items():
            print(f"<!-- {tag} -->\n{body}")
        return 0
    text = md_path.read_text() if md_path.exists() else "# Benchmarks\n"
    for tag, body in sections.items():
        text = replace_section(text, tag, body)
    md_path.parent.mkdir(parents=True, exist_ok=True)
    md_path.write_text(text)
    print(f"updated {md_path} ({', '.join(sections) or 'nothing'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
