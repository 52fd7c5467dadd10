#!/usr/bin/env python
"""Issues 11 / 12's speed targets against what any fused design could reach, from kernel_bench.py JSONs.

    python bench/plot_targets.py bench/results/kernel_bench_h200_..._v79.json [more.json ...] [--out PNG]

For each JSON (one GPU, one or more shapes) and each processed call it ran with its compiled materialized baseline
(top-k + top-p, min-p, the token bitmask, bias + penalties), at every B <= 64, from the CUDA-graph replays:

- reached: the baseline's replay over fsdist's (the issues ask >= 1.5x);
- ceiling: the baseline's replay over the faster of cuBLAS alone and plain fsdist (``plot.speedup_ceiling``), i.e.
  the speed-up of a call whose filters or processors cost nothing beyond one pass over the weight. No fused design
  gets past it but by noise: where it is under 1.5x the target cannot be met on that GPU and shape;
- x plain: fsdist's processed call over its plain call (the issues ask <= 1.10x for filters, <= 1.03x for the
  bitmask, <= 1.08x for bias + penalties).

Prints a markdown table (one row per GPU, shape and call) and draws one panel per GPU and shape: reached (solid) and
ceiling (dashed) against B, with the 1.5x line. Needs matplotlib only for the plot (--no-plot prints the table alone).
"""
import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
import plot as bench_plot  # noqa: E402  (bench/plot.py: the kernel JSON's index and the ceiling its tables print)

# (label, fsdist method, its compiled baseline, the "x plain" target)
CALLS = (("top-k 50 + top-p 0.9", "fsdist_topk_topp", "torch_topk_topp_compiled_es", 1.10),
         ("min-p 0.05", "fsdist_minp", "torch_minp_compiled", 1.10),
         ("bitmask", "fsdist_bitmask", "torch_bitmask_compiled", 1.03),
         ("bias + penalties", "fsdist_bias_pen", "torch_bias_pen_compiled", 1.08))
MAX_B = 64
TARGET_SPEEDUP = 1.5


def gpu_label(doc: dict) -> str:
    """A short GPU name (H100 / H200 / the driver's name) for titles and tables; "GPU" where the JSON has none."""
    name = str(((doc.get("env") or {}).get("gpu") or {}).get("name") or "")
    for short in ("H200", "H100"):
        if short in name:
            return short
    return name or "GPU"


def rows_of(doc: dict) -> list:
    """One dict per (shape, call) the JSON has: per B <= MAX_B where the call, its baseline, cuBLAS and plain fsdist
    all have graph replays, the speed-up reached, the ceiling (``plot.speedup_ceiling``) and the call over plain."""
    idx = bench_plot._kernel_index(doc)
    out = []
    for D, V in sorted({(k[0], k[1]) for k in idx}):
        batches = sorted({k[2] for k in idx if (k[0], k[1]) == (D, V) and k[2] <= MAX_B})
        for label, method, baseline, plain_target in CALLS:
            cells = []
            for B in batches:
                ours = bench_plot._med(idx, D, V, B, method, "graph")
                plain = bench_plot._med(idx, D, V, B, "fsdist", "graph")
                ceiling = bench_plot.speedup_ceiling(idx, D, V, B, [baseline])
                if not (ours and plain and ceiling and bench_plot._med(idx, D, V, B, "cublas", "graph")):
                    continue
                base, _, ratio = ceiling
                cells.append(dict(B=B, reached=base / ours, ceiling=ratio, x_plain=ours / plain))
            if cells:
                out.append(dict(D=D, V=V, call=label, plain_target=plain_target, cells=cells))
    return out


def markdown(tables: list) -> str:
    """The table: per B 'reached / ceiling', then the x-plain range against its target."""
    batches = sorted({c["B"] for _, rows in tables for r in rows for c in r["cells"]})
    head = "| GPU | D | call | " + " | ".join(f"B = {b}" for b in batches) + " | x plain, B <= 64 (target) |"
    lines = [head, "|" + "---|" * (4 + len(batches))]
    for gpu, rows in tables:
        for r in rows:
            by_b = {c["B"]: c for c in r["cells"]}
            cells = [f"{by_b[b]['reached']:.2f} / {by_b[b]['ceiling']:.2f}" if b in by_b else "–" for b in batches]
            xp = [c["x_plain"] for c in r["cells"]]
            lines.append(f"| {gpu} | {r['D']} | {r['call']} | " + " | ".join(cells)
                         + f" | {min(xp):.3f}-{max(xp):.3f} (<= {r['plain_target']:.2f}) |")
    return "\n".join(lines)


def plot(tables: list, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker  # noqa: F401  (the axes' formatters)

    panels = [(gpu, D, [r for r in rows if r["D"] == D]) for gpu, rows in tables
              for D in sorted({r["D"] for r in rows})]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4.2), squeeze=False, sharey=True)
    colors = dict(zip([c[0] for c in CALLS], ("tab:blue", "tab:orange", "tab:green", "tab:red")))
    for ax, (gpu, D, rows) in zip(axes[0], panels):
        for r in rows:
            bs = [c["B"] for c in r["cells"]]
            color = colors[r["call"]]
            ax.plot(bs, [c["reached"] for c in r["cells"]], "o-", color=color, label=f"{r['call']}: reached")
            ax.plot(bs, [c["ceiling"] for c in r["cells"]], "--", color=color, alpha=0.6,
                    label=f"{r['call']}: ceiling")
        ax.axhline(TARGET_SPEEDUP, color="black", lw=1, ls=":", label="issues' 1.5x")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%.1f"))
        ax.yaxis.set_minor_formatter(matplotlib.ticker.FormatStrFormatter("%.1f"))
        ax.set_xlabel("batch size B")
        ax.set_title(f"{gpu}, D={D}")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("compiled materialized baseline / fsdist (graph replays)")
    # (one legend for the figure, from every panel's lines: a call missing from one panel still has its entry)
    handles = {}
    for ax in axes[0]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    fig.legend(handles.values(), handles.keys(), fontsize=7, loc="lower center", ncol=5, frameon=False)
    fig.suptitle("Speed-up over the materialized baselines (solid) and the most a fused call could reach (dashed)")
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")


def load(paths: list) -> list:
    """[(GPU label, rows)] over the JSONs, one entry per GPU; a (GPU, shape) that two JSONs both have gets each one's
    rows under a label naming its file, so neither is hidden behind the other."""
    loaded = []  # (file, GPU label, rows), each JSON read and reduced once
    for f in map(Path, paths):
        doc = json.loads(f.read_text())
        rows = rows_of(doc)
        if not rows:
            raise SystemExit(f"{f}: no processed call with its baseline and cuBLAS / plain fsdist in graph mode")
        loaded.append((f, gpu_label(doc), rows))
    seen = {}
    for f, gpu, rows in loaded:
        for r in rows:
            seen.setdefault((gpu, r["D"]), set()).add(f)
    merged = {}
    for f, gpu, rows in loaded:
        for r in rows:
            label = f"{gpu} ({f.stem})" if len(seen[(gpu, r["D"])]) > 1 else gpu
            merged.setdefault(label, []).append(r)
    return list(merged.items())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("json", nargs="+", help="kernel_bench.py JSONs with the processed calls and their baselines")
    p.add_argument("--out", default=str(REPO / "docs" / "plots" / "issue11_12_targets.png"), help="the plot's path")
    p.add_argument("--no-plot", action="store_true")
    args = p.parse_args()
    tables = load(args.json)
    print(markdown(tables))
    if not args.no_plot:
        plot(tables, Path(args.out))


if __name__ == "__main__":
    main()
