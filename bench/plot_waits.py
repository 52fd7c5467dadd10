"""Plot where the ws tile's MMA warpgroup spends a step, from ``ws_waits_*.json`` files (bench/ws_waits.py).

One stacked bar per (cell, case / variant): the MMA warpgroup's cycles (median program) per 128 x 128 x 64 of work,
split into its waits for operand stages, for wgmmas to retire, for the hand-off buffer, and the rest (mostly HGMMA
issue stalled behind the tensor cores' earlier work: docs/performance.md v105). The dashed line is 512 cycles, one
128 x 128 x 64 step at the tensor cores' dense bf16 peak (1,024 multiply-adds a clock an SM); the bar's height over it
is tensor-core idle time. Each bar is labelled with the launch's µs over cuBLAS's matmul in the same run.

    python3 bench/plot_waits.py bench/results/ws_waits_h100_20261206T125424Z_v103.json \\
        bench/results/ws_waits_h100_20261206T134418Z_v104.json bench/results/ws_waits_h100_20261206T134921Z_v105.json \\
        --cells 4096x1024 --cases greedy,noise,greedy/retire,noise/retire,greedy/e4,noise/e4,greedy/k2+s3,noise/k2+s3 \\
        --out docs/plots/ws_waits_h100_20261206_v103_v105.png   # (the committed plot)
"""
import argparse
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PARTS = (("mma_operands", "operand waits", "tab:orange"), ("mma_wgmma", "wgmma-retire waits", "tab:green"),
         ("mma_hand_off", "hand-off waits", "tab:red"), ("mma_rest", "rest (HGMMA issue, loop)", "tab:blue"))
PEAK_STEP = 512  # cycles of a 128 x 128 x 64 step at 1,024 bf16 multiply-adds a clock an SM


def step_cycles(cell: dict, case: dict) -> float:
    """The median program's MMA cycles per 128 x 128 x 64 of work (a 64-row tile's step is half of one)."""
    rows = case.get("kwargs", {}).get("block_b", 128)
    tiles_a_program = case["tiles"] / case["programs"]
    return case["mma_total"] / (tiles_a_program * rows / 128 * cell["D"] / 64)


def bars(paths, cells, cases):
    """[(label, cell, case)] in file order, cells and cases filtered; the label names the case and its file's tag
    and time (two files of one tag stay apart)."""
    out = []
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        parts = os.path.basename(path).replace(".json", "").split("_")
        tag = f"{parts[-1]} {parts[-2][-7:-3]}" if len(parts) >= 2 else parts[-1]
        for cell in data["cells"]:
            if cells and f"{cell['D']}x{cell['B']}" not in cells:
                continue
            for key, case in cell["cases"].items():
                if cases and key not in cases:
                    continue
                out.append((f"{key}\n({tag})", cell, case))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("json", nargs="+")
    p.add_argument("--cells", default="", help="DxB cells to draw, comma-separated (default all)")
    p.add_argument("--cases", default="", help="case / variant keys to draw, comma-separated (default all)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    cells = [c for c in args.cells.split(",") if c]
    chosen = bars(args.json, cells, [c for c in args.cases.split(",") if c])
    if not chosen:
        p.error("no cell / case matched")
    groups = {}
    for label, cell, case in chosen:
        groups.setdefault((cell["D"], cell["B"]), []).append((label, cell, case))
    fig, axes = plt.subplots(1, len(groups), figsize=(max(9, 1.1 * len(chosen) + 2), 5), squeeze=False,
                             sharey=True)
    for ax, ((D, B), items) in zip(axes[0], groups.items()):
        for i, (label, cell, case) in enumerate(items):
            total = step_cycles(cell, case)
            bottom = 0.0
            for key, name, color in PARTS:
                h = total * case[key]
                ax.bar(i, h, 0.7, bottom=bottom, color=color, edgecolor="black", linewidth=0.4,
                       label=name if i == 0 else None)
                bottom += h
            t, cub = case.get("times_us", {}).get("plain"), cell.get("cublas_us")
            if t and cub:
                ax.text(i, bottom + 8, f"{t / cub:.2f}x", ha="center", fontsize=7)
        ax.axhline(PEAK_STEP, color="black", linestyle="--", linewidth=1)
        ax.set_xticks(range(len(items)))
        ax.set_xticklabels([it[0] for it in items], fontsize=7, rotation=60, ha="right")
        ax.set_title(f"D = {D}, B = {B}", fontsize=9)
    axes[0][0].set_ylabel("MMA warpgroup cycles per 128 x 128 x 64 of work")
    axes[0][0].legend(fontsize=7, loc="lower left")
    with open(args.json[0]) as f:
        gpu = json.load(f).get("env", {}).get("gpu", {})
    fig.suptitle(f"Where the ws tile's MMA warpgroup spends a step, {gpu.get('name', '')} (wait probe, medians; "
                 "over the bars: µs / cuBLAS matmul; dashed: tensor-core peak)", fontsize=9)
    fig.tight_layout()
    out = args.out or os.path.join("docs", "plots", os.path.basename(args.json[-1]).replace(".json", ".png"))
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    fig.savefig(out, dpi=120)
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
